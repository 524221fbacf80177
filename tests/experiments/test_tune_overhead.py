"""The per-step overhead benchmark of kdvfs.tune (experiments/tune_overhead.py) on the CPU and the
fake NVML card, briefly: what it prints, not what it measures."""

from __future__ import annotations

import json

import pytest

from kdvfs.experiments import tune_overhead

pytestmark = pytest.mark.usefixtures("lease_registry")  # kdvfs.tune holds its restore there


@pytest.mark.parametrize("driver", ["hf", "step"])
def test_a_short_run_prints_bare_and_tuned_step_times_with_the_overhead_between_them(
    driver, tmp_path, capsys
):
    out = tmp_path / "overhead.json"
    result = tune_overhead.main([
        "--rounds", "1", "--arm-s", "0.4", "--warmup-s", "0.2", "--layers", "2", "--driver", driver,
        "--out", str(out),
    ])  # fmt: skip
    assert json.loads(capsys.readouterr().out) == result == json.loads(out.read_text())
    assert result["measured_on"].startswith("measured on CPU, fake NVML")
    (round_,) = result["rounds"]
    bare, tuned = round_["bare"], round_["tuned"]
    assert bare["steps"] > 0 and tuned["steps"] > 0
    assert result["bare_step_ms"] > 0 and result["tuned_step_ms"] > 0
    assert result["overhead"] == pytest.approx(result["tuned_step_ms"] / result["bare_step_ms"] - 1, abs=1e-3)
    assert tuned["tuner"]["mismatched_steps"] == 0  # the job's sites were the tuner's every step
    assert "kdvfs-clock-controller" in tuned["threads"] and "kdvfs-clock-controller" not in bare["threads"]


def test_an_unknown_option_is_refused_with_one_line():
    with pytest.raises(SystemExit, match="unknown option --colour"):
        tune_overhead.parse_args(["--colour", "red"])


def test_an_interleaved_run_alternates_bare_and_tuned_blocks_of_one_job_and_pairs_them(capsys):
    # blocks of 2 s: with 0.5-s blocks, twice in full runs of the suite on a loaded CPU, a block
    # had no timed step (a tuned block opens kdvfs.tune at its first step)
    result = tune_overhead.main([
        "--interleave-s", "2", "--settle-s", "0.15", "--rounds", "2", "--warmup-s", "0.2", "--layers", "2",
    ])  # fmt: skip
    capsys.readouterr()
    blocks = result["interleaved"]["blocks"]
    assert [b["tuned"] for b in blocks] == [False, True, True, False]
    assert all(b["steps"] > 0 for b in blocks)
    pairs = result["interleaved"]["overhead_per_pair"]
    assert pairs == pytest.approx([
        blocks[1]["step_ms"] / blocks[0]["step_ms"] - 1, blocks[2]["step_ms"] / blocks[3]["step_ms"] - 1,
    ], abs=1e-4)  # fmt: skip
    assert result["overhead"] == pytest.approx(sum(pairs) / 2, abs=1e-4)
    assert result["interleaved"]["tuned_blocks"] == 2 and result["interleaved"]["mismatched_steps"] == 0


def test_an_interleaved_block_no_longer_than_its_settling_is_refused():
    with pytest.raises(SystemExit, match="--interleave-s must be 0 or more than --settle-s"):
        tune_overhead.parse_args(["--interleave-s", "0.5", "--settle-s", "1"])
