"""The real GPU through NVML (pynvml): locked clocks, energy counter, sensors.

`NvmlDevice` satisfies `Device` with source "measured". Locking clocks needs root or
CAP_SYS_ADMIN; every lock is covered by a lease (clock_lease.py) so that stock clocks come
back on exit, on SIGINT/SIGTERM, and after a crash (the next start resets them).
`dry_run=True` records the NVML Set/Reset calls it would make in `calls` and makes none:
the only mode allowed on shared GPUs. Each record is logged too (resets at INFO, locks at
DEBUG), so a dry run's stock restore on a signal is on record after the process is gone.
`NvmlCounter`: the energy counter and sensors alone, read-only (no lease, no clocks): what
the counter's poller opens in a process of its own (counter_process.py), named by a
`CounterSource` (`NvmlDevice.counter_source()`).

The NVML module is `pynvml` unless $KDVFS_NVML_MODULE names another (the tests' fake).
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from kdvfs.runtime import clock_lease, daemon_client
from kdvfs.runtime.types import ClockGrid, ClockPair, KdvfsError, Source

log = logging.getLogger(__name__)

NVML_MODULE_ENV = "KDVFS_NVML_MODULE"
"""Environment variable naming the NVML module to import instead of pynvml (the tests' fake)."""
CAP_SYS_ADMIN_BIT = 21
"""Bit of CAP_SYS_ADMIN in a process's capability sets (linux/capability.h)."""

# suffix of nvmlClocksEventReason* / nvmlClocksThrottleReason* -> our name
_REASON_NAMES = (
    ("GpuIdle", "gpu_idle"),
    ("ApplicationsClocksSetting", "applications_clocks"),
    ("SwPowerCap", "sw_power_cap"),
    ("HwSlowdown", "hw_slowdown"),
    ("SyncBoost", "sync_boost"),
    ("SwThermalSlowdown", "sw_thermal"),
    ("HwThermalSlowdown", "hw_thermal"),
    ("HwPowerBrakeSlowdown", "hw_power_brake"),
    ("DisplayClockSetting", "display_clocks"),
    ("BoardLimit", "board_limit"),
    ("Reliability", "reliability"),
)


class NvmlUnavailable(KdvfsError):
    """No NVML library, NVML failed to start, or no such GPU."""


def load_nvml() -> ModuleType:
    """Import the NVML bindings and start NVML; NvmlUnavailable names why not."""
    name = os.environ.get(NVML_MODULE_ENV, "pynvml")
    try:
        nvml = importlib.import_module(name)
    except ImportError:
        raise NvmlUnavailable(f"no NVIDIA GPU or NVML library found ({name} is not installed)") from None
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise NvmlUnavailable(f"no NVIDIA GPU or NVML library found ({type(exc).__name__})") from None
    return nvml


def list_gpu_uuids() -> list[str]:
    """UUIDs of the GPUs NVML sees, in NVML index order (NvmlUnavailable without NVML)."""
    nvml = load_nvml()
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        return [_text(nvml.nvmlDeviceGetUUID(h)) for h in handles]
    except nvml.NVMLError as exc:
        raise NvmlUnavailable(f"no NVIDIA GPU or NVML library found ({type(exc).__name__})") from None
    finally:
        nvml.nvmlShutdown()


def decode_clock_event_reasons(nvml: ModuleType, mask: int) -> frozenset[str]:
    """Names of the bits set in a clocks-event (throttle) reason mask; unknown bits as hex."""
    names = set()
    known = 0
    for suffix, name in _REASON_NAMES:
        bit = getattr(nvml, f"nvmlClocksEventReason{suffix}", None) or getattr(
            nvml, f"nvmlClocksThrottleReason{suffix}", 0
        )
        if bit:
            known |= bit
            if mask & bit:
                names.add(name)
    rest = mask & ~known
    if rest:
        names.add(f"unknown_{rest:#x}")
    return frozenset(names)


def admin_privilege(status_path: Path = Path("/proc/self/status")) -> tuple[bool, str]:
    """Whether this process may lock clocks: root, or CAP_SYS_ADMIN in its effective set."""
    if os.geteuid() == 0:
        return True, "running as root"
    try:
        lines = status_path.read_text().splitlines()
        cap_eff = int(next(line.split()[1] for line in lines if line.startswith("CapEff:")), 16)
    except (OSError, StopIteration, ValueError):
        return False, "not root, and CAP_SYS_ADMIN could not be read from /proc/self/status"
    if cap_eff >> CAP_SYS_ADMIN_BIT & 1:
        return True, "process has CAP_SYS_ADMIN"
    return False, "not root and no CAP_SYS_ADMIN"


class PowerIntegrator:
    """Energy from power samples, for GPUs without a total-energy counter.

    A daemon thread reads power every `period_s` and integrates it (trapezoids); a reading
    adds the stretch since the last sample at the last power. NVML power is itself a
    running average updated every ~100 ms (~1 s average on H200), so this energy lags and
    smooths changes shorter than that: good for sustained replays, not single kernels.

    Args:
        read_power_w: reads the card's power, W.
        period_s: time between two power samples, s.
    """

    def __init__(self, read_power_w: Callable[[], float], period_s: float = 0.02) -> None:
        self._read_power_w = read_power_w
        self._period_s = period_s
        self._lock = threading.Lock()
        self._energy_j = 0.0
        self._last_t = time.monotonic()
        self._last_w = read_power_w()
        self._error: KdvfsError | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kdvfs-power-sampler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._period_s):
            try:
                power_w = self._read_power_w()
            except KdvfsError as exc:  # the card stopped answering: energy_j says so
                self._error = exc
                return
            now = time.monotonic()
            with self._lock:
                self._energy_j += 0.5 * (self._last_w + power_w) * (now - self._last_t)
                self._last_t, self._last_w = now, power_w

    def energy_j(self) -> float:
        if self._error is not None:
            raise self._error
        with self._lock:
            return self._energy_j + self._last_w * (time.monotonic() - self._last_t)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@dataclass(frozen=True)
class CounterSource:
    """Where another process opens the same card's counter: its NVML index and NVML module.

    Attributes:
        index: the GPU's NVML index.
        module: the NVML module to import (pynvml unless $KDVFS_NVML_MODULE named another).
    """

    index: int
    module: str


class NvmlCounter:
    """One GPU's energy counter and sensors through NVML, read-only: it sets nothing and
    takes no clock lease. Call close() when done.

    Args:
        index: the GPU's NVML index.
    """

    source: Source = "measured"

    def __init__(self, index: int = 0) -> None:
        self._nvml = load_nvml()
        self.index = index
        try:
            self._open_handle(index)
        except BaseException:
            self._nvml.nvmlShutdown()
            raise

    def _open_handle(self, index: int) -> None:
        nvml = self._nvml
        try:
            count = nvml.nvmlDeviceGetCount()
            if not 0 <= index < count:
                raise NvmlUnavailable(f"no NVIDIA GPU with index {index} ({count} found)")
            self._handle = nvml.nvmlDeviceGetHandleByIndex(index)
            self.name = _text(nvml.nvmlDeviceGetName(self._handle))
        except nvml.NVMLError as exc:
            raise NvmlUnavailable(f"GPU {index} could not be opened ({type(exc).__name__})") from None

    def energy_j(self) -> float:
        """Total-energy counter, J since driver load."""
        return self._read("nvmlDeviceGetTotalEnergyConsumption") / 1000.0

    def temperature_c(self) -> float:
        return float(self._read("nvmlDeviceGetTemperature", self._nvml.NVML_TEMPERATURE_GPU))

    def power_limit_w(self) -> float:
        """The enforced power limit."""
        return self._read("nvmlDeviceGetEnforcedPowerLimit") / 1000.0

    def sm_clock_mhz(self) -> float:
        """The SM clock now, MHz."""
        return float(self._read("nvmlDeviceGetClockInfo", self._nvml.NVML_CLOCK_SM))

    def throttle_reasons(self) -> frozenset[str]:
        nvml = self._nvml
        try:
            mask = nvml.nvmlDeviceGetCurrentClocksEventReasons(self._handle)
        except (AttributeError, nvml.NVMLError_FunctionNotFound):  # older pynvml or driver
            mask = self._read("nvmlDeviceGetCurrentClocksThrottleReasons")
        return decode_clock_event_reasons(nvml, int(mask))

    def close(self) -> None:
        """Shut NVML down (once)."""
        if self._nvml is not None:
            self._nvml.nvmlShutdown()
            self._nvml = None

    def _read(self, fn_name: str, *args: Any) -> Any:
        nvml = self._nvml
        try:
            return getattr(nvml, fn_name)(self._handle, *args)
        except nvml.NVMLError as exc:
            raise KdvfsError(f"GPU {self.index} ({self.name}): {fn_name} failed: {exc}") from None


class NvmlDevice(NvmlCounter):
    """One real GPU through NVML. Use as a context manager, or call close().

    Args:
        index: the GPU's NVML index.
        dry_run: record the Set/Reset calls in `calls` and make none (the only mode allowed
            on shared GPUs).
        lease_dir: where the clock leases live; None: clock_lease.default_lease_dir().
        power_sample_period_s: power sampling period on a card without an energy counter, s.
        daemon_socket: lock clocks through the clock daemon at this socket (docs/clock-daemon.md);
            None: $KDVFS_DAEMON_SOCKET, else the default socket when this process may not lock
            clocks itself and it exists, else NVML directly (daemon_client.socket_for).
    """

    def __init__(
        self,
        index: int = 0,
        *,
        dry_run: bool = False,
        lease_dir: Path | str | None = None,
        power_sample_period_s: float = 0.02,
        daemon_socket: Path | str | None = None,
    ) -> None:
        self._nvml = load_nvml()
        self.index = index
        self.dry_run = dry_run
        self.calls: list[tuple[float, str, tuple[int, ...]]] = []
        self._leases = clock_lease.LeaseDir(lease_dir)
        self._holding = False
        self._denied_reason: str | None = None
        self._daemon_socket = daemon_client.socket_for(daemon_socket, lambda: admin_privilege()[0])
        self._daemon: daemon_client.DaemonClient | None = None
        self._power_integrator: PowerIntegrator | None = None
        try:
            self._open(index)
            self._recover_stale_lease()
            if not self.energy_counter:
                self._power_integrator = PowerIntegrator(self.power_w, power_sample_period_s)
        except BaseException:
            self._nvml.nvmlShutdown()
            raise

    def _open(self, index: int) -> None:
        nvml = self._nvml
        self._open_handle(index)
        try:
            self.uuid = _text(nvml.nvmlDeviceGetUUID(self._handle))
            self.grid = self._read_grid()
        except nvml.NVMLError as exc:
            raise NvmlUnavailable(f"GPU {index} could not be opened ({type(exc).__name__})") from None
        self._lock_kinds: tuple[str, ...] = ("gpu", "mem") if len(self.grid.mem_levels_mhz) > 1 else ("gpu",)
        try:
            nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
            self.energy_counter = True
        except nvml.NVMLError_NotSupported:
            self.energy_counter = False

    def __repr__(self) -> str:
        return f"NvmlDevice({self.index}, {self.name!r}, dry_run={self.dry_run})"

    def __enter__(self) -> NvmlDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- clocks -------------------------------------------------------------------------
    def set_clocks(self, pair: ClockPair, *, snap: bool = False) -> None:
        """Lock graphics and memory clocks to `pair` (min = max).

        A pair outside the grid is a KdvfsError naming the nearest supported pairs, or is
        replaced by the nearest one when snap=True. A card with one memory clock gets no
        memory lock (there is nothing to choose).
        """
        pair = self._supported(pair, snap)
        if self._daemon_socket is not None and not self.dry_run:
            self._lock_through_daemon(pair)
            return
        if self.dry_run:
            self._hold_as_if_locked()
        else:
            self._take_lease()
        self._change("nvmlDeviceSetGpuLockedClocks", (pair.core_mhz, pair.core_mhz))
        if "mem" in self._lock_kinds:
            self._change("nvmlDeviceSetMemoryLockedClocks", (pair.mem_mhz, pair.mem_mhz))

    def reset_clocks(self) -> None:
        """Release the graphics and memory locks (stock clocks) and drop the lease."""
        if self._daemon_socket is not None and not self.dry_run:
            self._reset_through_daemon()
            return
        self._reset_locks(self._lock_kinds)
        self._drop_lease()

    def can_set_clocks(self) -> tuple[bool, str]:
        """Whether this process may lock clocks, and why (dry-run or not)."""
        if self._denied_reason is not None:
            return False, self._denied_reason
        if self._daemon_socket is not None:
            return self._daemon_permission()
        return admin_privilege()

    def nearest_pairs(self, pair: ClockPair, count: int = 2) -> list[ClockPair]:
        """Supported pairs nearest to `pair`: closest memory clock first, then core clock."""
        ranked = sorted(
            self.grid.pairs, key=lambda p: (abs(p.mem_mhz - pair.mem_mhz), abs(p.core_mhz - pair.core_mhz), p)
        )
        return ranked[:count]

    # --- sensors ------------------------------------------------------------------------
    def energy_j(self) -> float:
        """Total-energy counter (J since driver load); power-integrated since start where the
        card has no counter (see PowerIntegrator)."""
        if self._power_integrator is not None:
            return self._power_integrator.energy_j()
        return self._read("nvmlDeviceGetTotalEnergyConsumption") / 1000.0

    def power_w(self) -> float:
        return self._read("nvmlDeviceGetPowerUsage") / 1000.0

    def clocks_mhz(self) -> ClockPair:
        """Current SM and memory clocks."""
        nvml = self._nvml
        return ClockPair(
            int(self._read("nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_SM)),
            int(self._read("nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_MEM)),
        )

    def power_limit_range_w(self) -> tuple[float, float]:
        low_mw, high_mw = self._read("nvmlDeviceGetPowerManagementLimitConstraints")
        return low_mw / 1000.0, high_mw / 1000.0

    def driver_version(self) -> str:
        return _text(self._nvml.nvmlSystemGetDriverVersion())

    def counter_source(self) -> CounterSource | None:
        """Where another process reads this card's counter (`NvmlCounter`), or None: a card
        without an energy counter (its energy is integrated here), or an NVML module whose
        counters are this process's own (`COUNTERS_SHARED = False`: the tests' fake)."""
        if not self.energy_counter or not getattr(self._nvml, "COUNTERS_SHARED", True):
            return None
        return CounterSource(self.index, self._nvml.__name__)

    def close(self) -> None:
        """Reset held locks, stop the power sampler, shut NVML down (once)."""
        if self._nvml is None:
            return
        if self._holding:
            self.reset_clocks()
        if self._daemon is not None:
            self._daemon.close()
        if self._power_integrator is not None:
            self._power_integrator.stop()
        self._nvml.nvmlShutdown()
        self._nvml = None

    # --- internals ----------------------------------------------------------------------
    def _read_grid(self) -> ClockGrid:
        nvml, h = self._nvml, self._handle
        pairs = [
            ClockPair(int(core), int(mem))
            for mem in nvml.nvmlDeviceGetSupportedMemoryClocks(h)
            for core in nvml.nvmlDeviceGetSupportedGraphicsClocks(h, mem)
        ]
        return ClockGrid(tuple(pairs))

    def _supported(self, pair: ClockPair, snap: bool) -> ClockPair:
        if pair in self.grid:
            return pair
        nearest = self.nearest_pairs(pair)
        if snap:
            return nearest[0]
        raise KdvfsError(
            f"GPU {self.index} ({self.name}): clock pair {pair} is not supported; nearest supported: "
            f"{', '.join(map(str, nearest))} (pass snap=True to use the nearest)"
        )

    def _take_lease(self) -> None:
        """Before the first lock: refuse when denied or held by a live process, else write
        the lease and register the restore-on-exit/signal hold."""
        if self._holding:
            return
        allowed, why = self.can_set_clocks()
        if not allowed:
            raise self._permission_error(why)
        lease = self._leases.read(self.uuid)
        if lease is not None and lease.owner_alive():
            raise KdvfsError(
                f"GPU {self.index} ({self.name}): clocks are held by live process {lease.pid} "
                f"(lease {self._leases.file_for(self.uuid)}); stop it first"
            )
        self._leases.write(clock_lease.new_lease(self.uuid, self.index, self._lock_kinds))
        self._holding = True
        clock_lease.hold(self, self.reset_clocks)

    def _hold_as_if_locked(self) -> None:
        """Dry run: register the restore-on-exit/signal hold a real lock takes (no lease), so
        the reset a signal would make is recorded too."""
        if not self._holding:
            self._holding = True
            clock_lease.hold(self, self.reset_clocks)

    def _lock_through_daemon(self, pair: ClockPair) -> None:
        """The daemon holds the lease for this connection; the hold resets on exit/signals."""
        if self._daemon is None:
            self._daemon = daemon_client.DaemonClient(self._daemon_socket)
        self._daemon.lock(self.index, pair, uuid=self.uuid)
        if not self._holding:
            self._holding = True
            clock_lease.hold(self, self.reset_clocks)

    def _reset_through_daemon(self) -> None:
        if self._holding and self._daemon is not None:
            try:
                self._daemon.reset(self.index)
            finally:
                clock_lease.let_go(self)
                self._holding = False

    def _daemon_permission(self) -> tuple[bool, str]:
        where = f"the clock daemon at {self._daemon_socket}"
        try:
            with daemon_client.DaemonClient(self._daemon_socket) as client:
                hello = client.hello()
        except KdvfsError as exc:
            return False, str(exc)
        ranges = [r for r in hello.may_lock if r.gpu == self.index]
        if not ranges:
            return False, f"{where} lets uid {hello.uid} lock no clocks on GPU {self.index}"
        text = "; ".join(
            f"core {r.core_mhz[0]}-{r.core_mhz[1]} MHz, memory {r.mem_mhz[0]}-{r.mem_mhz[1]} MHz"
            for r in ranges
        )
        return True, f"through {where} ({text})"

    def _drop_lease(self) -> None:
        if self._holding:
            if not self.dry_run:
                self._leases.remove(self.uuid)
            clock_lease.let_go(self)
            self._holding = False

    def _reset_locks(self, kinds: tuple[str, ...]) -> None:
        self._change("nvmlDeviceResetGpuLockedClocks", ())
        if "mem" in kinds:
            self._change("nvmlDeviceResetMemoryLockedClocks", ())

    def _change(self, fn_name: str, args: tuple[int, ...]) -> None:
        """One NVML Set/Reset call, or (dry-run) its record in `calls` instead."""
        if self.dry_run:
            self.calls.append((time.time(), fn_name, args))
            # the record outlives the process in the log: a signal's reset, a survivor's
            log.log(
                logging.INFO if "Reset" in fn_name else logging.DEBUG,
                "kdvfs: GPU %d dry run: %s%s",
                self.index,
                fn_name,
                args,
            )
            return
        nvml = self._nvml
        try:
            getattr(nvml, fn_name)(self._handle, *args)
        except nvml.NVMLError_NoPermission:
            # nothing of ours can have taken effect without permission: the lease is void
            self._denied_reason = "NVML answered NVML_ERROR_NO_PERMISSION"
            self._drop_lease()
            raise self._permission_error(self._denied_reason) from None
        except nvml.NVMLError as exc:
            raise KdvfsError(f"GPU {self.index} ({self.name}): {fn_name}{args} failed: {exc}") from None

    def _permission_error(self, why: str) -> KdvfsError:
        return KdvfsError(
            f"GPU {self.index} ({self.name}): not allowed to lock clocks ({why}); run with root or "
            "CAP_SYS_ADMIN, ask the GPU's admin, or use dry-run to record the calls without making them"
        )

    def _recover_stale_lease(self) -> None:
        """A lease whose owner died means clocks may still be locked: reset them and remove
        the lease. Dry-run, or no permission: leave them, record and warn."""
        lease = self._leases.read(self.uuid)
        if lease is None or lease.owner_alive():
            return
        where = self._leases.file_for(self.uuid)
        taken = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(lease.time_s))
        allowed, why = self.can_set_clocks()
        if self.dry_run or not allowed:
            if self.dry_run:
                self._reset_locks(lease.locks)  # recorded in calls, not made
            log.warning(
                "kdvfs: GPU %d: clocks locked by dead process %d at %s may still be locked (lease %s); "
                "left as they are (%s)",
                self.index,
                lease.pid,
                taken,
                where,
                "dry-run" if self.dry_run else why,
            )
            return
        self._reset_locks(lease.locks)
        self._leases.remove(self.uuid)
        log.warning(
            "kdvfs: GPU %d: reset clocks left locked by dead process %d at %s; removed lease %s",
            self.index,
            lease.pid,
            taken,
            where,
        )


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
