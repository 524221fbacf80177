"""Training steps under a schedule: fast-forwarded chunks run at the schedule's clocks."""

import pytest

from kdvfs.runtime.schedule import Schedule, StepRunner, schedule_items, steady_step
from kdvfs.runtime.simulator import SimulatedDevice
from kdvfs.runtime.types import ClockPair, Workload
from kdvfs.runtime.workloads import gpt3_xl_layer

SIX = Workload("six", gpt3_xl_layer().kernels[8:14])


@pytest.mark.parametrize("after_isolated", [False, True])
def test_a_chunk_runs_at_the_new_clocks_when_a_switch_outlasts_a_step(after_isolated):
    device = SimulatedDevice("h200", seed=0, noise=0.0)  # a 10-ms switch; a step of SIX is ~1.4 ms
    runner = StepRunner(device, SIX)
    runner.run(Schedule.stock(), 1_000)
    if after_isolated:  # an isolated measurement left the card at another pair
        device.set_clocks(ClockPair(max(device.grid.core_levels_mhz), max(device.grid.mem_levels_mhz)))
        runner.forget_requests()
    low = ClockPair(min(device.grid.core_levels_mhz), max(device.grid.mem_levels_mhz))
    _, total_s = runner.run(Schedule(((0, low),)), 10_000)
    at_low_s = device.expected_step([(k, low, k.launches) for k in SIX.kernels])[0]
    assert device.switch_latency_s > 5 * at_low_s / 10  # the switch outlasts a stock step
    assert total_s == pytest.approx(10_000 * at_low_s, rel=0.01)


def test_a_chunk_after_an_isolated_measurement_does_not_repeat_the_step_its_switch_landed_in():
    device = SimulatedDevice("a100", seed=0, noise=0.0)  # a 15-ms switch; a step of SIX is ~4.4 ms
    runner = StepRunner(device, SIX)
    runner.run(Schedule.stock(), 1_000)
    device.set_clocks(ClockPair(705, 1215))  # an isolated measurement at a low pair...
    device.run(SIX.kernels[0], 10_000)  # ...which landed, and ran
    runner.forget_requests()
    _, total_s = runner.run(Schedule.stock(), 2_000)  # back to stock: lands during the third step
    stock_s = device.expected_step([(k, None, k.launches) for k in SIX.kernels])[0]
    assert total_s == pytest.approx(2_000 * stock_s, rel=0.01)


def test_a_switch_still_in_flight_at_the_steps_end_lands_in_a_wait_long_enough():
    device = SimulatedDevice("rtx3080ti", noise=0.0)  # a 30-ms switch; SIX runs ~15 ms
    low, high = ClockPair(210, 405), ClockPair(1680, 9501)
    schedule = Schedule(((0, high), (5, low)))  # the last kernel's request lands after the step
    quiet = steady_step(device, SIX, schedule)
    assert quiet.end_pair == high and quiet.in_flight[1] == low and quiet.in_flight[0] > 0.02
    assert quiet.items == schedule_items(device, SIX, schedule)
    assert [pair for _, pair, _ in quiet.items] == [high] * 6  # replaced by the next step's request
    waited = steady_step(device, SIX, schedule, wait_rel=3.0)  # a ~46-ms wait: it lands in it
    assert waited.items[0][1] == low  # and the next step starts at it, until its own lands
