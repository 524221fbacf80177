"""The simulated card's power cap holds the mean over a window of milliseconds, not each launch."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kdvfs.runtime.presets import get_preset
from kdvfs.runtime.registry import open_workload
from kdvfs.runtime.schedule import Schedule, StepRunner
from kdvfs.runtime.simulator import SimulatedDevice
from kdvfs.runtime.steps import SimulatedJob
from kdvfs.runtime.types import ClockPair, Kernel
from kdvfs.runtime.workloads import gpt3_xl_layer

GEMM = Kernel("gemm", flops=2 * 2048**3, tensor_core=True, kind="gemm")  # ~25 us, over the cap alone
SMALL = Kernel("small", bytes_moved=4 * 2**20, kind="elementwise")  # a few us, far under it


def card(window_s: float) -> SimulatedDevice:
    return SimulatedDevice(replace(get_preset("h200"), power_window_s=window_s), noise=0)


def test_a_short_power_spike_inside_the_window_is_not_capped():
    dev = card(0.010)
    alone = dev.point(GEMM, None)
    assert alone.capped  # run back to back, the GEMM alone is over the cap
    step = [(SMALL, None, 400), (GEMM, None, 1), (SMALL, None, 400)]  # one window, mean far under the cap
    time_s, energy_j = dev.expected_step(step)
    temp_c = dev.steady_temperature_c(step)
    assert energy_j / time_s < 0.8 * dev.power_cap_w
    gemm_s = time_s - 800 * dev.point(SMALL, None, temp_c).time_s
    assert (
        gemm_s < 0.9 * dev.point(GEMM, None, temp_c).time_s
    )  # at its full clock, not pulled down to the cap alone


def test_per_launch_capping_is_what_a_zero_window_gives():
    per_launch = card(0.0)
    step = [(SMALL, None, 400), (GEMM, None, 1), (SMALL, None, 400)]
    time_s, _ = per_launch.expected_step(step)
    temp_c = per_launch.steady_temperature_c(step)
    small_s = per_launch.point(SMALL, None, temp_c).time_s
    assert time_s - 800 * small_s == pytest.approx(per_launch.point(GEMM, None, temp_c).time_s, rel=1e-6)


def test_a_window_over_the_cap_is_held_at_the_cap_and_a_window_of_one_kernel_as_that_kernel():
    dev = card(0.010)
    heavy = [(GEMM, None, 300), (SMALL, None, 100)]  # mostly GEMM: the window's mean is over the cap
    time_s, energy_j = dev.expected_step(heavy)
    assert energy_j / time_s == pytest.approx(dev.power_cap_w, rel=0.01)
    only = dev.expected_step([(GEMM, None, 1000)])  # 25 ms of one kernel: windows of it alone
    temp_c = dev.steady_temperature_c([(GEMM, None, 1000)])
    op = dev.point(GEMM, None, temp_c)
    assert only[0] == pytest.approx(1000 * op.time_s, rel=1e-3)


def test_timed_runs_hold_the_windows_mean_at_the_cap_as_the_noiseless_figures_do():
    dev = card(0.010)
    step = [(SMALL, None, 20), (GEMM, None, 40), (SMALL, None, 20)]
    expected_s, expected_j = dev.expected_step(step)

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


def test_a_whole_step_run_launch_by_launch_at_stock_draws_the_cap_on_average_and_takes_its_noiseless_time():
    # the H200's whole GPT-3-XL step (355 ms) swings between phases over the cap and under it;
    # the controller's lag alone let it draw 714 W under the 700-W cap and run 1.0% faster
    # than its noiseless figures, which fast-forwarded runs, the oracles and the peers' stock use
    dev = SimulatedDevice("h200", noise=0)
    workload = open_workload("gpt3-xl", dev)
    runner = StepRunner(dev, workload)
    expected_s, _ = dev.expected_step([(k, None, k.launches) for k in workload.kernels])
    runner.run(Schedule.stock(), 60)  # warm: 60 steps, fast-forwarded
    for _ in range(10):  # the controller settles launch by launch
        runner.run(Schedule.stock(), 1)
    start_s, start_j = dev.now_s(), dev.true_energy_j()
    for _ in range(10):
        runner.run(Schedule.stock(), 1)
    time_s, energy_j = dev.now_s() - start_s, dev.true_energy_j() - start_j
    assert energy_j / time_s <= 1.002 * dev.power_cap_w
    assert time_s / 10 == pytest.approx(expected_s, rel=0.003)


def test_after_a_window_of_idle_the_controller_lets_the_next_launch_boost():
    dev = card(0.010)
    dev.run(GEMM, 2000)  # ~50 ms of the GEMM alone: capped after the first window
    assert "sw_power_cap" in dev.throttle_reasons()
    dev.idle(0.030)
    dev.run(GEMM, 1)
    assert "sw_power_cap" not in dev.throttle_reasons()
    assert dev.sm_clock_mhz() == dev.preset.max_core_mhz


def test_a_capped_job_s_step_time_spreads_over_seconds_by_the_card_s_noise_not_the_controller_s():
    # The controller's level is carried from window to window, so a step shorter than the
    # window (the H200 layer, ~7 ms against 10 ms) runs at the same mean time whatever the
    # phase of the windows against it. The card's own noise (time_noise 0.5% per 1-s draw)
    # gives ~0.47% over 1-s windows; a control set afresh from each window's mix (bb23995)
    # gave 0.99% and 1.5% (seeds 0, 1), the noise moving it between phase-locked cycles.
    dev = SimulatedDevice("h200", seed=0)
    workload = gpt3_xl_layer()
    job = SimulatedJob(dev, workload)
    means = []
    for _ in range(10):
        start_s, steps = dev.now_s(), 0
        while dev.now_s() - start_s < 1.0:
            job.step(Schedule.stock())
            steps += 1
        means.append((dev.now_s() - start_s) / steps)
    assert "sw_power_cap" in dev.throttle_reasons()  # capped: the controller is at work
    settled = np.array(means[2:])
    assert settled.std(ddof=1) / settled.mean() < 0.007
    noiseless_s, _ = SimulatedDevice("h200", noise=0).expected_step(
        [(k, None, k.launches) for k in workload.kernels]
    )
    assert settled.mean() == pytest.approx(noiseless_s, rel=0.01)


def test_a_fast_forwarded_capped_schedule_measures_each_group_the_same_every_window():
    # StepRunner runs one step launch by launch and repeats it: the controller must
    # start that step where the repeated ones left it, not where one window's phase did
    # (a group's 2-s time swung 6% window to window on the noisy card at bb23995's parent).
    dev = SimulatedDevice("h200", noise=0)
    workload = gpt3_xl_layer()
    schedule = Schedule(((0, ClockPair(900, 3201)), (11, None), (30, ClockPair(1200, 3201))))
    runner = StepRunner(dev, workload)
    runner.run(schedule, 100)
    groups = np.array(
        [
            [times[:11].sum(), times[11:30].sum(), times[30:].sum()]
            for times, _ in (runner.run(schedule, 270) for _ in range(10))
        ]
    )
    assert np.all(groups.std(axis=0) / groups.mean(axis=0) < 0.001)
