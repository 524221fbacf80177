"""The online tuner: the budget holds at every point, it learns, its schedule is what runs."""

import numpy as np
import pytest

from kdvfs.runtime.iteration import IterationRunner, Schedule, schedule_figures
from kdvfs.runtime.simulator import SimulatedDevice
from kdvfs.runtime.types import ClockPair, Workload
from kdvfs.runtime.workloads import gpt3_xl_layer
from kdvfs.tuner.online import BudgetAccount, OnlineTuner
from kdvfs.tuner.sweep import evaluate

SIX = Workload("six", gpt3_xl_layer().kernels[8:14])  # residual+ln2, fc, gelu, fcproj, residual, fcproj dinp


@pytest.mark.parametrize("seed", [0, 1])
def test_budget_holds_at_every_point_and_the_tuner_converges(seed):
    device = SimulatedDevice("rtx3080ti-fastswitch", seed=seed)
    tuner = OnlineTuner(device, SIX, strategy="ucb", budget=0.01, seed=seed, warmup_s=30.0)
    state = tuner.run(600_000)
    assert state.points and max(p.slowdown for p in state.points) <= 0.01
    assert state.converged_at_iteration is not None and len(state.converged) == len(SIX)
    ideal = evaluate(device, SIX, state.obs.kernel_level_choice(0.01))
    assert ideal.energy_saving > 0.05 and ideal.slowdown <= 0.01
    saving, slowdown = schedule_figures(device, SIX, state.schedule)
    assert slowdown <= 0.01 and saving > 0.8 * ideal.energy_saving  # fast switching: groups ~ kernels
    assert state.points[-1].iteration == 600_000


def test_budget_account():
    acc = BudgetAccount(ref_time_s=0.1, budget=0.01)
    acc.charge(10.0, 100)
    assert acc.slack_s() == pytest.approx(0.1) and acc.slowdown() == pytest.approx(0.0)
    acc.charge(0.15)
    assert acc.slack_s() < 0 < acc.slowdown() - 0.01


def test_schedule_figures_match_the_device_running_the_schedule():
    device = SimulatedDevice("rtx3080ti", noise=0)
    workload = gpt3_xl_layer()
    schedule = Schedule(((0, ClockPair(1680, 9501)), (13, ClockPair(1470, 5001)), (37, None)))
    saving, slowdown = schedule_figures(device, workload, schedule)
    runner = IterationRunner(device, workload)
    runner.run(schedule, 2000)  # settle temperature
    _, total_s = runner.run(schedule, 3)
    ref_t, _ = device.expected_iteration([(k, None, k.launches) for k in workload.kernels])
    assert total_s / 3 / ref_t - 1 == pytest.approx(slowdown, abs=0.003)
    assert saving != 0.0


def test_a_schedule_switches_after_the_latency():
    device = SimulatedDevice("rtx3080ti", noise=0)
    workload = gpt3_xl_layer()
    # two groups shorter than the 30 ms switch: the second never gets its pair
    short = Schedule(((0, ClockPair(1260, 9501)), (1, ClockPair(2100, 9501))))
    IterationRunner(device, workload).run(short, 3)
    assert device.clocks_in_effect() in (ClockPair(1260, 9501), ClockPair(2100, 9501))
    assert np.isfinite(schedule_figures(device, workload, short)[1])
