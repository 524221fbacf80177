"""NvmlDevice against the fake pynvml: clocks, permissions, dry-run, sensors, restore paths."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pynvml
import pytest

from kdvfs.runtime import clock_lease, nvml_device
from kdvfs.runtime.device import Device
from kdvfs.runtime.nvml_device import NvmlDevice, NvmlUnavailable, decode_clock_event_reasons
from kdvfs.runtime.types import ClockPair, KdvfsError
from tests.runtime import fake_pynvml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
LOCK_CALLS = ["nvmlDeviceSetGpuLockedClocks", "nvmlDeviceSetMemoryLockedClocks"]
RESET_CALLS = ["nvmlDeviceResetGpuLockedClocks", "nvmlDeviceResetMemoryLockedClocks"]


pytestmark = pytest.mark.usefixtures("lease_registry")  # each test's holds and signal handlers its own


@pytest.fixture
def fake(monkeypatch):
    state = fake_pynvml.configure()
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)
    monkeypatch.delenv(nvml_device.NVML_MODULE_ENV, raising=False)
    monkeypatch.setattr(nvml_device, "admin_privilege", lambda: (True, "test: allowed"))
    return state


@pytest.fixture
def lease_dir(tmp_path):
    return tmp_path / "leases"


def fn_names(state) -> list[str]:
    return [name for name, _ in state.calls]


def lease_files(lease_dir: Path) -> list[Path]:
    return sorted(lease_dir.glob("*.json")) if lease_dir.exists() else []


# --- reading the card ----------------------------------------------------------------------
def test_device_reads_grid_and_identity(fake, lease_dir):
    with NvmlDevice(0, lease_dir=lease_dir) as dev:
        assert isinstance(dev, Device)
        assert (dev.name, dev.source) == ("NVIDIA H200", "measured")
        assert len(dev.grid) == len(fake_pynvml.MEM_CLOCKS_MHZ) * len(fake_pynvml.GRAPHICS_CLOCKS_MHZ)
        assert dev.grid.mem_levels_mhz == (2201, 3201)
        assert dev.grid.core_levels_mhz == (345, 990, 1410, 1755, 1980)
        assert dev.temperature_c() == 37.0
        assert dev.power_w() == pytest.approx(82.799)
        assert dev.clocks_mhz() == ClockPair(345, 3201)
        assert dev.power_limit_w() == 700.0 and dev.power_limit_range_w() == (200.0, 700.0)
    assert fake.init_count == 0  # close() shut NVML down
    assert fake.calls == []


def test_missing_library_and_bad_index_are_nvml_unavailable(fake, lease_dir):
    fake_pynvml.configure(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    with pytest.raises(NvmlUnavailable, match=r"NVMLError_LibraryNotFound"):
        NvmlDevice(0, lease_dir=lease_dir)
    state = fake_pynvml.configure()
    with pytest.raises(NvmlUnavailable, match=r"no NVIDIA GPU with index 3 \(1 found\)"):
        NvmlDevice(3, lease_dir=lease_dir)
    assert state.init_count == 0


def test_energy_counter_is_in_joules_and_steps(fake, lease_dir):
    now_s = [0.0]  # the card's clock, moved by the test
    state = fake_pynvml.configure(clock=lambda: now_s[0])
    with NvmlDevice(0, lease_dir=lease_dir) as dev:
        assert dev.energy_counter
        first = dev.energy_j()
        now_s[0] += 0.25
        gained = dev.energy_j() - first
    # 82.8 W in steps of 0.1 s: 0.25 s cross two steps
    assert gained == pytest.approx(state.power_mw / 1000 * 2 * state.energy_period_s, abs=2e-3)  # whole mJ


def test_energy_falls_back_to_integrated_power_where_counter_not_supported(fake, lease_dir):
    fake.not_supported = frozenset({"nvmlDeviceGetTotalEnergyConsumption"})
    fake.power_mw = 100_000
    t0 = time.monotonic()
    dev = NvmlDevice(0, lease_dir=lease_dir, power_sample_period_s=0.01)
    t1 = time.monotonic()
    assert not dev.energy_counter
    time.sleep(0.3)
    t2 = time.monotonic()
    energy_j = dev.energy_j()
    t3 = time.monotonic()
    dev.close()
    assert 100.0 * (t2 - t1) <= energy_j <= 100.0 * (t3 - t0)


def test_throttle_reasons_decoded_with_real_pynvml_bits(fake, lease_dir):
    fake.clock_event_reasons = (
        pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonHwThermalSlowdown
    )
    with NvmlDevice(0, lease_dir=lease_dir) as dev:
        assert dev.throttle_reasons() == {"sw_power_cap", "hw_thermal"}
        fake.missing = frozenset({"nvmlDeviceGetCurrentClocksEventReasons"})  # an older driver
        fake.clock_event_reasons = pynvml.nvmlClocksThrottleReasonGpuIdle
        assert dev.throttle_reasons() == {"gpu_idle"}


@pytest.mark.parametrize(
    ("mask", "names"),
    [
        (0, set()),
        (pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown, {"hw_power_brake"}),
        (pynvml.nvmlClocksEventReasonApplicationsClocksSetting | pynvml.nvmlClocksEventReasonSwThermalSlowdown,
         {"applications_clocks", "sw_thermal"}),
        (pynvml.nvmlClocksEventReasonHwSlowdown | 1 << 40, {"hw_slowdown", "unknown_0x10000000000"}),
    ],
)  # fmt: skip
def test_decode_clock_event_reasons(mask, names):
    assert decode_clock_event_reasons(pynvml, mask) == names


# --- locking and releasing ------------------------------------------------------------------
def test_set_and_reset_lock_both_clocks_under_a_lease(fake, lease_dir):
    dev = NvmlDevice(0, lease_dir=lease_dir)
    dev.set_clocks(ClockPair(1410, 2201))
    assert fake.locked_gpu_mhz == {0: (1410, 1410)} and fake.locked_mem_mhz == {0: (2201, 2201)}
    (lease_path,) = lease_files(lease_dir)
    lease = json.loads(lease_path.read_text())
    assert (lease["pid"], lease["gpu_index"], lease["locks"]) == (os.getpid(), 0, ["gpu", "mem"])
    assert lease["gpu_uuid"] == dev.uuid
    dev.reset_clocks()
    assert fake.locked_gpu_mhz == {} and fake.locked_mem_mhz == {}
    assert fn_names(fake) == LOCK_CALLS + RESET_CALLS
    assert lease_files(lease_dir) == []
    dev.close()
    assert fn_names(fake) == LOCK_CALLS + RESET_CALLS  # nothing held: close resets nothing more


def test_close_resets_held_clocks(fake, lease_dir):
    dev = NvmlDevice(0, lease_dir=lease_dir)
    dev.set_clocks(ClockPair(990, 3201))
    dev.close()
    assert fake.locked_gpu_mhz == {} and fn_names(fake)[-2:] == RESET_CALLS
    assert lease_files(lease_dir) == []


def test_unsupported_pair_is_refused_naming_the_nearest(fake, lease_dir):
    with NvmlDevice(0, lease_dir=lease_dir) as dev:
        with pytest.raises(KdvfsError) as err:
            dev.set_clocks(ClockPair(1400, 3000))
        message = str(err.value)
        assert "1400/3000 MHz is not supported" in message and "\n" not in message
        assert "nearest supported: 1410/3201 MHz, 1755/3201 MHz" in message
        assert fake.calls == [] and lease_files(lease_dir) == []
        dev.set_clocks(ClockPair(1400, 3000), snap=True)
        assert fake.locked_gpu_mhz == {0: (1410, 1410)} and fake.locked_mem_mhz == {0: (3201, 3201)}


def test_no_privilege_is_one_error_saying_what_to_do(fake, lease_dir, monkeypatch):
    monkeypatch.setattr(nvml_device, "admin_privilege", lambda: (False, "not root and no CAP_SYS_ADMIN"))
    with NvmlDevice(0, lease_dir=lease_dir) as dev:
        assert dev.can_set_clocks() == (False, "not root and no CAP_SYS_ADMIN")
        with pytest.raises(KdvfsError) as err:
            dev.set_clocks(ClockPair(1410, 3201))
    message = str(err.value)
    assert "\n" not in message
    for advice in ("root or CAP_SYS_ADMIN", "admin", "dry-run"):
        assert advice in message
    assert "nvidia-smi" not in message
    assert fake.calls == [] and lease_files(lease_dir) == []


def test_nvml_no_permission_answer_is_the_same_error_and_remembered(fake, lease_dir):
    fake.no_permission = True
    with NvmlDevice(0, lease_dir=lease_dir) as dev:
        with pytest.raises(
            KdvfsError, match=r"not allowed to lock clocks \(NVML answered NVML_ERROR_NO_PERMISSION\)"
        ):
            dev.set_clocks(ClockPair(1410, 3201))
        assert dev.can_set_clocks() == (False, "NVML answered NVML_ERROR_NO_PERMISSION")
        assert fn_names(fake) == LOCK_CALLS[:1]
        assert lease_files(lease_dir) == []
        with pytest.raises(KdvfsError, match="NO_PERMISSION"):
            dev.set_clocks(ClockPair(1410, 3201))
        assert fn_names(fake) == LOCK_CALLS[:1]  # refused up front the second time


def test_dry_run_records_and_changes_nothing(fake, lease_dir, monkeypatch):
    monkeypatch.setattr(nvml_device, "admin_privilege", lambda: (False, "not root and no CAP_SYS_ADMIN"))
    before = time.time()
    with NvmlDevice(0, dry_run=True, lease_dir=lease_dir) as dev:
        dev.set_clocks(ClockPair(990, 2201))
        dev.set_clocks(ClockPair(1000, 2201), snap=True)
        dev.reset_clocks()
        recorded = [(action, args) for _, action, args in dev.calls]
        assert all(before <= t <= time.time() for t, _, _ in dev.calls)
    assert recorded == [
        ("nvmlDeviceSetGpuLockedClocks", (990, 990)),
        ("nvmlDeviceSetMemoryLockedClocks", (2201, 2201)),
        ("nvmlDeviceSetGpuLockedClocks", (990, 990)),
        ("nvmlDeviceSetMemoryLockedClocks", (2201, 2201)),
        ("nvmlDeviceResetGpuLockedClocks", ()),
        ("nvmlDeviceResetMemoryLockedClocks", ()),
    ]
    assert fake.calls == [] and fake.locked_gpu_mhz == {}
    assert not lease_dir.exists()


def test_admin_privilege_reads_cap_sys_admin(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nCapEff:\t0000000000200000\n")
    assert nvml_device.admin_privilege(status) == (True, "process has CAP_SYS_ADMIN")
    status.write_text("Name:\tpython\nCapEff:\t00000000001fffff\n")
    assert nvml_device.admin_privilege(status) == (False, "not root and no CAP_SYS_ADMIN")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert nvml_device.admin_privilege(status)[0]


# --- leases held by other processes ---------------------------------------------------------
def write_lease(lease_dir: Path, pid: int, uuid: str) -> Path:
    lease = clock_lease.Lease(pid, clock_lease.process_start_ticks(pid), uuid, 0, ("gpu", "mem"), time.time())
    return clock_lease.LeaseDir(lease_dir).write(lease)


def test_live_owner_lease_blocks_locking(fake, lease_dir):
    with NvmlDevice(0, lease_dir=lease_dir) as dev:
        path = write_lease(lease_dir, os.getppid(), dev.uuid)
        with pytest.raises(KdvfsError, match=rf"held by live process {os.getppid()}"):
            dev.set_clocks(ClockPair(1410, 3201))
        assert fake.calls == [] and path.exists()


def test_reused_pid_does_not_make_a_lease_live(lease_dir):
    lease = clock_lease.Lease(os.getpid(), 1, "GPU-x", 0, ("gpu",), time.time())  # not our start time
    assert not lease.owner_alive()
    assert clock_lease.new_lease("GPU-x", 0, ("gpu",)).owner_alive()


# --- restore on exit, signals and after a crash (subprocesses) --------------------------------
def start_child(tmp_path: Path, lease_dir: Path, mode: str) -> tuple[subprocess.Popen, Path]:
    calls = tmp_path / "calls.jsonl"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(REPO), str(HERE)]),
        KDVFS_NVML_MODULE="fake_pynvml",
        KDVFS_FAKE_NVML_CALLS=str(calls),
    )
    child = subprocess.Popen(
        [sys.executable, str(HERE / "nvml_child.py"), str(lease_dir), mode],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdout.readline().strip() == "locked", child.stderr.read()
    return child, calls


def recorded(calls: Path) -> list[str]:
    return [json.loads(line)["fn"] for line in calls.read_text().splitlines()]


def test_normal_exit_restores_clocks(tmp_path, lease_dir):
    child, calls = start_child(tmp_path, lease_dir, "exit")
    assert child.wait(timeout=20) == 0
    assert recorded(calls) == LOCK_CALLS + RESET_CALLS
    assert lease_files(lease_dir) == []


def test_sigterm_restores_clocks_then_terminates(tmp_path, lease_dir):
    child, calls = start_child(tmp_path, lease_dir, "sleep")
    assert len(lease_files(lease_dir)) == 1
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=20) == -signal.SIGTERM
    assert recorded(calls) == LOCK_CALLS + RESET_CALLS
    assert lease_files(lease_dir) == []


@pytest.mark.usefixtures("sigint_default")
def test_sigint_restores_clocks_then_raises_keyboard_interrupt(tmp_path, lease_dir):
    child, calls = start_child(tmp_path, lease_dir, "sleep")
    child.send_signal(signal.SIGINT)
    assert child.wait(timeout=20) != 0
    assert "KeyboardInterrupt" in child.stderr.read()
    assert recorded(calls) == LOCK_CALLS + RESET_CALLS
    assert lease_files(lease_dir) == []


def test_stale_lease_after_sigkill_is_reset_by_next_start(tmp_path, lease_dir, fake, caplog):
    child, calls = start_child(tmp_path, lease_dir, "sleep")
    child.kill()
    child.wait(timeout=20)
    assert recorded(calls) == LOCK_CALLS  # killed: nothing restored
    assert len(lease_files(lease_dir)) == 1

    with caplog.at_level(logging.WARNING, logger="kdvfs.runtime.nvml_device"):
        NvmlDevice(0, dry_run=True, lease_dir=lease_dir).close()
    assert fake.calls == [] and len(lease_files(lease_dir)) == 1  # dry-run only warns
    assert "dry-run" in caplog.text

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kdvfs.runtime.nvml_device"):
        NvmlDevice(0, lease_dir=lease_dir).close()
    assert fn_names(fake) == RESET_CALLS
    assert lease_files(lease_dir) == []
    (warning,) = caplog.records
    assert f"dead process {child.pid}" in warning.getMessage()
