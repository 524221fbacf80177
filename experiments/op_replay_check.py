"""Are the rebuilt ops the step's own kernels? Each op of a training step, rebuilt alone, timed.

    python -m kdvfs.experiments.op_replay_check [--out DIR] [--device cuda]

Read-only: stock clocks, no setting changed. The step is the GPT-3-XL block of the H200
probe (experiments/h200_validation.py `Training`: d 2048, 16 heads, batch 8 x 1024, bf16
autocast, AdamW). runtime/op_replay.py records its outermost aten ops with their shapes,
dtypes and strides over 3 steps (torch.profiler, record_shapes), rebuilds each on random
inputs and times it back to back (CUDA events). Per op: its time alone against its kernels'
time inside the step. Prints JSON: how many ops were rebuilt and what share of the step's
device time they hold, the median ratio (alone / in step) and its spread (10th-90th
percentile, weighted and unweighted), the ops furthest off; DIR/op_replay.csv has every op.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from pathlib import Path

import numpy as np
import torch

from kdvfs.experiments.h200_validation import Training
from kdvfs.runtime.op_replay import rebuild, record_ops, time_rebuilt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None, help="also write DIR/op_replay.csv")
    p.add_argument("--device", default="cuda", help="cuda (the real check) or cpu (a smoke run)")
    p.add_argument("--d-model", type=int, default=2048, help="the block's width")
    p.add_argument("--batch", type=int, default=8, help="sequences per step")
    p.add_argument("--seq", type=int, default=1024, help="tokens per sequence")
    args = p.parse_args(argv)

    cuda = args.device.startswith("cuda")
    training = Training("cuda" if cuda else "cpu", args.d_model, 16, args.batch, args.seq)
    ops = record_ops(training.step, steps=3, warmup=5, cuda=cuda)
    rows = []
    for op in ops:
        fn = rebuild(op, args.device)
        alone_s = time_rebuilt(fn, args.device) if fn is not None and op.device_time_s > 0 else None
        rows.append(
            {
                "position": op.position,
                "op": op.name,
                "shapes": json.dumps(op.shapes),
                "dtypes": json.dumps(op.dtypes),
                "in_step_us": op.device_time_s * 1e6,
                "alone_us": None if alone_s is None else alone_s * 1e6,
                "ratio": None if alone_s is None else alone_s / op.device_time_s,
                "rebuilt": fn is not None,
            }
        )
        del fn
    timed = [r for r in rows if r["ratio"] is not None]
    total_us = sum(r["in_step_us"] for r in rows)
    ratios = np.array([r["ratio"] for r in timed])
    weights = np.array([r["in_step_us"] for r in timed])
    order = np.argsort(ratios)
    cumulative = np.cumsum(weights[order]) / weights.sum()
    summary = {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "source": "measured on a real GPU (stock clocks, read-only)"
        if cuda
        else "measured on the CPU (smoke run)",
        "ops": len(rows),
        "ops_with_device_time": sum(r["in_step_us"] > 0 for r in rows),
        "rebuilt": sum(r["rebuilt"] for r in rows),
        "timed": len(timed),
        "share_of_step_device_time_timed": sum(r["in_step_us"] for r in timed) / total_us
        if total_us
        else 0.0,
        "step_device_time_us": total_us,
        "ratio_alone_to_in_step": {
            "median": float(np.median(ratios)),
            "p10": float(np.percentile(ratios, 10)),
            "p90": float(np.percentile(ratios, 90)),
            "time_weighted_median": float(ratios[order][np.searchsorted(cumulative, 0.5)]),
            "time_weighted_p10": float(ratios[order][np.searchsorted(cumulative, 0.1)]),
            "time_weighted_p90": float(ratios[order][min(np.searchsorted(cumulative, 0.9), len(order) - 1)]),
        },
        "furthest_off": sorted(
            ({k: r[k] for k in ("position", "op", "in_step_us", "alone_us", "ratio")} for r in timed),
            key=lambda r: -abs(np.log(r["ratio"])),
        )[:10],
        "not_rebuilt": sorted({r["op"] for r in rows if not r["rebuilt"]}),
        "median_in_step_us": statistics.median(r["in_step_us"] for r in rows) if rows else 0.0,
    }
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        with (args.out / "op_replay.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
