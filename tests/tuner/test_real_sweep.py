"""`kdvfs sweep` on a real card: a step's recorded ops, rebuilt and run alone at each clock
pair (runtime/op_device.py), here recorded and run on the CPU with the fake NVML card."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from kdvfs.cli import main
from kdvfs.runtime import nvml_device
from kdvfs.runtime.nvml_device import NvmlDevice
from kdvfs.runtime.op_device import OpReplayDevice
from kdvfs.runtime.op_replay import load_ops, record_ops, save_ops
from kdvfs.tuner.sweep import measure_every_pair, measured_figures, spread_pairs, sweep_reference
from tests.runtime import fake_pynvml

FAST = ["--window-s", "0.1", "--warmup-s", "0.3", "--reference-s", "0.6", "--pairs", "2"]


@pytest.fixture
def card(monkeypatch, tmp_path, lease_registry):
    """The fake NVML card as pynvml, its counter advancing every 20 ms; leases in tmp_path."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)
    monkeypatch.delenv("KDVFS_NVML_MODULE", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setattr(nvml_device, "admin_privilege", lambda: (True, "the fake card needs no root"))
    return fake_pynvml.configure(energy_period_s=0.02, clock_event_reasons=0)


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: on a loaded 2-core machine two threads' barrier waits make a
    small op's time swing tenfold, where one thread's swings by a fraction."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def ops_file(tmp_path_factory):
    """A small training step's ops (a linear layer, SGD), recorded on the CPU."""
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(256, 256)

    def step() -> None:
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    path = tmp_path_factory.mktemp("ops") / "step.json"
    save_ops(record_ops(step, steps=2, cuda=False), path, device="cpu")
    return path


def test_a_dry_run_sweep_of_recorded_ops_comes_out_stock_the_null_test(card, ops_file, tmp_path, capsys):
    out = tmp_path / "sweep.json"
    assert (
        main(["sweep", "--device", "nvml:0", "--workload", f"ops:{ops_file}", *FAST, "--json", str(out)]) == 0
    )
    doc = json.loads(out.read_text())
    assert doc["source"] == "measured" and doc["dry_run"]
    assert doc["ops_rebuilt"] >= 5 and doc["kernels_swept"] == doc["ops_rebuilt"]
    assert doc["null_test"]["held"] and doc["null_test"]["clock_requests_recorded"] > 0
    assert doc["kernel_level"]["energy_saving"] == 0.0 and doc["pass_level"]["energy_saving"] == 0.0
    assert doc["realisable"]["groups"] == [{"start": 0, "kernel": doc["cells"][0]["kernel"], "pair": None}]
    assert doc["null_sd"] > 0 and doc["energy_margin"] > doc["null_sd"]
    assert "null test:" in capsys.readouterr().out


def test_a_pair_that_truly_draws_less_power_is_planned_and_its_saving_measured(card, ops_file, tmp_path):
    # applied clocks (the fake card has no hardware): the lowest core clock draws a twentieth
    # of the power. The fake's energy is power x wall time, so a loaded CPU's timing noise is
    # its energy noise too (A/A s.d. up to ~60% with the suite two at a time and other jobs:
    # a fifth of the power and a 50% budget were planned at stock in 1 of 8 such runs, the
    # margin and the time limit rightly refusing); at a twentieth and a 500% budget neither
    # the margin (3.8 s.d.) nor the time limit refuses it at any s.d. an A/A pair can show (<= 1.41)
    card.power_at = lambda gpu, mem: 4_000 if gpu is not None and gpu[0] == 345 else 80_000
    ops, where = load_ops(ops_file)
    with OpReplayDevice(NvmlDevice(0, lease_dir=tmp_path), ops, torch_device=where) as device:
        pairs = spread_pairs(device.grid.pairs, 2)
        assert pairs[0].core_mhz == 345  # the grid ascends
        obs = sweep_reference(device, device.workload, pairs, warmup_s=0.3, window_s=0.6)
        measure_every_pair(device, obs, window_s=0.1)
    plan = measured_figures(obs, obs.kernel_level_choice(budget=5.0))
    assert plan.energy_saving > 0.5, f"noise s.d. {obs.null_sd():.2f}, margin {obs.energy_margin():.2f}"
    assert sum(p is not None for p in plan.choice.values()) > len(plan.choice) / 2


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--device", "nvml:0", "--workload", "gpt3-xl-layer"], "--workload ops:FILE"),
        (["--device", "sim:h200", "--workload", "ops:x.json"], "--device nvml:INDEX"),
        (["--device", "nvml:0", "--workload", "ops:/nonexistent/ops.json"], "cannot read"),
        (["--device", "nvml:zero", "--workload", "ops:x.json"], "whole number"),
    ],
)
def test_bad_real_sweep_input_is_one_clear_line(card, argv, says, capsys):
    assert main(["sweep", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]
