"""The full-sweep baseline: measure every clock pair of every kernel, then solve for the plan.

As the founding paper did, each kernel runs in isolation at each supported pair (>= 1 s of
repeats per measurement), and the plan is the exact least-energy choice under the iteration's
time limit (observations.Observations); the pass-level plan is the same with one pair per pass.
The reference comes first: training iterations at stock clocks, then each kernel's isolated
stock measurement (observations.py says why both).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kdvfs.runtime.device import RunnableDevice
from kdvfs.runtime.iteration import Schedule
from kdvfs.runtime.measure import measure_reference_iterations
from kdvfs.runtime.model_device import ModelDevice
from kdvfs.runtime.types import ClockPair, Kernel, Workload
from kdvfs.tuner.grouping import group_kernels
from kdvfs.tuner.observations import Observations, measure_cell
from kdvfs.tuner.solver import pass_level


@dataclass(frozen=True)
class PlanFigures:
    """A plan (a pair per kernel, None = stock) and its noiseless evaluation."""

    choice: dict[str, ClockPair | None]
    energy_saving: float
    slowdown: float
    time_s: float
    energy_j: float


def run_sweep(
    device: RunnableDevice,
    workload: Workload,
    window_s: float = 1.0,
    progress: Callable[[int, int], None] | None = None,
) -> Observations:
    """Measure the reference, then every distinct kernel at stock and at every pair of the
    grid (sweep_reference, then measure_every_pair)."""
    return measure_every_pair(device, sweep_reference(device, workload), window_s, progress)


def sweep_reference(device: RunnableDevice, workload: Workload) -> Observations:
    """A sweep's first phase: training iterations at stock; nothing measured at a pair yet."""
    return Observations(workload, device.grid.pairs, measure_reference_iterations(device, workload.kernels))


def measure_every_pair(
    device: RunnableDevice,
    obs: Observations,
    window_s: float = 1.0,
    progress: Callable[[int, int], None] | None = None,
) -> Observations:
    """A sweep's second phase, into `obs` as it goes (an interrupted sweep keeps what it
    measured): every distinct kernel at stock and at every pair of the grid. A kernel doing the
    same work as one already measured (the same kernel of another layer) shares its
    measurements instead of being measured again."""
    workload = obs.workload
    first: dict[tuple, int] = {}
    by_work = getattr(device, "costs_by_work", False)  # else a kernel's costs go by its name (a table)
    copies = [first.setdefault(_work(k) if by_work else (k.name,), i) for i, k in enumerate(workload.kernels)]
    distinct = [i for i, source in enumerate(copies) if source == i]
    total = len(distinct) * len(obs.pairs)
    try:
        for n, i in enumerate(distinct):
            measure_cell(device, obs, i, None, window_s)
            for j, pair in enumerate(obs.pairs):
                measure_cell(device, obs, i, pair, window_s)
                if progress is not None:
                    progress(n * len(obs.pairs) + j + 1, total)
            for copy, source in enumerate(copies):
                if source == i and copy != i:
                    obs.share(i, copy)
    finally:
        device.reset_clocks()
    return obs


def _work(kernel: Kernel) -> tuple:
    """What a kernel's measurements depend on: everything but its name and pass."""
    return (
        kernel.flops,
        kernel.bytes_moved,
        kernel.tensor_core,
        kernel.kind,
        kernel.wait_s,
        kernel.launches,
        kernel.ref_time_s,
    )


def pass_level_choice(obs: Observations, budget: float) -> dict[str, ClockPair | None]:
    """One setting per pass (forward / backward / optimizer): a pair every kernel of the pass
    holds, or stock; same time limit."""
    passes = [k.pass_name for k in obs.workload.kernels]
    time_s, energy_j = obs.plannable()
    times = np.column_stack([time_s, obs.ref_time_s])
    energies = np.column_stack([energy_j, _stock_energy_j(obs)])
    per_pass, _ = pass_level(list(times), list(energies), passes, obs.time_limit_s(budget))
    options = (*obs.pairs, None)
    return {k.name: options[per_pass[k.pass_name]] for k in obs.workload.kernels}


def _stock_energy_j(obs: Observations) -> np.ndarray:
    """Each kernel's isolated stock energy, 0 where not measured yet (an interrupted sweep):
    such a kernel stays at stock, whose energy is the same in every plan."""
    return np.where(np.isnan(obs.stock_energy_j), 0.0, obs.stock_energy_j)


def evaluate(device: RunnableDevice, workload: Workload, choice: dict[str, ClockPair | None]) -> PlanFigures:
    """Noiseless evaluation of a per-kernel plan against the reference, each iteration at its
    own steady temperature (switch cost ignored, as the founding paper did; tuner/grouping.py
    prices switches)."""
    ref_t, ref_e = device.expected_iteration([(k, None, k.launches) for k in workload.kernels])
    t, e = device.expected_iteration([(k, choice[k.name], k.launches) for k in workload.kernels])
    return PlanFigures(dict(choice), 1.0 - e / ref_e, t / ref_t - 1.0, t, e)


@dataclass(frozen=True)
class Realisable:
    """The best schedule a card can run with its clock-switch latency within the budget,
    planned from a sweep's measurements, and its noiseless figures (switches included)."""

    schedule: Schedule
    energy_saving: float
    slowdown: float

    @property
    def groups(self) -> int:
        return len(self.schedule.groups)


def realisable(device: ModelDevice, obs: Observations, budget: float) -> Realisable:
    """Group the swept kernels so that clock switches pay for themselves (grouping.py), then
    evaluate the schedule as the card runs it (all stock when no grouping fits the budget)."""
    from kdvfs.runtime.iteration import schedule_figures

    time_m, energy_m = obs.plannable()
    t = np.column_stack([time_m, obs.ref_time_s])
    e = np.column_stack([energy_m, _stock_energy_j(obs)])
    columns = [*obs.pairs, None]
    grouping = group_kernels(t, e, device.switch_latency_s, obs.time_limit_s(budget), 0.0)
    schedule = (
        Schedule(tuple((g.start, columns[g.pair_index]) for g in grouping.groups))
        if grouping.feasible
        else Schedule.stock()
    )
    saving, slowdown = schedule_figures(device, obs.workload, schedule)
    return Realisable(schedule, saving, slowdown)
