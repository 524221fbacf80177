"""A recorded kernel inside a training step: its recorded duration after the launch gap before
it, busy for its kind's in-step share of the chip (runtime/trace.py kernel_from_duration,
presets.KindModel.step_busy); kernels whose work is counted run as the size ladder's."""

from __future__ import annotations

import csv

import pytest

from kdvfs.runtime.presets import (
    LADDER_KINDS,
    STEP_BUSY_COMPUTE,
    STEP_BUSY_RAMP_S,
    STEP_BUSY_STREAM,
    get_preset,
)
from kdvfs.runtime.probe_kernels import parse_probe_kernel
from kdvfs.runtime.simulator import UNCAPPED, SimulatedDevice, controlled_point, operating_point
from kdvfs.runtime.tables import read_csv
from kdvfs.runtime.trace import busy_share, classify, kernel_from_duration, ramped, trace_workload
from kdvfs.runtime.types import ClockPair, KdvfsError
from kdvfs.runtime.workloads import gpt3_xl_layer

GEMM = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT"
GELU = "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl<float>>()"
COPY = "void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda()>()"
H200 = get_preset("h200")
TEMP_C = 55.0


def test_a_recorded_kernel_runs_its_duration_after_the_launch_gap_whatever_its_busy_share():
    for name in (GEMM, GELU):
        for share in (1.0, 0.5):
            kernel = kernel_from_duration(0, classify(name), "forward", 200e-6, share, UNCAPPED)
            op = controlled_point(H200, kernel, None, TEMP_C, UNCAPPED)
            assert op.time_s == pytest.approx(200e-6 + H200.launch_latency_s, rel=1e-6)
            assert kernel.busy_share == share and kernel.ref_time_s == 200e-6


@pytest.mark.parametrize("ladder_kernel", ["gemm_bf16_2048", "gelu_32MiB"])
def test_at_a_busy_share_of_one_a_recorded_kernel_is_the_ladders_kernel_that_ran_as_long(ladder_kernel):
    # the model reduces to the ladder's where it should: a kernel back to back with itself
    ladder = parse_probe_kernel(ladder_kernel).kernel()
    temp_c = SimulatedDevice("h200", noise=0.0).operating_temperature_c()  # where traces are costed
    run = operating_point(H200, ladder, None, temp_c, H200.power_cap_w)  # capped alone, as replayed
    name = GEMM if ladder.tensor_core else GELU
    recorded = kernel_from_duration(0, classify(name), "forward", run.time_s - H200.launch_latency_s, 1.0)
    assert (recorded.flops, recorded.bytes_moved) == pytest.approx(
        (ladder.flops, ladder.bytes_moved), rel=1e-6
    )
    again = operating_point(H200, recorded, None, temp_c, H200.power_cap_w)
    assert (again.time_s, again.power_w) == pytest.approx((run.time_s, run.power_w), rel=1e-6)


def test_a_less_busy_recorded_kernel_draws_less_and_keeps_its_kinds_memory_clock_dependence():
    busy, half = (kernel_from_duration(0, classify(GELU), "forward", 200e-6, s, UNCAPPED) for s in (1.0, 0.5))
    at = {
        (k, mem): controlled_point(H200, k, ClockPair(1980, mem), TEMP_C, UNCAPPED)
        for k in (busy, half)
        for mem in (3201, 2201)
    }
    assert at[half, 3201].power_w < at[busy, 3201].power_w - 100.0  # less DRAM traffic, less activity
    slowdown = [at[k, 2201].time_s / at[k, 3201].time_s for k in (busy, half)]
    assert slowdown[0] > 1.2 and slowdown[1] == pytest.approx(slowdown[0], rel=1e-9)  # a stream still
    assert at[half, 2201].power_w < at[half, 3201].power_w  # and DRAM power still follows its clock


def test_kinds_that_compute_and_kinds_that_stream_have_their_fitted_in_step_shares():
    shares = {kind: model.step_busy for kind, model in LADDER_KINDS}
    assert shares["gemm"] == shares["attention"] == STEP_BUSY_COMPUTE == busy_share("gemm")
    streaming = [k for k in shares if k not in ("gemm", "attention")]
    assert streaming and all(shares[k] == STEP_BUSY_STREAM == busy_share(k) for k in streaming)
    assert 0.0 < STEP_BUSY_STREAM < STEP_BUSY_COMPUTE <= 1.0


def test_kernels_whose_work_is_counted_are_as_busy_as_the_ladders():
    assert all(k.busy_share == 1.0 for k in gpt3_xl_layer().kernels)
    assert parse_probe_kernel("layernorm_8k_x_2048").kernel().busy_share == 1.0


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5, float("nan")])
def test_a_busy_share_outside_zero_to_one_is_refused_in_one_line(share, tmp_path):
    with pytest.raises(KdvfsError, match=r"^a kernel's busy share must be in \(0, 1\], got "):
        kernel_from_duration(0, classify(GEMM), "forward", 100e-6, share)
    trace = tmp_path / "t.csv"
    trace.write_text("seq,name,start_us,duration_us\n" + "".join(f"{i},{GEMM},{i},50\n" for i in range(2)))
    _, rows = read_csv(trace)
    with pytest.raises(KdvfsError, match="busy share must be in"):
        trace_workload(trace, "t", rows, {"gemm": share})


def test_a_kernel_whose_grid_fills_a_quarter_of_the_sms_draws_less_in_the_same_time(tmp_path):
    def step(blocks_per_sm: str):
        trace = tmp_path / f"t{blocks_per_sm or 'none'}.csv"
        rows = "".join(f"{i},{GEMM},{60 * i},50,{blocks_per_sm}\n" for i in range(4))
        trace.write_text("seq,name,start_us,duration_us,blocks_per_sm\n" + rows)
        _, cells = read_csv(trace)
        return trace_workload(trace, "t", cells)

    device = SimulatedDevice(get_preset("h200"), noise=0.0)
    full, quarter, unrecorded = step("2.5"), step("0.25"), step("")
    whole = busy_share("gemm") * ramped(50e-6, STEP_BUSY_RAMP_S)  # a 50-us kernel's share over its run
    assert quarter.kernels[0].busy_share == pytest.approx(0.25 * whole)
    assert full.kernels[0].busy_share == pytest.approx(whole) == unrecorded.kernels[0].busy_share
    (t_full, e_full), (t_quarter, e_quarter) = (device.expected(w.kernels[0], None) for w in (full, quarter))
    assert t_quarter == pytest.approx(t_full, rel=1e-3) and e_quarter < 0.6 * e_full


def test_a_kernel_as_short_as_the_ramp_keeps_half_its_kinds_share_and_a_long_one_nearly_all(tmp_path):
    ramp_us = STEP_BUSY_RAMP_S * 1e6
    trace = tmp_path / "t.csv"
    durations_us = [ramp_us, 2000.0] * 2
    starts_us = [sum(durations_us[:i]) + 10 * i for i in range(4)]
    with trace.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["seq", "name", "start_us", "duration_us"])
        names = [GELU, COPY] * 2  # a short GELU, then a long copy (both elementwise), twice
        out.writerows(
            [i, n, t, d] for i, (n, t, d) in enumerate(zip(names, starts_us, durations_us, strict=True))
        )
    _, rows = read_csv(trace)
    short, long = trace_workload(trace, "t", rows).kernels[:2]
    assert short.busy_share == pytest.approx(0.5 * busy_share("elementwise"))
    assert busy_share("elementwise") > long.busy_share > 0.99 * busy_share("elementwise")
    unramped = trace_workload(trace, "t", rows, ramp_s=0.0).kernels[0]
    assert unramped.busy_share == busy_share("elementwise")  # no ramp: the kind's whole share
    device = SimulatedDevice(H200, noise=0.0)
    (t_short, e_short), (t_unramped, e_unramped) = (device.expected(k, None) for k in (short, unramped))
    assert t_short == pytest.approx(t_unramped, rel=1e-3) and e_short < e_unramped  # as long, less drawn


def test_no_ramp_keeps_the_whole_share_and_a_longer_kernel_keeps_more():
    assert ramped(1e-6, 0.0) == 1.0
    assert ramped(5e-6, 10e-6) < ramped(50e-6, 10e-6) < ramped(500e-6, 10e-6) < 1.0
