"""The `kdvfs` command line.

Each subcommand lives in tuner/commands/<name>.py with `add_arguments(parser)` and
`run(args) -> int`. Those modules import only the standard library at top level, so that
`kdvfs --help` and usage errors answer at once; torch, BoTorch and MLflow are imported inside
run() of the commands that need them.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from kdvfs.runtime.types import KdvfsError

COMMANDS: dict[str, str] = {
    "sweep": "full sweep of every clock pair of every kernel: the baseline plan and its cost",
    "calibrate": "simulated card in auto mode against a probe of a real card",
    "compare": "search strategies against the full sweep",
    "tune": "tune clocks online during a (simulated) training run",
    "demo": "run the main job on the simulated GPU (what `make demo` runs)",
    "plan": "show, diff or validate a plan file",
    "doctor": "what this machine's GPUs allow (read-only)",
    "probe": "read-only stock-clock measurements of reference kernels on a real GPU",
    "agent": "the root clock agent that locks clocks for unprivileged jobs, and its clients",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kdvfs",
        description="Per-kernel GPU clock tuning: least energy within a slowdown budget.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        module = _command_module(name)
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(p)
    return parser


def _command_module(name: str):
    return importlib.import_module(f"kdvfs.tuner.commands.{name}")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    try:
        return int(_command_module(args.command).run(args) or 0)
    except KdvfsError as exc:
        print(f"kdvfs {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"kdvfs {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
