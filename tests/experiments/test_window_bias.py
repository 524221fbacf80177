"""window_bias: a trial of a wait-group schedule in short windows reads less saving than the
schedules run alone, and long windows read it within their error (the simulated H200 layer on
the recorded sync job); bad schedules are one-line errors."""

from __future__ import annotations

import pytest

from kdvfs.experiments import window_bias
from tests.experiments.one_line import one_line_error


def test_a_wait_group_candidate_reads_less_saving_in_short_windows_than_in_long_ones():
    args = window_bias.Args(windows_s="2,8", trial_s=128.0, alone_s=300.0)
    doc = window_bias.measure(args)
    assert doc["source"] == "simulated"
    short, long = doc["trials"]
    assert (short["window_s"], long["window_s"]) == (2.0, 8.0)
    # alone, 1440/3201 with the wait group saves about 4% against stock with it
    assert 0.03 < doc["alone"]["energy_saving"] < 0.055
    # in 2-s windows the trial reads a point and more less, beyond three of its errors; in 8-s
    # windows within three errors
    assert short["energy_bias"] < -0.008 and short["energy_bias_errors"] < -3.0
    assert abs(long["energy_bias_errors"]) < 3.0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--candidate", "[[1,null]]"], "--candidate's first group must start at site 0"),
        (["--incumbent", "stock"], "--incumbent must be a JSON list"),
        (["--windows-s", "2,x"], "--windows-s must be window lengths in s"),
        (["--windows-s", "0"], "--windows-s must be positive"),
    ],
)
def test_a_bad_schedule_or_window_is_a_one_line_error(argv, message, capsys):
    assert message in one_line_error(window_bias.main, argv, capsys)
