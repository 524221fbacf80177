"""Reference kernels of the stock-clock probe, defined by their names.

A name carries its shape (`gemm_bf16_8192`, `layernorm_8k_x_2048`, `gelu_256MiB`,
`copy_256MiB`, `sdpa_causal_b8_h16_t1024`); `parse_probe_kernel` turns it into the work
it does (flops, bytes moved, as counted in h200-probe/kernels_stock.csv) and `build()` into
a callable that runs it once on a CUDA device. torch is imported only by build().
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from kdvfs.runtime.types import KdvfsError

DEFAULT_PROBE_KERNELS = (
    "gemm_bf16_8192",
    "gemm_bf16_2048",
    "layernorm_8k_x_2048",
    "gelu_256MiB",
    "copy_256MiB",
    "sdpa_causal_b8_h16_t1024",
)
SDPA_HEAD_DIM = 128  # GPT-3-XL: d_model 2048 / 16 heads
BF16_BYTES = 2
MIB = 1 << 20

_PATTERNS = {
    "gemm": re.compile(r"gemm_bf16_(?P<n>\d+)"),
    "layernorm": re.compile(r"layernorm_(?P<rows>\d+k?)_x_(?P<cols>\d+)"),
    "gelu": re.compile(r"gelu_(?P<mib>\d+)MiB"),
    "copy": re.compile(r"copy_(?P<mib>\d+)MiB"),
    "sdpa": re.compile(r"sdpa_causal_b(?P<b>\d+)_h(?P<h>\d+)_t(?P<t>\d+)(?:_d(?P<d>\d+))?"),
}


@dataclass(frozen=True)
class ProbeKernel:
    """One reference kernel: its op, shape (named sizes), and the work of one call."""

    name: str
    op: str
    shape: tuple[tuple[str, int], ...]
    flops: float
    bytes_moved: float

    def size(self, key: str) -> int:
        return dict(self.shape)[key]

    def build(self, device: str = "cuda") -> Callable[[], None]:
        """Allocate inputs on `device` and return a callable that runs one call (async)."""
        import torch
        import torch.nn.functional as F

        dt = torch.bfloat16
        if self.op == "gemm":
            n = self.size("n")
            a, b = torch.randn(n, n, device=device, dtype=dt), torch.randn(n, n, device=device, dtype=dt)
            out = torch.empty(n, n, device=device, dtype=dt)
            return lambda: torch.matmul(a, b, out=out)
        if self.op == "layernorm":
            cols = self.size("cols")
            x = torch.randn(self.size("rows"), cols, device=device, dtype=dt)
            w, bias = torch.ones(cols, device=device, dtype=dt), torch.zeros(cols, device=device, dtype=dt)
            return lambda: F.layer_norm(x, (cols,), w, bias)
        if self.op in ("gelu", "copy"):
            numel = self.size("mib") * MIB // BF16_BYTES
            x, out = torch.randn(numel, device=device, dtype=dt), torch.empty(numel, device=device, dtype=dt)
            if self.op == "copy":
                return lambda: out.copy_(x)
            return lambda: torch.ops.aten.gelu.out(x, out=out)
        b, h, t, d = (self.size(k) for k in ("b", "h", "t", "d"))
        q, k, v = (torch.randn(b, h, t, d, device=device, dtype=dt) for _ in range(3))
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)


def parse_probe_kernel(name: str) -> ProbeKernel:
    """The kernel a probe name stands for; KdvfsError for a name of no known form."""
    for op, pattern in _PATTERNS.items():
        m = pattern.fullmatch(name)
        if m:
            sizes = {k: _size(v) for k, v in m.groupdict().items() if v is not None}
            return _make(name, op, sizes)
    forms = "gemm_bf16_N, layernorm_R_x_C, gelu_NMiB, copy_NMiB, sdpa_causal_bB_hH_tT[_dD]"
    raise KdvfsError(f"probe kernel {name!r} has no known form ({forms})")


def _size(text: str) -> int:
    return int(text[:-1]) * 1024 if text.endswith("k") else int(text)


def _make(name: str, op: str, sizes: dict[str, int]) -> ProbeKernel:
    """Flops and bytes per call, counted as the recorded probe counts them: matrix work
    only for GEMM and attention, bytes read + written once for the memory-bound ops."""
    flops = 0.0
    bytes_moved = 0.0
    if op == "gemm":
        flops = 2.0 * sizes["n"] ** 3
    elif op == "layernorm":
        bytes_moved = 2.0 * sizes["rows"] * sizes["cols"] * BF16_BYTES
    elif op in ("gelu", "copy"):
        bytes_moved = 2.0 * sizes["mib"] * MIB
    else:
        sizes.setdefault("d", SDPA_HEAD_DIM)
        # QK^T and PV: 2 x (2 b h t^2 d), half of it under the causal mask
        flops = 2.0 * sizes["b"] * sizes["h"] * sizes["t"] ** 2 * sizes["d"]
    return ProbeKernel(name, op, tuple(sizes.items()), flops, bytes_moved)
