"""`kdvfs demo`: the main job on the simulated GPU: `kdvfs tune` on the RTX 3080 Ti with the
GPT-3-XL layer for 10 minutes of simulated training, the realisable oracle beside it, the run
in MLflow."""

from __future__ import annotations

import argparse
from pathlib import Path

from kdvfs.cli.commands._common import nonnegative_int

DEMO = [
    "tune",
    "--device",
    "sim:rtx3080ti",
    "--workload",
    "gpt3-xl-layer",
    "--strategy",
    "botorch",
    "--budget",
    "0.01",
    "--seconds",
    "600",
    "--plan-out",
    "kdvfs-demo-plan.json",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=nonnegative_int, default=0)
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write machine-readable results here")


def run(args: argparse.Namespace) -> int:
    from kdvfs.cli import main

    print("kdvfs demo: " + " ".join(["kdvfs", *DEMO]))
    return main([*DEMO, "--seed", str(args.seed), *(["--json", str(args.json)] if args.json else [])])
