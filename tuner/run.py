"""One tuning run: the one place the step-driven tuner is built, and what every caller reads of it.

- `TuningRun`: builds the StepTuner (tuner/step_tuner.py) from a `Card`, a workload, a `Prior`
  and the run's settings; callers feed it step reports (`on_step_end`) and follow its events
  (`subscribe`: the tuner's PhaseEntered, TrialFinished, Adoption, Alarm, and the run's own
  `Point` every POINT_EVERY_S of training). `kdvfs tune` and every simulated loop
  (tuner/session.py), `kdvfs.tune` and its callbacks (tuner/job_tuning.py), the scenarios, the
  peers' kdvfs row, the experiments and the Gymnasium environment all feed one.
- `choose_prior`: what the tuner starts from (a stored plan, another card's carried, a measured
  sweep's, the card's own model, or none), the same for every caller.
- `Point` / `point_metrics`: the run so far under one set of metric names (`METRICS`), the
  names MLflow and progress use whoever drives the run.
- `TuningRun.plan`: the adopted schedule as a Plan (measured figures, or a simulated card's
  noiseless ones); `TuningRun.summary`: what the tuner measured, JSON-ready.
- `Oracle` / `oracle` and `reached_after`: the yardstick (the realisable schedule and the ideal
  per-kernel plan, held to the budget in the step) and "reached a level and stayed there".

Design: docs/design-step-tuner.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from kdvfs.policies.base import Strategy
from kdvfs.runtime.device import RunnableDevice
from kdvfs.runtime.model_device import ModelDevice
from kdvfs.runtime.ranks import RankPool
from kdvfs.runtime.schedule import Schedule, schedule_items
from kdvfs.runtime.steps import StepReport
from kdvfs.runtime.trials import ADOPT_Z, Judgement, Window
from kdvfs.runtime.types import ClockGrid, KdvfsError, Workload
from kdvfs.tuner.plan import Plan, plan_schedule
from kdvfs.tuner.plan_store import PlanStore
from kdvfs.tuner.step_priors import model_schedule, switch_sites
from kdvfs.tuner.step_tuner import (
    DEFAULT_STRATEGY,
    Adoption,
    Alarm,
    PhaseEntered,
    StepTiming,
    StepTuner,
    TrialFinished,
    TunerEvent,
)
from kdvfs.tuner.sweep import held_plan, held_realisable, run_sweep
from kdvfs.tuner.transfer import carry_schedule

#: Training between two Points of a run; s.
POINT_EVERY_S = 1.0
#: The trial length whose resolvable differences the summary reports; s.
RESOLVE_TRIAL_S = 60.0
#: A card whose clock switch lands within this is switched at every kernel by "auto" sites; s.
FAST_SWITCH_S = 1e-3
#: Clock-switch latency assumed for a card that does not state its own, s (tens of ms on current cards).
DEFAULT_SWITCH_LATENCY_S = 0.030
#: Update period of the energy counter assumed for a card that does not state its own, s.
DEFAULT_ENERGY_UPDATE_PERIOD_S = 0.1
#: Share of the realisable oracle's saving a run's plan must reach to count as there; a fraction.
ORACLE_SHARE = 0.95
#: The tuner's phases, in the order their index is logged (the `phase` metric; phases added
#: later come last, so that earlier runs' indices keep their meaning).
PHASES = ("Reference", "Exploring", "Verifying", "Settled", "Retuning", "Screening", "Trading")
#: The run's metrics, logged under these names by every caller (MLflow step metrics).
METRICS = (
    "slowdown",
    "energy_saving",
    "plan_energy_saving",
    "budget_left_s",
    "adoptions",
    "step_time_s",
    "temperature_c",
    "phase",
    "time_noise_per_root_s",
    "energy_noise_per_root_s",
)

PriorSource = Literal["store", "transferred", "measured", "model", "none"]
Sites = Literal["auto", "modules", "kernels"]


@dataclass(frozen=True)
class Card:
    """What a tuning run needs to know of the card.

    Attributes:
        name: the GPU's name (NVML's, or the simulated preset's).
        grid: its supported clock pairs.
        switch_latency_s: how long a clock switch takes to land, s.
        energy_update_period_s: how often its energy counter advances, s.
        source: where its figures come from ("simulated", "replayed", "measured").
    """

    name: str
    grid: ClockGrid
    switch_latency_s: float
    energy_update_period_s: float
    source: str

    @classmethod
    def of(
        cls,
        device: Any,
        *,
        switch_latency_s: float | None = None,
        energy_update_period_s: float | None = None,
    ) -> Card:
        """The card of a device; a latency or period the device does not state (a real card)
        is the given one, else DEFAULT_SWITCH_LATENCY_S / DEFAULT_ENERGY_UPDATE_PERIOD_S."""
        return cls(
            name=device.name,
            grid=device.grid,
            switch_latency_s=_stated(switch_latency_s, device, "switch_latency_s", DEFAULT_SWITCH_LATENCY_S),
            energy_update_period_s=_stated(
                energy_update_period_s, device, "energy_update_period_s", DEFAULT_ENERGY_UPDATE_PERIOD_S
            ),
            source=getattr(device, "source", "measured"),
        )


def _stated(given: float | None, device: Any, name: str, default: float) -> float:
    if given is not None:
        return given
    value = getattr(device, name, None)
    return float(value) if isinstance(value, int | float) else default


def job_sites(workload: Workload, switch_latency_s: float, sites: Sites = "auto") -> list[int]:
    """Kernel indices where the job switches clocks: "modules", the step, each pass and each
    submodule (where a PyTorch job's hooks sit: step_priors.switch_sites); "kernels", every
    kernel (a fast-switch card's hooks); "auto", kernels on a card that switches within
    FAST_SWITCH_S, else modules."""
    if sites == "kernels" or (sites == "auto" and switch_latency_s <= FAST_SWITCH_S):
        return list(range(len(workload)))
    return switch_sites(workload)


# --- the prior ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Prior:
    """What the tuner starts from: a schedule (None: nothing), where it came from, a note."""

    schedule: Schedule | None
    source: PriorSource
    note: str | None = None


NO_PRIOR = Prior(None, "none")


def choose_prior(
    card: Card | Any,
    workload: Workload,
    budget: float,
    *,
    store: PlanStore | None,
    model: ModelDevice | None = None,
    sites: list[int] | None = None,
    measured: Schedule | None = None,
) -> Prior:
    """The stored plan for this GPU, grid and workload; else another GPU's plan for the workload
    carried to this card's clocks; else a plan from this card's measured table (`measured`:
    step_priors.sweep_prior of a real card's sweep); else the plan of the card's own model
    (`model`: a noiseless copy of a simulated card); else none. A stored plan that is refused
    (bad file) is said in the note, and skipped. `card`: a Card or a device (its name, grid)."""
    note = None
    if store is not None:
        try:
            plan = store.get(card.name, card.grid, workload.signature)
        except KdvfsError as exc:
            plan, note = None, f"stored plan refused: {exc}"
        if plan is not None:
            return Prior(plan_schedule(plan), "store", f"the stored plan of {plan.created}")
        note = note or "no stored plan for this GPU, clock grid and workload"
        other = store.newest_for_other_gpu(card.name, workload.signature)
        if other is not None:
            carried = carry_schedule(plan_schedule(other), other.grid, card.grid)
            clocks = ", ".join(
                "stock" if p is None else f"{p.core_mhz}/{p.mem_mhz}" for _, p in carried.groups
            )
            return Prior(
                carried,
                "transferred",
                f"{note}; the plan of {other.gpu_name} for this workload carried to this card's clocks "
                f"by relative position ({clocks} MHz)",
            )
    if measured is not None:
        return Prior(measured, "measured", note)
    if model is not None:
        return Prior(model_schedule(model, workload, budget, sites), "model", note)
    return Prior(None, "none", note)


# --- the run so far ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Point:
    """The run so far, as the tuner measured it.

    Attributes:
        step: steps run.
        end_s: training seconds.
        phase: the tuner's phase (PHASES).
        slowdown: the run's cumulative slowdown against stock measured in training (the budget
            account: the GPU's busy time, the job's own waits for its host left out), a
            fraction; NaN before stock was measured.
        energy_saving: the run's energy so far (the counter) against stock's step energy
            measured in training times the steps, a fraction; NaN before stock was measured.
        plan_energy_saving: the adopted schedule's saving against stock, as the tuner measured
            it, a fraction (0 before an adoption).
        budget_left_s: seconds the run may still overspend.
        adoptions: candidates adopted so far.
        step_time_s: the last step's time, s.
        temperature_c: the card's temperature at the last step's end, C (NaN: not reported).
        time_noise_per_root_s: the job's step-time noise, relative s.d. of a step time mean
            over 1 s, as measured so far (NaN before stock was measured).
        energy_noise_per_root_s: the job's energy noise, relative s.d. of a 1-s window's
            energy per step, as measured so far (NaN before stock was measured).
    """

    step: int
    end_s: float
    phase: str
    slowdown: float
    energy_saving: float
    plan_energy_saving: float
    budget_left_s: float
    adoptions: int
    step_time_s: float = math.nan
    temperature_c: float = math.nan
    time_noise_per_root_s: float = math.nan
    energy_noise_per_root_s: float = math.nan


def point_metrics(point: Point) -> dict[str, float]:
    """A Point as MLflow step metrics under METRICS' names (finite values only)."""
    values = {
        "slowdown": point.slowdown,
        "energy_saving": point.energy_saving,
        "plan_energy_saving": point.plan_energy_saving,
        "budget_left_s": point.budget_left_s,
        "adoptions": float(point.adoptions),
        "step_time_s": point.step_time_s,
        "temperature_c": point.temperature_c,
        "phase": float(PHASES.index(point.phase)),
        "time_noise_per_root_s": point.time_noise_per_root_s,
        "energy_noise_per_root_s": point.energy_noise_per_root_s,
    }
    return {k: float(v) for k, v in values.items() if math.isfinite(v)}


# --- the run -----------------------------------------------------------------------------------
class TuningRun:
    """One tuning run: the StepTuner built once, fed step reports, followed by events.

    Args:
        card: the card tuned (Card.of(device)).
        workload: the kernels of one training step.
        budget: the largest cumulative slowdown against stock, a fraction (0.01: 1%).
        strategy: the search strategy: a name (kdvfs.policies.registry) or the strategy itself
            (the service's, service/client.py).
        seed: seeds a strategy made from its name.
        prior: what the tuner starts from (choose_prior); a stored plan ("store") is verified
            over fewer blocks, as jobs before proved it in training.
        sites: kernel indices where the job can switch clocks (job_sites); None: the step and
            each pass.
        timing: how long the tuner measures (StepTiming); None: its defaults for the pool's ranks.
        pool: the job's data-parallel ranks (runtime/ranks.py: RankPool); None: one rank.
        replan: after a drift alarm, a schedule for the new conditions (StepTuner's replan).
        start_s: the reports' clock at the start of training, s (training seconds count from it).
        expected_s: how long the job is expected to train, s (how long one trial may grow);
            None: not known (StepTuner's expected_run_s).
    """

    def __init__(
        self,
        card: Card,
        workload: Workload,
        *,
        budget: float = 0.01,
        strategy: str | Strategy = DEFAULT_STRATEGY,
        seed: int = 0,
        prior: Prior = NO_PRIOR,
        sites: list[int] | None = None,
        timing: StepTiming | None = None,
        pool: RankPool | None = None,
        replan: Callable[[StepReport], Schedule | None] | None = None,
        start_s: float = 0.0,
        expected_s: float | None = None,
    ) -> None:
        self.card = card
        self.workload = workload
        self.budget = budget
        self.strategy = strategy if isinstance(strategy, str) else strategy.name
        """The strategy's name."""
        self.seed = seed
        self.prior = prior
        self.tuner = StepTuner(
            workload,
            list(card.grid.pairs),
            switch_latency_s=card.switch_latency_s,
            energy_update_period_s=card.energy_update_period_s,
            budget=budget,
            strategy=strategy,
            seed=seed,
            prior=prior.schedule,
            boundaries=sites,
            replan=replan,
            timing=timing,
            pool=pool,
            proven_prior=prior.source == "store",  # measured in training by a job before
            expected_run_s=expected_s,
        )
        self.offset_s = start_s
        """The reports' clock at this run's training second 0, s."""
        self.phase_log: list[tuple[float, str]] = [(0.0, type(self.tuner.phase).__name__)]
        """(training s, phase entered), the first phase at 0."""
        self.schedule_log: list[tuple[float, Schedule]] = [(0.0, self.tuner.incumbent)]
        """(training s, the tuner's schedule from then on), at each change of it."""
        self.outcomes: list[dict[str, Any]] = []
        """Each finished trial and verification: kind, step, candidate, figures, adopted."""
        self.points: list[Point] = []
        """The run so far, every POINT_EVERY_S of training."""
        self._listeners: list[Callable[[TunerEvent | Point], None]] = []
        self._run: Window | None = None  # the run's steps and energy from its first reading
        self._next_point_s = POINT_EVERY_S
        self._last: StepReport | None = None
        self.tuner.subscribe(self._on_event)

    # --- feeding and following -------------------------------------------------------------
    def subscribe(self, listener: Callable[[TunerEvent | Point], None]) -> None:
        """Call `listener` with each of the tuner's events and each Point, in order."""
        self._listeners.append(listener)

    def unsubscribe(self, listener: Callable[[TunerEvent | Point], None]) -> None:
        """Stop calling `listener`."""
        self._listeners.remove(listener)

    def on_step_end(self, report: StepReport) -> Schedule:
        """One step's report in; the schedule of the next steps out (StepController)."""
        schedule = self.tuner.on_step_end(report)
        self._last = report
        now_s = self.training_s(report.end_s)
        if self.schedule_log[-1][1] != self.tuner.incumbent:
            self.schedule_log.append((now_s, self.tuner.incumbent))
        if report.counter_readings and self._run is None:
            self._run = Window(self.tuner.incumbent, math.inf, report.end_s)  # from this reading on
        if self._run is not None:
            # the run's energy per step as the tuner's windows measure stock's: the job's
            # stalls inside its steps (StallFilter) left out of both
            counted = self.tuner.report  # its groups change with the schedule: the step as one
            self._run.add(dataclasses.replace(counted, group_times_s=(counted.step_time_s,)))
        if now_s >= self._next_point_s:
            self._next_point_s = now_s + POINT_EVERY_S
            point = self.point()
            self.points.append(point)
            self._tell(point)
        return schedule

    def training_s(self, clock_s: float) -> float:
        """A time on the reports' clock (a report's end, an event's) as training seconds."""
        return clock_s - self.offset_s

    def restart(self, start_s: float, at_s: float) -> None:
        """The job goes on under this run from another clock (a job restarted on another card):
        the reports' clock reads start_s at training second at_s; counter readings start over."""
        self.offset_s = start_s - at_s
        self._run = None
        self._next_point_s = at_s + POINT_EVERY_S

    def _on_event(self, event: TunerEvent) -> None:
        if isinstance(event, PhaseEntered):
            if self.phase_log[-1][1] != event.phase:
                self.phase_log.append((self.training_s(event.end_s), event.phase))
        elif isinstance(event, TrialFinished):
            o = event.outcome
            self.outcomes.append(
                {
                    "kind": event.kind,
                    "step": event.step,
                    "candidate": schedule_pairs(event.candidate),
                    "energy_diff": o.energy_diff,
                    "energy_se": o.energy_se,
                    "time_diff": o.time_diff,
                    "time_se": o.time_se,
                    "blocks": o.blocks,
                    "window_s": event.window_s,
                    "abandoned": o.abandoned,
                    "undecided": o.undecided,
                    "adopted": event.adopted,
                    # what the tuner read it by: saving and slowdown with their stated errors
                    "judged": _judged(event.judgement),
                    # ... and at its first look (a fixed look: the yardstick of those errors)
                    "first_look": None
                    if event.first_look is None
                    else {"blocks": event.first_look_blocks, **_judged(event.first_look)},
                }
            )
        self._tell(event)

    def _tell(self, event: TunerEvent | Point) -> None:
        for listener in self._listeners:
            listener(event)

    # --- what the run measured -------------------------------------------------------------
    @property
    def seconds(self) -> float:
        """Training seconds reported so far."""
        return 0.0 if self._last is None else self.training_s(self._last.end_s)

    @property
    def converged_after_s(self) -> float | None:
        """Training seconds when the tuner first settled (None: not yet)."""
        return next((t for t, name in self.phase_log if name == "Settled"), None)

    @property
    def adoptions(self) -> list[Adoption]:
        return self.tuner.adoptions

    @property
    def alarms(self) -> list[Alarm]:
        return self.tuner.alarms

    def point(self) -> Point:
        """The run so far (a Point)."""
        t = self.tuner
        run_j = math.nan if self._run is None else self._run.energy_per_step_j
        # stock at the run's own wait for its host: chance differences of the job's waits
        # between the windows that measured stock and the run are not the clocks' saving
        stock_j = t.stock_energy_at_wait_j(math.nan if self._run is None else self._run.regular_wait_s)
        saving = 1.0 - run_j / stock_j if math.isfinite(stock_j) and math.isfinite(run_j) else math.nan
        measured = math.isfinite(t.stock_step_s) or t.account.before_steps > 0
        last = self._last
        return Point(
            step=t.account.steps,
            end_s=self.seconds,
            phase=type(t.phase).__name__,
            slowdown=t.account.slowdown() if measured else math.nan,
            energy_saving=saving,
            plan_energy_saving=t.plan_energy_saving(),
            budget_left_s=t.account.slack_s(),
            adoptions=len(t.adoptions),
            step_time_s=math.nan if last is None else last.step_time_s,
            temperature_c=math.nan if last is None else last.temperature_c,
            time_noise_per_root_s=t.time_sd_per_root_s if t.stock is not None else math.nan,
            energy_noise_per_root_s=t.energy_sd_per_root_s,
        )

    def job_noise(self) -> dict[str, Any]:
        """What the job allows, as measured so far: its noise (per root second, from pairs of
        windows of one schedule), the budget's 95% margin on stock, the smallest differences a
        trial of RESOLVE_TRIAL_S resolves at three standard errors, and the expected training
        time to a plan (None where not measured yet)."""
        t = self.tuner
        measured = t.stock is not None
        energy_diff, time_diff = t.resolvable(RESOLVE_TRIAL_S) if measured else (math.nan, math.nan)
        return {
            "time_cv_per_root_s": _or_none(t.time_sd_per_root_s) if measured else None,
            "energy_cv_per_root_s": _or_none(t.energy_sd_per_root_s),
            "pairs_of_windows": t.noise.samples,
            "stock_margin_95": _or_none(t.stock_margin),
            "resolvable": {
                "trial_s": RESOLVE_TRIAL_S,
                "z": ADOPT_Z,
                "energy_diff": _or_none(energy_diff),
                "time_diff": _or_none(time_diff),
            },
            "budget_trial_s": _or_none(t.budget_trial_s()),
            "expected_time_to_plan_s": t.expected_time_to_plan_s(),
        }

    def stock_step_s(self) -> float | None:
        """Stock's step time as the reference measured it, s (None: not yet measured)."""
        t = self.tuner
        return t.stock.step_s if t.stock is not None else None

    def plan(
        self,
        label: str,
        figures: Callable[[Schedule], tuple[list[float], list[float], float, float]] | None = None,
    ) -> Plan | None:
        """The adopted schedule as a Plan (None before stock is measured). Its expected figures:
        `figures(schedule)` -> (group times s, group energies J, stock time s, stock energy J)
        where the card's truth is known (a simulated card's noiseless figures:
        schedule_group_figures); else the tuner's measurements, each group's share of the step
        its stock time's."""
        t = self.tuner
        schedule = t.incumbent
        starts = [s for s, _ in schedule.groups]
        ends = [*starts[1:], len(self.workload)]
        if figures is not None:
            group_t, group_e, ref_t, ref_e = figures(schedule)
        else:
            stock_s = self.stock_step_s()
            if stock_s is None or not math.isfinite(t.stock_energy_j):
                return None
            shares = t.group_times_s if len(t.group_times_s) == len(starts) else [1.0] * len(starts)
            total = sum(shares) or 1.0
            group_t = [t.incumbent_step_s * w / total for w in shares]
            group_e = [t.incumbent_energy_j * w / total for w in shares]
            ref_t, ref_e = stock_s, t.stock_energy_j
        spans = [(s, e, p, gt, ge) for (s, p), e, gt, ge in zip(schedule.groups, ends, group_t, group_e)]
        return Plan.from_groups(
            gpu_name=self.card.name,
            grid=self.card.grid,
            workload=self.workload,
            budget=self.budget,
            groups=spans,
            reference_time_s=ref_t,
            reference_energy_j=ref_e,
            source=self.card.source,
            strategy=label,
            measurements=t.trials,
        )

    def summary(self) -> dict[str, Any]:
        """What the tuner measured, JSON-ready (every caller's report starts from it)."""
        t = self.tuner
        last = self.points[-1] if self.points else self.point()
        return {
            "device": self.card.name,
            "workload": self.workload.name,
            "budget": self.budget,
            "strategy": self.strategy,
            "source": self.card.source,
            "prior": {"source": self.prior.source, "note": self.prior.note},
            "steps": t.account.steps,
            "phase": type(t.phase).__name__,
            "phases": list(t.phases),
            "stock_step_s": self.stock_step_s(),
            "stock_energy_per_step_j": t.stock_energy_j if math.isfinite(t.stock_energy_j) else None,
            "window_energy_cv": t.window_sd if math.isfinite(t.window_sd) else None,
            "stock_sm_clock_mhz": _or_none(t.stock_clock_mhz),
            "trial_window_s": t.timing.trial_window_s,
            "step_time_cv_per_root_s": t.time_sd_per_root_s,
            "job_noise": self.job_noise(),
            "trials": t.trials,
            "plan_energy_saving": t.plan_energy_saving(),
            "slowdown": t.account.slowdown() if math.isfinite(t.stock_step_s) else None,
            "run": {"energy_saving": _finite(last.energy_saving), "slowdown": _finite(last.slowdown)},
            "max_cumulative_slowdown": max(
                (p.slowdown for p in self.points if math.isfinite(p.slowdown)), default=0.0
            ),
            "converged_after_s": self.converged_after_s,
            "adopted": len(t.adoptions),
            "adoptions": [
                {
                    "step": a.step,
                    "end_s": self.training_s(a.end_s),
                    "schedule": schedule_pairs(a.schedule),
                    "saving": a.saving,
                    "saving_se": a.saving_se,
                    "slowdown": a.slowdown,
                }
                for a in t.adoptions
            ],
            "plan": schedule_pairs(t.incumbent),
            "outcomes": list(self.outcomes),
            "alarms": [
                {
                    "step": a.step,
                    "end_s": self.training_s(a.end_s),
                    "reasons": list(a.reasons),
                    "held": a.held,
                }
                for a in t.alarms
            ],
        }


def _judged(judgement: Judgement | None) -> dict[str, float] | None:
    """A Judgement's saving and slowdown with their stated errors, and the time ratio the time
    error is of (None: none)."""
    if judgement is None:
        return None
    return {
        "saving": judgement.saving,
        "saving_se": judgement.saving_se,
        "slowdown": judgement.slowdown,
        "time_se": judgement.time_se,
        "time_diff": judgement.time_diff,
    }


def schedule_pairs(schedule: Schedule) -> list[list[Any]]:
    """A schedule as JSON: [[first kernel, [core MHz, mem MHz] or None], ...]."""
    return [[s, None if p is None else p.as_list()] for s, p in schedule.groups]


def _finite(x: float) -> float:
    return float(x) if np.isfinite(x) else 0.0


def _or_none(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def schedule_group_figures(
    device: RunnableDevice, workload: Workload, schedule: Schedule
) -> tuple[list[float], list[float], float, float]:
    """Noiseless time and energy per step of each group of a schedule as the card runs it, and
    of the stock step: (group times s, group energies J, stock time s, stock energy J). The
    totals are schedule_figures'; a group's share is its kernels' share at the pair in effect."""
    ref_t, ref_e = device.expected_step([(k, None, k.launches) for k in workload.kernels])
    items = schedule_items(device, workload, schedule)
    total_t, total_e = device.expected_step(items)
    cells = np.array([device.expected(k, pair) for k, pair, _ in items]) * [[n] for _, _, n in items]
    starts = [s for s, _ in schedule.groups]
    ends = [*starts[1:], len(workload)]
    scale_t, scale_e = total_t / cells[:, 0].sum(), total_e / cells[:, 1].sum()
    group_t = [float(cells[s:e, 0].sum() * scale_t) for s, e in zip(starts, ends)]
    group_e = [float(cells[s:e, 1].sum() * scale_e) for s, e in zip(starts, ends)]
    return group_t, group_e, float(ref_t), float(ref_e)


# --- the yardstick -----------------------------------------------------------------------------
@dataclass
class Oracle:
    """The best this card can do within the budget, from noiseless per-kernel data (a sweep of
    a noiseless copy of the card): the realisable schedule (switch latency included) and the
    ideal per-kernel plan (switches ignored), both held to the budget in the step."""

    schedule: Schedule
    energy_saving: float
    slowdown: float
    ideal_energy_saving: float
    ideal_slowdown: float


def oracle(noiseless: ModelDevice, workload: Workload, budget: float) -> Oracle:
    """The Oracle of a noiseless copy of the card, both plans held to the budget in the step
    (sweep.held_to_budget: planned from isolated measurements, a plan can run over it, as the
    ideal per-kernel plan of the 3080 Ti layer did by 0.01 point at the step's temperature)."""
    obs = run_sweep(noiseless, workload)
    best = held_realisable(noiseless, obs, budget).plan
    ideal = held_plan(noiseless, obs, obs.kernel_level_choice, budget).plan
    return Oracle(best.schedule, best.energy_saving, best.slowdown, ideal.energy_saving, ideal.slowdown)


def reached_after(
    history: Sequence[tuple[float, Schedule]], saving_of: Callable[[Schedule], float], level: float
) -> float | None:
    """The time from which every schedule of the history (time, schedule from then on) saves
    at least `level` (saving_of: a schedule's true saving, a fraction): "reached and stayed".
    None: the last does not."""
    reached = None
    for start_s, schedule in history:
        good = saving_of(schedule) >= level - 1e-12
        reached = (reached if reached is not None else start_s) if good else None
    return reached


def largest_cumulative_slowdown(
    history: Sequence[tuple[float, Schedule]],
    end_s: float,
    slowdown_of: Callable[[Schedule], float],
    from_s: float = 0.0,
) -> float:
    """The largest slowdown of the run so far against stock at the end of each schedule of the
    history (time, schedule from then on; the run ends at end_s), slowdown_of giving a
    schedule's true slowdown (a fraction): the training seconds so far over the seconds stock
    would have taken for the same steps, less 1, read at each schedule's end from from_s on
    (a fraction; 0.0 when none ends there)."""
    largest, run_s, stock_s = 0.0, 0.0, 0.0
    ends = [s for s, _ in history[1:]] + [end_s]
    for (start_s, schedule), stop_s in zip(history, ends, strict=True):
        span_s = max(0.0, min(stop_s, end_s) - start_s)
        run_s += span_s
        stock_s += span_s / (1.0 + slowdown_of(schedule))
        if stop_s >= from_s and stock_s > 0.0:
            largest = max(largest, run_s / stock_s - 1.0)
    return largest


def reached_after_s(
    adoptions: Sequence[Adoption], saving_of: Callable[[Schedule], float], level: float
) -> float | None:
    """reached_after over the adoptions (the tuner's clock, s)."""
    return reached_after([(a.end_s, a.schedule) for a in adoptions], saving_of, level)
