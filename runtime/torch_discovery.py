"""Workload of a live PyTorch training step, discovered with torch.profiler.

- `discover_workload(step_fn)`: runs the step a few times under the profiler and returns one
  step's kernels as a Workload, in the order the GPU ran them, named `NNN.short` as trace.py
  names a recorded trace, each with its pass, op, module and step site (as features and in
  meta); without CUDA the step's outermost non-view aten ops stand in, so CI runs it;
- `StepSites`: the named points of a step where hooks fire (step, forward, backward,
  optimizer, listed submodules); `workload_sites` reads a workload's sites back;
- `_Trace`: the profiler's CPU-side op tree, walked for each kernel's pass, op and module.

How each kernel's pass, op, module and site are found: docs/design-runtime.md.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from statistics import fmean
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile, schedule

from kdvfs.runtime.trace import KernelClass, classify, kernel_from_duration
from kdvfs.runtime.types import PASSES, KdvfsError, Workload

SITE_PREFIX = "kdvfs.site:"
"""Prefix of the profiler annotation a step site records."""
MODULE_PREFIX = "kdvfs.module:"
"""Prefix of the profiler annotation around a module's forward."""
STEP_SITE = "step"
"""Name of the site at the start of every step."""
_EVALUATE = "autograd::engine::evaluate_function: "


class StepSites:
    """The named points of a training step where hooks fire, in the order they fire.

    "step" fires where the caller says (the start of a step); "forward" when the model's
    forward starts; "backward" when the first gradient of its output arrives; "optimizer" when
    the optimizer's step starts; "module:NAME" when the forward of a listed submodule starts.
    Sites exist only for what was given (no model: no forward/backward site).

    Args:
        model: its forward and backward become sites; None: no such sites.
        optimizer: its step becomes a site; None: no optimizer site.
        modules: names (as model.named_modules() gives them) of submodules whose forward is a
            site.
    """

    def __init__(
        self,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        modules: Sequence[str] = (),
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.modules = tuple(modules)
        if self.modules and model is None:
            raise KdvfsError(f"step sites at modules {', '.join(self.modules)} need the model")
        named = dict(model.named_modules()) if model is not None else {}
        missing = [name for name in self.modules if name not in named or not name]
        if missing:
            raise KdvfsError(f"model has no submodule {missing[0]!r} for a step site")
        self._named = named
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    @classmethod
    def for_sites(
        cls, names: Sequence[str], model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None
    ) -> StepSites:
        """The hooks that fire the given site names (a discovered workload's meta `sites`)."""
        if model is None and {"forward", "backward"} & set(names):
            raise KdvfsError("the workload's forward/backward sites need the model")
        if optimizer is None and "optimizer" in names:
            raise KdvfsError("the workload's optimizer site needs the optimizer")
        modules = dict.fromkeys(n.removeprefix("module:") for n in names if n.startswith("module:"))
        return cls(model, optimizer, tuple(modules))

    def attach(self, fire: Callable[[str], None]) -> None:
        """Register the hooks; each calls fire(site name)."""
        self.detach()
        if self.model is not None:
            self._handles += [
                self.model.register_forward_pre_hook(lambda module, args: fire("forward")),
                self.model.register_forward_hook(
                    lambda module, args, out: _on_first_grad(out, lambda: fire("backward"))
                ),
            ]
            for name in self.modules:
                site = f"module:{name}"
                self._handles.append(
                    self._named[name].register_forward_pre_hook(lambda module, args, s=site: fire(s))
                )
        if self.optimizer is not None:
            self._handles.append(
                self.optimizer.register_step_pre_hook(lambda opt, args, kwargs: fire("optimizer"))
            )

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def _on_first_grad(output: object, call: Callable[[], None]) -> None:
    """Call once, when the first gradient of the output's tensors arrives (tensor hooks:
    unlike a module backward hook, they add no autograd node)."""
    pending = [True]

    def on_grad(grad: torch.Tensor) -> None:
        if pending[0]:
            pending[0] = False
            call()

    for tensor in _tensors(output):
        if tensor.requires_grad:
            tensor.register_hook(on_grad)


def _tensors(obj: object) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value)


def discover_workload(
    step_fn: Callable[[], object],
    *,
    steps: int = 3,
    warmup: int = 1,
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    site_modules: Sequence[str] = (),
    name: str = "torch_step",
) -> Workload:
    """One training step of `step_fn` as a Workload (module docstring).

    step_fn runs one whole training step (forward, backward, optimizer). It runs `warmup`
    times unprofiled (first-step work: cuBLAS handles, optimizer state), once more as the
    profiler's own warm-up, then `steps` times profiled; every step must launch the same
    kernel sequence. model / optimizer / site_modules: what StepSites hooks (and model's
    submodules name the kernels' modules).
    """
    if steps < 1 or warmup < 0:
        raise KdvfsError(
            f"discover_workload needs steps >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}"
        )
    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(warmup):
        step_fn()
    sync()
    sites = StepSites(model, optimizer, site_modules)
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    module_classes = {n: type(m).__name__ for n, m in model.named_modules() if n} if model is not None else {}
    with profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=steps, repeat=1)) as prof:
        sites.attach(_annotate_site)
        try:
            with _module_annotations(model):
                for _ in range(steps + 1):
                    _annotate_site(STEP_SITE)
                    step_fn()
                    sync()
                    prof.step()
        finally:
            sites.detach()
    trace = _Trace(list(prof.events()), cuda)
    per_step = trace.steps()
    if len(per_step) != steps:
        raise KdvfsError(f"profiler recorded {len(per_step)} steps, expected {steps}")
    return _workload(name, per_step, module_classes, "cuda" if cuda else "cpu")


def _annotate_site(site: str) -> None:
    with record_function(SITE_PREFIX + site):
        pass


@contextmanager
def _module_annotations(model: torch.nn.Module | None) -> Iterator[None]:
    """Profiler ranges `kdvfs.module:NAME` around every submodule's forward."""
    handles = []
    if model is not None:
        for module_name, module in model.named_modules():
            if not module_name:
                continue
            open_ranges: list[record_function] = []

            def enter(
                module: torch.nn.Module, args: object, n: str = module_name, stack: list = open_ranges
            ) -> None:
                stack.append(record_function(MODULE_PREFIX + n))
                stack[-1].__enter__()

            def leave(module: torch.nn.Module, args: object, out: object, stack: list = open_ranges) -> None:
                stack.pop().__exit__(None, None, None)

            handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@dataclass(frozen=True)
class _Found:
    """One kernel (or CPU op) of one step, with what the op tree says about it."""

    cuda_name: str  # kernel name; on the CPU, the aten op
    duration_us: float
    pass_name: str
    op: str
    module: str
    site: int


@dataclass(frozen=True)
class _Step:
    kernels: tuple[_Found, ...]
    sites: tuple[str, ...]


class _Trace:
    """The profiler's events split into steps, kernels attributed through the CPU op tree."""

    def __init__(self, events: list, cuda: bool) -> None:
        cpu = [e for e in events if e.device_type == DeviceType.CPU]
        self.steps_ranges = sorted(
            (e.time_range.start, e.time_range.end) for e in cpu if e.name.startswith("ProfilerStep")
        )
        self.site_events = sorted(
            (e.time_range.start, e.name.removeprefix(SITE_PREFIX))
            for e in cpu
            if e.name.startswith(SITE_PREFIX)
        )
        self.forward_module: dict[int, str] = {}
        for e in cpu:
            if e.sequence_nr >= 0 and not _is_backward(e):
                self.forward_module.setdefault(e.sequence_nr, _module(e))
        if cuda:
            self.kernels = _owned_kernels(cpu, [e for e in events if e.device_type == DeviceType.CUDA])
        else:
            self.kernels = [(e, e) for e in cpu if is_outermost_compute_op(e)]

    def steps(self) -> list[_Step]:
        out = []
        for lo, hi in self.steps_ranges:
            inside = sorted(
                ((k, op) for k, op in self.kernels if lo <= op.time_range.start <= hi),
                key=lambda ko: ko[0].time_range.start,
            )
            site_times = [(t, s) for t, s in self.site_events if lo <= t <= hi]
            found = tuple(
                _Found(
                    cuda_name=k.name,
                    duration_us=k.time_range.end - k.time_range.start,
                    pass_name=_pass(op),
                    op=_op(op),
                    module=self._module_of(op),
                    site=max(0, sum(1 for t, _ in site_times if t <= op.time_range.start) - 1),
                )
                for k, op in inside
            )
            out.append(_Step(found, tuple(s for _, s in site_times)))
        return out

    def _module_of(self, op) -> str:
        evaluate = next((e for e in _chain(op) if e.name.startswith(_EVALUATE)), None)
        if evaluate is None:
            return _module(op)
        # the autograd node's sequence number is its forward op's; the evaluate_function
        # range loses it when a hook's range nests inside it, the node's own range keeps it
        node = evaluate.name.removeprefix(_EVALUATE)
        numbers = [evaluate.sequence_nr, *(c.sequence_nr for c in evaluate.cpu_children if c.name == node)]
        return next((self.forward_module.get(n, "") for n in numbers if n >= 0), "")


def _owned_kernels(cpu: list, device: list) -> list[tuple[Any, Any]]:
    """(kernel, op that launched it) pairs. The profiler lists each op's kernels (name,
    duration) in op.kernels, linked inside torch (event ids do not match the raw trace's
    across torch versions); the kernel events themselves carry the GPU start times. On one
    stream kernels run in launch order, so each op, taken in launch order, gets the earliest
    unclaimed kernel event of that name and duration (copies of CPU annotations on the GPU
    timeline are no kernels)."""
    cpu_names = {e.name for e in cpu}
    free: dict[tuple[str, float], deque] = {}
    for k in sorted(device, key=lambda e: e.time_range.start):
        if k.name not in cpu_names:
            free.setdefault((k.name, k.time_range.end - k.time_range.start), deque()).append(k)
    owned = []
    for op in sorted((e for e in cpu if e.kernels), key=lambda e: e.time_range.start):
        for launched in op.kernels:
            queue = free.get((launched.name, launched.duration))
            if queue:
                owned.append((queue.popleft(), op))
    return owned


def _chain(event) -> Iterator:
    while event is not None:
        yield event
        event = event.cpu_parent


def _is_backward(event) -> bool:
    return any(e.name.startswith(_EVALUATE) for e in _chain(event))


def _module(event) -> str:
    return next(
        (e.name.removeprefix(MODULE_PREFIX) for e in _chain(event) if e.name.startswith(MODULE_PREFIX)), ""
    )


def _pass(op) -> str:
    for e in _chain(op):
        if e.name.startswith("Optimizer.step") or e.name.startswith("Optimizer.zero_grad"):
            return "optimizer"
        if e.name.startswith(_EVALUATE):
            return "backward"
        if e.name.lower() in PASSES:
            return e.name.lower()
    return "forward"


def _op(op) -> str:
    aten = [e.name for e in _chain(op) if e.name.startswith("aten::")]
    evaluate = next((e.name for e in _chain(op) if e.name.startswith(_EVALUATE)), None)
    if evaluate is not None:
        return evaluate.removeprefix(_EVALUATE)
    return aten[-1] if aten else op.name


def is_view(aten_name: str) -> bool:
    packet = getattr(torch.ops.aten, aten_name.removeprefix("aten::"), None)
    if packet is None:
        return False
    return all(getattr(packet, overload).is_view for overload in packet.overloads())


def is_outermost_compute_op(event) -> bool:
    """An aten op that is not a view and runs inside no other such op."""
    if not event.name.startswith("aten::") or is_view(event.name):
        return False
    parent = event.cpu_parent
    return not any(e.name.startswith("aten::") and not is_view(e.name) for e in _chain(parent))


def _short(found: _Found, cuda: bool) -> KernelClass:
    """trace.classify() for a CUDA kernel; a CPU op keeps its own name (`aten::addmm` ->
    `addmm`: classify would call `native_layer_norm_backward` a forward layernorm)."""
    c = classify(found.cuda_name)
    if cuda:
        return c
    short = re.sub(r"[^0-9a-z]+", "_", found.cuda_name.removeprefix("aten::").lower()).strip("_")
    return KernelClass(short or "op", c.kind, False)


def _workload(name: str, steps: list[_Step], module_classes: dict[str, str], where: str) -> Workload:
    first = steps[0]
    if not first.kernels:
        raise KdvfsError(f"{name}: the profiled step launched no kernels")
    reference = [k.cuda_name for k in first.kernels]
    for i, step in enumerate(steps[1:], start=2):
        names = [k.cuda_name for k in step.kernels]
        if names != reference:
            at = next(
                (j for j, (a, b) in enumerate(zip(names, reference)) if a != b),
                min(len(names), len(reference)),
            )
            raise KdvfsError(
                f"{name}: profiled step {i} differs from step 1 at kernel {at} "
                f"({len(names)} vs {len(reference)} kernels); the step must repeat the same kernels"
            )
        if step.sites != first.sites:
            raise KdvfsError(
                f"{name}: profiled step {i} fired sites {list(step.sites)}, step 1 {list(first.sites)}"
            )
    if not first.sites or first.sites[0] != STEP_SITE:
        raise KdvfsError(f"{name}: the step site did not fire first (sites {list(first.sites)})")
    kernels = []
    for pos, found in enumerate(first.kernels):
        duration_s = fmean(step.kernels[pos].duration_us for step in steps) * 1e-6
        c = _short(found, where == "cuda")
        kernel = kernel_from_duration(pos, c, found.pass_name, duration_s)
        module_class = module_classes.get(found.module, "")
        extra = ((f"op.{found.op}", 1.0), *(((f"module.{module_class}", 1.0),) if module_class else ()))
        kernels.append(replace(kernel, features=kernel.features + extra))
    meta = (
        ("source", f"torch.profiler ({where})"),
        ("torch", torch.__version__),
        ("steps", str(len(steps))),
        ("kernels_per_step", str(len(kernels))),
        ("sites", "|".join(first.sites)),
        ("kernel_sites", ",".join(str(k.site) for k in first.kernels)),
        ("kernel_ops", "|".join(k.op for k in first.kernels)),
        ("kernel_modules", "|".join(k.module for k in first.kernels)),
    )
    return Workload(name, tuple(kernels), meta=meta)


def workload_sites(workload: Workload) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """(site names of one step, site index of each kernel) of a discovered workload."""
    meta = dict(workload.meta)
    if "sites" not in meta or "kernel_sites" not in meta:
        raise KdvfsError(
            f"workload {workload.name!r} has no step sites (meta 'sites'): discover it with discover_workload"
        )
    sites = tuple(meta["sites"].split("|"))
    kernel_sites = tuple(int(s) for s in meta["kernel_sites"].split(","))
    if len(kernel_sites) != len(workload) or any(not 0 <= s < len(sites) for s in kernel_sites):
        raise KdvfsError(
            f"workload {workload.name!r}: meta 'kernel_sites' does not fit its {len(workload)} kernels and {len(sites)} sites"
        )
    return sites, kernel_sites
