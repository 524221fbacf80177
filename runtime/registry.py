"""Devices and workloads by name, as the CLI spells them.

Devices:   sim:PRESET (rtx3080ti, a100, h100, h200; NAME-fastswitch for a fast clock switch),
           replay:CSV (a recorded measurement table), nvml:INDEX (a real GPU, dry-run).
Workloads: gpt3-xl-layer[:batch=N,seq=N], gpt3-xl[:batch=N,seq=N] (the whole step),
           gpt3-xl-dpN[:batch=N,seq=N,link_gbs=N] (with an N-rank all-reduce),
           trace:CSV (a torch.profiler kernel trace), step:DIR:SHAPE (a recorded whole
           step of a folder of recorded steps),
           table (the kernels of a replay device's table),
           ops:FILE (the recorded ops of a training step, run on nvml:INDEX: open_op_replay).
"""

from __future__ import annotations

from pathlib import Path

from kdvfs.runtime.device import Device
from kdvfs.runtime.types import KdvfsError, Workload, finite_number

MAX_NOISE_SCALE = 20.0
"""Largest measurement-noise scale a device opens with (x the device's own noise): beyond it
no measurement means anything (the CLI's --noise has the same limit)."""


def open_device(spec: str, *, seed: int = 0, noise: float | None = None, full_grid: bool = False) -> Device:
    """A device by name.

    Args:
        spec: sim:PRESET, replay:CSV or nvml:INDEX.
        seed: seeds the device's measurement noise.
        noise: measurement-noise scale, a finite number from 0 (noiseless) to MAX_NOISE_SCALE
            (None: the device's default: the preset's noise on a simulated card, none on a
            recorded table, whose cells are already single noisy samples).
        full_grid: a simulated card offers every supported clock pair, not the preset's grid.

    Raises:
        KdvfsError: an unknown device, a bad argument, or a noise scale out of range.
    """
    if noise is not None:
        noise = finite_number("noise", noise, 0.0, MAX_NOISE_SCALE)
    kind, _, arg = spec.partition(":")
    if kind == "sim":
        from kdvfs.runtime.simulator import SimulatedDevice

        return SimulatedDevice(
            arg or "rtx3080ti", seed=seed, noise=1.0 if noise is None else noise, full_grid=full_grid
        )
    if kind == "replay":
        from kdvfs.runtime.replay import ReplayDevice

        if not arg:
            raise KdvfsError("replay device needs a table: replay:PATH.csv")
        return ReplayDevice.from_csv(Path(arg), noise=0.0 if noise is None else noise, seed=seed)
    if kind == "nvml":
        from kdvfs.runtime.nvml_device import NvmlDevice

        return NvmlDevice(nvml_index(spec), dry_run=True)
    raise KdvfsError(f"unknown device {spec!r}: use sim:PRESET, replay:CSV or nvml:INDEX")


def nvml_index(spec: str) -> int:
    """The GPU index of a real card's spec, nvml:INDEX (nvml alone: 0), or a one-line
    KdvfsError that says the index must be a whole number."""
    kind, _, arg = spec.partition(":")
    if kind != "nvml":
        raise KdvfsError(f"device {spec!r} is not a real GPU: use nvml:INDEX")
    if not (arg or "0").isascii() or not (arg or "0").isdigit():
        raise KdvfsError(f"device {spec!r}: the GPU index must be a whole number, as nvml:0")
    return int(arg or 0)


def open_workload(spec: str, device: Device | None = None) -> Workload:
    kind, _, arg = spec.partition(":")
    if kind == "gpt3-xl-layer":
        from kdvfs.runtime.workloads import gpt3_xl_layer

        return gpt3_xl_layer(**_int_options(spec, arg, ("batch", "seq")))
    if kind == "gpt3-xl" or kind.startswith("gpt3-xl-dp"):
        return _gpt3_xl(spec, kind, arg, device)
    if kind == "trace":
        from kdvfs.runtime.trace import load_trace

        if not arg:
            raise KdvfsError("trace workload needs a file: trace:PATH.csv")
        return load_trace(Path(arg))
    if kind == "step":
        from kdvfs.runtime.recorded_steps import recorded_step_workload

        folder, sep, shape = arg.rpartition(":")
        if not (folder and sep and shape):
            raise KdvfsError(f"workload {spec!r}: a recorded step needs its folder and name: step:DIR:SHAPE")
        return recorded_step_workload(Path(folder), shape)
    if kind == "ops":
        raise KdvfsError(
            f"workload {spec!r}: recorded ops run on a real GPU: use it with --device nvml:INDEX"
        )
    if kind == "table":
        table = getattr(device, "table", None)
        if table is None:
            raise KdvfsError("workload 'table' needs a replay:CSV device")
        return table.workload()
    raise KdvfsError(
        f"unknown workload {spec!r}: use gpt3-xl-layer, gpt3-xl, gpt3-xl-dpN, trace:CSV, step:DIR:SHAPE, table or ops:FILE"
    )


def _gpt3_xl(spec: str, kind: str, arg: str, device: Device | None) -> Workload:
    """gpt3-xl[:batch=N,seq=N] and gpt3-xl-dpN[:batch=N,seq=N,link_gbs=N]: the batch defaults
    to what fits the simulated card's memory, the link to its preset's all-reduce bandwidth."""
    from kdvfs.runtime.workloads import GPT3_XL, fitting_batch, gpt3_xl

    ranks_text = kind.removeprefix("gpt3-xl-dp") if kind != "gpt3-xl" else "1"
    if not ranks_text.isdigit() or (int(ranks_text) < 2 and kind != "gpt3-xl"):
        raise KdvfsError(f"workload {spec!r}: the rank count must be a whole number >= 2, as gpt3-xl-dp8")
    ranks = int(ranks_text)
    options = _int_options(spec, arg, ("batch", "seq", "link_gbs") if ranks > 1 else ("batch", "seq"))
    preset = getattr(device, "preset", None)
    seq = options.get("seq", GPT3_XL["seq"])
    if "batch" not in options and preset is not None and preset.memory_bytes:
        shape = {k: GPT3_XL[k] for k in ("layers", "d_model", "heads", "vocab")}
        options["batch"] = fitting_batch(preset.memory_bytes, seq=seq, **shape)
    link = options.pop("link_gbs", 0) * 1e9 or (preset.link_bytes_per_s if preset is not None else 0.0)
    if ranks > 1 and not link:
        raise KdvfsError(f"workload {spec!r}: say the link's all-reduce bandwidth, as {kind}:link_gbs=400")
    return gpt3_xl(options.get("batch", 8), seq, ranks=ranks, link_bytes_per_s=link)


def _int_options(spec: str, arg: str, allowed: tuple[str, ...]) -> dict[str, int]:
    options: dict[str, int] = {}
    for item in filter(None, arg.split(",")):
        key, _, value = item.partition("=")
        if key not in allowed or not value.isdigit() or int(value) <= 0:
            raise KdvfsError(
                f"workload {spec!r}: bad option {item!r} (allowed: {', '.join(k + '=N' for k in allowed)})"
            )
        options[key] = int(value)
    return options


def open_op_replay(device_spec: str, workload_spec: str):
    """A real card and the recorded ops of a training step it runs (runtime/op_device.py):
    device_spec nvml:INDEX (dry run), workload_spec ops:FILE (op_replay.save_ops). The ops are
    rebuilt where they were recorded (the file says: cuda, or cpu in the tests)."""
    from kdvfs.runtime.nvml_device import NvmlDevice
    from kdvfs.runtime.op_device import OpReplayDevice
    from kdvfs.runtime.op_replay import load_ops

    kind = device_spec.partition(":")[0]
    if kind != "nvml":
        raise KdvfsError(
            f"workload {workload_spec!r}: recorded ops run on a real GPU, --device nvml:INDEX, not {device_spec!r}"
        )
    index = nvml_index(device_spec)
    path = Path(workload_spec.partition(":")[2])
    if not path.name:
        raise KdvfsError("ops workload needs a file: ops:PATH.json")
    ops, torch_device = load_ops(path)
    card = NvmlDevice(index, dry_run=True)
    try:
        device = OpReplayDevice(card, ops, torch_device=torch_device, name=path.stem)
    except BaseException:
        card.close()
        raise
    return device, device.workload
