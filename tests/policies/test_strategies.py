"""Every strategy on the small synthetic grid: finds the constrained optimum (at exchange rates
too: least energy + rate x time), never reports a config over budget, never re-measures, stays
away from configs known too slow, looks again when the rates change."""

import numpy as np
import pytest

from kdvfs.policies.base import SearchSpace, Strategy, Task
from kdvfs.policies.registry import STRATEGIES, make_strategy
from tests.policies.synthetic import (
    KINDS,
    SMALL_CORE_MHZ,
    SMALL_MEM_MHZ,
    grid_space,
    optimum,
    run,
    table,
    task_for,
)

SPACE = grid_space(SMALL_CORE_MHZ, SMALL_MEM_MHZ)
SAFE = [name for name in STRATEGIES if name not in ("sweep", "random")]


def test_registry_names_and_protocol():
    assert list(STRATEGIES) == ["sweep", "random", "egreedy", "ucb", "thompson", "botorch", "crosskernel"]
    for name in STRATEGIES:
        policy = make_strategy(name, SPACE, seed=0)
        assert isinstance(policy, Strategy) and policy.name == name
    with pytest.raises(ValueError, match="unknown strategy 'bogus'"):
        make_strategy("bogus", SPACE, seed=0)


@pytest.mark.parametrize("name", list(STRATEGIES))
@pytest.mark.parametrize("kind", list(KINDS))
def test_finds_the_constrained_optimum(name, kind):
    time_s, energy_j = table(KINDS[kind], SPACE)
    task = task_for(kind, KINDS[kind], SPACE, budget=0.05)
    policy = make_strategy(name, SPACE, seed=0)
    asked = run(policy, task, time_s, energy_j)
    assert policy.best(task) == optimum(time_s, energy_j, task)
    assert policy.ask(task) is None  # converged stays converged
    assert len(policy.ask_cpu_s) == len(asked) + 2


def least_cost(time_s: np.ndarray, energy_j: np.ndarray, task: Task, rate_w: float) -> int:
    """The known optimum at an exchange rate: least energy + rate x time within budget."""
    ok = time_s <= (1.0 + task.budget) * task.ref_time_s
    return int(np.argmin(np.where(ok, energy_j + rate_w * time_s, np.inf)))


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_finds_the_least_cost_at_each_exchange_rate(name):
    """Rates around the power of the kernel: the optima at the lowest and highest rates differ
    (a compute-bound kernel trades time for energy); best() is the optimum at the middle rate
    and the optimum at every rate has been measured."""
    time_s, energy_j = table(KINDS["gemm"], SPACE)
    task = task_for("gemm", KINDS["gemm"], SPACE, budget=0.15)
    power_w = task.ref_energy_j / task.ref_time_s
    rates = (0.1 * power_w, 0.5 * power_w, 2.0 * power_w)
    optima = [least_cost(time_s, energy_j, task, r) for r in rates]
    assert optima[0] != optima[-1]
    policy = make_strategy(name, SPACE, seed=0)
    policy.exchange_rates_w = rates
    run(policy, task, time_s, energy_j)
    assert policy.best(task) == optima[1]
    assert all(policy.log(task).measured[o] for o in optima)


@pytest.mark.parametrize("name", SAFE)
def test_a_change_of_rates_reopens_a_converged_task(name):
    """Converged at a high rate (fast configs), a task is asked again at rate 0: the strategy
    finds (measures, unless it already has) the slower, thriftier config that least energy
    prefers, then converges again."""
    time_s, energy_j = table(KINDS["gemm"], SPACE)
    task = task_for("gemm", KINDS["gemm"], SPACE, budget=0.15)
    policy = make_strategy(name, SPACE, seed=0)
    policy.exchange_rates_w = (2.0 * task.ref_energy_j / task.ref_time_s,)
    run(policy, task, time_s, energy_j)
    assert policy.ask(task) is None
    assert policy.best(task) != optimum(time_s, energy_j, task)
    policy.exchange_rates_w = (0.0,)
    run(policy, task, time_s, energy_j)
    assert policy.best(task) == optimum(time_s, energy_j, task)
    assert policy.ask(task) is None


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_never_remeasures_never_reports_over_budget(name):
    """Noisy measurements on every kind, tasks interleaved; checked against what was told."""
    policy = make_strategy(name, SPACE, seed=3)
    rng = np.random.default_rng(3)
    tasks = {k: (task_for(k, kind, SPACE, budget=0.02), *table(kind, SPACE)) for k, kind in KINDS.items()}
    told: dict[str, list[tuple[int, float]]] = {k: [] for k in tasks}
    active = set(tasks)
    while active:
        for key in sorted(active):
            task, time_s, energy_j = tasks[key]
            config = policy.ask(task)
            if config is None:
                active.discard(key)
                continue
            assert config not in [c for c, _ in told[key]] and config != SPACE.reference
            measured_t = float(time_s[config] * (1 + 0.01 * rng.standard_normal()))
            told[key].append((config, measured_t))
            measured_e = float(energy_j[config] * (1 + 0.02 * rng.standard_normal()))
            policy.tell(task, config, measured_t, measured_e)
            best = policy.best(task)
            times = dict(told[key]) | {SPACE.reference: task.ref_time_s}
            assert best is not None and times[best] <= (1 + task.budget) * task.ref_time_s


@pytest.mark.parametrize("name", SAFE)
def test_safe_strategies_never_try_a_config_known_too_slow(name):
    """Known too slow: both clocks <= those of a config already measured over budget."""
    policy = make_strategy(name, SPACE, seed=0)
    cfg = SPACE.configs_mhz
    for kind in KINDS:
        time_s, energy_j = table(KINDS[kind], SPACE)
        task = task_for(kind, KINDS[kind], SPACE, budget=0.02)
        asked = run(policy, task, time_s, energy_j)
        for i, config in enumerate(asked):
            slow = [c for c in asked[:i] if time_s[c] > (1 + task.budget) * task.ref_time_s]
            assert not any((cfg[config] <= cfg[c]).all() for c in slow), (kind, asked)


@pytest.mark.parametrize("name", SAFE)
def test_auto_reference_off_the_grid(name):
    """Reference = the card's auto mode (no grid index): the top pair is measured first; a
    task whose reference beats every grid pair converges with nothing feasible."""
    space = SearchSpace(SPACE.configs_mhz, reference=None)
    time_s, energy_j = table(KINDS["norm"], space)
    top = int(np.argmin(time_s))
    policy = make_strategy(name, space, seed=0)
    task = Task("auto", float(time_s[top]) * 1.01, float(energy_j[top]) * 1.2, budget=0.05)
    asked = run(policy, task, time_s, energy_j)
    assert asked[0] == top
    assert policy.best(task) == optimum(time_s, energy_j, task)
    fast = Task("fast", float(time_s[top]) * 0.5, float(energy_j[top]), budget=0.05)
    asked = run(policy, fast, time_s, energy_j)
    assert policy.best(fast) is None
    if name == "crosskernel":  # a transfer starts where its kind predicts the least cost
        assert len(asked) <= 2 and asked[-1] == top
    else:
        assert asked == [top]


@pytest.mark.parametrize("name", SAFE)
def test_single_memory_clock(name):
    core = np.arange(600, 2001, 100)
    configs = np.column_stack([core, np.full(core.size, 2619)]).astype(float)
    space = SearchSpace(configs, reference=core.size - 1)
    time_s, energy_j = table(KINDS["mixed"], space)
    task = task_for("mixed", KINDS["mixed"], space, budget=0.1)
    policy = make_strategy(name, space, seed=0)
    run(policy, task, time_s, energy_j)
    assert policy.best(task) == optimum(time_s, energy_j, task)


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_max_per_task_caps_measurements(name):
    policy = make_strategy(name, SPACE, seed=0, max_per_task=2)
    time_s, energy_j = table(KINDS["norm"], SPACE)
    task = task_for("norm", KINDS["norm"], SPACE, budget=0.05)
    assert len(run(policy, task, time_s, energy_j)) == 2


@pytest.mark.parametrize("name", SAFE)
def test_model_based_strategies_on_a_wider_grid(name):
    """105 configs: the initial design alone does not reach the optima; the models must."""
    from tests.policies.test_botorch import WIDE, regret

    policy = make_strategy(name, WIDE, seed=0)
    counts, regrets = [], []
    for kind in KINDS:
        time_s, energy_j = table(KINDS[kind], WIDE)
        task = task_for(kind, KINDS[kind], WIDE, budget=0.05)
        counts.append(len(run(policy, task, time_s, energy_j)))
        regrets.append(regret(policy, task, time_s, energy_j))
    assert max(counts) <= len(WIDE) // 4, counts
    assert np.mean(regrets) < 0.005, regrets
