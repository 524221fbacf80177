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
from kdvfs.runtime.measure import measure_reference_iterations
from kdvfs.runtime.types import ClockPair, Workload
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
    """Measure the reference, then every kernel at stock and at every pair of the grid."""
    obs = Observations(workload, device.grid.pairs, measure_reference_iterations(device, workload.kernels))
    total = len(workload) * len(obs.pairs)
    for i in range(len(workload)):
        measure_cell(device, obs, i, None, window_s)
        for j, pair in enumerate(obs.pairs):
            measure_cell(device, obs, i, pair, window_s)
            if progress is not None:
                progress(i * len(obs.pairs) + j + 1, total)
    device.reset_clocks()
    return obs


def pass_level_choice(obs: Observations, budget: float) -> dict[str, ClockPair | None]:
    """One setting per pass (forward / backward / optimizer): a pair every kernel of the pass
    holds, or stock; same time limit."""
    passes = [k.pass_name for k in obs.workload.kernels]
    time_s, energy_j = obs.plannable()
    times = np.column_stack([time_s, obs.ref_time_s])
    energies = np.column_stack([energy_j, obs.stock_energy_j])
    per_pass, _ = pass_level(list(times), list(energies), passes, obs.time_limit_s(budget))
    options = (*obs.pairs, None)
    return {k.name: options[per_pass[k.pass_name]] for k in obs.workload.kernels}


def evaluate(device: RunnableDevice, workload: Workload, choice: dict[str, ClockPair | None]) -> PlanFigures:
    """Noiseless evaluation of a per-kernel plan against the reference, each iteration at its
    own steady temperature (switch cost ignored, as the founding paper did; tuner/grouping.py
    prices switches)."""
    ref_t, ref_e = device.expected_iteration([(k, None, k.launches) for k in workload.kernels])
    t, e = device.expected_iteration([(k, choice[k.name], k.launches) for k in workload.kernels])
    return PlanFigures(dict(choice), 1.0 - e / ref_e, t / ref_t - 1.0, t, e)
