"""In-training refinement of a one-pair schedule: the lowest core clock that keeps the budget,
found by running it.

Where a clock switch takes longer than a good part of an iteration (30 ms on the 3080 Ti
against 63-ms iterations, 10 ms on the H200 against 6.7 ms) the plan is one pair for the whole
iteration. The planner's figure for it sums isolated cells where they were measured and
pessimistic fill-ins for the kernels too small to be worth a measurement, so it leaves budget
unused: on the simulated H200 the settled pair was planned at -0.4% and ran at -1.3% in
training, against a 1% budget. A one-pair schedule needs no per-kernel figures: training
itself measures its time (launch timings) and its energy (the counter), and a trial within
the budget costs nothing. So the tuner bisects the core clock, the memory clock fixed,
between the plan's pair and REFINEMENT_FLOOR of its core clock. Each candidate runs TRIAL_S of
training and is feasible when its measured slowdown is within the plan's time limit; one
plainly too slow (6 s.d. over) is stopped after ABORT_S. The lowest feasible candidate
replaces the plan only when its energy per iteration is lower by more than ENERGY_MARGIN:
two windows of TRIAL_S each carry the counter's 100-ms steps (<= 0.5% at 20 s) and the
card's 2% noise per second (0.45%); and a candidate measured while the card cools from the
last one carries some of its heat, which counts against it, never for it.

A settled schedule of several groups is first tried against the best one-pair schedule the
planner's matrices allow (one trial, the same rules): on the 30-ms 3080 Ti the planner,
working from noisy isolated cells, sometimes prefers two groups worth 1.6% to the one pair
worth 3.4%, which training tells apart in 20 s. The pair that wins is then refined as above.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kdvfs.runtime.types import ClockPair, KdvfsError

TRIAL_S = 20.0
ABORT_S = 2.0
REFINEMENT_FLOOR = 0.7
TRIAL_SLACK_S = 1.0
"""Slack the budget account must hold before a trial: a candidate REFINEMENT_FLOOR below the plan
runs at most ~40% slower for ABORT_S (0.8 s), and one just over the limit for TRIAL_S costs
far less; a refinement waits until the run has saved that much."""
ENERGY_MARGIN = 0.01


@dataclass(frozen=True)
class Trial:
    """One candidate as training measured it: slowdown against the reference, energy per
    iteration, and whether it kept the limit for a whole trial."""

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
    stays within the plan's limit (the module docstring; the tuner judges each trial). The
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
