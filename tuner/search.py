"""The tuning loop of a search strategy: asks, measurements and tells until every kernel converges.

- run_search: tunes every distinct kernel with one strategy (longest first, at an estimated
  exchange rate; a kernel doing the same work as another shares its cells, as the full sweep
  does: sweep.sources), solves the plan and verifies it; returns a SearchResult. What
  `kdvfs compare` runs.
- The exchange rate: estimate_exchange_rate_w (the multiplier of the tuned kernels' plan),
  exchange_rates_around (the rates a strategy looks at), task_tol (when a strategy stops).
- Bench: measures cells, pairing a throttled pair with the adjacent stock measurement.
- verified_plan (with _judge, _pooled): the plan judged by fresh measurements of its cells.
- task_features, search_space: what a strategy is given of the kernels and the clock grid.

Design and findings (the exchange rate, the winner's curse):
docs/design-tuner.md#search-the-tuning-loop-of-a-search-strategy
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kdvfs.policies._common import BaseStrategy, SafeExplorer
from kdvfs.policies.base import SearchSpace, Task
from kdvfs.policies.registry import make_strategy
from kdvfs.runtime.device import RunnableDevice
from kdvfs.runtime.measure import (
    SUB_WINDOW_S,
    StepReference,
    measure_isolated,
    measure_reference_steps,
)
from kdvfs.runtime.types import ClockPair, Measurement, Workload
from kdvfs.tuner.observations import SAFETY_Z, Observations, measure_cell
from kdvfs.tuner.solver import solve_budget
from kdvfs.tuner.sweep import evaluate, share_with_copies, sources

#: Exchange rate before any kernel is tuned, as a fraction of the step's mean power.
PRIOR_EXCHANGE_RATE_SHARE = 0.5
#: Factor below and above the estimated exchange rate that a strategy also looks at; no unit.
EXCHANGE_RATE_SPREAD = 1.5
#: A task's own slowdown limit, keeping strategies off pairs no plan would use; a fraction.
TASK_SLOWDOWN = 0.15
#: Smallest relative improvement a strategy stops below on a kernel; a fraction.
TASK_TOL = 0.002
#: Improvement, as a fraction of the step's energy, below which a strategy stops on a kernel.
STEP_TOL = 1e-4
#: Largest relative improvement a strategy stops below on a kernel; a fraction.
MAX_TASK_TOL = 0.5
#: Bias the unverified cells may put on the plan's time, as a fraction of the budget's slack.
VERIFY_TOLERANCE = 0.05
#: Most times a plan judged over its limit is solved again before falling back to stock.
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
    curve: list[tuple[int, float]]  # (measurements so far, plan's energy saving)
    tuner_cpu_s: float  # CPU seconds inside ask() and tell()
    ask_cpu_ms_median: float
    observations: Observations
    verify_measurements: int


def task_features(workload: Workload) -> list[tuple[float, ...]]:
    """What a search strategy sees of each kernel (Task.features): its numeric features in one
    fixed order (the union of names, zero-filled). The Gymnasium observation's features are
    another thing (envs.kernel_env.observation_features: names, float32, log10 flops/bytes)."""
    names = sorted({name for k in workload.kernels for name, _ in k.features})
    return [tuple(float(k.feature_dict().get(n, 0.0)) for n in names) for k in workload.kernels]


def search_space(device: RunnableDevice) -> SearchSpace:
    configs = np.array(device.grid.as_lists(), dtype=float)
    return SearchSpace(
        configs, reference=None if device.source == "simulated" else device.grid.index(device.grid.highest())
    )


class Bench:
    """Measures cells as observations.measure_cell does, but pairs a throttled pair with the
    adjacent stock measurement of the same kernel: the one taken just before it when there is
    one (the kernel's reference, or the pair of the cell before), else a new one right after it
    (which then also pairs the next cell). Same temperature either way, half the stock runs.

    Args:
        device: the card the cells are measured on.
        window_s: length of one measurement (isolated replay), s.
    """

    def __init__(self, device: RunnableDevice, window_s: float) -> None:
        self.device = device
        self.window_s = window_s
        self._last_stock: tuple[Observations, int, Measurement] | None = None

    def stock(self, obs: Observations, k: int) -> None:
        self._last_stock = (obs, k, measure_cell(self.device, obs, k, None, self.window_s))

    def cell(self, obs: Observations, k: int, pair: ClockPair) -> None:
        last, self._last_stock = self._last_stock, None
        if last is None or last[0] is not obs or last[1] != k:
            stock = measure_cell(self.device, obs, k, pair, self.window_s)
            if stock is not None:
                self._last_stock = (obs, k, stock)
            return
        res = measure_isolated(self.device, obs.workload.kernels[k], pair, self.window_s)
        if not res.measurement.throttled:
            obs.add(k, pair, res.measurement, res.cost_s)
        else:
            obs.add_paired(k, pair, res.measurement, last[2], res.cost_s)
            obs.measurements -= 1  # the stock measurement it pairs with was counted when taken


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


def estimate_exchange_rate_w(obs: Observations, budget: float, tuned: np.ndarray) -> float:
    """The Lagrange multiplier (J/s) of the plan over the tuned kernels (a boolean mask) within
    their share of the time limit: 0 when their least-energy options fit."""
    times, energies = _options(obs)
    times, energies = times[tuned], energies[tuned]
    limit_s = obs.time_limit_s(budget) * obs.ref_time_s[tuned].sum() / obs.ref_time_s.sum()
    rows = np.arange(len(times))
    costs_ok = ~np.isnan(times)

    def plan_time_s(exchange_rate_w: float) -> float:
        pick = np.argmin(
            np.where(costs_ok, energies + exchange_rate_w * np.nan_to_num(times), np.inf), axis=1
        )
        return float(times[rows, pick].sum())

    if plan_time_s(0.0) <= limit_s:
        return 0.0
    lo, hi = 0.0, obs.reference.step_energy_j / obs.reference.step_time_s
    for _ in range(40):  # above the steepest slope of any kernel's options, all take their fastest
        if plan_time_s(hi) <= limit_s:
            break
        lo, hi = hi, 2.0 * hi
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if plan_time_s(mid) > limit_s else (lo, mid)
    return hi


def exchange_rates_around(exchange_rate_w: float) -> tuple[float, ...]:
    """The exchange rates a strategy looks at: EXCHANGE_RATE_SPREAD either side of the estimate, or 0."""
    return (
        (0.0,)
        if exchange_rate_w == 0.0
        else (exchange_rate_w / EXCHANGE_RATE_SPREAD, exchange_rate_w, exchange_rate_w * EXCHANGE_RATE_SPREAD)
    )


def task_tol(obs: Observations, k: int) -> float:
    """The relative improvement below which a strategy stops on kernel k: STEP_TOL of the
    step's energy, as a share of the kernel's (TASK_TOL at least, MAX_TASK_TOL at most)."""
    share = obs.stock_energy_j[k] / obs.reference.step_energy_j
    return min(max(TASK_TOL, STEP_TOL / share), MAX_TASK_TOL)


def run_search(
    device: RunnableDevice,
    workload: Workload,
    strategy: str | BaseStrategy,
    *,
    budget: float,
    seed: int = 0,
    max_per_kernel: int | None = None,
    window_s: float = 1.0,
    progress: Callable[[int, int, int], None] | None = None,
) -> SearchResult:
    """Tune every kernel with the strategy; progress(kernels done, kernels, measurements)."""
    space = search_space(device)
    policy = make_strategy(strategy, space, seed=seed) if isinstance(strategy, str) else strategy
    obs = Observations(workload, device.grid.pairs, measure_reference_steps(device, workload.kernels))
    features = task_features(workload)
    curve: list[tuple[int, float]] = [(0, 0.0)]
    cpu_s = 0.0
    tuned = np.zeros(len(workload), dtype=bool)
    tasks: dict[int, Task] = {}
    bench = Bench(device, window_s)
    asked = np.zeros(len(workload), dtype=int)

    def tune(k: int) -> None:
        """Ask and tell until the strategy converges on kernel k or its cap is reached."""
        nonlocal cpu_s
        launches = workload.kernels[k].launches
        if isinstance(policy, SafeExplorer):
            policy.tol = task_tol(obs, k)
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

    prior_exchange_rate_w = (
        PRIOR_EXCHANGE_RATE_SHARE * obs.reference.step_energy_j / obs.reference.step_time_s
    )
    copies = sources(device, workload)  # a kernel doing the same work as another shares its cells

    def share(source: int) -> None:
        tuned[share_with_copies(obs, copies, source)] = True

    for done, k in enumerate(np.argsort(-obs.ref_time_s, kind="stable")):
        kernel = workload.kernels[k]
        if copies[k] != k:
            continue  # measured as its source; shared once that is tuned
        bench.stock(obs, k)
        tasks[k] = Task(
            key=kernel.name,
            ref_time_s=obs.stock_time_s[k] / kernel.launches,
            ref_energy_j=obs.stock_energy_j[k] / kernel.launches,
            budget=TASK_SLOWDOWN,
            features=features[k],
        )
        policy.exchange_rates_w = exchange_rates_around(
            estimate_exchange_rate_w(obs, budget, tuned) if tuned.any() else prior_exchange_rate_w
        )
        tune(k)
        tuned[k] = True
        share(k)
        curve.append(
            (obs.measurements, evaluate(device, workload, obs.kernel_level_choice(budget)).energy_saving)
        )
        if progress is not None:
            progress(done + 1, len(workload), obs.measurements)
    policy.exchange_rates_w = exchange_rates_around(estimate_exchange_rate_w(obs, budget, tuned))
    for k in tasks:
        tune(k)
        share(k)
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
        curve=[*curve, (obs.measurements, figures.energy_saving)],
        tuner_cpu_s=cpu_s,
        ask_cpu_ms_median=1e3 * float(np.median(asks)) if asks else 0.0,
        observations=obs,
        verify_measurements=obs.measurements - before,
    )


def verified_plan(bench: Bench, obs: Observations, budget: float) -> dict[str, ClockPair | None]:
    """The plan of least measured energy whose time, judged by fresh measurements of its cells
    and of the reference, is within the budget by SAFETY_Z s.d. of the judgement's error (the
    rule: docs/design-tuner.md, verification). Fresh measurements, and their device time, are
    counted in obs."""
    again = measure_reference_steps(bench.device, obs.workload.kernels)
    reference, reference_sd_s = _pooled(obs.reference, again)
    fresh = Observations(obs.workload, obs.pairs, reference)
    ref_s = reference.kernel_time_s
    noise = SAFETY_Z * reference.time_rel_sd
    slack_s = budget * float(ref_s.sum()) - SAFETY_Z * reference_sd_s
    stock = len(obs.pairs)
    solve_limit_s = obs.time_limit_s(budget)
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
        judged_s, cells_var_s2 = _judge(obs, fresh, choice, noise)
        limit_s = (1.0 + budget) * float(ref_s.sum()) - SAFETY_Z * float(
            np.sqrt(cells_var_s2 + reference_sd_s**2)
        )
        if judged_s <= limit_s:
            break
        planned_s = sum(
            float(obs.ref_time_s[k]) if c == stock else float(time_s[k, c]) for k, c in enumerate(choice)
        )
        solve_limit_s = planned_s - (judged_s - limit_s)
    else:
        choice = np.full(len(obs.workload), stock)
    obs.measurements += fresh.measurements
    obs.cost_s += again.cost_s + fresh.cost_s - reference.cost_s
    options = (*obs.pairs, None)
    return {kernel.name: options[c] for kernel, c in zip(obs.workload.kernels, choice)}


def _judge(obs: Observations, fresh: Observations, choice: np.ndarray, noise: float) -> tuple[float, float]:
    """A plan's judged step time and the variance (s^2) of its freshly measured part:
    stock kernels at the (pooled) reference, verified cells as freshly measured (a throttled
    one's ratio to its paired stock measurement has twice the variance), the rest as explored
    plus `noise` (relative)."""
    stock = len(obs.pairs)
    time_s, _ = obs.plannable()
    fresh_s, _ = fresh.plannable()
    judged_s, var_s2 = 0.0, 0.0
    for k, c in enumerate(choice):
        if c == stock:
            judged_s += float(fresh.ref_time_s[k])
        elif fresh.counts[k, c]:
            judged_s += float(fresh_s[k, c])
            paired = not np.isnan(fresh.paired_ratio[k, c, 0])
            var_s2 += (2.0 if paired else 1.0) * (fresh.reference.time_rel_sd * float(fresh_s[k, c])) ** 2
        else:
            judged_s += float(time_s[k, c]) * (1.0 + noise)
    return judged_s, var_s2


def _pooled(first: StepReference, second: StepReference) -> tuple[StepReference, float]:
    """Two references measured apart, pooled (their mean), and the s.d. (s) of the pooled
    step time: from their sub-window noise (rel_sd / sqrt(sub-windows), assuming
    independent sub-windows) or, when larger, from how far apart the two came out (which also
    sees noise correlated over many sub-windows, such as thermal drift), halved by pooling."""
    both = (first, second)
    kernel_time_s = (first.kernel_time_s + second.kernel_time_s) / 2.0
    step_s = float(kernel_time_s.sum())
    rel_var = float(np.mean([r.time_rel_sd**2 for r in both]))
    per_window_var = max(
        float(np.mean([rel_var * SUB_WINDOW_S / (r.steps * r.step_time_s) for r in both])),
        (first.step_time_s - second.step_time_s) ** 2 / (2.0 * step_s**2),
    )
    pooled = dataclasses.replace(
        first,
        kernel_time_s=kernel_time_s,
        step_time_s=step_s,
        step_energy_j=(first.step_energy_j + second.step_energy_j) / 2.0,
        time_rel_sd=float(np.sqrt(rel_var)),
        steps=first.steps + second.steps,
        cost_s=first.cost_s + second.cost_s,
    )
    return pooled, step_s * float(np.sqrt(per_window_var / 2.0))
