"""Job noise: a simulated job carrying a recorded job's waits reproduces the recording's step-time
statistics; the sampler is deterministic under its seed; the waits idle the card; the shipped
parameters are the recordings' fits; `kdvfs tune --job-noise` names the noise it used.

The tolerance is 15% of the recorded figure, for the per-step CV and for the CV of 1-s means
(averaged over window phases: the `sync` job's single-phase figure moves from 0.60 to 1.85 with
where the windows fall). The simulated workload is one streaming kernel whose own step is the
recording's GPU floor, so that its median step lands on the recording's median; a streaming
kernel keeps its time when the card idles between steps (a compute kernel at the H200's power
cap runs faster after each idle gap, which would add the simulated card's own variation).
"""

from __future__ import annotations

import functools
import json
import math

import numpy as np
import pytest

from kdvfs.cli import main
from kdvfs.runtime.job_noise import (
    JobNoise,
    JobNoiseSampler,
    cv,
    fit_job_noise,
    job_noise,
    job_noise_names,
    seen_wait_share,
    window_1s_cv_phase_mean,
)
from kdvfs.runtime.registry import open_device
from kdvfs.runtime.schedule import Schedule
from kdvfs.runtime.steps import SimulatedJob
from kdvfs.runtime.tables import REPO_DATA_DIR
from kdvfs.runtime.types import KdvfsError, Kernel, Workload

JOBS_DIR = REPO_DATA_DIR / "h200" / "jobs"
RECORDED_S = 300.0  # s: each recording's length after its warm-up
TOLERANCE_REL = 0.15


def streaming_workload(device, step_s: float) -> Workload:
    """One memory-bound kernel whose step on the device takes step_s (to 0.1%)."""
    kernel = Kernel("stream", flops=1e9, bytes_moved=1e11, kind="elementwise")
    for _ in range(4):
        time_s, _ = device.expected(kernel, None)
        kernel = Kernel(
            "stream",
            flops=kernel.flops * step_s / time_s,
            bytes_moved=kernel.bytes_moved * step_s / time_s,
            kind="elementwise",
        )
    assert device.expected(kernel, None)[0] == pytest.approx(step_s, rel=1e-3)
    return Workload("stream", (kernel,))


@functools.cache
def simulated_steps(name: str) -> tuple[np.ndarray, np.ndarray]:
    """(start_s, step_s) of each step of a recording's length of simulated training under the
    recording's noise, on the simulated H200."""
    noise = job_noise(name)
    device = open_device("sim:h200", seed=0)
    job = SimulatedJob(
        device, streaming_workload(device, noise.floor_step_s), job_noise=noise, job_noise_seed=0
    )
    starts, times = [], []
    while device.now_s() < RECORDED_S:
        report = job.step(Schedule.stock())
        starts.append(report.end_s - report.step_time_s)
        times.append(report.step_time_s)
    return np.asarray(starts), np.asarray(times)


@pytest.mark.parametrize("name", ["vision", "hf", "sync"])
def test_a_simulated_job_with_a_recorded_noise_has_the_recordings_per_step_cv_and_median(name):
    noise = job_noise(name)
    _, times = simulated_steps(name)
    assert np.median(times) == pytest.approx(noise.median_step_s, rel=0.05)
    assert cv(times) == pytest.approx(noise.recorded_per_step_cv, rel=TOLERANCE_REL)


@pytest.mark.parametrize("name", ["vision", "hf", "sync"])
def test_a_simulated_job_with_a_recorded_noise_has_the_recordings_cv_of_1s_means(name):
    noise = job_noise(name)
    starts, times = simulated_steps(name)
    assert window_1s_cv_phase_mean(starts, times) == pytest.approx(
        noise.recorded_window_1s_cv_phase_mean, rel=TOLERANCE_REL
    )


def test_the_sync_noise_is_the_noisiest_per_step_and_per_second():
    fits = {name: job_noise(name) for name in job_noise_names() if not name.endswith("-tuned")}
    assert set(fits) == {"vision", "hf", "sync"}
    assert max(fits, key=lambda n: fits[n].recorded_per_step_cv) == "sync"
    assert max(fits, key=lambda n: fits[n].recorded_window_1s_cv_phase_mean) == "sync"


def test_the_sampler_is_deterministic_under_its_seed():
    noise = job_noise("vision")

    def waits(seed: int) -> list[float]:
        sampler = JobNoiseSampler(noise, seed)
        return [sampler.wait_s(step, 0.03) for step in range(2000)]

    assert waits(3) == waits(3)
    assert waits(3) != waits(4)
    assert min(waits(3)) >= 0.0


def test_a_simulated_job_is_deterministic_under_its_seeds():
    def reports(seed: int):
        device = open_device("sim:h200", seed=1)
        job = SimulatedJob(
            device, streaming_workload(device, 0.03), job_noise=job_noise("hf"), job_noise_seed=seed
        )
        return [job.step(Schedule.stock()) for _ in range(200)]

    assert reports(0) == reports(0)
    assert reports(0) != reports(1)


def test_periodic_syncs_wait_at_the_step_before_each_multiple_of_their_period():
    noise = job_noise("sync")
    assert noise.period_steps == (200, 500)
    sampler = JobNoiseSampler(noise, 0)
    waits = {step: sampler.wait_s(step, noise.floor_step_s) for step in range(1000)}
    eval_s, ckpt_s = noise.period_wait_s
    assert waits[199] >= eval_s and waits[499] >= ckpt_s and waits[999] >= eval_s + ckpt_s
    plain = [w for step, w in waits.items() if (step + 1) % 200 and (step + 1) % 500]
    assert max(plain) < 0.2 * noise.floor_step_s


def test_a_steps_wait_idles_the_card_at_its_idle_power_after_the_kernels():
    noise = job_noise("sync")
    plain_device, noisy_device = open_device("sim:h200", seed=2), open_device("sim:h200", seed=2)
    workload = streaming_workload(plain_device, noise.floor_step_s)
    plain, noisy = SimulatedJob(plain_device, workload), SimulatedJob(noisy_device, workload, job_noise=noise)
    reports = [noisy.step(Schedule.stock()) for _ in range(500)]
    for _ in range(500):
        plain.step(Schedule.stock())
    for report in reports:
        assert sum(report.group_times_s) == pytest.approx(report.step_time_s)
    assert reports[499].step_time_s > noise.period_wait_s[1]
    idle_device = open_device("sim:h200", seed=2)
    idle_device.idle(2.0)
    idle_w = idle_device.true_energy_j() / 2.0
    extra_s = noisy_device.now_s() - plain_device.now_s()
    extra_j = noisy_device.true_energy_j() - plain_device.true_energy_j()
    assert extra_s > 2.0
    assert extra_j / extra_s == pytest.approx(idle_w, rel=0.25)


def test_the_shipped_parameters_are_the_recordings_fits():
    for name in ("hf", "sync"):
        fitted = fit_job_noise(JOBS_DIR / f"{name}_steps.csv.gz", JOBS_DIR / f"{name}_nvml.csv.gz")
        shipped = job_noise(name)
        assert fitted.period_steps == shipped.period_steps
        assert fitted.wait_rel_quantiles == pytest.approx(shipped.wait_rel_quantiles)
        assert fitted.wait_ar1_per_step == pytest.approx(shipped.wait_ar1_per_step, abs=1e-3)
        assert fitted.period_wait_s == pytest.approx(shipped.period_wait_s)
        assert fitted.recorded_per_step_cv == pytest.approx(shipped.recorded_per_step_cv)


def test_a_job_noise_file_is_read_and_a_bad_name_or_record_is_one_error(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(job_noise("hf").to_dict() | {"name": "mine"}))
    assert job_noise(path).name == "mine"
    with pytest.raises(KdvfsError, match="neither a known name"):
        job_noise("no-such-noise")
    (tmp_path / "bad.json").write_text(json.dumps({"name": "bad"}))
    with pytest.raises(KdvfsError, match="not a job-noise record"):
        job_noise(tmp_path / "bad.json")
    quantiles = list(job_noise("hf").wait_rel_quantiles)
    with pytest.raises(KdvfsError, match="non-decreasing"):
        JobNoise("x", 0.06, 0.06, tuple(reversed(quantiles)), 0.5)
    with pytest.raises(KdvfsError, match=r"\[0, 1\)"):
        JobNoise("x", 0.06, 0.06, tuple(quantiles), 1.0)


def test_tune_with_job_noise_names_it_in_the_json_and_the_label(tmp_path, capsys):
    out = tmp_path / "t.json"
    args = ["tune", "--device", "sim:h200", "--strategy", "ucb", "--no-sweep", "--no-mlflow"]
    assert main([*args, "--seconds", "3", "--job-noise", "sync", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["job_noise"] == "sync" and doc["job_noise_fit"]["period_steps"] == [200, 500]
    captured = capsys.readouterr()
    assert "[simulated, job noise: sync]" in captured.err and "[simulated, job noise: sync]" in captured.out
    assert main([*args, "--seconds", "3", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["job_noise"] == "none"
    assert "job noise" not in capsys.readouterr().out
    assert main([*args, "--seconds", "3", "--job-noise", "no-such-noise"]) == 2
    assert "no-such-noise" in capsys.readouterr().err
    assert not math.isnan(doc["job_noise_fit"]["wait_power_w"])


def test_the_mean_wait_is_a_share_below_one_and_larger_for_a_waiting_job_than_a_quiet_one():
    means = {name: job_noise(name).mean_wait_rel for name in ("vision", "hf", "sync")}
    assert all(0.0 <= m < 1.0 for m in means.values())
    assert means["vision"] > means["hf"] > means["sync"]
    assert means["vision"] == pytest.approx(0.47, abs=0.01)


def test_the_wait_strata_are_equally_likely_shares_of_what_the_sampler_draws():
    noise = job_noise("vision")
    strata = noise.wait_rel_strata()
    assert len(strata) == 10 and list(strata) == sorted(strata)
    assert sum(strata) / len(strata) == pytest.approx(noise.mean_wait_rel, rel=1e-12)
    sampler = JobNoiseSampler(noise, seed=3)
    rels = np.array([sampler.wait_parts(step)[0] for step in range(50_000)])
    assert rels.mean() == pytest.approx(noise.mean_wait_rel, rel=0.03)
    assert np.quantile(rels, 0.05) < strata[0] < strata[-1] < np.quantile(rels, 0.97)
    with pytest.raises(KdvfsError, match="strata must be >= 1"):
        noise.wait_rel_strata(0)


def test_the_periodic_wait_per_step_is_each_syncs_wait_over_its_period():
    noise = job_noise("sync")
    assert noise.mean_periodic_wait_s == pytest.approx(0.4065 / 200 + 1.4815 / 500)
    sampler = JobNoiseSampler(noise, seed=0)
    fixed_s = [sampler.wait_parts(step)[1] for step in range(1000)]  # one whole cycle of both
    assert sum(fixed_s) / 1000 == pytest.approx(noise.mean_periodic_wait_s, rel=1e-12)
    assert job_noise("vision").mean_periodic_wait_s == 0.0


def test_tune_with_job_noise_charges_its_waits_in_the_oracles_and_the_plans_figures(tmp_path):
    out = tmp_path / "t.json"
    args = ["tune", "--device", "sim:rtx3080ti", "--workload", "gpt3-xl-layer", "--strategy", "ucb"]
    args += ["--no-mlflow", "--seconds", "3", "--json", str(out)]
    assert main([*args, "--job-noise", "vision"]) == 0
    waited = json.loads(out.read_text())
    assert waited["job_waits_charged"]["wait_rel"] == pytest.approx(0.47, abs=0.01)
    assert "job waits charged" in waited["oracles"]["realisable"]["method"]
    assert main(args) == 0
    quiet = json.loads(out.read_text())
    assert quiet["job_waits_charged"] is None
    assert waited["realisable_oracle"]["energy_saving"] < quiet["realisable_oracle"]["energy_saving"]


@pytest.mark.parametrize("name", ["vision", "hf"])
def test_a_tuned_noise_is_its_bare_jobs_waits_with_the_share_the_job_saw_after_its_steps(name):
    # under kdvfs.tune (data/h200/jobs/*_tuned_20261205_reports) most of each job's wait fell
    # inside the steps, where the tuner counts it as the clocks' busy time
    bare, tuned = job_noise(name), job_noise(f"{name}-tuned")
    assert tuned.wait_rel_quantiles == bare.wait_rel_quantiles and bare.seen_wait_share == 1.0
    assert tuned.seen_wait_share == pytest.approx(
        seen_wait_share(JOBS_DIR / f"{name}_tuned_20261205_reports.csv.gz")
    )
    assert 0.0 < tuned.seen_wait_share < 0.5


@pytest.mark.parametrize("aggregate", [False, True])
def test_a_job_reports_the_seen_share_of_its_wait_and_the_rest_lands_in_its_busy_time(aggregate):
    def reports(name: str) -> list:
        device = open_device("sim:h200", seed=1)
        job = SimulatedJob(
            device, streaming_workload(device, 0.03), job_noise=job_noise(name), job_noise_seed=0
        )
        run = job.step_until_update if aggregate else job.step
        return [run(Schedule.stock()) for _ in range(400)]

    bare, tuned = reports("hf"), reports("hf-tuned")
    share = job_noise("hf-tuned").seen_wait_share
    for b, t in zip(bare, tuned, strict=True):
        assert t.step_time_s == b.step_time_s and t.steps == b.steps  # the card idles alike
        assert t.wait_s == pytest.approx(share * b.wait_s, rel=1e-9)
    busy = [np.std([r.step_time_s - r.wait_s for r in run]) for run in (bare, tuned)]
    assert busy[1] > 3.0 * busy[0]


@pytest.mark.parametrize("share", [0.0, -0.1, 1.5, math.nan])
def test_a_seen_share_outside_zero_to_one_is_refused(share):
    with pytest.raises(KdvfsError, match="seen_wait_share"):
        JobNoise.from_dict({**job_noise("hf").to_dict(), "seen_wait_share": share})
