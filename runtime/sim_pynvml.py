"""A pynvml-compatible module backed by one simulated card: NVML code meets the simulator.

`bind(device)` ties the module to one SimulatedDevice (its clock advances only while kernels
run on it, so every reading is on that card's clock); `unbind()` lets it go. Then code written
for the real bindings drives the simulated card unchanged:
- kdvfs's NvmlDevice, with KDVFS_NVML_MODULE=kdvfs.runtime.sim_pynvml (not dry run);
- Zeus (tuner/peers.py), with this module as `pynvml`.
Its parts: session and identity, clocks (a graphics lock is the simulator's locked pair; a
memory lock alone leaves stock clocks: the simulator has no locked memory clock under an
auto core clock), power limits (the enforced limit is the simulator's power cap), sensors
(the energy counter in mJ, stepping as the card's counter does; power; temperature; clock
event reasons). Constants and exception classes are the real pynvml's.
"""

from __future__ import annotations

import pynvml as _real

from kdvfs.runtime.simulator import SimulatedDevice
from kdvfs.runtime.types import ClockPair, KdvfsError

for _name in dir(_real):
    if _name.startswith(("NVML_", "NVMLError", "nvmlClocksEventReason", "nvmlClocksThrottleReason")):
        globals()[_name] = getattr(_real, _name)
NVMLError = _real.NVMLError

MIN_POWER_LIMIT_SHARE = 2.0 / 7.0
"""Lowest settable power limit as a share of the default one: 100 W of 350 W on an RTX 3080 Ti,
200 W of 700 W on an H100/H200 (nvidia-smi -q); a fraction."""

_ARCHITECTURES = {"NVIDIA H": _real.NVML_DEVICE_ARCH_HOPPER, "NVIDIA A": _real.NVML_DEVICE_ARCH_AMPERE}
_REASON_BITS = {
    "sw_power_cap": _real.nvmlClocksEventReasonSwPowerCap,
    "hw_thermal": _real.nvmlClocksEventReasonHwThermalSlowdown,
}


class _Bound:
    """The bound card and what was done to it through this module."""

    def __init__(self, device: SimulatedDevice) -> None:
        self.device = device
        self.default_limit_mw = round(device.power_cap_w * 1000)
        self.init_count = 0
        self.persistence = _real.NVML_FEATURE_DISABLED
        self.gpu_lock_mhz: int | None = None
        self.mem_lock_mhz: int | None = None


class Handle:
    """The handle of GPU `index` (always 0: one card)."""

    def __init__(self, index: int) -> None:
        self.index = index


_STATE: _Bound | None = None


def bind(device: SimulatedDevice) -> None:
    """Back this module by `device` (its power cap now is the default power limit)."""
    global _STATE
    _STATE = _Bound(device)


def unbind() -> None:
    """No card: nvmlInit fails as on a machine without a driver."""
    global _STATE
    _STATE = None


def bound_device() -> SimulatedDevice | None:
    return None if _STATE is None else _STATE.device


def _card() -> _Bound:
    if _STATE is None:
        raise _real.NVMLError(_real.NVML_ERROR_DRIVER_NOT_LOADED)
    if _STATE.init_count <= 0:
        raise _real.NVMLError(_real.NVML_ERROR_UNINITIALIZED)
    return _STATE


def _device(handle: Handle) -> SimulatedDevice:
    card = _card()
    if not isinstance(handle, Handle) or handle.index != 0:
        raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
    return card.device


# --- session and identity --------------------------------------------------------------------
def nvmlInit() -> None:
    if _STATE is None:
        raise _real.NVMLError(_real.NVML_ERROR_DRIVER_NOT_LOADED)
    _STATE.init_count += 1


def nvmlShutdown() -> None:
    _card().init_count -= 1


def _nvmlGetFunctionPointer(name: str) -> None:
    """The real bindings' symbol lookup (Zeus checks that it exists): nothing to look up here."""
    raise _real.NVMLError(_real.NVML_ERROR_FUNCTION_NOT_FOUND)


def nvmlSystemGetDriverVersion() -> str:
    _card()
    return "simulated"


def nvmlDeviceGetCount() -> int:
    _card()
    return 1


def nvmlDeviceGetHandleByIndex(index: int) -> Handle:
    _card()
    if index != 0:
        raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
    return Handle(index)


def nvmlDeviceGetName(handle: Handle) -> str:
    return _device(handle).name


def nvmlDeviceGetUUID(handle: Handle) -> str:
    device = _device(handle)
    return f"GPU-simulated-{device.preset_name}"


def nvmlDeviceGetArchitecture(handle: Handle) -> int:
    name = _device(handle).name
    return next(
        (a for prefix, a in _ARCHITECTURES.items() if name.startswith(prefix)), _real.NVML_DEVICE_ARCH_AMPERE
    )


def nvmlDeviceGetC2cModeInfoV(handle: Handle) -> None:
    """Not a Grace Hopper superchip."""
    _device(handle)
    raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)


def nvmlDeviceGetPersistenceMode(handle: Handle) -> int:
    _device(handle)
    return _card().persistence


def nvmlDeviceSetPersistenceMode(handle: Handle, mode: int) -> None:
    _device(handle)
    _card().persistence = mode


# --- clocks ----------------------------------------------------------------------------------
def nvmlDeviceGetSupportedMemoryClocks(handle: Handle) -> list[int]:
    return sorted(_device(handle).grid.mem_levels_mhz, reverse=True)


def nvmlDeviceGetSupportedGraphicsClocks(handle: Handle, mem_mhz: int) -> list[int]:
    device = _device(handle)
    cores = sorted((p.core_mhz for p in device.grid.pairs if p.mem_mhz == mem_mhz), reverse=True)
    if not cores:
        raise _real.NVMLError(_real.NVML_ERROR_NOT_FOUND)
    return cores


def nvmlDeviceSetGpuLockedClocks(handle: Handle, min_mhz: int, max_mhz: int) -> None:
    """Locks at max_mhz (the simulator runs one clock; a range runs at its ceiling)."""
    _device(handle)
    _apply_locks(gpu_mhz=int(max_mhz), mem_mhz=_card().mem_lock_mhz)


def nvmlDeviceSetMemoryLockedClocks(handle: Handle, min_mhz: int, max_mhz: int) -> None:
    _device(handle)
    _apply_locks(gpu_mhz=_card().gpu_lock_mhz, mem_mhz=int(max_mhz))


def nvmlDeviceResetGpuLockedClocks(handle: Handle) -> None:
    _device(handle)
    _apply_locks(gpu_mhz=None, mem_mhz=_card().mem_lock_mhz)


def nvmlDeviceResetMemoryLockedClocks(handle: Handle) -> None:
    _device(handle)
    _apply_locks(gpu_mhz=_card().gpu_lock_mhz, mem_mhz=None)


def _apply_locks(gpu_mhz: int | None, mem_mhz: int | None) -> None:
    """Request the pair the locks make (stock without a graphics lock); a pair the card does
    not support is NVML's INVALID_ARGUMENT and changes nothing."""
    card = _card()
    device = card.device
    if gpu_mhz is None:
        device.reset_clocks()
    else:
        mem = (
            mem_mhz
            if mem_mhz is not None
            else max(p.mem_mhz for p in device.grid.pairs if p.core_mhz == gpu_mhz)
        )
        try:
            device.set_clocks(ClockPair(gpu_mhz, mem))
        except (KdvfsError, ValueError):
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT) from None
    card.gpu_lock_mhz, card.mem_lock_mhz = gpu_mhz, mem_mhz


def nvmlDeviceGetClockInfo(handle: Handle, clock_type: int) -> int:
    device = _device(handle)
    if clock_type == _real.NVML_CLOCK_MEM:
        pair = device.clocks_in_effect()
        return device.preset.max_mem_mhz if pair is None else pair.mem_mhz
    return round(device.sm_clock_mhz())


def nvmlDeviceGetCurrentClocksEventReasons(handle: Handle) -> int:
    reasons = _device(handle).throttle_reasons()
    return sum(bit for name, bit in _REASON_BITS.items() if name in reasons)


nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons


# --- power limits ----------------------------------------------------------------------------
def nvmlDeviceGetPowerManagementLimitConstraints(handle: Handle) -> list[int]:
    _device(handle)
    default_mw = _card().default_limit_mw
    return [round(default_mw * MIN_POWER_LIMIT_SHARE), default_mw]


def nvmlDeviceGetPowerManagementDefaultLimit(handle: Handle) -> int:
    _device(handle)
    return _card().default_limit_mw


def nvmlDeviceGetPowerManagementLimit(handle: Handle) -> int:
    return round(_device(handle).power_cap_w * 1000)


nvmlDeviceGetEnforcedPowerLimit = nvmlDeviceGetPowerManagementLimit


def nvmlDeviceSetPowerManagementLimit(handle: Handle, limit_mw: int) -> None:
    """The card enforces the new limit from its next kernel on; outside the constraints:
    INVALID_ARGUMENT, as NVML answers."""
    low_mw, high_mw = nvmlDeviceGetPowerManagementLimitConstraints(handle)
    if not low_mw <= limit_mw <= high_mw:
        raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
    _device(handle).set_power_cap_w(limit_mw / 1000.0)


# --- sensors ---------------------------------------------------------------------------------
def nvmlDeviceGetTotalEnergyConsumption(handle: Handle) -> int:
    """mJ; advances every energy_update_period_s of the card's clock, as the card's counter."""
    return int(_device(handle).energy_j() * 1000.0)


def nvmlDeviceGetPowerUsage(handle: Handle) -> int:
    return round(_device(handle).power_w() * 1000.0)


def nvmlDeviceGetTemperature(handle: Handle, sensor: int) -> int:
    return round(_device(handle).temperature_c())


def nvmlDeviceGetTemperatureV(handle: Handle, sensor: int) -> int:
    return nvmlDeviceGetTemperature(handle, sensor)
