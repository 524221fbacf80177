"""The simulated GPU holds to simulator.md: physics shapes, the H200 probe, measurement."""

from pathlib import Path

import numpy as np
import pytest

from kdvfs.runtime.device import RunnableDevice
from kdvfs.runtime.measure import measure_isolated
from kdvfs.runtime.simulator import SimulatedDevice, idle_power_w
from kdvfs.runtime.types import ClockPair, KdvfsError, Kernel
from kdvfs.runtime.workloads import gpt3_xl_layer

PROBE = Path(__file__).resolve().parents[2] / "data" / "h200-probe" / "kernels_stock.csv"
GEMM = Kernel("gemm", flops=2 * 4096**3, bytes_moved=3 * 4096**2 * 2, tensor_core=True)
STREAM = Kernel("stream", flops=1e6, bytes_moved=512e6)


def test_is_a_runnable_device_with_the_papers_grid():
    dev = SimulatedDevice("rtx3080ti")
    assert isinstance(dev, RunnableDevice)
    assert len(dev.grid) == 50
    assert dev.grid.core_levels_mhz == tuple(range(210, 2101, 210))
    assert dev.grid.mem_levels_mhz == (405, 810, 5001, 9251, 9501)
    assert len(SimulatedDevice("rtx3080ti", full_grid=True).grid) == 127 * 5
    assert len(SimulatedDevice("h200").grid) == 220


def test_unknown_preset_and_unsupported_pair_are_clear_errors():
    with pytest.raises(KdvfsError, match="unknown simulated GPU preset 'v100'"):
        SimulatedDevice("v100")
    with pytest.raises(KdvfsError, match="unsupported clock pair 1111/9501"):
        SimulatedDevice("rtx3080ti").set_clocks(ClockPair(1111, 9501))


@pytest.mark.parametrize("preset", ["rtx3080ti", "h200", "a100", "h100"])
def test_energy_against_core_clock_is_u_shaped(preset):
    dev = SimulatedDevice(preset, noise=0, full_grid=True)
    mem = max(dev.grid.mem_levels_mhz)
    cores = dev.grid.core_levels_mhz
    energy = np.array([dev.expected(GEMM, ClockPair(c, mem))[1] for c in cores])
    best = int(np.argmin(energy))
    assert 0 < best < len(cores) - 1, "minimum must be interior"
    assert energy[0] > 1.2 * energy[best] and energy[-1] > 1.05 * energy[best]


def test_memory_bound_kernels_lose_little_time_at_lower_core_clock():
    dev = SimulatedDevice("rtx3080ti", noise=0)
    t_max, e_max = dev.expected(STREAM, ClockPair(2100, 9501))
    t_low, e_low = dev.expected(STREAM, ClockPair(1260, 9501))
    assert t_low / t_max - 1 < 0.01
    assert e_low < 0.8 * e_max
    # a compute-bound kernel does lose time (below the cap, where the lock holds)
    assert dev.expected(GEMM, ClockPair(840, 9501))[0] > 1.4 * dev.expected(GEMM, ClockPair(1260, 9501))[0]
    assert dev.point(GEMM, ClockPair(2100, 9501)).capped
    # and loses little from a lower memory clock, unlike the streaming kernel
    assert dev.expected(GEMM, ClockPair(2100, 5001))[0] < 1.03 * dev.expected(GEMM, ClockPair(2100, 9501))[0]
    assert dev.expected(STREAM, ClockPair(2100, 5001))[0] > 1.6 * t_max


def test_h200_auto_mode_matches_the_probe():
    from kdvfs.tuner.calibration import calibrate

    rows = {r.kernel: r for r in calibrate(SimulatedDevice("h200", noise=0), PROBE)}
    gemm = rows["gemm_bf16_8192"]
    assert gemm.capped and abs(gemm.simulated_power_w - 700) < 15
    assert gemm.simulated_sm_mhz < 1700
    for name in ("layernorm_8k_x_2048", "copy_256MiB"):
        assert rows[name].simulated_sm_mhz > 1900
        assert 540 <= rows[name].simulated_power_w <= 720  # the ladder's copies drew 508-610 W
    for r in rows.values():
        assert abs(r.rel_error("power_w")) < 0.15, r


def test_h200_idle_power_in_the_probes_range():
    dev = SimulatedDevice("h200")
    assert 70 <= idle_power_w(dev.preset, 345, 3201, 37) <= 100
    assert 100 <= idle_power_w(dev.preset, 1980, 3201, 55) <= 145


def test_power_cap_and_temperature_change_the_answer():
    dev = SimulatedDevice("h200", noise=0)
    t_700, _ = dev.expected(GEMM, None)
    dev.set_power_cap_w(500)
    t_500, _e_500 = dev.expected(GEMM, None)
    assert t_500 > 1.1 * t_700
    assert dev.point(GEMM, None).power_w <= 500 + 1e-6
    hot = SimulatedDevice("h200", noise=0, ambient_c=45)
    assert hot.expected(STREAM, None)[1] > SimulatedDevice("h200", noise=0).expected(STREAM, None)[1]


def test_temperature_follows_power_and_throttles():
    dev = SimulatedDevice("h200", noise=0, ambient_c=70)
    dev.set_clocks(ClockPair(1980, 3201))
    dev.run(GEMM, 40_000)  # ~ 60 s of a capped GEMM at a hot inlet
    assert dev.temperature_c() > dev.preset.t_limit_c
    assert "hw_thermal" in dev.throttle_reasons() and "sw_power_cap" in dev.throttle_reasons()


def test_energy_counter_advances_in_steps():
    dev = SimulatedDevice("h200")
    dev.run(STREAM, 1)
    assert dev.energy_j() == 0.0 < dev.true_energy_j()
    dev.idle(0.1)
    e = dev.energy_j()
    assert e > 0
    dev.idle(0.05)
    assert dev.energy_j() == e


def test_clock_switch_takes_effect_after_latency():
    dev = SimulatedDevice("rtx3080ti", noise=0)
    dev.set_clocks(ClockPair(2100, 9501))
    dev.idle(0.1)
    dev.set_clocks(ClockPair(420, 9501))
    t_fast = dev.expected(GEMM, ClockPair(2100, 9501))[0]
    dev.run(GEMM, 1)
    assert dev.clocks_in_effect() == ClockPair(2100, 9501)  # old clocks still running
    dev.idle(dev.switch_latency_s)
    dev.run(GEMM, 1)
    assert dev.clocks_in_effect() == ClockPair(420, 9501)
    assert SimulatedDevice("rtx3080ti-fastswitch").switch_latency_s < 1e-3 < dev.switch_latency_s
    assert t_fast > 0


def test_isolated_measurement_is_accurate_and_noisy_like_a_card():
    quiet = SimulatedDevice("rtx3080ti", noise=0)
    res = measure_isolated(quiet, GEMM, ClockPair(1470, 9501))
    t, e = quiet.expected(GEMM, ClockPair(1470, 9501))
    assert res.measurement.source == "simulated"
    assert res.measurement.time_s == pytest.approx(t, rel=0.02)  # warmed card, not the noiseless temperature
    assert res.measurement.energy_j == pytest.approx(e, rel=0.03)
    assert 1.0 <= res.cost_s < 1.5
    noisy = SimulatedDevice("rtx3080ti", seed=1)
    energies = [measure_isolated(noisy, GEMM, ClockPair(1470, 9501)).measurement.energy_j for _ in range(8)]
    spread = np.std(energies) / np.mean(energies)
    assert 0.003 < spread < 0.05


def test_same_seed_same_results():
    def trace(seed):
        dev = SimulatedDevice("h200", seed=seed)
        return [measure_isolated(dev, k, None).measurement for k in gpt3_xl_layer().kernels[:5]]

    assert trace(3) == trace(3)
    assert trace(3) != trace(4)


def test_idle_power_at_stock_is_the_lowest_core_clock_at_the_highest_memory_clock_as_idle_draws_it():
    dev = SimulatedDevice("rtx3080ti", noise=0)
    p = dev.preset
    stock_w = dev.idle_power_at(None)
    assert stock_w == idle_power_w(p, min(p.core_levels_mhz), p.max_mem_mhz, dev.temperature_c())
    assert dev.idle_power_at(None, 40.0) < stock_w  # cooler: less leakage
    dev.idle(0.5)
    assert dev.true_energy_j() == pytest.approx(0.5 * stock_w)


def test_a_lower_pair_idles_at_no_more_power_and_a_locked_top_pair_above_stock():
    dev = SimulatedDevice("h200", noise=0)
    for pair in dev.grid.pairs:
        for lower in dev.grid.pairs:
            if lower.core_mhz <= pair.core_mhz and lower.mem_mhz <= pair.mem_mhz:
                assert dev.idle_power_at(lower) <= dev.idle_power_at(pair)
    top = ClockPair(max(dev.grid.core_levels_mhz), max(dev.grid.mem_levels_mhz))
    assert dev.idle_power_at(top) > dev.idle_power_at(None) + 30.0


def test_a_steps_wait_adds_its_time_and_idle_energy_and_cools_the_card():
    dev = SimulatedDevice("rtx3080ti", noise=0)
    pair = ClockPair(1680, 9501)
    step = [(k, pair, k.launches) for k in gpt3_xl_layer().kernels]
    time_s, energy_j = dev.expected_step(step)
    wait = [(0.02, pair)]
    waited_s, waited_j = dev.expected_step(step, [wait])
    assert dev.steady_temperature_c(step, [wait]) < dev.steady_temperature_c(step) - 3.0
    # the wait's time, the kernels no slower for running cooler (their per-launch cap)
    assert time_s + 0.02 >= waited_s > 0.99 * (time_s + 0.02)
    idle_j = waited_j - energy_j  # the wait's idle, less the leakage the cooler kernels save
    assert 0.5 * 0.02 * dev.idle_power_at(pair) < idle_j < 0.02 * dev.idle_power_at(pair)
    assert dev.expected_step(step, [wait, wait]) == (waited_s, waited_j)  # a mean of equal waits


def test_a_wait_in_the_window_that_holds_the_steps_end_lets_a_capped_stock_step_run_faster():
    dev = SimulatedDevice("h200", noise=0)  # the cap held over 10-ms windows
    step = [(k, None, k.launches) for k in gpt3_xl_layer().kernels]
    time_s, _ = dev.expected_step(step)
    waited_s, _ = dev.expected_step(step, [[(0.003, None)]])
    rare_s, _ = dev.expected_step(step, rare_idle=[(0.003, None)])  # in windows of its own
    assert waited_s - 0.003 < time_s * 0.99
    assert rare_s - 0.003 == pytest.approx(time_s, rel=0.005)  # only cooler


def test_the_mean_sm_clock_reads_the_clock_a_lower_power_cap_holds_stock_to_and_a_locked_pair_below_it():
    from kdvfs.runtime.schedule import Schedule
    from kdvfs.runtime.steps import SimulatedJob

    dev = SimulatedDevice("rtx3080ti", noise=0.0)
    workload = gpt3_xl_layer()
    job = SimulatedJob(dev, workload)
    stock = Schedule(((0, None),))
    for _ in range(200):
        job.step(stock)
    at_350_w = dev.mean_sm_clock_mhz()
    dev.set_power_cap_w(250.0)
    for _ in range(200):
        job.step(stock)
    at_250_w = dev.mean_sm_clock_mhz()
    # the step's kernels run below the grid's top at the 350-W cap, and lower still at 250 W
    assert 1500 < at_350_w < 2100 and at_250_w < at_350_w - 200
    # a locked pair under what the cap allows runs at its own clock
    for _ in range(200):
        job.step(Schedule(((0, ClockPair(1050, 9501)),)))
    assert dev.mean_sm_clock_mhz() == pytest.approx(1050, abs=5)
