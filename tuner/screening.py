"""Many groups at once: the arithmetic of the step tuner's screening (tuner/step_tuner.py's
`Screening` phase runs it in training).

- `candidate_pairs(probes, times_s)`: each group's candidate pair, the probe of the whole step
  (every group at one low-clock corner) that slowed that group least, from its CUDA-event time.
- `candidate_clocks(...)`: along one clock, each group's lowest clock within a share of its
  time, interpolated between its time now and under a probe.
- `design_rows(n)`: a two-level orthogonal design (Sylvester-Hadamard columns, 0/1): which
  groups each trial moves to their candidates, every group in half the trials.
- `fit_savings(rows, savings, ses)`: each group's share of the step's energy saving, weighted
  least squares of the trials' savings on the design (the trials' own standard errors).
- `choose(...)`: the groups to move together, the largest saving per second first, within the
  time the budget leaves; a group that saves nothing at `z` errors is left out.
- `kinds_of(...)`: the groups clustered into kinds by how their CUDA-event times follow the
  clocks (their elasticities).
- `trade_clocks(...)`: a time-neutral trade between two kinds: one kind's clock lowered a step,
  the other's raised until the time it gives back covers the first's extra time.

All values are plain numbers and numpy arrays (no tuner state); docs/design-step-tuner.md,
"Many groups at once", says why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TypeVar

import numpy as np

P = TypeVar("P")


def candidate_pairs(
    probes: Mapping[P, Sequence[float]], times_s: Sequence[float]
) -> dict[int, tuple[P, float]]:
    """group -> (the probe pair that slowed it least, its time there less its time now, s per step).

    Args:
        probes: probe pair -> each group's time per step with every group at that pair, s
            (NaN where a group was not measured).
        times_s: each group's time per step under the incumbent, s.
    """
    chosen: dict[int, tuple[P, float]] = {}
    for g, now_s in enumerate(times_s):
        best: tuple[P, float] | None = None
        for pair, probed_s in probes.items():
            if g >= len(probed_s) or not math.isfinite(probed_s[g]) or not now_s > 0.0:
                continue
            extra_s = float(probed_s[g]) - float(now_s)
            if best is None or extra_s < best[1]:
                best = (pair, extra_s)
        if best is not None:
            chosen[g] = best
    return chosen


def candidate_clocks(
    times_s: Sequence[float],
    probed_s: Sequence[float],
    base_mhz: float,
    probe_mhz: float,
    clocks_mhz: Sequence[float],
    share: float,
    least_drop: float = 0.0,
) -> dict[int, tuple[float, float]]:
    """group -> (the lowest clock that slows it by at most `share` of its time, its extra time
    there, s per step), along one clock between a probe and the base it lowered.

    Each group's time is taken as t(f) = t_base * (c + (1 - c) * base / f): a part c that the
    clock does not move and a part in proportion to 1 / f, c fitted through the probe (a group
    the probe did not slow takes the probe's clock). Clocks below the probe's are not
    extrapolated to.

    Args:
        times_s: each group's time per step at the base clock, s.
        probed_s: each group's time per step with every group at the probe clock, s (NaN: not
            measured).
        base_mhz: the clock the groups run at now, MHz.
        probe_mhz: the probe's lower clock, MHz.
        clocks_mhz: the supported clocks of this axis, MHz.
        share: the largest extra time allowed a group, a fraction of its time.
        least_drop: a clock less than this share below the base is no candidate (its effect
            is below what a trial resolves); a fraction.
    """
    ladder = sorted(f for f in clocks_mhz if probe_mhz <= f <= base_mhz * (1.0 - least_drop) and f < base_mhz)
    if not ladder or not base_mhz > probe_mhz:
        return {}
    chosen: dict[int, tuple[float, float]] = {}
    for g, now_s in enumerate(times_s):
        if g >= len(probed_s) or not math.isfinite(probed_s[g]) or not now_s > 0.0:
            continue
        # extra time per unit of (base / f - 1): the part of the group that follows the clock
        slope_s = max(float(probed_s[g]) - float(now_s), 0.0) / (base_mhz / probe_mhz - 1.0)
        for f in ladder:
            extra_s = slope_s * (base_mhz / f - 1.0)
            if extra_s <= share * now_s:
                chosen[g] = (float(f), extra_s)
                break
    return chosen


def design_rows(n: int) -> np.ndarray:
    """A 0/1 design of n columns (factors) and m rows (trials), m the least power of two above n:
    columns 1..n of the Sylvester-Hadamard matrix of order m, +1 read as 1 (the group at its
    candidate) and -1 as 0. Every column holds m/2 ones and any two columns m/4 in common, so
    each factor is estimated with the whole design's precision. n >= 1."""
    if n < 1:
        raise ValueError(f"a design needs at least one factor, got {n}")
    h = np.ones((1, 1), dtype=int)
    while h.shape[0] <= n:
        h = np.block([[h, h], [h, -h]])
    return ((h[:, 1 : n + 1] + 1) // 2).astype(float)


def fit_savings(
    rows: np.ndarray, savings: Sequence[float], ses: Sequence[float]
) -> tuple[np.ndarray, np.ndarray]:
    """Each factor's saving and its standard error: weighted least squares through 0 of the
    trials' savings (fractions of the step's energy) on their rows, each weighted by 1 / its
    standard error squared; the errors from the weights alone (the trials' errors are known:
    the job's noise). Factors no trial moved read NaN."""
    x = np.asarray(rows, dtype=float)
    y = np.asarray(savings, dtype=float)
    s = np.asarray(ses, dtype=float)
    keep = np.isfinite(y) & np.isfinite(s) & (s > 0)
    x, y, s = x[keep], y[keep], s[keep]
    n = rows.shape[1] if rows.ndim == 2 else 0
    if x.shape[0] == 0:
        return np.full(n, math.nan), np.full(n, math.inf)
    w = 1.0 / s**2
    xtwx = x.T @ (x * w[:, None])
    cov = np.linalg.pinv(xtwx)
    effects = cov @ (x.T @ (w * y))
    se = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    moved = x.sum(axis=0) > 0
    effects[~moved], se[~moved] = math.nan, math.inf
    return effects, se


def choose(
    savings: Sequence[float], ses: Sequence[float], extra_s: Sequence[float], allowance_s: float, z: float
) -> list[int]:
    """The factors to move together: those saving more than z standard errors, the largest
    saving per second of extra time first (a factor that adds no time first of all), while
    their extra time adds up to at most allowance_s (s per step)."""
    ranked = []
    for g, (saving, se, extra) in enumerate(zip(savings, ses, extra_s)):
        if math.isfinite(saving) and math.isfinite(extra) and saving > z * se and saving > 0.0:
            ranked.append((-saving / extra if extra > 0 else -math.inf, -saving, g, max(extra, 0.0)))
    chosen, spent_s = [], 0.0
    for _, _, g, extra in sorted(ranked):
        if spent_s + extra <= allowance_s:
            chosen.append(g)
            spent_s += extra
    return sorted(chosen)


def pool_savings(
    savings: Sequence[float],
    ses: Sequence[float],
    times_s: Sequence[float],
    extra_s: Sequence[float],
    kinds: Sequence[object],
    history: Sequence[tuple[object, float, float, float, float]] = (),
) -> tuple[np.ndarray, np.ndarray]:
    """Each factor's saving pooled with what the factors of its kind show together.

    The factors of one kind (moved to one corner pair) follow one relation, the energy the
    lowered clock saves over the group's time less what its extra time costs at the step's
    power: saving = a * time - b * extra time, (a, b) fitted by weighted least squares over
    every estimate of that kind (this design's and `history`'s, each weighted by 1 / its
    error squared). A factor's own estimate is then averaged with the relation's prediction
    for it, each weighted by its precision: the prediction's variance is the fit's own plus
    the spread of the factors about the relation beyond their errors, in proportion to their
    time (the method of moments; none when the estimates scatter no more than their errors).
    A kind with fewer than 3 estimates keeps its factors' own estimates.

    Args:
        savings, ses: each factor's fitted saving and its standard error (fit_savings).
        times_s: each factor's time per step under the incumbent, s.
        extra_s: each factor's extra time at its candidate, s per step.
        kinds: each factor's kind (its candidate pair).
        history: (kind, time s, extra s, saving, error) of earlier designs' factors.
    Returns:
        (savings, errors), the pooled ones.
    """
    s = np.asarray(savings, dtype=float)
    e = np.asarray(ses, dtype=float)
    pooled_s, pooled_e = s.copy(), e.copy()
    points = [
        (k, float(t), float(x), float(v), float(se))
        for k, t, x, v, se in [*zip(kinds, times_s, extra_s, s, e), *history]
        if math.isfinite(v) and math.isfinite(se) and se > 0 and math.isfinite(t) and math.isfinite(x)
    ]
    for kind in dict.fromkeys(kinds):
        mine = [p for p in points if p[0] == kind]
        if len(mine) < 3:
            continue
        x = np.array([[t, -xs] for _, t, xs, _, _ in mine])
        y = np.array([v for *_, v, _ in mine])
        w = 1.0 / np.array([se for *_, se in mine]) ** 2
        cov = np.linalg.pinv(x.T @ (x * w[:, None]))
        beta = cov @ (x.T @ (w * y))
        resid = y - x @ beta
        t2 = float(np.sum(x[:, 0] ** 2))
        spread = max(float(np.sum(resid**2 - 1.0 / w)), 0.0) / t2 if t2 > 0 else 0.0
        for g, k in enumerate(kinds):
            if k != kind or not (math.isfinite(s[g]) and math.isfinite(e[g]) and e[g] > 0):
                continue
            row = np.array([float(times_s[g]), -float(extra_s[g])])
            mean = float(row @ beta)
            var = float(row @ cov @ row) + spread * float(times_s[g]) ** 2
            if var <= 0.0:
                pooled_s[g], pooled_e[g] = mean, 0.0
                continue
            precision = 1.0 / var + 1.0 / e[g] ** 2
            pooled_s[g] = (mean / var + s[g] / e[g] ** 2) / precision
            pooled_e[g] = math.sqrt(1.0 / precision)
    return pooled_s, pooled_e


def kinds_of(responses: np.ndarray, max_kinds: int) -> list[list[int]]:
    """Groups clustered by how their times follow the clocks (one row a group, one column an
    elasticity: the share of its time that follows a clock, lowered or raised): average-linkage agglomeration of the Euclidean distances until at most
    max_kinds clusters are left. Groups with a NaN response are left out. Each kind is its
    groups in order; the kinds in order of their first group.

    Args:
        responses: (groups, elasticities), fractions.
        max_kinds: most kinds returned (>= 1).
    """
    x = np.asarray(responses, dtype=float)
    if x.ndim != 2 or max_kinds < 1:
        return []
    clusters = [[g] for g in range(x.shape[0]) if np.all(np.isfinite(x[g]))]
    while len(clusters) > max_kinds:
        best = (math.inf, 0, 1)
        for i in range(len(clusters)):
            for j in range(i + 1, len(clusters)):
                d = float(np.mean([np.linalg.norm(x[a] - x[b]) for a in clusters[i] for b in clusters[j]]))
                if d < best[0]:
                    best = (d, i, j)
        _, i, j = best
        clusters[i] = sorted(clusters[i] + clusters[j])
        del clusters[j]
    return sorted(clusters, key=lambda c: c[0])


def trade_clocks(
    down_times_s: Sequence[float],
    down_elasticity: Sequence[float],
    down_mhz: Sequence[float],
    up_times_s: Sequence[float],
    up_elasticity: Sequence[float],
    up_mhz: Sequence[float],
    up_ladders_mhz: Sequence[Sequence[float]],
    down_to_mhz: Sequence[float],
) -> list[float] | None:
    """The clocks of a time-neutral trade's raised groups: each group of the raised kind moved up
    its own ladder by the same number of steps, the fewest whose time given back (each group's
    time taken as t * (1 - e + e * f / f'), e its elasticity) covers the extra time of the
    lowered groups at down_to_mhz. None where the lowered groups add no time (nothing to trade
    for) or the raised ones cannot give back enough below their ladders' tops.

    Args:
        down_times_s, down_elasticity, down_mhz: the lowered groups' times per step (s),
            elasticities and clocks now (MHz).
        up_times_s, up_elasticity, up_mhz: the raised groups' alike.
        up_ladders_mhz: each raised group's supported clocks (MHz).
        down_to_mhz: the lowered groups' clocks in the trade (MHz).
    """
    extra_s = sum(
        t * e * (f / f2 - 1.0) for t, e, f, f2 in zip(down_times_s, down_elasticity, down_mhz, down_to_mhz)
    )
    if not extra_s > 0.0:
        return None
    ladders = [sorted(c for c in ladder if c > f) for ladder, f in zip(up_ladders_mhz, up_mhz)]
    for k in range(1, max((len(lad) for lad in ladders), default=0) + 1):
        clocks = [lad[min(k, len(lad)) - 1] if lad else f for lad, f in zip(ladders, up_mhz)]
        back_s = sum(t * e * (1.0 - f / f2) for t, e, f, f2 in zip(up_times_s, up_elasticity, up_mhz, clocks))
        if back_s >= extra_s:
            return [float(c) for c in clocks]
    return None
