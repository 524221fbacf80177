"""A real card as a KernelRunner: the recorded ops of a training step, rebuilt, are its kernels.

`OpReplayDevice` wraps a Device (an `NvmlDevice`, dry run by default as everywhere) and the
ops that runtime/op_replay.py recorded from a step: each op that can be rebuilt on random
inputs of its recorded shapes and dtypes becomes one Kernel of `workload` (in step order,
its in-step time as ref_time_s, its pass from the profiler's ranges), and `run` runs it back
to back, timed with CUDA events (the host clock on the CPU). Clocks, the energy counter and
the sensors are the wrapped card's. This is what `kdvfs sweep --device nvml:N --workload
ops:FILE` measures, cell by cell, with runtime/measure.py's counter-aligned windows; it has no
noiseless `expected`, so the sweep evaluates its plans from the table it measured
(tuner/sweep.py `measured_figures`). Why and what it showed on the H200: docs/gpu-validation.md.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence

import torch

from kdvfs.runtime.device import Device
from kdvfs.runtime.op_replay import RecordedOp, rebuild
from kdvfs.runtime.types import ClockPair, KdvfsError, Kernel, Source, Workload

#: Clock-switch latency assumed for a card that states none (as tuner/job_tuning.py), s.
ASSUMED_SWITCH_LATENCY_S = 0.030
#: Longest time spent polling the counter for its update period when the device opens, s.
PERIOD_PROBE_S = 1.0


class OpReplayDevice:
    """The recorded ops of a training step, run alone on a real card (or on the CPU).

    Args:
        card: the card whose clocks, energy counter and sensors are used (NvmlDevice).
        ops: the step's recorded ops (op_replay.record_ops or load_ops).
        torch_device: where the ops are rebuilt and run: "cuda" (the card) or "cpu" (tests).
        switch_latency_s: the card's clock-switch latency, s (None: ASSUMED_SWITCH_LATENCY_S).
        name: the workload's name.
    """

    source: Source = "measured"

    def __init__(
        self,
        card: Device,
        ops: Sequence[RecordedOp],
        *,
        torch_device: str = "cuda",
        switch_latency_s: float | None = None,
        name: str = "recorded_ops",
    ) -> None:
        if torch_device.startswith("cuda") and not torch.cuda.is_available():
            raise KdvfsError("the recorded ops ran on CUDA, and torch sees no CUDA device here")
        self.card = card
        self.name = card.name
        self.grid = card.grid
        self.torch_device = torch_device
        self.switch_latency_s = ASSUMED_SWITCH_LATENCY_S if switch_latency_s is None else switch_latency_s
        self._cuda = torch_device.startswith("cuda")
        self._fns: dict[str, Callable[[], object]] = {}
        self._chunks: dict[str, int] = {}
        kernels = []
        for op in ops:
            fn = rebuild(op, torch_device)
            if fn is None:
                continue
            kernel = Kernel(
                f"{op.position:03d}.{op.name.removeprefix('aten::')}",
                pass_name=op.pass_name,
                ref_time_s=op.device_time_s or None,
            )
            self._fns[kernel.name] = fn
            kernels.append(kernel)
        total_s = sum(op.device_time_s for op in ops)
        rebuilt_s = sum(k.ref_time_s or 0.0 for k in kernels)
        self.ops_recorded = len(ops)
        self.share_rebuilt = rebuilt_s / total_s if total_s > 0 else 0.0
        """Share of the step's recorded (device) time held by the ops that were rebuilt."""
        if not kernels:
            raise KdvfsError(f"none of the {len(ops)} recorded ops could be rebuilt on {torch_device}")
        meta = (
            ("source", "recorded ops of a training step, rebuilt"),
            ("ops_recorded", str(len(ops))),
            ("share_rebuilt", f"{self.share_rebuilt:.4f}"),
        )
        self.workload = Workload(name, tuple(kernels), meta=meta)
        self._t0 = time.monotonic()
        self.energy_update_period_s = self._probe_update_period_s()

    def __enter__(self) -> OpReplayDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the card (stock clocks back where any were locked)."""
        close = getattr(self.card, "close", None)
        if callable(close):
            close()

    # --- Device: the card's -------------------------------------------------------------
    def set_clocks(self, pair: ClockPair) -> None:
        self.card.set_clocks(pair)

    def reset_clocks(self) -> None:
        self.card.reset_clocks()

    def energy_j(self) -> float:
        return self.card.energy_j()

    def temperature_c(self) -> float:
        return self.card.temperature_c()

    def power_w(self) -> float:
        return self.card.power_w()

    def throttle_reasons(self) -> frozenset[str]:
        return self.card.throttle_reasons()

    def power_limit_w(self) -> float:
        return self.card.power_limit_w()

    # --- KernelRunner -------------------------------------------------------------------
    def now_s(self) -> float:
        """Host time since the device opened (a real card's time passes on its own)."""
        return time.monotonic() - self._t0

    def run(self, kernel: Kernel, launches: int = 1) -> float:
        """Run the kernel's op `launches` times back to back; their elapsed seconds (CUDA
        events around them on a GPU, the host clock on the CPU)."""
        fn = self._fns.get(kernel.name)
        if fn is None:
            raise KdvfsError(f"kernel {kernel.name!r} is not one of the rebuilt ops")
        if not self._cuda:
            t0_s = time.perf_counter()
            for _ in range(launches):
                fn()
            return time.perf_counter() - t0_s
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(launches):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3

    def chunk_launches(self, kernel: Kernel, chunk_s: float) -> int:
        """Launches of the kernel's op in one chunk of about chunk_s, the same in every cell
        of a sweep (fixed at its first request from the fastest of three timed calls): a
        chunk's own overhead (the events, the synchronisation) then weighs alike at every
        pair, where a count from each cell's first, cold call would not."""
        if kernel.name not in self._chunks:
            fastest_s = min(self.run(kernel, 1) for _ in range(3))
            self._chunks[kernel.name] = max(1, int(chunk_s / max(fastest_s, 1e-9)))
        return self._chunks[kernel.name]

    def idle(self, duration_s: float) -> None:
        time.sleep(duration_s)

    def _probe_update_period_s(self) -> float:
        """The counter's update period: the median gap of its updates seen within
        PERIOD_PROBE_S (that probe time itself when fewer than three were seen)."""
        seen, last = [], self.card.energy_j()
        end_s = time.monotonic() + PERIOD_PROBE_S
        while time.monotonic() < end_s and len(seen) < 6:
            value = self.card.energy_j()
            if value != last:
                seen.append(time.monotonic())
                last = value
            time.sleep(0.001)
        gaps = sorted(b - a for a, b in itertools.pairwise(seen))
        return gaps[len(gaps) // 2] if len(gaps) >= 2 else PERIOD_PROBE_S
