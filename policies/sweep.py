"""The full sweep: every config in grid order. The baseline every strategy is judged against."""

from __future__ import annotations

import numpy as np

from kdvfs.policies._common import BaseStrategy, TaskLog
from kdvfs.policies.base import Task


class SweepStrategy(BaseStrategy):
    """Measures every config of the grid in order; converged when all are measured."""

    name = "sweep"

    def _choose(self, task: Task, log: TaskLog) -> int | None:
        return int(np.flatnonzero(~log.measured)[0])
