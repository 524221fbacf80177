"""`kdvfs demo`: the main job on the simulated RTX 3080 Ti with the GPT-3-XL layer."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    from kdvfs.tuner.commands import sweep

    sweep_args = argparse.Namespace(
        command="sweep", device="sim:rtx3080ti", workload="gpt3-xl-layer", full_grid=False, noise=None,
        seed=args.seed, budget=0.01, json=None, window_s=1.0, table=True,
    )
    return sweep.run(sweep_args)
