"""Workload from a torch.profiler kernel trace (CSV: seq, name, start_us, duration_us[, blocks_per_sm]).

- `load_trace` (a CSV file) / `trace_workload` (rows already read): finds the period of the
  repeating kernel sequence, keeps one step, averages each position's duration over the steps,
  drops profiler annotations, and tags each kernel's pass; the meta keeps the trace's time a
  step (span_us_per_step, the profiled host's pace where the GPU waited on it);
- `repeating_period`: the length of a trace's repeating kernel sequence (one step's);
- `idle_gaps_s`: the GPU's idle time before each kernel of a step, from the trace's starts;
- `classify` / `KernelClass`: a kernel name's short name, kind (`KINDS`) and tensor-core use
  (the rules in `_RULES`);
- `kernel_from_duration` / `work_for_duration`: a Kernel with flops (GEMMs, tensor-core
  kernels: `computes_flops`) or bytes moved (the rest) that runs its recorded duration on the
  simulated H200 at stock, the launch gap before it on top, busy for its kind's in-step share
  of the chip (presets.KindModel.step_busy, `busy_share`), times the share of the SMs its grid
  fills where the trace has its blocks per SM (`grid_fill`) and the share a kernel of its
  duration keeps while it comes up to speed (`ramped`, presets.STEP_BUSY_RAMP_S);
  `under_window_cap` re-sets the works under the step's power windows.

The pass rule and why annotations are dropped: docs/design-runtime.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from statistics import fmean
from typing import TYPE_CHECKING

from kdvfs.runtime.presets import STEP_BUSY_RAMP_S, get_preset
from kdvfs.runtime.tables import CsvRow, number, positive, read_csv, require_columns
from kdvfs.runtime.types import KERNEL_KINDS, KdvfsError, Kernel, Workload

if TYPE_CHECKING:
    from kdvfs.runtime.simulator import CapControl

H200_GEMM_FLOPS_PER_S = 656e12
"""bf16 8192^3 GEMM at stock: 656 TFLOP/s (h200-probe/kernels_stock.csv, gemm_bf16_8192); where
work_for_duration starts its search."""
H200_SIMT_FLOPS_PER_S = 67e12
"""FP32 on the CUDA cores at 1980 MHz: 67 TFLOP/s (datasheet); likewise for a GEMM off the
tensor cores."""
H200_COPY_BYTES_PER_S = 4.2e12
"""256 MiB device copy at stock: 4.2 TB/s (h200-probe/kernels_stock.csv, copy_256MiB); likewise."""

TRACE_COLUMNS = ("seq", "name", "start_us", "duration_us")
"""The columns a trace CSV must have (times in microseconds)."""
KINDS = KERNEL_KINDS
"""The kinds classify() sorts kernels into (types.KERNEL_KINDS)."""

_ANNOTATION = re.compile(r"^[A-Za-z_][\w.]*#[\w.]+$")
_BACKWARD = re.compile(r"bprop|backward|_grad|grad_", re.IGNORECASE)
_FORWARD_KINDS = ("layernorm_fwd", "gelu_fwd", "sdpa_fwd")


@dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern[str]
    short: str
    kind: str
    tensor_core: bool = False


def _rule(pattern: str, short: str, kind: str, tensor_core: bool = False) -> _Rule:
    return _Rule(re.compile(pattern), short, kind, tensor_core)


# First match wins: attention before GEMM (cuDNN's flash kernels say "wgmma"), backward
# variants before their forward ones.
_RULES = (
    _rule(r"^Memset", "memset", "memory_op"),
    _rule(r"nccl", "nccl", "communication"),
    _rule(r"^Memcpy", "memcpy", "memory_op"),
    # PyTorch's memory-efficient attention in fp32 runs on the CUDA cores (its name says
    # "cutlass", which would make it a tensor-core GEMM below)
    _rule(r"fmha_cutlassB_f32", "sdpa_bwd_f32", "attention"),
    _rule(r"fmha_cutlassF_f32", "sdpa_fwd_f32", "attention"),
    _rule(r"sdpa.*bprop|flash_bwd|fmha.*bwd|fmha_cutlassB", "sdpa_bwd", "attention", tensor_core=True),
    _rule(r"sdpa.*fprop|flash_fwd|fmha.*fwd|fmha_cutlassF", "sdpa_fwd", "attention", tensor_core=True),
    _rule(r"compute_dot_do_o", "sdpa_bwd_dot_do_o", "attention"),
    _rule(r"convert_dq_to_16bits", "sdpa_bwd_convert_dq", "attention"),
    # a GEMM on CUDA cores (fp32 without TF32), or one whose operands are not aligned for
    # vector loads (align1): bound by its loads and CUDA cores, not the tensor cores
    _rule(r"simt|sgemm|_ffma_", "gemm_simt", "gemm"),
    _rule(r"(gemm|cutlass|xmma).*align1\b", "gemm_align1", "gemm"),
    _rule(r"nvjet|gemm|cutlass|xmma", "gemm", "gemm", tensor_core=True),
    _rule(r"batch_norm", "batchnorm", "norm"),
    _rule(r"[Ss]oft[Mm]ax", "softmax", "norm"),
    _rule(r"layer_norm_grad_input", "layernorm_bwd_input", "norm"),
    _rule(r"GammaBetaBackward", "layernorm_bwd_gamma_beta", "norm"),
    _rule(r"layer_norm", "layernorm_fwd", "norm"),
    _rule(r"fused_adam|FusedAdam", "adamw_fused", "optimizer"),
    _rule(r"multi_tensor_apply", "foreach", "optimizer"),
    _rule(r"GeluBackward", "gelu_bwd", "elementwise"),
    _rule(r"Gelu", "gelu_fwd", "elementwise"),
    _rule(r"copy_kernel|CatArray", "elementwise_copy", "elementwise"),
    _rule(r"dropout", "dropout", "elementwise"),
    _rule(r"max_pool|avg_pool", "pool", "elementwise"),
    _rule(r"nll_loss", "nll_loss", "reduce"),
    _rule(r"FillFunctor", "fill", "elementwise"),
    _rule(r"reduce_kernel.*MeanOps", "reduce_mean", "reduce"),
    _rule(r"reduce_kernel.*sum_functor", "reduce_sum", "reduce"),
    _rule(r"reduce_kernel", "reduce", "reduce"),
    _rule(r"CUDAFunctor_add|AddFunctor", "elementwise_add", "elementwise"),
    _rule(r"MulFunctor", "elementwise_mul", "elementwise"),
    _rule(r"pow_tensor", "elementwise_pow", "elementwise"),
    _rule(r"elementwise_kernel", "elementwise", "elementwise"),
)


@dataclass(frozen=True)
class KernelClass:
    """What a CUDA kernel name says: a short readable name, a kind (one of KINDS), and
    whether it runs on tensor cores (then it is compute-bound, else memory-bound)."""

    short: str
    kind: str
    tensor_core: bool


def classify(cuda_name: str) -> KernelClass:
    """Classify a CUDA kernel name; unknown kernels keep their function name, kind "other"."""
    for rule in _RULES:
        if rule.pattern.search(cuda_name):
            short = rule.short
            if rule.short == "foreach":
                functor = re.search(r"(\w+?)Functor<", cuda_name)
                short = f"foreach_{_snake(functor.group(1))}" if functor else short
            elif rule.short == "memcpy":
                direction = re.search(r"Memcpy (\w+)", cuda_name)
                short = f"memcpy_{direction.group(1).lower()}" if direction else short
            return KernelClass(short, rule.kind, rule.tensor_core)
    function = re.sub(r"^void\s+", "", cuda_name).split("<")[0].split("(")[0].split("::")[-1]
    return KernelClass(_snake(function)[:40] or "kernel", "other", False)


def _snake(name: str) -> str:
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name)
    return re.sub(r"[^0-9a-z]+", "_", spaced.lower()).strip("_")


@dataclass(frozen=True)
class _TraceRow:
    seq: float
    name: str
    start_us: float
    duration_us: float
    blocks_per_sm: float = math.nan  # the profiler's grid blocks over the card's SMs (NaN: not recorded)


def load_trace(path: str | Path) -> Workload:
    """One training step of a torch.profiler kernel trace as a Workload."""
    path = Path(path)
    header, rows = read_csv(path)
    require_columns(path, header, TRACE_COLUMNS)
    return trace_workload(path, path.stem, rows)


def trace_workload(
    path: Path,
    name: str,
    rows: Sequence[CsvRow],
    busy_shares: Mapping[str, float] | None = None,
    card: str = "h200",
    ramp_s: float | None = None,
) -> Workload:
    """One training step of a kernel trace's rows (cells TRACE_COLUMNS; `path` is the file
    they came from, named in errors and the meta) as the Workload `name`; `busy_shares`: each
    kind's in-step busy share (kind -> share in (0, 1]; None or a kind left out: busy_share).
    A row's optional cell `blocks_per_sm` (its grid's blocks over the card's SMs) scales its
    kernel's share by the SMs the grid fills (`grid_fill`). `card`: the preset of the card the
    trace was recorded on, whose simulated twin runs each kernel its recorded duration at stock
    (work_for_duration). `ramp_s`: the busy ramp of a short kernel (`ramped`), s; None: the H200
    preset's STEP_BUSY_RAMP_S."""
    if not rows:
        raise KdvfsError(f"{path}: no data rows")
    trace = sorted((_parse(path, r) for r in rows), key=lambda t: t.seq)
    kernels = [t for t in trace if not _ANNOTATION.match(t.name)]
    annotations = [t for t in trace if _ANNOTATION.match(t.name)]
    period = _period(path, [k.name for k in kernels])
    steps = len(kernels) // period
    first = kernels[:period]
    classes = [classify(k.name) for k in first]
    durations_s = [
        fmean(kernels[s * period + i].duration_us for s in range(steps)) * 1e-6 for i in range(period)
    ]
    passes = _passes(classes, [k.name for k in first], _optimizer_start(first, annotations))
    from kdvfs.runtime.simulator import UNCAPPED

    shares = busy_shares or {}
    ramp_s = STEP_BUSY_RAMP_S if ramp_s is None else ramp_s
    # first works as if uncapped: under_window_cap sets them under their windows' controls
    workload_kernels = under_window_cap(
        [
            kernel_from_duration(
                i,
                c,
                passes[i],
                durations_s[i],
                _filled(shares.get(c.kind), c.kind, first[i].blocks_per_sm, durations_s[i], ramp_s),
                UNCAPPED,
                card,
            )
            for i, c in enumerate(classes)
        ],
        card,
    )
    whole = kernels[: steps * period]
    span_us = max(k.start_us + k.duration_us for k in whole) - min(k.start_us for k in whole)
    meta = (
        ("source", str(path)),
        ("steps", str(steps)),
        ("kernels_per_step", str(period)),
        ("dropped_annotations", ";".join(sorted({a.name for a in annotations}))),
        ("span_us_per_step", f"{span_us / steps:.3f}"),  # first start to last end of the whole steps
    )
    return Workload(name, workload_kernels, meta=meta)


def idle_gaps_s(path: Path, rows: Sequence[CsvRow], launch_latency_s: float) -> list[float]:
    """The GPU's idle time before each kernel of one step of a trace's rows (cells TRACE_COLUMNS;
    `path` named in errors), in trace_workload's kernel order: its start less its predecessor's
    end and the launch gap back to back (`launch_latency_s`, s), never below 0, the mean over the
    trace's steps (a step's first kernel after the step before it; in the first step it has
    none), s."""
    trace = sorted((_parse(path, r) for r in rows), key=lambda t: t.seq)
    kernels = [t for t in trace if not _ANNOTATION.match(t.name)]
    period = _period(path, [k.name for k in kernels])
    steps = len(kernels) // period
    gaps_s: list[list[float]] = [[] for _ in range(period)]
    for j in range(1, steps * period):
        before, k = kernels[j - 1], kernels[j]
        idle_us = k.start_us - (before.start_us + before.duration_us)
        gaps_s[j % period].append(max(0.0, idle_us * 1e-6 - launch_latency_s))
    return [fmean(g) if g else 0.0 for g in gaps_s]


def _parse(path: Path, row: CsvRow) -> _TraceRow:
    name = row.cells.get("name", "")
    if not name:
        raise KdvfsError(f"{path}: row {row.row} (line {row.line}), column 'name': empty value")
    return _TraceRow(
        seq=number(path, row, "seq"),
        name=name,
        start_us=number(path, row, "start_us"),
        duration_us=positive(path, row, "duration_us"),
        blocks_per_sm=positive(path, row, "blocks_per_sm") if row.cells.get("blocks_per_sm") else math.nan,
    )


def grid_fill(blocks_per_sm: float) -> float:
    """The share of the card's SMs a kernel's grid keeps busy: its blocks per SM up to one
    (a grid of fewer blocks than SMs leaves the rest idle; NaN, not recorded: 1)."""
    return 1.0 if math.isnan(blocks_per_sm) else min(1.0, blocks_per_sm)


def ramped(duration_s: float, ramp_s: float) -> float:
    """The share of a kernel's in-step busy share it keeps over a run of `duration_s`, where it
    takes `ramp_s` to come up to it: duration / (duration + ramp), 1 where ramp_s is 0."""
    return 1.0 if ramp_s <= 0.0 else duration_s / (duration_s + ramp_s)


def _filled(
    share: float | None, kind: str, blocks_per_sm: float, duration_s: float, ramp_s: float
) -> float | None:
    """A kernel's busy share (None: its kind's) times its grid's fill and its ramp (`ramped`);
    None where it fills the card for its whole run."""
    scale = grid_fill(blocks_per_sm) * ramped(duration_s, ramp_s)
    if scale >= 1.0:
        return share
    return (busy_share(kind) if share is None else share) * scale


def repeating_period(names: Sequence[str]) -> int:
    """The length of the shortest sequence that repeats at least twice and covers the whole
    trace (a trailing partial step, where the profiler stopped mid-step, is allowed); 0: none."""
    for period in range(1, len(names) // 2 + 1):
        if all(names[i] == names[i - period] for i in range(period, len(names))):
            return period
    return 0


def _period(path: Path, names: list[str]) -> int:
    """repeating_period, or an error naming the trace that has none."""
    period = repeating_period(names)
    if not period:
        raise KdvfsError(
            f"{path}: no repeating kernel sequence found in {len(names)} kernels (column 'name')"
        )
    return period


def _optimizer_start(step: list[_TraceRow], annotations: list[_TraceRow]) -> int:
    """Index of the first kernel of the optimizer pass in `step` (len(step) if none)."""
    end_us = step[-1].start_us + step[-1].duration_us
    ranges = [
        (a.start_us, a.start_us + a.duration_us)
        for a in annotations
        if a.name.startswith("Optimizer.step") and step[0].start_us <= a.start_us <= end_us
    ]
    for i, k in enumerate(step):
        if classify(k.name).kind == "optimizer" or any(lo <= k.start_us < hi for lo, hi in ranges):
            return i
    return len(step)


def _passes(classes: list[KernelClass], names: list[str], optimizer_start: int) -> list[str]:
    backward_named = [i for i in range(optimizer_start) if _BACKWARD.search(names[i])]
    backward_start = optimizer_start
    if backward_named:
        first_bwd = backward_named[0]
        forward_named = [i for i in range(first_bwd) if classes[i].short in _FORWARD_KINDS]
        after = forward_named[-1] + 1 if forward_named else 0
        seeds = [i for i in range(after, first_bwd) if classes[i].short == "fill"]
        backward_start = seeds[-1] if seeds else first_bwd
    return [
        "forward" if i < backward_start else "backward" if i < optimizer_start else "optimizer"
        for i in range(len(names))
    ]


def kernel_from_duration(
    position: int,
    c: KernelClass,
    pass_name: str,
    duration_s: float,
    busy: float | None = None,
    control: CapControl | None = None,
    card: str = "h200",
) -> Kernel:
    """A trace kernel with the work that runs `duration_s` on the simulated `card` at stock
    (work_for_duration): flops for a GEMM or a tensor-core kernel, bytes moved for the rest;
    busy for `busy` of the chip (None: its kind's in-step share, busy_share); capped alone
    (control None) or under a window's cap control; `card`: the preset it was recorded on."""
    features = (
        ("duration_s", duration_s),
        *((f"is_{kind}", float(c.kind == kind)) for kind in KINDS),
        ("tensor_core", float(c.tensor_core)),
    )
    share = busy_share(c.kind) if busy is None else _share(busy)
    work = work_for_duration(c.kind, c.tensor_core, duration_s, control, share, card)
    flops = computes_flops(c.kind, c.tensor_core)
    return Kernel(
        name=f"{position:03d}.{c.short}",
        pass_name=pass_name,
        flops=work if flops else 0.0,
        bytes_moved=0.0 if flops else work,
        tensor_core=c.tensor_core,
        ref_time_s=duration_s,
        features=features,
        kind=c.kind,
        busy_share=share,
    )


def computes_flops(kind: str, tensor_core: bool) -> bool:
    """Whether a trace kernel's work is flops (a GEMM, on tensor or CUDA cores, or another
    tensor-core kernel) rather than bytes moved."""
    return tensor_core or kind == "gemm"


def busy_share(kind: str) -> float:
    """The share of the chip a recorded kernel of this kind keeps busy inside a training step,
    against the size ladder's kernels of its kind (the H200 preset's KindModel.step_busy)."""
    return get_preset("h200").kind_model(kind).step_busy


def _share(share: float) -> float:
    if not (math.isfinite(share) and 0.0 < share <= 1.0):
        raise KdvfsError(f"a kernel's busy share must be in (0, 1], got {share!r}")
    return float(share)


WORK_BISECTION_STEPS = 40  # steps of the bisection on log(work): relative precision ~1e-9
WINDOW_FIT_ROUNDS = 4  # rounds of window controls and works: the step's time settles to ~0.1%


def under_window_cap(kernels: list[Kernel], card: str = "h200") -> tuple[Kernel, ...]:
    """The step's kernels with their work re-set so that each takes its recorded time under
    the cap control of its power window (the card holds the mean power over a window, so a
    GEMM among small kernels ran faster than it would alone at the cap); the controls depend
    on the works, so a few rounds of both."""
    from dataclasses import replace

    from kdvfs.runtime.simulator import window_control, windows

    preset = get_preset(card)
    if preset.power_window_s <= 0.0:
        return tuple(kernels)
    temp_c = preset.ambient_c + preset.r_th_c_per_w * 0.85 * preset.power_cap_w
    durations_s = [k.ref_time_s for k in kernels]
    launches_s = [d + preset.launch_latency_s for d in durations_s]  # each with the gap before it
    for _ in range(WINDOW_FIT_ROUNDS):
        controls = {}
        for window in windows(launches_s, preset.power_window_s):
            entries = [(kernels[i], None, share) for i, share in window]
            control = window_control(preset, entries, temp_c, preset.power_cap_w) if len(window) > 1 else None
            controls.update({i: control for i, _ in window})
        for i, k in enumerate(kernels):
            work = work_for_duration(k.kind, k.tensor_core, durations_s[i], controls[i], k.busy_share, card)
            flops = computes_flops(k.kind, k.tensor_core)
            kernels[i] = replace(k, flops=work if flops else 0.0, bytes_moved=0.0 if flops else work)
    return tuple(kernels)


@lru_cache(maxsize=65536)
def work_for_duration(
    kind: str,
    tensor_core: bool,
    duration_s: float,
    control: CapControl | None = None,
    busy_share: float = 1.0,
    card: str = "h200",
) -> float:
    """The work (flops for a GEMM or a tensor-core kernel, else bytes: computes_flops) a kernel
    of this kind needs to run `duration_s` on the simulated `card` (a preset's name) at stock,
    at its training temperature, busy for `busy_share` of the chip: the recorded kernel, as the simulator costs
    it, capped alone (control None) or under a window's cap control. A recorded duration is the
    kernel's own run; the launch before it (the card's launch_latency_s, the gap between
    kernels back to back) comes on top, as in the step. A duration under the kind's floor gets
    no work (the simulated kernel then runs its floor, a little longer than recorded)."""
    from kdvfs.runtime.simulator import controlled_point, operating_point

    preset = get_preset(card)
    temp_c = preset.ambient_c + preset.r_th_c_per_w * 0.85 * preset.power_cap_w
    flops = computes_flops(kind, tensor_core)

    def time_s(work: float) -> float:
        kernel = Kernel("k", flops=work if flops else 0.0, bytes_moved=0.0 if flops else work,
                        tensor_core=tensor_core, kind=kind, busy_share=busy_share)  # fmt: skip
        if control is None:
            return operating_point(preset, kernel, None, temp_c, preset.power_cap_w).time_s
        return controlled_point(preset, kernel, None, temp_c, control).time_s

    rate = H200_GEMM_FLOPS_PER_S if tensor_core else H200_SIMT_FLOPS_PER_S if flops else H200_COPY_BYTES_PER_S
    naive = duration_s * busy_share * rate
    launch_s = duration_s + preset.launch_latency_s
    if time_s(0.0) >= launch_s:
        return 0.0
    lo, hi = math.log(naive) - 2.0, math.log(naive) + 4.0
    for _ in range(WORK_BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if time_s(math.exp(mid)) < launch_s else (lo, mid)
    return math.exp(0.5 * (lo + hi))
