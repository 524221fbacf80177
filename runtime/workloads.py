"""Analytic workloads: the kernels one training step launches, with flops and bytes.

`gpt3_xl_layer` is one GPT-3-XL transformer layer (d_model 2048, 16 heads, MLP 4x) trained
with bf16 activations, fp32 master weights and AdamW, as the kernels an llm.c-style
implementation launches (layernorm, cuBLAS matmuls, permutes, causal softmax, residuals,
GELU, their backward kernels, bias-gradient reductions, the optimizer). Flops and bytes are
counted from the dimensions: a matmul of (m x k) by (k x n) is 2mkn FLOP on tensor cores and
reads/writes its operands once; elementwise kernels read and write their tensors once.
"""

from __future__ import annotations

from kdvfs.runtime.types import KdvfsError, Kernel, Workload

BF16_B = 2
FP32_B = 4


def _mm(name: str, pass_name: str, m: float, k: float, n: float, batch: float = 1.0) -> Kernel:
    """A (batched) cuBLAS matmul: m x k times k x n."""
    flops = 2.0 * batch * m * k * n
    bytes_moved = batch * (m * k + k * n + m * n) * BF16_B
    return Kernel(
        name,
        pass_name,
        flops,
        bytes_moved,
        tensor_core=True,
        features=_features("matmul", flops, bytes_moved),
        kind="gemm",
    )


def _ew(
    name: str,
    pass_name: str,
    elems_read: float,
    elems_written: float,
    flop_per_elem: float,
    elem_b: int = BF16_B,
    kind: str = "elementwise",
) -> Kernel:
    """A memory-streaming kernel of a kind of types.KERNEL_KINDS (elementwise, norm, reduce,
    optimizer, memory_op)."""
    flops = flop_per_elem * max(elems_read, elems_written)
    bytes_moved = (elems_read + elems_written) * elem_b
    return Kernel(
        name,
        pass_name,
        flops,
        bytes_moved,
        tensor_core=False,
        features=_features("stream", flops, bytes_moved),
        kind=kind,
    )


def _features(kind: str, flops: float, bytes_moved: float) -> tuple[tuple[str, float], ...]:
    import math

    return (
        ("is_matmul", 1.0 if kind == "matmul" else 0.0),
        ("log10_flops", math.log10(max(flops, 1.0))),
        ("log10_bytes", math.log10(max(bytes_moved, 1.0))),
        ("arith_intensity", flops / max(bytes_moved, 1.0)),
    )


def _layer(p: str, n: float, d: float, seq: int, heads: int) -> tuple[list[Kernel], list[Kernel]]:
    """The forward and backward kernels of one GPT layer, names prefixed with p: n tokens of
    width d, sequences of seq tokens, `heads` attention heads (llm.c-style: the attention
    matrix is materialised, softmax is its own kernel)."""
    att = n / seq * heads * seq * seq  # attention matrix elements
    hd = d / heads
    bh = n / seq * heads
    f, b = "forward", "backward"
    forward = [
        _ew(p + "ln1_fwd", f, n * d, n * d, 8, kind="norm"),
        _mm(p + "qkv_fwd", f, n, d, 3 * d),
        _ew(p + "permute_qkv_fwd", f, 3 * n * d, 3 * n * d, 0),
        _mm(p + "attn_qk_fwd", f, seq, hd, seq, bh),
        _ew(p + "softmax_fwd", f, att, att, 5, kind="norm"),
        _mm(p + "attn_av_fwd", f, seq, seq, hd, bh),
        _ew(p + "unpermute_fwd", f, n * d, n * d, 0),
        _mm(p + "attproj_fwd", f, n, d, d),
        _ew(p + "residual_ln2_fwd", f, 2 * n * d, 2 * n * d, 10, kind="norm"),
        _mm(p + "fc_fwd", f, n, d, 4 * d),
        _ew(p + "gelu_fwd", f, 4 * n * d, 4 * n * d, 15),
        _mm(p + "fcproj_fwd", f, n, 4 * d, d),
        _ew(p + "residual_fwd", f, 2 * n * d, n * d, 1),
    ]
    backward = [
        _mm(p + "fcproj_dinp_bwd", b, n, d, 4 * d),
        _mm(p + "fcproj_dw_bwd", b, 4 * d, n, d),
        _ew(p + "fcproj_dbias_bwd", b, n * d, d, 1, FP32_B, kind="reduce"),
        _ew(p + "gelu_bwd", b, 8 * n * d, 4 * n * d, 20),
        _mm(p + "fc_dinp_bwd", b, n, 4 * d, d),
        _mm(p + "fc_dw_bwd", b, d, n, 4 * d),
        _ew(p + "fc_dbias_bwd", b, 4 * n * d, 4 * d, 1, FP32_B, kind="reduce"),
        _ew(p + "ln2_bwd", b, 3 * n * d, n * d, 15, kind="norm"),
        _ew(p + "residual_acc2_bwd", b, 2 * n * d, n * d, 1),
        _mm(p + "attproj_dinp_bwd", b, n, d, d),
        _mm(p + "attproj_dw_bwd", b, d, n, d),
        _ew(p + "attproj_dbias_bwd", b, n * d, d, 1, FP32_B, kind="reduce"),
        _ew(p + "unpermute_bwd", b, n * d, n * d, 0),
        _mm(p + "attn_datt_bwd", b, seq, hd, seq, bh),
        _mm(p + "attn_dv_bwd", b, seq, seq, hd, bh),
        _ew(p + "softmax_bwd", b, 2 * att, att, 4, kind="norm"),
        _mm(p + "attn_dq_bwd", b, seq, seq, hd, bh),
        _mm(p + "attn_dk_bwd", b, seq, seq, hd, bh),
        _ew(p + "permute_qkv_bwd", b, 3 * n * d, 3 * n * d, 0),
        _mm(p + "qkv_dinp_bwd", b, n, 3 * d, d),
        _mm(p + "qkv_dw_bwd", b, d, n, 3 * d),
        _ew(p + "qkv_dbias_bwd", b, 3 * n * d, 3 * d, 1, FP32_B, kind="reduce"),
        _ew(p + "ln1_bwd", b, 3 * n * d, n * d, 15, kind="norm"),
        _ew(p + "residual_acc1_bwd", b, 2 * n * d, n * d, 1),
    ]
    return forward, backward


def _adamw(p: str, counts: dict[str, float], small: float) -> list[Kernel]:
    """Gradient norm, then AdamW over fp32 master weights (read param, grad, m, v; write
    param, m, v and the bf16 copy), then the gradients zeroed."""
    o = "optimizer"
    total = sum(counts.values()) + small
    return [
        _ew(p + "grad_norm", o, total, 1, 2, FP32_B, kind="reduce"),
        *(
            _ew(f"{p}adamw_{name}", o, 4 * count, 3.5 * count, 12, FP32_B, kind="optimizer")
            for name, count in counts.items()
        ),
        _ew(p + "adamw_small", o, 4 * small, 3.5 * small, 12, FP32_B, kind="optimizer"),
        _ew(p + "zero_grad", o, 0, total, 0, BF16_B, kind="memory_op"),
    ]


def _layer_params(d: float) -> tuple[dict[str, float], float]:
    """A layer's weight matrices by name, and its biases and LayerNorm scales and shifts."""
    return {
        "qkv": 3 * d * d,
        "attproj": d * d,
        "fc": 4 * d * d,
        "fcproj": 4 * d * d,
    }, 3 * d + d + 4 * d + d + 4 * d


def gpt3_xl_layer(batch: int = 4, seq: int = 2048, d_model: int = 2048, heads: int = 16) -> Workload:
    """One GPT-3-XL layer, forward + backward + AdamW: 44 kernels. Default: GPT-3's 2048-token
    context, batch 4 (8192 tokens, as the H200 probe's 8 x 1024)."""
    forward, backward = _layer("", float(batch * seq), float(d_model), seq, heads)
    params_w, params_small = _layer_params(float(d_model))
    meta = (("batch", str(batch)), ("seq", str(seq)), ("d_model", str(d_model)), ("heads", str(heads)))
    return Workload("gpt3-xl-layer", (*forward, *backward, *_adamw("", params_w, params_small)), meta)


GPT3_XL = {"layers": 24, "d_model": 2048, "heads": 16, "vocab": 50304, "seq": 2048}
"""GPT-3 XL (Brown et al. 2020, table 2.1): 24 layers, d_model 2048, 2048-token context; 16
heads of 128 as in gpt3_xl_layer; GPT-2's vocabulary padded to a multiple of 64."""
STATE_BYTES_PER_PARAM = 16  # fp32 weights, fp32 gradients, AdamW's two fp32 moments
ACT_BYTES_PER_TOKEN_WIDTH = 34  # bf16 activations kept for backward, per token, layer and width
ACT_BYTES_PER_HEAD_SCORE = 5  # the materialised attention matrix, per head and score
# Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models":
# a layer keeps 34 s b h + 5 a s^2 b bytes of activations (no recomputation, no parallelism).


def gpt3_xl_params(layers: int, d_model: int, vocab: int, seq: int) -> int:
    """Parameters of a GPT: 12 d^2 + 13 d per layer, token and position embeddings, final
    LayerNorm (the LM head is tied to the token embedding)."""
    return layers * (12 * d_model**2 + 13 * d_model) + vocab * d_model + seq * d_model + 2 * d_model


def fitting_batch(memory_bytes: float, layers: int, d_model: int, heads: int, vocab: int, seq: int) -> int:
    """The largest power-of-two batch of seq-token sequences whose activations fit in the
    memory the training state leaves (1 where not even that fits)."""
    free_b = memory_bytes - STATE_BYTES_PER_PARAM * gpt3_xl_params(layers, d_model, vocab, seq)
    per_sequence_b = layers * (
        ACT_BYTES_PER_TOKEN_WIDTH * seq * d_model + ACT_BYTES_PER_HEAD_SCORE * heads * seq**2
    )
    batch = 1
    while 2 * batch * per_sequence_b <= free_b:
        batch *= 2
    return batch


def gpt3_xl(
    batch: int = 8,
    seq: int = GPT3_XL["seq"],
    *,
    ranks: int = 1,
    link_bytes_per_s: float = 0.0,
    layers: int = GPT3_XL["layers"],
    d_model: int = GPT3_XL["d_model"],
    heads: int = GPT3_XL["heads"],
    vocab: int = GPT3_XL["vocab"],
) -> Workload:
    """The whole training step of GPT-3 XL (1.3 B parameters): token and position embeddings,
    `layers` layers forward, final LayerNorm, LM head and cross-entropy, all of it backward,
    then (ranks > 1) a ring all-reduce of the fp32 gradients that the GPU waits on, then
    AdamW over fp32 master weights.

    Args:
        batch: sequences per step on this GPU.
        seq: tokens per sequence.
        ranks: data-parallel ranks; 1 = no all-reduce.
        link_bytes_per_s: the all-reduce's bus bandwidth (NCCL's busbw), bytes/s; needed
            when ranks > 1.
        layers, d_model, heads, vocab: the model's shape (GPT-3 XL by default).
    """
    n, d = float(batch * seq), float(d_model)
    f, b = "forward", "backward"
    forward, backward = [_ew("embed_fwd", f, 2 * n * d, n * d, 1)], []
    for layer in range(layers):
        fwd, bwd = _layer(f"l{layer:02d}.", n, d, seq, heads)
        forward += fwd
        backward = bwd + backward  # backward runs the layers last to first
    forward += [
        _ew("lnf_fwd", f, n * d, n * d, 8, kind="norm"),
        _mm("lm_head_fwd", f, n, d, vocab),
        _ew("loss_fwd", f, n * vocab, n, 5, FP32_B, kind="norm"),
    ]
    backward = [
        _ew("loss_bwd", b, n * vocab, n * vocab, 3),
        _mm("lm_head_dinp_bwd", b, n, vocab, d),
        _mm("lm_head_dw_bwd", b, vocab, n, d),
        _ew("lnf_bwd", b, 3 * n * d, n * d, 15, kind="norm"),
        *backward,
        _ew("embed_bwd", b, n * d, n * d, 1, FP32_B, kind="reduce"),
    ]
    params = gpt3_xl_params(layers, d_model, vocab, seq)
    communication = []
    if ranks > 1:
        if link_bytes_per_s <= 0:
            raise KdvfsError(f"a {ranks}-rank all-reduce needs a link bandwidth > 0 bytes/s")
        grad_b = FP32_B * params
        # ring all-reduce: each rank sends and receives 2 (R-1)/R of the buffer over its link
        wait_s = grad_b * 2 * (ranks - 1) / ranks / link_bytes_per_s
        communication = [
            Kernel("allreduce_grads", "communication", 0.0, 2.0 * grad_b, kind="communication", wait_s=wait_s)
        ]
    weights, small = _layer_params(d)
    counts = {name: layers * count for name, count in weights.items()}
    counts["embeddings"] = float(vocab * d_model + seq * d_model)
    optimizer = _adamw("", counts, layers * small + 2 * d)
    name = "gpt3-xl" if ranks == 1 else f"gpt3-xl-dp{ranks}"
    meta = (
        ("batch", str(batch)),
        ("seq", str(seq)),
        ("layers", str(layers)),
        ("d_model", str(d_model)),
        ("heads", str(heads)),
        ("vocab", str(vocab)),
        ("parameters", str(params)),
        ("ranks", str(ranks)),
        ("link_bytes_per_s", f"{link_bytes_per_s:.4g}"),
    )
    return Workload(name, (*forward, *backward, *communication, *optimizer), meta)
