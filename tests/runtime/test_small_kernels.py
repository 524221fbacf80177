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
    assert large_gain > 1.9 and small_gain < 0.9 * large_gain  # the launch does not scale with the clock


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


def stream(name: str, bytes_moved: float, kind: str = "norm") -> Kernel:
    return Kernel(name, bytes_moved=bytes_moved, kind=kind)


def test_a_working_set_that_fits_l2_draws_less_energy_per_byte_than_one_streamed_from_dram():
    l2 = get_preset("h200").l2_bytes
    fits, spills = stream("fits", 0.8 * l2), stream("spills", 8 * l2)
    at = ClockPair(1980, 3201)
    per_byte_fits = H200.point(fits, at).energy_j / fits.bytes_moved
    per_byte_spills = H200.point(spills, at).energy_j / spills.bytes_moved
    assert per_byte_fits < 0.9 * per_byte_spills  # the ladder: 0.82 (layernorm 4k rows against 256k)


def test_a_working_set_that_fits_l2_does_not_slow_at_a_lower_memory_clock_and_one_in_dram_does():
    l2 = get_preset("h200").l2_bytes
    fits, spills = stream("fits", 0.8 * l2), stream("spills", 8 * l2)
    hi, lo = ClockPair(1980, 3201), ClockPair(1980, 2201)
    assert H200.point(fits, lo).time_s == pytest.approx(H200.point(fits, hi).time_s, rel=1e-9)
    assert H200.point(spills, lo).time_s > 1.3 * H200.point(spills, hi).time_s


def test_attention_runs_in_whole_waves_over_the_sms():
    p = get_preset("h200")
    block = p.kind_model("attention").block_bytes
    flops = 1e9  # the same math in every launch: only the grid's shape differs

    def attention_time(blocks: int) -> float:
        k = Kernel(
            f"att{blocks}", flops=flops, bytes_moved=blocks * block, tensor_core=True, kind="attention"
        )
        return H200.point(k, ClockPair(1320, 3201)).time_s  # under the cap: the lock holds

    one_wave, one_block_more, two_waves = (
        attention_time(n) for n in (p.sm_count, p.sm_count + 1, 2 * p.sm_count)
    )
    wave_jump_s = one_block_more - one_wave
    assert wave_jump_s > 0.5 * p.kind_model("attention").wave_s  # one block more costs a whole wave
    assert two_waves - one_block_more < 0.2 * wave_jump_s  # filling that wave costs little more


def test_a_launch_whose_work_equals_its_floor_takes_longer_than_either_alone():
    p = get_preset("h200")
    km = p.kind_model("gemm")
    at = ClockPair(1320, 3201)  # under the cap: the lock holds
    floor_s = km.floor_s * p.max_core_mhz / at.core_mhz
    flops = floor_s * p.tensor_flop_per_cycle * km.rate_eff * at.core_mhz * 1e6  # work == floor
    k = Kernel("at_floor", flops=flops, tensor_core=True, kind="gemm")
    busy_s = H200.point(k, at).time_s - p.launch_latency_s
    assert 1.2 * floor_s < busy_s < 2.0 * floor_s  # SMs partly filled: a blend, not a max or a sum
