"""experiments/noisy_jobs.py's yardstick: each row's oracle is computed with the row's job
waits charged (tuner/oracle.py's InStep), its JSON says which schedule and which waits, and a
run's schedules are measured by the same in-step truth. On the simulated RTX 3080 Ti's GPT-3-XL
layer (its oracles take seconds)."""

from __future__ import annotations

import json

import pytest

from kdvfs.experiments.noisy_jobs import in_step, oracle_of, saving_of
from kdvfs.runtime.job_noise import job_noise
from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.runtime.schedule import Schedule
from kdvfs.runtime.types import ClockPair
from kdvfs.tuner.oracle import one_knob_oracle, realisable_oracle
from kdvfs.tuner.run import job_sites

BUDGET = 0.01
ROW = "rtx3080ti:gpt3-xl-layer"


@pytest.fixture(scope="module")
def rows() -> dict[str, dict]:
    return {noise: oracle_of(f"{ROW}:{noise}", BUDGET) for noise in ("none", "vision")}


def test_each_rows_oracle_json_says_its_schedule_its_one_knob_pair_and_the_waits_charged(rows):
    vision = job_noise("vision")
    doc = json.loads(json.dumps(rows["vision"]))
    waits = doc["job_waits"]
    assert waits["noise"] == "vision" and waits["wait_rel"] == vision.mean_wait_rel
    assert waits["wait_rel_strata"] == list(vision.wait_rel_strata()) and waits["wait_fixed_s"] == 0.0
    assert waits["after_wait_share"] == 0.0  # no periodic wait
    assert doc["schedule"][0][0] == 0 and len(doc["schedule"]) == doc["groups"]
    assert len(doc["one_knob"]["pair"]) == 2
    assert "job waits charged: 47.2% of the step" in doc["method"]
    assert doc["slowdown"] <= BUDGET and doc["one_knob"]["slowdown"] <= BUDGET


def test_a_row_without_job_noise_keeps_the_noiseless_yardstick(rows):
    device = open_device("sim:rtx3080ti", noise=0.0)
    workload = open_workload("gpt3-xl-layer", device)
    one = one_knob_oracle(device, workload, BUDGET)
    best = realisable_oracle(
        device, workload, BUDGET, job_sites(workload, device.switch_latency_s), one_knob=one
    )
    doc = rows["none"]
    assert doc["job_waits"]["wait_rel"] == 0.0 and doc["job_waits"]["wait_rel_strata"] == []
    assert (doc["energy_saving"], doc["one_knob"]["energy_saving"]) == (best.energy_saving, one.energy_saving)
    assert "job waits" not in doc["method"]


def test_the_waits_lower_the_yardstick_of_a_waiting_row(rows):
    assert rows["vision"]["one_knob"]["energy_saving"] < rows["none"]["one_knob"]["energy_saving"] - 0.02
    assert rows["vision"]["energy_saving"] < rows["none"]["energy_saving"]


def test_a_runs_schedules_are_measured_by_the_rows_own_yardstick(rows):
    step = in_step(f"{ROW}:vision", BUDGET)
    doc = rows["vision"]
    best = Schedule(
        tuple((start, None if pair is None else ClockPair(*pair)) for start, pair in doc["schedule"])
    )
    assert saving_of(step, best) == doc["energy_saving"]
    assert (
        saving_of(step, Schedule(((0, ClockPair(*doc["one_knob"]["pair"])),)))
        == doc["one_knob"]["energy_saving"]
    )
    assert saving_of(step, Schedule.stock()) == 0.0


def test_the_judged_errors_count_the_draws_beyond_each_boundary_on_the_savings_side():
    from kdvfs.experiments.noisy_jobs import judged_errors

    figures = judged_errors([3.5, 2.7, 0.0, -1.0, -4.0])
    assert (figures["trials"], figures["beyond_2_5"], figures["beyond_3"]) == (5, 2, 1)
    assert figures["beyond_3_normal"] == pytest.approx(5 * 0.0013499, rel=1e-3)


def test_a_run_reaches_the_oracle_from_the_plan_after_which_every_plan_saves_nine_tenths_of_it():
    from kdvfs.experiments.noisy_jobs import against_oracle

    run = {"plan_log": [[0.0, 0.0], [100.0, 0.033], [200.0, 0.02], [300.0, 0.035]], "plan_saving": 0.035}
    assert against_oracle(run, 0.036) == {"reached": 300.0, "share_of_oracle": pytest.approx(0.035 / 0.036)}
    assert against_oracle(run, 0.02)["reached"] == 100.0
    # an oracle that saves nothing: reached by plans that save at least nothing, no share
    assert against_oracle({"plan_log": [[0.0, 0.0]], "plan_saving": 0.0}, 0.0) == {
        "reached": 0.0,
        "share_of_oracle": None,
    }


def test_a_row_searches_its_oracle_again_from_a_plan_that_beats_it():
    from kdvfs.experiments.noisy_jobs import schedule_json

    plan = Schedule(((0, ClockPair(1680, 9501)), (37, ClockPair(210, 405))))
    again = oracle_of(f"{ROW}:sync", BUDGET, starts=[schedule_json(plan)])
    assert again["searched_from_runs_plans"] == 1
    assert again["energy_saving"] >= saving_of(in_step(f"{ROW}:sync", BUDGET), plan) - 1e-12
