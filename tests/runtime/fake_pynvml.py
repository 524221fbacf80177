"""A fake `pynvml` for tests: an H200-like card with no hardware behind it.

It re-exports the real pynvml's constants and exception classes (NVML_*, NVMLError*,
nvmlClocksEventReason*/nvmlClocksThrottleReason*), so code that catches
`pynvml.NVMLError_NoPermission` or reads `NVML_CLOCK_SM` behaves as against the real module.

In-process: `monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)` after `configure()`.
In a subprocess: PYTHONPATH holding this folder and KDVFS_NVML_MODULE=fake_pynvml; the
environment variables below configure it, and every Set/Reset call is appended as one JSON
line (with the time.monotonic() of the call, comparable across processes) to the file named
by KDVFS_FAKE_NVML_CALLS.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pynvml as _real

for _name in dir(_real):
    if _name.startswith(("NVML_", "NVMLError", "nvmlClocksEventReason", "nvmlClocksThrottleReason")):
        globals()[_name] = getattr(_real, _name)

CALLS_ENV = "KDVFS_FAKE_NVML_CALLS"
NO_PERMISSION_ENV = "KDVFS_FAKE_NVML_NO_PERMISSION"
NOT_SUPPORTED_ENV = "KDVFS_FAKE_NVML_NOT_SUPPORTED"
GPU_COUNT_ENV = "KDVFS_FAKE_NVML_GPU_COUNT"

MEM_CLOCKS_MHZ = (3201, 2201)
GRAPHICS_CLOCKS_MHZ = (1980, 1755, 1410, 990, 345)
ENERGY_UPDATE_PERIOD_S = 0.1
#: The counters are this process's own state (set by configure() and the clocks locked here):
#: another process opening this module reads a card of its own.
COUNTERS_SHARED = False


@dataclass
class FakeState:
    """What the fake card does and what was done to it."""

    gpu_count: int = 1
    init_error: int | None = None  # an NVML_ERROR_* code that nvmlInit raises
    no_permission: bool = False  # Set*/Reset* raise NVMLError_NoPermission
    not_supported: frozenset[str] = frozenset()  # function names that raise NotSupported
    missing: frozenset[str] = frozenset()  # function names the "driver" lacks
    calls_file: str | None = None
    power_mw: int = 82_799
    clock_event_reasons: int = 0x1  # gpu_idle
    calls: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    locked_gpu_mhz: dict[int, tuple[int, int]] = field(default_factory=dict)
    locked_mem_mhz: dict[int, tuple[int, int]] = field(default_factory=dict)
    init_count: int = 0
    clock: Callable[[], float] = time.monotonic  # the card's time, s (a test's fake clock: deterministic)
    start_s: float | None = None  # when the counters started, on clock; None: now
    energy_period_s: float = ENERGY_UPDATE_PERIOD_S  # the counter advances this often, s
    # power (mW) at the locked (min, max) graphics and memory clocks (None: not locked);
    # None: power_mw whatever the clocks
    power_at: Callable[[tuple[int, int] | None, tuple[int, int] | None], int] | None = None
    power_changes: list[tuple[float, int]] = field(default_factory=list)  # (clock s, mW from then)

    def __post_init__(self) -> None:
        if self.start_s is None:
            self.start_s = self.clock()


STATE = FakeState()


def configure(**changes: object) -> FakeState:
    """Start a fresh fake card (its counters at zero) with the given FakeState fields."""
    global STATE
    STATE = FakeState(**changes)  # type: ignore[arg-type]
    return STATE


def _configure_from_env() -> None:
    configure(
        gpu_count=int(os.environ.get(GPU_COUNT_ENV, "1")),
        no_permission=os.environ.get(NO_PERMISSION_ENV) == "1",
        not_supported=frozenset(filter(None, os.environ.get(NOT_SUPPORTED_ENV, "").split(","))),
        calls_file=os.environ.get(CALLS_ENV),
    )


class Handle:
    def __init__(self, index: int) -> None:
        self.index = index


def _check(fn_name: str) -> None:
    if STATE.init_count <= 0:
        raise _real.NVMLError(_real.NVML_ERROR_UNINITIALIZED)
    if fn_name in STATE.missing:
        raise _real.NVMLError(_real.NVML_ERROR_FUNCTION_NOT_FOUND)
    if fn_name in STATE.not_supported:
        raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)


def _change(fn_name: str, handle: Handle, args: tuple[int, ...]) -> None:
    """Record a Set/Reset attempt; refuse it when permission is off."""
    STATE.calls.append((fn_name, args))
    if STATE.calls_file:
        with open(STATE.calls_file, "a") as f:
            record = {
                "fn": fn_name,
                "index": handle.index,
                "args": list(args),
                "monotonic_s": time.monotonic(),
            }
            f.write(json.dumps(record) + "\n")
    _check(fn_name)
    if STATE.no_permission:
        raise _real.NVMLError(_real.NVML_ERROR_NO_PERMISSION)


# --- session ---------------------------------------------------------------------------------
def nvmlInit() -> None:
    if STATE.init_error is not None:
        raise _real.NVMLError(STATE.init_error)
    STATE.init_count += 1


def nvmlShutdown() -> None:
    _check("nvmlShutdown")
    STATE.init_count -= 1


def nvmlSystemGetDriverVersion() -> str:
    _check("nvmlSystemGetDriverVersion")
    return "580.159.04"


def nvmlDeviceGetCount() -> int:
    _check("nvmlDeviceGetCount")
    return STATE.gpu_count


def nvmlDeviceGetHandleByIndex(index: int) -> Handle:
    _check("nvmlDeviceGetHandleByIndex")
    if not 0 <= index < STATE.gpu_count:
        raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
    return Handle(index)


def nvmlDeviceGetName(handle: Handle) -> str:
    _check("nvmlDeviceGetName")
    return "NVIDIA H200"


def nvmlDeviceGetUUID(handle: Handle) -> str:
    _check("nvmlDeviceGetUUID")
    return f"GPU-fa4e0000-0000-0000-0000-{handle.index:012d}"


# --- clocks ----------------------------------------------------------------------------------
def nvmlDeviceGetSupportedMemoryClocks(handle: Handle) -> list[int]:
    _check("nvmlDeviceGetSupportedMemoryClocks")
    return list(MEM_CLOCKS_MHZ)


def nvmlDeviceGetSupportedGraphicsClocks(handle: Handle, mem_mhz: int) -> list[int]:
    _check("nvmlDeviceGetSupportedGraphicsClocks")
    if mem_mhz not in MEM_CLOCKS_MHZ:
        raise _real.NVMLError(_real.NVML_ERROR_NOT_FOUND)
    return list(GRAPHICS_CLOCKS_MHZ)


def nvmlDeviceSetGpuLockedClocks(handle: Handle, min_mhz: int, max_mhz: int) -> None:
    _change("nvmlDeviceSetGpuLockedClocks", handle, (min_mhz, max_mhz))
    STATE.locked_gpu_mhz[handle.index] = (min_mhz, max_mhz)
    _power_changed(handle)


def nvmlDeviceSetMemoryLockedClocks(handle: Handle, min_mhz: int, max_mhz: int) -> None:
    _change("nvmlDeviceSetMemoryLockedClocks", handle, (min_mhz, max_mhz))
    STATE.locked_mem_mhz[handle.index] = (min_mhz, max_mhz)
    _power_changed(handle)


def nvmlDeviceResetGpuLockedClocks(handle: Handle) -> None:
    _change("nvmlDeviceResetGpuLockedClocks", handle, ())
    STATE.locked_gpu_mhz.pop(handle.index, None)
    _power_changed(handle)


def nvmlDeviceResetMemoryLockedClocks(handle: Handle) -> None:
    _change("nvmlDeviceResetMemoryLockedClocks", handle, ())
    STATE.locked_mem_mhz.pop(handle.index, None)
    _power_changed(handle)


def _power_mw(index: int = 0) -> int:
    """The card's power now: power_at(the locked clocks), else power_mw."""
    if STATE.power_at is None:
        return STATE.power_mw
    return STATE.power_at(STATE.locked_gpu_mhz.get(index), STATE.locked_mem_mhz.get(index))


def _power_changed(handle: Handle) -> None:
    if STATE.power_at is not None:
        STATE.power_changes.append((STATE.clock(), _power_mw(handle.index)))


def _energy_mj(at_s: float) -> float:
    """Energy since start_s up to at_s, each stretch at the power set at its start."""
    first_mw = STATE.power_mw if STATE.power_at is None else STATE.power_at(None, None)
    points = [(STATE.start_s, first_mw), *STATE.power_changes, (at_s, 0)]
    energy_mj = 0.0
    for (t0, mw), (t1, _) in itertools.pairwise(points):
        energy_mj += mw * max(0.0, min(t1, at_s) - t0)
    return energy_mj


def nvmlDeviceGetClockInfo(handle: Handle, clock_type: int) -> int:
    _check("nvmlDeviceGetClockInfo")
    if clock_type == _real.NVML_CLOCK_MEM:
        return STATE.locked_mem_mhz.get(handle.index, (MEM_CLOCKS_MHZ[0],))[0]
    return STATE.locked_gpu_mhz.get(handle.index, (GRAPHICS_CLOCKS_MHZ[-1],))[0]


def nvmlDeviceGetCurrentClocksEventReasons(handle: Handle) -> int:
    _check("nvmlDeviceGetCurrentClocksEventReasons")
    return STATE.clock_event_reasons


def nvmlDeviceGetCurrentClocksThrottleReasons(handle: Handle) -> int:
    _check("nvmlDeviceGetCurrentClocksThrottleReasons")
    return STATE.clock_event_reasons


# --- sensors ---------------------------------------------------------------------------------
def nvmlDeviceGetTotalEnergyConsumption(handle: Handle) -> int:
    """mJ, advancing only every energy_period_s as on a real card."""
    _check("nvmlDeviceGetTotalEnergyConsumption")
    period_s = STATE.energy_period_s
    ticks = int((STATE.clock() - STATE.start_s) / period_s)
    if STATE.power_at is None:
        return 2_760_605 + int(STATE.power_mw * ticks * period_s)
    return 2_760_605 + int(_energy_mj(STATE.start_s + ticks * period_s))


def nvmlDeviceGetPowerUsage(handle: Handle) -> int:
    _check("nvmlDeviceGetPowerUsage")
    return _power_mw(handle.index)


def nvmlDeviceGetTemperature(handle: Handle, sensor: int) -> int:
    _check("nvmlDeviceGetTemperature")
    return 37


def nvmlDeviceGetEnforcedPowerLimit(handle: Handle) -> int:
    _check("nvmlDeviceGetEnforcedPowerLimit")
    return 700_000


def nvmlDeviceGetPowerManagementLimitConstraints(handle: Handle) -> list[int]:
    _check("nvmlDeviceGetPowerManagementLimitConstraints")
    return [200_000, 700_000]


_configure_from_env()
