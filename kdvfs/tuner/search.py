"""The tuning loop of a search strategy: policy x measurements until every kernel converges.

Kernels are tuned one after another, longest first (they set the exchange rate below, and a
cross-kernel strategy learns from those before). Each kernel's reference (stock) is measured
first; then the policy asks for a clock pair, the pair is measured as the sweep measures it
(>= window_s of isolated replay, a paired stock measurement when the card throttles: Bench),
and the policy is told the result, until it answers None (converged) or the
cap is hit. The plan is solved from what was measured, against the iteration-level budget
measured in training conditions (observations.py), by the sweep's solver, then verified.

What a policy looks for per kernel is the least energy + lambda x time, not the least energy
under the iteration's budget: the iteration-level solver trades slack between kernels (a GEMM
locked below the cap can run faster than stock and pay for another's slower, thriftier pair),
and its optimum is, per kernel, the least energy + lambda x time for one exchange rate lambda
(J/s) shared by all kernels: the knapsack's Lagrange multiplier. The loop estimates it before
each kernel from the kernels tuned so far (exchange_rate_w: the multiplier of their plan
within their share of the limit; LAMBDA_SHARE x the iteration's mean power before any), and
the policy looks at RATE_SPREAD below and above it (at 0 alone when the limit does not bind).
Once every kernel is tuned, each is asked again at the final estimate: a kernel tuned early,
under a rate far from it, may still have pairs the plan would use. The task's time limit
(TASK_SLOWDOWN) only keeps policies away from pairs no plan would use.

Verification (the winner's curse): among many noisy cells the solver favours those measured
optimistically, so the plan's measured time is biased low. After solving, the plan's cells are
measured again, independently, longest first, until the kernels left unverified could bias the
plan's time by at most VERIFY_TOLERANCE of the budget's slack; the plan is judged by the fresh
measurements only (unbiased: the choice did not see them), the unverified rest at its measured
time plus SAFETY_Z noise s.d. If the judged time is over the limit, the limit is tightened by
the excess and the plan solved again (VERIFY_ROUNDS at most; then all stock). Every
verification measurement counts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kdvfs.policies._common import BasePolicy, SafeExplorer
from kdvfs.policies.base import SearchSpace, Task
from kdvfs.policies.registry import make_policy
from kdvfs.runtime.device import RunnableDevice
from kdvfs.runtime.measure import measure_isolated, measure_reference_iterations
from kdvfs.runtime.types import ClockPair, Measurement, Workload
from kdvfs.tuner.observations import SAFETY_Z, Observations
from kdvfs.tuner.solver import solve_budget
from kdvfs.tuner.sweep import evaluate

LAMBDA_SHARE = 0.5
RATE_SPREAD = 1.5
TASK_SLOWDOWN = 0.15
TASK_TOL = 0.002
ITERATION_TOL = 1e-4
MAX_TASK_TOL = 0.5
VERIFY_TOLERANCE = 0.05
VERIFY_ROUNDS = 8


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
    verify_measurements: int


def kernel_features(workload: Workload) -> list[tuple[float, ...]]:
    """Each kernel's numeric features in one fixed order (the union of names, zero-filled)."""
    names = sorted({name for k in workload.kernels for name, _ in k.features})
    return [tuple(float(k.feature_dict().get(n, 0.0)) for n in names) for k in workload.kernels]


def search_space(device: RunnableDevice) -> SearchSpace:
    configs = np.array(device.grid.as_lists(), dtype=float)
    return SearchSpace(configs, reference=None if device.source == "simulated" else device.grid.index(device.grid.highest()))


class Bench:
    """Measures cells as observations.measure_cell does, but pairs a throttled pair with the
    adjacent stock measurement of the same kernel: the one taken just before it when there is
    one (the kernel's reference, or the pair of the cell before), else a new one right after it
    (which then also pairs the next cell). Same temperature either way, half the stock runs."""

    def __init__(self, device: RunnableDevice, window_s: float) -> None:
        self.device = device
        self.window_s = window_s
        self._last_stock: tuple[Observations, int, Measurement] | None = None

    def stock(self, obs: Observations, k: int) -> None:
        res = measure_isolated(self.device, obs.workload.kernels[k], None, self.window_s)
        obs.add(k, None, res.measurement, res.cost_s)
        self._last_stock = (obs, k, res.measurement)

    def cell(self, obs: Observations, k: int, pair: ClockPair) -> None:
        kernel = obs.workload.kernels[k]
        res = measure_isolated(self.device, kernel, pair, self.window_s)
        last, self._last_stock = self._last_stock, None
        if not res.measurement.throttled:
            obs.add(k, pair, res.measurement, res.cost_s)
        elif last is not None and last[0] is obs and last[1] == k:
            obs.add_paired(k, pair, res.measurement, last[2], res.cost_s)
            obs.measurements -= 1  # the stock measurement it pairs with was counted when taken
        else:
            stock = measure_isolated(self.device, kernel, None, self.window_s)
            obs.add_paired(k, pair, res.measurement, stock.measurement, res.cost_s + stock.cost_s)
            self._last_stock = (obs, k, stock.measurement)


def _options(obs: Observations) -> tuple[np.ndarray, np.ndarray]:
    """(time, energy) per kernel and option: the measured pairs (NaN where not), then stock."""
    time_s, energy_j = obs.plannable()
    stock_e = np.where(np.isnan(obs.stock_energy_j), 0.0, obs.stock_energy_j)
    return np.column_stack([time_s, obs.ref_time_s]), np.column_stack([energy_j, stock_e])


def solve_within(obs: Observations, limit_s: float) -> np.ndarray:
    """Option index per kernel (len(obs.pairs): stock) of the least measured energy within an
    explicit time limit (Observations.kernel_level_choice with limit_s for the budget's)."""
    times, energies = _options(obs)
    return np.array(solve_budget(list(times), list(energies), limit_s).choice)


def exchange_rate_w(obs: Observations, budget: float, tuned: np.ndarray) -> float:
    """The Lagrange multiplier (J/s) of the plan over the tuned kernels (a boolean mask) within
    their share of the time limit: 0 when their least-energy options fit."""
    times, energies = _options(obs)
    times, energies = times[tuned], energies[tuned]
    limit_s = obs.time_limit_s(budget) * obs.ref_time_s[tuned].sum() / obs.ref_time_s.sum()
    rows = np.arange(len(times))
    costs_ok = ~np.isnan(times)

    def plan_time_s(lam: float) -> float:
        pick = np.argmin(np.where(costs_ok, energies + lam * np.nan_to_num(times), np.inf), axis=1)
        return float(times[rows, pick].sum())

    if plan_time_s(0.0) <= limit_s:
        return 0.0
    lo, hi = 0.0, obs.reference.iteration_energy_j / obs.reference.iteration_time_s
    while plan_time_s(hi) > limit_s and hi < 1e6 * obs.reference.iteration_energy_j:
        lo, hi = hi, 2.0 * hi
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if plan_time_s(mid) > limit_s else (lo, mid)
    return hi


def rates_around(lam_w: float) -> tuple[float, ...]:
    return (0.0,) if lam_w == 0.0 else (lam_w / RATE_SPREAD, lam_w, lam_w * RATE_SPREAD)


def run_search(
    device: RunnableDevice,
    workload: Workload,
    strategy: str | BasePolicy,
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
    tuned = np.zeros(len(workload), dtype=bool)
    tasks: dict[int, Task] = {}
    bench = Bench(device, window_s)

    asked = np.zeros(len(workload), dtype=int)

    def tune(k: int) -> None:
        nonlocal cpu_s
        launches = workload.kernels[k].launches
        while asked[k] < (max_per_kernel or len(space)):
            asked[k] += 1
            t0 = time.process_time()
            config = policy.ask(tasks[k])
            cpu_s += time.process_time() - t0
            if config is None:
                return
            bench.cell(obs, k, obs.pairs[config])
            time_s, energy_j = obs.plannable()
            t0 = time.process_time()
            policy.tell(tasks[k], config, time_s[k, config] / launches, energy_j[k, config] / launches)
            cpu_s += time.process_time() - t0

    prior_w = LAMBDA_SHARE * obs.reference.iteration_energy_j / obs.reference.iteration_time_s
    for done, k in enumerate(np.argsort(-obs.ref_time_s, kind="stable")):
        kernel = workload.kernels[k]
        bench.stock(obs, k)
        tasks[k] = Task(
            key=kernel.name,
            ref_time_s=obs.stock_time_s[k] / kernel.launches,
            ref_energy_j=obs.stock_energy_j[k] / kernel.launches,
            budget=TASK_SLOWDOWN,
            features=features[k],
        )
        policy.rates_w = rates_around(exchange_rate_w(obs, budget, tuned) if tuned.any() else prior_w)
        if isinstance(policy, SafeExplorer):
            share = obs.stock_energy_j[k] / obs.reference.iteration_energy_j
            policy.tol = min(max(TASK_TOL, ITERATION_TOL / share), MAX_TASK_TOL)
        tune(k)
        tuned[k] = True
        curve.append((obs.measurements, evaluate(device, workload, obs.kernel_level_choice(budget)).energy_saving))
        if progress is not None:
            progress(done + 1, len(workload), obs.measurements)
    policy.rates_w = rates_around(exchange_rate_w(obs, budget, tuned))
    for k in tasks:
        if isinstance(policy, SafeExplorer):
            share = obs.stock_energy_j[k] / obs.reference.iteration_energy_j
            policy.tol = min(max(TASK_TOL, ITERATION_TOL / share), MAX_TASK_TOL)
        tune(k)
    before = obs.measurements
    plan = verified_plan(bench, obs, budget)
    device.reset_clocks()
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
        verify_measurements=obs.measurements - before,
    )


def verified_plan(bench: Bench, obs: Observations, budget: float) -> dict[str, ClockPair | None]:
    """The plan of least measured energy whose time, judged by fresh measurements of its cells
    (module docstring), is within the time limit. Fresh measurements are counted in obs."""
    fresh = Observations(obs.workload, obs.pairs, obs.reference)
    limit_s = obs.time_limit_s(budget)
    slack_s = limit_s - float(obs.ref_time_s.sum())
    noise = SAFETY_Z * obs.reference.time_rel_sd
    stock = len(obs.pairs)
    solve_limit_s = limit_s
    for _ in range(VERIFY_ROUNDS):
        choice = solve_within(obs, solve_limit_s)
        time_s, _ = obs.plannable()
        chosen = [(float(time_s[k, c]), k, int(c)) for k, c in enumerate(choice) if c != stock]
        unverified_s = sum(t for t, _, _ in chosen)
        for t, k, c in sorted(chosen, reverse=True):
            if noise * unverified_s <= VERIFY_TOLERANCE * max(slack_s, 0.0):
                break
            if fresh.counts[k, c] == 0:
                bench.cell(fresh, k, obs.pairs[c])
            unverified_s -= t
        fresh_s, _ = fresh.plannable()
        judged_s = sum(
            float(obs.ref_time_s[k]) if c == stock
            else float(fresh_s[k, c]) if fresh.counts[k, c] else float(time_s[k, c]) * (1.0 + noise)
            for k, c in enumerate(choice)
        )
        if judged_s <= limit_s:
            break
        planned_s = sum(float(obs.ref_time_s[k]) if c == stock else float(time_s[k, c]) for k, c in enumerate(choice))
        solve_limit_s = planned_s - (judged_s - limit_s)
    else:
        choice = np.full(len(obs.workload), stock)
    obs.measurements += fresh.measurements
    obs.cost_s += fresh.cost_s - obs.reference.cost_s
    options = (*obs.pairs, None)
    return {kernel.name: options[c] for kernel, c in zip(obs.workload.kernels, choice)}
