"""A data-parallel job under kdvfs.tune, dry run: every rank tunes its own GPU, readings pooled.

    python3 -m torch.distributed.run --standalone --nproc-per-node N \\
        -m kdvfs.experiments.ddp_tune_check --out $OUT [--seconds 300]

NO clock, power-limit, persistence, compute-mode or MIG change is made: each rank opens its
own card as NvmlDevice(nvml_index(its CUDA device), dry_run=True), which records the clock
calls it would make. The job is h200_validation's GPT-3-XL block wrapped in
DistributedDataParallel (NCCL when every rank has a GPU of its own, else gloo), trained step
after step by every rank in lockstep: `--settle-s` bare, `--bare-s` bare, `--seconds` through
kdvfs.tune with the ranks' readings pooled (TorchRankPool over a gloo group of its own: the
controller thread gathers while DDP's collectives run on the training thread), `--bare-s`
bare again. Rank 0 decides when each timed loop ends (a flag all-reduced every block), so
every rank runs the same steps. Each rank writes rank<R>.json; rank 0 gathers them and
prints the JSON of the run:
- `ranks`: each rank's NVML index and UUID (each must be its own card), overhead against the
  mean of its bare runs, the null test (tune_job_check.null_figures), its dry-run calls;
- `identical_decisions`: every rank's clock calls and adoptions the same;
- `pooling`: the energy per step over `NOISE_WINDOW_S` windows (the trainer's counter windows,
  aligned by step), its CV on one rank against the CV of the ranks' mean: what pooling n ranks
  narrows (ranks on one card share one counter, so they narrow nothing: `shared_cards`).
Without a GPU (`--device cpu`, small sizes) it runs against the fake NVML:
KDVFS_NVML_MODULE=fake_pynvml PYTHONPATH=.:tests/runtime KDVFS_FAKE_NVML_GPU_COUNT=N.
Results: docs/gpu-validation.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from kdvfs.experiments.h200_validation import Training
from kdvfs.experiments.tune_job_check import BLOCK_STEPS, SMOKE_TIMING, null_figures
from kdvfs.runtime.distributed import TorchRankPool, nvml_index
from kdvfs.runtime.nvml_device import NvmlDevice
from kdvfs.tuner.job_tuning import tune

#: Length of the windows the pooling figure compares (whole counter windows summed); s.
NOISE_WINDOW_S = 2.0
#: How long a rank waits for the others in the pool's gather before it gives up; s.
POOL_TIMEOUT_S = 120.0


def agreed_blocks(
    training: Training, seconds: float, step: Callable[[], None], block_steps: int
) -> list[float]:
    """Time per step (s) of each block of block_steps steps; rank 0's clock ends the loop
    (every rank runs the same blocks, as DDP's collectives need)."""
    per_step: list[float] = []
    stop = torch.zeros(1, device=training.device)
    training.sync()
    end_s = time.perf_counter() + seconds
    while True:
        t0 = time.perf_counter()
        for _ in range(block_steps):
            step()
        training.sync()
        per_step.append((time.perf_counter() - t0) / block_steps)
        stop.fill_(float(dist.get_rank() == 0 and time.perf_counter() >= end_s))
        dist.all_reduce(stop)
        if stop.item() > 0:
            return per_step


def window_energies(windows: list[Any], steps_per_window: int) -> dict[int, float]:
    """Energy per step (J) of consecutive counter windows summed to about steps_per_window
    steps, keyed by their first step (full windows only)."""
    out: dict[int, float] = {}
    chunk: list[Any] = []
    for w in (w for w in windows if not w.partial):
        chunk.append(w)
        steps = sum(c.steps for c in chunk)
        if steps >= steps_per_window:
            out[chunk[0].first_step] = sum(c.energy_j for c in chunk) / steps
            chunk = []
    return out


def pooling_figures(per_rank: list[dict[int, float]]) -> dict[str, Any]:
    """One rank's window CV against the CV of the ranks' mean, over the windows every rank has."""
    common = sorted(set.intersection(*(set(r) for r in per_rank)))
    if len(common) < 3:
        return {"windows": len(common), "note": "too few common windows"}

    def cv(values: list[float]) -> float:
        return statistics.stdev(values) / statistics.fmean(values)

    single = [cv([r[k] for k in common]) for r in per_rank]
    pooled = cv([statistics.fmean(r[k] for r in per_rank) for k in common])
    return {
        "windows": len(common),
        "single_rank_cv": single,
        "pooled_cv": pooled,
        "narrowing": pooled / statistics.fmean(single),
        "independent_expectation": len(per_rank) ** -0.5,
    }


def tuned(
    args: argparse.Namespace, training: Training, gpu: NvmlDevice
) -> tuple[list[float], dict[str, Any]]:
    pool_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=POOL_TIMEOUT_S))
    tuning = tune(
        training.model,
        training.optimizer,
        budget=args.budget,
        strategy=args.strategy,
        device=gpu,
        dry_run=True,
        out_dir=args.out / f"tune-rank{dist.get_rank()}",
        plan_store=False,
        track=False,
        pool=TorchRankPool(pool_group),
        **({"timing": SMOKE_TIMING, "warmup_s": 1.0} if args.smoke else {}),
    )

    def step() -> None:
        with tuning.step():
            training.step()

    with tuning:
        per_step = agreed_blocks(training, args.seconds, step, args.block_steps)
    summary = tuning.summary()
    summary["energy_windows"] = window_energies(tuning.trainer.windows, args.noise_steps)
    return per_step, summary


def rank_report(args: argparse.Namespace) -> dict[str, Any]:
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(local % torch.cuda.device_count())
    training = Training(args.device, d_model=args.d_model, heads=args.heads, batch=args.batch, seq=args.seq)
    training.model = DistributedDataParallel(
        training.model, device_ids=[torch.cuda.current_device()] if cuda else None
    )
    index = nvml_index() if cuda else local
    with NvmlDevice(index, dry_run=True) as gpu:
        agreed_blocks(training, args.settle_s, training.step, args.block_steps)
        bare_a = agreed_blocks(training, args.bare_s, training.step, args.block_steps)
        tuned_blocks, summary = tuned(args, training, gpu)
        bare_b = agreed_blocks(training, args.bare_s, training.step, args.block_steps)
        calls = [[name, list(a)] for _, name, a in gpu.calls]
        uuid = gpu.uuid
    bare_s = statistics.fmean([*bare_a, *bare_b])
    tuned_s = statistics.fmean(tuned_blocks)
    return {
        "rank": rank,
        "world": world,
        "cuda_device": torch.cuda.current_device() if cuda else None,
        "nvml_index": index,
        "uuid": uuid,
        "overhead": {
            "bare_ms_per_step": [round(1e3 * statistics.fmean(b), 4) for b in (bare_a, bare_b)],
            "tuned_ms_per_step": round(1e3 * tuned_s, 4),
            "overhead": tuned_s / bare_s - 1.0,
            "bare_block_cv": statistics.stdev([*bare_a, *bare_b]) / bare_s,
        },
        "null_test": null_figures(summary),
        "phases": summary["phases"],
        "steps": summary["steps"],
        "window_energy_cv": summary["window_energy_cv"],
        "dry_run_calls": calls,
        "last_call": calls[-1][0] if calls else None,
        "adoptions": summary["adoptions"],
        "energy_windows": summary["energy_windows"],
        "tuner_error": summary["tuner_error"],
    }


def run_report(reports: list[dict[str, Any]]) -> dict[str, Any]:
    uuids = [r["uuid"] for r in reports]
    return {
        "source": "measured on a real GPU (dry run: no clock applied)"
        if reports[0]["cuda_device"] is not None
        else "CPU ranks against the fake NVML (no GPU)",
        "world": len(reports),
        "shared_cards": len(set(uuids)) < len(uuids),
        "identical_decisions": all(
            r["dry_run_calls"] == reports[0]["dry_run_calls"] and r["adoptions"] == reports[0]["adoptions"]
            for r in reports
        ),
        "stock_at_end_on_every_rank": all(
            r["last_call"] is None or r["last_call"].startswith("nvmlDeviceReset") for r in reports
        ),
        "pooling": pooling_figures([{int(k): v for k, v in r["energy_windows"].items()} for r in reports]),
        "ranks": [
            {k: v for k, v in r.items() if k not in ("dry_run_calls", "energy_windows")} for r in reports
        ],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "ddp-tune-check")))
    p.add_argument("--seconds", type=float, default=310.0, help="training through kdvfs.tune, s")
    p.add_argument("--bare-s", type=float, default=40.0, help="each bare run, s")
    p.add_argument("--settle-s", type=float, default=30.0, help="bare training before anything is timed, s")
    p.add_argument("--budget", type=float, default=0.01, help="allowed slowdown, fraction")
    p.add_argument("--strategy", default="botorch")
    p.add_argument("--block-steps", type=int, default=BLOCK_STEPS, help="steps per timed block")
    p.add_argument("--noise-steps", type=int, default=300, help="steps per pooling window (~NOISE_WINDOW_S)")
    p.add_argument("--smoke", action="store_true", help="the tuner's windows shortened (a CPU check)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: gloo ranks, the fake NVML")
    p.add_argument("--d-model", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s rank {os.environ.get('RANK', 0)}: %(message)s"
    )
    logging.getLogger("kdvfs.runtime.nvml_device").setLevel(logging.DEBUG)  # every dry-run call on record
    logging.info("pid %d", os.getpid())
    args.out.mkdir(parents=True, exist_ok=True)
    own_gpus = args.device == "cuda" and torch.cuda.device_count() >= int(os.environ.get("WORLD_SIZE", "1"))
    dist.init_process_group("nccl" if own_gpus else "gloo")
    try:
        report = rank_report(args)
        (args.out / f"rank{report['rank']}.json").write_text(json.dumps(report, indent=1) + "\n")
        reports: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(reports, report)
        dist.barrier()  # no rank tears gloo down while another is still in the gather (SIGABRT)
    finally:
        dist.destroy_process_group()
    if report["rank"] == 0:
        text = json.dumps(run_report(reports), indent=1)
        (args.out / "ddp_tune_check.json").write_text(text + "\n")
        print(text)
    return 0


if __name__ == "__main__":
    code = main()
    # every output is written and flushed: leave without the interpreter's teardown, where a
    # gloo thread still alive at exit aborted a rank now and then on a loaded machine (SIGABRT,
    # "terminate called without an active exception"), after its figures were all on disk
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)
