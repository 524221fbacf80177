"""`kdvfs tune` end to end: JSON, plan file, MLflow contents, a tracking server that dies, Ctrl-C,
the dry-run null test."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from kdvfs.cli import main
from kdvfs.tuner.plan import load_plan
from kdvfs.tuner.run import METRICS
from kdvfs.tuner.tracking import Tracker

ARGS = ["tune", "--device", "sim:rtx3080ti-fastswitch", "--strategy", "ucb", "--no-sweep", "--seed", "1"]


def test_tune_writes_json_plan_and_mlflow_run(tmp_path, monkeypatch, sqlite_store_uri, capsys):
    monkeypatch.chdir(tmp_path)
    uri = sqlite_store_uri
    out, plan_path = tmp_path / "t.json", tmp_path / "plan.json"
    assert (
        main(
            [
                *ARGS,
                "--seconds",
                "200",
                "--mlflow-uri",
                uri,
                "--json",
                str(out),
                "--plan-out",
                str(plan_path),
            ]
        )
        == 0
    )
    doc = json.loads(out.read_text())
    assert doc["source"] == "simulated" and 200 <= doc["seconds"] < 201
    assert set(doc) >= {
        "energy_saving",
        "slowdown",
        "converged_after_s",
        "realisable_oracle",
        "running",
        "max_cumulative_slowdown",
    }
    assert set(doc["running"]) == {"energy_saving", "slowdown", "groups"}
    assert doc["max_cumulative_slowdown"] <= 0.01 and doc["trials"] > 0
    assert doc["phases"][:2] == ["Reference", "Verifying"]  # the model prior is verified first
    # under its 350-W cap the card's stock runs below the grid's top, and the report says so
    clock_mhz = doc["tuner"]["stock_sm_clock_mhz"]
    assert 1500 < clock_mhz < 2100
    assert f"stock's SM clock (measured by the tuner at its reference): {clock_mhz:.0f} MHz, under" in (
        capsys.readouterr().out
    )
    plan = load_plan(plan_path)
    assert plan.workload_signature == doc["signature"] and plan.source == "simulated"
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("kdvfs-tune").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.params["strategy"] == "ucb" and run.data.params["budget"] == "0.01"
    history = client.get_metric_history(run.info.run_id, "slowdown")
    assert len(history) > 10 and max(m.value for m in history) <= 0.01
    # step metrics under the tuning run's names, the ones kdvfs.tune logs (tests/tuner/test_job_tuning.py)
    step_metrics = {
        k for k in run.data.metrics if not k.startswith(("final_", "run_", "realisable_", "ideal_"))
    }
    assert (
        {"slowdown", "energy_saving", "plan_energy_saving", "phase"}
        <= step_metrics
        <= set(METRICS)
        | {
            "max_cumulative_slowdown",
            "trials",
            "converged_after_s",
        }
    )
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)} | {
        a.path for a in client.list_artifacts(run.info.run_id, "plots")
    }
    assert {"plan.json", "tune.json", "plots/convergence.png"} <= artifacts


def _spawn(tmp_path: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.Popen(
        [sys.executable, "-m", "kdvfs.cli", *ARGS, *extra],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_run(uri: str, experiment: str, timeout_s: float = 60.0):
    client = MlflowClient(uri)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        exp = client.get_experiment_by_name(experiment)
        runs = client.search_runs([exp.experiment_id]) if exp else []
        if runs:
            return runs[0]
        time.sleep(0.2)
    raise AssertionError("the tune run never appeared in MLflow")


def _wait_for_metric(uri: str, run_id: str, key: str, timeout_s: float = 60.0) -> None:
    client = MlflowClient(uri)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if client.get_metric_history(run_id, key):
            return
        time.sleep(0.2)
    raise AssertionError(f"the tune run never logged {key}")


def test_tuning_finishes_when_the_tracking_server_dies_and_metrics_arrive_later(tmp_path, live_mlflow_server):
    proc = _spawn(tmp_path, "--seconds", "600", "--mlflow-uri", live_mlflow_server.uri, "--json", "t.json")
    run = _wait_for_run(live_mlflow_server.uri, "kdvfs-tune")
    live_mlflow_server.kill()
    _out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert json.loads((tmp_path / "t.json").read_text())["seconds"] >= 600
    assert "Traceback" not in err
    spools = list((tmp_path / "kdvfs-spool").glob("*.jsonl"))
    assert spools, "metrics were not kept on disk"
    live_mlflow_server.start()
    Tracker(live_mlflow_server.uri).replay_spool(spools[0])
    client = MlflowClient(live_mlflow_server.uri)
    history = client.get_metric_history(run.info.run_id, "slowdown")
    assert history and max(m.step for m in history) > 5_000  # steps: 600 s of ~66-ms steps
    assert client.get_run(run.info.run_id).info.status == "FINISHED"


@pytest.mark.usefixtures("sigint_default")
def test_ctrl_c_restores_stock_keeps_the_plan_and_closes_the_run(tmp_path, sqlite_store_uri):
    uri = sqlite_store_uri
    proc = _spawn(
        tmp_path,
        "--seconds",
        "1e6",
        "--mlflow-uri",
        uri,
        "--plan-out",
        "plan.json",
        "--json",
        "t.json",
    )
    run = _wait_for_run(uri, "kdvfs-tune")
    _wait_for_metric(uri, run.info.run_id, "slowdown")  # the tuner runs: stock was measured
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert (
        "interrupted while training under the tuner: stock clocks restored" in err and "Traceback" not in err
    )
    plan = load_plan(tmp_path / "plan.json")  # the plan so far, kept once stock was measured
    assert plan.reference_time_s > 0 and plan.reference_energy_j > 0
    doc = json.loads((tmp_path / "t.json").read_text())
    assert doc["partial"] and doc["seconds"] < 1e6
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("kdvfs-tune").experiment_id])
    assert run.info.status == "KILLED"


def test_tune_on_a_card_the_store_has_no_plan_for_carries_another_gpus_plan_and_says_so(tmp_path, capsys):
    from kdvfs.runtime.registry import open_device, open_workload
    from kdvfs.runtime.types import ClockPair
    from kdvfs.tuner.plan import Plan
    from kdvfs.tuner.plan_store import PlanStore

    rtx = open_device("sim:rtx3080ti")
    workload = open_workload("gpt3-xl-layer")
    store = PlanStore(tmp_path / "plans")
    store.put(
        Plan.from_groups(
            gpu_name=rtx.name,
            grid=rtx.grid,
            workload=workload,
            budget=0.01,
            groups=[(0, len(workload), ClockPair(1680, 9501), 1.0, 1.0)],
            reference_time_s=1.0,
            reference_energy_j=1.0,
            source="simulated",
            strategy="ucb",
            measurements=0,
        )
    )
    out = tmp_path / "t.json"
    assert (
        main(
            [
                "tune",
                "--device",
                "sim:a100",
                "--strategy",
                "ucb",
                "--no-sweep",
                "--no-mlflow",
                "--seconds",
                "60",
                "--plan-store",
                str(store.root),
                "--json",
                str(out),
            ]
        )
        == 0
    )
    doc = json.loads(out.read_text())
    assert doc["prior"]["source"] == "transferred"
    assert "the plan of NVIDIA GeForce RTX 3080 Ti" in doc["prior"]["note"]
    assert doc["max_cumulative_slowdown"] <= 0.01
    captured = capsys.readouterr()
    assert "carried to this card's clocks by relative position (1125/1215 MHz)" in captured.err
    assert "prior: transferred" in captured.out
    assert len(store.entries()) == 1  # a carried plan is not stored as this card's own


def test_a_run_left_running_by_sigkill_is_marked_failed_by_the_next_run(
    tmp_path, capsys, caplog, sqlite_store_uri
):
    uri = sqlite_store_uri
    proc = _spawn(tmp_path, "--seconds", "1e6", "--mlflow-uri", uri)
    killed = _wait_for_run(uri, "kdvfs-tune")
    proc.kill()
    proc.communicate(timeout=60)
    assert MlflowClient(uri).get_run(killed.info.run_id).info.status == "RUNNING"
    assert main([*ARGS, "--no-sweep", "--seconds", "5", "--mlflow-uri", uri]) == 0
    assert MlflowClient(uri).get_run(killed.info.run_id).info.status == "FAILED"
    said = [r.getMessage() for r in caplog.records if killed.info.run_id in r.getMessage()]
    assert len(said) == 1 and f"process {proc.pid}, which is gone: marked FAILED" in said[0]


def test_the_dry_run_null_test_adopts_nothing_and_measures_no_saving(tmp_path):
    """Every clock request is recorded and none applied, so every candidate truly equals stock:
    nothing may be adopted, and the run's measured saving lies within +-0.3% of zero."""
    out = tmp_path / "t.json"
    assert main([*ARGS, "--no-mlflow", "--dry-run", "--seconds", "200", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["dry_run"] and doc["clock_requests"] > 1 and doc["trials"] > 0
    assert doc["adoptions"] == [] and doc["tuner_claimed_saving"] == 0.0
    assert abs(doc["run"]["energy_saving"]) <= 0.003


def test_a_power_cap_scenario_is_detected_within_5_s_and_reported_in_training_seconds(
    tmp_path, sqlite_store_uri
):
    out = tmp_path / "s.json"
    argv = [
        "scenario",
        "power-cap",
        "--device",
        "sim:rtx3080ti",
        "--at-s",
        "40",
        "--after-s",
        "30",
    ]
    assert main([*argv, "--mlflow-uri", sqlite_store_uri, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["change_at_s"] >= 40 and not doc["restart"] and doc["partial"] is False
    assert doc["detected_after_s"] is not None and 0 <= doc["detected_after_s"] <= 5.0
    assert doc["alarms_after_change"][0]["reasons"] == ["power_limit"]
    assert {"settled_after_s", "recovered_after_s", "recovery_target_s"} <= set(doc)
    assert doc["phases_after"][:2] == ["Verifying", "Retuning"] or doc["phases_after"][0] == "Retuning"
    assert doc["max_slowdown_after"] <= 0.01 and doc["false_alarms_stable"] == 0
    # the yardstick is searched in the step, and is at least the plan the tuner ended with
    assert "evaluated in the step" in doc["oracle_method"]
    assert doc["oracle_saving_after"] >= doc["energy_saving_after"] - 1e-9
    client = MlflowClient(sqlite_store_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("kdvfs-scenarios").experiment_id])
    assert run.info.status == "FINISHED" and run.data.metrics["detected_after_s"] == doc["detected_after_s"]
    assert run.data.params["gpu"] == run.data.tags["gpu"] == "NVIDIA GeForce RTX 3080 Ti"
    assert run.data.params["source"] == "simulated" and run.data.tags["workload_signature"]


def test_from_no_prior_a_lower_power_cap_is_recovered_from_within_a_minute_of_the_cards_settling(
    tmp_path, capsys
):
    # no model to re-plan with: the plan before is verified with its core clock lowered as far
    # as stock's SM clock fell under the new cap (1680 -> 1260 MHz on this card's grid)
    out = tmp_path / "s.json"
    argv = ["scenario", "power-cap", "--device", "sim:rtx3080ti", "--prior", "none"]
    assert main([*argv, "--no-mlflow", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["prior"] == "none" and doc["alarms_after_change"][0]["reasons"] == ["power_limit"]
    assert doc["recovered_after_s"] is not None and doc["recovered_after_s"] <= doc["recovery_target_s"]
    assert doc["max_slowdown_after"] <= 0.01 and doc["false_alarms_stable"] == 0
    assert "prior none [simulated]" in capsys.readouterr().out


def test_a_gpu_swap_restarts_the_job_from_its_plan_carried_to_the_new_card(tmp_path):
    out = tmp_path / "s.json"
    argv = [
        "scenario",
        "gpu-swap",
        "--device",
        "sim:rtx3080ti",
        "--at-s",
        "30",
        "--after-s",
        "30",
    ]
    assert main([*argv, "--no-mlflow", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["restart"] and doc["gpu_after"] != "NVIDIA GeForce RTX 3080 Ti"
    assert doc["prior_after"]["source"] in ("transferred", "none")  # a plan is stored only once settled
    assert doc["detected_after_s"] is None and doc["settled_after_s"] == 0.0
