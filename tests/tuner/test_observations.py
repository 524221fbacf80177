"""The observation table: plans from partial measurements, throttled pairs, the safety margin."""

import numpy as np
import pytest

from kdvfs.runtime.measure import StepReference
from kdvfs.runtime.simulator import SimulatedDevice
from kdvfs.runtime.types import ClockPair, Kernel, Measurement, Workload
from kdvfs.tuner.observations import Observations, measure_cell

PAIRS = (ClockPair(1000, 5000), ClockPair(2000, 5000))
WL = Workload("w", (Kernel("a"), Kernel("b", launches=2)))


def reference(times=(1.0, 2.0), rel_sd=0.0):
    t = np.array(times)
    return StepReference(t, float(t.sum()), 30.0, rel_sd, steps=10, all_steps=20, cost_s=5.0)


def m(t, e, throttled=False):
    return Measurement(t, e, "simulated", throttled)


def test_unexplored_kernels_stay_at_stock_and_launches_count():
    obs = Observations(WL, PAIRS, reference())
    obs.add(0, None, m(1.0, 10.0), 1.0)
    obs.add(0, PAIRS[0], m(1.005, 6.0), 1.0)
    assert obs.stock_time_s.tolist()[0] == 1.0 and np.isnan(obs.stock_time_s[1])
    assert obs.kernel_level_choice(0.01) == {"a": PAIRS[0], "b": None}
    assert obs.kernel_level_choice(0.0) == {"a": None, "b": None}
    obs.add(1, PAIRS[1], m(0.5, 1.0), 1.0)
    assert obs.time_s[1, 1] == 1.0  # two launches per step
    assert obs.measurements == 3 and obs.cost_s == 5.0 + 3.0


def test_reference_noise_sets_the_margin_and_repeats_average():
    quiet = Observations(WL, PAIRS, reference())
    assert quiet.time_limit_s(0.01) == pytest.approx(1.01 * 3.0)
    noisy = Observations(WL, PAIRS, reference(rel_sd=0.01))
    assert noisy.time_limit_s(0.01) == pytest.approx(1.01 * 3.0)  # nothing explored: no error
    noisy.add(1, PAIRS[0], m(1.0, 5.0), 0.0)  # kernel b (2 s) explored
    assert noisy.time_limit_s(0.01) == pytest.approx(1.01 * 3.0 - 2.0 * 0.01 * np.sqrt(2 * 4.0))
    noisy.add(0, PAIRS[0], m(1.0, 5.0), 0.0)
    assert noisy.time_limit_s(0.01) == pytest.approx(1.01 * 3.0 - 2.0 * 0.01 * np.sqrt(2 * 5.0))
    assert noisy.time_limit_s(0.001) < 3.0
    assert set(noisy.kernel_level_choice(0.001).values()) == {None}  # margin > budget: all stock
    quiet.add(0, PAIRS[1], m(0.9, 8.0), 0.0)
    quiet.add(0, PAIRS[1], m(1.1, 12.0), 0.0)
    assert quiet.time_s[0, 1] == pytest.approx(1.0) and quiet.energy_j[0, 1] == pytest.approx(10.0)


def test_throttled_pair_is_planned_by_its_ratio_to_a_paired_stock_measurement():
    obs = Observations(WL, PAIRS, reference())
    obs.add(0, None, m(0.97, 10.0), 0.0)
    obs.add(1, None, m(1.0, 10.0), 0.0)
    # measured cool: 0.98 s looks 2% faster than training's 1.0 s, but stock measured right
    # after it took 0.96 s, so in training it runs 2% slower than the reference
    obs.add_paired(0, PAIRS[1], m(0.98, 9.0, throttled=True), m(0.96, 9.6), 2.0)
    time_s, energy_j = obs.plannable()
    assert time_s[0, 1] == pytest.approx(0.98 / 0.96)
    assert energy_j[0, 1] == pytest.approx(10.0 * 9.0 / 9.6)
    # +0.021 s on a 3 s step: over a 0.5% budget (raw, 0.98 s, it would have fitted)
    assert obs.kernel_level_choice(0.005)["a"] is None
    assert obs.kernel_level_choice(0.01)["a"] == PAIRS[1]
    assert obs.measurements == 4 and obs.throttled == 1


def test_measure_cell_pairs_a_throttled_measurement_with_stock():
    dev = SimulatedDevice("h200", noise=0)
    gemm = Kernel("gemm", flops=2 * 8192**3, bytes_moved=3 * 8192**2 * 2, tensor_core=True)
    obs = Observations(
        Workload("g", (gemm,)), (ClockPair(1980, 3201), ClockPair(1005, 3201)), reference((1.7e-3,))
    )
    measure_cell(dev, obs, 0, None, 0.3)
    measure_cell(dev, obs, 0, ClockPair(1980, 3201), 0.3)  # over the 700 W cap: throttles
    measure_cell(dev, obs, 0, ClockPair(1005, 3201), 0.3)  # holds
    assert obs.throttled == 1 and obs.measurements == 4
    assert not np.isnan(obs.paired_ratio[0, 0, 0]) and np.isnan(obs.paired_ratio[0, 1, 0])


def _real_card_table(stock_j: float, pair_j: float, repeat_j: float) -> Observations:
    """Both kernels measured at stock, at PAIRS[0] and at stock again, on a real card whose
    replayed reference is noisy (6% between its sub-windows, as the H200's dry-run sweep)."""
    obs = Observations(WL, PAIRS, reference(rel_sd=0.06))
    obs.on_real_card = True
    for k, launches in enumerate((1, 2)):
        base_s = (1.0, 1.0)[k]
        obs.add(k, None, m(base_s, stock_j / launches), 1.0)
        obs.add(k, PAIRS[0], m(base_s * 1.001, pair_j / launches), 1.0)
        obs.add_stock_repeat(k, m(base_s * 1.0005, repeat_j / launches), 1.0)
    return obs


def test_on_a_real_card_the_time_limit_comes_from_the_a_a_pairs_not_the_replayed_reference():
    obs = _real_card_table(10.0, 7.0, 10.05)
    assert obs.null_sd("time") == pytest.approx(0.0005 / 1.00025 / np.sqrt(2), rel=1e-3)
    assert obs.time_limit_s(0.01) > 3.0  # a 6% reference noise alone would leave no budget
    obs.on_real_card = False
    assert obs.time_limit_s(0.01) < 3.0


def test_on_a_real_card_a_pair_is_planned_only_beyond_the_a_a_noise():
    assert _real_card_table(10.0, 7.0, 10.05).kernel_level_choice(0.01) == {"a": PAIRS[0], "b": PAIRS[0]}
    # a 3% "saving" against a stock that repeats within 4%: noise, stock stays
    assert _real_card_table(10.0, 9.7, 10.4).kernel_level_choice(0.01) == {"a": None, "b": None}


def test_when_the_a_a_noise_leaves_no_time_budget_every_plan_is_stock_even_a_pair_that_looked_faster():
    from kdvfs.tuner.sweep import measured_realisable, pass_level_choice

    obs = Observations(WL, PAIRS, reference())
    obs.on_real_card = True
    for k in range(2):  # stock twice 10% apart in time (noise), the pair 25% faster and half the energy
        obs.add(k, None, m(1.0, 10.0), 1.0)
        obs.add(k, PAIRS[0], m(0.75, 5.0), 1.0)
        obs.add(k, PAIRS[1], m(1.0, 10.0), 1.0)
        obs.add_stock_repeat(k, m(1.1, 10.0), 1.0)
    assert obs.no_time_budget(0.01)
    assert obs.kernel_level_choice(0.01) == {"a": None, "b": None}
    assert set(pass_level_choice(obs, 0.01).values()) == {None}
    plan = measured_realisable(obs, 0.01, switch_latency_s=0.0)
    assert plan.schedule.groups == ((0, None),) and plan.energy_saving == 0.0
