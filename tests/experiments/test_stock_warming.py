"""stock_warming on the H200 recordings in the repository: near its power limit (the sync job,
668 W of 700) the warming card's SM clock falls and its stock step slows; off the limit (hf)
the clock stays at the top. A missing recording is a one-line error."""

from __future__ import annotations

from pathlib import Path

import pytest

from kdvfs.experiments import stock_warming

RECORDING = str(Path(__file__).resolve().parents[2] / "data" / "h200" / "jobs")


def test_near_its_power_limit_a_warming_card_runs_stock_slower_at_a_lower_clock():
    doc = stock_warming.measure(stock_warming.Args(recording=RECORDING, job="sync"))
    assert doc["temperature_change_c"] > 1.0
    assert doc["sm_clock_change_mhz"] < -5.0
    assert 0.002 < doc["step_time_change"] < 0.006  # +0.37%: the reference's first 30 s read it fast
    assert all(b["power_w"] > 600.0 for b in doc["bins"])


def test_off_its_power_limit_the_card_keeps_its_top_clock_as_it_warms():
    doc = stock_warming.measure(stock_warming.Args(recording=RECORDING, job="hf"))
    assert doc["sm_clock_change_mhz"] == pytest.approx(0.0)
    assert all(b["sm_clock_mhz"] == pytest.approx(1980.0) for b in doc["bins"])


def test_a_job_the_recording_does_not_hold_is_a_one_line_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        stock_warming.main(["--recording", RECORDING, "--job", "nope"])
    assert exit_info.value.code == 2
    assert "no recording file" in capsys.readouterr().err.strip().splitlines()[-1]
