"""Record the ops of a training step to a file, for `kdvfs sweep --device nvml:N --workload ops:FILE`.

    python -m kdvfs.experiments.record_step_ops --out FILE [--device cuda] [--d-model 2048 ...]

Read-only: stock clocks, no setting changed. The step is a GPT block (experiments/h200_validation.py
`Training`: bf16 autocast, AdamW; by default the GPT-3-XL block of the H200 probe, d 2048, 16
heads, batch 8 x 1024; --d-model 256 --batch 4 --seq 128 is a small one). runtime/op_replay.py
records its outermost aten ops with shapes, dtypes, strides and in-step device times over 3
steps (torch.profiler) and save_ops writes them; prints JSON: ops, their passes, the step's
device time.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

from kdvfs.experiments.h200_validation import Training
from kdvfs.runtime.op_replay import record_ops, save_ops


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="the recording file to write (JSON)")
    p.add_argument("--device", default="cuda", help="cuda (a real GPU) or cpu (a smoke run)")
    p.add_argument("--d-model", type=int, default=2048, help="the block's width")
    p.add_argument("--heads", type=int, default=16, help="attention heads")
    p.add_argument("--batch", type=int, default=8, help="sequences per step")
    p.add_argument("--seq", type=int, default=1024, help="tokens per sequence")
    args = p.parse_args(argv)

    cuda = args.device.startswith("cuda")
    training = Training("cuda" if cuda else "cpu", args.d_model, args.heads, args.batch, args.seq)
    ops = record_ops(training.step, steps=3, warmup=5, cuda=cuda)
    about = f"GPT block d {args.d_model}, {args.heads} heads, batch {args.batch} x {args.seq}, bf16 autocast, AdamW"
    save_ops(ops, args.out, device="cuda" if cuda else "cpu", about=about)
    print(
        json.dumps(
            {
                "out": str(args.out),
                "about": about,
                "ops": len(ops),
                "passes": dict(collections.Counter(op.pass_name for op in ops)),
                "step_time_us": sum(op.device_time_s for op in ops) * 1e6,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
