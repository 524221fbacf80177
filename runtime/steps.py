"""Training steps as the training loop reports them, and a simulated job that produces them.

- `StepReport`: what one step (or `steps` consecutive steps under one schedule) told the
  controller: its time and each group's time (CUDA events on a real card; means per step),
  the energy-counter updates observed since the last report (each as the host time of the
  update and the counter's joules), temperature, throttle reasons and the enforced power
  limit. It crosses from runtime/ to tuner/.
- `StepController`: the Protocol of whoever answers a report with the next steps' Schedule
  (tuner/step_tuner.py's StepTuner).
- `SimulatedJob`: steps of a Workload on a ModelDevice through StepRunner under the
  schedule it is given, one StepReport per step (`step`, or `run_kernels` then `end_step`
  for ranks that wait for one another); `run()` is the training loop (clocks back to
  stock when it ends, by an exception too); `change_workload` swaps the step's kernels mid-run
  (a drift scenario). It decides nothing. `dry_run` records the clock
  requests and applies none, as a real card in dry run does (the null test). `job_noise`
  (runtime/job_noise.py) adds a recorded job's host-side waits: the card idles after each
  step's kernels for the step's sampled wait, of which the report's `wait_s` is the part the
  job sees. `step_until_update` runs a stretch of steps at
  once (each step's noiseless costs cached per pattern, its noise, wait and counter reading
  drawn as step by step) and reports them in one StepReport that ends at the step where the
  next counter update is observed (at most MAX_REPORT_S of training).

The counter is read after every step, as a poller would, and its updates since the last read
are reported (each at the simulated time of the change; several after a long wait or step). Design: docs/design-step-tuner.md.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from kdvfs.runtime.device import optional_sensor
from kdvfs.runtime.job_noise import JobNoise, JobNoiseSampler
from kdvfs.runtime.model_device import ModelDevice
from kdvfs.runtime.schedule import Schedule, StepRunner
from kdvfs.runtime.types import KdvfsError, Workload


@dataclass(frozen=True)
class StepReport:
    """One training step as the loop measured it, or `steps` consecutive steps under one
    schedule (a stretch simulated at once, SimulatedJob.step_until_update).

    Attributes:
        step: the (last covered) step's index, from 0.
        end_s: host time at the (last) step's end, s.
        step_time_s: the step's time (the mean step time of the steps covered), s.
        group_times_s: each group's time under the schedule the step ran (the mean per step),
            s (in its order).
        counter_readings: energy-counter updates observed since the last report, as
            (host time of the update in s, counter in J), oldest first.
        temperature_c: the card's temperature at the (last) step's end, C.
        throttle_reasons: the card's throttle reasons at the (last) step's end.
        power_limit_w: the enforced power limit, W.
        steps: consecutive steps the report stands for (count, >= 1).
        wait_s: the part of step_time_s the GPU waited for the job's host after its kernels
            (a late batch, an evaluation, a checkpoint: the job's own, which the clocks do not
            set; the mean per step), s; 0 where the job cannot tell (then all of the step
            counts as the clocks').
        stall_s: the part of wait_s that was a stall inside the job's step (an evaluation, a
            checkpoint: runtime/trials.py's StallFilter moves it there; its energy is then
            left out of a window's, as its time is), s.
        sm_clock_mhz: the card's SM clock as last read (a simulated card: its launches' clocks
            averaged over their last 50 ms), MHz; NaN where the card does not say.
    """

    step: int
    end_s: float
    step_time_s: float
    group_times_s: tuple[float, ...]
    counter_readings: tuple[tuple[float, float], ...]
    temperature_c: float
    throttle_reasons: frozenset[str]
    power_limit_w: float
    steps: int = 1
    wait_s: float = 0.0
    stall_s: float = 0.0
    sm_clock_mhz: float = math.nan


class StepController(Protocol):
    """Answers each step's report with the schedule of the next steps."""

    def on_step_end(self, report: StepReport) -> Schedule: ...


@dataclass(frozen=True)
class RanKernels:
    """A simulated step's kernels run, its report not made yet (SimulatedJob.run_kernels).

    Attributes:
        schedule: the schedule the step was asked to run.
        kernel_times_s: each kernel's time, s (in the workload's order).
        step_s: the kernels' time, s.
    """

    schedule: Schedule
    kernel_times_s: np.ndarray
    step_s: float


MAX_REPORT_S = 0.25
"""Longest stretch of training one report of step_until_update covers when no counter update
ends it sooner, s (a step longer than this is reported alone)."""


class SimulatedJob:
    """A training job on a simulated or replayed device, step by step.

    Args:
        device: runs the kernels (a SimulatedDevice or ReplayDevice).
        workload: the kernels of one training step, in order.
        dry_run: record the clock requests (`requests`) but never apply them: every step runs
            at stock clocks.
        job_noise: a recorded job's waits (runtime/job_noise.py): after each step's kernels
            the card idles for the step's sampled wait, at the step's end because a recorded
            step runs from one step start to the next, so the GPU's wait for the host (a late
            batch, a checkpoint) closes the step it follows; the report's `wait_s` is the
            part the job sees (JobNoise.seen_wait_share), the rest counts in its busy time;
            None: the steps are the kernels alone.
        job_noise_seed: seeds the job noise's draws.
    """

    def __init__(
        self,
        device: ModelDevice,
        workload: Workload,
        *,
        dry_run: bool = False,
        job_noise: JobNoise | None = None,
        job_noise_seed: int = 0,
    ) -> None:
        self.device = device
        self.workload = workload
        self.dry_run = dry_run
        self.job_noise = job_noise
        self._job_noise = JobNoiseSampler(job_noise, job_noise_seed) if job_noise is not None else None
        self.runner = StepRunner(device, workload)
        self.requests: list[tuple[int, Schedule]] = []
        """(step index, schedule) of every change of the requested schedule, applied or not."""
        self.steps = 0
        self._schedule = Schedule.stock()
        self._counter_j = device.energy_j()
        self._counter_s = device.now_s()  # time of the latest counter update read, s

    @property
    def seconds(self) -> float:
        """Device seconds so far."""
        return self.device.now_s()

    def step(self, schedule: Schedule) -> StepReport:
        """Run one step under the schedule (stock in dry run) and report it."""
        return self.end_step(self.run_kernels(schedule))

    def run_kernels(self, schedule: Schedule) -> RanKernels:
        """A step's kernels under the schedule (stock in dry run), not reported yet."""
        if schedule != self._schedule or not self.requests:
            self.requests.append((self.steps, schedule))
            self._schedule = schedule
        applied = Schedule.stock() if self.dry_run else schedule
        kernel_times_s, step_s = self.runner.run(applied, 1)
        return RanKernels(schedule, kernel_times_s, step_s)

    def end_step(self, ran: RanKernels, wait_s: float = 0.0) -> StepReport:
        """The step's report, after the card idled wait_s (a data-parallel rank waiting at the
        step's gradient all-reduce for the slowest rank; the wait is the last group's, s) and
        the job noise's wait for this step, if any (the last group's too)."""
        job_wait_s = 0.0  # the job noise's wait the job sees after the step (all of it idles)
        if self._job_noise is not None:
            rel, fixed_s = self._job_noise.wait_parts(self.steps)
            wait_s += rel * ran.step_s + fixed_s
            job_wait_s = self._job_noise.seen_s(rel, fixed_s, ran.step_s)
        if wait_s > 0.0:
            self.device.idle(wait_s)
        groups = _group_times(ran.schedule, ran.kernel_times_s, ran.step_s)
        report = StepReport(
            step=self.steps,
            end_s=self.device.now_s(),
            step_time_s=ran.step_s + wait_s,
            group_times_s=(*groups[:-1], groups[-1] + wait_s),
            wait_s=job_wait_s,
            counter_readings=self._read_counter(),
            temperature_c=optional_sensor(self.device, "temperature_c", math.nan),
            throttle_reasons=frozenset(optional_sensor(self.device, "throttle_reasons", frozenset())),
            power_limit_w=optional_sensor(self.device, "power_limit_w", math.nan),
            sm_clock_mhz=_sm_clock_mhz(self.device),
        )
        self.steps += 1
        return report

    def step_until_update(self, schedule: Schedule) -> StepReport:
        """Run steps under the schedule (stock in dry run) until the step after which the
        energy counter shows an update, or until the next step would take the stretch past
        MAX_REPORT_S, and report them as one StepReport of `steps` steps (step times and group
        times their means, the counter update observed, the sensors at the end). Each step runs
        at once (ModelDevice.advance_step): the pairs its kernels run at from the switch state
        it starts in (StepRunner.pattern), their noiseless costs at the card's conditions then
        (cached), the noise of the epoch it starts in, the job noise's wait. A device that cannot
        run a step at once runs one step, kernel by kernel (step)."""
        device = self.device
        if not isinstance(device, ModelDevice):
            return self.step(schedule)
        if schedule != self._schedule or not self.requests:
            self.requests.append((self.steps, schedule))
            self._schedule = schedule
        applied = Schedule.stock() if self.dry_run else schedule
        starts = tuple(start for start, _ in schedule.groups)  # the groups reported: the requested schedule's
        sampler, runner = self._job_noise, self.runner
        steps, total_s, wait_sum_s, seen_sum_s, groups_sum_s = 0, 0.0, 0.0, 0.0, 0.0
        while True:
            noise = device.step_noise()
            pattern = runner.pattern(applied, noise[0])
            rel, fixed_s = sampler.wait_parts(self.steps) if sampler is not None else (0.0, 0.0)
            cost, group_s = self._step_cost(pattern, 0.0, starts)
            if rel > 0.0 or fixed_s > 0.0:  # a wait: the costs as the windows see it
                cost, group_s = self._step_cost(pattern, rel * cost.time_s * noise[0] + fixed_s, starts)
            step_s = cost.time_s * noise[0]
            wait_s = rel * step_s + fixed_s
            device.advance_step(pattern, cost, noise, wait_s)
            self.steps += 1
            steps += 1
            total_s += step_s + wait_s
            wait_sum_s += wait_s
            seen_sum_s += sampler.seen_s(rel, fixed_s, step_s) if sampler is not None else 0.0
            groups_sum_s = groups_sum_s + group_s * noise[0]
            if device.energy_j() != self._counter_j or total_s + step_s + wait_s > MAX_REPORT_S:
                break
        groups = groups_sum_s / steps
        groups[-1] += wait_sum_s / steps
        return StepReport(
            step=self.steps - 1,
            end_s=device.now_s(),
            step_time_s=total_s / steps,
            group_times_s=tuple(groups.tolist()),
            counter_readings=self._read_counter(),
            temperature_c=optional_sensor(device, "temperature_c", math.nan),
            throttle_reasons=frozenset(optional_sensor(device, "throttle_reasons", frozenset())),
            power_limit_w=optional_sensor(device, "power_limit_w", math.nan),
            sm_clock_mhz=_sm_clock_mhz(device),
            steps=steps,
            wait_s=seen_sum_s / steps,
        )

    def _step_cost(self, pattern, idle_s: float, starts: tuple[int, ...]) -> tuple:
        """(StepCost, the noiseless time s of each group starting at `starts`) of a pattern
        under the conditions now and idle_s after it, cached in the pattern. The groups are the
        requested schedule's: in dry run the pattern is stock's, the report the request's."""
        key = (self.device.step_cost_key(idle_s), starts)
        entry = pattern.costs.get(key)
        if entry is None:
            cost = self.device.step_cost(pattern.items, idle_s)
            bounds = [*starts, len(cost.times_s)]
            group_s = np.array(
                [cost.cum_time_s[b] - cost.cum_time_s[a] for a, b in itertools.pairwise(bounds)]
            )
            entry = pattern.costs[key] = (cost, group_s)
        return entry

    def change_workload(self, workload: Workload) -> None:
        """The job's steps run these kernels from now on (the schedule requested stays)."""
        self.workload = workload
        self.runner = StepRunner(self.device, workload)
        self.runner.forget_requests()

    def run(
        self,
        controller: StepController,
        *,
        seconds: float,
        on_report: Callable[[StepReport], None] | None = None,
        aggregate: bool = False,
    ) -> None:
        """Train for `seconds` of device time, each step's report answered by the controller
        (aggregate: each stretch's, step_until_update). The clocks go back to stock when it
        ends, normally or by an exception."""
        if not seconds > 0.0:
            raise KdvfsError(f"seconds of training must be > 0, got {seconds}")
        end_s = self.device.now_s() + seconds
        schedule = Schedule.stock()
        try:
            while self.device.now_s() < end_s:
                report = self.step_until_update(schedule) if aggregate else self.step(schedule)
                if on_report is not None:
                    on_report(report)
                schedule = controller.on_step_end(report)
        finally:
            self.reset()

    def reset(self) -> None:
        """Stock clocks requested now (a real job's clocks back to the card's default)."""
        self.device.reset_clocks()
        self.runner.forget_requests()
        if self._schedule != Schedule.stock():
            self.requests.append((self.steps, Schedule.stock()))
        self._schedule = Schedule.stock()

    def _read_counter(self) -> tuple[tuple[float, float], ...]:
        """The counter's updates since the last read, if its value changed: each one at the
        multiple of its period it came at (several inside a long wait or step, as a poller
        reading back to back sees them)."""
        value_j = self.device.energy_j()
        if value_j == self._counter_j:
            return ()
        self._counter_j = value_j
        since = getattr(self.device, "counter_updates_since", None)
        updates = since(self._counter_s) if since is not None else ()
        if updates:
            self._counter_s = updates[-1][0]
            return updates
        period_s = self.device.energy_update_period_s  # not kept: the update came at the last tick
        self._counter_s = math.floor(self.device.now_s() / period_s + 1e-9) * period_s
        return ((self._counter_s, value_j),)


def _group_times(schedule: Schedule, kernel_times_s: np.ndarray, step_s: float) -> tuple[float, ...]:
    """Each group's share of the step: its kernels' launch times, scaled to the step's time."""
    starts = [s for s, _ in schedule.groups]
    sums = [float(kernel_times_s[a:b].sum()) for a, b in zip(starts, [*starts[1:], len(kernel_times_s)])]
    total = sum(sums)
    return tuple(s * step_s / total for s in sums) if total > 0 else tuple(sums)


def _sm_clock_mhz(device: ModelDevice) -> float:
    """The SM clock a simulated job reports: the card's clock averaged over its recent launches
    where it has that (a poller sampling a real card through the steps reads the same), else
    its reading now, else NaN."""
    return float(
        optional_sensor(device, "mean_sm_clock_mhz", None)
        or optional_sensor(device, "sm_clock_mhz", math.nan)
    )
