"""SimulatedJob: one StepReport per step, counter updates as a poller sees them, dry run."""

from __future__ import annotations

import itertools

import pytest

from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.runtime.schedule import Schedule
from kdvfs.runtime.steps import SimulatedJob
from kdvfs.runtime.types import KdvfsError


@pytest.fixture()
def job() -> SimulatedJob:
    device = open_device("sim:rtx3080ti", seed=1)
    return SimulatedJob(device, open_workload("gpt3-xl-layer", device))


def test_each_step_reports_its_time_and_group_times_summing_to_it(job):
    schedule = Schedule(((0, None), (13, None)))
    report = job.step(schedule)
    assert report.step == 0
    assert len(report.group_times_s) == 2
    assert sum(report.group_times_s) == pytest.approx(report.step_time_s)
    assert report.end_s == pytest.approx(job.seconds)


def test_counter_updates_are_reported_only_when_the_counter_changed_at_period_multiples(job):
    period_s = job.device.energy_update_period_s
    readings = [r for _ in range(60) for r in job.step(Schedule.stock()).counter_readings]
    assert len(readings) >= 30  # a 66-ms step, a 100-ms counter
    assert len({j for _, j in readings}) == len(readings)
    for time_s, _ in readings:
        assert time_s / period_s == pytest.approx(round(time_s / period_s))
    assert all(b[0] > a[0] and b[1] > a[1] for a, b in itertools.pairwise(readings))


@pytest.mark.parametrize("aggregate", [False, True])
def test_a_checkpoint_wait_reports_every_counter_update_inside_it_at_its_time_and_value(aggregate):
    # the recorded sync job checkpoints every 500 steps (0.9-1.8 s at the card's idle power):
    # a poller reading back to back sees each of the ~10-18 updates inside that wait
    from kdvfs.runtime.job_noise import job_noise

    device = open_device("sim:h200", seed=0)
    job = SimulatedJob(device, open_workload("gpt3-xl-layer", device), job_noise=job_noise("sync"))
    period_s = device.energy_update_period_s
    readings, most = [], 0
    while job.steps < 1100:
        report = job.step_until_update(Schedule.stock()) if aggregate else job.step(Schedule.stock())
        readings += report.counter_readings
        most = max(most, len(report.counter_readings))
    assert most >= 8
    assert all(b[0] == pytest.approx(a[0] + period_s) for a, b in itertools.pairwise(readings))
    assert all(b[1] > a[1] for a, b in itertools.pairwise(readings))
    assert readings[-1][1] == device.energy_j()


def test_dry_run_records_requests_but_runs_stock_clocks():
    device = open_device("sim:rtx3080ti", seed=1)
    job = SimulatedJob(device, open_workload("gpt3-xl-layer", device), dry_run=True)
    low = Schedule(((0, device.grid.pairs[-10]),))
    for _ in range(5):
        job.step(low)
    assert device.clocks_in_effect() is None
    assert low in [s for _, s in job.requests]


def test_run_resets_clocks_when_the_controller_raises(job):
    pair = job.device.grid.pairs[-4]

    class Failing:
        calls = 0

        def on_step_end(self, report):
            self.calls += 1
            if self.calls > 20:
                raise RuntimeError("boom")
            return Schedule(((0, pair),))

    with pytest.raises(RuntimeError):
        job.run(Failing(), seconds=10.0)
    job.device.idle(1.0)  # the reset request lands after the switch latency
    assert job.device.clocks_in_effect() is None
    assert job.requests[-1][1] == Schedule.stock()


def test_run_refuses_no_training_time(job):
    with pytest.raises(KdvfsError, match="seconds"):
        job.run(None, seconds=0.0)
