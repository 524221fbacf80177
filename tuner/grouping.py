"""Switch-cost-aware grouping: consecutive kernels share one clock pair, switches cost time.

- group_kernels: the least-energy grouping within a time limit, and its gap to a lower bound;
  two stages: a Lagrangian DP walking the (time, energy) hull (_walk_hull), then, when the
  gap is worth closing, a DP over discretised slack (_Planner.within).
- evaluate_grouping: a grouping's time and energy under the device model (switches land
  switch_latency_s after their group starts; _run_step).
- Group, Grouping: the result.

Design (the device model, the two stages, why every pair is a candidate):
docs/design-tuner.md#grouping-switch-cost-aware-plans
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from kdvfs.runtime.types import KdvfsError
from kdvfs.tuner.solver import solve_budget

#: A switch due within this of a kernel's start applies to it (as in ModelDevice); s.
SWITCH_TOL_S = 1e-15
#: Extra times within this fraction of a slack unit above a whole number of units round down.
_CEIL_TOL = 1e-9
#: Relative gap of the hull plan to the bound above which the slack DP runs; a fraction.
_GAP_WORTH_CLOSING = 1e-4


@dataclass(frozen=True)
class Group:
    """Kernels [start, end) of one step under one requested pair (a column index of the
    planner's matrices). lag_kernels: how many of them ran at another pair (while the switch
    was pending). time_s / energy_j: the group's figures, those kernels included."""

    start: int
    end: int
    pair_index: int
    lag_kernels: int
    time_s: float
    energy_j: float


@dataclass(frozen=True)
class Grouping:
    """A segmentation of one step and its steady-state figures.

    switches: clock changes per step. unsettled: switch requests still pending when the
    next one was made or the step ended (0 for plans from group_kernels).
    dual_bound_j / gap: from group_kernels (no plan of its kind within the limit spends less
    than dual_bound_j); NaN for an evaluated grouping. feasible: within the time limit.
    """

    groups: tuple[Group, ...]
    time_s: float
    energy_j: float
    switches: int
    unsettled: int
    dual_bound_j: float = math.nan
    gap: float = math.nan
    feasible: bool = True


def group_kernels(
    time_s: np.ndarray,
    energy_j: np.ndarray,
    switch_latency_s: float,
    reference_time_s: float,
    budget: float,
    resolution: int = 2000,
) -> Grouping:
    """Least-energy grouping with step time <= (1 + budget) * reference_time_s.

    time_s[k, c], energy_j[k, c]: kernel k of the step (in order, launches included) at
    candidate pair c. Every kernel needs a finite figure at every pair, since any kernel may
    run at the pair of the group before it. resolution: slack units of the discretised DP.
    When even the fastest grouping exceeds the limit, returns that one with feasible=False.
    """
    t, e = _matrices(time_s, energy_j)
    if not (switch_latency_s >= 0.0 and math.isfinite(switch_latency_s)):
        raise KdvfsError(f"switch latency must be a finite number >= 0, got {switch_latency_s}")
    if not (reference_time_s > 0.0 and math.isfinite(reference_time_s)) or not budget >= 0.0:
        raise KdvfsError(f"need reference time > 0 and budget >= 0, got {reference_time_s} and {budget}")
    if resolution < 1:
        raise KdvfsError(f"resolution must be >= 1, got {resolution}")
    limit_s = (1.0 + budget) * reference_time_s
    if switch_latency_s <= SWITCH_TOL_S:
        # Free switches: kernels are independent, the plan is the per-kernel knapsack.
        solution = solve_budget(list(t), list(e), limit_s, resolution)
        starts, pairs = _merged(list(range(len(t))), list(solution.choice))
        grouping = evaluate_grouping(t, e, list(zip(starts, pairs)), switch_latency_s)
        return _with_bound(grouping, solution.dual_bound_j, feasible=solution.feasible)
    planner = _Planner(t, e, switch_latency_s)
    fastest = planner.lagrangian(0.0, 1.0)[0]
    if fastest.time_s > limit_s:
        return _with_bound(fastest, math.nan, feasible=False)
    least, value = planner.lagrangian(1.0, 0.0)
    if least.time_s <= limit_s:
        return _with_bound(least, value, feasible=True)
    low, high, dual_j, seen = _walk_hull(planner, least, fastest, value, limit_s)
    best = high
    if best.energy_j - dual_j > _GAP_WORTH_CLOSING * best.energy_j:
        # Between two hull points: the slack DP over the pairs the hull plans use, for the
        # pair(s) they end the step at.
        pairs = sorted({g.pair_index for plan in seen for g in plan.groups})
        local = _Planner(t[:, pairs], e[:, pairs], switch_latency_s)
        for end_pair in sorted({low.groups[-1].pair_index, high.groups[-1].pair_index}):
            candidate = local.within(limit_s, pairs.index(end_pair), resolution)
            if candidate is not None and candidate.time_s <= limit_s and candidate.energy_j < best.energy_j:
                best = _on_pairs(candidate, pairs)
    return _with_bound(best, dual_j, feasible=True)


def _walk_hull(
    planner: _Planner, low: Grouping, high: Grouping, dual_j: float, limit_s: float
) -> tuple[Grouping, Grouping, float, list[Grouping]]:
    """Walk the lower hull of (time, energy) between a plan over the limit (low) and one within
    it (high): exchange_rate_w = the slope between them finds any plan below their chord; none means it
    maximises the dual, and the chord at the limit is the bound. Returns the final low and
    high, the dual bound and every plan met."""
    seen = [low, high]
    for _ in range(200):
        exchange_rate_w = (high.energy_j - low.energy_j) / (low.time_s - high.time_s)
        plan, value = planner.lagrangian(1.0, exchange_rate_w)
        seen.append(plan)
        dual_j = max(dual_j, value - exchange_rate_w * limit_s)
        chord = low.energy_j + exchange_rate_w * low.time_s
        known = {(low.time_s, low.energy_j), (high.time_s, high.energy_j)}
        if value >= chord - 1e-12 * abs(chord) or (plan.time_s, plan.energy_j) in known:
            break
        if plan.time_s <= limit_s:
            high = plan
        else:
            low = plan
    return low, high, dual_j, seen


def evaluate_grouping(
    time_s: np.ndarray,
    energy_j: np.ndarray,
    groups: Sequence[tuple[int, int]],
    switch_latency_s: float,
    time_limit_s: float = math.inf,
) -> Grouping:
    """Steady-state time and energy of a grouping, simulated kernel by kernel.

    groups: (start, pair_index) of each group in order, the first starting at kernel 0. At a
    group's start a switch that is due lands; then the group's pair is requested if it differs
    from the pair last requested. A pending switch lands before the first kernel that starts
    switch_latency_s or more after its request. Steps repeat until the state at an
    step's start recurs; figures are the mean over that cycle.
    """
    t, e = _matrices(time_s, energy_j)
    starts = [int(s) for s, _ in groups]
    pairs = [int(p) for _, p in groups]
    n = t.shape[0]
    if not starts or starts[0] != 0 or any(b <= a for a, b in itertools.pairwise(starts)) or starts[-1] >= n:
        raise KdvfsError(
            f"groups must start at kernel 0 and increase within {n} kernels, got starts {starts}"
        )
    if any(not 0 <= p < t.shape[1] for p in pairs):
        raise KdvfsError(f"pair index out of range 0..{t.shape[1] - 1}: {pairs}")
    ends = [*starts[1:], n]
    state = (pairs[-1], pairs[-1], None)
    seen: dict[tuple, int] = {}
    history: list[_Step] = []
    while state not in seen and len(history) <= 2 * n + 4:
        seen[state] = len(history)
        figures, state = _run_step(t, e, starts, ends, pairs, switch_latency_s, state)
        history.append(figures)
    cycle = history[seen.get(state, len(history) - 1) :]
    group_t = np.mean([c.group_t for c in cycle], axis=0)
    group_e = np.mean([c.group_e for c in cycle], axis=0)
    built = tuple(
        Group(*spec, float(gt), float(ge))
        for *spec, gt, ge in zip(starts, ends, pairs, cycle[-1].lag_kernels, group_t, group_e)
    )
    total_t = float(group_t.sum())
    return Grouping(
        built,
        total_t,
        float(group_e.sum()),
        switches=round(float(np.mean([c.switches for c in cycle]))),
        unsettled=round(float(np.mean([c.unsettled for c in cycle]))),
        feasible=total_t <= time_limit_s,
    )


@dataclass(frozen=True)
class _Step:
    group_t: np.ndarray
    group_e: np.ndarray
    lag_kernels: list[int]
    switches: int
    unsettled: int


def _run_step(t, e, starts, ends, pairs, latency_s, state):
    """One step from state (pair in effect, pair last requested, pending (pair, due_s)
    relative to the step's start, or None); returns its figures and the next state."""
    in_effect, requested, pending = state
    group_t = np.zeros(len(starts))
    group_e = np.zeros(len(starts))
    lag_kernels = [0] * len(starts)
    switches = unsettled = 0
    now_s = 0.0

    def land_due() -> None:
        nonlocal in_effect, pending, switches
        if pending is not None and pending[1] <= now_s + SWITCH_TOL_S:
            switches += pending[0] != in_effect
            in_effect, pending = pending[0], None

    for g, (start, end, pair) in enumerate(zip(starts, ends, pairs)):
        land_due()
        if pair != requested:
            unsettled += pending is not None
            requested = pair
            pending = (pair, now_s + latency_s)
        for k in range(start, end):
            land_due()
            lag_kernels[g] += in_effect != pair
            group_t[g] += t[k, in_effect]
            group_e[g] += e[k, in_effect]
            now_s += t[k, in_effect]
    land_due()
    if pending is not None:
        unsettled += 1
        pending = (pending[0], pending[1] - now_s)
    return _Step(group_t, group_e, lag_kernels, switches, unsettled), (in_effect, requested, pending)


def _matrices(time_s: np.ndarray, energy_j: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    t = np.asarray(time_s, dtype=float)
    e = np.asarray(energy_j, dtype=float)
    if t.ndim != 2 or t.shape != e.shape or t.size == 0:
        raise KdvfsError(
            f"time and energy must be equal non-empty (kernels x pairs) matrices, got {t.shape} and {e.shape}"
        )
    bad = ~(np.isfinite(t) & np.isfinite(e)) | (t < 0) | (e < 0)
    if bad.any():
        k, c = np.argwhere(bad)[0]
        raise KdvfsError(
            f"kernel {k}, pair {c}: time {t[k, c]} / energy {e[k, c]} is not a finite number >= 0"
        )
    return t, e


class _Planner:
    """DPs over groupings whose every switch lands before the next request and before the
    step ends, for a switch latency > 0.

    State (m, q): pair q in effect at kernel position m, nothing pending. A switch requested at
    m from q runs the kernels that start within the latency at q and lands at the first
    position T > m whose start is at least the latency later: an 'offer' of state (T, any
    pair). The cycle closes where the pair in effect at the end is the one at the start.
    """

    def __init__(self, t: np.ndarray, e: np.ndarray, latency_s: float) -> None:
        self.t, self.e, self.latency_s = t, e, latency_s
        n, pairs = t.shape
        zero = np.zeros((1, pairs))
        cum_t = np.vstack([zero, np.cumsum(t, axis=0)])
        cum_e = np.vstack([zero, np.cumsum(e, axis=0)])
        positions = np.arange(n)
        target = np.empty((n, pairs), dtype=np.int64)
        for q in range(pairs):
            landing = np.searchsorted(cum_t[:, q], cum_t[:n, q] + latency_s - SWITCH_TOL_S, side="left")
            target[:, q] = np.maximum(landing, positions)
        ok = target <= n
        clipped = np.where(ok, target, positions[:, None])
        cols = np.arange(pairs)
        self.window_t = cum_t[clipped, cols] - cum_t[:n]
        self.window_e = cum_e[clipped, cols] - cum_e[:n]
        self.target = target
        self.offers: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        for m in range(n):
            sources = np.flatnonzero(ok[m])
            sources = sources[np.argsort(target[m, sources], kind="stable")]
            targets, seg = np.unique(target[m, sources], return_index=True)
            self.offers.append((sources, seg, targets))

    def lagrangian(self, a: float, b: float) -> tuple[Grouping, float]:
        """The grouping minimising a*energy + b*time, and that least value."""
        cost = a * self.e + b * self.t
        window_cost = a * self.window_e + b * self.window_t
        values = self._values(cost, window_cost)
        p0 = int(np.argmin(values))
        starts, pairs = self._path(cost, window_cost, p0)
        grouping = evaluate_grouping(self.t, self.e, list(zip(starts, pairs)), self.latency_s)
        return grouping, float(values[p0])

    def _values(self, cost: np.ndarray, window_cost: np.ndarray) -> np.ndarray:
        """Least cost of a whole step for each pair p0 in effect at its start and end
        (g[p0, q]: the least cost so far from p0 to q)."""
        n, pairs = cost.shape
        g = np.full((pairs, pairs), np.inf)
        np.fill_diagonal(g, 0.0)
        offer = np.full((n + 1, pairs), np.inf)
        for m in range(n):
            np.minimum(g, offer[m][:, None], out=g)
            sources, seg, targets = self.offers[m]
            if sources.size:
                arriving = np.take(g, sources, axis=1)
                arriving += window_cost[m, sources]
                best = np.minimum.reduceat(arriving, seg, axis=1).T
                offer[targets] = np.minimum(offer[targets], best)
            g += cost[m]
        np.minimum(g, offer[n][:, None], out=g)
        return np.diagonal(g).copy()

    def _path(self, cost: np.ndarray, window_cost: np.ndarray, p0: int) -> tuple[list[int], list[int]]:
        """Group starts and pairs of the least-cost step starting and ending at p0."""
        n, pairs = cost.shape
        g = np.full(pairs, np.inf)
        g[p0] = 0.0
        offer = np.full(n + 1, np.inf)
        source = np.zeros((n + 1, 2), dtype=np.int64)
        landed = np.zeros((n + 1, pairs), dtype=bool)
        for m in range(n + 1):
            landed[m] = offer[m] < g
            g = np.minimum(g, offer[m])
            if m == n:
                break
            sources, seg, targets = self.offers[m]
            if sources.size:
                arriving = g[sources] + window_cost[m, sources]
                best = np.minimum.reduceat(arriving, seg)
                hits = np.flatnonzero(arriving == np.repeat(best, np.diff(np.append(seg, sources.size))))
                winners = sources[hits[np.searchsorted(hits, seg)]]
                better = best < offer[targets]
                offer[targets[better]] = best[better]
                source[targets[better], 0] = m
                source[targets[better], 1] = winners[better]
            g = g + cost[m]
        starts: list[int] = []
        group_pairs: list[int] = []
        position, pair = n, p0
        while position > 0:
            if landed[position, pair]:
                start, previous = (int(x) for x in source[position])
                starts.append(start)
                group_pairs.append(pair)
                position, pair = start, previous
            else:
                position -= 1
        if not starts or starts[-1] != 0:
            starts.append(0)
            group_pairs.append(pair)
        return _merged(starts[::-1], group_pairs[::-1])

    def within(self, limit_s: float, p0: int, resolution: int) -> Grouping | None:
        """The least-energy grouping with p0 in effect at the step's start and end and time
        <= limit_s, by DP over (position, pair in effect, slack used): slack discretised as in
        solver.py, each kernel's extra time over its fastest rounded up (truly feasible)."""
        t, e = self.t, self.e
        n, pairs = t.shape
        fastest_s = t.min(axis=1)
        slack_s = limit_s - float(fastest_s.sum())
        if slack_s < 0.0:
            return None
        units = resolution if slack_s > 0.0 else 0
        extra_s = t - fastest_s[:, None]
        scaled = (
            np.ceil(extra_s * (units / slack_s) - _CEIL_TOL) if units else np.where(extra_s > 0.0, 1.0, 0.0)
        )
        used = np.clip(scaled, 0, units + 1).astype(np.int64)
        cum_used = np.vstack([np.zeros((1, pairs), dtype=np.int64), np.cumsum(used, axis=0)])
        window_used = cum_used[np.minimum(self.target, n), np.arange(pairs)] - cum_used[:n]
        steps = np.arange(units + 1)

        def shifted(values: np.ndarray, by: np.ndarray) -> np.ndarray:
            """out[i, s] = values[i, s - by[i]] (inf where s < by[i]): slack spent by a step."""
            out = np.full_like(values, np.inf)
            for row, (shift, value) in enumerate(zip(by.tolist(), values)):
                if shift <= units:
                    out[row, shift:] = value[: units + 1 - shift]
            return out

        g = np.full((pairs, units + 1), np.inf)  # g[q, s]: least energy so far using <= s units
        g[p0] = 0.0
        offer = np.full((n + 1, units + 1), np.inf)
        source = np.zeros((n + 1, units + 1, 2), dtype=np.int64)
        landed = np.zeros((n + 1, pairs, units + 1), dtype=bool)
        for m in range(n + 1):
            landed[m] = offer[m] < g
            g = np.minimum(g, offer[m])
            if m == n:
                break
            sources, seg, targets = self.offers[m]
            if sources.size:
                arriving = shifted(g[sources], window_used[m, sources]) + self.window_e[m, sources][:, None]
                bounds = np.append(seg, sources.size)
                for i, target in enumerate(targets):
                    block = arriving[bounds[i] : bounds[i + 1]]
                    pick = np.argmin(block, axis=0)
                    best = block[pick, steps]
                    better = best < offer[target]
                    offer[target, better] = best[better]
                    source[target, better, 0] = m
                    source[target, better, 1] = sources[bounds[i] + pick[better]]
            g = shifted(g, used[m]) + e[m][:, None]
        if not np.isfinite(g[p0, units]):
            return None
        starts: list[int] = []
        group_pairs: list[int] = []
        position, pair, s = n, p0, units
        while position > 0:
            if landed[position, pair, s]:
                start, previous = (int(x) for x in source[position, s])
                starts.append(start)
                group_pairs.append(pair)
                position, pair, s = start, previous, s - int(window_used[start, previous])
            else:
                position -= 1
                s -= int(used[position, pair])
        if not starts or starts[-1] != 0:
            starts.append(0)
            group_pairs.append(pair)
        starts, group_pairs = _merged(starts[::-1], group_pairs[::-1])
        return evaluate_grouping(t, e, list(zip(starts, group_pairs)), self.latency_s, limit_s)


def _merged(starts: list[int], pairs: list[int]) -> tuple[list[int], list[int]]:
    """Consecutive groups of one pair are one group (no switch between them)."""
    out_s, out_p = [starts[0]], [pairs[0]]
    for s, p in zip(starts[1:], pairs[1:]):
        if p != out_p[-1]:
            out_s.append(s)
            out_p.append(p)
    return out_s, out_p


def _on_pairs(grouping: Grouping, pairs: list[int]) -> Grouping:
    """A grouping planned on a subset of the pairs, with pair indices of the full set."""
    groups = tuple(replace(g, pair_index=pairs[g.pair_index]) for g in grouping.groups)
    return replace(grouping, groups=groups)


def _with_bound(grouping: Grouping, dual_j: float, *, feasible: bool) -> Grouping:
    gap = (grouping.energy_j - dual_j) / grouping.energy_j if feasible and grouping.energy_j > 0 else math.nan
    return Grouping(
        grouping.groups,
        grouping.time_s,
        grouping.energy_j,
        grouping.switches,
        grouping.unsettled,
        dual_bound_j=dual_j,
        gap=max(gap, 0.0) if feasible else math.nan,
        feasible=feasible,
    )
