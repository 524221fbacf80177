"""ReplayDevice: recorded costs, stock = highest pair, noise under a seed, stepped counter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kdvfs.runtime.device import Device, RunnableDevice
from kdvfs.runtime.replay import ReplayDevice
from kdvfs.runtime.tables import load_table
from kdvfs.runtime.types import ClockPair, KdvfsError, Kernel

LOW, HIGH, ONLY_GEMM = ClockPair(1000, 5000), ClockPair(2000, 5000), ClockPair(1500, 5000)
TABLE = """kernel,core_mhz,mem_mhz,time_s,energy_j
gemm,1000,5000,0.004,0.8
gemm,2000,5000,0.002,0.6
gemm,1500,5000,0.003,0.7
ln,1000,5000,0.003,0.3
ln,2000,5000,0.0025,0.4
"""
GEMM, LN = Kernel("gemm"), Kernel("ln")


@pytest.fixture
def csv_path(tmp_path: Path) -> Path:
    path = tmp_path / "toy.csv"
    path.write_text(TABLE)
    return path


def test_is_a_runnable_device_with_replayed_source(csv_path: Path) -> None:
    device = ReplayDevice.from_csv(csv_path)
    assert isinstance(device, RunnableDevice) and isinstance(device, Device)
    assert device.source == "replayed"
    assert device.name == "toy"
    assert device.grid.pairs == (LOW, ONLY_GEMM, HIGH)
    assert device.temperature_c() == 60.0
    assert device.throttle_reasons() == frozenset()


def test_expected_is_the_table_and_stock_is_the_highest_pair(csv_path: Path) -> None:
    device = ReplayDevice.from_csv(csv_path, noise=0.05)
    assert device.expected(GEMM, LOW) == (0.004, 0.8)
    assert device.expected(GEMM, None) == device.expected(GEMM, HIGH) == (0.002, 0.6)


def test_run_at_locked_and_stock_clocks(csv_path: Path) -> None:
    device = ReplayDevice.from_csv(csv_path)
    assert device.run(LN, launches=10) == pytest.approx(0.025)  # stock: 2000/5000
    device.set_clocks(LOW)
    assert device.run(LN, launches=10) == pytest.approx(0.03)
    assert device.now_s() == pytest.approx(0.055)
    assert device.true_energy_j() == pytest.approx(4.0 + 3.0)
    assert device.power_w() == pytest.approx(100.0)
    device.reset_clocks()
    assert device.clocks_in_effect() is None
    assert device.run(GEMM) == pytest.approx(0.002)


def test_unsupported_pair_and_unrecorded_kernel_pair_are_errors(csv_path: Path) -> None:
    device = ReplayDevice.from_csv(csv_path)
    with pytest.raises(KdvfsError, match="unsupported clock pair 1234/5000 MHz"):
        device.set_clocks(ClockPair(1234, 5000))
    with pytest.raises(KdvfsError, match="unsupported"):
        device.expected(LN, ClockPair(1234, 5000))
    device.set_clocks(ONLY_GEMM)
    assert device.run(GEMM) == pytest.approx(0.003)
    with pytest.raises(KdvfsError) as err:
        device.run(LN)
    assert str(csv_path) in str(err.value) and "'ln'" in str(err.value) and str(ONLY_GEMM) in str(err.value)
    with pytest.raises(KdvfsError, match="no kernel 'attn'"):
        device.run(Kernel("attn"))


def test_noise_is_deterministic_under_a_seed_and_scaled_time_vs_energy(csv_path: Path) -> None:
    table = load_table(csv_path)

    def samples(seed: int) -> np.ndarray:
        device = ReplayDevice(table, noise=0.04, seed=seed)
        out = []
        for _ in range(2000):
            device.idle(1.0)  # noise is drawn once per second of device time (ModelDevice)
            start_j = device.true_energy_j()
            out.append((device.run(GEMM), device.true_energy_j() - start_j))
        return np.array(out)

    a, b, c = samples(1), samples(1), samples(2)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    time_rel_sd = np.std(a[:, 0] / 0.002)
    energy_rel_sd = np.std(a[:, 1] / 0.6)
    assert time_rel_sd == pytest.approx(0.01, rel=0.15)
    assert energy_rel_sd == pytest.approx(0.04, rel=0.15)


def test_no_noise_by_default(csv_path: Path) -> None:
    device = ReplayDevice.from_csv(csv_path)
    assert {device.run(GEMM) for _ in range(20)} == {0.002}


def test_negative_noise_is_an_error(csv_path: Path) -> None:
    with pytest.raises(KdvfsError, match="noise"):
        ReplayDevice.from_csv(csv_path, noise=-0.1)


def test_energy_counter_advances_in_steps(csv_path: Path) -> None:
    device = ReplayDevice.from_csv(csv_path, energy_update_period_s=0.1)
    device.run(GEMM, launches=40)  # 0.08 s at 300 W
    assert device.energy_j() == 0.0 and device.true_energy_j() == pytest.approx(24.0)
    device.run(GEMM, launches=20)  # to 0.12 s: the counter catches up at the 0.1 s tick
    assert device.energy_j() == pytest.approx(30.0)
    assert device.true_energy_j() == pytest.approx(36.0)


def test_idle_draws_the_lowest_recorded_power(csv_path: Path) -> None:
    device = ReplayDevice.from_csv(csv_path)
    device.idle(0.5)
    assert device.true_energy_j() == pytest.approx(0.5 * 100.0)  # ln at 1000/5000: 0.3 J / 3 ms
    assert device.energy_j() == pytest.approx(50.0)


def test_switch_latency_keeps_old_clocks_running(csv_path: Path) -> None:
    device = ReplayDevice.from_csv(csv_path, switch_latency_s=0.01)
    device.set_clocks(LOW)
    assert device.run(GEMM, launches=5) == pytest.approx(0.010)  # still at stock: 5 x 2 ms
    assert device.run(GEMM) == pytest.approx(0.004)
    assert device.clocks_in_effect() == LOW


def test_idle_power_at_any_clocks_is_the_lowest_recorded_power(csv_path: Path) -> None:
    device = ReplayDevice.from_csv(csv_path)
    assert (
        device.idle_power_at(None) == device.idle_power_at(LOW) == device.idle_power_at(HIGH, 30.0) == 100.0
    )
    step = [(GEMM, None, 1), (LN, None, 1)]  # stock: the highest pair
    assert device.expected_step(step, [[(0.01, LOW)], [(0.03, None)]]) == pytest.approx((0.0245, 3.0))
