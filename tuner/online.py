"""Online tuning: clocks tuned while the training job runs, never slower than the budget.

- OnlineTuner: one session on a device whose kernels we run (simulated or replayed); run()
  advances it chunk by chunk. Its parts, in the class's order: the loop (_train,
  _explore_one), the in-training refinement (refinement.py), the drift watch (_watch_chunk,
  _hold_plan, _on_drift), plan reuse (_store_lookup, _warm_up_under, transfer.py),
  exploration and completion, planning (candidate_matrices, _replan: grouping.py).
- BudgetAccount: time allowed, (1 + budget) x reference, against time spent; the slack pays
  for exploration.
- TuneState: what the session learned and runs; Point: one reported point; Alarm: one drift
  alarm; PlanSource: where the running schedule came from.
- plan_schedule (a plan document as a schedule), schedule_figures (a schedule's noiseless
  saving and slowdown).

Design and findings: docs/design-tuner.md#online-the-tuning-session
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from kdvfs.policies.base import Task
from kdvfs.policies.registry import make_policy
from kdvfs.runtime.iteration import IterationRunner, Schedule
from kdvfs.runtime.measure import THROTTLES, measure_reference_iterations
from kdvfs.runtime.model_device import ModelDevice
from kdvfs.runtime.types import ClockPair, KdvfsError, Workload
from kdvfs.tuner.drift import ConditionWatch, DriftMonitor, group_stream, limit_moved, stream_group
from kdvfs.tuner.grouping import Grouping, group_kernels
from kdvfs.tuner.observations import Observations, measure_cell
from kdvfs.tuner.plan import plan_schedule
from kdvfs.tuner.plan_store import PlanStore
from kdvfs.tuner.refinement import (
    ABORT_S,
    ENERGY_MARGIN,
    TRIAL_S,
    TRIAL_SLACK_S,
    RefinementResult,
    RefinementSearch,
    Trial,
)
from kdvfs.tuner.search import PRIOR_EXCHANGE_RATE_SHARE, TASK_SLOWDOWN, search_space, task_features
from kdvfs.tuner.transfer import carry_schedule

PlanSource = Literal["tuned", "store", "transferred"]
"""Where the running schedule came from: tuned in this session, a stored plan for this card
verified and kept, or another GPU's plan carried to this card's clocks (on trial)."""

#: Share of the budget the schedule may use while exploring (the rest pays for it); a fraction.
EXPLORE_PLAN_SHARE = 0.5
#: Smallest share of the iteration's reference time of a kernel measured in completion; a fraction.
SIGNIFICANT_SHARE = 0.005
#: Number of the per-kernel plan's most used pairs (time-weighted) measured in completion.
COMPLETION_PAIRS = 3
#: Core clocks, as fractions of the top one, of the shared pairs (top memory clock) completion measures.
SHARED_CORE_FRACTIONS = (0.9, 0.8, 0.7)
#: Training between reported points while nothing else happens, and the drift watch's time window; s.
CHUNK_S = 2.0
#: Training under a schedule before its measured slowdown is held against it (its judge window); s.
JUDGE_S = 20.0
#: Longest training chunk while saving up for a measurement (a long one can run throttled); s.
TRAIN_MAX_S = 10.0
#: Shortest energy window of the drift watch (100 energy-counter periods); s.
ENERGY_WINDOW_S = 10.0
#: Longest run at stock waiting for the card to settle after an alarm (ten ~30-s time constants); s.
SETTLE_MAX_S = 300.0
#: Window of the reference measured again after an alarm; s.
REMEASURE_WINDOW_S = 10.0
#: Windows within which an output stream's alarm must recur before it re-tunes; windows.
CONFIRM_WINDOWS = 30
#: Longest training chunk under a settled plan (the inputs are read before each); iterations.
WATCH_ITERATIONS = 25
#: Slowdown beyond the budget, against a first second at stock, that stops a stored plan's warm-up.
WARM_ABORT_SLOWDOWN = 0.05


@dataclass(frozen=True)
class Point:
    """One reported point of the run, as the tuner measured it."""

    iteration: int
    device_s: float
    slowdown: float  # cumulative: run time / (reference time x iterations) - 1
    energy_saving: float  # cumulative: 1 - energy / (reference energy x iterations)
    budget_left_s: float
    measurements: int
    kernels_converged: int
    groups: int


@dataclass
class BudgetAccount:
    """Time allowed vs time spent, from the tuner's own measurements.

    Args:
        ref_time_s: the reference (stock) time of one iteration, s.
        budget: the largest slowdown allowed against it, a fraction.
        iterations, spent_s, ref_total_s: the account so far (iterations run, the seconds they
            took, their reference seconds); zero for a new account.
    """

    ref_time_s: float
    budget: float
    iterations: int = 0
    spent_s: float = 0.0
    ref_total_s: float = 0.0
    """Reference time of the iterations run, each at the reference in force when it ran."""

    def charge(self, seconds: float, iterations: int = 0) -> None:
        self.spent_s += seconds
        self.iterations += iterations
        self.ref_total_s += self.ref_time_s * iterations

    def rebase(self, ref_time_s: float, since_iteration: int | None = None) -> None:
        """The stock time changed (drift): iterations from since_iteration (the alarm that
        proved the change; default now) on are allowed against it."""
        since = self.iterations if since_iteration is None else since_iteration
        self.ref_total_s += (ref_time_s - self.ref_time_s) * (self.iterations - since)
        self.ref_time_s = ref_time_s

    def slack_s(self) -> float:
        return (1.0 + self.budget) * self.ref_total_s - self.spent_s

    def slowdown(self) -> float:
        return self.spent_s / self.ref_total_s - 1.0


@dataclass(frozen=True)
class Alarm:
    """A drift alarm: after how many iterations, which streams, which kernels re-opened;
    held: the plan was kept (the card warmed without throttling: _hold_plan)."""

    iteration: int
    streams: tuple[str, ...]
    reopened: tuple[int, ...]
    held: bool = False

    def summary(self) -> dict[str, object]:
        """What JSON reports say of it, besides when (each report counts iterations its way)."""
        return {"streams": list(self.streams), "reopened_kernels": len(self.reopened), "plan_held": self.held}


@dataclass
class TuneState:
    """What the session has learned and is running."""

    obs: Observations
    schedule: Schedule
    grouping: Grouping | None
    plan_budget: float
    converged: set[int] = field(default_factory=set)
    completion: list[tuple[int, ClockPair]] = field(default_factory=list)
    completion_rounds: int = 0
    converged_at_iteration: int | None = None
    points: list[Point] = field(default_factory=list)
    alarms: list[Alarm] = field(default_factory=list)
    reconverged_at: list[int] = field(default_factory=list)  # after each alarm's re-tuning
    watch_windows: int = 0  # time windows the drift watch judged
    unconfirmed_alarms: int = 0  # output alarms that did not recur within CONFIRM_WINDOWS (nothing re-tuned)
    refinements: list[RefinementResult] = field(
        default_factory=list
    )  # one-pair schedules refined in training
    plan_source: PlanSource = "tuned"  # "transferred" until a drift alarm or a drop
    store_note: str | None = (
        None  # what the plan store lookup found, unless a plan for this very card was kept
    )
    plan_from_iteration: int | None = (
        None  # a kept stored plan ran from this iteration on (after a second at stock)
    )
    stock_spans: list[tuple[int, int]] = field(default_factory=list)
    """Iterations run at stock outside the schedule, [start, end): a stored plan's reference,
    and each drift alarm's settling and reference. Reported points fall only between them."""


class OnlineTuner:
    """A tuning session on a device whose kernels we run (simulated or replayed).

    Args:
        device: the card the job trains on, whose kernels the tuner runs and measures.
        workload: the kernels of one training iteration, in order.
        strategy: the search strategy's name (kdvfs.policies.registry.POLICIES).
        budget: the largest slowdown allowed against stock, a fraction (0.01: 1%).
        seed: seed of the strategy's random draws.
        window_s: length of one exploration measurement (isolated replay), s.
        warmup_s: training at stock before the reference is measured, s.
        drift_watch: watch a settled plan for drift and re-tune on an alarm.
        plan_store: where to look first for this card's stored plan (or another GPU's, to
            carry over); None: tune from scratch.
    """

    def __init__(
        self,
        device: ModelDevice,
        workload: Workload,
        *,
        strategy: str = "botorch",
        budget: float = 0.01,
        seed: int = 0,
        window_s: float = 0.5,
        warmup_s: float = 120.0,
        drift_watch: bool = True,
        plan_store: PlanStore | None = None,
    ) -> None:
        self.device, self.workload, self.budget, self.window_s = device, workload, budget, window_s
        self.strategy, self.seed, self.drift_watch = strategy, seed, drift_watch
        self.runner = IterationRunner(device, workload)
        self.policy = make_policy(strategy, search_space(device), seed=seed)
        self._t0, self._e0 = device.now_s(), device.energy_j()
        plan, source, store_note = (
            self._store_lookup(plan_store) if plan_store is not None else (None, "tuned", None)
        )
        stored = plan if source == "store" else None
        warm_s, warm_runs, plan_s, plan_runs, refused = (
            self._warm_up_under(stored, warmup_s) if stored else (0.0, 0, 0.0, 0, None)
        )
        kept = stored is not None and refused is None
        store_note = "; ".join(filter(None, [store_note, refused])) or None
        # the warm-up already brought the card to its training temperature (under the plan, a
        # little cooler than at stock: a reference measured then is faster and cheaper, i.e. stricter)
        ref = measure_reference_iterations(device, workload.kernels, warmup_s=0.0 if kept else warmup_s)
        self.reference = ref
        self.account = BudgetAccount(ref.iteration_time_s, budget)
        self.account.charge(warm_s, warm_runs)
        self.account.charge(ref.cost_s, ref.all_iterations)
        self.state = TuneState(
            Observations(workload, device.grid.pairs, ref),
            Schedule.stock(),
            None,
            EXPLORE_PLAN_SHARE * budget,
        )
        self.state.store_note = store_note
        self._order = [int(k) for k in np.argsort(-ref.kernel_time_s)]
        self._task_features = task_features(workload)
        self._exchange_rate_w = PRIOR_EXCHANGE_RATE_SHARE * ref.iteration_energy_j / ref.iteration_time_s
        self._measure_cost_s = 2.0 * (window_s + 0.3)  # a throttled pair needs a paired stock measurement
        self._task: Task | None = None
        self._since_plan = (0.0, 0, device.energy_j())  # training seconds, iterations, counter at its start
        self._refinement_search: RefinementSearch | None = None
        self._incumbent: tuple[Schedule, float] | None = (
            None  # a schedule on trial against a one-pair challenger, its energy/iteration
        )
        self._refinement_done = False  # the settled one-pair schedule was refined in training
        self._remembered: ClockPair | None = (
            None  # the pair training chose before a drift re-plan: tried first
        )
        self._warming_since_s: float | None = (
            None  # a held plan runs while the card warms, since then (_hold_plan)
        )
        self._watch: DriftMonitor | None = None
        self._conditions = ConditionWatch()
        self._limit_w = device.power_limit_w()  # the power limit the cells were measured under
        self._time_window = (0.0, 0)  # training seconds and iterations of the open time window
        self._energy_window = (0.0, 0.0, 0)  # counter, seconds, iterations at/since its opening
        self.runner.forget_requests()
        if kept:
            self.state.stock_spans.append((warm_runs, warm_runs + ref.all_iterations))
            self._judge_stored_plan(stored, plan_s, plan_runs, warm_runs - plan_runs)
        elif source == "transferred":
            self._adopt(plan, "transferred", self.account.iterations)

    # --- the loop --------------------------------------------------------------------------
    def run(self, iterations: int, on_point: Callable[[Point], None] | None = None) -> TuneState:
        """Run until `iterations` training iterations have run (reference ones included)."""
        st = self.state
        while self.account.iterations < iterations:
            if self._exploring() and self.account.slack_s() >= self._measure_cost_s:
                self._explore_one()
            else:
                self._train(iterations)
            point = self._point()
            st.points.append(point)
            if on_point is not None:
                on_point(point)
        return st

    def _exploring(self) -> bool:
        """Kernels left to explore, or completion cells left to measure."""
        st = self.state
        return len(st.converged) < len(self.workload) or bool(st.completion)

    def _train(self, target_iterations: int) -> None:
        """Run a chunk of iterations: CHUNK_S, or what it takes to pay for the next
        exploration measurement, at most what is left."""
        iter_s = float(self.state.obs.ref_time_s.sum())
        n = max(1, int(CHUNK_S / iter_s))
        if self._settled():
            n = max(1, math.ceil(CHUNK_S / iter_s))  # a whole window per chunk
        if self._exploring():
            rate = max(self.account.budget - self._schedule_slowdown(), 1e-4) * self.account.ref_time_s
            need = self._measure_cost_s - self.account.slack_s()
            n = max(n, min(math.ceil(need / rate), int(TRAIN_MAX_S / iter_s)))
        transferred = self.state.plan_source == "transferred"
        worst_s = (
            iter_s * self._worst_slowdown(self.state.schedule) if transferred else 0.0
        )  # most an iteration can overspend
        if worst_s > 0.0:
            n = min(n, max(1, int(self.account.slack_s() / worst_s)))  # unproven here: never past the slack
        n = min(n, target_iterations - self.account.iterations)
        if self.drift_watch and self._settled():
            n = min(n, WATCH_ITERATIONS)
            moved = self._conditions.update(
                self.device.now_s(), self.device.temperature_c(), self.device.power_limit_w()
            )
            holding = self._warming_since_s is not None
            # read only when it decides something: an input moved, or a held plan's card warms
            throttled = (holding or bool(moved)) and bool(self.device.throttle_reasons() & THROTTLES)
            if holding and throttled:
                moved = ["temperature"]  # the card warming under a held plan now throttles: its pairs slow
            warmed = moved == ["temperature"] and self._conditions.step_c > 0.0
            if warmed and not throttled and not holding:
                self._hold_plan()
            elif moved:
                self._on_drift(moved, self._group_spans())
                return
        elif self.drift_watch and limit_moved(self._limit_w, self.device.power_limit_w()):
            # a new power limit while exploring: the reference and the cells measured under the old one are off
            self._on_drift(["power_limit"], self._group_spans())
            return
        times, total_s = self.runner.run(self.state.schedule, n)
        self.account.charge(total_s, n)
        run_s, runs, counter_j = self._since_plan
        run_s, runs = run_s + total_s, runs + n
        self._since_plan = (run_s, runs, counter_j)
        if self.refinement_running:
            self._trial_chunk()
            return
        if self.drift_watch and self._settled() and self._watch_chunk(times, total_s, n):
            return
        measured = run_s / runs / self.account.ref_time_s - 1.0
        over = self._beyond(measured, self.state.plan_budget, run_s, 3.0, 1e-3)
        plainly_slow = run_s >= ABORT_S and self._beyond(measured, self.state.plan_budget, run_s, 6.0)
        if transferred and ((over and run_s >= JUDGE_S) or plainly_slow or self.account.slack_s() < worst_s):
            # over the budget after its judge window, plainly slow after ABORT_S, or the slack spent on it
            self._drop_transferred(measured)
        elif run_s >= JUDGE_S and (self.state.grouping is not None or transferred):
            if over:
                self.state.plan_budget *= 0.5  # the schedule runs slower than planned: back off
                self._replan()
            elif self._settled() and not self._refinement_done and self.account.slack_s() >= TRIAL_SLACK_S:
                self._start_refinement(measured, (self.device.energy_j() - counter_j) / runs)

    # --- in-training refinement of a one-pair schedule (refinement.py) ------------------------
    @property
    def refinement_running(self) -> bool:
        """A trial of the in-training refinement is running."""
        return self._refinement_search is not None or self._incumbent is not None

    def _start_refinement(self, slowdown: float, energy_j: float) -> None:
        """A settled schedule passed its judge window (measured slowdown and energy per
        iteration). After a drift re-plan, first try the pair training chose before the drift
        against it. One pair: bisect its core clock. Several groups: first try the best
        one-pair schedule against it (on a slow-switch card the planner, working from
        isolated cells, may prefer groups that training does not bear out)."""
        pair = self._one_pair()
        remembered, self._remembered = self._remembered, None
        if remembered is not None and remembered != pair:
            # after a drift re-plan: training's own choice from before the drift, against the planner's
            self._incumbent = (self.state.schedule, energy_j)
            self.state.schedule = Schedule(((0, remembered),))
            self._start_window()
            return
        if pair is not None:
            cores = [p.core_mhz for p in self.device.grid.pairs if p.mem_mhz == pair.mem_mhz]
            self._refinement_search = RefinementSearch(Trial(pair, slowdown, energy_j, True), cores)
            self._next_trial()
            return
        alternative = self._best_one_pair()
        if alternative is None:
            self._refinement_done = True
            return
        self._incumbent = (self.state.schedule, energy_j)
        self.state.schedule = Schedule(((0, alternative),))
        self._start_window()

    def _best_one_pair(self) -> ClockPair | None:
        """The least-energy pair for the whole iteration within the time limit, from the
        planner's matrices (measured cells, pessimistic fill-ins)."""
        t, e, columns = self.candidate_matrices(self.state.plan_budget)
        limit_s = self.state.obs.time_limit_s(self.state.plan_budget)
        fits = [c for c, pair in enumerate(columns) if pair is not None and t[:, c].sum() <= limit_s]
        return columns[min(fits, key=lambda c: e[:, c].sum())] if fits else None

    def _one_pair(self) -> ClockPair | None:
        """The pair of the running schedule, when it runs the whole iteration at one."""
        return self.state.schedule.one_pair()

    def _beyond(self, slowdown: float, limit: float, run_s: float, sds: float, slack: float = 0.0) -> bool:
        """A slowdown measured over run_s of training exceeds the limit by more than sds s.d.
        of the reference's noise (its sub-window s.d. is per ~1 s) plus slack."""
        return slowdown > limit + sds * self.reference.time_rel_sd / math.sqrt(run_s) + slack

    def _limit_slowdown(self) -> float:
        obs = self.state.obs
        return obs.time_limit_s(self.state.plan_budget) / float(obs.ref_time_s.sum()) - 1.0

    def _start_window(self) -> None:
        """A new schedule runs from here: its own judge window and drift baselines."""
        self._since_plan = (0.0, 0, self.device.energy_j())
        self._watch = None
        self._conditions.relearn_temperature()

    def _trial_chunk(self) -> None:
        """Judge the running trial once it has run TRIAL_S (or ABORT_S, plainly too slow)."""
        run_s, runs, counter_j = self._since_plan
        slowdown = run_s / runs / self.account.ref_time_s - 1.0
        limit = self._limit_slowdown()
        too_slow = self._beyond(slowdown, limit, run_s, 6.0)
        if not (run_s >= TRIAL_S or (run_s >= ABORT_S and too_slow)):
            return
        trial = Trial(
            self._one_pair(),
            slowdown,
            (self.device.energy_j() - counter_j) / runs,
            run_s >= TRIAL_S and slowdown <= limit,
        )
        if self._incumbent is None:
            self._refinement_search.tell(trial)
            self._next_trial()
            return
        incumbent, incumbent_energy_j = self._incumbent
        self._incumbent = None
        incumbent_pair = incumbent.one_pair()
        if trial.feasible and trial.energy_j < (1.0 - ENERGY_MARGIN) * incumbent_energy_j:
            # the one-pair challenger wins in training: keep it, refine it after its own judge window
            self.state.refinements.append(
                RefinementResult(
                    self.account.iterations, incumbent_pair, trial.pair, 1, trial.slowdown, trial.energy_j
                )
            )
        else:
            # back to the incumbent: a one-pair one is refined after its judge window, groups are final
            self.state.schedule, self._refinement_done = incumbent, incumbent_pair is None
        self._start_window()

    def _next_trial(self) -> None:
        """Run the next candidate, or settle on the best when done (or when the slack could
        not pay for a trial that turns out too slow)."""
        ref = self._refinement_search
        pair = ref.candidate()
        if pair is not None and self.account.slack_s() >= TRIAL_SLACK_S:
            self.state.schedule = Schedule(((0, pair),))
        else:
            best = ref.best()
            self.state.refinements.append(
                RefinementResult(
                    self.account.iterations,
                    ref.incumbent.pair,
                    best.pair,
                    len(ref.trials),
                    best.slowdown,
                    best.energy_j,
                )
            )
            self.state.schedule = Schedule(((0, best.pair),))
            self._refinement_search, self._refinement_done = None, True
        self._start_window()

    def _settled(self) -> bool:
        """Converged (or a stored plan kept) and nothing left to explore."""
        return self.state.converged_at_iteration is not None and not self._exploring()

    # --- drift watch -----------------------------------------------------------------------
    @property
    def watch_ready(self) -> bool:
        """The drift watch has the baselines of all its streams (it can alarm)."""
        return self._watch is not None and self._watch.ready

    def _group_spans(self) -> list[tuple[int, int]]:
        groups = self.state.schedule.groups
        ends = [s for s, _ in groups[1:]] + [len(self.workload)]
        return [(s, e) for (s, _), e in zip(groups, ends)]

    def _watch_chunk(self, times: np.ndarray, total_s: float, n: int) -> bool:
        """Feed one training chunk to the drift watch; on an alarm re-tune. True on an alarm."""
        ref_t = self.state.obs.ref_time_s
        spans = self._group_spans()
        if self._watch is None:
            names = ["iteration", "energy"] + [group_stream(i) for i in range(len(spans))]
            self._watch = DriftMonitor(names, confirm=CONFIRM_WINDOWS)
            self._time_window = (0.0, 0)
            self._energy_window = (self.device.energy_j(), 0.0, 0)
            return False
        values: dict[str, float] = {}
        expected: dict[str, float] = {}
        win_s, win_n = self._time_window[0] + total_s, self._time_window[1] + n
        if win_s >= CHUNK_S:
            values["iteration"], expected["iteration"] = win_s / win_n, float(ref_t.sum())
            for i, (a, b) in enumerate(spans):
                stream = group_stream(i)
                values[stream], expected[stream] = float(times[a:b].sum()), float(ref_t[a:b].sum())
            win_s, win_n = 0.0, 0
            self.state.watch_windows += 1
        self._time_window = (win_s, win_n)
        e0, e_s, e_n = self._energy_window
        e_s, e_n = e_s + total_s, e_n + n
        if self._warming_since_s is not None:
            e0, e_s, e_n = (
                self.device.energy_j(),
                0.0,
                0,
            )  # leakage rises with the temperature: energy sits out
            if (
                self._conditions.centre_c is not None
                or self.device.now_s() - self._warming_since_s >= SETTLE_MAX_S
            ):
                self._end_warming()
        elif e_s >= ENERGY_WINDOW_S:
            now_j = self.device.energy_j()
            values["energy"], expected["energy"] = (now_j - e0) / e_n, self.reference.iteration_energy_j
            e0, e_s, e_n = now_j, 0.0, 0
        self._energy_window = (e0, e_s, e_n)
        if not values:
            return False
        unconfirmed = self._watch.unconfirmed
        moved = self._watch.update(values, expected)
        self.state.unconfirmed_alarms += self._watch.unconfirmed - unconfirmed
        if moved:
            self._on_drift(moved, spans)
        return bool(moved)

    def _hold_plan(self) -> None:
        """The card warmed and nothing throttles it: keep the plan and the reference (warmer
        stock is only slower). The energy stream sits out until the temperature is flat
        (_end_warming); a throttle reason meanwhile is an alarm. Why: docs/design-tuner.md
        (drift handling in the session)."""
        self.state.alarms.append(Alarm(self.account.iterations, ("temperature",), (), held=True))
        self._warming_since_s = self.device.now_s()

    def _on_drift(self, streams: list[str], spans: list[tuple[int, int]]) -> None:
        """Re-measure the stock reference and re-plan from what still holds: the kernels of the
        groups whose time moved are re-opened (their cells forgotten, explored again), the other
        cells kept (a new power limit: _limit_moved); everything is re-opened when the running
        plan came from the store and has no cells. Why: docs/design-tuner.md."""
        st = self.state
        obs = st.obs
        self._warming_since_s = None
        moved_groups = [i for i in map(stream_group, streams) if i is not None]
        if not obs.counts.any():
            reopen = list(range(len(self.workload)))
        else:
            reopen = sorted({k for i in moved_groups for k in range(*spans[i])})
        st.alarms.append(Alarm(self.account.iterations, tuple(streams), tuple(reopen)))
        self._remembered = None
        st.plan_source = "tuned"
        old, old_limit_w = self.reference, self._limit_w
        self._limit_w = self._conditions.limit_w = self.device.power_limit_w()
        alarm_at = self.account.iterations
        if streams != ["workload"]:
            self._settle_at_stock()
        ref = measure_reference_iterations(
            self.device, self.workload.kernels, warmup_s=0.0, window_s=REMEASURE_WINDOW_S
        )
        self.account.rebase(ref.iteration_time_s, since_iteration=alarm_at)
        self.account.charge(ref.cost_s, ref.all_iterations)
        st.stock_spans.append((alarm_at, self.account.iterations))
        self.reference = ref
        obs.reference = ref
        obs.cost_s += ref.cost_s
        self._exchange_rate_w = PRIOR_EXCHANGE_RATE_SHARE * ref.iteration_energy_j / ref.iteration_time_s
        kernel_ratio = ref.kernel_time_s / old.kernel_time_s
        obs.stock_time_s *= kernel_ratio  # isolated stock moves as stock in training did
        if "workload" in streams:
            # the same kernels at other sizes: each one's cells scale with its stock time (a
            # kernel twice as long at one pair draws the same power for twice the time)
            obs.stock_energy_j *= kernel_ratio
            obs.time_s *= kernel_ratio[:, None]
            obs.energy_j *= kernel_ratio[:, None]
        else:
            obs.stock_energy_j *= ref.iteration_energy_j / old.iteration_energy_j
        if "power_limit" in streams:
            self._limit_moved(old_limit_w)
        for k in reopen:
            st.converged.discard(k)
            obs.time_s[k], obs.energy_j[k], obs.counts[k], obs.paired_ratio[k] = np.nan, np.nan, 0, np.nan
            obs.stock_time_s[k], obs.stock_energy_j[k] = np.nan, np.nan
        self._order = [int(k) for k in np.argsort(-ref.kernel_time_s)]
        self.runner.forget_requests()
        if self._exploring():
            self._task = None  # the kernel in hand starts again from its scaled stock figures
        if not reopen:
            if not self._exploring():
                st.plan_budget = self.budget
                st.reconverged_at.append(self.account.iterations)
            self._replan()
            last = st.refinements[-1] if st.refinements and not self._exploring() else None
            self._remembered = None if last is None else last.to_pair
            return
        self.policy = make_policy(self.strategy, search_space(self.device), seed=self.seed + len(st.alarms))
        self._task = None
        st.completion, st.completion_rounds = [], 0
        st.plan_budget = EXPLORE_PLAN_SHARE * self.budget
        self._replan()

    def _end_warming(self) -> None:
        """The card settled under a held plan (or SETTLE_MAX_S passed): the energy stream
        learns its baseline afresh, with the warmer card's leakage in it. Stock is not measured
        again (docs/design-tuner.md says why)."""
        self._warming_since_s = None
        self._watch.reset(["energy"])

    def _settle_at_stock(self) -> None:
        """Run stock iterations until the card's temperature is flat again (ConditionWatch
        settles), at most SETTLE_MAX_S: the reference measured next is stock at its own
        steady temperature under the new conditions."""
        watch = ConditionWatch()
        n = max(1, math.ceil(1.0 / self.reference.iteration_time_s))
        start_s = self.device.now_s()
        while watch.centre_c is None and self.device.now_s() - start_s < SETTLE_MAX_S:
            _, total_s = self.runner.run(Schedule.stock(), n)
            self.account.charge(total_s, n)
            watch.update(self.device.now_s(), self.device.temperature_c(), self.device.power_limit_w())

    def change_workload(self, workload: Workload) -> None:
        """The job's kernels changed size (its batch size, say): the same kernels by name and
        order under another signature. The table is carried over (_on_drift) instead of
        tuning from scratch; other kernels need a new session."""
        old_names = [k.name for k in self.workload.kernels]
        if [k.name for k in workload.kernels] != old_names:
            raise KdvfsError(
                f"workload change from {self.workload.name!r} to {workload.name!r}: the kernels differ "
                "(names or order); start a new session for it"
            )
        spans = self._group_spans()
        self.workload = workload
        self.state.obs.workload = workload
        self.runner = IterationRunner(self.device, workload)
        self._task_features = task_features(workload)
        self._on_drift(["workload"], spans)

    def _limit_moved(self, old_limit_w: float) -> None:
        """Cells after the power limit moved. Lowered: a pair at which the kernel drew more than
        the new limit, or was already throttled (a paired cell), is now held to the limit by
        the card, as stock is: it runs as stock does (paired ratio 1). Raised: a paired cell
        may hold now; unknown, it is forgotten."""
        obs = self.state.obs
        paired = ~np.isnan(obs.paired_ratio[..., 0])
        limit_w = self._limit_w
        if limit_w < old_limit_w:
            with np.errstate(invalid="ignore"):
                capped = paired | (obs.energy_j / obs.time_s > limit_w)
            obs.paired_ratio[capped] = 1.0
        else:
            obs.time_s[paired], obs.energy_j[paired], obs.counts[paired], obs.paired_ratio[paired] = (
                np.nan,
                np.nan,
                0,
                np.nan,
            )

    # --- plan reuse ------------------------------------------------------------------------
    def _store_lookup(self, store: PlanStore) -> tuple[Schedule | None, PlanSource, str | None]:
        """The store's plan for this GPU, grid and workload ("store"); else the newest plan for
        this workload from another GPU, carried to this card's clocks ("transferred",
        transfer.py); else none. With a note of what was found, where it matters."""
        try:
            plan = store.get(self.device.name, self.device.grid, self.workload.signature)
        except KdvfsError as exc:
            return None, "tuned", f"stored plan refused: {exc}"
        if plan is not None:
            return plan_schedule(plan), "store", None
        note = "no stored plan for this GPU, clock grid and workload"
        other = store.newest_for_other_gpu(self.device.name, self.workload.signature)
        if other is None:
            return None, "tuned", note
        carried = carry_schedule(plan_schedule(other), other.grid, self.device.grid)
        clocks = ", ".join("stock" if p is None else f"{p.core_mhz}/{p.mem_mhz}" for _, p in carried.groups)
        return (
            carried,
            "transferred",
            (
                f"{note}; the plan of {other.gpu_name} for this workload carried to this card's "
                f"clocks by relative position ({clocks} MHz), verified in training"
            ),
        )

    def _warm_up_under(
        self, schedule: Schedule, warmup_s: float
    ) -> tuple[float, int, float, int, str | None]:
        """Run a stored schedule for the reference's warm-up (warmup_s of training): the job
        saves from its first iteration. A second at stock first gives a provisional reference
        (a cool card's stock, fast: strict); the schedule is stopped after a chunk when it
        runs slower than that by more than the budget plus WARM_ABORT_SLOWDOWN. Returns the
        seconds and iterations run, those of them under the schedule, and why it was refused,
        if it was."""
        run_s, runs = 0.0, 0
        while run_s < 1.0:
            _, total_s = self.runner.run(Schedule.stock(), 1)
            run_s, runs = run_s + total_s, runs + 1
        stock_total_s, stock_runs = run_s, runs
        stock_s = stock_total_s / stock_runs
        chunk = max(1, math.ceil(CHUNK_S / stock_s))
        refused = None
        while run_s < warmup_s:
            _, total_s = self.runner.run(schedule, chunk)
            run_s, runs = run_s + total_s, runs + chunk
            measured = total_s / chunk / stock_s - 1.0
            if measured > self.budget + WARM_ABORT_SLOWDOWN:
                refused = (
                    f"stored plan refused: measured slowdown {measured:+.4f} against a first second at stock, "
                    f"over the budget {self.budget}"
                )
                break
        return run_s, runs, run_s - stock_total_s, runs - stock_runs, refused

    def _judge_stored_plan(self, schedule: Schedule, run_s: float, runs: int, from_iteration: int) -> None:
        """Keep the stored schedule, which ran through the warm-up, when its measured slowdown
        against the reference measured after it is within the budget plus 3 s.d. of noise."""
        measured = run_s / runs / self.reference.iteration_time_s - 1.0
        if self._beyond(measured, self.budget, run_s, 3.0, 1e-3):
            self.state.store_note = (
                f"stored plan refused: measured slowdown {measured:+.4f} over the budget {self.budget}"
            )
            return
        self._adopt(schedule, "store", from_iteration)

    def _adopt(self, schedule: Schedule, source: PlanSource, from_iteration: int) -> None:
        """Run a schedule from the store as the settled one, nothing to explore. A transferred
        one is still on trial: _train drops it when training measures it over the budget."""
        st = self.state
        st.schedule, st.plan_source, st.plan_budget = schedule, source, self.budget
        st.plan_from_iteration = from_iteration
        st.converged = set(range(len(self.workload)))
        st.converged_at_iteration = self.account.iterations
        self._start_window()

    def _worst_slowdown(self, schedule: Schedule) -> float:
        """Bound on a schedule's slowdown: no kernel runs slower than at its slowest ratio."""
        return max((self._slowest_ratio(p) - 1.0 for _, p in schedule.groups if p is not None), default=0.0)

    def _slowest_ratio(self, pair: ClockPair) -> float:
        """How much slower than stock a kernel can run at a pair: the larger of the clock
        ratios to the top clocks (the planner's pessimistic fill-in)."""
        grid = self.device.grid
        return max(max(grid.core_levels_mhz) / pair.core_mhz, max(grid.mem_levels_mhz) / pair.mem_mhz, 1.0)

    def _drop_transferred(self, measured: float) -> None:
        """A transferred schedule ran over the budget in training: tune this card from scratch."""
        st = self.state
        st.store_note = (
            f"{st.store_note}; transferred plan dropped: measured slowdown {measured:+.4f} in training"
        )
        st.plan_source, st.converged, st.converged_at_iteration = "tuned", set(), None
        st.plan_budget = EXPLORE_PLAN_SHARE * self.budget
        self._replan()

    def _schedule_slowdown(self) -> float:
        g = self.state.grouping
        return 0.0 if g is None else g.time_s / float(self.state.obs.ref_time_s.sum()) - 1.0

    def _explore_one(self) -> None:
        st = self.state
        before_s = self.device.now_s()
        if len(st.converged) == len(self.workload):
            k, pair = st.completion.pop(0)
            measure_cell(self.device, st.obs, k, pair, self.window_s)
            if not st.completion:
                self._complete()
            self._charge_exploration(before_s)
            return
        k = next(k for k in self._order if k not in st.converged)
        kernel = self.workload.kernels[k]
        obs = st.obs
        if self._task is None or self._task.key != kernel.name:
            measure_cell(self.device, obs, k, None, self.window_s)
            self._task = Task(
                key=kernel.name,
                ref_time_s=obs.stock_time_s[k] / kernel.launches,
                ref_energy_j=(obs.stock_energy_j[k] + self._exchange_rate_w * obs.stock_time_s[k])
                / kernel.launches,
                budget=TASK_SLOWDOWN,
                features=self._task_features[k],
            )
        else:
            config = self.policy.ask(self._task)
            if config is None:
                st.converged.add(k)
                self._task = None
                if len(st.converged) == len(self.workload):
                    self._complete()
                else:
                    self._replan()
            else:
                measure_cell(self.device, obs, k, obs.pairs[config], self.window_s)
                time_s, energy_j = obs.plannable()
                cost = energy_j[k, config] + self._exchange_rate_w * time_s[k, config]
                self.policy.tell(
                    self._task, config, time_s[k, config] / kernel.launches, cost / kernel.launches
                )
        self._charge_exploration(before_s)

    def _charge_exploration(self, before_s: float) -> None:
        spent = self.device.now_s() - before_s
        self._measure_cost_s = max(self._measure_cost_s, spent)
        self.account.charge(spent)
        self.runner.forget_requests()

    def _complete(self) -> None:
        """Queue, once, the cells of the COMPLETION_PAIRS pairs the per-kernel plan uses most
        (time-weighted) for every significant kernel not measured there; when done, settle on
        the final schedule."""
        st = self.state
        needed: list[tuple[int, ClockPair]] = []
        if st.completion_rounds == 0:
            st.completion_rounds = 1
            obs = st.obs
            share = obs.ref_time_s / obs.ref_time_s.sum()
            weight: dict[ClockPair, float] = {}
            for k, pair in enumerate(obs.kernel_level_choice(self.budget).values()):
                if pair is not None:
                    weight[pair] = weight.get(pair, 0.0) + share[k]
            for pair in self._completion_pairs(weight):
                j = obs.pairs.index(pair)
                needed += [
                    (k, pair) for k in self._order if share[k] >= SIGNIFICANT_SHARE and obs.counts[k, j] == 0
                ]
        st.completion = needed
        if not st.completion:
            if st.converged_at_iteration is None:
                st.converged_at_iteration = self.account.iterations
            else:
                st.reconverged_at.append(self.account.iterations)
            st.plan_budget = self.budget
            self._replan()

    def _completion_pairs(self, plan_weight: dict[ClockPair, float]) -> list[ClockPair]:
        """The pairs the per-kernel plan uses most (time-weighted), and the pairs a group of
        mixed kernels can share: the top memory clock (memory-bound kernels need it) with the
        core a step or more below its top (SHARED_CORE_FRACTIONS: compute-bound kernels lose
        little there, and under a power cap may even gain)."""
        grid = self.device.grid
        top_mem = max(grid.mem_levels_mhz)
        cores = sorted(p.core_mhz for p in grid.pairs if p.mem_mhz == top_mem)
        shared = [
            ClockPair(min(cores, key=lambda c: abs(c - f * cores[-1])), top_mem)
            for f in SHARED_CORE_FRACTIONS
        ]
        preferred = sorted(plan_weight, key=plan_weight.get, reverse=True)[:COMPLETION_PAIRS]
        return list(dict.fromkeys(preferred + shared))

    # --- planning --------------------------------------------------------------------------
    def candidate_matrices(self, budget: float) -> tuple[np.ndarray, np.ndarray, list[ClockPair | None]]:
        """Per kernel x candidate setting (the pairs the per-kernel plan uses, the pairs measured
        for kernels carrying most of the time, and stock): time and energy per iteration,
        measured where known, pessimistic fill-ins elsewhere (time scaled by the larger clock
        ratio, power as at stock)."""
        obs = self.state.obs
        ideal = obs.kernel_level_choice(budget)
        share = obs.ref_time_s / obs.ref_time_s.sum()
        covered = ((obs.counts > 0) * share[:, None]).sum(axis=0)
        common = [obs.pairs[j] for j in np.argsort(-covered)[:8] if covered[j] > 0]
        columns: list[ClockPair | None] = [
            *list(dict.fromkeys([p for p in ideal.values() if p is not None] + common)),
            None,
        ]
        time_m, energy_m = obs.plannable()
        ref_t = obs.ref_time_s
        mean_power_w = self.reference.iteration_energy_j / self.reference.iteration_time_s
        stock_e = np.where(np.isnan(obs.stock_energy_j), ref_t * mean_power_w, obs.stock_energy_j)
        t = np.empty((len(self.workload), len(columns)))
        e = np.empty_like(t)
        for c, pair in enumerate(columns):
            if pair is None:
                t[:, c], e[:, c] = ref_t, stock_e
                continue
            j = obs.pairs.index(pair)
            fill_t = ref_t * self._slowest_ratio(pair)
            fill_e = stock_e / ref_t * fill_t
            t[:, c] = np.where(np.isnan(time_m[:, j]), fill_t, time_m[:, j])
            e[:, c] = np.where(np.isnan(energy_m[:, j]), fill_e, energy_m[:, j])
        return t, e, columns

    def _replan(self) -> None:
        st = self.state
        self._start_window()
        self._refinement_search, self._incumbent, self._refinement_done = None, None, False
        limit_s = st.obs.time_limit_s(st.plan_budget)
        if limit_s < float(st.obs.ref_time_s.sum()):
            st.schedule, st.grouping = Schedule.stock(), None
            return
        t, e, columns = self.candidate_matrices(st.plan_budget)
        grouping = group_kernels(t, e, self.device.switch_latency_s, limit_s, 0.0)
        if not grouping.feasible:
            st.schedule, st.grouping = Schedule.stock(), None
            return
        st.grouping = grouping
        st.schedule = Schedule(tuple((g.start, columns[g.pair_index]) for g in grouping.groups))

    def _point(self) -> Point:
        acc = self.account
        energy_j = self.device.energy_j() - self._e0
        return Point(
            iteration=acc.iterations,
            device_s=self.device.now_s() - self._t0,
            slowdown=acc.slowdown(),
            energy_saving=1.0 - energy_j / (self.reference.iteration_energy_j * acc.iterations),
            budget_left_s=acc.slack_s(),
            measurements=self.state.obs.measurements,
            kernels_converged=len(self.state.converged),
            groups=len(self.state.schedule.groups),
        )
