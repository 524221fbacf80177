"""The step-driven tuner: fed each training step's report, it answers with the clocks of the
next steps. It never runs kernels itself.

- `StepTuner.on_step_end(report) -> Schedule`: the one entry point. A state machine (Zeus's
  power_limit.py shape): `phase` is the phase object now, `Reference` -> `Exploring` ->
  (`Trading`: kinds of groups against each other; `Screening`: many groups at once, both
  tuner/screening.py) -> `Verifying` -> ... -> `Settled`
  (-> `Retuning` -> `Reference` after an alarm); each phase is a
  small dataclass holding its own data, its docstring listing its transitions; `phases` lists
  the phases passed.
- Events (`subscribe`): `PhaseEntered`, `TrialFinished`, `Adoption`, `Alarm`; tuner/run.py's
  TuningRun (the one place a StepTuner is built) and through it MLflow and progress follow them.
- The measuring core (`Window`, `Trial`, `Outcome`, `StepAccount`, `switchable_groups`,
  `pass_boundaries`) is runtime/trials.py's; `StepTiming`: the measuring lengths, the constants
  by default, `StepTiming.for_ranks(n)` for n pooled data-parallel ranks.
- Ranks pooled (`pool`, runtime/ranks.py: RankPool): every rank decides on the same pooled
  figures; a lost pool (PoolLost) is an alarm: the rank goes on alone from a new reference.
- Statistics that scale with the job: the whole step at one pair first (`STEP_GROUP`), then
  kinds of groups traded (`TRADE_GROUP`), many groups at once (`SCREEN_GROUP`, a design fitted
  across trials), then
  each group; sequential trials capped by the measured noise and the run's expected length;
  the budget held against stock at 95% confidence (every window at stock refines it), the
  incumbent's time read from its adoptions' ratios and its own windows (`_read_level`);
  undecided groups reopened from `Settled` with longer windows; `resolvable` and
  `expected_time_to_plan_s` say what the job allows.
- Once `Settled`, the drift watch (tuner/drift.py); an alarm enters `Retuning` (stock until the
  temperature is flat), then `Reference` again, the plan before verified first.

Design and findings: docs/design-step-tuner.md; figures: docs/benchmarks.md.
"""

from __future__ import annotations

import copy
import functools
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

from kdvfs.policies.base import ASK_LATER, SearchSpace, Strategy, Task
from kdvfs.policies.registry import make_strategy, takes_option
from kdvfs.runtime.ranks import PoolLost, RankPool
from kdvfs.runtime.schedule import Schedule
from kdvfs.runtime.steps import StepReport
from kdvfs.runtime.trials import (  # the measuring core lives in runtime (envs measure through it too)
    ADOPT_Z,
    CONFIDENCE_Z,
    REFERENCE_FINE_MARGIN_SHARE,
    REFERENCE_FINE_MAX_S,
    REFERENCE_MARGIN,
    REFERENCE_MARGIN_SHARE,
    REFERENCE_MAX_S,
    REFERENCE_S,
    TRIAL_BLOCKS,
    TRIAL_WINDOW_S,
    Judgement,
    NoiseMeter,
    Outcome,
    PooledWindow,
    ScheduleLevel,
    StallFilter,
    StepAccount,
    StockFigures,
    StockReference,
    Trial,
    Window,
    energy_at_wait_j,
    judge,
    open_window,
    pass_boundaries,
    pooled_report,
    resolvable,
    sequential_z,
    switchable_groups,
    trial_s_to_resolve,
    window_pairs,
)
from kdvfs.runtime.types import ClockPair, KdvfsError, Workload, finite_number
from kdvfs.tuner.drift import ConditionWatch, DriftMonitor, group_stream, stream_group
from kdvfs.tuner.screening import (
    candidate_clocks,
    candidate_pairs,
    choose,
    design_rows,
    fit_savings,
    kinds_of,
    pool_savings,
    trade_clocks,
)

#: Most A-B-B-A blocks of one trial while its decision is open (fewer when the measured noise,
#: the run's expected length or the budget's slack says so); blocks.
TRIAL_MAX_BLOCKS = 12
#: Standard errors at which an exploring trial is decided (better, worse, or resolved); sds.
DECIDE_Z = 2.0
#: An exploring trial is resolved once DECIDE_Z energy errors are within this; a fraction.
RESOLVE_ENERGY = 0.01
#: Largest share of the run's expected length one trial may take; a fraction.
TRIAL_RUN_SHARE = 0.05
#: The run's expected length when the caller does not say, at least; s (else twice the
#: training so far).
MIN_EXPECTED_RUN_S = 1800.0
#: Shortest wait in Settled before undecided groups are tried again; s (else as long as
#: the round before took).
REOPEN_WAIT_MIN_S = 30.0
#: Largest share of the run's expected length a (noisy job's) reference may take; a fraction.
REFERENCE_RUN_SHARE = 0.1
#: A group whose search completed fewer trials than this (a strategy that stopped early, or
#: trials abandoned) is reopened later, from its best pair, as an undecided one; trials.
MIN_COMPLETED_TRIALS = 6
#: ... in at most this many rounds (a group whose every pair is too slow stops being reopened); rounds.
MAX_FEW_ROUNDS = 3
#: Longest trial window of a reopened round (each round doubles the window); s.
MAX_TRIAL_WINDOW_S = 16.0
#: The group index of the whole step: every group at one pair (the one-knob optimum, explored
#: first when the run starts without a prior).
STEP_GROUP = -1
#: The screening's place in a search's order (`Screening`: every group with a candidate pair
#: at once, in a designed set of trials, after the whole step's pair).
SCREEN_GROUP = -2
#: The trades' place in a search's order (`Trading`: kinds of groups, told apart by how their
#: CUDA-event times followed the screening's probes, traded against each other: one kind's core
#: clock lowered, another's raised to give the time back; after the screening).
TRADE_GROUP = -3
#: Most kinds the groups are told apart into for the trades; kinds.
MAX_KINDS = 3
#: The wait group (`StepTuner.wait_group`): where a job's waits for its host are long enough
#: for a clock request at the step's last site to land in them, that site is a group of its own
#: whose pair the card idles at through those waits (a held pair otherwise idles at itself, stock
#: at its lowest core clock); it is tried once per round at the grid's lowest pair (the least
#: idle draw), first, and is otherwise left out of the search.
#: The shortest mean wait per step at stock, a share of stock's busy step, where a step whose
#: last segment outlasts a switch gets a wait group that releases the clocks there (stock: the
#: card idles at its own lowest clock through the wait, but runs the rest of that segment and
#: the next step's first switch latency at stock). On the simulated whole GPT-3-XL step
#: releasing pays from about 10% (H200, 1380/3201) and 15% (RTX 3080 Ti, 1680/9501), by 0.3-0.4
#: points from 20%, and loses 0.3 and 1.0 points where the job never waits
#: (experiments/release_gain.py); a fraction.
RELEASE_MIN_WAIT_SHARE = 0.2
#: Fewest groups a first run screens (fewer are searched one by one, the wait group not
#: counted); groups.
MIN_SCREEN_GROUPS = 3
#: Standard errors of saving above which a screened group is moved (the verification of the
#: groups together is the adoption test); sds.
SCREEN_Z = 0.5
#: Most screenings in a row (each after the one before adopted its choice); rounds.
SCREEN_ROUNDS = 2
#: A verification (a group's best, a trade, a screening's choice) that ends undecided with its
#: saving at this many errors or more goes on at once, its blocks kept (one longer test, judged
#: as the next verification of what it moves); sds.
GO_ON_Z = 2.0
#: ... at most this many times in a row; verifications.
GO_ON_EXTENSIONS = 1
#: The screening's probes lower one clock of the whole step's pair to the lowest supported at
#: or above this share of it (a probe far below it is over the budget before its first
#: window, and slows every group too much to be a candidate); a fraction.
PROBE_CLOCK_SHARE = 0.5
#: A candidate between a group's pair and a probe lowers its clock by at least this share
#: (a smaller move's energy is below what the design's trials resolve: on the H200's whole
#: step one core step, 1%, moved the step's energy by less than a row's error); a fraction.
SCREEN_LEAST_DROP = 0.05
#: The screened groups' extra times (at their candidates) add up to at most this many times
#: the budget's time, so that a design trial, moving half of them, fits the budget; times.
SCREEN_EXTRA_BUDGETS = 1.5
#: Time errors a verification adds to the candidate's slowdown before it must be within the
#: budget: the budget's own confidence (one-sided 95%, as the account holds it; the stock it
#: counts against is already less its 95% margin, at least REFERENCE_MARGIN); the saving keeps
#: the verification's sequential boundary (false adoptions); sds.
VERIFY_TIME_Z = CONFIDENCE_Z
#: Standard errors of saving a group's best pair must have shown in its exploring trial
#: before it is verified (a best that saved nothing the trial could tell from 0, a strategy's
#: least energy among null readings on a noisy job, is not worth a verification's minutes);
#: sds.
VERIFY_MIN_Z = 1.0
#: Length of one verification window; s.
VERIFY_WINDOW_S = 4.0
#: The shortest window of a verification where either arm holds a pair of its own in the
#: wait group: that pair's requests land after the next step has begun, and a change of arm
#: leaves a cost that a short window reads as the candidate's (the simulated H200 layer on
#: the sync job: 1440/3201 with the wait group against stock with it reads 1.3 points less
#: saving in 2-s windows, 0.9 in 4-s, 0.2 in 8-s; experiments/window_bias.py). Exploring trials
#: keep theirs: on the 3080 Ti layer with the vision job's waits, 8-s windows let a wait pair's
#: first trial (+29% in the step's truth) run long enough to take one seed's cumulative
#: slowdown to 1.03% in the card's truth; s.
WAIT_GROUP_WINDOW_S = 8.0
#: Verifications in a row of one group's next-best pairs after a verification that proved the
#: saving but measured the time over the budget (each next pair explored faster than the one
#: before it); verifications.
MAX_FALLBACKS = 2
#: A-B-B-A blocks of a verification run; blocks.
VERIFY_BLOCKS = 4
#: Most A-B-B-A blocks of a verification extended while its time bound is undecided; blocks.
VERIFY_MAX_BLOCKS = 12
#: A-B-B-A blocks verifying a prior that jobs before proved in training (a stored plan): the
#: adoption test is the same, on fewer blocks (more when its time is undecided); blocks.
PROVEN_VERIFY_BLOCKS = 2
#: Standard deviations beyond the budget at which a candidate's measured time abandons it; sds.
ABANDON_Z = 3.0
#: Candidate time measured before it may be abandoned on time (the guard acts at once); s.
ABANDON_MIN_S = 0.3
#: Slack kept back in the budget account at all times, as seconds per step of the worst case.
GUARD_STEPS = 2
#: Most trials of one group before its best is verified; trials.
MAX_TRIALS_PER_GROUP = 20
#: The search strategy by default (policies/registry.py); why: docs/design-step-tuner.md.
DEFAULT_STRATEGY = "botorch"
#: The strategy's stopping tolerance (relative expected improvement); BoTorch's own 0.002 stops
#: after 5 noisy trials on the 3080 Ti layer, short of the best pair; a fraction.
STRATEGY_TOL = 1e-4
#: Length of one drift-watch window once Settled; s.
WATCH_WINDOW_S = 1.0
#: Watch windows within which an output stream's alarm must recur to be acted on (a window
#: is WATCH_WINDOW_S); windows.
WATCH_CONFIRM_WINDOWS = 5
#: Watch windows a stream learns its baseline over before it may alarm; windows.
WATCH_WARMUP = 10
#: Longest wait at stock for the temperature to settle after an alarm; s.
RETUNE_SETTLE_MAX_S = 300.0
#: Stock run after an alarm before the temperature may count as settled; s.
RETUNE_MIN_S = 5.0
#: The latest SM clock readings at stock (a reference's, or after an alarm) whose median is
#: stock's clock; readings.
RETUNE_CLOCK_READINGS = 64
#: Drop of stock's SM clock after an alarm, against the reference before, from which the plan
#: before is verified with its core clocks lowered as much (moved_with_stock); a fraction.
RETUNE_CLOCK_DROP = 0.02
#: Shortest trial window of pooled ranks (for_ranks shortens windows no further); s.
MIN_POOLED_WINDOW_S = 0.5
#: Fewest A-B-B-A blocks of a pooled trial or verification (the adoption needs two); blocks.
MIN_POOLED_BLOCKS = 2
#: Largest slowdown budget a tuner takes (a test or smoke check on a loaded CPU keeps the guard
#: out of the way with 1.0 or more; anything beyond is a typing error); a fraction (100: 10,000%).
MAX_BUDGET = 100.0
#: Longest a measuring length, a clock-switch latency or an energy-update period may be (a
#: larger one is a unit or typing error); s.
MAX_TIMING_S = 1e7


@dataclass(frozen=True)
class StepTiming:
    """How long the tuner measures: the module's constants by default; a short job or a test
    passes shorter ones (StepTuner's `timing`).

    Attributes:
        reference_s: training at stock measured as the reference, s (at least: a noisy job
            measures stock longer, runtime/trials.py: StockReference).
        trial_window_s: length of one trial window, s.
        trial_blocks: A-B-B-A blocks of one trial before it may end decided.
        trial_max_blocks: most blocks of a trial while its decision is open (at least
            trial_blocks).
        reference_max_s: the longest reference of a noisy job, s (None: REFERENCE_MAX_S /
            REFERENCE_S x reference_s, 300 s at the defaults).
        verify_window_s: length of one verification window, s.
        verify_blocks: A-B-B-A blocks of a verification run.
        verify_max_blocks: most blocks of a verification extended while its time is undecided.
        max_trials_per_group: most trials of one group before its best is verified.
        watch_window_s: length of one drift-watch window once Settled, s.

    Raises:
        KdvfsError: a length that is not finite, > 0 and at most MAX_TIMING_S, or a count that
            is not a whole number >= 1 (verify_max_blocks at least verify_blocks).
    """

    reference_s: float = REFERENCE_S
    trial_window_s: float = TRIAL_WINDOW_S
    trial_blocks: int = TRIAL_BLOCKS
    trial_max_blocks: int = TRIAL_MAX_BLOCKS
    reference_max_s: float | None = None
    verify_window_s: float = VERIFY_WINDOW_S
    verify_blocks: int = VERIFY_BLOCKS
    verify_max_blocks: int = VERIFY_MAX_BLOCKS
    max_trials_per_group: int = MAX_TRIALS_PER_GROUP
    watch_window_s: float = WATCH_WINDOW_S

    def __post_init__(self) -> None:
        for name in ("reference_s", "trial_window_s", "verify_window_s", "watch_window_s"):
            finite_number(f"StepTiming.{name}", getattr(self, name), 0.0, MAX_TIMING_S, open_low=True)
        if self.reference_max_s is not None:
            finite_number(
                "StepTiming.reference_max_s", self.reference_max_s, 0.0, MAX_TIMING_S, open_low=True
            )
        for name in (
            "trial_blocks",
            "trial_max_blocks",
            "verify_blocks",
            "verify_max_blocks",
            "max_trials_per_group",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise KdvfsError(f"StepTiming.{name} must be a whole number >= 1, got {value!r}")
        if self.verify_max_blocks < self.verify_blocks:
            raise KdvfsError(
                f"StepTiming.verify_max_blocks must be >= verify_blocks ({self.verify_blocks}), "
                f"got {self.verify_max_blocks}"
            )

    @classmethod
    def for_ranks(cls, ranks: int) -> StepTiming:
        """The lengths for `ranks` pooled data-parallel ranks: n energy samples a window, so a
        trial measures 1/n of one rank's training for the same energy error: blocks first
        (down to MIN_POOLED_BLOCKS), then windows (down to MIN_POOLED_WINDOW_S); the reference
        is 1/n as long (still three windows at least). The step time is one sample however
        many ranks (they wait for one another), so a verification whose time bound is
        undecided may extend to as much training as one rank's would. One rank: the constants."""
        if ranks <= 1:
            return cls()
        blocks = max(MIN_POOLED_BLOCKS, round(TRIAL_BLOCKS / ranks))
        verify_blocks = max(MIN_POOLED_BLOCKS, round(VERIFY_BLOCKS / ranks))
        verify_window_s = max(MIN_POOLED_WINDOW_S, VERIFY_WINDOW_S * VERIFY_BLOCKS / (ranks * verify_blocks))
        return cls(
            reference_s=REFERENCE_S / ranks,
            trial_window_s=max(MIN_POOLED_WINDOW_S, TRIAL_WINDOW_S * TRIAL_BLOCKS / (ranks * blocks)),
            trial_blocks=blocks,
            verify_window_s=verify_window_s,
            verify_blocks=verify_blocks,
            verify_max_blocks=max(
                verify_blocks, round(VERIFY_MAX_BLOCKS * VERIFY_WINDOW_S / verify_window_s)
            ),
        )


# --- phases: each holds its own data; its docstring lists its transitions ----------------------
@dataclass
class Search:
    """What the exploration of one reference's groups carries from phase to phase.

    Attributes:
        order: the groups to explore, in order (STEP_GROUP first on a run without a prior,
            then the longest group first).
        first: group -> the pair it tries first (after an alarm: the plan before's; in a
            reopened round: the group's best so far); empty at the start of a run.
        round: 0, then 1, 2, ... for each reopening of undecided groups.
        window_s: the trial window of this round, s.
        started_s: when the round began (the report's clock), s.
        reopen: the groups whose trials or verification ended undecided in this round.
    """

    order: list[int]
    first: dict[int, ClockPair | None] = field(default_factory=dict)
    round: int = 0
    window_s: float = TRIAL_WINDOW_S
    started_s: float = 0.0
    reopen: list[int] = field(default_factory=list)

    def after(self, group: int) -> int:
        """The position in `order` of the group after `group`."""
        return self.order.index(group) + 1


@dataclass
class Reference:
    """Stock measured in training: windows of whole steps at stock, every segment its own group.

    Transitions:
        -> Verifying (a whole schedule): stock is measured and a schedule waits to be verified
           (the prior at the start of a run; after an alarm, the plan before or the replan).
        -> Exploring: stock is measured and nothing waits: the whole step's search at one pair
           (a first reference without a prior, more than one group), else the longest group's.
        -> Settled: stock is measured and no group is left to explore.
        -> Retuning: the power limit moved, or the rank pool was lost.

    Attributes:
        schedule: the stock schedule run (one group a segment).
        window_s: length of one reference window, s.
        min_s: training measured before the reference may end, s.
        schedule_before: after an alarm, the schedule verified first (None: the prior's turn).
        explore: after an alarm, the groups to explore again (None: all).
        first: group -> the pair it tries first.
        max_margin: the reference goes on while the 95% margin of its stock step time exceeds
            this (a noisy job measures stock longer), a fraction.
        max_s: ... but no longer than this, s.
        fine_margin: ... and on to this margin for fine_max_s at most, a fraction (inf: not
            on).
        fine_max_s: the longest the reference goes on for fine_margin, s.
        measured: the windows so far (runtime/trials.py: StockReference).
        sm_clocks_mhz: the SM clock its reports read (the latest RETUNE_CLOCK_READINGS), MHz.
    """

    schedule: Schedule
    window_s: float = TRIAL_WINDOW_S
    min_s: float = REFERENCE_S
    schedule_before: Schedule | None = None
    explore: tuple[int, ...] | None = None
    first: dict[int, ClockPair | None] = field(default_factory=dict)
    max_margin: float = math.inf
    max_s: float = REFERENCE_MAX_S
    fine_margin: float = math.inf
    fine_max_s: float = REFERENCE_FINE_MAX_S
    measured: StockReference = field(init=False)
    sm_clocks_mhz: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.measured = StockReference(
            self.schedule,
            self.window_s,
            self.min_s,
            self.max_margin,
            self.max_s,
            self.fine_margin,
            self.fine_max_s,
        )


@dataclass
class Exploring:
    """Trials of one group's candidates through the strategy's Task of that group.

    Transitions:
        -> Exploring (itself): a trial ends; the strategy is told and asked again (a strategy
           answering ASK_LATER is asked again at the next step).
        -> Verifying (the group's best): the strategy has converged or reached the group's
           trial cap, and its best differs from the incumbent's pair.
        -> Exploring (the next group) or Settled (no group left): nothing to verify.
        -> Retuning: the power limit moved, or the rank pool was lost.

    Attributes:
        group: the group explored (its index in the incumbent).
        task: the strategy's Task of the group.
        search: the groups' order and first pairs (Search).
        trial: the trial running (None between trials).
        config: the candidate's index in the grid (None: not asked yet).
        trials: trials of this group so far.
        first: a config tried before the strategy is asked (the pair chosen before an alarm).
        waiting_steps: steps run at the incumbent waiting for budget slack.
        undecided: trials of this group that ended with their decision open.
        completed: trials of this group that completed at least one block, not abandoned.
        abandoned: trials of this group stopped before their decision (on time or slack).
    """

    group: int
    task: Task
    search: Search
    trial: Trial | None = None
    config: int | None = None
    trials: int = 0
    first: int | None = None
    waiting_steps: int = 0
    undecided: int = 0
    completed: int = 0
    abandoned: int = 0


@dataclass
class Screening:
    """Many groups at once (tuner/screening.py): the whole step probed at two low-clock
    corners around its pair (the one-knob pair adopted, else the top: its core clock lowered to
    the lowest at or above PROBE_CLOCK_SHARE of it at the top memory clock, and its memory clock
    lowered alike at its core clock) gives each group a candidate pair, the corner that slowed
    it least by its CUDA-event time; then the trials
    of a two-level orthogonal design each move half the groups to their candidates, and a
    weighted fit of the trials' savings on the design gives each group's share of the saving.

    Transitions:
        -> Screening (itself): a probe or a design trial ends and the next starts (or waits
           for the budget's slack).
        -> Verifying (the chosen groups at their candidates together): the design has run and
           some groups save, within the time the budget leaves.
        -> Exploring (the next group) or Settled (no group left): no group chosen.
        -> Retuning: the power limit moved, or the rank pool was lost.
        A verification of its choice that adopts enters Screening again (its round + 1, up to
        SCREEN_ROUNDS), the groups left at their pairs screened against the new incumbent.

    Attributes:
        search: the groups' order and first pairs (Search).
        probes: the corner pairs left to probe.
        base: the pair the probes lowered (the whole step's pair then).
        probed: pair -> each group's time per step with the whole step at it, s.
        probe_saving: pair -> the whole step's energy saving there per unit of its slowdown
            (one block: a direction's sign, not a figure to adopt on).
        candidates: group -> (its candidate pair, its extra time there, s per step).
        factors: the groups in the design, in its column order.
        rows: the design (design_rows), one row a trial (None until the probes are done).
        row: the next row to run.
        results: each row run: (its index, saving, the saving's standard error, B's group times
            per step in s).
        current: what the running trial measures: a probe's pair, or a row's index.
        trial: the trial running (None between trials).
        waiting_steps: steps run at the incumbent waiting for budget slack.
        round: 1, then 2, ... for each screening after an adopted one.
        extra_budgets: the candidates' extra times add up to at most this many budgets (halved,
            and the design built anew, when a quarter of its rows ran over the budget: the
            probes, every group at one pair, do not see what a row's mixed pairs cost); times.
        over_budget: rows of this design abandoned for their measured time.
        history: each group the rounds before fitted: (its candidate pair, its time under that
            round's incumbent s, its extra time there s, its own saving and error), which the
            relation of its kind is fitted over again (screening.pool_savings).
    """

    search: Search
    probes: list[ClockPair]
    base: ClockPair | None = None
    probed: dict[ClockPair, np.ndarray] = field(default_factory=dict)
    probe_saving: dict[ClockPair, float] = field(default_factory=dict)
    candidates: dict[int, tuple[ClockPair, float]] = field(default_factory=dict)
    factors: list[int] = field(default_factory=list)
    rows: np.ndarray | None = None
    row: int = 0
    results: list[tuple[int, float, float, np.ndarray]] = field(default_factory=list)
    current: ClockPair | int | None = None
    trial: Trial | None = None
    waiting_steps: int = 0
    round: int = 1
    extra_budgets: float = SCREEN_EXTRA_BUDGETS
    over_budget: int = 0
    history: list[tuple[ClockPair, float, float, float, float]] = field(default_factory=list)


@dataclass
class Trading:
    """Kinds of groups traded against each other (tuner/screening.py: `kinds_of`,
    `trade_clocks`). The groups are clustered into at most MAX_KINDS kinds by how their
    CUDA-event times followed the screening's probes (each probe's elasticity); a trade lowers
    the core clock of every group of one kind by SCREEN_LEAST_DROP at least and raises another
    kind's until the time it gives back, by the probe's elasticities, covers the first's extra
    time. A one-knob optimum spends the whole budget, so a group alone can only go down over
    the budget or up at a cost; a trade moves time from the kind whose time follows the clock
    to the kind whose time does not. The trades are tried the least elastic kind lowered
    against the most elastic raised first; a trade whose trial saves is verified, and after an
    adoption the trades start again from the new incumbent.

    Transitions:
        -> Trading (itself): a trade's trial ends and the next starts (or waits for slack).
        -> Verifying (the trade): its trial read a saving within the budget; after
           the verification (and the trade with its lowered groups one memory clock up, where
           it proved the saving over the budget on time), Trading again (the trades rebuilt
           where it adopted).
        -> Exploring (the next group) or Settled (no group left): no trade left saves.
        -> Retuning: the power limit moved, or the rank pool was lost.

    Attributes:
        search: the groups' order and first pairs (Search).
        kinds: the groups of each kind.
        elasticity: each group's share of its time that follows the core clock, lowered and
            raised (columns 0 and 1), from the one-knob search's trials and the trades' own.
        queue: the trades left to try under `built_for`.
        built_for: the incumbent the queue was built under (None: to be built, with what the
            last trade's trial measured).
        tried: the trades tried (at most max_trials_per_group of them).
        trial: the trial running (None between trials).
        waiting_steps: steps run at the incumbent waiting for budget slack.
    """

    search: Search
    kinds: list[list[int]]
    elasticity: np.ndarray
    queue: list[Schedule] = field(default_factory=list)
    built_for: Schedule | None = None
    tried: list[Schedule] = field(default_factory=list)
    trial: Trial | None = None
    waiting_steps: int = 0


@dataclass
class Verifying:
    """A candidate against the incumbent over a longer run: a group's best (group: its index),
    or a whole schedule (group None: the prior, or the plan before an alarm).

    Transitions:
        -> Verifying (itself, more blocks): the adoption is still open (a sequential trial:
           from verify_blocks to verify_max_blocks blocks).
        -> Verifying (a new one, the group's next-best pair): the saving was proven but the
           time measured over the budget, and a pair the group's decided trials measured
           faster, with a saving, is left, else the verified core clock at the next memory
           clock up, if untried (a trade: each group it lowered one memory clock up); at most
           MAX_FALLBACKS in a row.
        -> Verifying (the same candidate, its blocks kept): the verification reached its
           longest length undecided, its saving at GO_ON_Z errors or more and its time
           possibly within the budget (at most GO_ON_EXTENSIONS times), judged as the next
           verification of what it moves.
        -> Exploring (the next group; after a whole schedule, the first) or Settled (no group
           left): the verification is judged, the candidate adopted or not.
        -> Retuning: the power limit moved, or the rank pool was lost.

    Attributes:
        group: the group verified (None: a whole schedule).
        trial: the verification's A-B-B-A trial.
        search: the groups' order and first pairs (Search).
        adopted: the judgement (None until judged).
        explored_undecided: the group's exploring trials that ended undecided (a group
            verified after any is reopened later, adopted or not: a pair they left open may
            save more than the one adopted).
        z: the standard errors the adoption must exceed at each of the trial's looks (its
            blocks from the first judged to the last: `sequential_z`, so that its false rate
            over all looks is that of one look at `verification_z`: ADOPT_Z for a group's
            first verification, stricter for each one after); sds.
        first_look: the block after which the test was first judged (a verification going on
            from an earlier one of the same candidate and incumbent: that one's); blocks.
        screened: the screening whose choice is verified (None: not a screening's).
        traded: the trades whose trade is verified (None: not a trade).
        over_time: the judgement proved the saving but put the time over the budget (or the
            trial was stopped on its measured time); the group's next-best pair may follow.
        fallbacks: the verifications of next-best pairs before this one, in a row; verifications.
        time_diff: the candidate's step time against the incumbent's as the verification
            measured it (NaN until judged); a fraction.
        extensions: the times this candidate's verification went on undecided before this
            one; verifications.
        saving_z: the judged saving over its standard error (NaN until judged); sds.
        time_open: the judgement left the candidate's time possibly within the budget (its
            slowdown less VERIFY_TIME_Z time errors within it, the trial not stopped on time).
    """

    group: int | None
    trial: Trial
    search: Search
    adopted: bool | None = None
    explored_undecided: int = 0
    z: float = ADOPT_Z
    first_look: int = 1
    screened: Screening | None = None
    traded: Trading | None = None
    over_time: bool = False
    fallbacks: int = 0
    time_diff: float = math.nan
    extensions: int = 0
    saving_z: float = math.nan
    time_open: bool = False


@dataclass
class Settled:
    """The incumbent runs under the drift watch: windows of its group times and energy.

    Transitions:
        -> Retuning: a stream of the watch (a group's time, the step's energy) or a condition
           (the power limit, the settled temperature with throttling) moved, or the rank pool
           was lost.
        -> Exploring (a reopened round): some groups ended undecided, reopen_at_s has come and
           the budget's slack covers a trial: they are tried again with windows twice as long.
        -> Settled (itself): a card that warmed without throttling keeps its plan.
        The incumbent falls back to stock (no phase change) when the budget's guard is reached.

    Attributes:
        since_step: the step it settled at.
        window: the watch window open (None between windows).
        expected: the first window's values, the streams' baseline.
        reopen: the groups to try again (ended undecided); empty: none.
        round: the round that ended here.
        reopen_at_s: when they may be tried again (the report's clock), s.
        first: group -> its best pair so far (tried first when reopened).
        window_s: the trial window of the round that ended, s.
        noise_window: a window of the trial window's length, open beside the watch's: with
            the one before it (`noise_last`), a pair of windows of one schedule for the job's
            noise, so that the noise is kept up to date while no trial runs (at the length a
            trial measures: a job's slow drifts add more to longer windows).
        noise_last: the noise window closed before (None at first).
    """

    since_step: int
    window: Window | PooledWindow | None = None
    noise_window: Window | PooledWindow | None = None
    noise_last: Window | PooledWindow | None = None
    expected: dict[str, float] | None = None
    reopen: tuple[int, ...] = ()
    round: int = 0
    reopen_at_s: float = math.inf
    first: dict[int, ClockPair | None] = field(default_factory=dict)
    window_s: float = TRIAL_WINDOW_S


@dataclass
class Retuning:
    """After an alarm: stock until the temperature is flat again (or RETUNE_SETTLE_MAX_S).

    Transitions:
        -> Reference: RETUNE_MIN_S of stock have run and the temperature is flat (or
           RETUNE_SETTLE_MAX_S passed; a lost pool, which says nothing of the card, waits
           RETUNE_MIN_S only); the plan before (or the replan) is verified first;
           without a replan, where stock now runs at a lower SM clock than at the reference
           before (a lower power limit, a hot card), with its core clocks lowered as much
           (`moved_with_stock`).

    Attributes:
        since_s: when the alarm came, s (the report's clock).
        reasons: the streams or conditions that moved.
        groups: the groups to explore again (their own time moved; all when a condition or
            the energy moved).
        schedule_before: the schedule adopted before the alarm (the plan so far).
        sm_clocks_mhz: the SM clock the reports read at stock since the alarm (the latest
            RETUNE_CLOCK_READINGS), MHz.
    """

    since_s: float
    reasons: tuple[str, ...]
    groups: tuple[int, ...]
    schedule_before: Schedule
    sm_clocks_mhz: list[float] = field(default_factory=list)

    @property
    def settles(self) -> bool:
        """Whether the reference waits for a flat temperature (not after a lost pool alone,
        which says nothing of the card)."""
        return self.reasons != ("pool",)


Phase = Reference | Exploring | Screening | Trading | Verifying | Settled | Retuning


def moved_with_stock(plan: Schedule, ratio: float, pairs: Sequence[ClockPair]) -> Schedule:
    """The plan with each pair's core clock times `ratio` (stock's SM clock now over stock's at
    the reference the plan was found against: a lower power limit or a hot card holds stock
    lower, and the plan's pairs lose what they saved against it), down to the grid's highest
    core clock at or below that, at the pair's memory clock. A pair with no such clock, and
    stock, stay."""
    groups = []
    for start, pair in plan.groups:
        if pair is not None:
            pair = highest_at_or_below(pairs, pair.mem_mhz, pair.core_mhz * ratio) or pair
        groups.append((start, pair))
    return Schedule(tuple(groups))


def highest_at_or_below(pairs: Sequence[ClockPair], mem_mhz: int, core_mhz: float) -> ClockPair | None:
    """The pair at the memory clock with the highest core clock at or below `core_mhz` (None:
    none)."""
    below = [p for p in pairs if p.mem_mhz == mem_mhz and p.core_mhz <= core_mhz]
    return max(below, key=lambda p: p.core_mhz, default=None)


def _latest_clocks(clocks_mhz: list[float], report: StepReport) -> list[float]:
    """The latest RETUNE_CLOCK_READINGS SM clock readings with the report's (where it has one)."""
    if not math.isfinite(report.sm_clock_mhz):
        return clocks_mhz
    return [*clocks_mhz[1 - RETUNE_CLOCK_READINGS :], report.sm_clock_mhz]


def verification_z(nth: int) -> float:
    """The single look's boundary, in standard errors, of a group's nth verification since the
    run's last alarm: ADOPT_Z for the first, then at 1/nth^2 of its one-sided false rate, so
    that however often a reopened group is verified its false rate over the run stays within
    1.65x (pi^2 / 6) of one verification's; sds."""
    if nth < 1:
        raise ValueError(f"verification_z: nth counts from 1, got {nth}")
    return ADOPT_Z if nth == 1 else NormalDist().inv_cdf(1.0 - NormalDist().cdf(-ADOPT_Z) / nth**2)


def _first_look(trial: Trial, outcome: Outcome, judgement: Judgement | None) -> tuple[Judgement | None, int]:
    """A trial's judgement at its first look and that look's blocks: the one its decider kept,
    or, for a trial that ended at that look without being asked (a trial whose first look is
    its last), its final judgement; (None, 0) for one that ended before it."""
    first_blocks = trial.min_blocks or trial.blocks
    if trial.first_look is not None:
        return trial.first_look, first_blocks
    if judgement is not None and not outcome.abandoned and outcome.blocks == first_blocks:
        return judgement, first_blocks
    return None, 0


# --- events: what the tuner tells its subscribers (tuner/run.py, MLflow, progress) -----------
@dataclass(frozen=True)
class PhaseEntered:
    """The tuner entered a phase (its class name), at a step and a time (the report's clock, s)."""

    step: int
    end_s: float
    phase: str


@dataclass(frozen=True)
class TrialFinished:
    """A trial ("trial") or a verification ("verify") ended: its candidate and Outcome, for a
    verification whether the candidate was adopted (None for a trial), the Judgement the
    tuner read it by at its end (saving and slowdown with the errors it stated for them; None
    where no block completed, and for the screening's probes and rows), the length of its
    windows (s), and the Judgement at its first look with that look's blocks (None, 0: it
    ended before one, or it is a probe or a row of fixed length)."""

    step: int
    end_s: float
    kind: str
    group: int | None
    candidate: Schedule
    outcome: Outcome
    adopted: bool | None
    judgement: Judgement | None = None
    window_s: float = math.nan
    first_look: Judgement | None = None
    first_look_blocks: int = 0


@dataclass(frozen=True)
class Alarm:
    """What the drift watch saw: when (training s), which streams or conditions, whether the
    plan was held (a card warming without throttling)."""

    step: int
    end_s: float
    reasons: tuple[str, ...]
    held: bool = False


@dataclass(frozen=True)
class Adoption:
    """A candidate adopted after verification: when, which schedule, its measured figures."""

    step: int
    end_s: float
    schedule: Schedule
    saving: float  # of the incumbent's step energy, a fraction
    saving_se: float
    slowdown: float  # against stock, as measured


TunerEvent = PhaseEntered | TrialFinished | Adoption | Alarm


class StepTuner:
    """Tunes a training job's clocks from its step reports (a state machine of the phases
    above; `subscribe` to its events). Build it through tuner/run.py's TuningRun, which every
    caller feeds.

    Args:
        workload: the kernels of one step (for where the job can switch: its passes).
        pairs: the card's supported clock pairs (the search grid), in its order.
        switch_latency_s: the card's clock-switch latency, s (finite, >= 0).
        energy_update_period_s: how often the card's energy counter advances, s (finite, > 0).
        budget: the largest cumulative slowdown against stock, a fraction from 0 to
            MAX_BUDGET (0.01: 1%).
        strategy: the search strategy: a name (kdvfs.policies.registry), made here with `seed`
            and `strategy_options`, or the strategy itself (e.g. the service's,
            service/client.py).
        seed: seeds a strategy made here.
        boundaries: kernel indices where the job can switch clocks (default: the step and each pass).
        strategy_options: passed to a strategy made here (e.g. tol).
        prior: a schedule planned before training (step_priors.prior_schedule): its groups are
            explored, and it is verified against stock first; None: groups from segment times.
        replan: after a drift alarm, once the card has settled at stock: a plan for the new
            conditions from the report then (its power limit), verified first in place of the
            plan before; None, or it answering None: the plan before is verified.
        timing: how long the reference, trials, verifications and watch windows run
            (StepTiming); None: StepTiming.for_ranks of the pool's ranks.
        proven_prior: the prior is a plan that jobs before proved in training (a stored
            plan): verified over PROVEN_VERIFY_BLOCKS blocks, not verify_blocks.
        pool: the job's data-parallel ranks (runtime/ranks.py), each running this tuner with
            the same arguments: every step's report is gathered from all of them and every
            rank decides on the same pooled figures; None: this rank alone.
        expected_run_s: how long the job is expected to train, s (sets how long one trial may
            grow: TRIAL_RUN_SHARE of it); None: twice the training so far, at least
            MIN_EXPECTED_RUN_S.

    Raises:
        KdvfsError: a budget, latency or period that is not finite or out of its range (one
            line naming the parameter, its value and the range).
    """

    def __init__(
        self,
        workload: Workload,
        pairs: list[ClockPair],
        *,
        switch_latency_s: float,
        energy_update_period_s: float,
        budget: float = 0.01,
        strategy: str | Strategy = DEFAULT_STRATEGY,
        seed: int = 0,
        boundaries: list[int] | None = None,
        strategy_options: dict[str, float] | None = None,
        prior: Schedule | None = None,
        replan: Callable[[StepReport], Schedule | None] | None = None,
        timing: StepTiming | None = None,
        pool: RankPool | None = None,
        proven_prior: bool = False,
        expected_run_s: float | None = None,
    ) -> None:
        budget = finite_number("budget", budget, 0.0, MAX_BUDGET)
        switch_latency_s = finite_number("switch_latency_s", switch_latency_s, 0.0, MAX_TIMING_S)
        energy_update_period_s = finite_number(
            "energy_update_period_s", energy_update_period_s, 0.0, MAX_TIMING_S, open_low=True
        )
        if expected_run_s is not None:
            expected_run_s = finite_number("expected_run_s", expected_run_s, 0.0, 1e9, open_low=True)
        self.expected_run_s = expected_run_s
        self.pool = pool
        self.pool_lost: str | None = None  # why the pool was lost (None: it was not)
        self._left_pool = False
        self._timing_given = timing is not None
        timing = timing or StepTiming.for_ranks(pool.ranks if pool is not None else 1)
        self.workload = workload
        self.pairs = list(pairs)
        self.top_pair = ClockPair(max(p.core_mhz for p in self.pairs), max(p.mem_mhz for p in self.pairs))
        """The top core and the top memory clock of the grid (stock's clocks at their highest)."""
        self.switch_latency_s = switch_latency_s
        self.timing = timing
        self.settle_s = switch_latency_s + energy_update_period_s
        self.budget = budget
        self.account = StepAccount(budget)
        space = SearchSpace(np.array([[p.core_mhz, p.mem_mhz] for p in self.pairs], dtype=float))
        self.strategy: Strategy = (
            make_strategy(
                strategy,
                space,
                seed=seed,
                max_per_task=self.timing.max_trials_per_group,
                **(
                    ({"tol": STRATEGY_TOL} if takes_option(strategy, "tol") else {})
                    | (strategy_options or {})
                ),
            )
            if isinstance(strategy, str)
            else strategy
        )
        """The search strategy asked and told (made here from a name, or given)."""
        self.prior = prior
        self.proven_prior = proven_prior
        self.replan = replan
        if prior is not None:
            segments = [s for s, _ in prior.groups]
        else:
            segments = boundaries if boundaries is not None else pass_boundaries(workload)
        self.segments = sorted(set(segments) | {0})
        self.incumbent = Schedule(tuple((s, None) for s in self.segments))
        """The schedule adopted so far (the plan): stock until something is adopted."""
        self.wait_site: int | None = None
        """The kernel index of the wait group's start (None: the job has none; `wait_group`)."""
        self.fallbacks_to_stock = 0
        """Times the budget's guard put a plan back to stock (`_hold_budget`)."""
        self.wait_releases = False
        """Whether the wait group's segment outlasts a switch: its candidate is then stock
        (the clocks released there), not the grid's lowest pair (`_wait_site_of`)."""
        self.longest_wait_s = 0.0  # the largest mean wait per step of a report seen, s
        self.stock_energy_j = math.nan  # per step, measured in the reference
        self.stock_wait_s = math.nan  # the job's mean wait per step in the windows stock_energy_j reads, s
        self.incumbent_energy_j = math.nan  # per step, stock's times the adopted savings
        self.incumbent_step_s = math.nan
        """The incumbent's busy step time, s: the chain of adopted trials' paired time ratios from
        stock and the incumbent's own level (`_levels`), each weighted by its variance."""
        self._chain_step_s = math.nan  # the incumbent's step time by the chain of ratios alone, s
        self._chain_var = 0.0  # its relative variance: the adopted trials' time errors squared, added
        self._step_var = 0.0  # incumbent_step_s's relative variance (0 at stock: the account's margin)
        self._levels: dict[Schedule, ScheduleLevel] = {}  # each schedule tried since the reference
        self._warm_stock = ScheduleLevel()  # the windows at stock after the reference (a warm card)
        self.window_sd = math.nan  # relative s.d. of a TRIAL_WINDOW_S window's energy per step
        self.stock: StockFigures | None = None  # stock as the reference measured it
        self.noise = NoiseMeter()
        """The job's noise, kept up to date from pairs of windows of one schedule."""
        self.stock_margin = math.nan  # the account's 95% margin on the stock step time, a fraction
        self._reference_s = 0.0  # settled seconds of every window run at stock, s (one rank's)
        self._stock_time_s = 0.0  # their steps' time, every rank's, s
        self._stock_steps = 0  # their steps, every rank's
        self._trial_seconds: list[float] = []  # training seconds of each finished trial, s
        self._trials_per_group: list[int] = []  # trials each explored group took
        self.adoptions: list[Adoption] = []
        self.trials = 0  # trials started, verifications included
        self.retunes = 0
        self.phase: Phase = self._new_reference(self.incumbent)
        self.phases: list[str] = ["Reference"]
        self.group_times_s: list[float] = []  # each group's stock time per step, s
        self.incumbent_group_times_s: list[float] = []  # each group's time under the incumbent, s
        self.conditions = ConditionWatch()
        self.watch: DriftMonitor | None = None
        self.alarms: list[Alarm] = []
        self.stock_clock_mhz = math.nan
        """Stock's SM clock at the latest reference (the median of its reports'), MHz."""
        self._listeners: list[Callable[[TunerEvent], None]] = []
        self._moved: list[str] = []  # conditions that moved before the watch acts on them
        self._now_s = 0.0  # this step's end, s (the report's clock)
        self._feed: StepReport | list[StepReport] | None = None  # what windows count this step
        self.stalls = StallFilter()
        """The job's stalls inside its steps (runtime/trials.py: StallFilter)."""
        self._answered: Schedule = self.incumbent  # the schedule the last answer asked for
        self.report: StepReport | None = None
        """The last step's report as the tuner counted it (a stall's excess in its wait)."""
        self._now: float | tuple[float, ...] = 0.0  # this step's end on each rank's clock, s
        self._ranks = 1 if pool is None else pool.ranks
        self._best_so_far: dict[int, ClockPair] = {}  # group -> the strategy's best pair so far
        self._verified: dict[int | None, int] = {}  # group -> its verifications since the last alarm
        self._screen_verified: dict[int, int] = {}  # group -> the screenings' verifications that moved it
        # group -> what its decided trials measured since the last alarm: (the incumbent then,
        # config, time and energy as ratios of the task's reference), told again to a reopened round
        self._decided: dict[int, list[tuple[Schedule, int, float, float]]] = {}
        # (group, the incumbent then, config) -> its latest completed trial's judged saving over
        # that saving's standard error (VERIFY_MIN_Z)
        self._saving_z: dict[tuple[int, Schedule, int], float] = {}
        # (incumbent, candidate) -> the whole blocks of its verification that did not adopt, and
        # the block it was first judged after: verified again, it goes on from them
        self._unadopted: dict[tuple[Schedule, Schedule], tuple[list[Window | PooledWindow], int]] = {}
        self._waiting_window: Window | PooledWindow | None = None  # stock measured while waiting
        # whole-step pair -> each group's time per step (s) under it, from the one-knob search's
        # trials (their B windows' CUDA events): how each group's time follows the clocks, which
        # the trades tell the kinds of groups by
        self._step_times: dict[ClockPair, np.ndarray] = {}

    # --- the entry point and the events ----------------------------------------------------
    def subscribe(self, listener: Callable[[TunerEvent], None]) -> None:
        """Call `listener` with each event (PhaseEntered, TrialFinished, Adoption, Alarm), in
        order, on the thread that feeds the tuner."""
        self._listeners.append(listener)

    def on_step_end(self, report: StepReport) -> Schedule:
        """Take one step's report; the schedule for the next steps (pooled: every rank calls
        it each step, a collective)."""
        fresh = self.stalls.is_fresh(self._answered)  # its first steps: judged by the bound
        worst_ratio = 1.0 + self._worst_slowdown(self._answered) if fresh else math.inf
        report = self.stalls.apply(report, self._answered, worst_ratio)  # a stall's excess: the job's wait
        self.report = report
        self._answered = self._step(report)
        return self._answered

    def _step(self, report: StepReport) -> Schedule:
        reports = self._gather(report)
        if reports is not None:
            self._feed, self._now = reports, tuple(r.end_s for r in reports)
            report = pooled_report(reports)
        else:
            self._feed, self._now = report, report.end_s
        # the clocks' account: busy time (the job's own waits for its host are not the clocks')
        self.account.charge(
            report.step_time_s - report.wait_s, report.steps, at_stock=self._answered.is_stock
        )
        if self.stock is not None:  # the job's noise as measured now (the account's own margin)
            self.account.noise_per_root_s = self.time_sd_per_root_s
        self._now_s = report.end_s
        if math.isfinite(report.wait_s):
            self.longest_wait_s = max(self.longest_wait_s, report.wait_s)
        phase = self.phase
        if math.isfinite(report.temperature_c):
            moved = self.conditions.update(report.end_s, report.temperature_c, report.power_limit_w)
            # the temperature is the settled plan's: trials move it, the power limit moves alone
            self._moved += [m for m in moved if isinstance(phase, Settled) or m == "power_limit"]
        if self.pool_lost is not None and not self._left_pool:
            self._leave_pool(report)
            return self.incumbent
        if "power_limit" in self._moved and not isinstance(phase, Retuning | Settled):
            self._moved = []  # a new limit ends any trial at once: its figures are void
            return self._alarm(report, ("power_limit",), None)
        if isinstance(phase, Retuning):
            return self._retuning(phase, report)
        if isinstance(phase, Reference):
            return self._reference(phase, report)
        if isinstance(phase, Exploring):
            return self._exploring(phase, report)
        if isinstance(phase, Screening):
            return self._screening(phase, report)
        if isinstance(phase, Trading):
            return self._trading(phase, report)
        if isinstance(phase, Verifying):
            return self._verifying(phase, report)
        return self._settled(phase, report)

    def current_task(self) -> Task | None:
        """The Task of the group being explored (None outside Exploring): what the strategy
        is asked about (the Gymnasium environment observes it)."""
        return self.phase.task if isinstance(self.phase, Exploring) else None

    def _emit(self, event: TunerEvent) -> None:
        for listener in self._listeners:
            listener(event)

    def _gather(self, report: StepReport) -> list[StepReport] | None:
        """Every rank's report of this step (None: this rank is alone, or the pool is lost)."""
        if self.pool is None:
            return None
        try:
            return self.pool.gather(report)
        except PoolLost as exc:
            self.pool, self._ranks, self.pool_lost = None, 1, str(exc) or "pool lost"
            return None

    def _leave_pool(self, report: StepReport) -> None:
        """The pool is lost: what was measured over every rank no longer compares with this
        rank's own windows, so stock is measured again (the retune path: the plan so far
        verified first, with one rank's timing) and this rank tunes alone."""
        if not self._timing_given:
            self.timing = StepTiming()
        self._left_pool = True
        self._alarm(report, ("pool",), None)

    @property
    def stock_step_s(self) -> float:
        return self.account.stock_step_s

    def stock_energy_at_wait_j(self, wait_s: float) -> float:
        """Stock's energy per step moved to a mean wait for the host of wait_s per step (the
        run's), as a trial moves its windows to a common wait (NoiseMeter.wait_power_w): the
        waits are the host's, so the windows that measured stock waiting longer or shorter
        than the run did says nothing of the clocks, J (stock_energy_j where either wait is
        unknown)."""
        stock_j = self.stock_energy_j
        if not (math.isfinite(wait_s) and math.isfinite(self.stock_wait_s)):
            return stock_j
        return energy_at_wait_j(stock_j, self.stock_wait_s, wait_s, self.noise.wait_power_w)

    def plan_energy_saving(self) -> float:
        """The incumbent's saving against stock, as measured (a fraction of stock's step energy)."""
        return 1.0 - self.incumbent_energy_j / self.stock_energy_j if self.adoptions else 0.0

    # --- phases ------------------------------------------------------------------------------
    def _enter(self, phase: Phase) -> None:
        self.phase = phase
        name = type(phase).__name__
        if self.phases[-1] != name:
            self.phases.append(name)
        self._emit(PhaseEntered(self.account.steps, self._now_s, name))

    def _new_reference(self, schedule: Schedule, **kwargs) -> Reference:
        """A reference of `schedule` (stock), within its longest length: until its 95% margin is
        REFERENCE_MARGIN_SHARE of the budget, and a run's first on to REFERENCE_FINE_MARGIN_SHARE
        for REFERENCE_FINE_MAX_S at most (scaled as the timing's reference_s is: pooled ranks
        count every rank's seconds); one after a drift alarm does not go on (the recovery
        waits on it, and the plan before is verified after it)."""
        t = self.timing
        max_s = t.reference_max_s
        if max_s is None:  # at most REFERENCE_RUN_SHARE of the run, so that trials have their turn
            max_s = min(
                REFERENCE_MAX_S / REFERENCE_S * t.reference_s,
                max(t.reference_s, REFERENCE_RUN_SHARE * self._expected_run_s()),
            )
        return Reference(
            schedule,
            t.trial_window_s,
            t.reference_s,
            max_margin=self.budget * REFERENCE_MARGIN_SHARE,
            max_s=max_s,
            fine_margin=math.inf if self.retunes else self.budget * REFERENCE_FINE_MARGIN_SHARE,
            fine_max_s=min(max_s, REFERENCE_FINE_MAX_S / REFERENCE_S * t.reference_s),
            **kwargs,
        )

    def _reference(self, ref: Reference, report: StepReport) -> Schedule:
        ref.sm_clocks_mhz = _latest_clocks(ref.sm_clocks_mhz, report)
        if not ref.measured.add(self._feed):
            return ref.schedule
        if ref.sm_clocks_mhz:
            self.stock_clock_mhz = float(np.median(ref.sm_clocks_mhz))
        search = self._finish_reference(ref, ref.measured.figures())
        before = ref.schedule_before if self.retunes else None
        plan = before if before is not None and any(p is not None for _, p in before.groups) else self.prior
        if plan is not None and any(p is not None for _, p in plan.groups):
            return self._verify(None, plan, search)
        return self._start_group(search, 0)

    def _finish_reference(self, ref: Reference, stock: StockFigures) -> Search:
        """Stock's figures kept; the groups (switchable ones on a first reference without a
        prior, else the segments) and the order they are explored in (the whole step first on
        a first reference without a prior)."""
        self.stock = stock
        self.stock_energy_j = self.incumbent_energy_j = stock.energy_per_step_j
        self.incumbent_step_s = self._chain_step_s = stock.busy_s
        self._chain_var = self._step_var = 0.0
        self._levels, self._warm_stock = {}, ScheduleLevel()
        self.window_sd = stock.window_sd
        self.noise.add_pairs(ref.measured.pairs())
        self._reference_s, self._stock_time_s, self._stock_steps = 0.0, 0.0, 0
        self._stock_energy_sum_j, self._stock_energy_steps = 0.0, 0.0
        self._stock_wait_sum_s = 0.0  # the waits x steps of those windows, s
        self._count_stock(ref.measured.windows, reference=True)
        segment_times = stock.segment_times_s
        first_run = self.prior is None and not self.retunes
        starts = self.segments
        if first_run:
            times_s, latency_s = list(segment_times), self.switch_latency_s
            starts = switchable_groups(self.segments, times_s, latency_s)
            self.wait_site = self._wait_site_of(starts, times_s)
            if self.wait_site is not None:  # the step's last pass is the wait group's
                starts = [*starts, self.wait_site]
            else:  # a pass too short for a group of its own takes the kernels beside it
                passes = [self.workload.kernels[i].pass_name for i in self.segments]
                starts = switchable_groups(self.segments, times_s, latency_s, passes)
        elif self.wait_site is not None and starts[-1] != self.wait_site:
            self.wait_site = None  # a plan without it (a replan): no wait group
        self.incumbent = Schedule(tuple((s, None) for s in starts))
        ends = [*starts[1:], len(self.workload)]
        times = [
            float(sum(t for s, t in zip(self.segments, segment_times) if a <= s < b))
            for a, b in zip(starts, ends)
        ]
        self.group_times_s = times
        self.incumbent_group_times_s = list(times)
        wait = self.wait_group
        held = len(starts) - (wait is not None)  # the groups that hold their clocks through kernels
        order = [int(g) for g in np.argsort(times)[::-1] if g != wait]  # the longest group first
        if ref.explore is not None:
            order = [g for g in order if g in ref.explore]
        if first_run and held > 1:
            order.insert(0, STEP_GROUP)  # the one-knob optimum first, then each group from it
        if first_run and held >= MIN_SCREEN_GROUPS and ref.explore is None:
            order.insert(1, TRADE_GROUP)  # then kinds of groups traded against each other
            order.insert(2, SCREEN_GROUP)  # then many groups at once, then each group alone
        if wait is not None and (ref.explore is None or wait in ref.explore):
            # where the card idles first: the held pairs are then tried with it; a releasing
            # wait group once the step holds a pair (released at stock, nothing changes)
            order.insert(1 if self.wait_releases and order[:1] == [STEP_GROUP] else 0, wait)
        return Search(order, dict(ref.first), window_s=self.timing.trial_window_s, started_s=self._now_s)

    def _wait_site_of(self, starts: list[int], segment_times_s: list[float]) -> int | None:
        """The step's last site, as the wait group's start (`wait_releases` set), where the card
        can idle through the job's waits at a pair of the group's own:
        - a request there lands after the step's kernels (its segment is shorter than the
          switch latency, so it runs at the clocks before it) and a wait of the job's can
          outlast its landing (a report's mean wait per step exceeded the latency less that
          segment's time): the card then idles at the group's pair, tried at the lowest;
        - or its segment outlasts a switch and the job waits, per step at stock (the
          reference's mean), at least RELEASE_MIN_WAIT_SHARE of the busy step: the group then
          releases the clocks (stock), so the card idles at its own lowest clock and the
          segment's last kernels run at stock (a low pair would slow them and lag into the
          next step).
        None where the step has one site, that site already starts a group, or the job's waits
        end before such a request lands (it is replaced by the next step's first)."""
        self.wait_releases = False
        if len(self.segments) < 2 or self.segments[-1] in starts:
            return None
        tail_s, latency_s = float(segment_times_s[-1]), self.switch_latency_s
        if tail_s < latency_s and self.longest_wait_s > latency_s - tail_s:
            return self.segments[-1]
        if tail_s >= latency_s and self.stock_wait_s >= RELEASE_MIN_WAIT_SHARE * self.stock_estimate_s:
            self.wait_releases = True
            return self.segments[-1]
        return None

    @property
    def wait_group(self) -> int | None:
        """The wait group's index in the incumbent (its last group; None: none)."""
        if self.wait_site is None or len(self.incumbent.groups) < 2:
            return None
        return len(self.incumbent.groups) - 1 if self.incumbent.groups[-1][0] == self.wait_site else None

    @property
    def wait_pair(self) -> ClockPair:
        """The pair a wait group that does not release is tried at: the grid's lowest core and
        memory clocks (the least idle draw), else the lowest core clock at the lowest memory
        clock."""
        low = ClockPair(min(p.core_mhz for p in self.pairs), min(p.mem_mhz for p in self.pairs))
        if low in self.pairs:
            return low
        mem = min(p.mem_mhz for p in self.pairs)
        return min((p for p in self.pairs if p.mem_mhz == mem), key=lambda p: p.core_mhz)

    def _holding_wait(self, schedule: Schedule) -> int | None:
        """The wait group where a schedule's holds a pair of its own (None: there is none, or it
        follows the group before it, requesting nothing new)."""
        wait = self.wait_group
        if wait is None or schedule.groups[wait][1] == schedule.groups[wait - 1][1]:
            return None
        return wait

    # --- the job's noise and the budget at 95% confidence --------------------------------------
    @property
    def time_sd_per_root_s(self) -> float:
        """The job's step-time noise: relative s.d. of a step time mean over 1 s (the
        NoiseMeter's once it has pairs, else the reference's; 0.005 before any)."""
        if self.noise.samples >= 2:
            return self.noise.time_sd_per_root_s
        return self.stock.time_sd_per_root_s if self.stock is not None else 0.005

    @property
    def energy_sd_per_root_s(self) -> float:
        """The job's energy noise: relative s.d. of a 1-s window's energy per step (NaN before
        the reference)."""
        if self.noise.samples >= 2:
            return self.noise.energy_sd_per_root_s
        if self.stock is None:
            return math.nan
        return self.stock.window_sd * math.sqrt(self.stock.window_s)

    def _count_stock(self, windows: list[Window | PooledWindow], reference: bool = False) -> None:
        """Windows run at stock (the reference's, a trial's A windows and the drift watch's
        while the plan is stock) refine the stock step time the account counts against; those
        after the reference (`reference` False) are also stock on a warm card (`_read_level`)."""
        if not reference:
            self._warm_stock.add(windows, self._ranks)
        for w in windows:
            if w.steps:
                self._reference_s += w.settled_s / self._ranks
                self._stock_time_s += w.busy_sum_s
                self._stock_steps += w.steps
                energy_j = w.energy_per_step_j
                if math.isfinite(energy_j):
                    self._stock_energy_sum_j += energy_j * w.steps / self._ranks
                    self._stock_energy_steps += w.steps / self._ranks
                    wait_s = float(np.mean([wait for wait, _ in w.rank_waits]))  # the ranks' mean
                    self._stock_wait_sum_s += wait_s * w.steps / self._ranks
        if self._stock_energy_steps > 0 and not self.adoptions:
            self.stock_energy_j = self._stock_energy_sum_j / self._stock_energy_steps
            self.stock_wait_s = self._stock_wait_sum_s / self._stock_energy_steps
            if self.incumbent.is_stock:
                self.incumbent_energy_j = self.stock_energy_j
        self._update_account_stock()

    def _level_of(self, schedule: Schedule) -> ScheduleLevel:
        return self._levels.setdefault(schedule, ScheduleLevel())

    def _read_level(self) -> None:
        """The incumbent's step time from the chain of adopted trials' paired time ratios and
        from its own level (every window it ran in since the reference) over stock's after the
        reference (a warm card's; the reference's where none ran after it), times the stock
        estimate the chain starts from, each weighted by the inverse of its variance (the job's
        time noise over the windows' seconds): a chain's errors add up with each adoption and
        a verification reads a plan at both arms' temperature, while the level's error shrinks
        as the plan runs. The groups' times move with it."""
        level = self._levels.get(self.incumbent)
        if self.incumbent.is_stock or level is None or level.seconds <= 0.0:
            return
        # unpaired, the level carries stock's error too (the chain's ratios are paired). A card
        # measured cold in the reference runs stock faster than once warm, as the level's own
        # steps run: over the reference, the level would read the plan that much slower.
        if self._warm_stock.seconds > 0.0:
            stock_s, stock_seconds = self._warm_stock.busy_s, self._warm_stock.seconds
        else:
            stock_s, stock_seconds = self.stock_estimate_s, self._reference_s
        level_s = self.stock_estimate_s * level.busy_s / stock_s
        level_var = self.time_sd_per_root_s**2 * (1.0 / level.seconds + 1.0 / max(stock_seconds, 1e-9))
        if not (math.isfinite(level_s) and level_var > 0.0 and math.isfinite(self._chain_step_s)):
            return
        if self._chain_var <= 0.0:
            return  # a chain without error (none adopted yet) is stock itself
        w_chain, w_level = 1.0 / self._chain_var, 1.0 / level_var
        step_s = (w_chain * self._chain_step_s + w_level * level_s) / (w_chain + w_level)
        self._step_var = 1.0 / (w_chain + w_level)
        if self.incumbent_group_times_s and self.incumbent_step_s > 0.0:
            scale = step_s / self.incumbent_step_s
            self.incumbent_group_times_s = [t * scale for t in self.incumbent_group_times_s]
        self.incumbent_step_s = step_s

    @property
    def stock_estimate_s(self) -> float:
        """The stock busy step time (the job's waits for its host left out: the clocks do not
        set them) over every window run at stock so far, s (NaN: none)."""
        return self._stock_time_s / self._stock_steps if self._stock_steps else math.nan

    def _update_account_stock(self) -> None:
        """The account counts against stock less its 95% margin (CONFIDENCE_Z x the job's time
        noise over the seconds measured at stock, at least REFERENCE_MARGIN), and holds back the
        margin of the other steps' own noise (StepAccount.noise_margin_s, at the job's time noise
        now): the run so far is within the budget at 95% confidence wherever the account says it
        is. While the plan is stock, the incumbent's step time is that stock too."""
        if self.stock is None or self._reference_s <= 0.0 or math.isnan(self.stock_estimate_s):
            return
        margin = CONFIDENCE_Z * self.time_sd_per_root_s / math.sqrt(self._reference_s)
        self.stock_margin = max(REFERENCE_MARGIN, margin)
        self.account.stock_step_s = self.stock_estimate_s * (1.0 - self.stock_margin)
        if self.incumbent.is_stock:
            self.incumbent_step_s = self.stock_estimate_s

    def resolvable(self, trial_s: float) -> tuple[float, float]:
        """The smallest energy and time differences (fractions) a trial of trial_s seconds
        resolves at ADOPT_Z standard errors, given the job's noise (NaN before the reference)."""
        return resolvable(self.energy_sd_per_root_s, trial_s), resolvable(self.time_sd_per_root_s, trial_s)

    def budget_trial_s(self) -> float:
        """How long a trial must run to resolve the budget's difference of step time at
        ADOPT_Z standard errors, given the job's noise, s (what a job this noisy allows: a
        slower candidate cannot be shown within the budget sooner)."""
        return trial_s_to_resolve(self.time_sd_per_root_s, self.budget)

    def expected_time_to_plan_s(self) -> float | None:
        """Training seconds until the groups left in this round are explored and verified, at
        the trials' lengths and counts so far, each trial at least as long as it takes to
        resolve the budget (`budget_trial_s`) (0 once Settled with nothing to reopen; None
        before the reference)."""
        phase = self.phase
        if isinstance(phase, Settled):
            return 0.0 if not phase.reopen else None
        search = getattr(phase, "search", None)
        if search is None:
            return None
        if isinstance(phase, Exploring):
            left = len(search.order) - search.after(phase.group) + 1
        elif isinstance(phase, Verifying) and phase.group is not None:
            left = len(search.order) - search.after(phase.group)
        else:
            left = len(search.order)
        trial_s = (
            float(np.median(self._trial_seconds))
            if self._trial_seconds
            else 4 * self.timing.trial_blocks * search.window_s
        )
        trial_s = max(trial_s, self.budget_trial_s())
        trials = float(np.median(self._trials_per_group)) if self._trials_per_group else 6.0
        verify_s = 4 * self.timing.verify_blocks * self.timing.verify_window_s
        return left * (trials * trial_s + verify_s)

    def _expected_run_s(self) -> float:
        if self.expected_run_s is not None:
            return self.expected_run_s
        return max(MIN_EXPECTED_RUN_S, 2.0 * self.account.spent_s)

    def _trial_max_blocks(self, window_s: float) -> int:
        """Most blocks of a trial with windows window_s long: as many as resolve RESOLVE_ENERGY
        at DECIDE_Z errors given the job's noise, within TRIAL_RUN_SHARE of the run's expected
        length; between trial_blocks and trial_max_blocks."""
        t = self.timing
        low, high = t.trial_blocks, max(t.trial_max_blocks, t.trial_blocks)
        sigma = self.energy_sd_per_root_s
        need = high
        if math.isfinite(sigma):
            need = math.ceil((DECIDE_Z * sigma / RESOLVE_ENERGY) ** 2 / (window_s * self._ranks))
        by_length = math.floor(TRIAL_RUN_SHARE * self._expected_run_s() / (4.0 * window_s))
        return int(min(max(min(need, by_length), low), high))

    # --- exploring -----------------------------------------------------------------------------
    def _start_group(self, search: Search, position: int) -> Schedule:
        if position >= len(search.order):
            return self._settle(search)
        g = search.order[position]
        if g == SCREEN_GROUP:
            return self._start_screening(search)
        if g == TRADE_GROUP:
            return self._start_trading(search)
        # the group's time as the incumbent runs it: the budget left is what it may add to that
        group_s = self.incumbent_step_s if g == STEP_GROUP else self.incumbent_group_times_s[g]
        extra_s = self._extra_allowed_s()
        wait = g == self.wait_group
        where = (
            "step" if g == STEP_GROUP else f"{'wait' if wait else 'group'}{g}@{self.incumbent.groups[g][0]}"
        )
        if wait and self.wait_releases:
            return self._start_release(search, position)
        current = self._own_pair(g)
        task = Task(
            key=f"{where}/{self.retunes}" + (f".{search.round}" if search.round else ""),
            ref_time_s=group_s,
            ref_energy_j=self.incumbent_energy_j,
            budget=max(extra_s / group_s, 0.0),
            # the incumbent's own pair is the trial's A arm: known, never a candidate
            reference=self.pairs.index(current) if current in self.pairs else None,
        )
        # a reopened round keeps what the rounds before decided under this incumbent (a decided
        # config is not measured again; what they left undecided is, with longer windows)
        for incumbent, config, time_ratio, energy_ratio in self._decided.get(g, []) if search.round else []:
            if incumbent == self.incumbent:
                self.strategy.tell(task, config, time_ratio * group_s, energy_ratio * self.incumbent_energy_j)
        first = self.wait_pair if wait else search.first.get(g)
        first_config = self.pairs.index(first) if first is not None and first != current else None
        if wait and first_config is None:  # it idles at the wait pair already
            return self._start_group(search, position + 1)
        self._enter(Exploring(g, task, search, first=first_config))
        return self._exploring(self.phase, None)

    def _start_release(self, search: Search, position: int) -> Schedule:
        """A releasing wait group (`wait_releases`): its one candidate, the clocks released
        there, verified at once (nothing to explore); skipped while the group before it is at
        stock (a release would change nothing) or it releases already."""
        g = search.order[position]
        candidate = self._with_pairs({g: None})
        if candidate == self.incumbent or self._pair_of(g - 1) is None:
            return self._start_group(search, position + 1)
        return self._verify(g, candidate, search)

    def _extra_allowed_s(self) -> float:
        """The time per step a candidate may add to the incumbent's: the budget less what the
        incumbent already spends and what its verification's time bound takes (`_proof_s`), s."""
        extra_s = self.budget * self.stock_step_s - (self.incumbent_step_s - self.stock_step_s)
        return extra_s - self._proof_s()

    # --- screening: many groups at once ---------------------------------------------------------
    def _start_screening(self, search: Search, after: Screening | None = None) -> Schedule:
        """The screening's probes (none after an adopted screening: its probes serve), then its
        design."""
        if after is not None:
            self._enter(
                Screening(
                    search,
                    [],
                    after.base,
                    dict(after.probed),
                    dict(after.probe_saving),
                    round=after.round + 1,
                    extra_budgets=after.extra_budgets,
                    history=list(after.history),
                )
            )
            return self._screening(self.phase, None)
        # the corners around the whole step's pair (the one-knob optimum adopted; else the top):
        # its core clock lowered at the top memory clock, and its memory clock lowered at its core
        top_mem = self.top_pair.mem_mhz
        base = self._pair_of(STEP_GROUP) or self.top_pair
        if base == self.top_pair and not self.incumbent.is_stock:
            # groups at pairs of their own (a trade adopted): no group at a base to probe around
            return self._start_group(search, search.after(SCREEN_GROUP))
        low_core = [
            p
            for p in self.pairs
            if p.mem_mhz == top_mem and PROBE_CLOCK_SHARE * base.core_mhz <= p.core_mhz < base.core_mhz
        ]
        low_mem = [
            p
            for p in self.pairs
            if p.core_mhz == base.core_mhz and PROBE_CLOCK_SHARE * base.mem_mhz <= p.mem_mhz < base.mem_mhz
        ]
        corners = [
            min(low_core, key=lambda p: p.core_mhz, default=None),
            min(low_mem, key=lambda p: p.mem_mhz, default=None),
        ]
        probes = [p for p in dict.fromkeys(corners) if p is not None]
        self._enter(Screening(search, probes, base))
        return self._screening(self.phase, None)

    def _screening(self, sc: Screening, report: StepReport | None) -> Schedule:
        if sc.trial is not None and report is not None:
            # a probe is meant to be slow: only the account's guard stops it
            outcome = self._feed_trial(sc.trial, time_check=not isinstance(sc.current, ClockPair))
            if outcome is not None:
                self._screen_ended(sc, outcome)
                sc.trial = None
        if sc.trial is None:
            candidate = self._next_screen(sc)
            if candidate is None:
                return self._screened(sc)
            probe = isinstance(sc.current, ClockPair)
            probe_s = 2.0 * (sc.search.window_s + self.settle_s) if probe else None
            if self._waits_for_slack(candidate, report is not None, probe_s):
                sc.waiting_steps += 1
                return self.incumbent
            blocks = 1 if probe else self.timing.trial_blocks
            sc.trial = Trial(
                self.incumbent,
                candidate,
                blocks,
                sc.search.window_s,
                self.settle_s,
                wait_power_w=self.noise.wait_power_w,
            )
            self.trials += 1
        if sc.trial.current is None:
            sc.trial.open(self._now)
        return sc.trial.schedule()

    def _next_screen(self, sc: Screening) -> Schedule | None:
        """The next trial's candidate (a probe's, then a design row's); None: the design is done."""
        if sc.probes:
            sc.current = sc.probes[0]
            return self._with_pair(STEP_GROUP, sc.current)
        if sc.rows is None:
            sc.candidates = self._screen_candidates(sc)
            sc.factors = sorted(sc.candidates)
            sc.rows = design_rows(len(sc.factors)) if sc.factors else np.zeros((0, 0))
        if sc.row >= len(sc.rows):
            return None
        sc.current = sc.row
        return self._with_pairs({g: sc.candidates[g][0] for g, x in zip(sc.factors, sc.rows[sc.row]) if x})

    def _screen_candidates(self, sc: Screening) -> dict[int, tuple[ClockPair, float]]:
        """Each group still at the probes' base gets a candidate, their extra times adding up to
        at most `extra_budgets` budgets (and each within what the budget leaves):
        first, the least extra time first, the probe that slowed it least (`candidate_pairs`);
        then, for a group whose probes all slow it too much, along the clock whose probe saved
        the most energy per unit of slowdown (else the other), its lowest clock that slows it
        by at most an equal share of its time (`candidate_clocks`), the shares adding up to the
        extra time left."""
        times_s = np.asarray(self.incumbent_group_times_s, dtype=float)
        allowed_s = self._extra_allowed_s()
        left_s = sc.extra_budgets * self.budget * self.stock_step_s
        at_base = {g for g in range(len(times_s)) if g != self.wait_group and self._own_pair(g) == sc.base}
        candidates: dict[int, tuple[ClockPair, float]] = {}
        found = candidate_pairs(sc.probed, times_s)
        for g, (pair, extra_s) in sorted(found.items(), key=lambda item: item[1][1]):
            if g in at_base and extra_s <= allowed_s and max(extra_s, 0.0) <= left_s:
                candidates[g] = (pair, extra_s)
                left_s -= max(extra_s, 0.0)
        rest = sorted(at_base - set(candidates))
        rest_s = float(np.sum(times_s[rest])) if rest else 0.0
        left_s = min(left_s, allowed_s)
        if sc.base is None or not rest_s > 0.0 or not left_s > 0.0:
            return candidates
        share = left_s / rest_s
        axes = []
        for probe, probed_s in sc.probed.items():
            rate = sc.probe_saving.get(probe, math.nan)
            if not rate > 0.0:
                continue  # lowering this clock cost the whole step energy
            core = probe.core_mhz < sc.base.core_mhz  # the core clock lowered, else the memory's
            if core:
                base_mhz, probe_mhz = sc.base.core_mhz, probe.core_mhz
                clocks = [p.core_mhz for p in self.pairs if p.mem_mhz == probe.mem_mhz]
            else:
                base_mhz, probe_mhz = sc.base.mem_mhz, probe.mem_mhz
                clocks = [p.mem_mhz for p in self.pairs if p.core_mhz == probe.core_mhz]
            along = candidate_clocks(times_s, probed_s, base_mhz, probe_mhz, clocks, share, SCREEN_LEAST_DROP)
            # each clock is one of the grid's beside the probe's other clock, below the base's
            pairs = {
                g: (ClockPair(int(f), probe.mem_mhz) if core else ClockPair(probe.core_mhz, int(f)), e)
                for g, (f, e) in along.items()
            }
            axes.append((rate, pairs))
        for _, pairs in sorted(axes, key=lambda a: -a[0]):
            for g, (pair, extra_s) in pairs.items():
                if g in rest and g not in candidates:
                    candidates[g] = (pair, extra_s)
        return candidates

    def _screen_ended(self, sc: Screening, outcome: Outcome) -> None:
        """A probe's group times kept, or a row's saving (with its standard error, as `judge`
        reads it: no smaller than the job's noise predicts)."""
        self._trial_ended(sc.trial, outcome)
        self._emit(
            TrialFinished(
                self.account.steps,
                self._now_s,
                "screen",
                SCREEN_GROUP,
                sc.trial.candidate,
                outcome,
                None,
                window_s=sc.trial.window_s,
            )
        )
        if isinstance(sc.current, ClockPair):
            b = [w for w in sc.trial.b_windows() if w.steps]
            if b:
                steps = np.array([w.steps for w in b], dtype=float)
                sc.probed[sc.current] = np.average([w.group_times_s for w in b], axis=0, weights=steps)
                if outcome.time_diff > 0.0 and math.isfinite(outcome.energy_diff):
                    sc.probe_saving[sc.current] = -outcome.energy_diff / outcome.time_diff
            sc.probes.pop(0)
            return
        if outcome.blocks > 0 and not outcome.abandoned:
            j = self.judge(outcome, sc.search.window_s, z=DECIDE_Z)
            sc.results.append(
                (sc.row, j.saving, j.saving_se, np.asarray(outcome.b_group_times_s, dtype=float))
            )
        elif outcome.abandoned and not sc.trial.undecided_stop:
            sc.over_budget += 1  # its measured time over the budget: the probes' times were low
        sc.row += 1
        if (
            sc.over_budget >= 2
            and 4 * sc.over_budget > sc.row
            and sc.extra_budgets > SCREEN_EXTRA_BUDGETS / 8
        ):
            # a quarter of the rows over the budget: half the extra time, a new design
            sc.extra_budgets /= 2.0
            sc.rows, sc.row, sc.results, sc.over_budget = None, 0, [], 0

    def _screened(self, sc: Screening) -> Schedule:
        """The design fitted: each group's saving pooled with the relation of the groups moved
        to the same pair (`pool_savings`: saving = a * time - b * extra time over this round's
        and the earlier rounds' estimates), the groups whose pooled saving exceeds SCREEN_Z
        errors, the largest per second first, within the time the budget leaves, verified
        together."""
        chosen: list[int] = []
        if sc.results:
            rows = sc.rows[[r for r, *_ in sc.results]]
            savings, ses = fit_savings(
                rows, [s for _, s, _, _ in sc.results], [e for _, _, e, _ in sc.results]
            )
            extra_s = []
            for k, g in enumerate(sc.factors):
                seen = [t[g] for (r, _, _, t), x in zip(sc.results, rows[:, k]) if x and t.size > g]
                extra_s.append(
                    float(np.mean(seen)) - self.incumbent_group_times_s[g] if seen else sc.candidates[g][1]
                )
            # each group's own estimate pooled with the relation its kind (its candidate pair)
            # follows over every screened group, this design's and the earlier rounds'
            times = [self.incumbent_group_times_s[g] for g in sc.factors]
            kinds = [sc.candidates[g][0] for g in sc.factors]
            own = list(zip(kinds, times, extra_s, savings, ses))
            savings, ses = pool_savings(savings, ses, times, extra_s, kinds, sc.history)
            sc.history.extend(own)
            picked = choose(savings, ses, extra_s, self._extra_allowed_s(), SCREEN_Z)
            chosen = [sc.factors[k] for k in picked]
        if not chosen:
            return self._start_group(sc.search, sc.search.after(SCREEN_GROUP))
        candidate = self._with_pairs({g: sc.candidates[g][0] for g in chosen})
        return self._verify(SCREEN_GROUP, candidate, sc.search, screened=sc)

    # --- trades: kinds of groups against each other ---------------------------------------------
    def _start_trading(self, search: Search) -> Schedule:
        """The kinds told apart by the one-knob search's trials, traded (Trading); the next group
        where the whole step is not at one pair, or there are fewer than two kinds."""
        base = self._pair_of(STEP_GROUP)
        elastic = self._elasticity(base) if base is not None else None
        if elastic is None:
            return self._start_group(search, search.after(TRADE_GROUP))
        held = [
            g for g in self._held(self.incumbent) if g != self.wait_group and np.all(np.isfinite(elastic[g]))
        ]
        kinds = [[held[i] for i in kind] for kind in kinds_of(elastic[held], MAX_KINDS)]
        if len(kinds) < 2:
            return self._start_group(search, search.after(TRADE_GROUP))
        self._enter(Trading(search, kinds, elastic))
        return self._trading(self.phase, None)

    def _elasticity(self, base: ClockPair) -> np.ndarray | None:
        """Each group's share of its time that follows the core clock about the whole step's pair
        `base`, down and up (columns 0 and 1: a raised clock gains less where the power cap
        holds it): the least-squares slope through 0 of its time under the one-knob search's
        pairs below (above) base's core clock at its memory clock within 2 SCREEN_LEAST_DROP of
        it (else the nearest), relative to its time under the incumbent, on base / f - 1,
        clipped to [0, 1] (as `elasticity`); a side without a pair takes the other's; None
        where none was measured."""
        now = np.asarray(self.incumbent_group_times_s, dtype=float)
        if not np.all(now > 0.0):
            return None
        sides = []
        for below in (True, False):
            points = [
                (p.core_mhz, t)
                for p, t in self._step_times.items()
                if p.mem_mhz == base.mem_mhz
                and (p.core_mhz < base.core_mhz) == below
                and p.core_mhz != base.core_mhz
                and t.size == now.size
            ]
            if not points:
                sides.append(None)
                continue
            # about the trades' own steps: the pairs within two of them, else the nearest
            near = [q for q in points if abs(base.core_mhz / q[0] - 1.0) <= 2.0 * SCREEN_LEAST_DROP]
            points = near or [min(points, key=lambda q: abs(q[0] - base.core_mhz))]
            x = np.array([base.core_mhz / f - 1.0 for f, _ in points])
            y = np.array([t / now - 1.0 for _, t in points])  # (points, groups)
            sides.append(np.clip((x @ y) / float(x @ x), 0.0, 1.0))
        if sides[0] is None and sides[1] is None:
            return None
        down = sides[0] if sides[0] is not None else sides[1]
        up = sides[1] if sides[1] is not None else sides[0]
        return np.column_stack([down, up])

    def _trades(self, tr: Trading) -> list[Schedule]:
        """The trades under the incumbent: for each two kinds, the first lowered a step of at
        least SCREEN_LEAST_DROP, alone where its extra time (by the elasticities) fits what the
        budget leaves, else with the second raised to give it back (`trade_clocks`); the kinds
        with the most time that does not follow the clock lowered first (the largest expected
        gain: a small kind's trade is below what a trial resolves, and each verification makes
        the next stricter), then the lowered kind's elasticity (time-weighted) less the raised
        one's, least first."""
        times = np.asarray(self.incumbent_group_times_s, dtype=float)
        mean_e = [np.average(tr.elasticity[k], axis=0, weights=np.maximum(times[k], 1e-12)) for k in tr.kinds]
        # the expected gain of lowering a kind: its time that does not follow the clock (the
        # energy a lower clock saves there costs no time)
        free_s = [float(np.sum(times[k] * (1.0 - tr.elasticity[k, 0]))) for k in tr.kinds]
        pairs = sorted(
            ((a, b) for a in range(len(tr.kinds)) for b in range(len(tr.kinds)) if a != b),
            key=lambda ab: (-free_s[ab[0]], mean_e[ab[0]][0] - mean_e[ab[1]][1]),
        )
        out: list[Schedule] = []
        for a, b in pairs:
            down, up = tr.kinds[a], tr.kinds[b]
            now = {g: self._own_pair(g) for g in down + up}
            lowered = {}
            for g in down:
                low = highest_at_or_below(
                    self.pairs, now[g].mem_mhz, now[g].core_mhz * (1.0 - SCREEN_LEAST_DROP)
                )
                if low is not None:
                    lowered[g] = low.core_mhz
            if len(lowered) < len(down):
                continue  # a group of the kind at its lowest clock: no trade of this kind down
            moves = {g: ClockPair(lowered[g], now[g].mem_mhz) for g in down}
            extra_s = sum(times[g] * tr.elasticity[g, 0] * (now[g].core_mhz / lowered[g] - 1.0) for g in down)
            if extra_s > self._extra_allowed_s():
                raised = trade_clocks(
                    times[down],
                    tr.elasticity[down, 0],
                    [now[g].core_mhz for g in down],
                    times[up],
                    tr.elasticity[up, 1],
                    [now[g].core_mhz for g in up],
                    [[p.core_mhz for p in self.pairs if p.mem_mhz == now[g].mem_mhz] for g in up],
                    [lowered[g] for g in down],
                )
                if raised is None:
                    continue
                moves |= {g: ClockPair(int(f), now[g].mem_mhz) for g, f in zip(up, raised)}
            candidate = self._with_pairs(moves)
            if candidate != self.incumbent and candidate not in out and candidate not in tr.tried:
                out.append(candidate)
        return out

    def _learn_elasticity(self, tr: Trading, candidate: Schedule, outcome: Outcome) -> None:
        """A trade's trial measured the step's time under it: the kind it lowered takes the
        elasticity that accounts for that time, less what the raised kind gave back by its own
        elasticities (so the trades built after it give back what the lowered groups really
        took). The step's time, not the groups' own: on a card that switches at every kernel,
        a group's first kernels run at the clocks of the group before until its switch lands,
        so a lowered group slows the group after it."""
        if outcome.blocks == 0 or not math.isfinite(outcome.time_diff):
            return
        times = np.asarray(self.incumbent_group_times_s, dtype=float)
        lowered, back_s = [], 0.0
        for g, ((_, old), (_, new)) in enumerate(zip(self.incumbent.groups, candidate.groups)):
            old = old or self.top_pair
            if new is None or new == old:
                continue
            if new.core_mhz < old.core_mhz:
                lowered.append((g, old.core_mhz / new.core_mhz - 1.0))
            else:
                back_s += times[g] * tr.elasticity[g, 1] * (1.0 - old.core_mhz / new.core_mhz)
        span_s = sum(times[g] * x for g, x in lowered)
        if not span_s > 0.0:
            return
        extra_s = outcome.time_diff * self.incumbent_step_s + back_s
        for g, _ in lowered:
            tr.elasticity[g, 0] = max(extra_s / span_s, 0.0)

    def _trading(self, tr: Trading, report: StepReport | None) -> Schedule:
        if tr.trial is not None and report is not None:
            outcome = self._feed_trial(tr.trial)
            if outcome is not None:
                trial, tr.trial = tr.trial, None
                self._trial_ended(trial, outcome)
                judged = self.judge(outcome, trial.window_s, z=DECIDE_Z) if outcome.blocks > 0 else None
                self._emit(
                    TrialFinished(
                        self.account.steps,
                        self._now_s,
                        "trial",
                        TRADE_GROUP,
                        trial.candidate,
                        outcome,
                        None,
                        judged,
                        trial.window_s,
                    )
                )
                self._learn_elasticity(tr, trial.candidate, outcome)
                tr.built_for = None  # the trades left, rebuilt with what this one measured
                read = outcome.blocks > 0 and not outcome.abandoned and 1.0 + outcome.energy_diff > 0.0
                # a trade moves kinds of groups, a large share of the step, whose saving its
                # trial reads at about its own error on a noisy card: any saving it read within
                # the budget is verified (the verification is the adoption test)
                if (
                    read
                    and judged is not None
                    and judged.saving > 0.0
                    and judged.slowdown - DECIDE_Z * judged.time_se <= self.budget
                ):
                    return self._verify(TRADE_GROUP, trial.candidate, tr.search, traded=tr)
        if tr.trial is None:
            if tr.built_for != self.incumbent:
                tr.queue, tr.built_for = self._trades(tr), self.incumbent
            if not tr.queue or len(tr.tried) >= self.timing.max_trials_per_group:
                return self._start_group(tr.search, tr.search.after(TRADE_GROUP))
            candidate = tr.queue[0]
            if self._waits_for_slack(candidate, report is not None):
                tr.waiting_steps += 1
                return self.incumbent
            tr.queue.pop(0)
            tr.tried.append(candidate)
            tr.trial = self._explore_trial(candidate, tr.search.window_s)
            self.trials += 1
        if tr.trial.current is None:
            tr.trial.open(self._now)
        return tr.trial.schedule()

    def _window_s(self, candidate: Schedule, window_s: float) -> float:
        """The window of a verification of `candidate` against the incumbent: window_s, or at
        least WAIT_GROUP_WINDOW_S where either holds a pair of its own in the wait group, s."""
        if self._holding_wait(self.incumbent) is None and self._holding_wait(candidate) is None:
            return window_s
        return max(window_s, WAIT_GROUP_WINDOW_S)

    def _explore_trial(self, candidate: Schedule, window_s: float) -> Trial:
        """A sequential trial of `candidate` against the incumbent, in windows of window_s (s),
        decided as an exploring trial is (`_explore_decided`)."""
        trial = Trial(
            self.incumbent,
            candidate,
            self._trial_max_blocks(window_s),
            window_s,
            self.settle_s,
            min_blocks=self.timing.trial_blocks,
            wait_power_w=self.noise.wait_power_w,
        )
        trial.decide = functools.partial(self._explore_decided, window_s=window_s, trial=trial)
        return trial

    def _proof_s(self) -> float:
        """The budget a verification of the longest length spends on proof: VERIFY_TIME_Z time
        errors over its blocks at the job's time noise, s per step. The strategy searches within
        the budget less this, so that what it finds can be adopted (a pair at the budget's edge
        never can)."""
        t = self.timing
        verify_s = 4.0 * t.verify_max_blocks * t.verify_window_s
        return resolvable(self.time_sd_per_root_s, verify_s, VERIFY_TIME_Z) * self.stock_step_s

    def _settle(self, search: Search) -> Schedule:
        """Every group of the round explored: Settled, with the undecided and abandoned ones to
        reopen after as long as the round took (at least REOPEN_WAIT_MIN_S, doubled for each
        round past MAX_FEW_ROUNDS)."""
        reopen = tuple(dict.fromkeys(search.reopen))
        # past the few rounds, each round waits twice as long: a group no pair of which fits
        # the budget costs ever less of a long run, and is still tried again
        backoff = 2.0 ** max(0, search.round + 1 - MAX_FEW_ROUNDS)
        wait_s = max(REOPEN_WAIT_MIN_S * backoff, self._now_s - search.started_s)
        first = {g: self._pair_of(g) for g in reopen}
        for g in reopen:
            best = self._best_so_far.get(g)
            if best is not None:
                first[g] = best
        self._enter(
            Settled(
                self.account.steps,
                reopen=reopen,
                round=search.round,
                reopen_at_s=self._now_s + wait_s if reopen else math.inf,
                first=first,
                window_s=search.window_s,
            )
        )
        self.conditions.relearn_temperature()  # the settled plan's own temperature
        return self.incumbent

    def _exploring(self, ex: Exploring, report: StepReport | None) -> Schedule:
        if ex.trial is not None and report is not None:
            outcome = self._feed_trial(ex.trial)
            if outcome is not None:
                self._tell(ex, outcome)
                ex.trial = None
        if ex.trial is None:
            if ex.config is None and ex.first is not None:
                ex.config, ex.first = ex.first, None
            if ex.config is None:
                ex.config = (
                    self.strategy.ask(ex.task)
                    if ex.trials < self.timing.max_trials_per_group and ex.group != self.wait_group
                    else None  # the wait group's one candidate was tried
                )
                if ex.config is None:
                    return self._verify_best(ex)
                if ex.config == ASK_LATER:  # the strategy's answer comes from outside, later
                    ex.config = None
                    return self.incumbent
            candidate = self._with_pair(ex.group, self.pairs[ex.config])
            if self._waits_for_slack(candidate, report is not None):
                ex.waiting_steps += 1
                return self.incumbent
            ex.trial = self._explore_trial(candidate, ex.search.window_s)
            ex.trials += 1
            self.trials += 1
        if ex.trial.current is None:
            ex.trial.open(self._now)
        return ex.trial.schedule()

    def _feed_trial(self, trial: Trial, time_check: bool = True) -> Outcome | None:
        """The running trial fed this report (and abandoned if the slack, or with `time_check`
        its measured time, says so); its outcome once it is done, else None."""
        trial.add(self._feed)
        self._maybe_abandon(trial, time_check)
        return trial.outcome() if trial.done else None

    def _waits_for_slack(self, candidate: Schedule, fed: bool, b_s: float | None = None) -> bool:
        """Whether the budget's slack does not yet cover a trial of the candidate (until its
        time check may act; `b_s`: its whole B arm of that many seconds, for a trial not
        stopped by its time): the step then runs the incumbent, measuring stock meanwhile
        (`_measure_stock_while_waiting`)."""
        worst_s = self._worst_case_s(candidate) if b_s is None else self._worst_slowdown(candidate) * b_s
        if self.account.slack_s() < worst_s:
            self._hold_budget(0.0)
            self._measure_stock_while_waiting(fed)
            return True
        self._waiting_window = None
        return False

    def _hold_budget(self, floor_s: float) -> None:
        """The budget's guard: where the account's slack falls below floor_s (s), the incumbent
        falls back to stock (its groups kept) and is judged as stock from then on: a plan whose
        own steps run the account down (adopted on a reading the job's noise bent) runs no
        further. Settled keeps GUARD_STEPS steps of the budget; a trial waiting for the slack
        acts once the account is over the budget (its 95% bound above it)."""
        if self.incumbent.is_stock or self.account.slack_s() >= floor_s:
            return
        self.incumbent = self.incumbent.at_stock()
        self.incumbent_step_s = self._chain_step_s = self.stock_estimate_s
        self._chain_var = self._step_var = 0.0
        self.incumbent_energy_j = self.stock_energy_j
        self.incumbent_group_times_s = list(self.group_times_s)
        self.fallbacks_to_stock += 1

    def _measure_stock_while_waiting(self, fed: bool) -> None:
        """Steps run at a stock incumbent while waiting for the slack measure stock (windows of
        the trial window's length): the 95% margin shrinks and the slack grows, so a noisy job
        whose margin exceeds the budget does not wait for good."""
        if not fed or not self.incumbent.is_stock:
            self._waiting_window = None
            return
        if self._waiting_window is None:
            self._waiting_window = open_window(self.incumbent, self.timing.trial_window_s, 0.0, self._now)
            return
        if self._waiting_window.add(self._feed):
            window, self._waiting_window = self._waiting_window, None
            self._count_stock([window])

    def _explore_decided(self, outcome: Outcome, window_s: float, trial: Trial) -> bool:
        """An exploring trial is decided once, at DECIDE_Z errors, B is within the budget and
        saves, or saves nothing or is over the budget, or its figures are precise enough for
        the strategy (DECIDE_Z energy errors within RESOLVE_ENERGY, time errors within half the
        budget). The judgement of `trial`'s first look is kept on it (Trial.first_look)."""
        j = self.judge(outcome, window_s, z=DECIDE_Z)
        trial.last_look = j
        if trial.first_look is None:
            trial.first_look = j
        worse = j.saving + DECIDE_Z * j.saving_se < 0.0 or j.slowdown - DECIDE_Z * j.time_se > self.budget
        resolved = DECIDE_Z * j.saving_se <= RESOLVE_ENERGY and DECIDE_Z * j.time_se <= self.budget / 2
        return j.adopted or worse or resolved

    def _trial_ended(self, trial: Trial, outcome: Outcome) -> None:
        """What every ended trial teaches: the job's noise (its pairs of windows), its length."""
        self.noise.add_pairs(outcome.pairs)
        if not trial.candidate.is_stock:
            self._level_of(trial.candidate).add(trial.b_closed_windows(), self._ranks)
        if trial.incumbent.is_stock:
            self._count_stock(trial.a_windows())
        else:
            self._level_of(trial.incumbent).add(trial.a_windows(), self._ranks)
            self._update_account_stock()
            self._read_level()
        self._trial_seconds.append(
            float(sum(np.mean(w.rank_settled_s) for w in trial.closed)) + trial.settle_s * len(trial.closed)
        )

    def _tell(self, ex: Exploring, outcome: Outcome) -> None:
        """The group's time under B and the step's energy at B (the incumbent's as the task
        began, moved by the measured difference; an abandoned B: its power so far, or stock
        power, x its time). The task's own reference, not the incumbent's energy now: while
        the incumbent is stock its energy is refined by every trial's A windows, and on a job
        whose waits vary that estimate moves by percents, which would move each told energy
        against those told before it."""
        self._trial_ended(ex.trial, outcome)
        completed = outcome.blocks > 0 and not outcome.abandoned
        # an energy at or below none is no reading (a first trial's windows moved to a common
        # wait before the job's wait power was known can read -150%): told as the incumbent's,
        # and the trial counts as undecided
        impossible = completed and not (1.0 + outcome.energy_diff > 0.0)
        if outcome.undecided or impossible:
            ex.undecided += 1
        if outcome.abandoned:
            ex.abandoned += 1
        if impossible:
            energy_j = ex.task.ref_energy_j
        elif completed:
            ex.completed += 1
            energy_j = ex.task.ref_energy_j * (1.0 + outcome.energy_diff)
        else:
            read = [w.power_w for w in ex.trial.b_windows() if w.steps and not math.isnan(w.power_w)]
            power_w = read[-1] if read else math.nan  # B's latest window that read its power
            if math.isnan(power_w):
                power_w = self.incumbent_energy_j / self.incumbent_step_s
            energy_j = power_w * outcome.b_step_s
        if ex.group == STEP_GROUP:
            group_s = float(np.sum(outcome.b_group_times_s)) if outcome.b_group_times_s.size else math.nan
            times = np.asarray(outcome.b_group_times_s, dtype=float)
            if outcome.blocks > 0 and times.size == len(self.incumbent.groups) and np.all(np.isfinite(times)):
                self._step_times[self.pairs[ex.config]] = times
        else:
            group_s = float(outcome.b_group_times_s[ex.group]) if outcome.b_group_times_s.size else math.nan
        if math.isnan(group_s) or math.isnan(energy_j):
            group_s, energy_j = (
                ex.task.ref_time_s * 10.0,
                ex.task.ref_energy_j * 10.0,
            )  # nothing measured: too slow
        judged = self.judge(outcome, ex.trial.window_s, z=DECIDE_Z) if outcome.blocks > 0 else None
        self._emit(
            TrialFinished(
                self.account.steps,
                self._now_s,
                "trial",
                ex.group,
                ex.trial.candidate,
                outcome,
                None,
                judged,
                ex.trial.window_s,
                *_first_look(ex.trial, outcome, judged),
            )
        )
        self.strategy.tell(ex.task, ex.config, group_s, energy_j)
        read = completed and not impossible  # a reading the bookkeeping below may keep
        if judged is not None and read and judged.saving_se > 0.0:
            self._saving_z[(ex.group, self.incumbent, ex.config)] = judged.saving / judged.saving_se
        if read and not outcome.undecided:
            self._decided.setdefault(ex.group, []).append(
                (self.incumbent, ex.config, group_s / ex.task.ref_time_s, energy_j / ex.task.ref_energy_j)
            )
        ex.config = None

    def _maybe_abandon(self, trial: Trial, time_check: bool = True) -> None:
        """Stop the candidate when the account's guard is reached (its decision left open), or
        (with `time_check`) when its measured time already shows it over the budget against
        the trial's latest A window (each window's longest eighth of steps left out)."""
        if trial.arm != "B" or trial.done:
            return
        if self.account.slack_s() < GUARD_STEPS * self.incumbent_step_s * self._worst_slowdown(
            trial.candidate
        ):
            trial.abandoned = trial.undecided_stop = True
            return
        if not time_check:
            return
        # every rank's (pooled) busy time, the job's waits left out (not the clocks'), and each
        # window's longest eighth of steps left out: a few stalled steps cannot stop a candidate
        parts = [w.longest_busy_s_left_out for w in trial.b_windows()]
        busy_s = float(sum(b for b, _ in parts))
        steps = sum(n for _, n in parts)
        ran_s = busy_s / self._ranks  # training time: the ranks' steps end together
        if ran_s < ABANDON_MIN_S or steps == 0:
            return
        # against the trial's latest A window (the incumbent now, scaled as the account's stock
        # is to the incumbent's): a job whose stock drifts is not taken for a slow candidate
        a = [w for w in trial.a_windows() if w.steps]
        if a:
            a_s = a[-1].settled_s / self._ranks
            reference_s = a[-1].busy_sum_s / a[-1].steps * self.stock_step_s / self.incumbent_step_s
        else:
            a_s, reference_s = math.inf, self.stock_step_s
        slowdown = busy_s / steps / reference_s - 1.0
        # the error of a few steps' mean: the job's noise per root s, or the spread of single
        # steps at short spans where that is larger (a job whose steps vary one by one)
        se = self.time_sd_per_root_s * math.sqrt(1.0 / ran_s + 1.0 / a_s)
        step_cv = self.stalls.step_cv(trial.incumbent)
        if math.isfinite(step_cv):
            se = max(se, step_cv / math.sqrt(steps / self._ranks))
        if slowdown - ABANDON_Z * se > self.budget:
            trial.abandoned = True

    def _verify_best(self, ex: Exploring) -> Schedule:
        self._trials_per_group.append(ex.trials)
        best = self.strategy.best(ex.task)
        current = self._own_pair(ex.group)
        if best is not None:
            self._best_so_far[ex.group] = self.pairs[best]
            if self._saving_z.get((ex.group, self.incumbent, best), math.inf) < VERIFY_MIN_Z:
                best = None  # its trial saw no saving: nothing to verify
        if ex.group == self.wait_group:
            # its trial times the group alone, which its pair does not slow (the lag lands in
            # the next step's first group): verified only on a saving its trial showed
            if best is not None and (ex.group, self.incumbent, best) not in self._saving_z:
                best = None
            if ex.undecided:
                ex.search.reopen.append(ex.group)  # its one candidate, tried again later
        elif ex.completed < MIN_COMPLETED_TRIALS and ex.search.round < MAX_FEW_ROUNDS:
            ex.search.reopen.append(ex.group)  # searched too little to stop at, whatever it adopts
        elif (ex.undecided or ex.abandoned) and (best is None or self.pairs[best] == current):
            ex.search.reopen.append(ex.group)  # never given up: tried again, later each round
        if best is None or self.pairs[best] == current:
            return self._start_group(ex.search, ex.search.after(ex.group))
        return self._verify(
            ex.group, self._with_pair(ex.group, self.pairs[best]), ex.search, undecided=ex.undecided
        )

    # --- verifying -----------------------------------------------------------------------------
    def _verify(
        self,
        group: int | None,
        candidate: Schedule,
        search: Search,
        undecided: int = 0,
        screened: Screening | None = None,
        fallbacks: int = 0,
        extensions: int = 0,
        traded: Trading | None = None,
    ) -> Schedule:
        t = self.timing
        blocks = t.verify_blocks
        if group is None and (self.retunes > 0 or self.proven_prior):
            # a stored plan jobs before proved, or after a drift alarm the plan before (or its
            # re-plan for the new conditions) while the job runs stock: the first look earlier
            blocks = min(blocks, PROVEN_VERIFY_BLOCKS)
        max_blocks = max(t.verify_max_blocks, blocks)
        if group == SCREEN_GROUP:
            # a screening's choice is a new question for each group it moves: counted per group
            # (every screening verification that moved it), so a later round's disjoint choice
            # is its groups' first, and a reopened screening's choice is not
            moved = [g for g, (a, b) in enumerate(zip(self.incumbent.groups, candidate.groups)) if a != b]
            nth = 1 + max((self._screen_verified.get(g, 0) for g in moved), default=0)
            self._screen_verified.update({g: self._screen_verified.get(g, 0) + 1 for g in moved})
        else:
            self._verified[group] = nth = self._verified.get(group, 0) + 1
        # the same candidate verified against the same incumbent before (a reopened round's
        # best again): its blocks go on where that verification stopped, one longer test
        closed, first_look = self._unadopted.pop((self.incumbent, candidate), ([], blocks))
        if closed:
            blocks, max_blocks = len(closed) // 4 + 1, len(closed) // 4 + t.verify_max_blocks
        z = sequential_z(first_look, max_blocks, verification_z(nth))
        window_s = self._window_s(candidate, t.verify_window_s)
        trial = Trial(
            self.incumbent,
            candidate,
            max_blocks,
            window_s,
            self.settle_s,
            min_blocks=blocks,
            wait_power_w=self.noise.wait_power_w,
            closed=closed,
        )
        trial.decide = functools.partial(self._verify_decided, z=z, window_s=window_s, trial=trial)
        self.trials += 1
        self._enter(
            Verifying(
                group,
                trial,
                search,
                explored_undecided=undecided,
                z=z,
                first_look=first_look,
                screened=screened,
                fallbacks=fallbacks,
                extensions=extensions,
                traded=traded,
            )
        )
        return self._verifying(self.phase, None)

    def _verify_decided(self, outcome: Outcome, z: float, window_s: float, trial: Trial) -> bool:
        """A verification (windows window_s long) is decided once the candidate is adopted (z
        errors: the verification's sequential boundary), or at ADOPT_Z errors it saves nothing
        or is over the budget, the job's noise read with its own pairs of windows. The judgement
        of `trial`'s first look and of its latest are kept on it (Trial.first_look, last_look)."""
        j = self.judge(outcome, window_s, z=z, time_z=VERIFY_TIME_Z, own_pairs=True)
        trial.last_look = j
        if trial.first_look is None:
            trial.first_look = j
        worse = j.saving + ADOPT_Z * j.saving_se <= 0.0 or j.slowdown - ADOPT_Z * j.time_se > self.budget
        return j.adopted or worse

    def _verifying(self, ver: Verifying, report: StepReport | None) -> Schedule:
        trial = ver.trial
        if report is not None and trial.current is not None:
            trial.add(self._feed)
            if trial.current is not None:  # B's window opens only once the slack covers it
                self._maybe_abandon(trial)
        if trial.done:
            outcome = trial.outcome()
            # a test that stopped at a look (adopted, or clearly not) stands as it stopped (the
            # judgement its decider made there): judged again after this trial's windows refine
            # the job's noise and stock, a decided adoption's error moved and it was dropped,
            # neither adopted nor reopened
            stopped_on = trial.last_look if trial.decided else None
            self._trial_ended(trial, outcome)
            self._judge(ver, outcome, adopted=None if stopped_on is None else stopped_on.adopted)
            if self._goes_on(ver, outcome):  # one longer test: its blocks kept
                return self._verify(
                    ver.group,
                    trial.candidate,
                    ver.search,
                    undecided=ver.explored_undecided,
                    screened=ver.screened,
                    fallbacks=ver.fallbacks,
                    extensions=ver.extensions + 1,
                    traded=ver.traded,
                )
            # tried again later: left open, or adopted while its exploration left pairs open
            if ver.group is not None and (ver.explored_undecided or (not ver.adopted and outcome.undecided)):
                ver.search.reopen.append(ver.group)
            fallback = self._fallback(ver)
            if fallback is not None:
                return self._verify(
                    ver.group,
                    fallback,
                    ver.search,
                    undecided=ver.explored_undecided,
                    fallbacks=ver.fallbacks + 1,
                    traded=ver.traded,
                )
            if ver.traded is not None:  # the trades go on (rebuilt where this one was adopted)
                self._enter(ver.traded)
                return self._trading(ver.traded, None)
            if ver.group is None:
                return self._start_group(ver.search, 0)
            screened = ver.screened
            if ver.adopted and screened is not None and screened.round < SCREEN_ROUNDS:
                return self._start_screening(ver.search, screened)  # the groups left, screened again
            return self._start_group(ver.search, ver.search.after(ver.group))
        if trial.current is None:
            if trial.arm == "B" and self.account.slack_s() < self._worst_case_s(trial.candidate):
                return self.incumbent  # wait for the slack; the window opens when it covers B
            trial.open(self._now)
        return trial.schedule()

    def judge(
        self,
        outcome: Outcome,
        window_s: float,
        z: float = ADOPT_Z,
        time_z: float | None = None,
        own_pairs: bool = False,
    ) -> Judgement:
        """A trial's outcome (windows window_s long) judged against this run's stock (the
        account's, at 95% confidence), the incumbent, the budget and the job's noise at z
        standard errors: runtime/trials.py's `judge`, the one the environment pays its reward
        from. own_pairs: the job's noise read with the trial's own pairs of windows added (a
        verification's looks: the noise its windows show counts before it adopts, not only
        after it ends)."""
        noise = self.noise
        if own_pairs and outcome.pairs:
            noise = copy.deepcopy(self.noise)
            noise.add_pairs(outcome.pairs)
        return judge(
            outcome,
            self.stock,
            incumbent_step_s=self.incumbent_step_s,
            incumbent_energy_j=self.incumbent_energy_j,
            budget=self.budget,
            window_s=window_s,
            noise=noise,
            account_step_s=self.account.stock_step_s,
            ranks=self._ranks,
            z=z,
            time_z=time_z,
        )

    def _goes_on(self, ver: Verifying, outcome: Outcome) -> bool:
        """Whether a verification that reached its longest length undecided goes on at once
        (GO_ON_EXTENSIONS at most): its saving at GO_ON_Z errors or more and its time possibly
        within the budget (a candidate at the budget's edge needs more blocks to prove its
        time). A group's step, a trade or a screening's choice each move a small share of
        the step; whatever the search tries after it resolves less than such a candidate saves."""
        return (
            not ver.adopted
            and outcome.undecided
            and ver.time_open
            and ver.saving_z >= GO_ON_Z
            and ver.extensions < GO_ON_EXTENSIONS
        )

    def _judge(self, ver: Verifying, outcome: Outcome, adopted: bool | None = None) -> None:
        """Adopt when the saving exceeds ver.z standard errors (of the blocks' differences, and
        no less than the job's noise predicts) and the candidate's slowdown, ver.z time errors
        added, is within the budget: ver.z is ADOPT_Z held over the verification's looks.
        adopted: the judgement its test stopped on at a look before its last (None: made here,
        the trial run to its last block)."""
        judgement = self.judge(outcome, ver.trial.window_s, z=ver.z, time_z=VERIFY_TIME_Z)
        ver.adopted = judgement.adopted if adopted is None else adopted
        stopped_on_time = outcome.abandoned and not ver.trial.undecided_stop
        proven_over_time = (
            judgement.saving - ver.z * judgement.saving_se > 0.0
            and judgement.slowdown + VERIFY_TIME_Z * judgement.time_se > self.budget
        )
        ver.over_time = not ver.adopted and (stopped_on_time or proven_over_time)
        ver.time_open = not stopped_on_time and (
            judgement.slowdown - VERIFY_TIME_Z * judgement.time_se <= self.budget
        )
        ver.time_diff = outcome.time_diff
        ver.saving_z = judgement.saving / judgement.saving_se if judgement.saving_se > 0.0 else math.nan
        if not ver.adopted:
            closed = ver.trial.closed
            self._unadopted[(ver.trial.incumbent, ver.trial.candidate)] = (
                closed[: 4 * (len(closed) // 4)],
                ver.first_look,
            )
        se, saving, slowdown = judgement.saving_se, judgement.saving, judgement.slowdown
        self._emit(
            TrialFinished(
                self.account.steps,
                self._now_s,
                "verify",
                ver.group,
                ver.trial.candidate,
                outcome,
                ver.adopted,
                judgement if outcome.blocks > 0 else None,
                ver.trial.window_s,
                *_first_look(ver.trial, outcome, judgement),
            )
        )
        if ver.adopted:
            self.incumbent = ver.trial.candidate
            self.incumbent_energy_j *= 1.0 - saving
            self._chain_step_s = self.incumbent_step_s * (1.0 + outcome.time_diff)
            self._chain_var = self._step_var + judgement.time_se**2
            self.incumbent_step_s, self._step_var = self._chain_step_s, self._chain_var
            self._levels = {ver.trial.candidate: self._level_of(ver.trial.candidate)}
            self._read_level()
            self._adopt_group_times(outcome.b_group_times_s)
            adoption = Adoption(
                self.account.steps,
                self._now_s,
                self.incumbent,
                1.0 - self.incumbent_energy_j / self.stock_energy_j,
                se,
                slowdown,
            )
            self.adoptions.append(adoption)
            self._emit(adoption)

    def _fallback(self, ver: Verifying) -> Schedule | None:
        """After a verification over the budget on time alone, the candidate verified next
        (None: none): the group at its next-best pair (`_fallback_pair`); a trade with the
        groups it lowered one memory clock up (`_trade_fallback`); or, for the wait group, its
        pair kept and the step's pair raised to the next-best faster one (`_faster_step_pair`):
        its trial showed a saving that the step's pair leaves no time for. None also once
        MAX_FALLBACKS were verified in a row."""
        if not ver.over_time or ver.fallbacks >= MAX_FALLBACKS:
            return None
        if ver.group == TRADE_GROUP:
            return self._trade_fallback(ver)
        pair = self._fallback_pair(ver)
        if pair is not None:
            return self._with_pair(ver.group, pair)
        wait = self.wait_group
        if wait is None or ver.group != wait:
            return None
        wait_pair = self._pair_of(wait, ver.trial.candidate)
        step_pair = self._faster_step_pair(self._pair_of(STEP_GROUP, ver.trial.candidate))
        if wait_pair is None or step_pair is None:
            return None
        return self._with_pairs({**{g: step_pair for g in self._held(self.incumbent)}, wait: wait_pair})

    def _faster_step_pair(self, pair: ClockPair | None) -> ClockPair | None:
        """Of the pairs decided for the groups the step runs at (the whole step's, or the one
        group's before the wait group) in the exploration that measured `pair` (or, where its
        trial was left undecided, in one under stock: `pair` then at the incumbent's measured
        step time), under the same incumbent, those measured faster than it with a saving: the
        least energy (None: none)."""
        if pair is None:
            return None
        held = [g for g in self._held(self.incumbent) if g != self.wait_group]
        decided = [
            e for g in [STEP_GROUP, *(held if len(held) == 1 else [])] for e in self._decided.get(g, [])
        ]
        own = [(inc, t) for inc, config, t, _ in decided if self.pairs[config] == pair]
        if not own and self._pair_of(STEP_GROUP) == pair and math.isfinite(self.stock_estimate_s):
            own = [
                (inc, self.incumbent_step_s / self.stock_estimate_s) for inc, *_ in decided if inc.is_stock
            ][:1]
        if not own:
            return None
        incumbent, bound = own[-1]
        faster = [
            (e, self.pairs[config])
            for inc, config, t, e in decided
            if inc == incumbent and t < bound and e < 1.0 and self.pairs[config] != pair
        ]
        return min(faster, key=lambda c: (c[0], c[1].core_mhz, c[1].mem_mhz))[1] if faster else None

    def _fallback_pair(self, ver: Verifying) -> ClockPair | None:
        """After a verification over the budget on time alone, the group's next-best pair: of
        the pairs its decided trials under this incumbent measured faster than the verified one
        (than its exploring trial and its verification both: a tighter time bound), with a
        saving, the least energy; where none was, the verified core clock at the next memory
        clock up, if no trial decided it (not for the wait group). None when there is neither, or
        the verification was not a group's (the whole schedule, a screening's, a trade's)."""
        group = ver.group
        if group is None or group in (SCREEN_GROUP, TRADE_GROUP):
            return None
        verified = self._pair_of(group, ver.trial.candidate)
        decided = [
            (self.pairs[config], time_ratio, energy_ratio)
            for incumbent, config, time_ratio, energy_ratio in self._decided.get(group, [])
            if incumbent == self.incumbent
        ]
        # the verification's step time difference as a share of the group's time (the decided
        # trials' time ratios are of the group's time under the incumbent)
        group_s = self.incumbent_step_s if group == STEP_GROUP else self.incumbent_group_times_s[group]
        bound = (
            1.0 + ver.time_diff * self.incumbent_step_s / group_s
            if math.isfinite(ver.time_diff)
            else math.inf
        )
        bound = min([bound] + [t for p, t, _ in decided if p == verified])
        faster = [(e, p) for p, t, e in decided if t < bound and e < 1.0 and p != verified]
        if faster:
            return min(faster, key=lambda c: (c[0], c[1].core_mhz, c[1].mem_mhz))[1]
        # none measured faster: the verified core clock with the memory clock one step up,
        # where no trial under this incumbent decided it (a group whose kernels compute gives
        # back time at little energy: on the simulated RTX 3080 Ti's whole step under the hf
        # noise 1260/9501 at its last group runs +0.45% slower than stock and 1260/9251 +0.85%,
        # each saving 7.2%)
        if group == self.wait_group:  # its pair idles cheaply; the time comes from the step's pair
            return None
        up = self._memory_step_up(verified)
        tried = {p for p, _, _ in decided}
        return up if up is not None and up not in tried else None

    def _trade_fallback(self, ver: Verifying) -> Schedule | None:
        """After a trade's verification over the budget on time alone, the trade with each
        group it lowered at its memory clock one step up (`_memory_step_up`; None: no group
        has one)."""
        candidate, moved = ver.trial.candidate, {}
        for g in self._held(candidate):
            pair, before = self._pair_of(g, candidate), self._pair_of(g)
            if pair is None or before is None or pair == before or pair.core_mhz >= before.core_mhz:
                continue
            up = self._memory_step_up(pair)
            if up is not None:
                moved[g] = up
        if not moved:
            return None
        groups = [(start, moved.get(g, pair)) for g, (start, pair) in enumerate(candidate.groups)]
        return Schedule(tuple(groups))

    def _memory_step_up(self, pair: ClockPair | None) -> ClockPair | None:
        """The grid's pair of the same core clock at the next memory clock up (None: none)."""
        if pair is None:
            return None
        up = [p for p in self.pairs if p.core_mhz == pair.core_mhz and p.mem_mhz > pair.mem_mhz]
        return min(up, key=lambda p: p.mem_mhz) if up else None

    def _adopt_group_times(self, b_group_times_s: np.ndarray) -> None:
        """Each group's time under the adopted schedule: the verification's B shares of the
        (new) incumbent step; where B's groups were not measured, the old times scaled alike."""
        times = np.asarray(b_group_times_s, dtype=float)
        old = np.asarray(self.incumbent_group_times_s, dtype=float)
        if times.size == old.size and old.size and np.all(np.isfinite(times)) and times.sum() > 0:
            shares = times / times.sum()
        elif old.size and old.sum() > 0:
            shares = old / old.sum()
        else:
            return
        self.incumbent_group_times_s = [float(x) for x in shares * self.incumbent_step_s]

    # --- settled -------------------------------------------------------------------------------
    def _settled(self, settled: Settled, report: StepReport) -> Schedule:
        self._hold_budget(GUARD_STEPS * self.incumbent_step_s * self.budget)
        if self._moved:
            return self._condition_alarm(report)
        if settled.reopen and self._now_s >= settled.reopen_at_s:
            return self._reopen(settled)
        self._settled_noise(settled)
        if settled.window is None:
            settled.window = open_window(self.incumbent, self.timing.watch_window_s, 0.0, self._now)
            return self.incumbent
        if not settled.window.add(self._feed):
            return self.incumbent
        window, settled.window = settled.window, None
        if self.incumbent.is_stock:
            self._count_stock([window])
        else:
            self._level_of(self.incumbent).add([window], self._ranks)
            self._read_level()
        values = {group_stream(i): float(t) for i, t in enumerate(window.group_times_s)}
        values["energy"] = window.energy_per_step_j
        if settled.expected is None:
            settled.expected = values
            self.watch = DriftMonitor(list(values), warmup=WATCH_WARMUP, confirm=WATCH_CONFIRM_WINDOWS)
        moved = self.watch.update(values, settled.expected)
        if moved:
            groups = [g for g in map(stream_group, moved) if g is not None]
            return self._alarm(report, tuple(moved), None if "energy" in moved else groups)
        return self.incumbent

    def _settled_noise(self, settled: Settled) -> None:
        """The Settled incumbent's windows of a trial window's length, each with the one
        before, as pairs for the job's noise."""
        if settled.noise_window is None:
            settled.noise_window = open_window(self.incumbent, settled.window_s, 0.0, self._now)
            return
        if not settled.noise_window.add(self._feed):
            return
        window, settled.noise_window = settled.noise_window, None
        last, settled.noise_last = settled.noise_last, window
        if last is not None and last.schedule == window.schedule:
            self.noise.add_pairs(window_pairs(last, window))

    def _reopen(self, settled: Settled) -> Schedule:
        """The groups that ended undecided, tried again with windows twice as long (at most
        MAX_TRIAL_WINDOW_S), their best so far first; the longest first."""
        groups = sorted(
            settled.reopen,
            key=lambda g: -(self.incumbent_step_s if g < 0 else self.group_times_s[g]),
        )
        window_s = min(settled.window_s * 2.0, max(MAX_TRIAL_WINDOW_S, settled.window_s))
        search = Search(
            groups,
            dict(settled.first),
            round=settled.round + 1,
            window_s=window_s,
            started_s=self._now_s,
        )
        return self._start_group(search, 0)

    def _condition_alarm(self, report: StepReport) -> Schedule:
        """The power limit or the settled temperature moved. A card that warmed without
        throttling keeps its plan (the watch learns its new temperature)."""
        moved, self._moved = tuple(dict.fromkeys(self._moved)), []
        if moved == ("temperature",) and self.conditions.step_c > 0.0 and not report.throttle_reasons:
            alarm = Alarm(self.account.steps, report.end_s, moved, held=True)
            self.alarms.append(alarm)
            self._emit(alarm)
            if self.watch is not None:
                self.watch.reset(["energy"])  # a warmer card leaks more: learn its energy again
            return self.incumbent
        return self._alarm(report, moved, None)

    def _alarm(self, report: StepReport, reasons: tuple[str, ...], groups: list[int] | None) -> Schedule:
        """Stock now; the reference again once the temperature is flat (Retuning.settles; else
        after RETUNE_MIN_S)."""
        alarm = Alarm(self.account.steps, report.end_s, reasons)
        self.alarms.append(alarm)
        self._emit(alarm)
        everything = tuple(range(len(self.incumbent.groups)))
        plan = self.incumbent
        self.incumbent = plan.at_stock()
        self.conditions.relearn_temperature()
        self.account.rebase()
        self._verified.clear()  # new conditions: a new question for every group
        self._screen_verified.clear()
        self._unadopted.clear()
        self._decided.clear()  # ... and what was measured under the old ones is not told again
        self._saving_z.clear()
        self._enter(Retuning(report.end_s, reasons, tuple(groups) if groups else everything, plan))
        return self.incumbent

    def _retuning(self, ret: Retuning, report: StepReport) -> Schedule:
        ret.sm_clocks_mhz = _latest_clocks(ret.sm_clocks_mhz, report)
        waited_s = report.end_s - ret.since_s
        flat = (
            not ret.settles or self.conditions.centre_c is not None or not math.isfinite(report.temperature_c)
        )
        if waited_s < RETUNE_MIN_S or (not flat and waited_s < RETUNE_SETTLE_MAX_S):
            return self.incumbent
        self.retunes += 1
        fresh = self.replan(report) if self.replan is not None else None
        plan = fresh if fresh is not None else ret.schedule_before
        if fresh is None and ret.sm_clocks_mhz and math.isfinite(self.stock_clock_mhz):
            ratio = float(np.median(ret.sm_clocks_mhz)) / self.stock_clock_mhz
            if ratio < 1.0 - RETUNE_CLOCK_DROP:
                plan = moved_with_stock(plan, ratio, self.pairs)
        self.segments = [s for s, _ in plan.groups]
        self.incumbent = Schedule(tuple((s, None) for s in self.segments))
        self._moved = []
        self._enter(
            self._new_reference(
                self.incumbent,
                schedule_before=plan,
                explore=None if fresh is not None else ret.groups,
                first=dict(enumerate(p for _, p in plan.groups)),
            )
        )
        return self.incumbent

    # --- helpers -----------------------------------------------------------------------------
    def _with_pair(self, group: int, pair: ClockPair) -> Schedule:
        """The incumbent with the group at the pair (STEP_GROUP: every group at it, but a wait
        group that holds a pair of its own)."""
        if group == STEP_GROUP:
            return self._with_pairs({g: pair for g in self._held(self.incumbent)})
        return self._with_pairs({group: pair})

    def _with_pairs(self, pairs: dict[int, ClockPair]) -> Schedule:
        """The incumbent with each group of `pairs` at its pair (a wait group that follows the
        group before it follows it to its new pair)."""
        groups = list(self.incumbent.groups)
        wait = self.wait_group
        if (
            wait is not None
            and wait not in pairs
            and wait - 1 in pairs
            and self._holding_wait(self.incumbent) is None
        ):
            pairs = {**pairs, wait: pairs[wait - 1]}
        for g, pair in pairs.items():
            groups[g] = (groups[g][0], pair)
        return Schedule(tuple(groups))

    def _held(self, schedule: Schedule) -> list[int]:
        """The groups of a schedule whose pairs its kernels run at: all but a wait group that
        holds a pair of its own."""
        wait = self._holding_wait(schedule)
        return [g for g in range(len(schedule.groups)) if g != wait]

    def _pair_of(self, group: int, schedule: Schedule | None = None) -> ClockPair | None:
        """A schedule's pair of a group (None: the incumbent's; STEP_GROUP: the pair every group
        has, a wait group's own left out, None: none; SCREEN_GROUP, TRADE_GROUP: None)."""
        schedule = self.incumbent if schedule is None else schedule
        if group in (SCREEN_GROUP, TRADE_GROUP):
            return None
        if group == STEP_GROUP:
            pairs = {schedule.groups[g][1] for g in self._held(schedule)}
            return next(iter(pairs)) if len(pairs) == 1 else None
        return schedule.groups[group][1]

    def _own_pair(self, group: int) -> ClockPair | None:
        """The pair the incumbent runs a group at, as its search knows it: the group's pair, or
        at stock the top pair (stock's clocks at their highest; a trial of the top pair against
        stock is a null trial, and one noisy reading of it over the budget would rule out every
        pair below it); STEP_GROUP: the pair every group has (None: groups at different pairs)."""
        if group == STEP_GROUP:
            pairs = {self.incumbent.groups[g][1] or self.top_pair for g in self._held(self.incumbent)}
            return next(iter(pairs)) if len(pairs) == 1 else None
        return self._pair_of(group) or self.top_pair

    def _worst_slowdown(self, schedule: Schedule) -> float:
        """Bound on a schedule's slowdown: no kernel slower than its pair's largest clock ratio,
        nor (while a switch lands) the ratio of the group before; weighted by the groups'
        stock times where they are known, else the largest."""
        top_core, top_mem = self.top_pair.core_mhz, self.top_pair.mem_mhz
        ratios = [
            0.0 if p is None else max(top_core / p.core_mhz, top_mem / p.mem_mhz) - 1.0
            for _, p in schedule.groups
        ]
        worst = [max(r, ratios[i - 1]) for i, r in enumerate(ratios)]  # [-1]: the step before's last group
        wait = self._holding_wait(schedule)
        if wait is not None:
            # a wait group's kernels run at the clocks before it (its request lands after them);
            # its pair lands in a long wait and lags into the next step's first group for at
            # most one switch latency L: L wall seconds at a ratio r_w get through at least
            # L / (1 + r_w) of stock's work, so that group (stock time t_0) is slowed by at
            # most r_0 + L / (1 + r_w) / t_0 x (r_w - r_0) when that work lies within it
            r_w, r_0 = ratios[wait], ratios[0]
            t_0 = self.group_times_s[0] if len(self.group_times_s) == len(worst) else 0.0
            lag_work_s = self.switch_latency_s / (1.0 + r_w)
            if r_w > r_0 and 0.0 < lag_work_s <= t_0:  # (a longer lag: the bound as before)
                worst[0] = r_0 + lag_work_s / t_0 * (r_w - r_0)
            worst[wait] = worst[wait - 1]
        if len(self.group_times_s) != len(worst):
            return max(worst, default=0.0)
        return float(np.dot(worst, self.group_times_s) / sum(self.group_times_s))

    def _worst_case_s(self, candidate: Schedule) -> float:
        """What a trial of the candidate can overspend before it is abandoned: its worst
        slowdown until the time check may act (ABANDON_MIN_S plus a step), the guard kept."""
        worst = self._worst_slowdown(candidate)
        return worst * (ABANDON_MIN_S + (1 + GUARD_STEPS) * self.incumbent_step_s)
