"""The counter poller of a real training loop (runtime/step_feed.py CounterPoller), on the fake NVML card."""

from __future__ import annotations

import math
import statistics
import sys
import time

import pytest

from kdvfs.runtime.nvml_device import NvmlDevice
from kdvfs.runtime.step_feed import CounterPoller
from tests.runtime import fake_pynvml


@pytest.fixture
def card(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)
    monkeypatch.delenv("KDVFS_NVML_MODULE", raising=False)
    state = fake_pynvml.configure()
    with NvmlDevice(0, dry_run=True, lease_dir=tmp_path) as device:
        yield state, device


def _poll_for(device, seconds: float, **options) -> CounterPoller:
    poller = CounterPoller(device, poll_s=0.001, **options)
    poller.start()
    time.sleep(seconds)
    poller.stop()
    return poller


def _lags_s(state, updates) -> list[float]:
    """How long after the card's update each was seen (the fake advances at start + k x period)."""
    period = state.energy_period_s
    return [t - (state.start_s + math.floor((t - state.start_s) / period) * period) for t, _ in updates]


def _reads_per_s(device, **options) -> tuple[float, CounterPoller]:
    """Reads a second once the poller has run 1 s (its period learnt), over 1.5 s."""
    poller = CounterPoller(device, poll_s=0.001, **options)
    poller.start()
    time.sleep(1.0)
    before = poller.reads
    time.sleep(1.5)
    poller.stop()
    return (poller.reads - before) / 1.5, poller


def test_the_poller_learns_the_counter_period_and_reads_a_fraction_of_back_to_back(card):
    state, device = card
    around, poller = _reads_per_s(device)
    back_to_back, _ = _reads_per_s(device, guard_s=None)
    assert poller.period_s() == pytest.approx(state.energy_period_s, rel=0.05)
    assert around < 0.25 * back_to_back


def test_the_poller_still_sees_each_update_within_a_few_ms(card):
    state, device = card
    poller = _poll_for(device, 2.0)
    updates = poller.take(math.inf)
    assert len(updates) >= 17  # one every 100 ms, none missed
    lags = _lags_s(state, updates[5:])  # once the period is known
    assert statistics.median(lags) < 0.003
    assert poller.early_updates <= 2


class _LateWaker:
    """The card read through a host that wakes a sleeping thread WAKE_LATE_S late: the first
    read after a pause returns that much later."""

    WAKE_LATE_S = 0.015

    def __init__(self, device) -> None:
        self._device = device
        self._last_s = time.monotonic()

    def energy_j(self) -> float:
        if time.monotonic() - self._last_s > 0.005:
            time.sleep(self.WAKE_LATE_S)
        self._last_s = time.monotonic()
        return self._device.energy_j()

    def __getattr__(self, name):
        return getattr(self._device, name)


def test_the_guard_widens_when_a_busy_host_wakes_the_poller_late_and_updates_are_seen_again(card):
    _, device = card
    poller = CounterPoller(_LateWaker(device), poll_s=0.001)
    poller.start()
    time.sleep(2.0)
    early_before = poller.early_updates
    time.sleep(2.0)
    poller.stop()
    assert poller.wake_guard_s > _LateWaker.WAKE_LATE_S
    assert poller.early_updates - early_before <= 2  # of 20 updates in those 2 s (a fixed guard: ~10)
    assert poller.early_updates >= 1  # the 8-ms guard was too short at first
