"""experiments/in_step_truth.py: any schedule of a noisy-job row in the card's in-step truth (the
noisy_jobs yardstick), alone on the simulated job, and the realisable oracle at any sites."""

from __future__ import annotations

import json

import pytest

from kdvfs.experiments import in_step_truth
from kdvfs.experiments.noisy_jobs import in_step, saving_of, schedule_of_json
from tests.experiments.one_line import one_line_error

SYNC = "h200:gpt3-xl-layer:sync"
ONE_KNOB = "[[0,[1440,3201]],[37,[1440,3201]]]"
WAIT_PAIR = "[[0,[1440,3201]],[37,[345,2201]]]"


def run(argv: list[str], capsys) -> dict:
    in_step_truth.main(argv)
    return json.loads(capsys.readouterr().out)


def test_each_schedule_reads_as_the_noisy_jobs_yardstick_reads_it(capsys):
    doc = run(["--row", SYNC, "--schedules", f"{ONE_KNOB};{WAIT_PAIR}"], capsys)
    step = in_step(SYNC, 0.01)
    assert doc["source"] == "simulated" and doc["oracles"] == []
    for row in doc["schedules"]:
        assert row["energy_saving"] == pytest.approx(saving_of(step, schedule_of_json(row["schedule"])))
        assert "alone" not in row


def test_alone_on_the_sync_job_a_wait_pair_costs_more_busy_time_than_the_yardstick_charges(capsys):
    # the yardstick's slowdown keeps the job's waits in the step's time; the tuner holds the
    # busy time (the waits left out) to the budget, and a wait pair's cost lands in the next
    # step's first kernels, which the busy time keeps
    doc = run(["--row", SYNC, "--schedules", WAIT_PAIR, "--alone-s", "300"], capsys)
    (row,) = doc["schedules"]
    assert row["alone"]["energy_saving"] > 0.0
    assert row["alone"]["busy_slowdown"] > row["slowdown"] + 0.001


def test_the_oracle_at_one_site_is_the_one_knob_optimum_and_at_the_jobs_sites_no_less(capsys):
    doc = run(["--row", "h200:gpt3-xl-layer:none", "--oracle-sites", "0", "--budgets", "0.01"], capsys)
    (one_site,) = doc["oracles"]
    assert one_site["sites"] == 1 and len(one_site["schedule"]) == 1
    assert one_site["slowdown"] <= 0.01
    doc = run(["--row", "h200:gpt3-xl-layer:none", "--oracle-sites", "job", "--budgets", "0.01"], capsys)
    (job,) = doc["oracles"]
    assert job["sites"] > 1 and job["energy_saving"] >= one_site["energy_saving"] - 1e-12


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--row", "h200"], "--row"),
        (["--row", "h200:gpt3-xl-layer:nope"], "--row"),
        (["--schedules", "[[0,null]]", "--alone-s", "nan"], "--alone-s"),
        (["--schedules", "[[1,null]]"], "--schedules"),
        (["--schedules", "[[0,[1681,3201]]]"], "--schedules"),
        ([], "--schedules"),
        (["--schedules", "not json"], "--schedules"),
        (["--oracle-sites", "0,5,3"], "--oracle-sites"),
        (["--oracle-sites", "1,2"], "--oracle-sites"),
        (["--budgets", "x"], "--budgets"),
        (["--budgets", "1.5"], "--budgets"),
        (["--alone-s", "-1"], "--alone-s"),
    ],
)
def test_bad_input_is_one_line_naming_the_option_with_exit_two(argv, named, capsys):
    err = one_line_error(in_step_truth.main, ["--row", "h200:gpt3-xl-layer:none", *argv], capsys)
    assert err.startswith("in_step_truth: error: ") and named in err
