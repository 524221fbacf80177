"""The `main` of an experiment that parses its Args, measures, and prints JSON: one line
`PROG: error: ...` and exit 2 for a KdvfsError (bad input named by the experiment), exit 0
with the JSON otherwise. Shared by window_bias, thermal_carryover, stock_warming,
release_gain and in_step_truth; `parse_floats` reads their comma-separated numbers."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from kdvfs.experiments.record_job import parse_fields
from kdvfs.runtime.types import KdvfsError


def json_main(
    args_cls: type, argv: list[str] | None, prog: str, doc: str, measure: Callable[[Any], dict]
) -> None:
    """Parse argv (None: sys.argv[1:]) onto args_cls (parse_fields), print measure(args) as
    JSON; a KdvfsError it raises is one line on stderr naming `prog`, exit 2."""
    args = parse_fields(args_cls, sys.argv[1:] if argv is None else argv, prog, doc)
    try:
        doc_out = measure(args)
    except KdvfsError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print(json.dumps(doc_out, indent=2))


def parse_floats(text: str, name: str, what: str) -> list[float]:
    """The comma-separated numbers of option --NAME (at least one; each caller checks their
    range); text that is not is a KdvfsError `--NAME must be WHAT, got TEXT`."""
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise KdvfsError(f"--{name} must be {what}, got {text!r}") from None
