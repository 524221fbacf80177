"""A simulated training job fed to one tuning run (tuner/run.py): what `kdvfs tune`, the
scenarios, the peers' kdvfs row, the service's jobs and the experiments train.

- `TuneSession`: a SimulatedJob (runtime/steps.py) on a simulated or replayed card, each step's
  report (with `aggregate_steps`, each stretch's up to a counter update:
  SimulatedJob.step_until_update) fed to a TuningRun and its answer run next; `run_until(end_s)` trains to a training
  second, the clocks back to stock when it ends (by an exception or Ctrl-C too);
  `restart_on` the job on another card (a new run from a new prior, the same training clock);
  `plan(label)` the adopted schedule as a Plan with the card's noiseless figures.
- What it went through is the run's (`run.points`, `run.phase_log`, `run.schedule_log`,
  `run.outcomes`); the properties below read them.

The tuner never sees the device: only StepReports. What a figure was measured on (simulated
or replayed) is the device's `source`. Design: docs/design-step-tuner.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from kdvfs.policies.base import Strategy
from kdvfs.runtime.job_noise import JobNoise
from kdvfs.runtime.model_device import ModelDevice
from kdvfs.runtime.schedule import Schedule
from kdvfs.runtime.steps import SimulatedJob, StepReport
from kdvfs.runtime.types import Workload
from kdvfs.tuner.plan import Plan
from kdvfs.tuner.run import NO_PRIOR, Card, Point, Prior, TuningRun, schedule_group_figures
from kdvfs.tuner.step_priors import model_schedule
from kdvfs.tuner.step_tuner import StepTuner

#: How far a re-plan may move the model's inlet air to meet the reported temperature, either
#: way; C.
REPLAN_AMBIENT_SPAN_C = 60.0
#: Bisection rounds over that span (to about 0.01 C); rounds.
REPLAN_AMBIENT_ROUNDS = 14


@dataclass
class TuneSession:
    """A simulated training job tuned by one TuningRun.

    Args:
        device: the card (SimulatedDevice or ReplayDevice).
        workload: the kernels of one training step.
        strategy: the search strategy: a name (kdvfs.policies.registry) or the strategy itself
            (a ServiceStrategy: the service's, service/client.py).
        budget: the largest cumulative slowdown against stock, a fraction (0.01: 1%).
        seed: seeds the strategy.
        prior: what the tuner starts from (choose_prior).
        dry_run: record the clock requests and apply none (the null test).
        model: a noiseless copy of the card (a simulated card's own model): after a drift
            alarm the tuner's plan for the new conditions is re-planned on it, at the power
            limit the card then reports; None: the tuner verifies the plan before instead.
        sites: kernel indices where the job can switch clocks (job_sites); None: the step
            and each pass.
        job_noise: a recorded job's waits added to each step (runtime/job_noise.py; seeded
            by `seed`); None: the steps are the kernels alone.
        aggregate_steps: run and report a stretch of steps at once, up to the step after
            which the energy counter updates (SimulatedJob.step_until_update: the same
            statistics, far less CPU for long runs); False: one report per step, each step run
            kernel by kernel.
    """

    device: ModelDevice
    workload: Workload
    strategy: str | Strategy = "botorch"
    budget: float = 0.01
    seed: int = 0
    prior: Prior = field(default_factory=lambda: NO_PRIOR)
    dry_run: bool = False
    model: ModelDevice | None = None
    sites: list[int] | None = None
    job_noise: JobNoise | None = None
    aggregate_steps: bool = False

    def __post_init__(self) -> None:
        self.run = self._new_run(self.device.now_s(), 0.0)
        self.card_since = 0
        """Where this card's schedules begin in the run's schedule_log (after restart_on: the new card's)."""
        self.job = self._new_job(self.device)
        self.schedule = self.run.tuner.incumbent

    def _new_job(self, device: ModelDevice) -> SimulatedJob:
        return SimulatedJob(
            device, self.workload, dry_run=self.dry_run, job_noise=self.job_noise, job_noise_seed=self.seed
        )

    def _new_run(self, start_s: float, at_s: float) -> TuningRun:
        run = TuningRun(
            Card.of(self.device),
            self.workload,
            budget=self.budget,
            strategy=self.strategy,
            seed=self.seed,
            prior=self.prior,
            sites=self.sites,
            replan=self._replan if self.model is not None else None,
            start_s=start_s - at_s,
        )
        return run

    def _replan(self, report: StepReport) -> Schedule | None:
        """The card's model re-planned for the conditions the report shows, the card settled at
        stock: its power limit, and its temperature (the model's inlet air moved until the
        model's stock steady temperature is the report's), for the job's workload now."""
        model = self.model
        if math.isfinite(report.power_limit_w) and hasattr(model, "set_power_cap_w"):
            model.set_power_cap_w(report.power_limit_w)
        if math.isfinite(report.temperature_c) and hasattr(model, "set_ambient_c"):
            # bisected: the steady temperature rises with the inlet air, but not in proportion
            # (the leak grows with the heat; at a throttle step the card's power drops)
            stock = [(k, None, k.launches) for k in self.workload.kernels]
            lo_c, hi_c = model.ambient_c - REPLAN_AMBIENT_SPAN_C, model.ambient_c + REPLAN_AMBIENT_SPAN_C
            for _ in range(REPLAN_AMBIENT_ROUNDS):
                model.set_ambient_c((lo_c + hi_c) / 2.0)
                if model.steady_temperature_c(stock) < report.temperature_c:
                    lo_c = model.ambient_c
                else:
                    hi_c = model.ambient_c
        return model_schedule(model, self.workload, self.budget, self.sites)

    # --- what the run went through -------------------------------------------------------------
    @property
    def tuner(self) -> StepTuner:
        """The run's tuner (read it; feed the run)."""
        return self.run.tuner

    @property
    def strategy_name(self) -> str:
        return self.run.strategy

    @property
    def points(self) -> list[Point]:
        return self.run.points

    @property
    def phase_log(self) -> list[tuple[float, str]]:
        return self.run.phase_log

    @property
    def schedule_log(self) -> list[tuple[float, Schedule]]:
        return self.run.schedule_log

    @property
    def converged_after_s(self) -> float | None:
        """Training seconds when the tuner first settled (None: not yet)."""
        return self.run.converged_after_s

    @property
    def seconds(self) -> float:
        """Training seconds of this job so far."""
        return self.run.training_s(self.device.now_s())

    def training_s(self, device_s: float) -> float:
        """A device time (a report's, an alarm's) as training seconds of this job."""
        return self.run.training_s(device_s)

    def point(self) -> Point:
        """The run so far (a Point)."""
        return self.run.point()

    def plan(self, label: str) -> Plan:
        """The adopted schedule as a Plan, its figures the card's noiseless ones."""
        return self.run.plan(label, lambda s: schedule_group_figures(self.device, self.workload, s))

    # --- training ------------------------------------------------------------------------------
    def run_until(
        self,
        end_s: float,
        on_point: Callable[[Point], None] | None = None,
        on_report: Callable[[StepReport], None] | None = None,
    ) -> None:
        """Train until end_s training seconds; the clocks back to stock when it ends, however.
        on_point: called with each Point of the run (every POINT_EVERY_S of training);
        on_report: with each step's report, before the run answers it."""
        listener = None
        if on_point is not None:

            def listener(event) -> None:
                if isinstance(event, Point):
                    on_point(event)

            self.run.subscribe(listener)
        if self.tuner.expected_run_s is None:
            self.tuner.expected_run_s = end_s  # how long one trial may grow: a share of the run
        try:
            while self.seconds < end_s:
                report = (
                    self.job.step_until_update(self.schedule)
                    if self.aggregate_steps
                    else self.job.step(self.schedule)
                )
                if on_report is not None:
                    on_report(report)
                self.schedule = self.run.on_step_end(report)
        finally:
            if listener is not None:
                self.run.unsubscribe(listener)
            self.job.reset()

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
        """The job starts again on another card (a new run, from `prior`; `model` and `sites`:
        the new card's, as the constructor's); the training clock, points and phases go on."""
        at_s = self.run.points[-1].end_s if self.run.points else 0.0
        before = self.run
        self.device, self.prior, self.model, self.sites = device, prior, model, sites
        self.run = self._new_run(device.now_s(), at_s)
        self.run.points[:0] = before.points
        self.run.phase_log[:] = [*before.phase_log, (at_s, type(self.run.tuner.phase).__name__)]
        self.run.schedule_log[:] = [*before.schedule_log, (at_s, self.run.tuner.incumbent)]
        self.card_since = len(before.schedule_log)  # this card's first schedule in schedule_log
        self.run.outcomes[:0] = before.outcomes
        self.run.restart(device.now_s(), at_s)
        self.job = self._new_job(device)
        self.schedule = self.run.tuner.incumbent
