"""experiments/release_gain.py: releasing the clocks at the step's last site against holding the
step's pair, by the job's wait, on a simulated card."""

from __future__ import annotations

import json

import pytest

from kdvfs.experiments import release_gain
from tests.experiments.one_line import one_line_error


def test_releasing_the_clocks_loses_where_the_job_never_waits_and_gains_where_it_waits_half_a_step(capsys):
    release_gain.main(["--device", "sim:h200", "--workload", "gpt3-xl", "--wait-shares", "0,0.5"])
    doc = json.loads(capsys.readouterr().out)
    never, half = doc["rows"]
    assert doc["source"] == "simulated" and doc["last_site"] == 897
    assert never["gain_points"] < 0.0 < half["gain_points"]
    assert half["gain_points"] == pytest.approx(100.0 * (half["released_saving"] - half["held_saving"]))


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--pair", "1380"], "--pair"),
        (["--pair", "1381,3201"], "--pair"),
        (["--wait-shares", "a"], "--wait-shares"),
        (["--wait-shares", "-0.1"], "--wait-shares"),
        (["--device", "replay:x.csv"], "--device"),
    ],
)
def test_bad_input_is_one_line_naming_the_option_with_exit_two(argv, named, capsys):
    err = one_line_error(release_gain.main, argv, capsys)
    assert err.startswith("release_gain: error: ") and named in err
