"""Analytic workloads: the kernels one training iteration launches, with flops and bytes.

`gpt3_xl_layer` is one GPT-3-XL transformer layer (d_model 2048, 16 heads, MLP 4x) trained
with bf16 activations, fp32 master weights and AdamW, as the kernels an llm.c-style
implementation launches (layernorm, cuBLAS matmuls, permutes, causal softmax, residuals,
GELU, their backward kernels, bias-gradient reductions, the optimizer). Flops and bytes are
counted from the dimensions: a matmul of (m x k) by (k x n) is 2mkn FLOP on tensor cores and
reads/writes its operands once; elementwise kernels read and write their tensors once.
"""

from __future__ import annotations

from kdvfs.runtime.types import Kernel, Workload

BF16_B = 2
FP32_B = 4


def _mm(name: str, pass_name: str, m: float, k: float, n: float, batch: float = 1.0) -> Kernel:
    """A (batched) matmul: m x k times k x n."""
    flops = 2.0 * batch * m * k * n
    bytes_moved = batch * (m * k + k * n + m * n) * BF16_B
    return Kernel(
        name,
        pass_name,
        flops,
        bytes_moved,
        tensor_core=True,
        features=_features("matmul", flops, bytes_moved),
    )


def _ew(
    name: str,
    pass_name: str,
    elems_read: float,
    elems_written: float,
    flop_per_elem: float,
    elem_b: int = BF16_B,
) -> Kernel:
    """A memory-streaming kernel (elementwise, reduction, permute, layernorm)."""
    flops = flop_per_elem * max(elems_read, elems_written)
    bytes_moved = (elems_read + elems_written) * elem_b
    return Kernel(
        name,
        pass_name,
        flops,
        bytes_moved,
        tensor_core=False,
        features=_features("stream", flops, bytes_moved),
    )


def _features(kind: str, flops: float, bytes_moved: float) -> tuple[tuple[str, float], ...]:
    import math

    return (
        ("is_matmul", 1.0 if kind == "matmul" else 0.0),
        ("log10_flops", math.log10(max(flops, 1.0))),
        ("log10_bytes", math.log10(max(bytes_moved, 1.0))),
        ("arith_intensity", flops / max(bytes_moved, 1.0)),
    )


def gpt3_xl_layer(batch: int = 4, seq: int = 2048, d_model: int = 2048, heads: int = 16) -> Workload:
    """One GPT-3-XL layer, forward + backward + AdamW: 44 kernels. Default: GPT-3's 2048-token
    context, batch 4 (8192 tokens, as the H200 probe's 8 x 1024)."""
    n = float(batch * seq)  # tokens
    d = float(d_model)
    att = float(batch * heads * seq * seq)  # attention matrix elements
    hd = d / heads
    bh = float(batch * heads)
    params_w = {"qkv": 3 * d * d, "attproj": d * d, "fc": 4 * d * d, "fcproj": 4 * d * d}
    params_small = 3 * d + d + 4 * d + d + 4 * d  # biases and layernorm scales/shifts
    f, b, o = "forward", "backward", "optimizer"
    kernels = [
        # forward
        _ew("ln1_fwd", f, n * d, n * d, 8),
        _mm("qkv_fwd", f, n, d, 3 * d),
        _ew("permute_qkv_fwd", f, 3 * n * d, 3 * n * d, 0),
        _mm("attn_qk_fwd", f, seq, hd, seq, bh),
        _ew("softmax_fwd", f, att, att, 5),
        _mm("attn_av_fwd", f, seq, seq, hd, bh),
        _ew("unpermute_fwd", f, n * d, n * d, 0),
        _mm("attproj_fwd", f, n, d, d),
        _ew("residual_ln2_fwd", f, 2 * n * d, 2 * n * d, 10),
        _mm("fc_fwd", f, n, d, 4 * d),
        _ew("gelu_fwd", f, 4 * n * d, 4 * n * d, 15),
        _mm("fcproj_fwd", f, n, 4 * d, d),
        _ew("residual_fwd", f, 2 * n * d, n * d, 1),
        # backward
        _mm("fcproj_dinp_bwd", b, n, d, 4 * d),
        _mm("fcproj_dw_bwd", b, 4 * d, n, d),
        _ew("fcproj_dbias_bwd", b, n * d, d, 1, FP32_B),
        _ew("gelu_bwd", b, 8 * n * d, 4 * n * d, 20),
        _mm("fc_dinp_bwd", b, n, 4 * d, d),
        _mm("fc_dw_bwd", b, d, n, 4 * d),
        _ew("fc_dbias_bwd", b, 4 * n * d, 4 * d, 1, FP32_B),
        _ew("ln2_bwd", b, 3 * n * d, n * d, 15),
        _ew("residual_acc2_bwd", b, 2 * n * d, n * d, 1),
        _mm("attproj_dinp_bwd", b, n, d, d),
        _mm("attproj_dw_bwd", b, d, n, d),
        _ew("attproj_dbias_bwd", b, n * d, d, 1, FP32_B),
        _ew("unpermute_bwd", b, n * d, n * d, 0),
        _mm("attn_datt_bwd", b, seq, hd, seq, bh),
        _mm("attn_dv_bwd", b, seq, seq, hd, bh),
        _ew("softmax_bwd", b, 2 * att, att, 4),
        _mm("attn_dq_bwd", b, seq, seq, hd, bh),
        _mm("attn_dk_bwd", b, seq, seq, hd, bh),
        _ew("permute_qkv_bwd", b, 3 * n * d, 3 * n * d, 0),
        _mm("qkv_dinp_bwd", b, n, 3 * d, d),
        _mm("qkv_dw_bwd", b, d, n, 3 * d),
        _ew("qkv_dbias_bwd", b, 3 * n * d, 3 * d, 1, FP32_B),
        _ew("ln1_bwd", b, 3 * n * d, n * d, 15),
        _ew("residual_acc1_bwd", b, 2 * n * d, n * d, 1),
        # optimizer: gradient norm, then AdamW over fp32 master weights (read param, grad,
        # m, v; write param, m, v and the bf16 copy)
        _ew("grad_norm", o, sum(params_w.values()) + params_small, 1, 2, FP32_B),
        *(_ew(f"adamw_{name}", o, 4 * count, 3.5 * count, 12, FP32_B) for name, count in params_w.items()),
        _ew("adamw_small", o, 4 * params_small, 3.5 * params_small, 12, FP32_B),
        _ew("zero_grad", o, 0, sum(params_w.values()) + params_small, 0, BF16_B),
    ]
    meta = (("batch", str(batch)), ("seq", str(seq)), ("d_model", str(d_model)), ("heads", str(heads)))
    return Workload("gpt3-xl-layer", tuple(kernels), meta)
