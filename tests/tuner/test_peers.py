"""Peers in the same run (tuner/peers.py): Zeus's own optimizer reaching its Done state on the
simulated card, and `kdvfs peers` scoring every peer against one stock run."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest

from kdvfs.cli import main
from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.tuner.peers import Loop, run_kdvfs, run_peers

ZEUS = importlib.util.find_spec("zeus") is not None


@pytest.mark.skipif(not ZEUS, reason="zeus is not installed (the 'peers' extra)")
def test_zeus_power_limit_optimizer_reaches_done_on_the_simulated_card_and_holds_its_choice():
    import sys

    import pynvml
    import zeus.device.gpu.nvidia as zeus_nvidia

    doc = run_peers("sim:rtx3080ti", "gpt3-xl-layer", ["zeus-power-limit"], budget=0.05, steps=1500)
    zeus = doc["peers"]["zeus-power-limit"]
    assert zeus["done"]
    assert zeus["limits_profiled"] == 11  # 350 W down to 100 W in 25-W steps
    assert zeus["profiling_steps"] < doc["steps"]
    assert 100.0 <= zeus["power_limit_w"] <= 350.0
    assert zeus["training_s"] > doc["stock"]["training_s"] * 0.9
    assert sys.modules["pynvml"] is pynvml and zeus_nvidia.pynvml is pynvml  # the real bindings are back


def test_peers_scores_every_peer_against_the_same_stock_run(tmp_path, capsys):
    out = tmp_path / "peers.json"
    code = main(
        [
            "peers",
            "envpipe-sm-stepdown,paper-sweep",
            "--device",
            "sim:rtx3080ti",
            "--steps",
            "40000",
            "--budget",
            "0.05",
            "--no-mlflow",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    doc = json.loads(out.read_text())
    assert set(doc["peers"]) == {"envpipe-sm-stepdown", "paper-sweep"}
    for p in doc["peers"].values():
        assert {"energy_saving", "slowdown", "training_s", "source"} <= p.keys()
        assert math.isclose(p["training_s"], doc["stock"]["training_s"] * (1 + p["slowdown"]))
    sweep = doc["peers"]["paper-sweep"]
    assert sweep["training_s"] > sweep["sweep_s"] > 0  # its exploration is in its run
    assert sweep["as_paper_ran_it"]["energy_saving"] != sweep["energy_saving"]  # a figure of its own
    assert "envpipe-sm-stepdown" in capsys.readouterr().out


def test_peers_refuses_an_unknown_peer_with_one_line(capsys):
    assert main(["peers", "nope", "--no-mlflow"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown peer 'nope'" in err[0]


@pytest.mark.parametrize("flag, value", [("--peers", "kdvfs"), ("--scenario", "power-cap")])
def test_compare_compares_strategies_only_peers_and_scenarios_are_their_own_commands(capsys, flag, value):
    with pytest.raises(SystemExit) as exit_:
        main(["compare", flag, value, "--no-mlflow"])
    assert exit_.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err


def test_kdvfs_still_tuning_at_the_end_of_its_run_trains_exactly_the_run_s_steps():
    # 1,500 steps of the 3080 Ti layer (about 100 s): the tuner is still searching when they end,
    # so its run is cut at the last step, not at the end of a chunk of training seconds
    device = open_device("sim:rtx3080ti", seed=0)
    loop = Loop(device, open_workload("gpt3-xl-layer", device))
    detail = run_kdvfs(loop, 1500, budget=0.01, seed=0)
    assert detail["converged_at_step"] is None
    assert loop.steps == 1500
