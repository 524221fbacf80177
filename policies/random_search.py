"""Random search: configs in a random order per task, no model and no pruning."""

from __future__ import annotations

from kdvfs.policies._common import BaseStrategy, TaskLog
from kdvfs.policies.base import Task


class RandomStrategy(BaseStrategy):
    """Measures configs in a random order fixed per (seed, task key) until the cap or the end.

    Without max_per_task it is a sweep in random order; comparisons set the cap.
    """

    name = "random"

    def _choose(self, task: Task, log: TaskLog) -> int | None:
        order = self.rng(task).permutation(len(self.space))
        return int(order[~log.measured[order]][0])
