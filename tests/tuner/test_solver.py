"""The budget solver against brute force, its dual bound, and its edge cases."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from kdvfs.runtime.types import KdvfsError
from kdvfs.tuner.solver import pass_level, solve_budget


def brute_force(times, energies, limit):
    """Least energy over every choice within the limit: (energy, choice) or None."""
    best = None
    for choice in itertools.product(*(range(len(t)) for t in times)):
        t = sum(times[k][c] for k, c in enumerate(choice))
        e = sum(energies[k][c] for k, c in enumerate(choice))
        if np.isfinite(t + e) and t <= limit + 1e-12 and (best is None or e < best[0]):
            best = (e, choice)
    return best


def random_items(rng, items, options, integer=False):
    if integer:
        times = [rng.integers(1, 10, options).astype(float) for _ in range(items)]
    else:
        times = [rng.uniform(1.0, 3.0, options) for _ in range(items)]
    energies = [rng.uniform(1.0, 5.0, options) for _ in range(items)]
    return times, energies


@pytest.mark.parametrize("seed", range(20))
def test_exact_when_times_fall_on_the_slack_grid(seed):
    rng = np.random.default_rng(seed)
    times, energies = random_items(rng, 5, 4, integer=True)
    slack = int(rng.integers(1, 12))
    limit = sum(t.min() for t in times) + slack
    solution = solve_budget(times, energies, limit, resolution=slack)
    expected_j, _ = brute_force(times, energies, limit)
    assert solution.feasible
    assert solution.energy_j == pytest.approx(expected_j, abs=1e-9)
    assert solution.time_s <= limit


@pytest.mark.parametrize("seed", range(20))
def test_feasible_and_bracketed_by_the_dual_bound(seed):
    rng = np.random.default_rng(100 + seed)
    times, energies = random_items(rng, 6, 4)
    fastest = sum(t.min() for t in times)
    limit = fastest + rng.uniform(0.0, 1.0) * (sum(t.max() for t in times) - fastest)
    solution = solve_budget(times, energies, limit, resolution=500)
    optimum_j, _ = brute_force(times, energies, limit)
    assert solution.time_s <= limit
    assert solution.dual_bound_j <= optimum_j + 1e-9 <= solution.energy_j + 2e-9
    assert solution.gap == pytest.approx((solution.energy_j - solution.dual_bound_j) / solution.energy_j)
    assert solution.energy_j <= optimum_j * 1.03
    chosen_t = sum(times[k][c] for k, c in enumerate(solution.choice))
    chosen_e = sum(energies[k][c] for k, c in enumerate(solution.choice))
    assert (chosen_t, chosen_e) == pytest.approx((solution.time_s, solution.energy_j))


def test_unconstrained_takes_the_least_energy_of_each_item_with_no_gap():
    rng = np.random.default_rng(7)
    times, energies = random_items(rng, 8, 5)
    solution = solve_budget(times, energies, math.inf)
    assert solution.choice == tuple(int(np.argmin(e)) for e in energies)
    assert solution.gap == pytest.approx(0.0, abs=1e-12)


def test_unavailable_options_are_never_chosen():
    times = [np.array([1.0, 2.0, np.nan]), np.array([1.0, 1.5, 3.0])]
    energies = [np.array([5.0, 4.0, 0.1]), np.array([3.0, np.nan, 1.0])]
    solution = solve_budget(times, energies, 10.0)
    assert solution.choice == (1, 2)
    assert solution.energy_j == pytest.approx(5.0)


def test_a_limit_below_the_fastest_plan_returns_the_fastest_infeasible():
    times = [np.array([1.0, 2.0]), np.array([3.0, 1.0])]
    energies = [np.array([5.0, 1.0]), np.array([1.0, 5.0])]
    solution = solve_budget(times, energies, 1.5)
    assert not solution.feasible
    assert solution.choice == (0, 1)
    assert solution.time_s == pytest.approx(2.0)
    assert math.isnan(solution.dual_bound_j) and math.isnan(solution.gap)


def test_zero_slack_keeps_every_item_at_its_fastest():
    times = [np.array([1.0, 2.0]), np.array([2.0, 1.0])]
    energies = [np.array([5.0, 1.0]), np.array([1.0, 5.0])]
    solution = solve_budget(times, energies, 2.0)
    assert solution.feasible and solution.choice == (0, 1)


def test_bad_input_is_a_one_line_error():
    with pytest.raises(KdvfsError, match="item 1: no available option"):
        solve_budget([np.ones(2), np.full(2, np.nan)], [np.ones(2), np.ones(2)], 5.0)
    with pytest.raises(KdvfsError, match="2 time rows but 1 energy rows"):
        solve_budget([np.ones(2), np.ones(2)], [np.ones(2)], 5.0)
    with pytest.raises(KdvfsError, match="item 0: negative"):
        solve_budget([np.array([-1.0, 1.0])], [np.ones(2)], 5.0)


def test_pass_level_picks_one_option_per_pass():
    rng = np.random.default_rng(3)
    times, energies = random_items(rng, 6, 3)
    passes = ["forward", "forward", "backward", "backward", "backward", "optimizer"]
    limit = 0.5 * (sum(t.min() for t in times) + sum(t.max() for t in times))
    choice, solution = pass_level(times, energies, passes, limit)
    assert list(choice) == ["forward", "backward", "optimizer"]
    names = list(choice)
    pass_t = [sum(t for t, p in zip(times, passes) if p == name) for name in names]
    pass_e = [sum(e for e, p in zip(energies, passes) if p == name) for name in names]
    optimum_j, best = brute_force(pass_t, pass_e, limit)
    assert solution.energy_j == pytest.approx(optimum_j)
    assert tuple(choice.values()) == best


def test_pass_level_drops_a_pair_any_kernel_of_the_pass_lacks():
    times = [np.array([1.0, 2.0]), np.array([1.0, np.nan])]
    energies = [np.array([3.0, 1.0]), np.array([3.0, 1.0])]
    choice, _ = pass_level(times, energies, ["forward", "forward"], 100.0)
    assert choice == {"forward": 0}


def test_a_full_grid_plan_solves_quickly():
    rng = np.random.default_rng(0)
    t = rng.uniform(1e-5, 2e-3, (111, 1)) * np.linspace(2, 1, 220) * rng.uniform(0.9, 1.1, (111, 220))
    e = t * rng.uniform(200, 400, (111, 220)) * np.linspace(0.6, 1.0, 220) ** 2
    solution = solve_budget(list(t), list(e), 1.01 * t[:, -1].sum())
    assert solution.feasible and solution.gap < 0.01
