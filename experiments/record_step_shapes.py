"""Record whole training steps of differently shaped models, read-only, for a simulator's calibration.

    python experiments/record_step_shapes.py --out DIR [--warmup-s 6 --window-s 20 --budget-s 270]
                                             [--shapes NAME,NAME,...]
    python experiments/record_step_shapes.py --out DIR --grids-only 1 [--shapes ...]
    python experiments/record_step_shapes.py --out DIR --graphs 1 [--shapes ...]

Standalone beside record_job.py (whose NVML sampler it uses); it changes no GPU setting. Map:
  SHAPES        the steps: ResNet-50 bf16 batch 128; GPT-2 small bf16 with SDPA attention and with
                eager attention; an fp32 MLP with SGD; a large-batch transformer at the power cap;
                a ViT-B/16 in fp32 with AdamW; GPT-2 medium bf16 SDPA at 8 x 1024; a small
                launch-bound ResNet-18 bf16 batch 32 with SGD; steps that wait on their host for
                more or less of the step: ResNet-18 at batch 16 and 64, ResNet-50 at batch 16,
                GPT-2 small SDPA at 2 x 128; short kernels: ResNet-34 and ResNet-50 at batch 32,
                GPT-2 small eager at 4 x 256 and SDPA at 8 x 256
  graphed       --graphs 1: each step captured in one CUDA graph and replayed (its kernels back
                to back, the host's launches gone), measured and written as main writes steps
  select_shapes --shapes a,b,c: the named shapes, in SHAPES order (default: all); an unknown name
                exits with one line naming it
  counter_power_w, sensor_figures
                a window of the NVML sampler's rows: the energy counter's power, and the mean
                power, clocks, temperatures and throttle share (record_gap_power.py uses them too)
  measure       per shape: warm up for warmup_s, then run window_s between two synchronisations
                with the NVML sampler on: step time, energy per step from the energy counter,
                mean power, SM clock, temperature, throttle reasons; the host's time to issue a
                step to an idle GPU (host_issue_s); then a torch.profiler trace of 3 steps: GPU
                busy share (union of kernel intervals over the steps' span)
  gpu_events    a chrome trace's GPU events, each with the start of the host call that launched
                it (its correlation id) and, on request, its launch shape
  main          the selected shapes, one after another; writes DIR/steps_summary.json (one entry per shape, after each shape) and
                DIR/steps_kernels.csv.gz (KERNEL_COLUMNS per GPU event: shape, name, start_us,
                duration_us, launch_us, grid_blocks, block_threads, blocks_per_sm)
  grids_only    --grids-only 1: per shape, a 3-s warm-up and the profiled 3 steps alone (no
                energy window), each GPU event with its launch shape from the profiler's trace
                (grid and block as products of their x, y, z; the profiler's blocks per SM):
                DIR/steps_grids.csv.gz (shape, index, name, start_us, duration_us, grid_blocks,
                block_threads, blocks_per_sm; empty for copies and fills)
Data are random tensors already on the GPU: the steps, not a data pipeline, are measured.
"""

from __future__ import annotations

import csv
import gzip
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

try:
    from record_job import REASON_BITS, EncoderLM, NvmlSampler, quantile
except ImportError:
    from kdvfs.experiments.record_job import REASON_BITS, EncoderLM, NvmlSampler, quantile

DEVICE = torch.device("cuda")
HOST_ISSUE_STEPS = 20  # steps timed one by one on the host, each after a synchronisation
KERNEL_COLUMNS = (
    "shape",
    "name",
    "start_us",
    "duration_us",
    "launch_us",
    "grid_blocks",
    "block_threads",
    "blocks_per_sm",
)
"""steps_kernels.csv.gz's columns (launch_us and the launch shape since 2026-12-06)."""


def resnet_bf16(arch: str, batch: int) -> tuple:
    """A torchvision ResNet (`arch`: resnet50, resnet34, resnet18) at `batch` images of 224x224, bf16
    autocast, channels_last, SGD momentum."""
    import torchvision

    model = getattr(torchvision.models, arch)(weights=None).to(DEVICE, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    x = torch.randn(batch, 3, 224, 224, device=DEVICE).to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device=DEVICE)

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step, f"torchvision {arch}, batch {batch}x3x224x224, bf16 autocast, channels_last, SGD momentum"


def gpt2(attn: str, batch: int, seq: int, size: str = "small") -> tuple:
    """A Hugging Face GPT-2 (`size`: small, GPT2Config's defaults; medium: d 1024, 24 layers,
    16 heads) at batch x seq tokens, bf16 autocast, attention `attn`, fused AdamW."""
    from transformers import GPT2Config, GPT2LMHeadModel

    dims = {"small": {}, "medium": {"n_embd": 1024, "n_layer": 24, "n_head": 16}}[size]
    model = GPT2LMHeadModel(GPT2Config(**dims, attn_implementation=attn)).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    ids = torch.randint(0, 50257, (batch, seq), device=DEVICE)

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    what = "GPT-2 small (GPT2Config)" if size == "small" else "GPT-2 medium (d 1024, 24 layers)"
    return step, f"{what}, batch {batch}x{seq}, bf16 autocast, attention {attn}, fused AdamW"


def mlp_fp32() -> tuple:
    width, depth = 8192, 4
    layers = [m for _ in range(depth) for m in (nn.Linear(width, width), nn.ReLU())]
    model = nn.Sequential(*layers, nn.Linear(width, 1000)).to(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(4096, width, device=DEVICE)
    y = torch.randint(0, 1000, (4096,), device=DEVICE)

    def step() -> None:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    tf32 = torch.backends.cuda.matmul.allow_tf32
    return step, f"MLP {depth}x{width} ReLU, batch 4096, fp32 (allow_tf32={tf32}), SGD momentum"


def transformer_large_batch() -> tuple:
    model = EncoderLM(32768, 1024, 12).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    x = torch.randint(0, 32768, (64, 513), device=DEVICE)

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step, "nn.TransformerEncoder LM d=1024 12 layers, batch 64x512, bf16 autocast, fused AdamW"


def vit_b16_fp32() -> tuple:
    import torchvision

    model = torchvision.models.vit_b_16(weights=None).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    x = torch.randn(64, 3, 224, 224, device=DEVICE)
    y = torch.randint(0, 1000, (64,), device=DEVICE)

    def step() -> None:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    tf32 = torch.backends.cuda.matmul.allow_tf32
    return step, f"torchvision vit_b_16, batch 64x3x224x224, fp32 (allow_tf32={tf32}), fused AdamW"


SHAPES = {
    "resnet50_bf16_b128": lambda: resnet_bf16("resnet50", 128),
    "gpt2_small_sdpa_bf16": lambda: gpt2("sdpa", 16, 512),
    "gpt2_small_eager_bf16": lambda: gpt2("eager", 16, 512),
    "mlp_fp32_sgd": mlp_fp32,
    "transformer_bf16_b64_powercap": transformer_large_batch,
    "vit_b16_fp32_adamw_b64": vit_b16_fp32,
    "gpt2_medium_sdpa_bf16_b8x1024": lambda: gpt2("sdpa", 8, 1024, "medium"),
    "resnet18_bf16_b32_sgd": lambda: resnet_bf16("resnet18", 32),
    "resnet18_bf16_b16_sgd": lambda: resnet_bf16("resnet18", 16),
    "resnet18_bf16_b64_sgd": lambda: resnet_bf16("resnet18", 64),
    "resnet50_bf16_b16_sgd": lambda: resnet_bf16("resnet50", 16),
    "gpt2_small_sdpa_bf16_b2x128": lambda: gpt2("sdpa", 2, 128),
    # short kernels, GPU-bound and launch-bound, added 2026-12-06 to test the ramp of a short
    # kernel's busy share (docs/design-runtime.md) on steps it was not fitted to
    "resnet34_bf16_b32_sgd": lambda: resnet_bf16("resnet34", 32),
    "resnet50_bf16_b32_sgd": lambda: resnet_bf16("resnet50", 32),
    "gpt2_small_eager_bf16_b4x256": lambda: gpt2("eager", 4, 256),
    "gpt2_small_sdpa_bf16_b8x256": lambda: gpt2("sdpa", 8, 256),
}


def graphed(build):
    """A shape's builder whose step is a replay of its step captured in one CUDA graph (after 3
    eager steps on a side stream, as torch.cuda.graphs prescribes): the same kernels back to
    back, without the host's launches between them."""

    def build_graphed() -> tuple:
        step, description = build()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        return graph.replay, f"{description}; one CUDA graph replayed a step"

    return build_graphed


def select_shapes(text: str | None) -> list[str]:
    """The shapes named in `text` (comma-separated), in SHAPES order; None or "": all of them.
    An unknown name exits with one line naming it and the known ones."""
    if not text:
        return list(SHAPES)
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in SHAPES]
    if unknown or not names:
        sys.exit(
            f"record_step_shapes: unknown shape {', '.join(unknown) or repr(text)}; known: {', '.join(SHAPES)}"
        )
    return [n for n in SHAPES if n in names]


def busy_share(kernels: list[tuple[str, float, float]]) -> tuple[float, float]:
    """(union of GPU event intervals / their span, span in us)."""
    spans = sorted((s, s + d) for _, s, d in kernels)
    if not spans:
        return float("nan"), 0.0
    busy, cur_s, cur_e = 0.0, spans[0][0], spans[0][1]
    for s, e in spans[1:]:
        if s > cur_e:
            busy, cur_s, cur_e = busy + cur_e - cur_s, s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    total = max(e for _, e in spans) - spans[0][0]
    return (busy / total if total > 0 else float("nan")), total


def profile(step, steps: int, launch: bool = False) -> list[tuple]:
    """GPU events (kernels, memcpys, memsets) of `steps` steps: (name, start_us, duration_us,
    launch_us), and with launch=True each one's (grid blocks, block threads, blocks per SM) after
    them (gpu_events)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    path = Path(tempfile.mkdtemp()) / "trace.json"
    prof.export_chrome_trace(str(path))
    return gpu_events(json.loads(path.read_text())["traceEvents"], launch)


def gpu_events(events: list[dict], launch: bool = False) -> list[tuple]:
    """A chrome trace's GPU events in start order: (name, start_us, duration_us, launch_us), times
    from the first GPU event's start; launch_us: the start of the host's runtime or driver call
    that launched it (the call of the same correlation id; "" where the trace has none). With
    launch=True each one's launch_shape after them (empty strings for copies and fills)."""
    calls = {
        e["args"]["correlation"]: float(e["ts"])
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    gpu = [
        (
            e["name"],
            float(e["ts"]),
            float(e.get("dur", 0.0)),
            calls.get(e.get("args", {}).get("correlation"), ""),
            *(launch_shape(e.get("args", {})) if launch else ()),
        )
        for e in events
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    ]
    t0 = min((k[1] for k in gpu), default=0.0)
    return [
        (k[0], k[1] - t0, k[2], "" if k[3] == "" else round(k[3] - t0, 3), *k[4:])
        for k in sorted(gpu, key=lambda k: k[1])
    ]


def host_issue_s(step, steps: int = HOST_ISSUE_STEPS) -> tuple[float, float, float]:
    """The host's time to issue one step to an idle GPU: (median, p10, p90) over `steps` steps,
    each timed from its call to its return, after a synchronisation (no profiler running)."""
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return quantile(times, 0.5), quantile(times, 0.1), quantile(times, 0.9)


def launch_shape(args: dict) -> tuple:
    """(grid blocks, block threads, blocks per SM) of a kernel event's args ("" where absent)."""

    def product(v) -> int | str:
        return v[0] * v[1] * v[2] if isinstance(v, list) and len(v) == 3 else ""

    per_sm = args.get("blocks per SM", "")
    return (
        product(args.get("grid")),
        product(args.get("block")),
        per_sm if isinstance(per_sm, int | float) else "",
    )


def grids_only(names: list[str], out: Path) -> None:
    """Each shape's profiled steps with their kernels' launch shapes, no energy window."""
    with gzip.open(out / "steps_grids.csv.gz", "wt", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(("shape", "index", "name", "start_us", "duration_us", "grid_blocks", "block_threads", "blocks_per_sm"))  # fmt: skip
        for name in names:
            step, _ = SHAPES[name]()
            t_end = time.perf_counter() + 3.0
            while time.perf_counter() < t_end:
                step()
            events = profile(step, 3, launch=True)
            writer.writerows(
                (name, i, n, round(s, 3), round(d, 3), g, b, m)
                for i, (n, s, d, _, g, b, m) in enumerate(events)
            )
            print(
                json.dumps(
                    {"shape": name, "events": len(events), "with_grid": sum(e[3] != "" for e in events)}
                ),
                flush=True,
            )
            del step
            torch.cuda.empty_cache()


def counter_power_w(rows: list[tuple]) -> float:
    """The NVML sampler's rows (record_job.NvmlSampler): the energy counter's difference between
    its first and last update among them, over their time, W (NaN under two updates)."""
    changes = [r for r in rows if r[2]]
    if len(changes) < 2:
        return float("nan")
    return (changes[-1][1] - changes[0][1]) / 1e3 / (changes[-1][0] - changes[0][0])


def sensor_figures(rows: list[tuple]) -> dict:
    """The NVML sampler's rows over a window: mean reported power, SM and memory clocks,
    temperature at its start and end, and the share of samples throttled for any reason but
    idle (None where no sample fell in the window)."""
    return {
        "power_mean_w": sum(r[5] for r in rows) / len(rows) if rows else None,
        "sm_mhz_median": quantile([r[3] for r in rows], 0.5),
        "sm_mhz_p1": quantile([r[3] for r in rows], 0.01),
        "mem_mhz_median": quantile([r[4] for r in rows], 0.5),
        "temperature_c_start": rows[0][6] if rows else None,
        "temperature_c_end": rows[-1][6] if rows else None,
        "throttle_share_any_but_idle": sum(1 for r in rows if r[7] & ~0x1) / len(rows) if rows else None,
    }


def measure(name: str, build, warmup_s: float, window_s: float, sampler: NvmlSampler) -> tuple[dict, list]:
    step, description = build()
    t_end = time.perf_counter() + warmup_s
    while time.perf_counter() < t_end:
        step()
    torch.cuda.synchronize()
    first = len(sampler.rows)
    start_s = time.perf_counter() - sampler.t0_s
    steps = 0
    t_end = time.perf_counter() + window_s
    while time.perf_counter() < t_end:
        step()
        steps += 1
    torch.cuda.synchronize()
    end_s = time.perf_counter() - sampler.t0_s
    rows = [r for r in sampler.rows[first:] if start_s <= r[0] <= end_s]
    power_w = counter_power_w(rows)
    step_s = (end_s - start_s) / steps
    issue_s, issue_p10_s, issue_p90_s = host_issue_s(step)
    kernels = profile(step, 3, launch=True)
    share, span_us = busy_share([k[:3] for k in kernels])
    seen = 0
    for r in rows:
        seen |= r[7]
    summary = {
        "shape": name,
        "description": description,
        "steps": steps,
        "window_s": end_s - start_s,
        "step_s": step_s,
        "counter_power_w": power_w,
        "energy_per_step_j": power_w * step_s,
        **sensor_figures(rows),
        "throttle_reasons_seen": [n for bit, n in REASON_BITS.items() if seen & bit],
        "profiled_steps": 3,
        "profiled_span_us": span_us,
        "profiled_gpu_events": len(kernels),
        "gpu_busy_share": share,
        "host_issue_s": issue_s,
        "host_issue_p10_s": issue_p10_s,
        "host_issue_p90_s": issue_p90_s,
        "memory_allocated_max_gib": torch.cuda.max_memory_allocated() / 2**30,
    }
    return summary, kernels


def main(argv: list[str]) -> None:
    opts = dict(zip(argv[::2], argv[1::2]))
    out = Path(opts.get("--out", "."))
    warmup_s = float(opts.get("--warmup-s", 6))  # per shape, before its window; s
    window_s = float(opts.get("--window-s", 20))  # measured window per shape; s
    budget_s = float(opts.get("--budget-s", 270))  # no new shape starts after this; s
    names = select_shapes(opts.get("--shapes"))  # before the GPU is touched
    grids = opts.get("--grids-only", "0")  # 1: the launch shapes alone, no energy window
    if grids not in ("0", "1"):
        sys.exit(f"record_step_shapes: --grids-only is 0 or 1, got {grids!r}")
    graphs = opts.get("--graphs", "0")  # 1: each step captured in a CUDA graph and replayed
    if graphs not in ("0", "1"):
        sys.exit(f"record_step_shapes: --graphs is 0 or 1, got {graphs!r}")
    out.mkdir(parents=True, exist_ok=True)
    if grids == "1":
        grids_only(names, out)
        return
    t0 = time.perf_counter()
    sampler = NvmlSampler(torch.cuda.current_device(), 0.01, t0)
    sampler.start()
    results = {"gpu": sampler.info(), "torch": torch.__version__, "warmup_s": warmup_s, "shapes": []}
    with gzip.open(out / "steps_kernels.csv.gz", "wt", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(KERNEL_COLUMNS)
        for name in names:
            build = graphed(SHAPES[name]) if graphs == "1" else SHAPES[name]
            if time.perf_counter() - t0 + warmup_s + window_s + 15 > budget_s:
                print(f"skipped {name}: budget", flush=True)
                continue
            try:
                summary, kernels = measure(name, build, warmup_s, window_s, sampler)
            except Exception as error:
                summary, kernels = {"shape": name, "error": repr(error)}, []
            writer.writerows((name, n, round(s, 3), round(d, 3), *rest) for n, s, d, *rest in kernels)
            results["shapes"].append(summary)
            (out / "steps_summary.json").write_text(json.dumps(results, indent=2) + "\n")
            print(json.dumps({k: summary.get(k) for k in ("shape", "step_s", "energy_per_step_j", "power_mean_w",
                  "sm_mhz_median", "gpu_busy_share", "throttle_share_any_but_idle", "error")}), flush=True)  # fmt: skip
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    sampler.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
