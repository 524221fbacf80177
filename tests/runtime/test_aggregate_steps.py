"""A stretch of steps simulated at once (SimulatedJob.step_until_update) against the same job
run step by step: the same statistics within stated tolerances, on fixed seeds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kdvfs.runtime.job_noise import JobNoiseSampler, job_noise
from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.runtime.schedule import Schedule
from kdvfs.runtime.steps import MAX_REPORT_S, SimulatedJob, StepReport


def three_groups(device, workload) -> Schedule:
    """Forward at stock, backward at a low pair, the optimizer at the highest pair."""
    pairs = sorted(device.grid.pairs, key=lambda p: (p.core_mhz, -p.mem_mhz))
    backward = next(i for i, k in enumerate(workload.kernels) if k.pass_name == "backward")
    optimizer = next(i for i, k in enumerate(workload.kernels) if k.pass_name == "optimizer")
    return Schedule(((0, None), (backward, pairs[len(pairs) // 4]), (optimizer, pairs[-1])))


def run_job(preset: str, workload: str, seconds: float, *, aggregate: bool, noise=None, groups=False, seed=3):
    device = open_device(f"sim:{preset}", seed=seed)
    w = open_workload(workload, device)
    job = SimulatedJob(device, w, job_noise=job_noise(noise) if noise else None, job_noise_seed=seed)
    schedule = three_groups(device, w) if groups else Schedule.stock()
    reports = []
    while device.now_s() < seconds:
        reports.append(job.step_until_update(schedule) if aggregate else job.step(schedule))
    return job, reports


def figures(reports: list[StepReport]) -> dict[str, float]:
    """Mean step time, the spread of the mean step time over the counter's windows, the mean
    and spread of the power over them, the counter update spacing, the end temperature."""
    readings, window_means, steps_s, counts = [], [], 0.0, 0
    for r in reports:
        steps_s += r.step_time_s * r.steps
        counts += r.steps
        if r.counter_readings:
            readings += r.counter_readings
            window_means.append(steps_s / counts)
            steps_s, counts = 0.0, 0
    t = np.array([x[0] for x in readings])
    e = np.array([x[1] for x in readings])
    power = np.diff(e) / np.diff(t)
    total_steps = sum(r.steps for r in reports)
    return {
        "step_s": sum(r.step_time_s * r.steps for r in reports) / total_steps,
        "window_step_sd": float(np.std(window_means[1:])),
        "power_w": float(power.mean()),
        "power_sd": float(power.std()),
        "spacing_s": float(np.diff(t).mean()),
        "temperature_c": reports[-1].temperature_c,
    }


CASES = [
    # preset, workload, seconds, job noise, three groups, (step time, power) relative tolerances
    ("rtx3080ti", "gpt3-xl-layer", 60.0, None, False, 0.002, 0.005),
    ("rtx3080ti", "gpt3-xl-layer", 60.0, None, True, 0.005, 0.01),
    ("a100", "gpt3-xl-layer", 20.0, "hf", True, 0.005, 0.01),
    ("h200-fastswitch", "gpt3-xl-layer", 6.0, None, True, 0.005, 0.01),
    ("h200", "gpt3-xl-layer", 6.0, "vision", False, 0.01, 0.03),
]


@pytest.mark.parametrize("preset,workload,seconds,noise,groups,time_tol,power_tol", CASES)
def test_a_stretch_at_once_has_the_step_by_step_statistics(
    preset, workload, seconds, noise, groups, time_tol, power_tol
):
    _, exact = run_job(preset, workload, seconds, aggregate=False, noise=noise, groups=groups)
    _, stretch = run_job(preset, workload, seconds, aggregate=True, noise=noise, groups=groups)
    a, b = figures(exact), figures(stretch)
    assert b["step_s"] == pytest.approx(a["step_s"], rel=time_tol)
    assert b["power_w"] == pytest.approx(a["power_w"], rel=power_tol)
    assert b["spacing_s"] == pytest.approx(a["spacing_s"], rel=0.01)
    assert b["temperature_c"] == pytest.approx(a["temperature_c"], abs=1.0)
    # the spreads over the counter's windows: what a tuner's windows average
    assert b["power_sd"] == pytest.approx(a["power_sd"], rel=0.35)
    assert b["window_step_sd"] == pytest.approx(a["window_step_sd"], rel=0.35, abs=2e-5 * a["step_s"])


def test_each_stretch_ends_right_after_a_counter_update_and_says_how_many_steps_it_covers():
    job, reports = run_job("a100", "gpt3-xl-layer", 5.0, aggregate=True, groups=True)
    covered = 0
    for before, r in zip([None, *reports], reports):
        covered += r.steps
        assert r.step == covered - 1
        assert len(r.counter_readings) == 1
        start_s = before.end_s if before is not None else 0.0
        assert r.end_s - start_s == pytest.approx(r.steps * r.step_time_s, rel=1e-9)
        assert sum(r.group_times_s) == pytest.approx(r.step_time_s, rel=1e-9)
        assert r.steps * r.step_time_s <= MAX_REPORT_S + r.step_time_s
    assert covered == job.steps
    assert sum(r.steps for r in reports) > len(reports) * 3


def test_a_stretch_never_runs_past_its_limit_when_the_counter_does_not_update():
    device = open_device("sim:a100", seed=0)
    device.energy_update_period_s = 10.0
    job = SimulatedJob(device, open_workload("gpt3-xl-layer", device))
    report = job.step_until_update(Schedule.stock())
    assert report.counter_readings == ()
    assert report.steps * report.step_time_s <= MAX_REPORT_S
    assert (report.steps + 1) * report.step_time_s > MAX_REPORT_S * 0.9


def test_a_report_stands_for_one_step_unless_it_says_otherwise():
    report = StepReport(0, 1.0, 1.0, (1.0,), (), 50.0, frozenset(), 700.0)
    assert report.steps == 1


def test_the_same_seed_gives_the_same_stretches():
    _, a = run_job("h200", "gpt3-xl-layer", 2.0, aggregate=True, noise="sync")
    _, b = run_job("h200", "gpt3-xl-layer", 2.0, aggregate=True, noise="sync")
    assert a == b


def test_a_stretch_draws_the_job_noise_waits_that_a_step_by_step_run_draws():
    noise = job_noise("vision")
    one, parts = JobNoiseSampler(noise, 5), JobNoiseSampler(noise, 5)
    waits = [one.wait_s(step, 0.01) for step in range(3000)]
    other = [rel * 0.01 + fixed for rel, fixed in (parts.wait_parts(step) for step in range(3000))]
    assert np.allclose(waits, other, rtol=1e-12, atol=0.0)


def test_the_periodic_syncs_and_temperature_go_on_in_a_stretch():
    _, reports = run_job("h200", "gpt3-xl-layer", 8.0, aggregate=True, noise="sync")
    longest = max(r.step_time_s * r.steps for r in reports)
    assert longest > 0.4  # the 200-step sync's wait is in one stretch
    temps = [r.temperature_c for r in reports]
    assert temps[-1] != temps[0] and all(math.isfinite(t) for t in temps)
