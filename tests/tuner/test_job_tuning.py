"""kdvfs.tune on a real PyTorch training loop (CPU), the fake NVML card the whole way through."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

import kdvfs
from kdvfs.runtime import nvml_device
from kdvfs.runtime.nvml_device import NvmlDevice
from kdvfs.runtime.torch_integration import HFTrainerHooks, LightningHooks
from kdvfs.runtime.types import ClockPair
from kdvfs.tuner.job_tuning import PLAN_FILE, SUMMARY_FILE
from kdvfs.tuner.plan import load_plan
from kdvfs.tuner.plan_store import PlanStore
from kdvfs.tuner.run import METRICS
from kdvfs.tuner.step_tuner import Settled
from tests.runtime import fake_pynvml
from tests.runtime.test_torch_discovery import tiny_mlp
from tests.tuner.job_loop import (
    BUDGET,
    FAST_TIMING,
    POLL_S,
    WARMUP_S,
    card_power_mw,
    configure_card,
    in_trial,
    paced,
    warmed,
)

REPO = Path(__file__).resolve().parents[2]
#: Longest a test trains before it gives up waiting for a phase; s.
PATIENCE_S = 20.0


@pytest.fixture(autouse=True)
def fake_card(monkeypatch, lease_registry):
    """The fake NVML card as `pynvml`, and clock_lease's holds and signal handlers per test."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)
    monkeypatch.delenv("KDVFS_NVML_MODULE", raising=False)
    monkeypatch.setattr(nvml_device, "admin_privilege", lambda: (True, "the fake card needs no root"))
    return configure_card(fake_pynvml)


def tuning_of(tmp_path: Path, *, dry_run: bool = False, **options):
    model, optimizer, step = tiny_mlp()
    step = warmed(step)
    device = NvmlDevice(0, dry_run=dry_run, lease_dir=tmp_path / "leases")
    tuning = kdvfs.tune(
        model,
        optimizer,
        budget=BUDGET,
        strategy="ucb",
        device=device,
        dry_run=dry_run,
        out_dir=tmp_path / "run",
        plan_store=tmp_path / "store",
        timing=FAST_TIMING,
        poll_s=POLL_S,
        warmup_s=WARMUP_S,
        **({"track": False} | options),
    )
    return tuning, paced(step), device


def train_until(tuning, step, done) -> None:
    deadline_s = time.monotonic() + PATIENCE_S
    while not done():
        assert time.monotonic() < deadline_s, f"still in {tuning.tuner.phases} after {PATIENCE_S} s"
        with tuning.step():
            step()


def assert_stock_back(fake) -> None:
    assert fake.locked_gpu_mhz == {} and fake.locked_mem_mhz == {}
    assert [name for name, _ in fake.calls[-2:]] == [
        "nvmlDeviceResetGpuLockedClocks",
        "nvmlDeviceResetMemoryLockedClocks",
    ]


def test_a_training_loop_tunes_its_clocks_to_a_stored_plan_with_an_mlflow_run(
    fake_card, tmp_path, sqlite_tracking_uri
):
    tuning, step, device = tuning_of(tmp_path, track=True, tracking_uri=sqlite_tracking_uri)
    with tuning:
        train_until(tuning, step, lambda: isinstance(tuning.tuner.phase, Settled))
    device.close()
    summary = tuning.summary()
    # it measured stock, tried candidates in training, and adopted one that draws less power
    assert summary["phases"][:2] == ["Reference", "Exploring"] and summary["phase"] == "Settled"
    assert summary["adopted"] >= 1 and summary["plan_energy_saving"] > 0.05, json.dumps(summary)
    assert all(o["kind"] in ("trial", "verify") for o in summary["outcomes"])
    assert any(o["adopted"] for o in summary["outcomes"] if o["kind"] == "verify")
    plan = load_plan(tmp_path / "run" / PLAN_FILE)
    (pair,) = {g.pair for g in plan.groups}
    assert pair is not None and card_power_mw((pair.core_mhz,) * 2, (pair.mem_mhz,) * 2) < card_power_mw(
        None, None
    )
    assert plan.energy_saving == pytest.approx(summary["plan_energy_saving"])
    stored = PlanStore(tmp_path / "store").get(device.name, device.grid, tuning.workload.signature)
    assert stored is not None and stored.groups == plan.groups
    assert json.loads((tmp_path / "run" / SUMMARY_FILE).read_text())["adopted"] == summary["adopted"]
    assert_stock_back(fake_card)
    # the MLflow run: step metrics, the plan as an artifact
    client = MlflowClient(sqlite_tracking_uri)
    run = client.get_run(tuning.mlflow_run.run_id)
    assert run.info.status == "FINISHED" and run.data.params["strategy"] == "ucb"
    assert len(client.get_metric_history(run.info.run_id, "step_time_s")) >= 3
    # the tuning run's metric names, the ones `kdvfs tune` logs (tests/tuner/test_tune_cli.py)
    assert (
        {"slowdown", "energy_saving", "plan_energy_saving", "phase"} <= set(run.data.metrics) <= set(METRICS)
    )
    assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"plan.json", "summary.json"}


def test_a_real_cards_sweep_is_the_prior_the_tuner_verifies_first(fake_card, tmp_path):
    sweep = {
        "source": "measured",
        "cells": [{"kernel": "000.addmm", "pass": "forward"}, {"kernel": "001.mm", "pass": "backward"}],
        "pass_level": {"plan": {"000.addmm": None, "001.mm": [990, 3201]}},
    }
    (tmp_path / "sweep.json").write_text(json.dumps(sweep))
    tuning, _, device = tuning_of(tmp_path, dry_run=True, prior_sweep=tmp_path / "sweep.json")
    sites = [k.pass_name for k in tuning.workload.kernels]
    backward = sites.index("backward")
    assert tuning.tuner.prior.groups[0] == (0, None)
    assert (backward, ClockPair(990, 3201)) in tuning.tuner.prior.groups
    tuning.close()
    device.close()


def test_in_dry_run_no_clock_reaches_the_card_and_nothing_is_adopted(fake_card, tmp_path):
    tuning, step, device = tuning_of(tmp_path, dry_run=True)
    with tuning:
        train_until(tuning, step, lambda: len(tuning.outcomes) >= 2)
    device.close()
    assert fake_card.calls == []  # the requests stayed in the dry-run device's records
    assert any(name == "nvmlDeviceSetGpuLockedClocks" for _, name, _ in device.calls)
    summary = tuning.summary()
    assert summary["adopted"] == 0 and summary["plan_energy_saving"] == 0.0
    assert len(summary["outcomes"]) >= 2 and summary["stock_energy_per_step_j"] > 0
    assert summary["stock_sm_clock_mhz"] > 0  # the card's SM clock, read by the counter's poller
    assert not PlanStore(tmp_path / "store").entries()  # a dry run stores no plan


@pytest.mark.usefixtures("sigint_default")
@pytest.mark.parametrize("failure", ["exception", "ctrl-c"])
def test_a_failure_mid_trial_restores_stock_and_keeps_the_plan_so_far(fake_card, tmp_path, failure):
    tuning, step, device = tuning_of(tmp_path)
    with pytest.raises(RuntimeError if failure == "exception" else KeyboardInterrupt), tuning:
        train_until(tuning, step, lambda: in_trial(tuning) and bool(fake_card.locked_gpu_mhz))
        with tuning.step():
            step()
            if failure == "exception":
                raise RuntimeError("loss is nan")
            os.kill(os.getpid(), signal.SIGINT)
    device.close()
    assert_stock_back(fake_card)
    plan = load_plan(tmp_path / "run" / PLAN_FILE)  # the reference's figures, no candidate adopted
    assert {g.pair for g in plan.groups} == {None} and plan.reference_time_s > 0
    assert json.loads((tmp_path / "run" / SUMMARY_FILE).read_text())["phase"] == "Exploring"
    with pytest.raises(kdvfs.KdvfsError, match="closed"):
        tuning.begin_step()


def test_sigterm_mid_trial_restores_stock_and_keeps_the_plan_so_far(tmp_path):
    calls = tmp_path / "calls.jsonl"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "tests" / "runtime"), str(REPO)]),
        "KDVFS_NVML_MODULE": "fake_pynvml",
        fake_pynvml.CALLS_ENV: str(calls),
    }
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.tuner.job_loop", str(tmp_path / "leases"), str(tmp_path / "run")],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "trial", child.stderr.read()
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=30) == -signal.SIGTERM
    finally:
        child.kill()
    made = [json.loads(line)["fn"] for line in calls.read_text().splitlines()]
    assert "nvmlDeviceSetGpuLockedClocks" in made
    assert made[-2:] == ["nvmlDeviceResetGpuLockedClocks", "nvmlDeviceResetMemoryLockedClocks"]
    assert not list((tmp_path / "leases").glob("*.json"))  # the lease went with the locks
    plan = load_plan(tmp_path / "run" / PLAN_FILE)
    assert plan.reference_time_s > 0


def drive(hooks, model, optimizer, step, until) -> int:
    """Steps through the framework's hooks (stand-in trainers, as Lightning and transformers
    call them) until `until()`; returns the steps run."""
    steps, deadline_s = 0, time.monotonic() + PATIENCE_S
    lightning = isinstance(hooks, LightningHooks)
    trainer = object()
    if lightning:
        hooks.on_train_start(trainer, model)
        # Lightning calls on_before_backward after the training step's forward, and
        # on_before_optimizer_step inside its optimizer step
        model.register_forward_hook(lambda *_: hooks.on_before_backward(trainer, model, None))
        optimizer.register_step_pre_hook(lambda *_: hooks.on_before_optimizer_step(trainer, model, optimizer))
    else:
        hooks.on_train_begin(None, None, None, model=model, optimizer=optimizer)
    while not until():
        assert time.monotonic() < deadline_s
        if lightning:
            hooks.on_train_batch_start(trainer, model, None, steps)
        else:
            hooks.on_step_begin(None, None, None)
        step()
        if lightning:
            hooks.on_train_batch_end(trainer, model, None, None, steps)
        else:
            hooks.on_step_end(None, None, None)
        steps += 1
    if lightning:
        hooks.on_train_end(trainer, model)
    else:
        hooks.on_train_end(None, None, None)
    return steps


@pytest.mark.parametrize("hooks_class", [LightningHooks, HFTrainerHooks])
def test_the_lightning_and_hugging_face_hooks_tune(fake_card, tmp_path, hooks_class):
    model, optimizer, step = tiny_mlp()
    step = warmed(step)
    device = NvmlDevice(0, lease_dir=tmp_path / "leases")
    tuning = kdvfs.tune(  # no model or optimizer yet: the framework hands them over
        device=device,
        dry_run=False,
        budget=BUDGET,
        strategy="ucb",
        plan_store=False,
        track=False,
        timing=FAST_TIMING,
        poll_s=POLL_S,
        warmup_s=WARMUP_S,
    )
    steps = drive(hooks_class(tuning), model, optimizer, paced(step), lambda: bool(tuning.outcomes))
    device.close()
    assert tuning.trainer.controller.mismatched_steps == []
    assert 0 < tuning.tuner.account.steps < steps == len(tuning.trainer.records)  # after the warm-up
    assert tuning.outcomes[0]["kind"] == "trial"
    assert_stock_back(fake_card)
