"""The counter poller of a real training loop (runtime/step_feed.py CounterPoller), on the fake
NVML card. The card's counter and the poller's waits run on a fake host clock that moves only
when the poller waits, so what the poller sees does not depend on how busy the test machine is."""

from __future__ import annotations

import itertools
import math
import statistics
import sys
import threading
import time
from collections.abc import Callable

import pytest

from kdvfs.runtime.nvml_device import NvmlDevice
from kdvfs.runtime.step_feed import UPDATE_GUARD_S, CounterPoller
from tests.runtime import fake_pynvml

#: The poller's pause between two reads while reading back to back, s.
POLL_S = 0.001


class FakeHost:
    """A host clock that moves only when the poller waits (a read takes no time). A thread
    that waited longer than LATE_AFTER_S (a sleep, not a pause between reads) wakes
    wake_late_s late, as on a busy host. `at(t, action)` runs action once the clock reaches t.

    Args:
        wake_late_s: how late a sleeping poller wakes, s.
    """

    LATE_AFTER_S = 0.005

    def __init__(self, wake_late_s: float = 0.0) -> None:
        self.t = 100.0
        self.wake_late_s = wake_late_s
        self._actions: list[tuple[float, Callable[[], None]]] = []

    def now_s(self) -> float:
        return self.t

    def wait(self, stop: threading.Event, timeout_s: float) -> bool:
        if not stop.is_set():
            self.t += timeout_s + (self.wake_late_s if timeout_s > self.LATE_AFTER_S else 0.0)
            while self._actions and self._actions[0][0] <= self.t:
                self._actions.pop(0)[1]()
        return stop.is_set()

    def at(self, t: float, action: Callable[[], None]) -> None:
        self._actions = sorted([*self._actions, (t, action)], key=lambda a: a[0])


@pytest.fixture
def open_card(monkeypatch, tmp_path):
    """Opens the fake card (dry run) with its counter on the given clock."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)
    monkeypatch.delenv("KDVFS_NVML_MODULE", raising=False)
    opened = []

    def open_(clock: Callable[[], float]):
        state = fake_pynvml.configure(clock=clock)
        device = NvmlDevice(0, dry_run=True, lease_dir=tmp_path)
        opened.append(device)
        return state, device

    yield open_
    for device in opened:
        device.close()


@pytest.fixture
def host() -> FakeHost:
    return FakeHost()


@pytest.fixture
def card(open_card, host):
    """The fake card, its counter on the fake host clock."""
    return open_card(host.now_s)


def _poll_for(device, host: FakeHost, seconds: float, **options) -> CounterPoller:
    """A poller run on this thread for `seconds` of the host's clock."""
    poller = CounterPoller(device, poll_s=POLL_S, clock=host, **options)
    host.at(host.t + seconds, poller.stop)
    poller.run()
    return poller


def _lags_s(state, updates) -> list[float]:
    """How long after the card's update each was seen (the fake advances at start + k x period)."""
    period = state.energy_period_s
    return [t - (state.start_s + math.floor((t - state.start_s) / period) * period) for t, _ in updates]


def _reads_per_s(device, host: FakeHost, **options) -> tuple[float, CounterPoller]:
    """Reads a second once the poller has run 1 s (its period learnt), over the next 1.5 s."""
    poller = CounterPoller(device, poll_s=POLL_S, clock=host, **options)
    before = []
    host.at(host.t + 1.0, lambda: before.append(poller.reads))
    host.at(host.t + 2.5, poller.stop)
    poller.run()
    return (poller.reads - before[0]) / 1.5, poller


def test_the_poller_learns_the_counter_period_and_reads_a_fraction_of_back_to_back(card, host):
    state, device = card
    around, poller = _reads_per_s(device, host)
    back_to_back, _ = _reads_per_s(device, host, guard_s=None)
    assert poller.period_s() == pytest.approx(state.energy_period_s, rel=0.05)
    assert around < 0.25 * back_to_back


def test_the_poller_still_sees_each_update_within_a_few_ms(card, host):
    state, device = card
    poller = _poll_for(device, host, 2.0)
    updates = poller.take(math.inf)
    gaps_s = [b - a for (a, _), (b, _) in itertools.pairwise(updates)]
    assert len(updates) >= 19 and max(gaps_s) < 1.5 * state.energy_period_s  # one every 100 ms, none missed
    lags = _lags_s(state, updates[5:])  # once the period is known
    assert statistics.median(lags) < 0.003 and max(lags) < 0.003
    assert poller.early_updates == 0  # a host that wakes the poller on time


def test_the_guard_widens_when_a_busy_host_wakes_the_poller_late_and_updates_are_seen_again(open_card):
    late = FakeHost(wake_late_s=0.015)
    _, device = open_card(late.now_s)
    poller = CounterPoller(device, poll_s=POLL_S, clock=late)
    early = []
    late.at(late.t + 2.0, lambda: early.append(poller.early_updates))
    late.at(late.t + 4.0, poller.stop)
    poller.run()
    assert poller.wake_guard_s > late.wake_late_s
    assert poller.early_updates - early[0] <= 2  # of 20 updates in those 2 s (a fixed guard: ~10)
    assert poller.early_updates >= 1  # the 8-ms guard was too short at first


def test_the_widened_guard_shrinks_back_once_the_host_wakes_the_poller_on_time(open_card):
    host = FakeHost(wake_late_s=0.015)
    _, device = open_card(host.now_s)
    poller = CounterPoller(device, poll_s=POLL_S, clock=host)
    widened = []

    def on_time() -> None:
        widened.append((poller.wake_guard_s, poller.early_updates))
        host.wake_late_s = 0.0

    host.at(host.t + 4.0, on_time)
    host.at(host.t + 12.0, poller.stop)
    poller.run()
    widened_s, early_then = widened[0]
    assert widened_s > 0.015 and poller.guard_s == UPDATE_GUARD_S
    assert poller.wake_guard_s == poller.guard_s  # back to the quiet guard within 8 s (80 updates)
    assert poller.early_updates == early_then  # none came before a wake since


def test_the_poller_reads_on_a_thread_of_its_own_until_stopped(open_card):
    _, device = open_card(time.monotonic)
    poller = CounterPoller(device, poll_s=POLL_S)
    poller.start()
    deadline_s = time.monotonic() + 30.0  # a loaded host: the thread may start late
    updates = []
    while len(updates) < 3 and time.monotonic() < deadline_s:
        time.sleep(0.01)
        updates.extend(poller.take(time.monotonic()))
    poller.stop()
    reads = poller.reads
    time.sleep(0.05)
    assert len(updates) >= 3 and poller.error is None
    assert all(b[1] > a[1] for a, b in itertools.pairwise(updates))  # each a new counter value
    assert poller.reads == reads  # it stopped reading


def test_a_read_that_takes_longer_than_the_poll_is_followed_at_once_by_the_next(card, host):
    _, device = card
    waits_s = []
    wait = host.wait

    def timed_wait(stop, timeout_s):
        waits_s.append(timeout_s)
        return wait(stop, timeout_s)

    def slow_read():  # a card's read: 4 ms of host time, as on an H200
        host.t += 0.004
        return read()

    read, device.energy_j = device.energy_j, slow_read
    host.wait = timed_wait
    poller = _poll_for(device, host, 1.0, guard_s=None)  # back to back throughout
    assert 240 <= poller.reads <= 250  # one every 4 ms, not one every 4 ms + POLL_S
    assert set(waits_s[1:]) == {0.0}
