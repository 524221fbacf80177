"""The full-sweep baseline: measure every clock pair of every kernel, then solve for the plan.

As the founding paper did, each kernel runs in isolation at each supported pair (>= 1 s of
repeats per measurement). The reference (stock clocks, or the highest pair on a table) is
measured REF_REPEATS times per kernel; their spread estimates the measurement noise, which
sets a safety margin so that a plan chosen on noisy measurements still meets the budget.
The plan is then the exact least-energy choice per kernel under the iteration's time limit
(solver.solve_budget), and the pass-level plan the same with one pair per pass.
Isolated replay measures each pair at whatever temperature the sweep has left the card at,
cooler than training for the low-clock part of the grid; a power-capped pair then looks
faster than it runs in training. The reference repeats are therefore spread over the sweep
(before, half-way, after), so that their spread, and the safety margin, include that drift.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kdvfs.runtime.device import RunnableDevice
from kdvfs.runtime.measure import measure_isolated
from kdvfs.runtime.types import ClockPair, Workload
from kdvfs.tuner.solver import pass_level, solve_budget

REF_REPEATS = 3
SAFETY_Z = 2.0


@dataclass(frozen=True)
class MeasuredGrid:
    """Per-iteration (launches included) measured time and energy of every kernel at every
    pair, the measured reference with its noise estimate, and how many pair measurements
    the card throttled (did not hold the asked clocks)."""

    pairs: tuple[ClockPair, ...]
    time_s: np.ndarray          # (kernels, pairs)
    energy_j: np.ndarray
    ref_time_s: np.ndarray      # (kernels,)
    ref_energy_j: np.ndarray
    ref_time_rel_sd: float      # relative s.d. of one time measurement, from the repeats
    measurements: int
    throttled: int
    cost_s: float               # device seconds spent measuring


@dataclass(frozen=True)
class PlanFigures:
    """A plan (a pair per kernel) and its noiseless evaluation against the reference."""

    choice: dict[str, ClockPair]
    energy_saving: float
    slowdown: float
    time_s: float
    energy_j: float


def run_sweep(
    device: RunnableDevice,
    workload: Workload,
    window_s: float = 1.0,
    progress: Callable[[int, int], None] | None = None,
) -> MeasuredGrid:
    """Measure every kernel at every pair of the device's grid, and the reference REF_REPEATS
    times spread over the sweep."""
    pairs = device.grid.pairs
    n = len(workload)
    time_s = np.full((n, len(pairs)), np.nan)
    energy_j = np.full_like(time_s, np.nan)
    ref_t = np.empty((n, REF_REPEATS))
    ref_e = np.empty_like(ref_t)
    cost_s, throttled = 0.0, 0
    total = n * len(pairs)
    ref_after = {round(r * n / (REF_REPEATS - 1)) for r in range(REF_REPEATS)}   # kernel counts
    repeat = 0
    for i in range(n + 1):
        if i in ref_after:
            for r, kernel in enumerate(workload.kernels):
                res = measure_isolated(device, kernel, None, window_s)
                ref_t[r, repeat] = res.measurement.time_s * kernel.launches
                ref_e[r, repeat] = res.measurement.energy_j * kernel.launches
                cost_s += res.cost_s
            repeat += 1
        if i == n:
            break
        kernel = workload.kernels[i]
        for j, pair in enumerate(pairs):
            res = measure_isolated(device, kernel, pair, window_s)
            time_s[i, j] = res.measurement.time_s * kernel.launches
            energy_j[i, j] = res.measurement.energy_j * kernel.launches
            throttled += res.measurement.throttled
            cost_s += res.cost_s
            if progress is not None:
                progress(i * len(pairs) + j + 1, total)
    device.reset_clocks()
    rel_sd = float(np.sqrt(np.mean((ref_t.std(axis=1, ddof=1) / ref_t.mean(axis=1)) ** 2)))
    return MeasuredGrid(pairs, time_s, energy_j, ref_t.mean(axis=1), ref_e.mean(axis=1), rel_sd,
                        ref_t.size + total, throttled, cost_s)


def time_limit_s(grid: MeasuredGrid, budget: float) -> float:
    """The iteration time a plan may take by the measurements: (1 + budget) x reference,
    less SAFETY_Z standard deviations of the measured-time error of plan and reference."""
    ref_total = float(grid.ref_time_s.sum())
    sd_s = grid.ref_time_rel_sd * np.sqrt(2.0 * np.sum(grid.ref_time_s**2))
    return (1.0 + budget) * ref_total - SAFETY_Z * sd_s


def kernel_level_choice(grid: MeasuredGrid, workload: Workload, budget: float) -> dict[str, ClockPair]:
    """Least measured energy per kernel within the iteration's time limit (exact knapsack)."""
    sol = solve_budget(list(grid.time_s), list(grid.energy_j), time_limit_s(grid, budget))
    return {k.name: grid.pairs[c] for k, c in zip(workload.kernels, sol.choice)}


def pass_level_choice(grid: MeasuredGrid, workload: Workload, budget: float) -> dict[str, ClockPair]:
    """One pair per pass (forward / backward / optimizer), same limit."""
    passes = [k.pass_name for k in workload.kernels]
    per_pass, _ = pass_level(list(grid.time_s), list(grid.energy_j), passes, time_limit_s(grid, budget))
    return {k.name: grid.pairs[per_pass[k.pass_name]] for k in workload.kernels}


def evaluate(device: RunnableDevice, workload: Workload, choice: dict[str, ClockPair | None]) -> PlanFigures:
    """Noiseless evaluation of a per-kernel plan against the reference, each iteration at its
    own steady temperature (switch cost ignored, as the founding paper did; tuner/grouping.py
    prices switches)."""
    ref_t, ref_e = device.expected_iteration([(k, None, k.launches) for k in workload.kernels])
    t, e = device.expected_iteration([(k, choice[k.name], k.launches) for k in workload.kernels])
    return PlanFigures(
        {name: pair for name, pair in choice.items() if pair is not None},
        1.0 - e / ref_e,
        t / ref_t - 1.0,
        t,
        e,
    )
