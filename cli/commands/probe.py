"""`kdvfs probe`: read-only stock-clock measurements of reference kernels on a real GPU.

Each kernel (runtime/probe_kernels.py; `--ladder` for the size ladder) is captured in a CUDA
graph of enough calls to last ~2 ms, so that the GPU runs it back to back as a training
step's queue does, not at Python's launch rate (eager launches where capture fails, said in
the `mode` column). The graph is replayed for at least --seconds; a sampler thread reads the
SM and memory clocks, power and the energy counter meanwhile, and the power is the energy
between the first and last counter updates it saw while the GPU was busy (the counter
advances only every ~100 ms; a window closed at observed updates resolves power to ~0.3%
in 1 s, data/h200-window-noise). Rows go to DIR/kernels_stock.csv with the columns
of h200-probe/kernels_stock.csv (plus window_s and mode), so `kdvfs calibrate --against`
reads it. Clocks are never changed: the GPU is opened in dry run. Interrupted (Ctrl-C,
SIGTERM), it writes the rows it has and exits 130.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import astuple, dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from kdvfs.cli.commands._common import Phases, check_outputs, duration_s, write_all
from kdvfs.runtime.types import KdvfsError

if TYPE_CHECKING:
    from kdvfs.runtime.nvml_device import NvmlDevice
    from kdvfs.runtime.probe_kernels import ProbeKernel

PROBE_COLUMNS = (
    "kernel", "iters", "per_call_us", "wall_s", "gpu_s", "energy_J", "avg_power_W", "energy_per_call_mJ",
    "sm_clock_median", "sm_clock_min", "mem_clock", "power_W_median", "temp_end", "tflops", "gbps",
    "window_s", "mode",
)  # fmt: skip
PROBE_FILE = "kernels_stock.csv"
SAMPLE_PERIOD_S = 0.01  # s between clock/power samples (an energy read itself takes ~4 ms)
GRAPH_S = 2e-3  # s of GPU work one captured CUDA graph holds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kdvfs.runtime.probe_kernels import DEFAULT_PROBE_KERNELS

    parser.add_argument("--out", metavar="DIR", type=Path, required=True, help=f"write DIR/{PROBE_FILE}")
    parser.add_argument(
        "--seconds", metavar="S", type=duration_s, default=2.0, help="run each kernel >= S s (default 2)"
    )
    parser.add_argument("--index", metavar="N", type=int, default=0, help="CUDA device index (default 0)")
    parser.add_argument(
        "--kernels",
        metavar="NAMES",
        default=",".join(DEFAULT_PROBE_KERNELS),
        help="comma-separated kernel names (default: the six of h200-probe)",
    )
    parser.add_argument(
        "--ladder", action="store_true",
        help="probe the size ladder (8 kinds x 6 sizes, probe_kernels.SIZE_LADDER) instead of --kernels",
    )  # fmt: skip


@dataclass(frozen=True)
class ProbeRow:
    """One kernel's stock-clock measurement; fields in PROBE_COLUMNS order."""

    kernel: str
    iters: int
    per_call_us: float
    wall_s: float
    gpu_s: float
    energy_j: float
    avg_power_w: float
    energy_per_call_mj: float
    sm_clock_median_mhz: int
    sm_clock_min_mhz: int
    mem_clock_mhz: int
    power_median_w: float
    temp_end_c: int
    tflops: float
    gbps: float
    window_s: float  # the counter-aligned window the power comes from
    mode: str  # "graph" (CUDA graph replay) or "eager" (Python launches)


def write_probe_csv(path: Path, rows: list[ProbeRow]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(PROBE_COLUMNS)
        writer.writerows(astuple(row) for row in rows)


def run(args: argparse.Namespace) -> int:
    from kdvfs.runtime.probe_kernels import SIZE_LADDER, parse_probe_kernel

    if args.seconds <= 0:
        raise KdvfsError(f"--seconds must be > 0, got {args.seconds}")
    check_outputs(args, {}, {"--out": args.out})
    names = SIZE_LADDER if args.ladder else [n.strip() for n in args.kernels.split(",") if n.strip()]
    kernels = [parse_probe_kernel(name) for name in names]
    why_not = _cuda_missing(args.index)
    if why_not:
        print(f"kdvfs probe: needs PyTorch with CUDA and an NVIDIA GPU ({why_not})", file=sys.stderr)
        return 1
    from kdvfs.runtime.nvml_device import NvmlDevice, NvmlUnavailable

    try:
        dev = NvmlDevice(_nvml_index(args.index), dry_run=True)
    except NvmlUnavailable as exc:
        print(f"kdvfs probe: {exc}", file=sys.stderr)
        return 1
    phases, rows = Phases("probe"), []
    with dev, phases.interruptible():
        print(
            f"probing {dev.name} (GPU {dev.index}) at stock clocks, >= {args.seconds:g} s per kernel [measured]"
        )
        for kernel in kernels:
            phases.enter(f"probing {kernel.name}")
            row = measure_kernel(kernel, dev, args.seconds, f"cuda:{args.index}")
            print(
                f"  {row.kernel}: {row.per_call_us:.1f} us/call, {row.energy_per_call_mj:.2f} mJ/call, "
                f"{row.avg_power_w:.0f} W, SM {row.sm_clock_median_mhz} MHz median [measured]"
            )
            rows.append(row)
    out = args.out / PROBE_FILE
    if phases.interrupted:
        print(f"  partial: {len(rows)} of {len(kernels)} kernels probed")
    return phases.exit_status(write_all([("probe table", lambda: _write(out, rows))]))


def _write(out: Path, rows: list[ProbeRow]) -> None:
    write_probe_csv(out, rows)
    print(f"wrote {out}")


def _cuda_missing(index: int) -> str | None:
    """Why the probe cannot run here, or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False"
    if not 0 <= index < torch.cuda.device_count():
        return f"no CUDA device {index}; {torch.cuda.device_count()} visible"
    return None


def _nvml_index(cuda_index: int) -> int:
    """The NVML index of a CUDA device (they differ under CUDA_VISIBLE_DEVICES): matched by
    UUID, else the same number."""
    import torch

    from kdvfs.runtime.nvml_device import list_gpu_uuids

    cuda_uuid = str(getattr(torch.cuda.get_device_properties(cuda_index), "uuid", "") or "")
    nvml_uuids = [u.removeprefix("GPU-") for u in list_gpu_uuids()]
    if cuda_uuid and cuda_uuid.removeprefix("GPU-") in nvml_uuids:
        return nvml_uuids.index(cuda_uuid.removeprefix("GPU-"))
    return cuda_index


def measure_kernel(kernel: ProbeKernel, dev: NvmlDevice, seconds: float, cuda_device: str) -> ProbeRow:
    """Run one ProbeKernel back to back for >= seconds at stock clocks on an NvmlDevice."""
    import torch

    fn = kernel.build(cuda_device)
    per_call_s = _estimate_per_call_s(fn, torch)
    calls = max(1, math.ceil(GRAPH_S / per_call_s))
    replay, mode = _capture(fn, calls, torch)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    replays = 0
    with _Sampler(dev) as sampler:
        t0_s = time.perf_counter()
        start.record()
        while time.perf_counter() - t0_s < seconds or len(sampler.updates) < 2:
            for _ in range(8):  # ~16 ms queued ahead: the GPU never waits, the CPU never runs far ahead
                replay()
            replays += 8
            torch.cuda.synchronize()
            if time.perf_counter() - t0_s > 10 * seconds + 5:
                break
        end.record()
        busy_until_s = time.perf_counter()
        torch.cuda.synchronize()
    wall_s = time.perf_counter() - t0_s
    gpu_s = start.elapsed_time(end) / 1000.0
    iters = replays * calls
    window = [(t, e) for t, e in sampler.updates if t <= busy_until_s]
    if len(window) < 2:
        raise KdvfsError(f"{kernel.name}: the energy counter did not advance twice in {wall_s:.1f} s")
    (ta_s, ea_j), (tb_s, eb_j) = window[0], window[-1]
    power_w = (eb_j - ea_j) / (tb_s - ta_s)
    del fn, replay
    torch.cuda.empty_cache()
    return ProbeRow(
        kernel=kernel.name,
        iters=iters,
        per_call_us=gpu_s / iters * 1e6,
        wall_s=wall_s,
        gpu_s=gpu_s,
        energy_j=power_w * gpu_s,
        avg_power_w=power_w,
        energy_per_call_mj=power_w * gpu_s / iters * 1000.0,
        sm_clock_median_mhz=round(statistics.median(sampler.sm_mhz)),
        sm_clock_min_mhz=min(sampler.sm_mhz),
        mem_clock_mhz=round(statistics.median(sampler.mem_mhz)),
        power_median_w=statistics.median(sampler.power_w),
        temp_end_c=round(dev.temperature_c()),
        tflops=kernel.flops * iters / gpu_s / 1e12,
        gbps=kernel.bytes_moved * iters / gpu_s / 1e9,
        window_s=tb_s - ta_s,
        mode=mode,
    )


def _capture(fn: Callable[[], object], calls: int, torch: ModuleType) -> tuple[Callable[[], object], str]:
    """A callable that runs `calls` calls of fn: one CUDA graph replay, or eager launches
    where the op cannot be captured."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):  # warm-up on a side stream, as capture requires
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        torch.cuda.synchronize()
        return graph.replay, "graph"
    except RuntimeError:
        torch.cuda.synchronize()

        def eager() -> None:
            for _ in range(calls):
                fn()

        return eager, "eager"


def _estimate_per_call_s(fn: Callable[[], object], torch: ModuleType) -> float:
    """Warm up, then time doubling batches until one lasts >= 0.1 s."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    n = 4
    while True:
        t0_s = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        elapsed_s = time.perf_counter() - t0_s
        if elapsed_s >= 0.1:
            return elapsed_s / n
        n *= 2


class _Sampler:
    """Samples SM/memory clocks and power every SAMPLE_PERIOD_S on one thread, and polls the
    energy counter back to back on another (a read takes ~4 ms), while a kernel runs;
    `updates` holds (time, energy) at each observed counter update."""

    def __init__(self, dev: NvmlDevice) -> None:
        self._dev = dev
        self.sm_mhz: list[int] = []
        self.mem_mhz: list[int] = []
        self.power_w: list[float] = []
        self.updates: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._sample_loop, name="kdvfs-probe-sampler", daemon=True),
            threading.Thread(target=self._energy_loop, name="kdvfs-probe-energy", daemon=True),
        ]

    def _sample(self) -> None:
        clocks = self._dev.clocks_mhz()
        self.sm_mhz.append(clocks.core_mhz)
        self.mem_mhz.append(clocks.mem_mhz)
        self.power_w.append(self._dev.power_w())

    def _sample_loop(self) -> None:
        while not self._stop.wait(SAMPLE_PERIOD_S):
            self._sample()

    def _energy_loop(self) -> None:
        last_j = self._dev.energy_j()
        while not self._stop.is_set():
            energy_j = self._dev.energy_j()
            if energy_j != last_j:
                self.updates.append((time.perf_counter(), energy_j))
                last_j = energy_j

    def __enter__(self) -> _Sampler:
        self._sample()
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()
