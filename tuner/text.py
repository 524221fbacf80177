"""Wording and identity shared by the library and the command line (stdlib only at import time).

- `pct`, `slowdown_text`: how a saving or a slowdown reads;
- `plan_json`: a kernel-level choice as JSON;
- `SOURCE_LABEL`: how the figures of a simulated, replayed or measured card are labelled;
- `PRIORS`: the names of what a run may start from, as its options and its figures say them;
- `run_identity`: the params and tags that make MLflow runs comparable.
"""

from __future__ import annotations

from typing import Any

SOURCE_LABEL = {
    "simulated": "simulated",
    "replayed": "replayed from recorded data",
    "measured": "measured on a real GPU",
}

#: What a run may start from: its card's noiseless model's plan ("model"), or nothing ("none").
PRIORS = ("model", "none")


def pct(x: float) -> str:
    """`+1.23%`; a value that rounds to zero prints as +0.00%, never -0.00%."""
    return f"{100.0 * x if abs(x) >= 5e-5 else 0.0:+.2f}%"


def slowdown_text(x: float) -> str:
    """`slowdown +0.42%`, or `slowdown -0.10% (faster than stock)` for a negative one."""
    return f"slowdown {pct(x)}" + (" (faster than stock)" if x <= -5e-5 else "")


def plan_json(choice) -> dict[str, Any]:
    """{kernel: [core_mhz, mem_mhz]}, or "stock" for a kernel left at the card's auto mode."""
    return {k: "stock" if p is None else p.as_list() for k, p in choice.items()}


def run_identity(device, workload) -> dict[str, str]:
    """What makes MLflow runs comparable, as params and tags of every command's runs: GPU
    name, clock grid, source (simulated, replayed, measured), workload signature, kdvfs version."""
    from kdvfs import __version__
    from kdvfs.tuner.plan import describe_grid

    return {
        "gpu": device.name,
        "clock_grid": describe_grid(device.grid),
        "source": device.source,
        "workload_signature": workload.signature,
        "kdvfs_version": __version__,
    }
