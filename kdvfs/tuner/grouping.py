"""Switch-cost-aware grouping: consecutive kernels share one clock pair, switches cost time.

The device model: a switch requested at the start of a group lands switch_latency_s later;
until then the old clocks keep running (no stall), so the kernels that start within the
latency of their group's start run at the pair in effect before. A request made while an
earlier one is still pending replaces it: a group shorter than the latency never gets its
pair (the same as merging it into the group before), and the planner only proposes groups
that last at least the latency. The iteration repeats: the pair in effect when it starts is
the last group's. The granularity is the kernel: a kernel (all its launches in the
iteration) runs at the pair in effect when it starts.

`group_kernels` plans by dynamic programming over (kernel position, pair in effect), exact for
a Lagrangian cost energy + lambda * time; the time limit is met by walking lambda along the
lower hull of (time, energy), and the best Lagrangian value bounds the energy of any plan
within the limit from below (the reported gap). Cost per lambda is O(n * P^2) vectorised: 111
kernels x 220 pairs take a fraction of a second in all, so every pair is a candidate for every
group (pruning pairs per kernel to its Pareto front could drop the best plan: a group shares
one pair, and a pair's speed also sets how many kernels the next switch's window covers).
It does not plan a switch that would still be pending when the iteration ends.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kdvfs.runtime.types import KdvfsError

SWITCH_TOL_S = 1e-15
"""A switch due within this of a kernel's start applies to it (as in ModelDevice)."""


@dataclass(frozen=True)
class Group:
    """Kernels [start, end) of one iteration under one requested pair (a column index of the
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
    """A segmentation of one iteration and its steady-state figures.

    switches: clock changes per iteration. unsettled: switch requests still pending when the
    next one was made or the iteration ended (0 for plans from group_kernels).
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
) -> Grouping:
    """Least-energy grouping with iteration time <= (1 + budget) * reference_time_s.

    time_s[k, c], energy_j[k, c]: kernel k of the iteration (in order, launches included) at
    candidate pair c. Every kernel needs a finite figure at every pair, since any kernel may
    run at the pair of the group before it. When even the fastest grouping exceeds the limit,
    returns that one with feasible=False.
    """
    t, e = _matrices(time_s, energy_j)
    if not (switch_latency_s >= 0.0 and math.isfinite(switch_latency_s)):
        raise KdvfsError(f"switch latency must be a finite number >= 0, got {switch_latency_s}")
    if not (reference_time_s > 0.0 and math.isfinite(reference_time_s)) or not budget >= 0.0:
        raise KdvfsError(f"need reference time > 0 and budget >= 0, got {reference_time_s} and {budget}")
    limit_s = (1.0 + budget) * reference_time_s
    dp = _Lagrangian(t, e, switch_latency_s)

    fastest = dp.plan(0.0, 1.0)[0]
    if fastest.time_s > limit_s:
        return _with_bound(fastest, math.nan, feasible=False)
    low, value = dp.plan(1.0, 0.0)
    if low.time_s <= limit_s:
        return _with_bound(low, value, feasible=True)
    # Walk the lower hull of (time, energy) between a plan over the limit (low) and one within
    # it (high): lam = the slope between them finds any plan below their chord; none means lam
    # maximises the dual, and the chord at the limit is the bound.
    high, dual_j = fastest, value
    for _ in range(200):
        lam = (high.energy_j - low.energy_j) / (low.time_s - high.time_s)
        plan, value = dp.plan(1.0, lam)
        dual_j = max(dual_j, value - lam * limit_s)
        chord = low.energy_j + lam * low.time_s
        known = {(low.time_s, low.energy_j), (high.time_s, high.energy_j)}
        if value >= chord - 1e-12 * abs(chord) or (plan.time_s, plan.energy_j) in known:
            break
        if plan.time_s <= limit_s:
            high = plan
        else:
            low = plan
    return _with_bound(high, dual_j, feasible=True)


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
    switch_latency_s or more after its request. Iterations repeat until the state at an
    iteration's start recurs; figures are the mean over that cycle.
    """
    t, e = _matrices(time_s, energy_j)
    starts = [int(s) for s, _ in groups]
    pairs = [int(p) for _, p in groups]
    n = t.shape[0]
    if not starts or starts[0] != 0 or any(b <= a for a, b in zip(starts, starts[1:])) or starts[-1] >= n:
        raise KdvfsError(f"groups must start at kernel 0 and increase within {n} kernels, got starts {starts}")
    if any(not 0 <= p < t.shape[1] for p in pairs):
        raise KdvfsError(f"pair index out of range 0..{t.shape[1] - 1}: {pairs}")
    ends = starts[1:] + [n]
    state = (pairs[-1], pairs[-1], None)
    seen: dict[tuple, int] = {}
    history: list[_Iteration] = []
    while state not in seen and len(history) <= 2 * n + 4:
        seen[state] = len(history)
        figures, state = _iterate(t, e, starts, ends, pairs, switch_latency_s, state)
        history.append(figures)
    cycle = history[seen.get(state, len(history) - 1):]
    group_t = np.mean([c.group_t for c in cycle], axis=0)
    group_e = np.mean([c.group_e for c in cycle], axis=0)
    built = tuple(
        Group(*spec, float(gt), float(ge))
        for *spec, gt, ge in zip(starts, ends, pairs, cycle[-1].lag_kernels, group_t, group_e)
    )
    total_t = float(group_t.sum())
    return Grouping(
        built, total_t, float(group_e.sum()),
        switches=round(float(np.mean([c.switches for c in cycle]))),
        unsettled=round(float(np.mean([c.unsettled for c in cycle]))),
        feasible=total_t <= time_limit_s,
    )


@dataclass(frozen=True)
class _Iteration:
    group_t: np.ndarray
    group_e: np.ndarray
    lag_kernels: list[int]
    switches: int
    unsettled: int


def _iterate(t, e, starts, ends, pairs, latency_s, state):
    """One iteration from state (pair in effect, pair last requested, pending (pair, due_s)
    relative to the iteration's start, or None); returns its figures and the next state."""
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
    return _Iteration(group_t, group_e, lag_kernels, switches, unsettled), (in_effect, requested, pending)


def _matrices(time_s: np.ndarray, energy_j: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    t = np.asarray(time_s, dtype=float)
    e = np.asarray(energy_j, dtype=float)
    if t.ndim != 2 or t.shape != e.shape or t.size == 0:
        raise KdvfsError(f"time and energy must be equal non-empty (kernels x pairs) matrices, got {t.shape} and {e.shape}")
    bad = ~(np.isfinite(t) & np.isfinite(e)) | (t < 0) | (e < 0)
    if bad.any():
        k, c = np.argwhere(bad)[0]
        raise KdvfsError(f"kernel {k}, pair {c}: time {t[k, c]} / energy {e[k, c]} is not a finite number >= 0")
    return t, e


class _Lagrangian:
    """DP for min over groupings of (a * energy + b * time), exact over groupings whose every
    switch lands before the next request and before the iteration ends.

    State g[p0, q] at position m: least cost of kernels [0, m) given pair p0 in effect when the
    iteration starts, pair q in effect at m and nothing pending. A switch requested at m from q
    runs the kernels that start within the latency at q and lands at the first position T
    whose start is at least the latency later: an 'offer' of state (T, any pair). With no
    latency, T = m: the switch is immediate. The cycle closes where q at the end equals p0.
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
        self.offers: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        for m in range(n):
            sources = np.flatnonzero(ok[m])
            sources = sources[np.argsort(target[m, sources], kind="stable")]
            targets, seg = np.unique(target[m, sources], return_index=True)
            self.offers.append((sources, seg, targets))

    def plan(self, a: float, b: float) -> tuple[Grouping, float]:
        """The grouping minimising a*energy + b*time, and that least value."""
        cost = a * self.e + b * self.t
        window_cost = a * self.window_e + b * self.window_t
        values = self._values(cost, window_cost)
        p0 = int(np.argmin(values))
        starts, pairs = self._path(cost, window_cost, p0)
        grouping = evaluate_grouping(self.t, self.e, list(zip(starts, pairs)), self.latency_s)
        return grouping, float(values[p0])

    def _values(self, cost: np.ndarray, window_cost: np.ndarray) -> np.ndarray:
        """Least cost of a whole iteration for each pair p0 in effect at its start and end."""
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
                np.minimum(g, offer[m][:, None], out=g)
            g += cost[m]
        np.minimum(g, offer[n][:, None], out=g)
        return np.diagonal(g).copy()

    def _path(self, cost: np.ndarray, window_cost: np.ndarray, p0: int) -> tuple[list[int], list[int]]:
        """Group starts and pairs of the least-cost iteration starting and ending at p0."""
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
                if targets[0] == m:  # no latency: the switch is immediate
                    landed[m] |= offer[m] < g
                    g = np.minimum(g, offer[m])
            g = g + cost[m]
        starts: list[int] = []
        group_pairs: list[int] = []
        position, pair = n, p0
        while True:
            if landed[position, pair]:
                start, previous = (int(x) for x in source[position])
                starts.append(start)
                group_pairs.append(pair)
                pair = previous
                if start < position:
                    position = start
                    continue
            if position == 0:
                break
            position -= 1
        if not starts or starts[-1] != 0:
            starts.append(0)
            group_pairs.append(pair)
        return _merged(starts[::-1], group_pairs[::-1])


def _merged(starts: list[int], pairs: list[int]) -> tuple[list[int], list[int]]:
    """Consecutive groups of one pair are one group (no switch between them)."""
    out_s, out_p = [starts[0]], [pairs[0]]
    for s, p in zip(starts[1:], pairs[1:]):
        if p != out_p[-1]:
            out_s.append(s)
            out_p.append(p)
    return out_s, out_p


def _with_bound(grouping: Grouping, dual_j: float, *, feasible: bool) -> Grouping:
    gap = (grouping.energy_j - dual_j) / grouping.energy_j if feasible and grouping.energy_j > 0 else math.nan
    return Grouping(grouping.groups, grouping.time_s, grouping.energy_j, grouping.switches, grouping.unsettled,
                    dual_bound_j=dual_j, gap=max(gap, 0.0) if feasible else math.nan, feasible=feasible)
