"""thermal_carryover: a plan that cools the card reads slower alternated with stock than alone
(the simulated RTX 3080 Ti's whole step near its power limit), and a bad pair is a one-line error."""

from __future__ import annotations

import pytest

from kdvfs.experiments import thermal_carryover


def test_alternated_with_stock_a_cooler_plan_reads_slower_than_it_runs_alone():
    args = thermal_carryover.Args(warmup_s=150.0, measure_s=120.0)
    doc = thermal_carryover.measure(args)
    assert doc["source"] == "simulated"
    assert doc["alone"]["plan"]["temperature_c"] < doc["alternated"]["plan"]["temperature_c"] - 0.5
    # alone it runs within 0.1 point of the noiseless in-step figure; alternated, over 0.15 slower
    assert doc["slowdown_alone"] == pytest.approx(doc["in_step_truth"]["slowdown"], abs=0.001)
    assert doc["slowdown_alternated"] > doc["slowdown_alone"] + 0.0015


def test_a_pair_that_is_not_core_slash_memory_is_a_one_line_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        thermal_carryover.main(["--pair", "1680"])
    assert exit_info.value.code == 2
    assert "--pair must be CORE/MEM in MHz" in capsys.readouterr().err
