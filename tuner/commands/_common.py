"""Arguments and output shared by the subcommands (stdlib only at import time)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

SOURCE_LABEL = {
    "simulated": "simulated",
    "replayed": "replayed from recorded data",
    "measured": "measured on a real GPU",
}


def add_device_workload(parser: argparse.ArgumentParser, default_device: str = "sim:rtx3080ti") -> None:
    parser.add_argument(
        "--device", default=default_device, help="sim:PRESET | replay:CSV (default %(default)s)"
    )
    parser.add_argument(
        "--workload", default="gpt3-xl-layer", help="gpt3-xl-layer | trace:CSV | table (default %(default)s)"
    )
    parser.add_argument(
        "--full-grid",
        action="store_true",
        help="search every supported clock pair, not the preset's default grid",
    )
    parser.add_argument(
        "--noise",
        type=nonnegative_float,
        default=None,
        help="measurement-noise scale (default: the device's)",
    )
    parser.add_argument("--seed", type=nonnegative_int, default=0)


def add_budget(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--budget",
        type=_budget,
        default=0.01,
        help="allowed slowdown of the iteration, e.g. 0.01 (default %(default)s)",
    )


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write machine-readable results here")


def positive_int(text: str) -> int:
    """argparse type: a whole number > 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def nonnegative_int(text: str) -> int:
    """argparse type: a whole number >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    value = _finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value:g}")
    return value


def nonnegative_float(text: str) -> float:
    """argparse type: a finite number >= 0."""
    value = _finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value:g}")
    return value


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def _budget(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"budget must be a number, got {text!r}") from None
    if not math.isfinite(value) or not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"budget must be in [0, 1), got {value}")
    return value


def open_from_args(args: argparse.Namespace):
    """(device, workload) named by --device/--workload."""
    from kdvfs.runtime.device import RunnableDevice
    from kdvfs.runtime.registry import open_device, open_workload
    from kdvfs.runtime.types import KdvfsError

    device = open_device(args.device, seed=args.seed, noise=args.noise, full_grid=args.full_grid)
    if not isinstance(device, RunnableDevice):
        raise KdvfsError(
            f"{args.command} runs kernels itself: it needs a sim: or replay: device, not {args.device!r}"
        )
    return device, open_workload(args.workload, device)


def write_json(path: Path | None, payload: dict[str, Any]) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {path}", file=sys.stderr)


def pct(x: float) -> str:
    return f"{100.0 * x:+.2f}%"


def plan_json(choice) -> dict[str, Any]:
    """{kernel: [core_mhz, mem_mhz]}, or "stock" for a kernel left at the card's auto mode."""
    return {k: "stock" if p is None else p.as_list() for k, p in choice.items()}
