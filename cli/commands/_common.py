"""Arguments and output shared by the subcommands (stdlib only at import time).

- argparse types (positive_int, noise_scale, ...) and the shared options (add_device_workload,
  add_budget, add_json);
- outputs: check_file_output / check_dir_output before any work, write_json (atomic),
  write_all (every output whatever the others do), deferred_interrupts;
- Phases: how a command is interrupted (one line, JSON marked partial, KILLED, exit 130).

Wording shared with the library (pct, slowdown_text, plan_json, SOURCE_LABEL) and run_identity
are in tuner/text.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def add_device_workload(parser: argparse.ArgumentParser, default_device: str = "sim:rtx3080ti") -> None:
    parser.add_argument(
        "--device",
        default=default_device,
        help="sim:PRESET | replay:CSV | nvml:INDEX (sweep, with --workload ops:FILE) (default %(default)s)",
    )
    parser.add_argument(
        "--workload",
        default="gpt3-xl-layer",
        help="gpt3-xl-layer | trace:CSV | table | ops:FILE (default %(default)s)",
    )
    parser.add_argument(
        "--full-grid",
        action="store_true",
        help="search every supported clock pair, not the preset's default grid",
    )
    parser.add_argument(
        "--noise",
        type=noise_scale,
        default=None,
        help=f"measurement-noise scale, 0 to {MAX_NOISE_SCALE:g} (default: the device's)",
    )
    parser.add_argument("--seed", type=nonnegative_int, default=0)


def add_budget(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--budget",
        type=_budget,
        default=0.01,
        help="allowed slowdown of the step, e.g. 0.01 (default %(default)s)",
    )


def add_mlflow(parser: argparse.ArgumentParser) -> None:
    """--mlflow-uri URI and --no-mlflow, the same for every command that logs a run."""
    parser.add_argument(
        "--mlflow-uri",
        default=None,
        help="tracking URI (default: MLFLOW_TRACKING_URI, else MLflow's default ./mlflow.db)",
    )
    parser.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write machine-readable results here")


def positive_int(text: str) -> int:
    """argparse type: a whole number > 0."""
    value = _whole(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None


def nonnegative_int(text: str) -> int:
    """argparse type: a whole number >= 0."""
    value = _whole(text)
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


MAX_NOISE_SCALE = 20.0  # x the device's own measurement noise: beyond it no measurement means anything


def noise_scale(text: str) -> float:
    """argparse type: a measurement-noise scale, 0 (noiseless) to MAX_NOISE_SCALE x the device's.
    A scale in the thousands made one in-training trial never settle (found by the hostile-input
    test: `--noise 4979` ran past its 60-s case limit)."""
    value = nonnegative_float(text)
    if value > MAX_NOISE_SCALE:
        raise argparse.ArgumentTypeError(
            f"must be at most {MAX_NOISE_SCALE:g} (x the device's noise), got {value:g}"
        )
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
    """Write the JSON document atomically (a temporary file beside it, then a rename)."""
    if path is None:
        return
    from kdvfs.runtime.types import KdvfsError

    text = json.dumps(payload, indent=2, default=str) + "\n"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise KdvfsError(f"{path}: cannot write ({exc.strerror or exc})") from None
    print(f"wrote {path}", file=sys.stderr)


def check_file_output(path: Path | None, option: str) -> None:
    """KdvfsError unless `path` can be written (checked before any work, so nothing is lost)."""
    if path is None:
        return
    from kdvfs.runtime.types import KdvfsError

    if path.is_dir():
        raise KdvfsError(f"{option} {path}: is a directory, not a file")
    if path.exists() and not os.access(path, os.W_OK):
        raise KdvfsError(f"{option} {path}: not writable (permission denied)")
    _check_creatable_in(path.parent, option, path)


def check_dir_output(path: Path | None, option: str) -> None:
    """KdvfsError unless `path` is (or can be made) a directory this user writes in."""
    if path is None:
        return
    from kdvfs.runtime.types import KdvfsError

    if path.exists():
        if not path.is_dir():
            raise KdvfsError(f"{option} {path}: not a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise KdvfsError(f"{option} {path}: not writable (permission denied)")
        return
    _check_creatable_in(path.parent, option, path)


def _check_creatable_in(folder: Path, option: str, path: Path) -> None:
    """The nearest existing ancestor of `folder` must be a directory this user writes in."""
    from kdvfs.runtime.types import KdvfsError

    ancestor = folder.absolute()
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise KdvfsError(f"{option} {path}: {ancestor} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise KdvfsError(f"{option} {path}: cannot create files in {ancestor} (permission denied)")


def write_all(outputs: list[tuple[str, Callable[[], None]]]) -> int:
    """Run each output step whatever the others do; a failure is one stderr line. Returns
    how many failed. Ctrl-C/SIGTERM meanwhile does not stop them."""
    from kdvfs.runtime.types import KdvfsError

    failed = 0
    with deferred_interrupts():
        for label, write in outputs:
            try:
                write()
            except (KdvfsError, OSError) as exc:
                failed += 1
                print(f"kdvfs: {label} not written: {exc}", file=sys.stderr)
    return failed


class Phases:
    """Which phase a command is in, and whether Ctrl-C/SIGTERM cut it short: the one way
    every command keeps what it has when interrupted (JSON marked partial, MLflow run KILLED,
    exit 130).

    Args:
        command: the subcommand's name, for the interruption line.
    """

    def __init__(self, command: str) -> None:
        self.command = command
        self.now = "starting"
        self.interrupted = False

    def enter(self, phase: str) -> None:
        """The command now does `phase` (plain words: "measuring every clock pair")."""
        self.now = phase

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """Ctrl-C/SIGTERM inside the block ends the block, not the command: one line names the
        phase, and the command goes on to write what it has."""
        try:
            yield
        except KeyboardInterrupt:
            self.interrupted = True
            print(
                f"kdvfs {self.command}: interrupted while {self.now}: what was measured so far is kept",
                file=sys.stderr,
            )

    @property
    def run_status(self) -> str:
        """The MLflow status of the command's runs: KILLED when interrupted, else FINISHED."""
        return "KILLED" if self.interrupted else "FINISHED"

    def mark(self, doc: dict[str, Any]) -> dict[str, Any]:
        """`doc` with "partial" (and, when interrupted, "interrupted_while": the phase)."""
        doc["partial"] = self.interrupted
        if self.interrupted:
            doc["interrupted_while"] = self.now
        return doc

    def exit_status(self, failed_outputs: int = 0) -> int:
        """130 when interrupted, else 2 when an output failed, else 0."""
        if self.interrupted:
            return 130
        return 2 if failed_outputs else 0


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Ignore SIGINT/SIGTERM while the block runs (one line says so): outputs are written whole."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []

    def hold(signum: int, frame: object) -> None:
        if not caught:
            print("kdvfs: interrupt received: finishing writing the outputs first", file=sys.stderr)
        caught.append(signum)

    previous = {sig: signal.signal(sig, hold) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
