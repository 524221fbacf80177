"""The simulated card's power cap holds the mean over a window of milliseconds, not each launch."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kdvfs.runtime.presets import get_preset
from kdvfs.runtime.simulator import SimulatedDevice
from kdvfs.runtime.types import Kernel

GEMM = Kernel("gemm", flops=2 * 2048**3, tensor_core=True, kind="gemm")  # ~25 us, over the cap alone
SMALL = Kernel("small", bytes_moved=4 * 2**20, kind="elementwise")  # a few us, far under it


def card(window_s: float) -> SimulatedDevice:
    return SimulatedDevice(replace(get_preset("h200"), power_window_s=window_s), noise=0)


def test_a_short_power_spike_inside_the_window_is_not_capped():
    dev = card(0.010)
    alone = dev.point(GEMM, None)
    assert alone.capped  # run back to back, the GEMM alone is over the cap
    step = [(SMALL, None, 400), (GEMM, None, 1), (SMALL, None, 400)]  # one window, mean far under the cap
    time_s, energy_j = dev.expected_iteration(step)
    temp_c = dev.steady_temperature_c(step)
    assert energy_j / time_s < 0.8 * dev.power_cap_w
    gemm_s = time_s - 800 * dev.point(SMALL, None, temp_c).time_s
    assert (
        gemm_s < 0.9 * dev.point(GEMM, None, temp_c).time_s
    )  # at its full clock, not pulled down to the cap alone


def test_per_launch_capping_is_what_a_zero_window_gives():
    per_launch = card(0.0)
    step = [(SMALL, None, 400), (GEMM, None, 1), (SMALL, None, 400)]
    time_s, _ = per_launch.expected_iteration(step)
    temp_c = per_launch.steady_temperature_c(step)
    small_s = per_launch.point(SMALL, None, temp_c).time_s
    assert time_s - 800 * small_s == pytest.approx(per_launch.point(GEMM, None, temp_c).time_s, rel=1e-6)


def test_a_window_over_the_cap_is_held_at_the_cap_and_a_window_of_one_kernel_as_that_kernel():
    dev = card(0.010)
    heavy = [(GEMM, None, 300), (SMALL, None, 100)]  # mostly GEMM: the window's mean is over the cap
    time_s, energy_j = dev.expected_iteration(heavy)
    assert energy_j / time_s == pytest.approx(dev.power_cap_w, rel=0.01)
    only = dev.expected_iteration([(GEMM, None, 1000)])  # 25 ms of one kernel: windows of it alone
    temp_c = dev.steady_temperature_c([(GEMM, None, 1000)])
    op = dev.point(GEMM, None, temp_c)
    assert only[0] == pytest.approx(1000 * op.time_s, rel=1e-3)


def test_timed_runs_hold_the_windows_mean_at_the_cap_as_the_noiseless_figures_do():
    dev = card(0.010)
    step = [(SMALL, None, 20), (GEMM, None, 40), (SMALL, None, 20)]
    expected_s, expected_j = dev.expected_iteration(step)

    def run_steps(count: int) -> tuple[float, float]:
        start_s, start_j = dev.now_s(), dev.true_energy_j()
        for _ in range(count):
            for k, _pair, n in step:
                dev.run(k, n)
        return dev.now_s() - start_s, dev.true_energy_j() - start_j

    run_steps(20)  # the controller's first window: it has watched nothing yet, so nothing is capped
    time_s, energy_j = run_steps(200)
    assert energy_j / time_s <= 1.02 * dev.power_cap_w
    assert time_s / 200 == pytest.approx(expected_s, rel=0.03)
    assert energy_j / 200 == pytest.approx(expected_j, rel=0.03)


def test_after_a_window_of_idle_the_controller_lets_the_next_launch_boost():
    dev = card(0.010)
    dev.run(GEMM, 2000)  # ~50 ms of the GEMM alone: capped after the first window
    assert "sw_power_cap" in dev.throttle_reasons()
    dev.idle(0.030)
    dev.run(GEMM, 1)
    assert "sw_power_cap" not in dev.throttle_reasons()
    assert dev.sm_clock_mhz() == dev.preset.max_core_mhz
