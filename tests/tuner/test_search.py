"""The search loop and `kdvfs compare`: budgets hold (verified plans), strategies learn, the
exchange rate is the knapsack's, throttled pairs share adjacent stock measurements, output is
complete."""

import dataclasses
import json

import numpy as np
import pytest

from kdvfs.cli import main
from kdvfs.runtime.measure import measure_reference_steps
from kdvfs.runtime.registry import open_device
from kdvfs.runtime.replay import ReplayDevice
from kdvfs.runtime.tables import load_table
from kdvfs.runtime.workloads import gpt3_xl_layer
from kdvfs.tuner.observations import Observations
from kdvfs.tuner.search import Bench, estimate_exchange_rate_w, run_search, verified_plan
from kdvfs.tuner.sweep import evaluate, run_sweep

STRATEGIES = ["sweep", "random", "egreedy", "ucb", "thompson", "botorch", "crosskernel"]


@pytest.fixture(scope="module")
def table_csv(tmp_path_factory):
    """A small recorded table with a known shape: 6 kernels (memory-, compute-bound and mixed)
    on a 5 x 3 grid, energies from a U-shaped law, times from a roofline (tens of ms a launch,
    so that a reference of training steps simulates quickly)."""
    rows = ["kernel,core_mhz,mem_mhz,time_s,energy_j"]
    rng = np.random.default_rng(0)
    for k in range(6):
        comp, mem = [(1.0, 0.2), (0.2, 1.0), (0.7, 0.7)][k % 3]
        comp, mem = comp * (1 + 0.1 * k), mem * (1 + 0.1 * k)
        for core in (800, 1000, 1200, 1400, 1600):
            for memf in (4000, 5000, 6000):
                t = 2e-2 * (max(comp * 1600 / core, mem * 6000 / memf) + 0.05 * min(comp, mem))
                v = 0.7 + 0.3 * max(0, core - 1000) / 600
                p = 40 + 120 * v * v * core / 1600 * comp + 30 * memf / 6000 * (0.5 + mem)
                rows.append(f"k{k},{core},{memf},{t:.6g},{t * p * (1 + 0.002 * rng.standard_normal()):.6g}")
    path = tmp_path_factory.mktemp("t") / "table.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.fixture(scope="module")
def table_sweep(table_csv):
    """The small table's sweep: device, workload, observations."""
    device = ReplayDevice(load_table(table_csv), seed=0)
    workload = device.table.workload()
    return device, workload, run_sweep(device, workload, window_s=0.3)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_reaches_the_known_optimum_within_budget(table_csv, table_sweep, strategy):
    device, workload, sweep = table_sweep
    target = evaluate(device, workload, sweep.kernel_level_choice(0.01))
    r = run_search(
        ReplayDevice(load_table(table_csv), seed=0), workload, strategy, budget=0.01, seed=1, window_s=0.3
    )
    assert r.slowdown <= 0.01 + 1e-12
    assert r.energy_saving >= 0.95 * target.energy_saving, (r.energy_saving, target.energy_saving)
    assert r.measurements <= len(workload) * (len(device.grid) + 1) + 1


def test_no_reported_plan_exceeds_the_budget_on_a_noisy_simulated_card():
    """Much noise: the plan solved from what the search measured goes over the budget (the
    winner's curse); the plan it reports, verified, does not."""
    # a seed whose raw plan overshoots on the ladder-calibrated card with copies of a kernel
    # sharing its cells (seeds 0-9 at 4x the preset's noise: 2 does, +1.32%, since fe2bd8d;
    # 2 and 4 of 0-5 before; at 2x none of 0-9)
    device, workload = open_device("sim:a100", seed=2, noise=4.0), gpt3_xl_layer(batch=16)
    r = run_search(device, workload, "crosskernel", budget=0.01, seed=2, window_s=0.3, max_per_kernel=6)
    assert evaluate(device, workload, r.observations.kernel_level_choice(0.01)).slowdown > 0.01
    assert r.slowdown <= 0.01 and r.verify_measurements > 0


def test_a_plan_measured_optimistically_is_verified_back_within_budget(table_csv, table_sweep):
    """Every cell's time recorded 3 % fast (a winner's curse in the extreme, on a card whose
    reference shows 0.3 % noise): the plan solved from it overshoots the budget; the verified
    plan, judged by fresh measurements, does not, and its fresh measurements are counted."""
    device, workload, sweep = table_sweep
    obs = Observations(workload, sweep.pairs, dataclasses.replace(sweep.reference, time_rel_sd=0.003))
    for name in ("time_s", "energy_j", "counts", "paired_ratio", "stock_time_s", "stock_energy_j"):
        setattr(obs, name, getattr(sweep, name).copy())
    obs.time_s *= 0.97
    assert evaluate(device, workload, obs.kernel_level_choice(0.01)).slowdown > 0.015
    plan = verified_plan(Bench(ReplayDevice(load_table(table_csv), seed=0), 0.3), obs, 0.01)
    figures = evaluate(device, workload, plan)
    assert (
        figures.slowdown <= 0.01
        and figures.energy_saving
        > 0.5 * evaluate(device, workload, sweep.kernel_level_choice(0.01)).energy_saving
    )
    assert obs.measurements >= sum(p is not None for p in plan.values()) > 0


def test_exchange_rate_is_the_multiplier_of_the_tuned_kernels_plan(table_sweep):
    """At the rate, each kernel's least energy + rate x time fits their share of the limit;
    at 10 % less it does not; when the least energy fits anyway, the rate is 0."""
    _, workload, sweep = table_sweep
    tuned = np.ones(len(workload), dtype=bool)
    tuned[0] = False
    time_s, energy_j = sweep.plannable()
    times = np.column_stack([time_s, sweep.ref_time_s])[tuned]
    energies = np.column_stack([energy_j, sweep.stock_energy_j])[tuned]

    def plan_time_s(exchange_rate_w):
        pick = np.nanargmin(energies + exchange_rate_w * times, axis=1)
        return times[np.arange(len(times)), pick].sum()

    limit_s = sweep.time_limit_s(0.0) * sweep.ref_time_s[tuned].sum() / sweep.ref_time_s.sum()
    exchange_rate_w = estimate_exchange_rate_w(sweep, 0.0, tuned)
    assert plan_time_s(exchange_rate_w) <= limit_s < plan_time_s(0.9 * exchange_rate_w)
    assert estimate_exchange_rate_w(sweep, 10.0, tuned) == 0.0


def test_bench_pairs_throttled_pairs_with_the_adjacent_stock_measurement():
    """A capped GEMM pair right after the kernel's stock measurement pairs with it; the next
    one gets a stock measurement right after it, which pairs the one after that too."""
    device = open_device("sim:rtx3080ti", seed=0)
    workload = gpt3_xl_layer()
    k = next(i for i, kernel in enumerate(workload.kernels) if kernel.name == "fc_fwd")
    obs = Observations(
        workload, device.grid.pairs, measure_reference_steps(device, workload.kernels, 1.0, 2.0)
    )
    capped = [p for p in device.grid.pairs if p.mem_mhz == 9501 and p.core_mhz >= 1680]
    bench = Bench(device, 0.3)
    bench.stock(obs, k)
    counts = []
    for pair in capped[:3]:
        bench.cell(obs, k, pair)
        counts.append(obs.measurements)
    assert obs.throttled == 3 and counts == [2, 4, 5]
    assert not np.isnan(obs.paired_ratio[k, [obs.pairs.index(p) for p in capped[:3]], 0]).any()


def test_botorch_beats_random_at_equal_measurements_on_a_real_table():
    from pathlib import Path

    csv = (
        Path(__file__).resolve().parents[2]
        / "data"
        / "dvfs-real"
        / "gtx1080ti-dvfs-real-Performance-Power.csv"
    )

    def saving(strategy, seed):
        device = ReplayDevice(load_table(csv), seed=seed)
        return run_search(
            device, device.table.workload(), strategy, budget=0.01, seed=seed, window_s=0.3, max_per_kernel=3
        ).energy_saving

    bo = np.mean([saving("botorch", s) for s in range(2)])
    rnd = np.mean([saving("random", s) for s in range(2)])
    assert bo > rnd + 0.003, (bo, rnd)


def test_cli_compare_json_and_mlflow(tmp_path, table_csv, sqlite_store_uri):
    out = tmp_path / "c.json"
    uri = sqlite_store_uri
    assert (
        main(
            [
                "compare",
                "--device",
                f"replay:{table_csv}",
                "--workload",
                "table",
                "--strategies",
                "random,ucb",
                "--seeds",
                "2",
                "--budget",
                "0.01",
                "--window-s",
                "0.3",
                "--mlflow-uri",
                uri,
                "--json",
                str(out),
            ]
        )
        == 0
    )
    doc = json.loads(out.read_text())
    assert doc["source"] == "replayed"
    assert set(doc["strategies"]) == {"random", "ucb"} and len(doc["strategies"]["ucb"]) == 2
    run = doc["strategies"]["ucb"][0]
    assert set(run) >= {
        "seed",
        "measurements",
        "explore_seconds",
        "energy_saving",
        "slowdown",
        "plan",
        "curve",
        "tuner_cpu_s",
    }
    assert run["curve"][-1][0] == run["measurements"]
    assert doc["sweep"]["measurements"] > run["measurements"]
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("kdvfs-compare").experiment_id])
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(runs) == 5 and len(children) == 4
    assert client.get_metric_history(children[0].info.run_id, "energy_saving")
    # parent and children carry what tune runs carry, so that the runs table compares them
    identity = {"gpu", "clock_grid", "source", "workload_signature", "kdvfs_version"}
    for r in runs:
        assert identity <= set(r.data.params) and identity <= set(r.data.tags) and r.info.status == "FINISHED"
        assert r.data.tags["workload_signature"] == doc["signature"] and r.data.params["source"] == "replayed"
    (parent,) = [r for r in runs if r not in children]
    assert parent.data.metrics["sweep_energy_saving"] == pytest.approx(doc["sweep"]["energy_saving"])
    assert parent.data.metrics["ucb.energy_saving"] == pytest.approx(doc["summary"]["ucb"]["energy_saving"])
    child = next(r for r in children if r.info.run_name == "ucb-seed0")
    assert child.data.metrics["final_energy_saving"] == pytest.approx(run["energy_saving"])
    assert child.data.params["strategy"] == "ucb" and child.data.metrics["sweep_energy_saving"] > 0


def test_cli_compare_rejects_unknown_strategy(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["compare", "--strategies", "ucb,annealing"])
    assert exc.value.code == 2 and "unknown strategy 'annealing'" in capsys.readouterr().err
