"""The search loop and `kdvfs compare`: budgets hold, strategies learn, output is complete."""

import json

import numpy as np
import pytest

from kdvfs.cli import main
from kdvfs.runtime.registry import open_device
from kdvfs.runtime.replay import ReplayDevice
from kdvfs.runtime.tables import load_table
from kdvfs.runtime.workloads import gpt3_xl_layer
from kdvfs.tuner.search import run_search
from kdvfs.tuner.sweep import evaluate, run_sweep

STRATEGIES = ["sweep", "random", "egreedy", "ucb", "thompson", "botorch", "crosskernel"]


@pytest.fixture(scope="module")
def table_csv(tmp_path_factory):
    """A small recorded table with a known shape: 6 kernels (memory-, compute-bound and mixed)
    on a 5 x 3 grid, energies from a U-shaped law, times from a roofline."""
    rows = ["kernel,core_mhz,mem_mhz,time_s,energy_j"]
    rng = np.random.default_rng(0)
    for k in range(6):
        comp, mem = [(1.0, 0.2), (0.2, 1.0), (0.7, 0.7)][k % 3]
        comp, mem = comp * (1 + 0.1 * k), mem * (1 + 0.1 * k)
        for core in (800, 1000, 1200, 1400, 1600):
            for memf in (4000, 5000, 6000):
                t = 1e-3 * (max(comp * 1600 / core, mem * 6000 / memf) + 0.05 * min(comp, mem))
                v = 0.7 + 0.3 * max(0, core - 1000) / 600
                p = 40 + 120 * v * v * core / 1600 * comp + 30 * memf / 6000 * (0.5 + mem)
                rows.append(f"k{k},{core},{memf},{t:.6g},{t * p * (1 + 0.002 * rng.standard_normal()):.6g}")
    path = tmp_path_factory.mktemp("t") / "table.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_reaches_the_known_optimum_within_budget(table_csv, strategy):
    def fresh():
        return ReplayDevice(load_table(table_csv), seed=0)

    device = fresh()
    workload = device.table.workload()
    target = evaluate(device, workload, run_sweep(device, workload, window_s=0.3).kernel_level_choice(0.01))
    r = run_search(fresh(), workload, strategy, budget=0.01, seed=1, window_s=0.3)
    assert r.slowdown <= 0.01 + 1e-12
    assert r.energy_saving >= 0.95 * target.energy_saving, (r.energy_saving, target.energy_saving)
    assert r.measurements <= len(workload) * (len(device.grid) + 1) + 1


def test_no_reported_plan_exceeds_the_budget_on_a_noisy_simulated_card():
    for strategy in ("random", "ucb", "crosskernel"):
        r = run_search(open_device("sim:a100", seed=3), gpt3_xl_layer(),
                       strategy, budget=0.01, seed=3, window_s=0.3, max_per_kernel=6)
        assert r.slowdown <= 0.01, (strategy, r.slowdown)


def test_botorch_beats_random_at_equal_measurements_on_a_real_table():
    from pathlib import Path

    csv = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "dvfs-real" / "gtx1080ti-dvfs-real-Performance-Power.csv"
    if not csv.exists():
        pytest.skip("shared data not present")

    def saving(strategy, seed):
        device = ReplayDevice(load_table(csv), seed=seed)
        return run_search(device, device.table.workload(), strategy, budget=0.01, seed=seed, window_s=0.3, max_per_kernel=4).energy_saving

    bo = np.mean([saving("botorch", s) for s in range(2)])
    rnd = np.mean([saving("random", s) for s in range(2)])
    assert bo > rnd + 0.003, (bo, rnd)


def test_cli_compare_json_and_mlflow(tmp_path, table_csv):
    out = tmp_path / "c.json"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert main(["compare", "--device", f"replay:{table_csv}", "--workload", "table", "--strategies", "ucb,crosskernel",
                 "--seeds", "2", "--budget", "0.01", "--window-s", "0.3", "--mlflow-uri", uri, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["source"] == "replayed"
    assert set(doc["strategies"]) == {"ucb", "crosskernel"} and len(doc["strategies"]["ucb"]) == 2
    run = doc["strategies"]["ucb"][0]
    assert set(run) >= {"seed", "measurements", "explore_seconds", "energy_saving", "slowdown", "plan", "curve", "tuner_cpu_s"}
    assert run["curve"][-1][0] == run["measurements"]
    assert doc["sweep"]["measurements"] > run["measurements"]
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("kdvfs-compare").experiment_id])
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(runs) == 5 and len(children) == 4
    assert client.get_metric_history(children[0].info.run_id, "energy_saving")


def test_cli_compare_rejects_unknown_strategy(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["compare", "--strategies", "ucb,annealing"])
    assert exc.value.code == 2 and "unknown strategy 'annealing'" in capsys.readouterr().err
