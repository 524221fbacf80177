"""Ops a training step ran, recorded by torch.profiler and rebuilt to run alone (isolated replay).

- `RecordedOp`: an aten op of a step that launched kernels (on the CPU: an outermost op)
  (name, overload, input shapes, dtypes,
  strides and scalar values as the profiler recorded them, and the device time its kernels
  took inside the step, averaged over the steps recorded);
- `record_ops`: profile a few training steps with record_shapes and keep their ops; the
  profiler records no shapes inside a list of tensors (the optimizer's `_foreach_*` ops), so
  the last warm-up step runs under `ListShapes`, a dispatch mode that notes them;
- `rebuild`: a callable that runs one recorded op on random inputs of its recorded shapes and
  dtypes (integer inputs are zeros, valid as indices), or None where the op cannot be rebuilt;
- `time_rebuilt`: its time per call, run back to back (CUDA events on a GPU);
- `save_ops` / `load_ops`: a recording as a JSON file (`kdvfs sweep --workload ops:FILE`;
  experiments/record_step_ops.py writes one).
This is how a real card gets the founding paper's per-kernel measurements: each op of the
step, repeated at a clock pair; the check that they are the same kernels is
experiments/op_replay_check.py.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode  # public in use; no other hook sees list inputs

from kdvfs.runtime.torch_discovery import is_outermost_compute_op
from kdvfs.runtime.types import KdvfsError, check_file_size

TORCH_DTYPES = {
    "float": torch.float32,
    "double": torch.float64,
    "c10::Half": torch.float16,
    "c10::BFloat16": torch.bfloat16,
    "long int": torch.int64,
    "int": torch.int32,
    "short int": torch.int16,
    "signed char": torch.int8,
    "unsigned char": torch.uint8,
    "bool": torch.bool,
}
"""The profiler's dtype names (FunctionEvent.input_dtypes) and the torch dtypes they stand for."""
LIST_DTYPE = torch.float32  # elements of a TensorList whose dtype was not noted (ListShapes)
MIN_TIME_S = 0.02  # s: a rebuilt op runs back to back for at least this long when timed


@dataclass(frozen=True)
class RecordedOp:
    """One op of a training step as the profiler recorded it.

    Attributes:
        name: the aten op, e.g. "aten::addmm".
        overload: its overload ("" for the default one).
        shapes: each input's shape ([] for a scalar or None; a list of shapes for a TensorList).
        dtypes: each input's profiler dtype name ("Scalar", "TensorList", "" for None, ...).
        strides: each tensor input's strides, where recorded.
        values: each input's recorded value where it is a scalar, else None.
        position: the op's index among the step's recorded ops.
        device_time_s: time its kernels took inside the step, mean over the steps recorded
            (on the CPU, where there are no kernels: the op's own CPU time).
        pass_name: the pass it ran in, from the profiler's enclosing ranges: "backward" under
            an autograd engine function, "optimizer" under an Optimizer.step, else "forward".
        list_dtypes: each input's element dtype where it is a TensorList whose shapes were
            noted (ListShapes), else "".
    """

    name: str
    overload: str
    shapes: tuple[Any, ...]
    dtypes: tuple[str, ...]
    strides: tuple[Any, ...]
    values: tuple[Any, ...]
    position: int
    device_time_s: float
    pass_name: str = "forward"
    list_dtypes: tuple[str, ...] = ()


PROFILER_DTYPE_NAMES = {dtype: name for name, dtype in TORCH_DTYPES.items()}
"""A torch dtype's name as the profiler writes it (TORCH_DTYPES reversed)."""


class ListShapes(TorchDispatchMode):
    """Notes the element shapes and dtype of every list-of-tensors input of the foreach ops
    run under it (`calls`: the op's name, then per input (shapes, profiler dtype name) or
    None), in the order they ran."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, list[tuple[list[list[int]], str] | None]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name  # "aten::_foreach_mul_": the name the profiler records
        if name.startswith("aten::_foreach_"):
            schema = func._schema.arguments
            values = [*args, *(kwargs.get(a.name) for a in schema[len(args) :])]
            self.calls.append((name, [_list_shapes(v) for v in values]))
        return func(*args, **kwargs)


def _list_shapes(value: Any) -> tuple[list[list[int]], str] | None:
    if not (isinstance(value, list | tuple) and value and all(isinstance(t, torch.Tensor) for t in value)):
        return None
    return [list(t.shape) for t in value], PROFILER_DTYPE_NAMES.get(value[0].dtype, "")


def record_ops(
    step: Callable[[], object], *, steps: int = 2, warmup: int = 1, cuda: bool
) -> list[RecordedOp]:
    """The outermost compute ops of one training step, as recorded over `steps` steps (their
    in-step device times averaged), after `warmup` unprofiled steps (the last of them noting
    the shapes inside the foreach ops' lists of tensors: ListShapes)."""
    from torch.profiler import ProfilerActivity, profile

    lists = ListShapes()
    for _ in range(warmup - 1):
        step()
    if warmup > 0:
        with lists:
            step()
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities, record_shapes=True) as prof:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize()
    # On a GPU: the ops that launched kernels themselves, with the inputs their kernels saw
    # (under autocast, aten::linear's addmm gets bf16 inputs; the linear got fp32 ones). On
    # the CPU, which has no kernels to go by: the outermost compute ops.
    ops = [
        e
        for e in prof.events()
        if (e.name.startswith("aten::") and bool(e.kernels)) or (not cuda and is_outermost_compute_op(e))
    ]
    # torch < 2.13 keeps the dtypes and strides only on the profiler's own events (same id)
    kineto = {k.correlation_id(): k for k in prof.profiler.kineto_results.events()}
    if not ops or len(ops) % steps:
        per_step = ops
        steps = 1
    else:
        per_step = ops[: len(ops) // steps]
    out = []
    for i, e in enumerate(per_step):
        same = [ops[i + s * len(per_step)] for s in range(steps)]
        device_s = statistics.fmean(_device_time_s(x, cuda) for x in same)
        out.append(
            RecordedOp(
                name=e.name,
                overload=e.overload_name or "",
                shapes=tuple(e.input_shapes or ()),
                dtypes=tuple(_recorded(e, kineto, "input_dtypes", "dtypes")),
                strides=tuple(_recorded(e, kineto, "structured_input_strides", "structured_input_strides")),
                values=tuple(e.concrete_inputs or ()),
                position=i,
                device_time_s=device_s,
                pass_name=_pass_of(e),
            )
        )
    return _with_list_shapes(out, lists.calls)


def _with_list_shapes(
    ops: list[RecordedOp], calls: list[tuple[str, list[tuple[list[list[int]], str] | None]]]
) -> list[RecordedOp]:
    """The ops with the shapes noted in their lists of tensors: the k-th op of a name gets the
    k-th noted call of that name (both in the order they ran; a step runs its foreach ops in
    the same order every time). An op without a noted call keeps its empty shapes."""
    pending: dict[str, list] = {}
    for name, inputs in calls:
        pending.setdefault(name, []).append(inputs)
    out = []
    for op in ops:
        noted = pending.get(op.name)
        if not noted or "TensorList" not in op.dtypes:
            out.append(op)
            continue
        inputs = noted.pop(0)
        shapes, list_dtypes = list(op.shapes), [""] * len(op.dtypes)
        shapes += [[]] * (len(op.dtypes) - len(shapes))
        for i, dtype in enumerate(op.dtypes):
            if dtype == "TensorList" and i < len(inputs) and inputs[i] is not None:
                shapes[i], list_dtypes[i] = inputs[i]
        out.append(dataclasses.replace(op, shapes=tuple(shapes), list_dtypes=tuple(list_dtypes)))
    return out


def _pass_of(event) -> str:
    """The pass an op ran in, from the ranges enclosing it (the profiler's parents)."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("autograd::engine::evaluate_function"):
            return "backward"
        if parent.name.startswith("Optimizer."):
            return "optimizer"
        parent = parent.cpu_parent
    return "forward"


OPS_FORMAT = "kdvfs-recorded-ops/1"
"""The `format` of a recording file (save_ops)."""
MAX_OPS_BYTES = 256 << 20
"""Largest recording load_ops reads (a training step's ops are a few MiB); bytes."""


def save_ops(ops: Sequence[RecordedOp], path: Path, *, device: str, about: str = "") -> None:
    """Write a recording as JSON: the torch device type it ran on ("cuda", "cpu") and its ops."""
    doc = {
        "format": OPS_FORMAT,
        "device": device,
        "about": about,
        "ops": [dataclasses.asdict(op) for op in ops],
    }
    path.write_text(json.dumps(doc, indent=1) + "\n")


def load_ops(path: Path) -> tuple[list[RecordedOp], str]:
    """A recording written by save_ops: its ops and the torch device type they ran on
    (KdvfsError naming the problem for a file that is not one)."""
    check_file_size(path, MAX_OPS_BYTES, "recording of ops")
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise KdvfsError(f"recorded ops {path}: cannot read ({exc.strerror or exc})") from None
    except ValueError:
        raise KdvfsError(f"recorded ops {path}: not JSON") from None
    if not isinstance(doc, dict) or doc.get("format") != OPS_FORMAT or not isinstance(doc.get("ops"), list):
        raise KdvfsError(
            f"recorded ops {path}: not a {OPS_FORMAT} file (write one with kdvfs.experiments.record_step_ops)"
        )
    fields = {f.name for f in dataclasses.fields(RecordedOp)}
    try:
        ops = [RecordedOp(**{k: _tuple(v) for k, v in op.items() if k in fields}) for op in doc["ops"]]
    except TypeError as exc:
        raise KdvfsError(f"recorded ops {path}: an op lacks a field ({exc})") from None
    if not ops:
        raise KdvfsError(f"recorded ops {path}: no ops")
    return ops, str(doc.get("device", "cuda"))


def _tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _recorded(event, kineto: dict, attribute: str, method: str) -> list:
    """A recorded input property from the FunctionEvent, else from its profiler event."""
    value = getattr(event, attribute, None)
    if value is None and event.id in kineto:
        found = getattr(kineto[event.id], method, None)
        value = found() if callable(found) else found
    return list(value or ())


def _device_time_s(event, cuda: bool) -> float:
    if not cuda:
        return event.cpu_time_total * 1e-6
    return sum(k.duration for k in event.kernels) * 1e-6


def rebuild(op: RecordedOp, device: str) -> Callable[[], object] | None:
    """A callable that runs the op once on random inputs of its recorded shapes and dtypes,
    or None where it cannot be rebuilt (an unknown op or dtype, or no overload accepts them).
    The profiler records inputs in schema order, keyword-only ones included: each overload's
    schema (the recorded one first) says which go by keyword."""
    packet = getattr(torch.ops.aten, op.name.removeprefix("aten::"), None)
    if packet is None:
        return None
    try:
        args = [_argument(op, i, device) for i in range(len(op.dtypes))]
    except (KeyError, RuntimeError, TypeError, ValueError):
        return None
    names = [op.overload] if op.overload in packet.overloads() else []
    for name in names + [n for n in packet.overloads() if n not in names]:
        overload = getattr(packet, name)
        schema = overload._schema.arguments  # the op's signature: public in torch as FunctionSchema
        if len(args) > len(schema):
            continue
        positional = [v for a, v in zip(schema, args) if not a.kwarg_only]
        keywords = {a.name: v for a, v in zip(schema, args) if a.kwarg_only and v is not None}
        while positional and positional[-1] is None:  # trailing optional inputs: their defaults
            positional.pop()

        def call(overload=overload, positional=positional, keywords=keywords) -> object:
            return overload(*positional, **keywords)

        try:
            call()  # fails here, not in the caller's timing loop
        except (RuntimeError, TypeError, ValueError, IndexError):
            continue
        return call
    return None


def _argument(op: RecordedOp, i: int, device: str) -> Any:
    dtype, shape = op.dtypes[i], op.shapes[i] if i < len(op.shapes) else []
    value = op.values[i] if i < len(op.values) else None
    if dtype == "TensorList":
        element = op.list_dtypes[i] if i < len(op.list_dtypes) else ""
        return [_tensor(list(s), None, TORCH_DTYPES.get(element, LIST_DTYPE), device) for s in shape]
    if dtype in TORCH_DTYPES and isinstance(shape, list | tuple) and (shape or value is None):
        strides = op.strides[i] if i < len(op.strides) else None
        return _tensor(list(shape), strides, TORCH_DTYPES[dtype], device)
    if value is not None:
        return value
    if dtype in ("", "None"):
        return None
    raise KeyError(f"{op.name}: input {i} of dtype {dtype!r} cannot be rebuilt")


def _tensor(shape: list[int], strides: Sequence[int] | None, dtype: torch.dtype, device: str) -> torch.Tensor:
    """Random values (zeros for integers) in the recorded layout: strides of 0 (an expanded
    tensor) view one element many times, as in the step."""
    if not (strides and len(strides) == len(shape)):
        strides = torch.empty(shape, device="meta").stride()
    extent = 1 + sum((n - 1) * st for n, st in zip(shape, strides) if n > 0)
    base = torch.empty(max(extent, 1) if all(n > 0 for n in shape) else 0, dtype=dtype, device=device)
    base = base.normal_() if dtype.is_floating_point else base.zero_()
    return base.as_strided(shape, list(strides))


def time_rebuilt(fn: Callable[[], object], device: str, min_time_s: float = MIN_TIME_S) -> float:
    """Seconds per call of a rebuilt op run back to back (CUDA events on a GPU)."""
    cuda = device.startswith("cuda")
    for _ in range(3):
        fn()
    n = 1
    while True:
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            elapsed_s = start.elapsed_time(end) * 1e-3
        else:
            t0_s = time.perf_counter()
            for _ in range(n):
                fn()
            elapsed_s = time.perf_counter() - t0_s
        if elapsed_s >= min_time_s:
            return elapsed_s / n
        n *= 2
