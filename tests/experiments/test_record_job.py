"""The standalone job recorder (experiments/record_job.py) on the CPU: its summary and a short
run of the plain-loop job with host timing and no NVML."""

from __future__ import annotations

import csv
import gzip
import json

import pytest

from kdvfs.experiments import record_job


def test_summary_leaves_out_the_warm_up_and_the_last_step_and_times_the_counter_updates():
    # 30 steps of 0.1 s from host time 0; the warm-up ends at 1.0 s; the last step is 5 s long.
    steps = [(i, 0.1 * i, 0.1, 0.1) for i in range(30)] + [(30, 3.0, 5.0, 5.0)]
    # Samples every 0.05 s; the energy counter moves every 0.2 s by 40 J (200 W).
    nvml = [(0.05 * k, 40_000 * (k // 4), int(k % 4 == 0 and k > 0), 1980, 3201, 200.0, 50, 0x4 * (k % 2), 700.0)
            for k in range(61)]  # fmt: skip
    summary = record_job.summarise(steps, nvml, warmup_end_s=1.0)
    assert summary["steps"] == 20
    assert summary["gpu_step_median_s"] == pytest.approx(0.1)
    assert summary["per_step_cv"] == pytest.approx(0.0, abs=1e-9)
    assert summary["counter_period_median_s"] == pytest.approx(0.2)
    assert summary["energy_power_mean_w"] == pytest.approx(200.0, rel=0.15)
    assert summary["throttle_reasons_seen"] == ["sw_power_cap"]
    assert 0.4 < summary["throttle_share_any_but_idle"] < 0.6


def test_regular_steps_put_a_stall_at_the_typical_step_and_leave_the_first_steps_and_slower_steps_alone():
    rows = [(i, 0.1 * i, 0.1) for i in range(40)]
    rows[3] = (3, 0.3, 1.0)  # under STALL_MIN steps seen: kept
    rows[20] = (20, 2.0, 0.8)  # an evaluation inside the step: the typical 0.1 s
    rows[30] = (30, 3.0, 0.25)  # 2.5x: a slow step, not a stall
    out = record_job.regular_steps(rows)
    assert out[3][2] == 1.0 and out[20][2] == pytest.approx(0.1) and out[30][2] == 0.25
    assert [r[:2] for r in out] == [r[:2] for r in rows]  # every step kept, in order


def test_an_unknown_option_is_refused_with_one_line():
    with pytest.raises(SystemExit, match="unknown option --colour"):
        record_job.parse_args(["--colour", "red"])


def test_an_option_value_of_the_wrong_type_is_refused_with_one_line():
    with pytest.raises(SystemExit, match=r"--seconds takes a float, got 'long'"):
        record_job.parse_args(["--seconds", "long"])


def test_the_plain_loop_job_records_its_steps_on_the_cpu_without_nvml(tmp_path):
    record_job.main([
        "--job", "sync", "--device", "cpu", "--seconds", "0.5", "--warmup-s", "0", "--out", str(tmp_path),
        "--batch", "1", "--seq-len", "8", "--layers", "1", "--d-model", "16",
        "--item-every", "1", "--eval-every", "2", "--eval-batches", "1", "--ckpt-every", "3",
    ])  # fmt: skip
    with gzip.open(tmp_path / "sync_steps.csv.gz", "rt") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["step", "host_start_s", "gpu_step_s", "host_step_s"]
    assert len(rows) >= 2 and all(float(r[2]) > 0 for r in rows[1:])
    with gzip.open(tmp_path / "sync_nvml.csv.gz", "rt") as f:
        assert next(csv.reader(f)) == list(record_job.NVML_COLUMNS)
    meta = json.loads((tmp_path / "sync_meta.json").read_text())
    assert meta["job"] == "sync" and meta["nvml"] is None
    assert meta["gpu_timing"].startswith("host")
    assert meta["steps_total"] == len(rows) - 1


def test_an_arm_under_a_requested_pair_is_compared_with_the_stock_steps_on_either_side_of_it():
    # 40 steps of 70 ms; steps 10-19 ran under a requested pair and took 1% longer, with twice
    # the tuner's answer CPU; a request of stock at step 20 ends the arm.
    rows = [(i, 0.07 * i, 0.0707 if 10 <= i < 20 else 0.070, 0.07) for i in range(40)]
    requests = [(10, "step", 1380, 2619, 0.7), (20, "step", "", "", 1.4)]
    reports = [(i, 0.0, 0.07, 1, 0.0, 1e-4 if 10 <= i < 20 else 5e-5) for i in range(40)]
    out = record_job.arms_against_stock(rows, requests, reports)
    assert out["arms"] == 1
    (arm,) = out["each"]
    assert arm["pair"] == "1380/2619" and arm["first_step"] == 10 and arm["steps"] == 10
    assert arm["median_step_diff"] == pytest.approx(0.01)
    assert arm["answer_cpu_ms"] == pytest.approx(0.1)
    assert arm["answer_cpu_ms_stock_around"] == pytest.approx(0.05)
