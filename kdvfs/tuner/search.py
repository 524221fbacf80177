"""The tuning loop of a search strategy: policy x measurements until every kernel converges.

Kernels are tuned one after another (a cross-kernel strategy learns from those before).
Each kernel's reference (stock) is measured first; then the policy asks for a clock pair,
the pair is measured as the sweep measures it (observations.measure_cell: >= window_s of
isolated replay, a paired stock measurement when the card throttles), and the policy is told
the result, until it answers None (converged) or the cap is hit. The plan is solved from
what was measured, against the iteration-level budget measured in training conditions
(observations.py), by the sweep's solver.

What a policy minimises per kernel is energy + lambda x time, not energy under the
iteration's budget: the iteration-level solver trades slack between kernels (a GEMM locked
below the cap can run faster than stock and pay for another's slower, thriftier pair), and
its optimum is exactly, per kernel, the least energy + lambda x time for one exchange rate
lambda (J/s) shared by all kernels. lambda starts at LAMBDA_SHARE x the iteration's mean
power at stock (the rate lies between 0, energy at any price in time, and about the mean
power, where slowing down stops paying for the energy of the whole card). The task's time
limit (TASK_SLOWDOWN) only keeps policies away from pairs no plan would use.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kdvfs.policies.base import Policy, SearchSpace, Task
from kdvfs.policies.registry import make_policy
from kdvfs.runtime.device import RunnableDevice
from kdvfs.runtime.measure import measure_reference_iterations
from kdvfs.runtime.types import ClockPair, Workload
from kdvfs.tuner.observations import Observations, measure_cell
from kdvfs.tuner.sweep import evaluate

LAMBDA_SHARE = 0.5
TASK_SLOWDOWN = 0.15


@dataclass(frozen=True)
class SearchResult:
    """One strategy on one seed. Plan figures are the device's noiseless evaluation."""

    strategy: str
    seed: int
    measurements: int
    explore_seconds: float
    energy_saving: float
    slowdown: float
    plan: dict[str, ClockPair | None]
    curve: list[tuple[int, float]]        # (measurements so far, plan's energy saving)
    tuner_cpu_s: float                    # CPU seconds inside ask() and tell()
    ask_cpu_ms_median: float
    observations: Observations


def kernel_features(workload: Workload) -> list[tuple[float, ...]]:
    """Each kernel's numeric features in one fixed order (the union of names, zero-filled)."""
    names = sorted({name for k in workload.kernels for name, _ in k.features})
    return [tuple(float(k.feature_dict().get(n, 0.0)) for n in names) for k in workload.kernels]


def search_space(device: RunnableDevice) -> SearchSpace:
    configs = np.array(device.grid.as_lists(), dtype=float)
    return SearchSpace(configs, reference=None if device.source == "simulated" else device.grid.index(device.grid.highest()))


def run_search(
    device: RunnableDevice,
    workload: Workload,
    strategy: str | Policy,
    *,
    budget: float,
    seed: int = 0,
    max_per_kernel: int | None = None,
    window_s: float = 1.0,
    progress: Callable[[int, int, int], None] | None = None,
) -> SearchResult:
    """Tune every kernel with the strategy; progress(kernels done, kernels, measurements)."""
    space = search_space(device)
    policy = make_policy(strategy, space, seed=seed) if isinstance(strategy, str) else strategy
    obs = Observations(workload, device.grid.pairs, measure_reference_iterations(device, workload.kernels))
    features = kernel_features(workload)
    curve: list[tuple[int, float]] = [(0, 0.0)]
    cpu_s = 0.0
    lam_j_per_s = LAMBDA_SHARE * obs.reference.iteration_energy_j / obs.reference.iteration_time_s
    for k, kernel in enumerate(workload.kernels):
        measure_cell(device, obs, k, None, window_s)
        task = Task(
            key=kernel.name,
            ref_time_s=obs.stock_time_s[k] / kernel.launches,
            ref_energy_j=(obs.stock_energy_j[k] + lam_j_per_s * obs.stock_time_s[k]) / kernel.launches,
            budget=TASK_SLOWDOWN,
            features=features[k],
        )
        for _ in range(max_per_kernel or len(space)):
            t0 = time.process_time()
            config = policy.ask(task)
            cpu_s += time.process_time() - t0
            if config is None:
                break
            measure_cell(device, obs, k, obs.pairs[config], window_s)
            time_s, energy_j = obs.plannable()
            t0 = time.process_time()
            cost_j = energy_j[k, config] + lam_j_per_s * time_s[k, config]
            policy.tell(task, config, time_s[k, config] / kernel.launches, cost_j / kernel.launches)
            cpu_s += time.process_time() - t0
        curve.append((obs.measurements, evaluate(device, workload, obs.kernel_level_choice(budget)).energy_saving))
        if progress is not None:
            progress(k + 1, len(workload), obs.measurements)
    device.reset_clocks()
    plan = obs.kernel_level_choice(budget)
    figures = evaluate(device, workload, plan)
    asks = getattr(policy, "ask_cpu_s", [])
    return SearchResult(
        strategy=policy.name,
        seed=seed,
        measurements=obs.measurements,
        explore_seconds=obs.cost_s,
        energy_saving=figures.energy_saving,
        slowdown=figures.slowdown,
        plan=plan,
        curve=curve + [(obs.measurements, figures.energy_saving)],
        tuner_cpu_s=cpu_s,
        ask_cpu_ms_median=1e3 * float(np.median(asks)) if asks else 0.0,
        observations=obs,
    )
