"""The one interface every search strategy implements: ask / tell / best.

- `Strategy`: the Protocol (ask, tell, best);
- `SearchSpace`: the candidate clock configurations of a device (scaled to [0, 1] by `unit`);
- `Task`: one thing to tune, a kernel or a group of kernels, with its measured reference.

Policies see numbers only; they never import runtime/ or touch hardware
(docs/design-policies.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class SearchSpace:
    """The candidate clock configurations of a device.

    Attributes:
        configs_mhz: (n, 2) array of (core_mhz, mem_mhz), MHz, in the device grid's order.
        reference: index of the config the reference runs at when the reference is a grid
            pair (the highest pair on a recorded table); None when it is the card's auto mode.
    """

    configs_mhz: np.ndarray
    reference: int | None = None

    def __len__(self) -> int:
        return int(self.configs_mhz.shape[0])

    @property
    def unit(self) -> np.ndarray:
        """Configs scaled to [0, 1] per column by the grid's own min and max."""
        lo = self.configs_mhz.min(axis=0)
        span = np.maximum(self.configs_mhz.max(axis=0) - lo, 1e-9)
        return (self.configs_mhz - lo) / span


@dataclass(frozen=True)
class Task:
    """One thing to tune: a kernel (or a group of kernels) with its measured reference.

    The task's goal is least energy per launch with time_s <= (1 + budget) * ref_time_s.

    Attributes:
        key: the task's name, unique within a policy (seeds its generator).
        ref_time_s: reference time per launch, s.
        ref_energy_j: reference energy per launch, J.
        budget: allowed slowdown, a fraction (0.01: 1 %).
        features: numeric description for strategies that share knowledge across tasks.
        reference: index of the config the reference runs at, for this task alone (a tuner
            whose incumbent runs the task at a grid pair); its log starts with the reference's
            figures there, so it is never measured again. None: the space's reference.
    """

    key: str
    ref_time_s: float
    ref_energy_j: float
    budget: float
    features: tuple[float, ...] = ()
    reference: int | None = None

    def reference_in(self, space: SearchSpace) -> int | None:
        """The config the reference runs at: the task's own, else the space's (None: neither
        is a grid pair)."""
        return self.reference if self.reference is not None else space.reference


#: What a strategy whose answers come from outside (an agent choosing between steps: the
#: Gymnasium environment's) answers `ask` with while it has no answer yet: the tuner runs the
#: incumbent for a step and asks again. No config index is negative.
ASK_LATER = -1


@runtime_checkable
class Strategy(Protocol):
    """A search strategy over a SearchSpace, for many tasks at once."""

    name: str

    def ask(self, task: Task) -> int | None:
        """The next config index to measure for this task, or None when it has converged."""

    def tell(self, task: Task, config: int, time_s: float, energy_j: float) -> None:
        """Report one measurement (per launch) of this task at a config."""

    def best(self, task: Task) -> int | None:
        """The least-energy config so far whose time is within the task's budget, if any."""
