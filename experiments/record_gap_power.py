"""Record a card's power when its kernels are spaced by idle gaps, read-only: what a launch-bound step draws.

    python experiments/record_gap_power.py --out DIR [--window-s 4 --warmup-s 3 --kernels a,b --gaps-us 0,50,...]

Standalone beside record_job.py (whose NVML sampler it uses) and record_step_shapes.py (whose window
figures it uses); it changes no GPU setting. Map:
  KERNELS       the kernels: a small elementwise add, bf16 GEMMs of 1024^3, 2048^3 and 4096^3
  back_to_back  a kernel launched back to back for some seconds (the warm-ups, gap "b2b")
  kernel_us     a kernel's mean duration launched back to back (CUDA events over 200 launches), us
  spaced_run    the kernel for `window_s`, each launch after the one before has ended (the host
                synchronises) and a further `gap_us` of host spin: the GPU idles between
                kernels; gap "b2b": launched back to back, no synchronisation (no idle);
                returns launches, the window's time and the energy counter's power over it
  idle_decay    after `warmup_s` of the largest GEMM, nothing launched for `idle_s`: power, SM
                clock and the counter's updates as the card idles (how soon its power falls)
  main          every kernel at every gap, the idle decay last; writes DIR/gap_power.json
                (per run: kernel, gap, launches, window, kernel duration, busy share = launches x
                duration / window, counter power, mean reported power, SM clock, temperature)
                and DIR/gap_power_samples.csv.gz (every NVML sample: host time, energy mJ,
                counter updated, SM MHz, memory MHz, power W, temperature C, reasons, limit W)
Why: a launch-bound training step idles between small kernels (data/h200/steps: ResNet-18 at
batch 32 keeps its GPU busy a quarter of the step); what the card draws in those gaps, and
whether a kernel after a gap draws what it draws back to back, decides the step's energy.
"""

from __future__ import annotations

import csv
import gzip
import json
import sys
import time
from pathlib import Path

import torch

try:
    from record_job import NvmlSampler, quantile
    from record_step_shapes import counter_power_w, sensor_figures
except ImportError:
    from kdvfs.experiments.record_job import NvmlSampler, quantile
    from kdvfs.experiments.record_step_shapes import counter_power_w, sensor_figures

DEVICE = torch.device("cuda")


def _add() -> tuple:
    x = torch.zeros(1 << 20, device=DEVICE)
    return (lambda: x.add_(1.0)), "x.add_(1) on 2^20 fp32 (4 MiB)"


def _gemm(n: int) -> tuple:
    a = torch.randn(n, n, device=DEVICE, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=DEVICE, dtype=torch.bfloat16)
    c = torch.empty(n, n, device=DEVICE, dtype=torch.bfloat16)
    return (lambda: torch.mm(a, b, out=c)), f"bf16 GEMM {n}^3"


KERNELS = {
    "add_4mib": _add,
    "gemm_bf16_1024": lambda: _gemm(1024),
    "gemm_bf16_2048": lambda: _gemm(2048),
    "gemm_bf16_4096": lambda: _gemm(4096),
}
GAPS_US = ("b2b", 0, 20, 50, 200, 1000, 5000)
"""Idle after each kernel: "b2b" back to back (no synchronisation); a number: the host
synchronises on the kernel, then spins that many us before the next launch (0: the
synchronisation's own latency alone)."""


def kernel_us(launch) -> float:
    """Mean duration of one launch back to back over 200 launches, us (CUDA events)."""
    for _ in range(20):
        launch()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(200):
        launch()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / 200


def back_to_back(launch, seconds: float, per_sync: int = 20) -> int:
    """The kernel back to back for `seconds`, synchronising every `per_sync` launches (the
    queue stays short, so the time ends on time); returns the launches."""
    t_end = time.perf_counter() + seconds
    launches = 0
    while time.perf_counter() < t_end:
        for _ in range(per_sync):
            launch()
        launches += per_sync
        torch.cuda.synchronize()
    return launches


def spaced_run(launch, gap, window_s: float, sampler: NvmlSampler) -> dict:
    """The kernel for `window_s` at idle gaps of `gap` (GAPS_US); its launches and power."""
    torch.cuda.synchronize()
    first = len(sampler.rows)
    t0 = time.perf_counter()
    t_end = t0 + window_s
    launches = 0
    if gap == "b2b":
        launches = back_to_back(launch, window_s, per_sync=50)
    else:
        spin_s = float(gap) * 1e-6
        while time.perf_counter() < t_end:
            launch()
            torch.cuda.synchronize()
            until = time.perf_counter() + spin_s
            while time.perf_counter() < until:
                pass
            launches += 1
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    start_s, end_s = t0 - sampler.t0_s, t1 - sampler.t0_s
    rows = [r for r in sampler.rows[first:] if start_s <= r[0] <= end_s]
    return {
        "launches": launches,
        "window_s": t1 - t0,
        "counter_power_w": counter_power_w(rows),
        **sensor_figures(rows),
        "samples": len(rows),
    }


def idle_decay(launch, warmup_s: float, idle_s: float, sampler: NvmlSampler) -> dict:
    """Power and SM clock after the kernel stops, in 100-ms bins from its last launch's end."""
    back_to_back(launch, warmup_s)
    stop_s = time.perf_counter() - sampler.t0_s
    time.sleep(idle_s)
    rows = [r for r in sampler.rows if r[0] >= stop_s]
    bins = []
    for i in range(int(idle_s / 0.1)):
        inside = [r for r in rows if stop_s + 0.1 * i <= r[0] < stop_s + 0.1 * (i + 1)]
        if inside:
            bins.append({
                "from_s": round(0.1 * i, 1),
                "power_mean_w": sum(r[5] for r in inside) / len(inside),
                "sm_mhz_median": quantile([r[3] for r in inside], 0.5),
            })  # fmt: skip
    return {"stop_s": stop_s, "idle_s": idle_s, "bins": bins, "counter_power_w": counter_power_w(rows)}


def main(argv: list[str]) -> None:
    opts = dict(zip(argv[::2], argv[1::2]))
    out = Path(opts.get("--out", "."))
    window_s = float(opts.get("--window-s", 4))  # measured window per kernel and gap; s
    warmup_s = float(opts.get("--warmup-s", 3))  # the largest GEMM back to back before the runs; s
    idle_s = float(opts.get("--idle-s", 3))  # idle after the runs, for the decay; s
    names = [n for n in opts.get("--kernels", ",".join(KERNELS)).split(",") if n]
    unknown = [n for n in names if n not in KERNELS]
    if unknown or not names:
        sys.exit(
            f"record_gap_power: unknown kernel {', '.join(unknown) or '(none)'}; known: {', '.join(KERNELS)}"
        )
    try:
        gaps = [
            g if g == "b2b" else int(g) for g in opts.get("--gaps-us", ",".join(map(str, GAPS_US))).split(",")
        ]
    except ValueError:
        sys.exit(
            f"record_gap_power: --gaps-us takes b2b and whole microseconds, got {opts.get('--gaps-us')!r}"
        )
    if any(g != "b2b" and g < 0 for g in gaps):
        sys.exit("record_gap_power: a gap must be b2b or at least 0 us")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    sampler = NvmlSampler(torch.cuda.current_device(), 0.005, t0)
    sampler.start()
    doc = {"gpu": sampler.info(), "torch": torch.__version__, "window_s": window_s, "runs": []}
    big, _ = KERNELS["gemm_bf16_4096"]()
    back_to_back(big, warmup_s)
    for name in names:
        launch, description = KERNELS[name]()
        duration_us = kernel_us(launch)
        for gap in gaps:
            run = spaced_run(launch, gap, window_s, sampler)
            run.update(kernel=name, description=description, gap_us=gap, kernel_us=duration_us,
                       busy_share=run["launches"] * duration_us * 1e-6 / run["window_s"])  # fmt: skip
            doc["runs"].append(run)
            (out / "gap_power.json").write_text(json.dumps(doc, indent=2) + "\n")
            print(json.dumps({k: run[k] for k in ("kernel", "gap_us", "kernel_us", "busy_share",
                  "counter_power_w", "sm_mhz_median", "temperature_c_end")}), flush=True)  # fmt: skip
    doc["idle_decay"] = idle_decay(big, warmup_s, idle_s, sampler)
    (out / "gap_power.json").write_text(json.dumps(doc, indent=2) + "\n")
    sampler.stop()
    with gzip.open(out / "gap_power_samples.csv.gz", "wt", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(("host_s", "energy_mj", "updated", "sm_mhz", "mem_mhz", "power_w", "temp_c", "reasons", "limit_w"))  # fmt: skip
        writer.writerows(sampler.rows)
    print(json.dumps({"idle_decay": doc["idle_decay"]["bins"][:10]}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
