"""torch.profiler trace loader: period, names, passes, work from durations, bad input."""

from __future__ import annotations

import csv
import dataclasses
import re
from pathlib import Path

import pytest

from kdvfs.runtime.simulator import SimulatedDevice
from kdvfs.runtime.trace import KINDS, classify, load_trace
from kdvfs.runtime.types import PASSES, KdvfsError

PROBE = Path(__file__).resolve().parents[2] / "data" / "h200-probe"
TRACE = PROBE / "gpt3xl_block_kernels.csv"

GEMM = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT"
FPROP = (
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0"
)
BPROP = (
    "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x128_1x4x1_cga1x1x1_kernel0_0"
)
LN = "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, false>(int, float)"
FILL = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >()"
ADAM = (
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
    "TensorListMetadata<1>, at::native::(anonymous namespace)::BinaryOpScalarFunctor<float, 1, 1, 0>, std::"
)


def test_gpt3xl_trace_one_step_of_110_kernels() -> None:
    workload = load_trace(TRACE)
    # 111 rows per step in the file, one of them the Optimizer.step annotation (not a kernel)
    assert len(workload) == 110
    meta = dict(workload.meta)
    assert meta["steps"] == "3" and meta["dropped_annotations"] == "Optimizer.step#AdamW.step"
    assert all(re.fullmatch(r"\d{3}\.[a-z0-9_]+", k.name) for k in workload.kernels)
    assert [int(k.name[:3]) for k in workload.kernels] == list(range(110))
    # kernel time is what the profiler saw: 6.7 ms of the step's 7.04 ms (README.md)
    assert sum(k.ref_time_s for k in workload.kernels) == pytest.approx(6.69e-3, rel=0.01)


def test_gpt3xl_trace_signature_is_stable() -> None:
    assert (
        load_trace(TRACE).signature == load_trace(TRACE).signature == "de076e187776c1cb"
    )  # the work is the simulated H200's for each recorded duration, at its kind's in-step busy share, ramped


def test_gpt3xl_trace_passes_in_order() -> None:
    workload = load_trace(TRACE)
    passes = [k.pass_name for k in workload.kernels]
    assert sorted(passes, key=PASSES.index) == passes
    assert set(passes) == {"forward", "backward", "optimizer"}  # no all-reduce in a one-GPU trace
    by_name = {k.name.split(".", 1)[1]: k.pass_name for k in workload.kernels}
    assert by_name["sdpa_fwd"] == "forward" and by_name["sdpa_bwd"] == "backward"
    assert by_name["reduce_mean"] == "forward"  # the loss
    assert workload.kernels[28].name == "028.fill" and passes[28] == "backward"  # loss.backward()'s seed
    assert passes[27] == "forward"
    assert all(p == "optimizer" for k, p in zip(workload.kernels, passes) if ".foreach_" in k.name)
    assert passes.count("optimizer") == 24


def test_gpt3xl_trace_durations_and_work() -> None:
    with TRACE.open() as f:
        rows = list(csv.DictReader(f))
    # position 5 of each 111-row step is the QKV GEMM: its mean duration over the 3 steps
    mean_s = sum(float(rows[5 + 111 * s]["duration_us"]) for s in range(3)) / 3 * 1e-6
    workload = load_trace(TRACE)
    gemm = workload.kernels[5]
    assert gemm.name == "005.gemm" and gemm.tensor_core
    assert gemm.ref_time_s == pytest.approx(mean_s)
    h200 = SimulatedDevice("h200", noise=0.0)
    assert gemm.flops > 0 and gemm.bytes_moved == 0.0
    # the recorded step, simulated: each kernel takes its recorded time under its power window's
    # cap (those under their kind's floor take the floor), the launch gap before it on top, and
    # the GEMM, run alone back to back, is capped harder than among the step's small kernels
    step_s, _ = h200.expected_step([(k, None, k.launches) for k in workload.kernels])
    launch_s = h200.preset.launch_latency_s
    assert step_s == pytest.approx(sum(k.ref_time_s + launch_s for k in workload.kernels), rel=0.01)
    assert h200.point(gemm, None).time_s > 1.05 * mean_s
    copy = workload.kernels[2]
    assert copy.name == "002.elementwise_copy" and not copy.tensor_core and copy.kind == "elementwise"
    assert copy.bytes_moved > 0 and copy.flops == 0.0
    floor_s = h200.point(dataclasses.replace(copy, bytes_moved=0.0), None).time_s
    assert h200.point(copy, None).time_s <= max(copy.ref_time_s + launch_s, floor_s) * (1 + 1e-6)
    features = gemm.feature_dict()
    assert features["duration_s"] == gemm.ref_time_s
    assert features["is_gemm"] == 1.0 and features["is_elementwise"] == 0.0 and features["tensor_core"] == 1.0
    assert all(k.feature_dict().keys() == features.keys() for k in workload.kernels)
    assert sum(k.feature_dict()[f"is_{kind}"] for kind in KINDS for k in workload.kernels) == 110


@pytest.mark.parametrize(
    ("name", "short", "kind", "tensor_core"),
    [
        (GEMM, "gemm", "gemm", True),
        (FPROP, "sdpa_fwd", "attention", True),
        (BPROP, "sdpa_bwd", "attention", True),
        (LN, "layernorm_fwd", "norm", False),
        (FILL, "fill", "elementwise", False),
        (ADAM, "foreach_binary_op_scalar", "optimizer", False),
        ("Memset (Device)", "memset", "memory_op", False),
        ("Memcpy DtoD (Device -> Device)", "memcpy_dtod", "memory_op", False),
        ("void my_ns::MyCustomKernel<int>(float*)", "my_custom_kernel", "other", False),
        # fp32 GEMMs on the CUDA cores, and a tensor-op GEMM whose operands are not aligned for
        # vector loads: GEMMs costed at the CUDA-core rate
        (
            "void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nt_align1>(Params)",
            "gemm_simt",
            "gemm",
            False,
        ),
        (
            "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize256x64x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_execute_kernel",
            "gemm_simt",
            "gemm",
            False,
        ),
        (
            "void cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_tn_align1>(Params)",
            "gemm_align1",
            "gemm",
            False,
        ),
        ("cutlass_tensorop_bf16_s16816fprop_optimized_bf16_256x64_32x4_nhwc_align8", "gemm", "gemm", True),
        (
            "fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float",
            "sdpa_fwd_f32",
            "attention",
            False,
        ),
        (
            "fmha_cutlassB_f32_aligned_64x64_k64_sm80(PyTorchMemEffAttention::AttentionBackwardKernel<",
            "sdpa_bwd_f32",
            "attention",
            False,
        ),
        (
            "void at::native::batch_norm_collect_statistics_channels_last_kernel<at::native::Var>()",
            "batchnorm",
            "norm",
            False,
        ),
        (
            "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float>()",
            "softmax",
            "norm",
            False,
        ),
        (
            "void (anonymous namespace)::softmax_warp_backward<float, float, float, 9, false, false>()",
            "softmax",
            "norm",
            False,
        ),
        (
            "void at::native::(anonymous namespace)::fused_dropout_kernel_vec<c10::BFloat16>()",
            "dropout",
            "elementwise",
            False,
        ),
        (
            "void at::native::(anonymous namespace)::CatArrayBatchedCopy<OpaqueType<2u>>()",
            "elementwise_copy",
            "elementwise",
            False,
        ),
        (
            "void at::native::(anonymous namespace)::max_pool_backward_nhwc<c10::BFloat16, float>()",
            "pool",
            "elementwise",
            False,
        ),
        (
            "void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float>()",
            "nll_loss",
            "reduce",
            False,
        ),
    ],
)
def test_classify(name: str, short: str, kind: str, tensor_core: bool) -> None:
    c = classify(name)
    assert (c.short, c.kind, c.tensor_core) == (short, kind, tensor_core)


def write_trace(tmp_path: Path, names: list[str], durations_us: list[float] | None = None) -> Path:
    durations_us = durations_us or [10.0 + i for i in range(len(names))]
    lines = ["seq,name,start_us,duration_us"]
    for i, (name, d) in enumerate(zip(names, durations_us)):
        lines.append(f'{i},"{name}",{100.0 * i},{d}')
    path = tmp_path / "trace.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_synthetic_trace_with_partial_last_step_and_profiler_step_annotations(tmp_path: Path) -> None:
    step = [LN, GEMM, FPROP, FILL, BPROP, GEMM, ADAM, ADAM]
    names: list[str] = []
    durations: list[float] = []
    for s in range(3):
        names += [f"ProfilerStep#{s}", *step]
        durations += [999.0] + [10.0 * (s + 1)] * len(step)
    names += step[:3]  # the profiler stopped mid-step
    durations += [1.0] * 3
    workload = load_trace(write_trace(tmp_path, names, durations))
    assert [k.name for k in workload.kernels] == [
        "000.layernorm_fwd", "001.gemm", "002.sdpa_fwd", "003.fill",
        "004.sdpa_bwd", "005.gemm", "006.foreach_binary_op_scalar", "007.foreach_binary_op_scalar",
    ]  # fmt: skip
    assert [k.pass_name for k in workload.kernels] == ["forward"] * 3 + ["backward"] * 3 + ["optimizer"] * 2
    assert [k.ref_time_s for k in workload.kernels] == pytest.approx([20e-6] * 8)  # whole steps only
    assert dict(workload.meta)["steps"] == "3"


def test_inference_trace_is_all_forward(tmp_path: Path) -> None:
    workload = load_trace(write_trace(tmp_path, [LN, GEMM] * 2))
    assert [k.pass_name for k in workload.kernels] == ["forward", "forward"]


def test_no_repeat_is_an_error(tmp_path: Path) -> None:
    path = write_trace(tmp_path, [LN, GEMM, FPROP, GEMM])
    with pytest.raises(
        KdvfsError, match=r"no repeating kernel sequence found in 4 kernels \(column 'name'\)"
    ) as err:
        load_trace(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("seq,name,start_us\n0,k,1\n", "header (line 1): missing required column 'duration_us'"),
        ("seq,name,start_us,duration_us\n0,k,1,2\n1,k,soon,2\n", "row 2 (line 3), column 'start_us'"),
        ("seq,name,start_us,duration_us\n0,k,1,2\n1,k,2,-2\n", "row 2 (line 3), column 'duration_us'"),
        ("seq,name,start_us,duration_us\nfirst,k,1,2\n", "row 1 (line 2), column 'seq'"),
        ("seq,name,start_us,duration_us\n0,,1,2\n", "row 1 (line 2), column 'name'"),
        ("seq,name,start_us,duration_us\n", "no data rows"),
    ],
)
def test_bad_trace_names_file_row_and_column(tmp_path: Path, text: str, where: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(KdvfsError) as err:
        load_trace(path)
    message = str(err.value)
    assert message.startswith(str(path)) and where in message and "\n" not in message
