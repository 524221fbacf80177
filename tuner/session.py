"""One tuning run on a simulated or replayed card: the StepTuner answering a SimulatedJob's steps.

- `TuneSession`: a job (runtime/steps.py: SimulatedJob) and its tuner (step_tuner.py:
  StepTuner); `run_until(end_s, on_point)` trains to a training second, the clocks back to
  stock when it ends (by an exception or Ctrl-C too); `points`, `phase_log`,
  `converged_after_s` what it went through; `restart_on` the job on another card.
- `Point`: the run so far as the tuner measured it, every POINT_EVERY_S of training (phase,
  cumulative slowdown against stock measured in training, energy saving by the counter).
- `choose_prior`: what the tuner starts from: the plan store's plan for this card, grid and
  workload ("store"), another card's plan carried to this card's clocks ("transferred"), the
  card's own per-kernel model ("model", simulated cards), or nothing ("none").
- `oracle`: the realisable oracle and the ideal per-kernel plan, from a noiseless sweep.
- `reached_after_s`: when the adopted schedule first reached a saving and stayed there (the
  one measure of "95% of the oracle" the experiments and the report use).

The tuner never sees the device: only StepReports. What a figure was measured on (simulated
or replayed) is the device's `source`. Design: docs/design-step-tuner.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from kdvfs.policies.base import Strategy
from kdvfs.runtime.model_device import ModelDevice
from kdvfs.runtime.schedule import Schedule
from kdvfs.runtime.steps import SimulatedJob, StepReport
from kdvfs.runtime.types import KdvfsError, Workload
from kdvfs.tuner.plan import plan_schedule
from kdvfs.tuner.plan_store import PlanStore
from kdvfs.tuner.step_priors import model_plan, switch_sites
from kdvfs.tuner.step_tuner import Adoption, StepTuner
from kdvfs.tuner.sweep import held_plan, held_realisable, run_sweep
from kdvfs.tuner.transfer import carry_schedule

#: Training between two reported points of a run; s.
POINT_EVERY_S = 1.0
#: A card whose clock switch lands within this is switched at every kernel by "auto" sites; s.
FAST_SWITCH_S = 1e-3

PriorSource = Literal["store", "transferred", "measured", "model", "none"]
Sites = Literal["auto", "modules", "kernels"]


def job_sites(workload: Workload, switch_latency_s: float, sites: Sites = "auto") -> list[int]:
    """Kernel indices where the job switches clocks: "modules", the step, each pass and each
    submodule (where a PyTorch job's hooks sit: step_priors.switch_sites); "kernels", every
    kernel (a fast-switch card's hooks); "auto", kernels on a card that switches within
    FAST_SWITCH_S, else modules."""
    if sites == "kernels" or (sites == "auto" and switch_latency_s <= FAST_SWITCH_S):
        return list(range(len(workload)))
    return switch_sites(workload)


@dataclass(frozen=True)
class Point:
    """The run so far, as the tuner measured it.

    Attributes:
        step: steps run.
        end_s: training seconds.
        phase: the tuner's phase (Reference, Exploring, Verifying, Settled, Retuning).
        slowdown: the run's cumulative slowdown against stock measured in training (the budget
            account), a fraction; NaN before stock was measured.
        energy_saving: the run's energy so far (the counter) against stock's step energy
            measured in training times the steps, a fraction; NaN before stock was measured.
        budget_left_s: seconds the run may still overspend.
        adoptions: candidates adopted so far.
    """

    step: int
    end_s: float
    phase: str
    slowdown: float
    energy_saving: float
    budget_left_s: float
    adoptions: int


@dataclass(frozen=True)
class Prior:
    """What the tuner starts from: a schedule (None: nothing), where it came from, a note."""

    schedule: Schedule | None
    source: PriorSource
    note: str | None = None


def choose_prior(
    device: ModelDevice,
    workload: Workload,
    budget: float,
    *,
    store: PlanStore | None,
    model: ModelDevice | None,
    sites: list[int] | None = None,
    measured: Schedule | None = None,
) -> Prior:
    """The stored plan for this GPU, grid and workload; else another GPU's plan for the workload
    carried to this card's clocks; else a plan from this card's measured table (`measured`:
    step_priors.sweep_prior of a real card's sweep); else the plan of the card's own model
    (`model`: a noiseless copy of a simulated card); else none. A stored plan that is refused
    (bad file) is said, and skipped."""
    note = None
    if store is not None:
        try:
            plan = store.get(device.name, device.grid, workload.signature)
        except KdvfsError as exc:
            plan, note = None, f"stored plan refused: {exc}"
        if plan is not None:
            return Prior(plan_schedule(plan), "store", f"the stored plan of {plan.created}")
        note = note or "no stored plan for this GPU, clock grid and workload"
        other = store.newest_for_other_gpu(device.name, workload.signature)
        if other is not None:
            carried = carry_schedule(plan_schedule(other), other.grid, device.grid)
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
        return Prior(model_plan(model, workload, budget, sites), "model", note)
    return Prior(None, "none", note)


@dataclass
class Oracle:
    """The best this card can do within the budget, from noiseless per-kernel data (a sweep of
    a noiseless copy of the card): the realisable schedule (switch latency included) and the
    ideal per-kernel plan (switches ignored)."""

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


def reached_after_s(
    adoptions: Sequence[Adoption], saving_of: Callable[[Schedule], float], level: float
) -> float | None:
    """The adoption time (the tuner's clock, s) from which every adopted schedule saves at
    least `level` (saving_of: a schedule's true saving, a fraction); None: the last does not."""
    reached = None
    for adoption in adoptions:
        good = saving_of(adoption.schedule) >= level - 1e-12
        reached = (reached if reached is not None else adoption.end_s) if good else None
    return reached


@dataclass
class TuneSession:
    """A simulated training job tuned by the step-driven tuner.

    Args:
        device: the card (SimulatedDevice or ReplayDevice).
        workload: the kernels of one training step.
        strategy: the search strategy (kdvfs.policies.registry.STRATEGIES).
        budget: the largest cumulative slowdown against stock, a fraction (0.01: 1%).
        seed: seeds the strategy.
        prior: what the tuner starts from (choose_prior).
        dry_run: record the clock requests and apply none (the null test).
        model: a noiseless copy of the card (a simulated card's own model): after a drift
            alarm the tuner's plan for the new conditions is re-planned on it, at the power
            limit the card then reports; None: the tuner verifies the plan before instead.
        sites: kernel indices where the job can switch clocks (job_sites); None: the step
            and each pass.
        policy: the search strategy itself (a ServiceStrategy: the service's, service/
            client.py); None: the tuner makes `strategy` itself.
    """

    device: ModelDevice
    workload: Workload
    strategy: str = "botorch"
    budget: float = 0.01
    seed: int = 0
    prior: Prior = field(default_factory=lambda: Prior(None, "none"))
    dry_run: bool = False
    model: ModelDevice | None = None
    sites: list[int] | None = None
    policy: Strategy | None = None
    points: list[Point] = field(default_factory=list)
    phase_log: list[tuple[float, str]] = field(default_factory=list)
    """(training s, phase entered), the first phase at 0."""
    plan_log: list[tuple[float, Schedule]] = field(default_factory=list)
    """(training s, the tuner's plan from then on), at each change of plan."""

    def __post_init__(self) -> None:
        self.tuner = self._make_tuner()
        self.job = SimulatedJob(self.device, self.workload, dry_run=self.dry_run)
        self.schedule = self.tuner.incumbent
        self.phase_log.append((0.0, type(self.tuner.phase).__name__))
        self.plan_log.append((0.0, self.tuner.incumbent))
        self._start_j: float | None = None  # the first counter reading, J
        self._last_j = math.nan
        self._steps_counted = 0  # steps between the first and the last counter reading
        self._next_point_s = POINT_EVERY_S
        self._offset_s = self.device.now_s()
        self._steps_from = 0

    def _make_tuner(self) -> StepTuner:
        return StepTuner(
            self.workload,
            self.device.grid.pairs,
            switch_latency_s=self.device.switch_latency_s,
            energy_update_period_s=self.device.energy_update_period_s,
            budget=self.budget,
            strategy=self.strategy,
            seed=self.seed,
            prior=self.prior.schedule,
            boundaries=self.sites,
            replan=self._replan if self.model is not None else None,
            policy=self.policy,
            proven_prior=self.prior.source == "store",  # measured in training by a job before
        )

    def _replan(self, report: StepReport) -> Schedule | None:
        """The card's model re-planned for the power limit the report shows (and the job's
        workload now)."""
        model = self.model
        if math.isfinite(report.power_limit_w) and hasattr(model, "set_power_cap_w"):
            model.set_power_cap_w(report.power_limit_w)
        return model_plan(model, self.workload, self.budget, self.sites)

    @property
    def seconds(self) -> float:
        """Training seconds of this job so far."""
        return self.device.now_s() - self._offset_s

    @property
    def converged_after_s(self) -> float | None:
        """Training seconds when the tuner first settled (None: not yet)."""
        return next((t for t, name in self.phase_log if name == "Settled"), None)

    def run_until(self, end_s: float, on_point: Callable[[Point], None] | None = None) -> None:
        """Train until end_s training seconds; the clocks back to stock when it ends, however."""
        try:
            while self.seconds < end_s:
                report = self.job.step(self.schedule)
                self.schedule = self.tuner.on_step_end(report)
                self._follow(report, on_point)
        finally:
            self.job.reset()

    def training_s(self, device_s: float) -> float:
        """A device time (a report's, an alarm's) as training seconds of this job."""
        return device_s - self._offset_s

    def change_workload(self, workload: Workload) -> None:
        """The job's steps run these kernels from now on (a drift scenario)."""
        self.workload = workload
        self.job.change_workload(workload)

    def restart_on(
        self,
        device: ModelDevice,
        prior: Prior,
        model: ModelDevice | None = None,
        sites: list[int] | None = None,
    ) -> None:
        """The job starts again on another card (a new tuner, from `prior`; `model` and `sites`:
        the new card's, as the constructor's); the points and phases go on from here."""
        self.device, self.prior, self.model, self.sites = device, prior, model, sites
        self.tuner = self._make_tuner()
        self.job = SimulatedJob(device, self.workload, dry_run=self.dry_run)
        self.schedule = self.tuner.incumbent
        self._offset_s = device.now_s() - (self.points[-1].end_s if self.points else 0.0)
        self._start_j, self._steps_counted = None, 0
        self._next_point_s = self.seconds + POINT_EVERY_S
        self.phase_log.append((self.seconds, type(self.tuner.phase).__name__))
        self.plan_log.append((self.seconds, self.tuner.incumbent))

    def point(self) -> Point:
        """The run so far (a Point)."""
        t = self.tuner
        stock_j = t.stock_energy_j
        counted = self._start_j is not None and self._steps_counted > 0 and math.isfinite(stock_j)
        saving = (
            1.0 - (self._last_j - self._start_j) / (stock_j * self._steps_counted) if counted else math.nan
        )
        measured = math.isfinite(t.stock_step_s) or t.account.before_steps > 0
        return Point(
            step=t.account.steps,
            end_s=self.seconds,
            phase=type(t.phase).__name__,
            slowdown=t.account.slowdown() if measured else math.nan,
            energy_saving=saving,
            budget_left_s=t.account.slack_s(),
            adoptions=len(t.adoptions),
        )

    def _follow(self, report: StepReport, on_point: Callable[[Point], None] | None) -> None:
        name = type(self.tuner.phase).__name__
        if self.phase_log[-1][1] != name:
            self.phase_log.append((self.seconds, name))
        if self.plan_log[-1][1] != self.tuner.incumbent:
            self.plan_log.append((self.seconds, self.tuner.incumbent))
        if report.counter_readings:
            value_j = report.counter_readings[-1][1]
            if self._start_j is None:
                self._start_j, self._steps_from = value_j, self.tuner.account.steps
            self._last_j, self._steps_counted = value_j, self.tuner.account.steps - self._steps_from
        if self.seconds >= self._next_point_s:
            self._next_point_s = self.seconds + POINT_EVERY_S
            point = self.point()
            self.points.append(point)
            if on_point is not None:
                on_point(point)
