"""The simulated card on small kernels: launch-bound, partly filled, and drawing little power."""

from __future__ import annotations

import pytest

from kdvfs.runtime.presets import get_preset
from kdvfs.runtime.probe_kernels import parse_probe_kernel
from kdvfs.runtime.simulator import SimulatedDevice
from kdvfs.runtime.types import ClockPair, Kernel

H200 = SimulatedDevice("h200", noise=0.0, full_grid=True)


def kernel(name: str) -> Kernel:
    probe = parse_probe_kernel(name)
    return Kernel(
        name, flops=probe.flops, bytes_moved=probe.bytes_moved, tensor_core=probe.tensor_core, kind=probe.kind
    )


def test_a_kernel_of_no_work_runs_its_launch_at_every_clock():
    empty = Kernel("launch_only")
    times = {H200.point(empty, ClockPair(core, 3201)).time_s for core in (345, 990, 1980)}
    assert times == {get_preset("h200").launch_latency_s}


def test_a_kernel_below_its_floor_gains_far_less_than_the_clock_from_a_higher_clock():
    small, large = kernel("gelu_256KiB"), kernel("gemm_bf16_8192")
    low, high = ClockPair(660, 3201), ClockPair(1320, 3201)  # both under the power cap
    small_gain = H200.point(small, low).time_s / H200.point(small, high).time_s
    large_gain = H200.point(large, low).time_s / H200.point(large, high).time_s
    assert small_gain < 1.7 and large_gain > 1.9  # the launch does not scale with the clock; a full GEMM does


def test_small_kernels_draw_far_less_than_the_cap_and_large_ones_reach_it():
    for name in ("gemm_bf16_256", "gelu_256KiB", "layernorm_256_x_2048", "copy_256KiB"):
        assert H200.point(kernel(name), None).power_w < 0.45 * H200.power_cap_w, name
    for name in ("gemm_bf16_8192", "gelu_1GiB"):
        assert H200.point(kernel(name), None).power_w > 0.9 * H200.power_cap_w, name


@pytest.mark.parametrize("name", ["layernorm_16k_x_2048", "gelu_256MiB", "softmax_64k_x_1024"])
def test_memory_bound_kinds_stream_below_the_cards_peak(name):
    k = kernel(name)
    achieved_bytes_per_s = k.bytes_moved / H200.point(k, ClockPair(1980, 3201)).time_s
    assert achieved_bytes_per_s < 0.8 * get_preset("h200").mem_bw_bytes_per_s
