"""Drift scenarios: each changes the simulated truth the way its name says, at its step."""

from __future__ import annotations

import pytest

from kdvfs.runtime.presets import H200
from kdvfs.runtime.scenarios import SCENARIOS, get_scenario
from kdvfs.runtime.schedule import Schedule, StepRunner
from kdvfs.runtime.simulator import SimulatedDevice
from kdvfs.runtime.types import ClockPair, KdvfsError, Kernel, Workload
from kdvfs.runtime.workloads import gpt3_xl_layer

GEMM = Kernel("gemm", flops=2 * 8192**3, bytes_moved=3 * 8192**2 * 2, tensor_core=True)
STREAM = Kernel("stream", flops=1e6, bytes_moved=2e9)
WORKLOAD = gpt3_xl_layer()


def test_registry_and_lookup():
    assert set(SCENARIOS) == {"ambient-step", "power-cap", "gpu-swap", "workload-change"}
    assert get_scenario("power-cap", 500).at_step == 500
    with pytest.raises(KdvfsError, match="unknown scenario 'heatwave' \\(known: ambient-step, power-cap"):
        get_scenario("heatwave")
    with pytest.raises(KdvfsError, match="step -1 is negative"):
        get_scenario("power-cap", -1)


def test_a_loop_of_chunks_stops_at_the_change_and_applies_it_once():
    scenario = get_scenario("power-cap", 500)
    device = SimulatedDevice("h200", noise=0)
    runner = StepRunner(device, WORKLOAD)
    done, chunks, caps = 0, [], []
    while done < 1200:
        n = scenario.steps_before(done, min(300, 1200 - done))
        runner.run(Schedule.stock(), n)
        chunks.append(n)
        if scenario.due(done, done + n):
            device, _ = scenario.apply(device, WORKLOAD)
        done += n
        caps.append(device.power_cap_w)
    assert chunks == [300, 200, 300, 300, 100]
    assert caps == [700, 500, 500, 500, 500]


def test_ambient_step_heats_the_card_and_raises_energy_in_place():
    device = SimulatedDevice("h200", noise=0)
    locked = ClockPair(1200, 3201)
    before_t, before_e = device.expected(GEMM, locked)
    before_c = device.operating_temperature_c()
    runner = StepRunner(device, WORKLOAD)
    runner.run(Schedule.stock(), 20_000)  # settled
    settled_c = device.temperature_c()
    same, workload = get_scenario("ambient-step").apply(device, WORKLOAD)
    assert same is device and workload is WORKLOAD
    assert device.ambient_c == H200.ambient_c + 15.0
    assert device.operating_temperature_c() == pytest.approx(before_c + 15.0)
    after_t, after_e = device.expected(GEMM, locked)
    assert after_t == pytest.approx(before_t)  # locked below the cap: same speed
    assert after_e > before_e * 1.003  # hotter silicon leaks more
    for _ in range(10):  # ~5 thermal time constants
        runner.run(Schedule.stock(), 2_000)
    assert device.temperature_c() > settled_c + 12.0


@pytest.mark.parametrize("preset, cap_w", [("h200", 500), ("h100", 500), ("a100", 286), ("rtx3080ti", 250)])
def test_power_cap_lowers_the_limit_to_five_sevenths_and_slows_a_capped_gemm(preset, cap_w):
    device = SimulatedDevice(preset, noise=0)
    stock_t, _stock_e = device.expected(GEMM, None)
    low = ClockPair(
        min(device.grid.core_levels_mhz, key=lambda c: abs(c - 600)), max(device.grid.mem_levels_mhz)
    )
    low_before = device.expected(GEMM, low)
    same, _ = get_scenario("power-cap").apply(device, WORKLOAD)
    assert same is device and device.power_cap_w == cap_w
    assert device.expected(GEMM, None)[0] > 1.1 * stock_t  # held to a lower clock
    assert device.point(GEMM, None).capped
    assert device.expected(GEMM, low)[0] == pytest.approx(low_before[0])  # far below the cap: as fast


def test_gpu_swap_restarts_on_the_partner_card_with_the_same_noise_and_grid_choice():
    old = SimulatedDevice("h200", noise=2.0, seed=1)
    new, workload = get_scenario("gpu-swap").apply(old, WORKLOAD, seed=7)
    assert new is not old and old.name == "NVIDIA H200" and workload is WORKLOAD
    assert new.name == "NVIDIA H100 80GB HBM3" and new.grid.mem_levels_mhz == (2619,)
    assert new.time_noise == pytest.approx(2.0 * new.preset.time_noise)
    # slower memory: a streaming kernel at stock takes longer on the H100
    assert new.expected(STREAM, None)[0] > 1.2 * old.expected(STREAM, None)[0]
    # seeded: the same seed draws the same noise
    again, _ = get_scenario("gpu-swap").apply(SimulatedDevice("h200", noise=2.0, seed=1), WORKLOAD, seed=7)
    assert new.run(GEMM, 3) == again.run(GEMM, 3)

    fast, _ = get_scenario("gpu-swap").apply(SimulatedDevice("h100-fastswitch"), WORKLOAD)
    assert fast.name == "NVIDIA H200" and fast.switch_latency_s == 50e-6
    full, _ = get_scenario("gpu-swap").apply(SimulatedDevice("rtx3080ti", full_grid=True), WORKLOAD)
    assert full.name == "NVIDIA A100-SXM4-40GB" and len(full.grid) == len(full.preset.core_levels_mhz)
    paper, _ = get_scenario("gpu-swap").apply(SimulatedDevice("a100"), WORKLOAD)
    assert paper.name == "NVIDIA GeForce RTX 3080 Ti" and len(paper.grid) == 50
    quiet, _ = get_scenario("gpu-swap").apply(SimulatedDevice("a100", noise=0), WORKLOAD)
    assert quiet.time_noise == 0.0 and quiet.energy_noise == 0.0
    with pytest.raises(KdvfsError, match="no card to swap preset 'NVIDIA H200'"):
        get_scenario("gpu-swap").apply(SimulatedDevice(H200), WORKLOAD)


def test_workload_change_doubles_the_batch_and_the_step():
    device = SimulatedDevice("h200", noise=0)
    same, doubled = get_scenario("workload-change").apply(device, WORKLOAD)
    assert same is device
    assert dict(doubled.meta)["batch"] == "8" and dict(WORKLOAD.meta)["batch"] == "4"
    assert [k.name for k in doubled.kernels] == [k.name for k in WORKLOAD.kernels]
    assert doubled.signature != WORKLOAD.signature  # a stored plan no longer fits

    def stock(w):
        return device.expected_step([(k, None, k.launches) for k in w.kernels])

    (t0, e0), (t1, e1) = stock(WORKLOAD), stock(doubled)
    assert 1.8 < t1 / t0 < 2.0 and 1.8 < e1 / e0 < 2.0  # the optimizer's kernels do not grow
    with pytest.raises(KdvfsError, match="workload 'trace' cannot be rebuilt at another batch size"):
        get_scenario("workload-change").apply(device, Workload("trace", (GEMM,)))
