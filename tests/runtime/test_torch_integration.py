"""The training integration end to end on the CPU: a small model, a simulated GPU."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time

import pytest
import torch

from kdvfs.runtime import nvml_device
from kdvfs.runtime.nvml_device import NvmlDevice
from kdvfs.runtime.presets import get_preset
from kdvfs.runtime.schedule import Schedule
from kdvfs.runtime.simulator import SimulatedDevice
from kdvfs.runtime.torch_discovery import discover_workload, workload_sites
from kdvfs.runtime.torch_integration import (
    RECORDS_FILE,
    ClockController,
    HFTrainerHooks,
    KdvfsTrainer,
    LightningHooks,
    lightning_callback,
    place_schedule,
    site_schedule,
)
from kdvfs.runtime.types import ClockPair, KdvfsError, Kernel
from kdvfs.tuner.plan import Plan, load_plan
from tests.runtime import fake_pynvml
from tests.runtime.test_torch_discovery import tiny_mlp

FWD, BWD, OPT = ClockPair(1980, 3201), ClockPair(1410, 3201), ClockPair(990, 2201)
PAIRS = {"forward": FWD, "backward": BWD, "optimizer": OPT}


class LoggingDevice(SimulatedDevice):
    """A simulated H200 whose switches land at once, logging the clocks each kernel ran at."""

    def __init__(self) -> None:
        preset = dataclasses.replace(get_preset("h200"), switch_latency_s=0.0, energy_update_period_s=1e-4)
        super().__init__(preset, noise=0)
        self.ran: list[tuple[str, ClockPair | None]] = []

    def run(self, kernel: Kernel, launches: int = 1) -> float:
        self.ran.append((kernel.name, self.clocks_in_effect()))
        return super().run(kernel, launches)


pytestmark = pytest.mark.usefixtures("lease_registry")  # the controller holds its halt there


@pytest.fixture(scope="module")
def mlp():
    model, optimizer, step = tiny_mlp()
    workload = discover_workload(step, steps=2, model=model, optimizer=optimizer)
    return model, optimizer, step, workload


def test_schedule_applied_at_sites_with_records_and_stock_restored(mlp, tmp_path):
    model, optimizer, step, workload = mlp
    device = LoggingDevice()
    schedule = site_schedule(workload, PAIRS)
    expected = dict(zip((k.name for k in workload.kernels), schedule.pair_per_kernel(len(workload))))
    with KdvfsTrainer(
        device, workload, schedule, model=model, optimizer=optimizer, window_steps=10, out_dir=tmp_path
    ) as tuner:
        for i in range(30):
            with tuner.step() as number:
                assert number == i
                step()
    # every kernel of every step ran at its group's clocks, on the simulated GPU
    assert len(device.ran) == 30 * len(workload)
    assert all(pair == expected[name] for name, pair in device.ran)
    assert {pair for _, pair in device.ran} == {FWD, BWD, OPT}
    # three switches a step, and stock clocks back at the end
    requests = tuner.controller.requests
    assert [(r.site, r.pair) for r in requests[:3]] == [
        ("forward", FWD),
        ("backward", BWD),
        ("optimizer", OPT),
    ]
    assert len(requests) == 90 and device.clocks_in_effect() is None
    # records: every step, energy from 3 windows of 10 steps
    records = tuner.records
    assert [r.step for r in records] == list(range(30))
    assert all(r.time_s > 0 and r.requests == 3 for r in records)
    assert [(w.first_step, w.steps, w.partial) for w in tuner.windows] == [
        (0, 10, False),
        (10, 10, False),
        (20, 10, False),
    ]
    assert tuner.energy_per_step_j() == pytest.approx(sum(w.energy_j for w in tuner.windows) / 30)
    assert tuner.energy_per_step_j() > 0
    saved = json.loads((tmp_path / RECORDS_FILE).read_text())
    assert len(saved["steps"]) == 30 and saved["sites"] == ["step", "forward", "backward", "optimizer"]
    assert saved["site_requests"] == [
        ["forward", FWD.as_list()],
        ["backward", BWD.as_list()],
        ["optimizer", OPT.as_list()],
    ]


@pytest.mark.parametrize("failure", [RuntimeError("loss is nan"), KeyboardInterrupt()])
def test_failure_in_a_step_restores_stock_and_closes(mlp, tmp_path, failure):
    model, optimizer, step, workload = mlp
    device = LoggingDevice()
    tuner = KdvfsTrainer(
        device,
        workload,
        site_schedule(workload, PAIRS),
        model=model,
        optimizer=optimizer,
        window_steps=4,
        out_dir=tmp_path,
    )
    with pytest.raises(type(failure)):
        for i in range(10):
            with tuner.step():
                step()
                if i == 5:
                    raise failure
    assert device.clocks_in_effect() is None
    assert not tuner.controller.running  # its thread is gone after a failed step
    assert [r["step"] for r in json.loads((tmp_path / RECORDS_FILE).read_text())["steps"]] == list(range(5))
    with pytest.raises(KdvfsError, match="closed"):
        tuner.begin_step()


def test_a_mismatched_step_sends_no_clock_request_and_a_repeated_site_is_passed_over(mlp):
    model, optimizer, step, workload = mlp
    device = LoggingDevice()
    with KdvfsTrainer(
        device, workload, site_schedule(workload, PAIRS), model=model, optimizer=optimizer
    ) as tuner:
        for i in range(7):
            with tuner.step():
                if i == 2:  # two micro-batches, then the optimizer step: the sites repeat in order
                    model(torch.randn(4, 8)).sum().backward()
                    model(torch.randn(4, 8)).sum().backward()
                    optimizer.step()
                elif i == 3:  # an accumulation step: no optimizer site at all
                    model(torch.randn(4, 8)).sum().backward()
                elif i == 4:  # the optimizer's site before the forward's: another code path
                    optimizer.step()
                    model(torch.randn(4, 8)).sum().backward()
                else:
                    step()
    controller = tuner.controller
    assert controller.mismatched_steps == [3, 4]
    assert controller.repeated_sites == 2
    by_step = {i: [(r.site, r.pair) for r in controller.requests if r.step == i] for i in range(7)}
    assert by_step[2] == [("forward", FWD), ("backward", BWD), ("optimizer", OPT)]
    assert by_step[3] == [("forward", FWD), ("backward", BWD)]  # then it ends: nothing more
    assert by_step[4] == []  # after a mismatched step: no request, the clocks in effect stay
    assert by_step[5] == []  # it matches: the next step requests again
    assert by_step[6] == [("forward", FWD), ("backward", BWD), ("optimizer", OPT)]
    assert len(tuner.records) == 7 and device.clocks_in_effect() is None


def test_a_step_lasts_until_the_next_step_starts(mlp):
    model, optimizer, step, workload = mlp
    pause_s = 0.05
    with KdvfsTrainer(LoggingDevice(), workload, Schedule.stock(), model=model, optimizer=optimizer) as tuner:
        for i in range(4):
            with tuner.step():
                step()
            if i == 1:
                time.sleep(pause_s)  # input, logging, evaluation between two steps: the job's step
    records = {r.step: r.time_s for r in tuner.records}
    assert sorted(records) == [0, 1, 2, 3]
    assert records[1] >= pause_s  # at least the pause that followed it (sleep waits at least that)
    assert tuner.controller.mismatched_steps == []


def test_the_time_between_a_steps_end_and_the_next_start_is_reported_as_the_jobs_wait(mlp):
    model, optimizer, step, workload = mlp
    pause_s = 0.05
    reports = []

    class Recording:
        def on_step_end(self, report):
            reports.append(report)
            return Schedule.stock()

    with KdvfsTrainer(
        LoggingDevice(), workload, Schedule.stock(), model=model, optimizer=optimizer, tuner=Recording()
    ) as tuner:
        for i in range(4):
            with tuner.step():
                step()
            if i == 1:
                time.sleep(pause_s)  # the host is late: the GPU waits for the next step
    by_step = {r.step: r for r in reports}
    assert by_step[1].wait_s >= pause_s and by_step[1].step_time_s >= by_step[1].wait_s
    assert by_step[0].wait_s < pause_s and by_step[2].wait_s < pause_s


def test_each_report_carries_the_cards_sensors_as_the_poller_read_them_the_sm_clock_included(mlp):
    model, optimizer, step, workload = mlp
    reports = []

    class Recording:
        def on_step_end(self, report):
            reports.append(report)
            return Schedule.stock()

    device = LoggingDevice()
    device.set_power_cap_w(450.0)
    with KdvfsTrainer(
        device, workload, Schedule.stock(), model=model, optimizer=optimizer, tuner=Recording()
    ) as t:
        for _ in range(3):
            with t.step():
                step()
    assert reports and all(r.power_limit_w == 450.0 for r in reports)
    top_mhz = max(device.grid.core_levels_mhz)
    assert all(0 < r.sm_clock_mhz <= top_mhz for r in reports)  # a reading, not the NaN of no sensor


def test_group_starts_between_sites_are_reported_moved(mlp):
    workload = mlp[3]
    _, kernel_sites = workload_sites(workload)
    inside = next(k for k in range(1, len(workload)) if kernel_sites[k] == kernel_sites[k - 1])
    placement = place_schedule(workload, Schedule(((0, FWD), (inside, OPT))))
    assert placement.moved == (workload.kernels[inside].name,)
    assert placement.requests[0] == (kernel_sites[0], FWD)
    with pytest.raises(KdvfsError, match="has no site 'loss'"):
        site_schedule(workload, {"loss": FWD})


def test_plan_gives_the_schedule_and_is_saved(mlp, tmp_path):
    model, optimizer, step, workload = mlp
    device = LoggingDevice()
    schedule = site_schedule(workload, PAIRS)
    bounds = [g[0] for g in schedule.groups] + [len(workload)]
    plan = Plan.from_groups(
        gpu_name=device.name,
        grid=device.grid,
        workload=workload,
        budget=0.05,
        groups=[(s, e, p, 1e-3, 0.5) for (s, p), e in zip(schedule.groups, bounds[1:])],
        reference_time_s=3e-3,
        reference_energy_j=1.6,
        source="simulated",
        strategy="test",
        measurements=0,
    )
    with (
        KdvfsTrainer(device, workload, plan, model=model, optimizer=optimizer, out_dir=tmp_path) as tuner,
        tuner.step(),
    ):
        step()
    assert [(r.site, r.pair) for r in tuner.controller.requests] == [
        ("forward", FWD),
        ("backward", BWD),
        ("optimizer", OPT),
    ]
    assert load_plan(tmp_path / "kdvfs_plan.json").groups == plan.groups
    other = dataclasses.replace(workload, name="other", kernels=workload.kernels[:-1])
    with pytest.raises(KdvfsError, match="plan is for workload signature"):
        KdvfsTrainer(device, other, plan)


def test_dry_run_nvml_device_records_the_calls_and_a_real_one_is_refused(mlp, monkeypatch, tmp_path):
    model, optimizer, step, workload = mlp
    fake = fake_pynvml.configure()
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)
    monkeypatch.delenv(nvml_device.NVML_MODULE_ENV, raising=False)
    schedule = site_schedule(workload, {"forward": FWD, "optimizer": OPT})
    with NvmlDevice(0, dry_run=True, lease_dir=tmp_path) as device:
        with KdvfsTrainer(device, workload, schedule, model=model, optimizer=optimizer) as tuner:
            for _ in range(2):
                with tuner.step():
                    step()
        calls = [(name, args) for _, name, args in device.calls]
        with pytest.raises(KdvfsError, match="dry-run"):
            ClockController(NvmlDevice(0, lease_dir=tmp_path), workload, schedule)
    set_fwd = [
        ("nvmlDeviceSetGpuLockedClocks", (1980, 1980)),
        ("nvmlDeviceSetMemoryLockedClocks", (3201, 3201)),
    ]
    set_opt = [
        ("nvmlDeviceSetGpuLockedClocks", (990, 990)),
        ("nvmlDeviceSetMemoryLockedClocks", (2201, 2201)),
    ]
    reset = [("nvmlDeviceResetGpuLockedClocks", ()), ("nvmlDeviceResetMemoryLockedClocks", ())]
    assert calls == set_fwd + set_opt + set_fwd + set_opt + reset
    assert fake.calls == []  # nothing reached the (fake) card
    assert tuner.energy_per_step_j() is not None


def test_on_a_card_a_site_that_changes_clocks_is_requested_as_it_fires_not_at_the_next_step(
    mlp, monkeypatch, tmp_path
):
    model, optimizer, step, workload = mlp
    fake_pynvml.configure()
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)
    monkeypatch.delenv(nvml_device.NVML_MODULE_ENV, raising=False)
    schedule = site_schedule(workload, {"forward": None, "optimizer": OPT})  # stock, then OPT
    with (
        NvmlDevice(0, dry_run=True, lease_dir=tmp_path) as device,
        KdvfsTrainer(device, workload, schedule, model=model, optimizer=optimizer) as tuner,
    ):
        for _ in range(3):
            with tuner.step() as number:
                step()  # its optimizer step fires the site
                deadline_s = time.monotonic() + 30.0  # a loaded host: the thread may run late
                while (number, "optimizer", OPT) not in [
                    (r.step, r.site, r.pair) for r in tuner.controller.requests
                ]:
                    assert time.monotonic() < deadline_s, "no request while the step was open"
                    time.sleep(0.001)
    assert [(r.site, r.pair) for r in tuner.controller.requests] == [
        ("forward", None),
        ("optimizer", OPT),
    ] * 3


def test_lightning_and_hugging_face_hooks_drive_the_trainer(mlp):
    model, optimizer, step, workload = mlp
    for hooks_class in (LightningHooks, HFTrainerHooks):
        device = LoggingDevice()
        tuner = KdvfsTrainer(device, workload, site_schedule(workload, PAIRS))
        hooks = hooks_class(tuner)
        if hooks_class is LightningHooks:
            trainer = type("Trainer", (), {"optimizers": [optimizer]})()
            hooks.on_train_start(trainer, model)

            def closure(
                hooks=hooks, trainer=trainer
            ) -> torch.Tensor:  # Lightning runs forward and backward inside optimizer.step
                loss = model(torch.randn(4, 8)).pow(2).mean()
                hooks.on_before_backward(trainer, model, loss)
                loss.backward()
                hooks.on_before_optimizer_step(trainer, model, optimizer)
                return loss

            for i in range(3):
                hooks.on_train_batch_start(trainer, model, None, i)
                optimizer.step(closure)
                optimizer.zero_grad(set_to_none=True)
                hooks.on_train_batch_end(trainer, model, None, None, i)
            hooks.on_train_end(trainer, model)
        else:
            hooks.on_train_begin(None, None, None, model=model, optimizer=optimizer)
            for _ in range(3):
                hooks.on_step_begin(None, None, None)
                step()
                hooks.on_step_end(None, None, None)
            hooks.on_train_end(None, None, None)
        assert tuner.controller.mismatched_steps == [], hooks_class
        assert len(tuner.records) == 3 and len(tuner.controller.requests) == 9, hooks_class
        assert device.clocks_in_effect() is None


def test_lightning_callback_needs_lightning(mlp):
    try:
        import lightning  # noqa: F401  (only whether it imports matters)
    except ImportError:
        with pytest.raises(KdvfsError, match="needs PyTorch Lightning"):
            lightning_callback(KdvfsTrainer(LoggingDevice(), mlp[3], Schedule.stock()))
    else:
        pytest.skip("lightning is installed: the callback is built, not refused")


class ResetLoggingDevice(LoggingDevice):
    def __init__(self) -> None:
        super().__init__()
        self.resets: list[bool] = []  # was the controller halted when the clocks were reset?

    def reset_clocks(self) -> None:
        self.resets.append(self.controller.halted)
        super().reset_clocks()


@pytest.mark.usefixtures("sigint_default")
def test_sigint_halts_the_controller_then_restores_stock(mlp):
    model, optimizer, step, workload = mlp
    device = ResetLoggingDevice()
    tuner = KdvfsTrainer(
        device, workload, site_schedule(workload, {"forward": FWD}), model=model, optimizer=optimizer
    )
    device.controller = tuner.controller
    halted_when_interrupted = []
    with pytest.raises(KeyboardInterrupt):
        for i in range(5):
            with tuner.step():
                step()
                if i == 2:
                    deadline_s = (
                        time.monotonic() + 10.0
                    )  # the controller thread has locked clocks (it follows asynchronously)
                    while not tuner.controller.requested_clocks and time.monotonic() < deadline_s:
                        time.sleep(0.001)
                    assert tuner.controller.requested_clocks
                    try:
                        os.kill(os.getpid(), signal.SIGINT)  # clock_lease's handler, then KeyboardInterrupt
                    except KeyboardInterrupt:
                        halted_when_interrupted.append(tuner.controller.halted)
                        raise
    assert halted_when_interrupted == [True]  # the signal handler halted it, before the trainer closed
    assert device.resets == [True]
    assert [(r.step, r.pair) for r in tuner.controller.requests] == [(0, FWD)]
    assert device.clocks_in_effect() is None
