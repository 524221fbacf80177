"""The full-sweep baseline: the paper's regime on the simulated 3080 Ti, budgets, replay."""

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from kdvfs.cli import main
from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.runtime.workloads import gpt3_xl_layer
from kdvfs.tuner.sweep import MAX_REPLANS, evaluate, held_to_budget, pass_level_choice, run_sweep

DATA = Path(__file__).resolve().parents[2] / "data"
GTX1080TI = DATA / "dvfs-real" / "gtx1080ti-dvfs-real-Performance-Power.csv"


@pytest.fixture(scope="module")
def rtx_sweep():
    device = open_device("sim:rtx3080ti", seed=0)
    workload = open_workload("gpt3-xl-layer")
    return device, workload, run_sweep(device, workload)


def test_sweep_lands_in_the_founding_papers_regime(rtx_sweep):
    device, workload, grid = rtx_sweep
    # every pair and a stock measurement per distinct kernel (kernels of the same work share
    # them), and a paired stock one per throttled pair
    assert grid.measurements == distinct_kernels(workload) * (50 + 1) + grid.throttled
    kernel = evaluate(device, workload, grid.kernel_level_choice(0.01))
    passes = evaluate(device, workload, pass_level_choice(grid, 0.01))
    assert 0.08 <= kernel.energy_saving <= 0.20
    assert kernel.slowdown <= 0.01
    assert passes.slowdown <= 0.01
    assert passes.energy_saving < kernel.energy_saving - 0.03


def test_plans_follow_the_kernels_needs(rtx_sweep):
    """GEMMs keep a high memory clock and lower core; memory-bound kernels keep the memory
    clock and drop the core clock."""
    _device, workload, grid = rtx_sweep
    choice = grid.kernel_level_choice(0.01)
    for k in workload.kernels:
        if k.name in ("softmax_fwd", "gelu_fwd", "adamw_fc", "ln1_fwd"):
            assert choice[k.name].mem_mhz == 9501 and choice[k.name].core_mhz <= 1470
        if k.name in ("fc_fwd", "qkv_fwd"):
            assert choice[k.name] is not None
            assert choice[k.name].mem_mhz >= 5001 and choice[k.name].core_mhz < 2100


def test_a_tighter_budget_saves_less_and_holds(rtx_sweep):
    device, workload, grid = rtx_sweep
    tight = evaluate(device, workload, grid.kernel_level_choice(0.0))
    loose = evaluate(device, workload, grid.kernel_level_choice(0.05))
    assert tight.slowdown <= 0.0 + 1e-9
    assert loose.slowdown <= 0.05 and loose.energy_saving > tight.energy_saving


@pytest.mark.parametrize("noise", [0.0, 0.03])
def test_replay_sweep_plan_is_within_budget(noise):
    device = open_device(f"replay:{GTX1080TI}", seed=1, noise=noise)
    workload = open_workload("table", device)
    grid = run_sweep(device, workload)
    plan = evaluate(device, workload, grid.kernel_level_choice(0.01))
    assert plan.slowdown <= 0.01
    assert plan.energy_saving >= 0.0


def test_cli_sweep_json_and_determinism(tmp_path):
    out = [tmp_path / "a.json", tmp_path / "b.json"]
    for path in out:
        assert (
            main(["sweep", "--device", "sim:a100", "--budget", "0.02", "--seed", "7", "--json", str(path)])
            == 0
        )
    a, b = (json.loads(p.read_text()) for p in out)
    assert a == b
    assert a["source"] == "simulated"
    assert set(a["kernel_level"]) >= {"energy_saving", "slowdown", "plan"}
    assert set(a["pass_level"]) >= {"energy_saving", "slowdown"}
    assert a["measurements"] >= distinct_kernels(gpt3_xl_layer()) * (len(open_device("sim:a100").grid) + 1)
    assert len(a["kernel_level"]["plan"]) == 44
    assert a["reference"]["step_time_s"] > 0 and a["reference"]["step_energy_j"] > 0
    realisable = a["realisable"]
    assert (
        realisable["slowdown"] <= 0.02
        and 0 <= realisable["energy_saving"] <= a["kernel_level"]["energy_saving"]
    )
    assert realisable["groups"][0]["start"] == 0 and realisable["switch_latency_s"] == 0.015
    # the A100's cap holds per launch: every plan of the budget holds in the step as planned
    assert {h["planned_budget"] for h in a["held_to_budget"].values()} == {0.02}
    starts = [g["start"] for g in realisable["groups"]]
    assert starts == sorted(set(starts))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["sweep", "--device", "sim:v100"], "unknown simulated GPU preset 'v100'"),
        (["sweep", "--device", "gpu:0"], "unknown device 'gpu:0'"),
        (["sweep", "--workload", "gpt3-xl-layer:batch=x"], "bad option 'batch=x'"),
        (["sweep", "--device", "replay:/nonexistent.csv", "--workload", "table"], "/nonexistent.csv"),
        (["sweep", "--workload", "table"], "needs a replay:CSV device"),
        (["sweep", "--workload", "gpt3-xl-dp1"], "rank count must be a whole number >= 2"),
        (["sweep", "--workload", "gpt3-xl:ranks=2"], "bad option 'ranks=2'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


def test_usage_errors_and_help_import_nothing_heavy():
    code = (
        "import sys; from kdvfs.cli import build_parser; build_parser(); "
        "heavy = [m for m in ('torch', 'botorch', 'mlflow', 'gymnasium', 'numpy') if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == ""
    bad = subprocess.run(
        [sys.executable, "-m", "kdvfs.cli", "sweep", "--budget", "lots"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "budget must be a number" in bad.stderr


def distinct_kernels(workload) -> int:
    """Kernels of distinct work: what a sweep of a simulated card measures."""
    return len(
        {(k.flops, k.bytes_moved, k.tensor_core, k.kind, k.wait_s, k.launches) for k in workload.kernels}
    )


@dataclass(frozen=True)
class _Plan:
    planned_at: float
    energy_saving: float
    slowdown: float


def test_a_plan_the_step_runs_over_budget_is_planned_again_at_a_tighter_budget():
    # the step runs each plan 3x slower than planned (as a windowed cap can); saving grows with it
    held = held_to_budget(lambda b: _Plan(b, 5.0 * b, 3.0 * b), lambda: _Plan(0.0, 0.0, 0.0), 0.01)
    assert held.first_slowdown == pytest.approx(0.03) and held.plan.slowdown <= 0.01
    assert 0.01 / 3 - 0.01 / 2**MAX_REPLANS < held.planned_budget <= 0.01 / 3
    assert held.plan.planned_at == held.planned_budget


def test_a_plan_over_budget_at_every_planning_budget_falls_back_to_stock():
    # a pair measured faster alone than with its neighbours: every plan picks it
    held = held_to_budget(lambda b: _Plan(b, 0.05, 0.03), lambda: _Plan(0.0, 0.0, 0.0), 0.01)
    assert held.plan == _Plan(0.0, 0.0, 0.0) and held.planned_budget == 0.0 and held.first_slowdown == 0.03
