"""Training steps on a device whose kernels we run: a schedule of clock groups applied.

- `Schedule`: the clock requests of one step (a group's first kernel and its pair);
- `StepRunner`: runs steps of a workload on a ModelDevice under a schedule,
  requesting a group's clocks at its first kernel only when they differ from the last
  request, so a switch lands switch_latency_s later, as tuner/grouping.py models it;
- `schedule_figures`: a schedule's noiseless (energy saving, slowdown) against stock, as the
  card runs it (`schedule_items`: each kernel with the pair in effect when it starts;
  `steady_step` / `SteadyStep`: the same with the job's wait after each step, and the clocks
  and the switch in flight at the kernels' end);
- `StepPattern` / `StepRunner.pattern`: the pairs one step's kernels run at from a given
  switch state (clocks in effect, a switch in flight), for a stretch of steps simulated at
  once (SimulatedJob.step_until_update); its noiseless costs (ModelDevice.step_cost) cached.

On a real GPU the training loop runs the kernels instead (torch_integration.py); why the
switch latency shapes schedules: docs/design-runtime.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kdvfs.runtime.model_device import ModelDevice
from kdvfs.runtime.types import ClockPair, Kernel, Workload


@dataclass(frozen=True)
class Schedule:
    """Clock requests of one step: (index of a group's first kernel, pair or None for
    stock clocks), the first group starting at kernel 0."""

    groups: tuple[tuple[int, ClockPair | None], ...]

    @classmethod
    def stock(cls) -> Schedule:
        return cls(((0, None),))

    @property
    def is_stock(self) -> bool:
        """Every group at stock clocks (no pair requested)."""
        return all(pair is None for _, pair in self.groups)

    def at_stock(self) -> Schedule:
        """The same groups, each at stock clocks."""
        return Schedule(tuple((start, None) for start, _ in self.groups))

    def one_pair(self) -> ClockPair | None:
        """The pair when the whole step runs at one locked pair, else None."""
        return self.groups[0][1] if len(self.groups) == 1 else None

    def pair_per_kernel(self, n: int) -> list[ClockPair | None]:
        """The pair each of n kernels requests (its group's)."""
        out: list[ClockPair | None] = []
        for (start, pair), nxt in zip(self.groups, [g[0] for g in self.groups[1:]] + [n]):
            out.extend([pair] * (nxt - start))
        return out


PENDING_QUANTA = 64
"""A switch in flight at a step's start is placed to 1/PENDING_QUANTA of the switch latency
when the step's pattern is looked up (count): patterns are cached by it."""


@dataclass
class StepPattern:
    """The clocks each kernel of one step runs at, from a switch state at the step's start.

    Attributes:
        items: (kernel, pair in effect as it starts, launches) of each kernel, in order.
        groups: each schedule group's first kernel (the schedule's starts).
        end_clocks: the clocks in effect as the step's kernels end (None: stock).
        end_pending: the switch still in flight then, as (s until it lands, pair), or None.
        requested: the last pair requested in the step (StepRunner's record of it).
        switches: clock changes that landed during the step's kernels (count).
        costs: the step's noiseless costs under the conditions they were costed at
            (ModelDevice.step_cost_key -> StepCost), filled as the stretch runs.
    """

    items: tuple[tuple[Kernel, ClockPair | None, int], ...]
    groups: tuple[int, ...]
    end_clocks: ClockPair | None
    end_pending: tuple[float, ClockPair | None] | None
    requested: ClockPair | None
    switches: int
    costs: dict = field(default_factory=dict)


class StepRunner:
    """Runs training steps of a workload on a ModelDevice under a schedule.

    Args:
        device: runs the kernels (a simulated or replayed device).
        workload: the kernels of one step, in order.
    """

    def __init__(self, device: ModelDevice, workload: Workload) -> None:
        self.device = device
        self.workload = workload
        self._requested: ClockPair | str | None = "unset"
        self._patterns: dict[tuple, StepPattern] = {}

    def run(self, schedule: Schedule, steps: int) -> tuple[np.ndarray, float]:
        """(each kernel's time in the last step run kernel by kernel, launches included, as
        launch timings give it; total seconds of all the steps). Steps run kernel by
        kernel until one runs in steady state: at least one (two after an isolated
        measurement), and more while a switch that the steady cycle would not make is in
        flight during it (a new schedule's first request, or one made before the previous
        step began: on the H200 a switch takes 10 ms, longer than a step, and an
        step in which such a switch lands runs partly at the old clocks). The rest repeat
        that one (ModelDevice.repeat_since), which keeps long runs cheap."""
        starts = dict(schedule.groups)
        cyclic_first = (
            schedule.groups[0][1] != schedule.groups[-1][1]
        )  # the steady cycle requests at kernel 0
        t0 = self.device.now_s()
        exact = 1 if self._requested != "unset" else 2
        done = 0
        prev_start_s: float | None = None  # start of the previous step, when it was steady
        while done < steps:
            t_it, e_it = self.device.now_s(), self.device.true_energy_j()
            inherited_s = self.device.switch_requested_s()  # in flight as it begins: the cycle's own?
            times = np.empty(len(self.workload))
            transient = False
            for k, kernel in enumerate(self.workload.kernels):
                if k in starts and starts[k] != self._requested:
                    transient |= k == 0 and not cyclic_first
                    self._request(starts[k])
                times[k] = self.device.run(kernel, kernel.launches)
            done += 1
            requested_s = self.device.switch_requested_s()
            own_start = inherited_s is None or (prev_start_s is not None and inherited_s >= prev_start_s)
            if done >= exact and not transient and own_start and (requested_s is None or requested_s >= t_it):
                break
            prev_start_s = None if transient else t_it
        self.device.repeat_since(t_it, e_it, steps - done)
        return times, self.device.now_s() - t0

    def pattern(self, schedule: Schedule, time_f: float = 1.0) -> StepPattern:
        """The pattern of the next step under the schedule, from the device's switch state now
        (clocks in effect, the switch in flight placed to 1/PENDING_QUANTA of the latency) and
        the last request made; the runner then records the step's last request as made. A
        request lands switch_latency_s after its group's first kernel starts, at a kernel's
        start (as schedule_items), the kernels timed by the device's noiseless figures now
        (launch_time_s; patterns cached by the conditions, step_cost_key) times the step's
        time noise factor time_f (to TIME_F_QUANTUM): a switch that lands near a kernel's start
        lands before or after it as the noise has the kernels run."""
        device = self.device
        clocks, pending = device.clocks_in_effect(), device.pending_switch()
        latency_s = device.switch_latency_s
        if pending is not None:
            quantum_s = latency_s / PENDING_QUANTA
            pending = (max(0.0, round(pending[0] / quantum_s)) * quantum_s, pending[1])
        time_f = round(time_f / TIME_F_QUANTUM) * TIME_F_QUANTUM
        key = (schedule, clocks, pending, self._requested, device.step_cost_key(), time_f)
        pattern = self._patterns.get(key)
        if pattern is None:
            if len(self._patterns) >= PATTERN_CACHE:
                self._patterns.clear()
            pattern = self._new_pattern(schedule, clocks, pending, latency_s, time_f)
            self._patterns[key] = pattern
        self._requested = pattern.requested
        return pattern

    def _new_pattern(
        self,
        schedule: Schedule,
        clocks: ClockPair | None,
        pending: tuple[float, ClockPair | None] | None,
        latency_s: float,
        time_f: float,
    ) -> StepPattern:
        starts = dict(schedule.groups)
        requested = self._requested
        clock_s, switches, items = 0.0, 0, []
        for k, kernel in enumerate(self.workload.kernels):
            if pending is not None and clock_s >= pending[0] - 1e-15:
                switches += pending[1] != clocks
                clocks, pending = pending[1], None
            if k in starts and starts[k] != requested:
                requested = starts[k]
                if latency_s <= 0.0:
                    switches += requested != clocks
                    clocks, pending = requested, None
                else:
                    pending = (clock_s + latency_s, requested)
            items.append((kernel, clocks, kernel.launches))
            clock_s += self.device.launch_time_s(kernel, clocks) * kernel.launches * time_f
        end_pending = None if pending is None else (pending[0] - clock_s, pending[1])
        return StepPattern(
            tuple(items),
            tuple(starts),
            clocks,
            end_pending,
            requested,
            switches,  # type: ignore[arg-type]
        )

    def _request(self, pair: ClockPair | None) -> None:
        if pair is None:
            self.device.reset_clocks()
        else:
            self.device.set_clocks(pair)
        self._requested = pair

    def forget_requests(self) -> None:
        """Someone else set the clocks (an isolated measurement): request again next time."""
        self._requested = "unset"


TIME_F_QUANTUM = 1e-3
"""Resolution of the time noise factor a step's pattern is computed at (dimensionless)."""
PATTERN_CACHE = 4096
"""Step patterns a runner keeps before it forgets them all (count)."""


def schedule_figures(device: ModelDevice, workload: Workload, schedule: Schedule) -> tuple[float, float]:
    """Noiseless (energy saving, slowdown) of a schedule run over and over, against stock, at
    the step's own steady temperature: each kernel at the pair in effect when it starts
    (a switch lands switch_latency_s after its group's first kernel starts, as on the card)."""
    ref_t, ref_e = device.expected_step([(k, None, k.launches) for k in workload.kernels])
    t, e = device.expected_step(schedule_items(device, workload, schedule))
    return 1.0 - e / ref_e, t / ref_t - 1.0


def schedule_items(
    device: ModelDevice, workload: Workload, schedule: Schedule
) -> list[tuple[Kernel, ClockPair | None, int]]:
    """(kernel, pair in effect, launches) of one steady-state step of a schedule (see
    schedule_figures; steady_step with no wait)."""
    return steady_step(device, workload, schedule).items


@dataclass(frozen=True)
class SteadyStep:
    """One steady-state step of a schedule as the card runs it (steady_step).

    Attributes:
        items: (kernel, pair in effect when it starts, launches) of each kernel.
        end_pair: the clocks in effect when the step's kernels end (None: stock).
        in_flight: the switch still in flight then, as (s after the kernels' end it lands,
            pair), or None: in a wait after the kernels it lands that long into it.
    """

    items: list[tuple[Kernel, ClockPair | None, int]]
    end_pair: ClockPair | None
    in_flight: tuple[float, ClockPair | None] | None


def steady_step(
    device: ModelDevice,
    workload: Workload,
    schedule: Schedule,
    wait_rel: float = 0.0,
    wait_fixed_s: float = 0.0,
) -> SteadyStep:
    """The second of two steps of a schedule run back to back (it starts in steady state), each
    followed by the job's wait for its host: each kernel at the pair in effect when it starts, a
    switch landing switch_latency_s after its group's first kernel starts, the kernels timed by
    the card's isolated noiseless figures (expected); a switch still in flight at a step's end
    lands in the wait, or in the next step when the wait is shorter.

    Args:
        device: the card (expected, switch_latency_s).
        workload: the kernels of one step.
        schedule: the clock requests.
        wait_rel: the wait after each step's kernels as a share of their time, a fraction.
        wait_fixed_s: the wait's part that does not scale with the step, s.
    """
    requested = schedule.pair_per_kernel(len(workload))
    starts = {s for s, _ in schedule.groups}
    in_effect, pending, clock_s = requested[-1], None, 0.0
    items: list[tuple[Kernel, ClockPair | None, int]] = []
    kernels_end_s = 0.0
    for _ in range(2):  # the second step starts in steady state
        items = []
        start_s = clock_s
        for k, kernel in enumerate(workload.kernels):
            if pending is not None and clock_s >= pending[0]:
                in_effect, pending = pending[1], None
            if k in starts and requested[k] != (pending[1] if pending else in_effect):
                pending = (clock_s + device.switch_latency_s, requested[k])
                if device.switch_latency_s <= 0:
                    in_effect, pending = requested[k], None
            items.append((kernel, in_effect, kernel.launches))
            clock_s += device.expected(kernel, in_effect)[0] * kernel.launches
        kernels_end_s = clock_s
        clock_s += wait_rel * (clock_s - start_s) + wait_fixed_s  # a switch in flight runs on
    if pending is not None and pending[0] <= kernels_end_s:  # landed as the last kernel ran
        return SteadyStep(items, pending[1], None)
    return SteadyStep(items, in_effect, None if pending is None else (pending[0] - kernels_end_s, pending[1]))
