"""In-training refinement of a one-pair schedule: the lowest core clock that keeps the budget,
found by running it.

- RefinementSearch: bisection of the core clock (memory clock fixed) between the running
  pair and REFINEMENT_FLOOR of it; candidate() proposes, tell() takes a Trial, best() answers.
- Trial: one candidate as training measured it; RefinementResult: a finished refinement.
- The knobs below; OnlineTuner runs the trials (its refinement section).

Design and findings: docs/design-tuner.md#refinement-a-one-pair-schedule-tuned-in-training
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kdvfs.runtime.types import ClockPair, KdvfsError

#: Training under one candidate before it is judged; s.
TRIAL_S = 20.0
#: Training after which a candidate plainly too slow (6 s.d. over the limit) is stopped; s.
ABORT_S = 2.0
#: Lowest core clock tried, as a fraction of the running pair's.
REFINEMENT_FLOOR = 0.7
#: Slack the budget account must hold before a trial (a candidate at the floor costs <= 0.8 s); s.
TRIAL_SLACK_S = 1.0
#: Energy per iteration a candidate must save on the incumbent to replace it; a fraction.
ENERGY_MARGIN = 0.01


@dataclass(frozen=True)
class Trial:
    """One candidate as training measured it.

    Args:
        pair: the clock pair the whole iteration ran at.
        slowdown: its measured slowdown against the reference, a fraction.
        energy_j: its measured energy per iteration, J.
        feasible: it kept the plan's limit for a whole trial.
    """

    pair: ClockPair
    slowdown: float
    energy_j: float
    feasible: bool


@dataclass(frozen=True)
class RefinementResult:
    """A finished refinement: after how many iterations, from which pair (None: a grouped
    schedule that one pair beat in training) to which, in how many trials, and the chosen
    pair as training measured it (slowdown against the reference, energy per iteration)."""

    iteration: int
    from_pair: ClockPair | None
    to_pair: ClockPair
    trials: int
    slowdown: float
    energy_j: float


class RefinementSearch:
    """Bisection for the lowest core clock of a one-pair schedule whose measured slowdown
    stays within the plan's limit (docs/design-tuner.md; the tuner judges each trial). The
    incumbent is feasible by its own measurement; candidate() proposes the next core clock,
    tell() takes its trial.

    Args:
        incumbent: the running pair's own trial; must be feasible.
        core_levels_mhz: the core clocks the grid has at the incumbent's memory clock, MHz.
    """

    def __init__(self, incumbent: Trial, core_levels_mhz: Sequence[int]) -> None:
        if not incumbent.feasible:
            raise KdvfsError(
                f"refinement needs a feasible incumbent, got {incumbent.pair} at {incumbent.slowdown:+.4f}"
            )
        top = incumbent.pair.core_mhz
        self.levels_mhz = sorted(c for c in core_levels_mhz if REFINEMENT_FLOOR * top <= c <= top)
        self.incumbent = incumbent
        self.trials: list[Trial] = []
        self._lo, self._hi = 0, len(self.levels_mhz) - 1  # levels_mhz[_hi] is the lowest known feasible

    def candidate(self) -> ClockPair | None:
        """The next core clock to try (memory clock as the incumbent's); None when done."""
        if self._lo >= self._hi:
            return None
        return ClockPair(self.levels_mhz[(self._lo + self._hi) // 2], self.incumbent.pair.mem_mhz)

    def tell(self, trial: Trial) -> None:
        mid = (self._lo + self._hi) // 2
        if trial.pair.core_mhz != self.levels_mhz[mid]:
            raise KdvfsError(
                f"refinement: trial at {trial.pair}, but the candidate was {self.levels_mhz[mid]} MHz"
            )
        self.trials.append(trial)
        if trial.feasible:
            self._hi = mid
        else:
            self._lo = mid + 1

    def best(self) -> Trial:
        """The lowest feasible candidate when it saves more than ENERGY_MARGIN on the
        incumbent, else the incumbent."""
        feasible = [t for t in self.trials if t.feasible]
        if not feasible:
            return self.incumbent
        lowest = min(feasible, key=lambda t: t.pair.core_mhz)
        return lowest if lowest.energy_j < (1.0 - ENERGY_MARGIN) * self.incumbent.energy_j else self.incumbent
