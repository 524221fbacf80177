"""Reference kernels of the stock-clock probe, defined by their names.

A name carries its shape, sizes written as people write them: `gemm_bf16_8192`,
`layernorm_8k_x_2048`, `softmax_64k_x_1024`, `gelu_256MiB`, `copy_1GiB`, `reduce_sum_4MiB`,
`sdpa_causal_b8_h16_t1024`, `adamw_64M` (parameters; k, M, B). Byte sizes take B, KiB, MiB,
GiB (and KB, MB, GB as powers of ten). `parse_probe_kernel` turns a name into the work it
does (flops and bytes moved, counted as h200-probe/kernels_stock.csv counts them) and its
kind (the runtime's kernel kinds, as trace.py classifies kernels); `ProbeKernel.build()`
into a callable that runs it once on a device. torch is imported only by build().
`SIZE_LADDER` is the size ladder of `kdvfs probe --ladder`: 6 sizes of each of 8 kinds,
from a few microseconds to milliseconds at stock on an H200.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from kdvfs.runtime.types import KdvfsError, Kernel

#: The six kernels of h200-probe/kernels_stock.csv: what `kdvfs probe` runs by default.
DEFAULT_PROBE_KERNELS = (
    "gemm_bf16_8192",
    "gemm_bf16_2048",
    "layernorm_8k_x_2048",
    "gelu_256MiB",
    "copy_256MiB",
    "sdpa_causal_b8_h16_t1024",
)
#: `kdvfs probe --ladder`: 8 kinds x 6 sizes, ~1 us to ~8 ms a call at stock on an H200.
SIZE_LADDER = (
    *(f"gemm_bf16_{n}" for n in (256, 512, 1024, 2048, 4096, 8192)),
    *(f"layernorm_{r}_x_2048" for r in ("256", "1k", "4k", "16k", "64k", "256k")),
    *(f"softmax_{r}_x_1024" for r in ("256", "4k", "16k", "64k", "256k", "1024k")),
    *(f"gelu_{s}" for s in ("256KiB", "4MiB", "32MiB", "256MiB", "1GiB", "4GiB")),
    *(f"copy_{s}" for s in ("256KiB", "4MiB", "32MiB", "256MiB", "1GiB", "4GiB")),
    *(f"reduce_sum_{s}" for s in ("256KiB", "4MiB", "32MiB", "256MiB", "1GiB", "4GiB")),
    *(f"sdpa_causal_b8_h16_t{t}" for t in (128, 256, 512, 1024, 2048, 4096)),
    *(f"adamw_{n}" for n in ("256k", "4M", "16M", "64M", "256M", "1B")),
)
SDPA_HEAD_DIM = 128  # GPT-3-XL: d_model 2048 / 16 heads
BF16_BYTES = 2  # bytes per bf16 element
FP32_BYTES = 4  # bytes per fp32 element
ADAMW_FLOP_PER_PARAM = 12.0  # moments, bias corrections, decay and the update
ADAMW_BYTES_PER_PARAM = 7 * FP32_BYTES  # reads param, grad, m, v; writes param, m, v

#: Multipliers of the units a size is written in: bytes (binary and decimal), counts, rows.
BYTE_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "KB": 10**3, "MB": 10**6, "GB": 10**9}
COUNT_UNITS = {"": 1, "k": 10**3, "M": 10**6, "B": 10**9}
ROW_UNITS = {"": 1, "k": 1 << 10}  # rows: 8k = 8192, as the probe names them

_BYTES = r"(?P<bytes>\d+(?:KiB|MiB|GiB|KB|MB|GB|B))"
_PATTERNS = {
    "gemm": re.compile(r"gemm_bf16_(?P<n>\d+)"),
    "layernorm": re.compile(r"layernorm_(?P<rows>\d+k?)_x_(?P<cols>\d+)"),
    "softmax": re.compile(r"softmax_(?P<rows>\d+k?)_x_(?P<cols>\d+)"),
    "gelu": re.compile(r"gelu_" + _BYTES),
    "copy": re.compile(r"copy_" + _BYTES),
    "reduce_sum": re.compile(r"reduce_sum_" + _BYTES),
    "sdpa": re.compile(r"sdpa_causal_b(?P<b>\d+)_h(?P<h>\d+)_t(?P<t>\d+)(?:_d(?P<d>\d+))?"),
    "adamw": re.compile(r"adamw_(?P<params>\d+[kMB]?)"),
}
_FORMS = (
    "gemm_bf16_N, layernorm_R_x_C, softmax_R_x_C, gelu_SIZE, copy_SIZE, reduce_sum_SIZE, "
    "sdpa_causal_bB_hH_tT[_dD], adamw_COUNT; SIZE as 256KiB, 4MiB, 1GiB (B, KiB, MiB, GiB, KB, MB, GB), "
    "R as 512 or 8k, COUNT as 64M (k, M, B)"
)
KIND_OF_OP = {
    "gemm": "gemm",
    "sdpa": "attention",
    "layernorm": "norm",
    "softmax": "norm",
    "gelu": "elementwise",
    "copy": "memory_op",
    "reduce_sum": "reduce",
    "adamw": "optimizer",
}
"""The runtime kernel kind (runtime/trace.py KINDS) of each probe op."""


@dataclass(frozen=True)
class ProbeKernel:
    """One reference kernel: its op, shape (named sizes), kind, and the work of one call."""

    name: str
    op: str
    shape: tuple[tuple[str, int], ...]
    flops: float
    bytes_moved: float

    @property
    def kind(self) -> str:
        return KIND_OF_OP[self.op]

    @property
    def tensor_core(self) -> bool:
        return self.op in ("gemm", "sdpa")

    def size(self, key: str) -> int:
        return dict(self.shape)[key]

    def kernel(self) -> Kernel:
        """The probe kernel as the simulator costs it: its work, kind and tensor-core use."""
        return Kernel(
            self.name,
            flops=self.flops,
            bytes_moved=self.bytes_moved,
            tensor_core=self.tensor_core,
            kind=self.kind,
        )

    def build(self, device: str = "cuda") -> Callable[[], object]:
        """Allocate inputs on `device` and return a callable that runs one call (async)."""
        import torch
        import torch.nn.functional as F

        dt = torch.bfloat16
        if self.op == "gemm":
            n = self.size("n")
            a, b = torch.randn(n, n, device=device, dtype=dt), torch.randn(n, n, device=device, dtype=dt)
            out = torch.empty(n, n, device=device, dtype=dt)
            return lambda: torch.matmul(a, b, out=out)
        if self.op in ("layernorm", "softmax"):
            cols = self.size("cols")
            x = torch.randn(self.size("rows"), cols, device=device, dtype=dt)
            if self.op == "softmax":
                return lambda: torch.softmax(x, dim=-1)
            w, bias = torch.ones(cols, device=device, dtype=dt), torch.zeros(cols, device=device, dtype=dt)
            return lambda: F.layer_norm(x, (cols,), w, bias)
        if self.op in ("gelu", "copy", "reduce_sum"):
            numel = self.size("bytes") // BF16_BYTES
            x = torch.randn(numel, device=device, dtype=dt)
            if self.op == "reduce_sum":
                total = torch.empty((), device=device, dtype=torch.float32)
                return lambda: torch.sum(x, dim=0, dtype=torch.float32, out=total)
            out = torch.empty(numel, device=device, dtype=dt)
            if self.op == "copy":
                return lambda: out.copy_(x)
            return lambda: torch.ops.aten.gelu.out(x, out=out)
        if self.op == "adamw":
            return _adamw_step(self.size("params"), device, torch)
        b, h, t, d = (self.size(k) for k in ("b", "h", "t", "d"))
        q, k, v = (torch.randn(b, h, t, d, device=device, dtype=dt) for _ in range(3))
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _adamw_step(params: int, device: str, torch) -> Callable[[], object]:
    """One AdamW step over one flat fp32 parameter (fused on CUDA, for-each elsewhere)."""
    p = torch.zeros(params, device=device, dtype=torch.float32, requires_grad=True)
    p.grad = torch.randn(params, device=device, dtype=torch.float32)
    fused = torch.device(device).type == "cuda"
    opt = torch.optim.AdamW([p], lr=1e-4, fused=fused, foreach=None if fused else True, capturable=fused)
    return opt.step


def parse_probe_kernel(name: str) -> ProbeKernel:
    """The kernel a probe name stands for; KdvfsError for a name of no known form."""
    for op, pattern in _PATTERNS.items():
        m = pattern.fullmatch(name)
        if m:
            sizes = {k: _size(k, v) for k, v in m.groupdict().items() if v is not None}
            if any(v <= 0 for v in sizes.values()):
                raise KdvfsError(f"probe kernel {name!r}: every size must be > 0")
            return _make(name, op, sizes)
    raise KdvfsError(f"probe kernel {name!r} has no known form ({_FORMS})")


def _size(key: str, text: str) -> int:
    """A size as the name writes it: bytes with a unit, rows with k, counts with k/M/B."""
    number, unit = re.fullmatch(r"(\d+)(\D*)", text).groups()
    units = BYTE_UNITS if key == "bytes" else COUNT_UNITS if key == "params" else ROW_UNITS
    return int(number) * units[unit]


def _make(name: str, op: str, sizes: dict[str, int]) -> ProbeKernel:
    """Flops and bytes per call: matrix work for GEMM (its operands stay in cache) and
    attention (plus its inputs and output), bytes read + written once for the memory-bound
    ops, both for AdamW."""
    flops = 0.0
    bytes_moved = 0.0
    if op == "gemm":
        flops = 2.0 * sizes["n"] ** 3
    elif op in ("layernorm", "softmax"):
        bytes_moved = 2.0 * sizes["rows"] * sizes["cols"] * BF16_BYTES
    elif op in ("gelu", "copy"):
        bytes_moved = 2.0 * sizes["bytes"]
    elif op == "reduce_sum":
        bytes_moved = float(sizes["bytes"])
    elif op == "adamw":
        flops = ADAMW_FLOP_PER_PARAM * sizes["params"]
        bytes_moved = float(ADAMW_BYTES_PER_PARAM * sizes["params"])
    else:
        sizes.setdefault("d", SDPA_HEAD_DIM)
        # QK^T and PV: 2 x (2 b h t^2 d), half of it under the causal mask; q, k, v read and
        # the output written once (a flash kernel keeps the scores on chip)
        flops = 2.0 * sizes["b"] * sizes["h"] * sizes["t"] ** 2 * sizes["d"]
        bytes_moved = 4.0 * sizes["b"] * sizes["h"] * sizes["t"] * sizes["d"] * BF16_BYTES
    return ProbeKernel(name, op, tuple(sizes.items()), flops, bytes_moved)
