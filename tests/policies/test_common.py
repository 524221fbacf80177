"""Shared bookkeeping and grid facts: logs, best(), monotone pruning, design, cap, timing."""

import numpy as np
import pytest

# steps_since_improvement, the convergence count the strategies share, is tested directly: its
# edge cases (seeded configs, several rates) are hard to reach through a strategy
from kdvfs.policies import (
    GridFacts,
    RandomStrategy,
    SearchSpace,
    SweepStrategy,
    Task,
    TaskLog,
    steps_since_improvement,
)
from tests.policies.synthetic import SMALL_CORE_MHZ, SMALL_MEM_MHZ, grid_space

SPACE = grid_space(SMALL_CORE_MHZ, SMALL_MEM_MHZ)
TASK = Task("k", ref_time_s=1.0, ref_energy_j=10.0, budget=0.05)


def index(core_mhz: int, mem_mhz: int) -> int:
    return int(np.flatnonzero((SPACE.configs_mhz == (core_mhz, mem_mhz)).all(axis=1))[0])


def test_reference_is_seeded_and_not_counted():
    policy = SweepStrategy(SPACE, seed=0)
    log = policy.log(TASK)
    assert log.measured[SPACE.reference] and log.measured.sum() == 1
    assert policy.measurements(TASK) == 0
    assert policy.best(TASK) == SPACE.reference


def test_best_is_least_energy_within_budget_using_means():
    policy = SweepStrategy(SPACE, seed=0)
    policy.tell(TASK, 0, 1.04, 8.0)
    policy.tell(TASK, 1, 1.06, 5.0)  # least energy but over budget
    policy.tell(TASK, 2, 1.00, 9.0)
    assert policy.best(TASK) == 0
    policy.tell(TASK, 0, 1.08, 8.0)  # mean time of config 0 becomes 1.06: over budget
    assert policy.best(TASK) == 2


def test_best_is_none_when_nothing_within_budget():
    space = SearchSpace(SPACE.configs_mhz, reference=None)
    policy = SweepStrategy(space, seed=0)
    assert policy.best(TASK) is None
    policy.tell(TASK, 3, 2.0, 1.0)
    assert policy.best(TASK) is None


def test_known_infeasible_covers_every_config_no_faster():
    facts = GridFacts(SPACE)
    log = TaskLog.empty(len(SPACE))
    log.add(index(1520, 7000), 1.2, 9.0)  # over budget
    blocked = facts.known_infeasible(log, TASK)
    cfg = SPACE.configs_mhz
    expected = (cfg[:, 0] <= 1520) & (cfg[:, 1] <= 7000)
    assert np.array_equal(blocked, expected)


def test_time_bounds_follow_monotonicity_and_clock_ratios():
    facts = GridFacts(SPACE)
    log = TaskLog.empty(len(SPACE))
    log.add(index(2000, 9000), 1.0, 10.0)
    log.add(index(1520, 9000), 1.1, 8.0)
    lower, upper = facts.log_time_bounds(log, TASK)
    # Below 1520 MHz at any memory clock: at least as slow as the 1520/9000 measurement.
    assert lower[index(1040, 5000)] == pytest.approx(np.log(1.1))
    # At 2000/7000: no faster than the top, at most 9000/7000 times slower.
    assert lower[index(2000, 7000)] == 0.0
    assert upper[index(2000, 7000)] == pytest.approx(np.log(9000 / 7000))


def test_design_steps_down_each_clock_and_skips_deeper_steps_after_a_slow_one():
    facts = GridFacts(SPACE)
    top, mem_step, core_step = index(2000, 9000), index(2000, 7000), index(1280, 9000)
    assert facts.design[:3] == [top, mem_step, core_step]
    log = TaskLog.empty(len(SPACE))
    log.add(top, 1.0, 10.0)
    log.add(mem_step, 1.0, 9.0)
    log.add(core_step, 1.5, 9.0)  # compute-bound: the deeper core step is known too slow
    assert facts.next_design(log, TASK) == index(2000, 5000)
    log.add(index(2000, 5000), 1.0, 8.5)
    assert facts.next_design(log, TASK) is None


def test_steps_since_improvement_counts_from_the_last_real_gain():
    log = TaskLog.empty(len(SPACE))
    log.add(0, 1.0, 10.0)
    log.order.clear()  # a seeded reference
    for config, energy in [(1, 9.0), (2, 8.999), (3, 12.0)]:
        log.add(config, 1.0, energy)
    assert steps_since_improvement(log, TASK, tol=0.002, relative_rates=np.zeros(1)) == 2


def test_sweep_goes_in_order_and_stops_after_every_config():
    policy = SweepStrategy(SPACE, seed=0)
    asked = []
    while (config := policy.ask(TASK)) is not None:
        asked.append(config)
        policy.tell(TASK, config, 1.0, 1.0)
    assert asked == [c for c in range(len(SPACE)) if c != SPACE.reference]
    assert len(policy.ask_cpu_s) == len(asked) + 1


def test_random_is_reproducible_per_seed_and_task_and_respects_the_cap():
    def order(seed: int, key: str) -> list[int]:
        policy = RandomStrategy(SPACE, seed=seed, max_per_task=6)
        task = Task(key, 1.0, 10.0, 0.05)
        asked = []
        while (config := policy.ask(task)) is not None:
            asked.append(config)
            policy.tell(task, config, 1.0, 1.0)
        return asked

    assert order(1, "a") == order(1, "a")
    assert len(order(1, "a")) == 6
    assert order(1, "a") != order(2, "a") or order(1, "a") != order(1, "b")


def test_tell_rejects_a_config_outside_the_space():
    with pytest.raises(IndexError, match="outside the search space"):
        SweepStrategy(SPACE, seed=0).tell(TASK, len(SPACE), 1.0, 1.0)
