"""The energy counter read in a process of its own (runtime/counter_process.py): a real child
process opening the fake NVML card through $KDVFS_NVML_MODULE, as kdvfs.tune opens a real card."""

from __future__ import annotations

import itertools
import os
import statistics
import sys
import time
from pathlib import Path

import pytest

import kdvfs
from kdvfs.runtime import nvml_device
from kdvfs.runtime.counter_process import COUNTER_POLLER_ENV, ProcessCounterPoller, open_poller
from kdvfs.runtime.nvml_device import CounterSource, NvmlDevice
from kdvfs.runtime.step_feed import CounterPoller
from kdvfs.runtime.types import KdvfsError
from tests.runtime import fake_pynvml
from tests.runtime.test_torch_discovery import tiny_mlp

FAKE_DIR = Path(fake_pynvml.__file__).resolve().parent
REPO = FAKE_DIR.parents[1]
#: Longest a test waits for the child's output; s (a loaded 2-core machine starts Python slowly).
PATIENCE_S = 30.0


@pytest.fixture
def child_finds_the_fake(monkeypatch):
    """A child process imports fake_pynvml, as `fake_pynvml` or `tests.runtime.fake_pynvml` (a
    card of its own: counters at 82.8 W, an update every 0.1 s)."""
    paths = [str(FAKE_DIR), str(REPO), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))


def wait_for(condition, what: str) -> None:
    deadline_s = time.monotonic() + PATIENCE_S
    while not condition():
        assert time.monotonic() < deadline_s, f"no {what} within {PATIENCE_S} s"
        time.sleep(0.05)


def test_a_counter_read_in_its_own_process_hands_over_each_update_on_this_process_clock(child_finds_the_fake):
    poller = ProcessCounterPoller(CounterSource(0, "fake_pynvml"))
    started_s = time.monotonic()
    poller.start()
    try:
        updates: list[tuple[float, float]] = []
        wait_for(lambda: len(updates.extend(poller.take(time.monotonic())) or updates) >= 8, "8 updates")
        sensors = poller.sensors()
    finally:
        poller.stop()
    times_s = [t for t, _ in updates]
    energies_j = [j for _, j in updates]
    # stamped on the host's monotonic clock, which this process shares: after the start, not ahead of now
    assert started_s < times_s[0] and times_s[-1] <= time.monotonic()
    assert (
        times_s == sorted(times_s)
        and energies_j == sorted(energies_j)
        and len(set(energies_j)) == len(updates)
    )
    # the fake card's counter moves every 0.1 s at 82.8 W
    gaps_s = [b - a for a, b in itertools.pairwise(times_s)]
    assert statistics.median(gaps_s) == pytest.approx(0.1, abs=0.02)
    assert (energies_j[-1] - energies_j[0]) / (times_s[-1] - times_s[0]) == pytest.approx(82.8, rel=0.2)
    assert sensors.temperature_c > 0 and sensors.power_limit_w > 0 and "gpu_idle" in sensors.throttle_reasons
    assert sensors.sm_clock_mhz > 0
    figures = poller.figures()
    assert figures["process"] is True and figures["reads"] >= len(updates)
    assert figures["period_s"] == pytest.approx(0.1, abs=0.02)
    assert figures["updates_received"] >= len(updates) and poller.error is None
    assert poller.take(times_s[-1]) == ()  # handed out once


def test_a_card_the_counter_process_cannot_open_is_a_one_line_error(child_finds_the_fake, caplog):
    poller = ProcessCounterPoller(CounterSource(5, "fake_pynvml"))
    poller.start()
    try:
        wait_for(lambda: poller.take(time.monotonic()) == () and poller.error is not None, "error")
    finally:
        poller.stop()
    assert str(poller.error) == "no NVIDIA GPU with index 5 (1 found)"
    assert "energy counter poller stopped: no NVIDIA GPU with index 5" in caplog.text


def tuned_until(device, done, what: str) -> dict:
    """A CPU training loop under kdvfs.tune (dry run) on `device` until done(its counter_polling
    figures while it runs); the device closed; the figures after kdvfs.tune closed."""
    model, optimizer, step = tiny_mlp()
    tuning = kdvfs.tune(
        model, optimizer, device=device, dry_run=True, plan_store=False, track=False, warmup_s=0.2
    )
    deadline_s = time.monotonic() + PATIENCE_S
    with tuning:
        while not done(tuning.summary()["counter_polling"]):
            assert time.monotonic() < deadline_s, f"no {what} within {PATIENCE_S} s"
            with tuning.step():
                step()
            time.sleep(0.005)
    device.close()
    return tuning.summary()["counter_polling"]


@pytest.fixture
def fake_card(monkeypatch, lease_registry):
    """The fake NVML card as `pynvml` in this process."""
    fake_pynvml.configure()
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)
    monkeypatch.delenv(nvml_device.NVML_MODULE_ENV, raising=False)
    monkeypatch.delenv(COUNTER_POLLER_ENV, raising=False)
    return fake_pynvml


def test_the_counter_is_polled_on_a_thread_unless_a_process_is_asked_for_and_can_read_it(
    fake_card, tmp_path, monkeypatch
):
    device = NvmlDevice(0, dry_run=True, lease_dir=tmp_path)
    try:
        assert device.counter_source() is None  # the fake's counters are this process's state
        assert isinstance(open_poller(device), CounterPoller)  # the default
        monkeypatch.setenv(COUNTER_POLLER_ENV, "process")
        with pytest.raises(KdvfsError, match="counter cannot be read from another process"):
            open_poller(device)
        monkeypatch.setenv(COUNTER_POLLER_ENV, "elsewhere")
        with pytest.raises(KdvfsError, match=f"^{COUNTER_POLLER_ENV} must be one of thread, process, got 'elsewhere'$"):  # fmt: skip
            open_poller(device)
    finally:
        device.close()


def test_kdvfs_tune_asked_for_a_process_polls_a_real_cards_counter_there(
    fake_card, child_finds_the_fake, tmp_path, monkeypatch
):
    monkeypatch.setattr(fake_pynvml, "COUNTERS_SHARED", True, raising=False)  # as a real card's
    device = NvmlDevice(0, dry_run=True, lease_dir=tmp_path / "leases")
    assert device.counter_source() == CounterSource(0, "tests.runtime.fake_pynvml")
    assert isinstance(open_poller(device), CounterPoller)  # the default
    monkeypatch.setenv(COUNTER_POLLER_ENV, "process")
    assert isinstance(open_poller(device), ProcessCounterPoller)
    polling = tuned_until(device, lambda polling: polling["updates_received"] >= 10, "counter updates")
    assert polling["process"] is True and polling["reads"] >= polling["updates_received"] >= 10
    assert polling["period_s"] == pytest.approx(0.1, abs=0.02)


def test_the_counter_process_imports_kdvfs_from_where_this_process_did(
    child_finds_the_fake, tmp_path, monkeypatch
):
    # a working directory holding a bare kdvfs/ folder (a clone of kdvfs: its layers live beside it)
    (tmp_path / "kdvfs").mkdir()
    (tmp_path / "kdvfs" / "__init__.py").write_text("")
    monkeypatch.chdir(tmp_path)
    poller = ProcessCounterPoller(CounterSource(0, "fake_pynvml"))
    poller.start()
    try:
        wait_for(lambda: poller.figures()["updates_received"] >= 2 or poller.error is not None, "2 updates")
    finally:
        poller.stop()
    assert poller.error is None and poller.figures()["process"] is True


def test_kdvfs_tune_reads_the_counter_on_a_thread_when_its_process_fails(
    fake_card, child_finds_the_fake, tmp_path, monkeypatch
):
    monkeypatch.setattr(fake_pynvml, "COUNTERS_SHARED", True, raising=False)
    monkeypatch.setenv(COUNTER_POLLER_ENV, "process")
    device = NvmlDevice(0, dry_run=True, lease_dir=tmp_path / "leases")
    monkeypatch.setattr(device, "counter_source", lambda: CounterSource(0, "no_such_nvml_module"))
    polling = tuned_until(device, lambda polling: polling.get("period_s") is not None, "counter period")
    assert polling["process"] is False and "no_such_nvml_module is not installed" in polling["process_error"]
    assert polling["period_s"] == pytest.approx(0.1, abs=0.02)  # the in-process fake card's counter
