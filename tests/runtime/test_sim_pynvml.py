"""The pynvml module backed by the simulator: its counter, power limit and locked clocks, and
kdvfs's NvmlDevice (not dry run) driving the simulated card through it."""

from __future__ import annotations

import pytest

from kdvfs.runtime import nvml_device, sim_pynvml
from kdvfs.runtime.nvml_device import NvmlDevice
from kdvfs.runtime.registry import open_workload
from kdvfs.runtime.simulator import SimulatedDevice
from kdvfs.runtime.types import ClockPair

nvml = sim_pynvml


@pytest.fixture
def card():
    device = SimulatedDevice("rtx3080ti", seed=0)
    nvml.bind(device)
    nvml.nvmlInit()
    yield device
    nvml.unbind()


@pytest.fixture
def workload(card):
    return open_workload("gpt3-xl-layer", card)


def run_for(device: SimulatedDevice, workload, seconds: float) -> None:
    """Run steps at whatever clocks are in effect until `seconds` of the card's clock passed."""
    end_s = device.now_s() + seconds
    while device.now_s() < end_s:
        for kernel in workload.kernels:
            device.run(kernel, kernel.launches)


def test_nvml_init_fails_without_a_bound_card():
    nvml.unbind()
    with pytest.raises(nvml.NVMLError) as exc:
        nvml.nvmlInit()
    assert exc.value.value == nvml.NVML_ERROR_DRIVER_NOT_LOADED


def test_energy_counter_steps_with_the_card_clock_and_only_at_its_update_period(card, workload):
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    start_mj = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
    assert nvml.nvmlDeviceGetTotalEnergyConsumption(h) == start_mj  # no kernels: no time, no energy
    card.run(workload.kernels[0], 1)  # far shorter than the update period
    assert nvml.nvmlDeviceGetTotalEnergyConsumption(h) == start_mj
    run_for(card, workload, 1.0)
    spent_mj = nvml.nvmlDeviceGetTotalEnergyConsumption(h) - start_mj
    power_w = spent_mj / 1000.0 / 1.0
    assert 0.3 * card.power_cap_w < power_w < 1.1 * card.power_cap_w


def test_power_limit_is_honoured_within_its_constraints(card, workload):
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    low_mw, high_mw = nvml.nvmlDeviceGetPowerManagementLimitConstraints(h)
    assert low_mw < high_mw == nvml.nvmlDeviceGetPowerManagementDefaultLimit(h)
    with pytest.raises(nvml.NVMLError):
        nvml.nvmlDeviceSetPowerManagementLimit(h, high_mw + 1000)
    run_for(card, workload, 2.0)
    e0, t0 = nvml.nvmlDeviceGetTotalEnergyConsumption(h), card.now_s()
    run_for(card, workload, 5.0)
    stock_w = (nvml.nvmlDeviceGetTotalEnergyConsumption(h) - e0) / 1000.0 / (card.now_s() - t0)
    limit_mw = int(0.7 * stock_w) * 1000  # well above the power of the lowest clocks
    nvml.nvmlDeviceSetPowerManagementLimit(h, limit_mw)
    assert nvml.nvmlDeviceGetEnforcedPowerLimit(h) == limit_mw
    e0, t0 = nvml.nvmlDeviceGetTotalEnergyConsumption(h), card.now_s()
    run_for(card, workload, 5.0)
    limited_w = (nvml.nvmlDeviceGetTotalEnergyConsumption(h) - e0) / 1000.0 / (card.now_s() - t0)
    assert limited_w <= limit_mw / 1000.0 * 1.03 < stock_w  # 3%: the card's energy-noise scale
    reasons = nvml.nvmlDeviceGetCurrentClocksEventReasons(h)
    assert reasons & nvml.nvmlClocksEventReasonSwPowerCap


def test_locked_clocks_take_effect_after_the_switch_latency_and_reset_to_stock(card, workload):
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    mem = nvml.nvmlDeviceGetSupportedMemoryClocks(h)[0]
    core = nvml.nvmlDeviceGetSupportedGraphicsClocks(h, mem)[-1]
    nvml.nvmlDeviceSetGpuLockedClocks(h, core, core)
    nvml.nvmlDeviceSetMemoryLockedClocks(h, mem, mem)
    assert card.clocks_in_effect() is None  # the switch is in flight
    run_for(card, workload, 0.5)
    assert card.clocks_in_effect() == ClockPair(core, mem)
    assert nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM) == core
    with pytest.raises(nvml.NVMLError):
        nvml.nvmlDeviceSetGpuLockedClocks(h, core + 1, core + 1)
    nvml.nvmlDeviceResetGpuLockedClocks(h)
    nvml.nvmlDeviceResetMemoryLockedClocks(h)
    run_for(card, workload, 0.5)
    assert card.clocks_in_effect() is None


@pytest.fixture
def restore_state(lease_registry):
    """Keep clock_lease's holds and signal handlers from leaking between tests."""
    return lease_registry


def test_nvml_device_drives_the_simulated_card_not_dry_run(
    card, workload, monkeypatch, tmp_path, restore_state
):
    monkeypatch.setenv(nvml_device.NVML_MODULE_ENV, "kdvfs.runtime.sim_pynvml")
    monkeypatch.delenv("KDVFS_DAEMON_SOCKET", raising=False)
    monkeypatch.setattr(nvml_device, "admin_privilege", lambda: (True, "simulated card: no root needed"))
    with NvmlDevice(0, lease_dir=tmp_path / "leases", daemon_socket=None) as gpu:
        assert gpu.name == card.name and gpu.energy_counter
        assert set(gpu.grid.pairs) == set(card.grid.pairs)
        assert gpu.power_limit_w() == card.power_cap_w
        low = min(card.grid.pairs, key=lambda p: (p.core_mhz, -p.mem_mhz))
        e0, t0 = gpu.energy_j(), card.now_s()
        run_for(card, workload, 3.0)
        stock_w = (gpu.energy_j() - e0) / (card.now_s() - t0)
        gpu.set_clocks(low)
        run_for(card, workload, 0.5)
        assert gpu.clocks_mhz() == low and card.clocks_in_effect() == low
        e0, t0 = gpu.energy_j(), card.now_s()
        run_for(card, workload, 3.0)
        assert (gpu.energy_j() - e0) / (card.now_s() - t0) < 0.8 * stock_w
        assert 20.0 < gpu.temperature_c() < 100.0
    run_for(card, workload, 0.5)
    assert card.clocks_in_effect() is None  # closing reset the locks it held
