"""What a real training loop hands the tuner each step: the counter and sensors, read aside.

- `CounterPoller`: reads the energy counter on a thread of its own and keeps every update it
  sees, as (host time it was seen, J): back to back until it has the counter's period (the
  median gap of observed updates), then asleep until `UPDATE_GUARD_S` before the next
  expected update and back to back from there until it comes (an H200 read takes ~4 ms: this
  cut ~200 reads a second to 26 on the H200). Back to back, a read starts `COUNTER_POLL_S`
  after the last one started, or at once after a longer read (an H200's): the thread then
  takes the GIL once a read, and each time it takes it costs a training thread busy on the
  host more than its own work. An update already there at the wake is not handed out (its
  time is not known: the window closes at the next one), and the guard doubles (a busy host
  wakes the thread late; at most half the period) and shrinks back by `GUARD_SHRINK` with
  each update seen after its wake; the sensors (`Sensors`: temperature, throttle reasons,
  enforced power limit, SM clock) every `sensor_period_s`. The controller takes the updates
  seen up to a step's end into that step's StepReport (runtime/steps.py), so the tuner's
  windows close at observed updates (data/h200-window-noise/README.md: polling sees an update within ~2 ms; the NVML
  field-value timestamp is no better a clock).
- `CounterReader`: what the controller needs of a poller (the Protocol); runtime/counter_process.py's
  `ProcessCounterPoller` reads a real card's counter in a process of its own instead, so
  that its reads never take the training process's GIL.
- `site_groups`: which schedule group each step site's time belongs to.
- `site_workload`: a workload of one segment per site, for a job whose kernels were not
  discovered (kdvfs.tune does not need them: clocks change only at sites).

ClockController (torch_integration.py) builds the reports; the host clock is time.monotonic
(`MONOTONIC`; a `Clock` of its own makes the poller's time and waits deterministic in a test).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from kdvfs.runtime.device import Device, optional_sensor
from kdvfs.runtime.schedule import Schedule
from kdvfs.runtime.types import PASSES, Kernel, Workload

log = logging.getLogger(__name__)

#: Least time from one counter read's start to the next's while reading back to back, s (an
#: H200 read itself takes ~4 ms: the next follows at once).
COUNTER_POLL_S = 0.001
#: Time between two reads of temperature, throttle reasons and power limit, s.
SENSOR_PERIOD_S = 0.5
#: How long before an expected counter update the poller wakes to read back to back, s
#: (the H200's update gaps spread 97-103 ms around its 100 ms).
UPDATE_GUARD_S = 0.008
#: Factor the guard shrinks by (down to guard_s) at each update seen after a wake, not at it.
GUARD_SHRINK = 0.98
#: Observed update gaps the period estimate needs before the poller sleeps between updates.
PERIOD_GAPS = 5


@dataclass(frozen=True)
class Sensors:
    """The card's sensors as last read (NaN or none where the card has no such sensor).

    Attributes:
        temperature_c: the GPU's temperature, C.
        throttle_reasons: the reasons its clocks are held back now.
        power_limit_w: the enforced power limit, W.
        sm_clock_mhz: the SM (core) clock it runs at now, MHz (a lower power limit or a hot
            card holds stock's clock below the grid's top).
    """

    temperature_c: float = math.nan
    throttle_reasons: frozenset[str] = frozenset()
    power_limit_w: float = math.nan
    sm_clock_mhz: float = math.nan


class CounterReader(Protocol):
    """What the clock controller reads of the counter's poller (CounterPoller, ProcessCounterPoller)."""

    error: BaseException | None

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def take(self, until_s: float) -> tuple[tuple[float, float], ...]:
        """The updates seen at or before until_s (host time, s), oldest first, handed out once."""
        ...

    def sensors(self) -> Sensors:
        """The sensors as last read."""
        ...

    def figures(self) -> dict[str, object]:
        """What the polling cost and saw."""
        ...


class Clock(Protocol):
    """The host time the poller stamps reads with, and its waits between them."""

    def now_s(self) -> float:
        """Host time now, s (any origin; only differences count)."""
        ...

    def wait(self, stop: threading.Event, timeout_s: float) -> bool:
        """Wait timeout_s or until stop is set, whichever comes first; True when stop is set."""
        ...


class MonotonicClock:
    """The host's monotonic clock; waits are the stop event's own."""

    def now_s(self) -> float:
        return time.monotonic()

    def wait(self, stop: threading.Event, timeout_s: float) -> bool:
        return stop.wait(timeout_s) if timeout_s > 0 else stop.is_set()


#: The clock of a real training loop.
MONOTONIC = MonotonicClock()


class CounterPoller:
    """The energy counter's updates and the card's sensors, read on their own thread.

    Args:
        device: the card (energy_j; temperature_c, throttle_reasons, power_limit_w, sm_clock_mhz
            where it has them).
        poll_s: least time from one counter read's start to the next's while reading back to
            back, s (a read that takes longer is followed at once).
        sensor_period_s: time between two sensor reads, s.
        guard_s: how long before an expected update the poller wakes at least, s (it widens
            while updates come before the wake); None: never sleeps between updates (reads
            back to back throughout).
        clock: the host time reads are stamped with and the waits between them.
        on_update: called on the poller's thread with each update it keeps: host time (s), J.
        on_sensors: called on the poller's thread with each sensor read (Sensors).
    """

    def __init__(
        self,
        device: Device,
        *,
        poll_s: float = COUNTER_POLL_S,
        sensor_period_s: float = SENSOR_PERIOD_S,
        guard_s: float | None = UPDATE_GUARD_S,
        clock: Clock = MONOTONIC,
        on_update: Callable[[float, float], None] | None = None,
        on_sensors: Callable[[Sensors], None] | None = None,
    ) -> None:
        self.device = device
        self.on_update = on_update
        self.on_sensors = on_sensors
        self.clock = clock
        self.poll_s = poll_s
        self.sensor_period_s = sensor_period_s
        self.guard_s = guard_s
        self.wake_guard_s = guard_s  # the guard now: widened while wakes come late, s
        self.reads = 0
        self.early_updates = 0  # updates already there at the first read after a sleep: not handed out
        self._gaps_s: list[float] = []
        self._started_s = self._stopped_s = 0.0
        self.error: BaseException | None = None
        self._updates: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._last_j = device.energy_j()
        self._sensors = self._read_sensors()
        self._sensors_s = clock.now_s()
        self._thread = threading.Thread(target=self.run, name="kdvfs-counter", daemon=True)

    def start(self) -> None:
        """Poll on a thread of its own until stop()."""
        self._started_s = self.clock.now_s()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._stopped_s = self._stopped_s or self.clock.now_s()

    def figures(self) -> dict[str, float | int | None]:
        """What the polling cost and saw: reads, reads a second, the counter period it
        learnt (s), and the updates that came before a planned wake (seen late)."""
        end_s = self._stopped_s or self.clock.now_s()
        seconds = end_s - self._started_s if self._started_s else 0.0
        return {
            "reads": self.reads,
            "reads_per_s": self.reads / seconds if seconds > 0 else None,
            "period_s": self.period_s(),
            "early_updates": self.early_updates,
            "guard_s": self.guard_s,
            "wake_guard_s": self.wake_guard_s,
        }

    def take(self, until_s: float) -> tuple[tuple[float, float], ...]:
        """The updates seen at or before until_s (host time), oldest first; they are handed out once."""
        with self._lock:
            n = next((i for i, (t, _) in enumerate(self._updates) if t > until_s), len(self._updates))
            taken, self._updates = self._updates[:n], self._updates[n:]
        return tuple(taken)

    def sensors(self) -> Sensors:
        """The sensors as last read."""
        return self._sensors

    def period_s(self) -> float | None:
        """The counter's update period: the median gap between updates seen while reading
        back to back (None until PERIOD_GAPS of them)."""
        gaps = sorted(self._gaps_s[-51:])
        return gaps[len(gaps) // 2] if len(gaps) >= PERIOD_GAPS else None

    def run(self) -> None:
        """Poll on the calling thread until stop() (start() runs this on a thread of its own)."""
        self._started_s = self._started_s or self.clock.now_s()
        try:
            wake_s = seen_s = None  # the next planned wake; when the last update was seen
            read_s = 0.0  # how long the last read took
            while not self.clock.wait(self._stop, self._pause_s(wake_s, read_s)):
                asked_s = self.clock.now_s()
                value_j = self.device.energy_j()
                now = self.clock.now_s()
                read_s = now - asked_s
                self.reads += 1
                first_after_sleep = wake_s is not None
                wake_s = None
                if value_j != self._last_j:
                    self._last_j = value_j
                    period = self.period_s()
                    if first_after_sleep:  # it came before the wake: when is not known, skip it
                        self.early_updates += 1
                        self.wake_guard_s = min(2.0 * self.wake_guard_s, 0.5 * period)
                    else:
                        with self._lock:
                            self._updates.append((now, value_j))
                        if self.on_update is not None:
                            self.on_update(now, value_j)
                        if seen_s is not None:
                            self._gaps_s.append(now - seen_s)
                        if self.guard_s is not None and period is not None:
                            self.wake_guard_s = max(self.guard_s, GUARD_SHRINK * self.wake_guard_s)
                    seen_s = None if first_after_sleep else now
                    if period is not None and self.guard_s is not None and seen_s is not None:
                        wake_s = seen_s + period - self.wake_guard_s
                if now - self._sensors_s >= self.sensor_period_s:
                    self._sensors, self._sensors_s = self._read_sensors(), now
                    if self.on_sensors is not None:
                        self.on_sensors(self._sensors)
        except Exception as exc:  # the card stopped answering: the tuner sees no more updates
            self.error = exc
            log.warning("kdvfs: energy counter poller stopped: %s", exc)

    def _pause_s(self, wake_s: float | None, read_s: float) -> float:
        """Reading back to back, what is left of poll_s after the last read took read_s (none:
        the next read at once); else the time to the planned wake."""
        if wake_s is None:
            return max(self.poll_s - read_s, 0.0)
        return max(wake_s - self.clock.now_s(), self.poll_s)

    def _read_sensors(self) -> Sensors:
        return Sensors(
            float(optional_sensor(self.device, "temperature_c", math.nan)),
            frozenset(optional_sensor(self.device, "throttle_reasons", frozenset())),
            float(optional_sensor(self.device, "power_limit_w", math.nan)),
            float(optional_sensor(self.device, "sm_clock_mhz", math.nan)),
        )


def site_groups(schedule: Schedule, kernel_sites: Sequence[int], sites: int) -> list[int]:
    """The schedule group each site's segment belongs to: the group of the site's first
    kernel; a site followed by no kernel, the group of the site before (0 for the first)."""
    starts = [s for s, _ in schedule.groups]
    first = {}
    for k, site in enumerate(kernel_sites):
        first.setdefault(site, k)
    groups, current = [], 0
    for site in range(sites):
        if site in first:
            current = max(i for i, s in enumerate(starts) if s <= first[site])
        groups.append(current)
    return groups


def site_workload(sites: Sequence[str], name: str = "torch_sites") -> Workload:
    """One segment per step site (`NNN.site`), each the kernels between its site and the next,
    in the meta that torch_discovery.workload_sites reads."""
    kernels = []
    pass_name = "forward"
    for i, site in enumerate(sites):
        pass_name = site if site in PASSES else pass_name
        kernels.append(Kernel(f"{i:03d}.{site.replace(':', '_')}", pass_name=pass_name))
    meta = (
        ("source", "step sites (kernels not discovered)"),
        ("sites", "|".join(sites)),
        ("kernel_sites", ",".join(str(i) for i in range(len(sites)))),
    )
    return Workload(name, tuple(kernels), meta=meta)
