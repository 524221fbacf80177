"""Least energy within a time limit: the plan as a multiple-choice knapsack.

Each item (a kernel, or a whole pass) takes exactly one option (a clock pair) with a time and
an energy (launches included); a plan minimises total energy subject to total time <= limit.
Solved exactly over a discretised slack: each option's extra time over its item's fastest
option is rounded UP to units of slack/resolution, so the answer is truly feasible (up to float
rounding) and at most one unit per item from the continuous optimum. The Lagrangian dual gives
a lower bound on any feasible plan's energy (the reported gap is the proof of how close the
answer is) and, on the way, a feasible choice of its own: the answer is the better of the two.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kdvfs.runtime.types import KdvfsError

#: Extra times within this fraction of a slack unit above a whole number of units round down
#: (float noise on an exact multiple must not cost a whole unit).
_CEIL_TOL = 1e-9


@dataclass(frozen=True)
class Solution:
    """choice[k]: the option index item k takes. dual_bound_j: no plan within the limit spends
    less (NaN when nothing fits). gap = (energy_j - dual_bound_j) / energy_j. feasible: False
    when even the fastest options exceed the limit (choice is then the fastest plan)."""

    choice: tuple[int, ...]
    energy_j: float
    time_s: float
    dual_bound_j: float
    gap: float
    feasible: bool


@dataclass(frozen=True)
class _Item:
    """The Pareto-efficient options of one item, fastest first."""

    index: np.ndarray
    time_s: np.ndarray
    energy_j: np.ndarray


def solve_budget(
    times_s: Sequence[np.ndarray],
    energies_j: Sequence[np.ndarray],
    time_limit_s: float,
    resolution: int = 4000,
) -> Solution:
    """Least-energy choice of one option per item with total time <= time_limit_s (inf: none).

    times_s[k][c], energies_j[k][c]: option c of item k; NaN marks an unavailable option.
    """
    if resolution < 1:
        raise KdvfsError(f"solver resolution must be >= 1, got {resolution}")
    if math.isnan(time_limit_s):
        raise KdvfsError("time limit is NaN")
    items = _items(times_s, energies_j)
    fastest = [0] * len(items)
    base_s = sum(float(item.time_s[0]) for item in items)
    slack_s = time_limit_s - base_s
    if slack_s < 0.0:
        return _solution(items, fastest, math.nan, feasible=False)
    dp_choice = _dp(items, slack_s, resolution)
    dual_j, relaxed_choice = _dual(items, time_limit_s)
    choice = min(dp_choice, relaxed_choice, key=lambda c: _energy_j(items, c))
    return _solution(items, choice, dual_j, feasible=True)


def pass_level(
    times_s: Sequence[np.ndarray],
    energies_j: Sequence[np.ndarray],
    pass_of_item: Sequence[str],
    time_limit_s: float,
    resolution: int = 4000,
) -> tuple[dict[str, int], Solution]:
    """One option for all items of a pass (e.g. one clock pair per forward/backward pass).

    All items must share one option list (the same clock pairs); a pass's option is the sum
    over its items, unavailable if any item lacks it. Returns {pass: option} and the solution
    over passes, in order of first appearance.
    """
    if len(pass_of_item) != len(times_s):
        raise KdvfsError(f"pass_of_item names {len(pass_of_item)} items, times_s has {len(times_s)}")
    t, e = _stack(times_s, energies_j)
    passes = list(dict.fromkeys(pass_of_item))
    member = np.asarray([passes.index(p) for p in pass_of_item])
    pass_t = [t[member == i].sum(axis=0) for i in range(len(passes))]
    pass_e = [e[member == i].sum(axis=0) for i in range(len(passes))]
    solution = solve_budget(pass_t, pass_e, time_limit_s, resolution)
    return dict(zip(passes, solution.choice)), solution


def _stack(times_s: Sequence[np.ndarray], energies_j: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    widths = {np.asarray(x).shape for x in list(times_s) + list(energies_j)}
    if len(widths) != 1 or len(times_s) != len(energies_j):
        raise KdvfsError(
            f"pass-level planning needs one option list shared by every item, got shapes {sorted(widths)}"
        )
    return np.asarray(times_s, dtype=float), np.asarray(energies_j, dtype=float)


def _items(times_s: Sequence[np.ndarray], energies_j: Sequence[np.ndarray]) -> list[_Item]:
    if len(times_s) != len(energies_j):
        raise KdvfsError(f"{len(times_s)} time rows but {len(energies_j)} energy rows")
    if not times_s:
        raise KdvfsError("nothing to plan: no items")
    return [
        _front(k, np.asarray(t, dtype=float), np.asarray(e, dtype=float))
        for k, (t, e) in enumerate(zip(times_s, energies_j))
    ]


def _front(k: int, time_s: np.ndarray, energy_j: np.ndarray) -> _Item:
    """Options of item k no other option beats on both time and energy (dominated ones can
    never be the better choice: their rounded extra time is no smaller)."""
    if time_s.ndim != 1 or time_s.shape != energy_j.shape:
        raise KdvfsError(
            f"item {k}: times {time_s.shape} and energies {energy_j.shape} must be equal-length vectors"
        )
    ok = np.isfinite(time_s) & np.isfinite(energy_j)
    if not ok.any():
        raise KdvfsError(f"item {k}: no available option (all NaN)")
    if (time_s[ok] < 0).any() or (energy_j[ok] < 0).any():
        raise KdvfsError(f"item {k}: negative time or energy")
    index = np.flatnonzero(ok)
    index = index[np.lexsort((energy_j[index], time_s[index]))]
    e_sorted = energy_j[index]
    prev_best = np.minimum.accumulate(np.concatenate(([np.inf], e_sorted[:-1])))
    keep = index[e_sorted < prev_best]
    return _Item(keep, time_s[keep], energy_j[keep])


def _dp(items: list[_Item], slack_s: float, resolution: int) -> list[int]:
    """Exact DP over slack units; best[s] = least energy of the items so far using <= s units."""
    units = resolution if slack_s > 0.0 else 0
    best = np.zeros(units + 1)
    steps = np.arange(units + 1)
    pointers: list[np.ndarray] = []
    weights: list[np.ndarray] = []
    for item in items:
        extra_s = item.time_s - item.time_s[0]
        if units:
            w = np.ceil(extra_s * (units / slack_s) - _CEIL_TOL).astype(np.int64)
            w = np.maximum(w, 0)
        else:
            w = np.where(extra_s > 0.0, 1, 0)
        fits = w <= units
        w, energy_j = w[fits], item.energy_j[fits]
        origin = steps[None, :] - w[:, None]
        cand = np.where(origin >= 0, best[np.maximum(origin, 0)] + energy_j[:, None], np.inf)
        pick = np.argmin(cand, axis=0)
        best = cand[pick, steps]
        pointers.append(pick)
        weights.append(w)
    choice = [0] * len(items)
    s = units
    for k in range(len(items) - 1, -1, -1):
        c = int(pointers[k][s])
        choice[k] = c
        s -= int(weights[k][c])
    return choice


def _dual(items: list[_Item], time_limit_s: float) -> tuple[float, list[int]]:
    """The Lagrangian dual bound and the best choice within the limit met on the way.

    max over lambda >= 0 of sum_k min_c (e + lambda t) - lambda T: concave and piecewise
    linear; bisection on the sign of its slope (the minimising choice's time minus T).
    """
    width = max(len(item.index) for item in items)
    t = np.zeros((len(items), width))
    e = np.full((len(items), width), np.inf)
    for k, item in enumerate(items):
        t[k, : len(item.index)] = item.time_s
        e[k, : len(item.index)] = item.energy_j
    rows = np.arange(len(items))

    def relax(exchange_rate_w: float) -> tuple[float, float, np.ndarray]:
        cost = e + exchange_rate_w * t
        pick = np.argmin(cost, axis=1)
        penalty_j = (
            exchange_rate_w * time_limit_s if exchange_rate_w else 0.0
        )  # 0 * inf is no penalty, not NaN
        return float(cost[rows, pick].sum() - penalty_j), float(t[rows, pick].sum()), pick

    value, time_s, pick = relax(0.0)
    if time_s <= time_limit_s:
        return value, pick.tolist()
    steps_s = np.diff(np.unique(np.concatenate([item.time_s for item in items])))
    energies_j = np.concatenate([item.energy_j for item in items])
    # Above the steepest energy-per-second slope of any front, every item takes its fastest.
    rate_lo_w, rate_hi_w = (
        0.0,
        float(np.ptp(energies_j)) / max(float(steps_s.min(initial=np.inf)), 1e-30) + 1.0,
    )
    best_value = value
    best_pick = np.zeros(len(items), dtype=np.int64)
    for _ in range(200):
        if rate_hi_w - rate_lo_w <= 1e-12 * rate_hi_w:
            break
        mid = 0.5 * (rate_lo_w + rate_hi_w)
        value, time_s, pick = relax(mid)
        best_value = max(best_value, value)
        if time_s <= time_limit_s:
            rate_hi_w, best_pick = mid, pick
        else:
            rate_lo_w = mid
    return best_value, best_pick.tolist()


def _energy_j(items: list[_Item], choice: list[int]) -> float:
    return float(sum(item.energy_j[c] for item, c in zip(items, choice)))


def _solution(items: list[_Item], choice: list[int], dual_bound_j: float, *, feasible: bool) -> Solution:
    energy_j = _energy_j(items, choice)
    time_s = float(sum(item.time_s[c] for item, c in zip(items, choice)))
    gap = (energy_j - dual_bound_j) / energy_j if energy_j > 0 else 0.0
    return Solution(
        choice=tuple(int(item.index[c]) for item, c in zip(items, choice)),
        energy_j=energy_j,
        time_s=time_s,
        dual_bound_j=dual_bound_j,
        gap=max(gap, 0.0) if feasible else math.nan,
        feasible=feasible,
    )
