"""Arguments and output shared by the subcommands (stdlib only at import time).

- argparse types (positive_int, noise_scale, ...) and the shared options (add_device_workload,
  add_budget, add_json);
- outputs: check_outputs (each writable, no two the same, none an input) before any work,
  write_json (atomic), write_all (every output whatever the others do; a closed stdout pipe
  is not a failed output), deferred_interrupts;
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
        help="gpt3-xl-layer | gpt3-xl | gpt3-xl-dp8[:link_gbs=N] | trace:CSV | step:DIR:SHAPE (a recorded whole "
        "step) | table | ops:FILE (default %(default)s)",
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


MAX_DURATION_S = 1e7  # s (about 116 days): the longest duration an option takes


def duration_s(text: str) -> float:
    """argparse type: a duration in seconds, a finite number > 0 and at most MAX_DURATION_S."""
    return _at_most_max_duration(positive_float(text))


def nonnegative_duration_s(text: str) -> float:
    """argparse type: a duration in seconds, a finite number >= 0 and at most MAX_DURATION_S."""
    return _at_most_max_duration(nonnegative_float(text))


def _at_most_max_duration(value: float) -> float:
    if value > MAX_DURATION_S:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_DURATION_S:g} s, got {value:g} s")
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
    tmp = path.with_name(f".{path.name[:TEMP_NAME_KEEP]}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise KdvfsError(f"{path}: cannot write ({exc.strerror or exc})") from None
    print(f"wrote {path}", file=sys.stderr)


#: How much longer than an output's name the name of the temporary file written beside it may
#: be (tuner.plan.save_plan: "." + name + "." + 8 random characters + ".tmp").
TEMP_NAME_EXTRA = 24
#: write_json keeps this many characters of the name in its temporary file's name.
TEMP_NAME_KEEP = 100
#: Kernel interfaces, not folders: a file "created" there is refused only when written.
_PSEUDO_FILESYSTEMS = (Path("/proc"), Path("/sys"))


def check_strategy(name: str) -> None:
    """A search strategy's name the registry knows; else one line naming the known ones."""
    from kdvfs.policies.registry import STRATEGIES
    from kdvfs.runtime.types import KdvfsError

    if name not in STRATEGIES:
        raise KdvfsError(f"unknown strategy {name!r} (known: {', '.join(STRATEGIES)})")


def check_outputs(
    args: argparse.Namespace,
    files: dict[str, Path | None],
    dirs: dict[str, Path | None] | None = None,
) -> None:
    """Before any work: every output can be written where it will be written, no two outputs
    are the same file, none is one of the command's inputs, and no file output lies inside a
    directory output. `files` and `dirs` map each option (e.g. "--json") to its path.

    Raises:
        KdvfsError: one line naming the option (and, for a clash, both options).
    """
    from kdvfs.runtime.types import KdvfsError

    dirs = dirs or {}
    for option, path in files.items():
        check_file_output(path, option)
    for option, path in dirs.items():
        check_dir_output(path, option)
    outputs = [(option, path) for option, path in [*files.items(), *dirs.items()] if path is not None]
    for i, (option, path) in enumerate(outputs):
        for other_option, other in outputs[i + 1 :]:
            if same_file(path, other):
                raise KdvfsError(
                    f"{option} and {other_option} are the same file ({path}): one would overwrite the other"
                )
    for option, path in outputs:
        for input_option, source in input_paths(args):
            if same_file(path, source):
                raise KdvfsError(
                    f"{option} {path} is the input of {input_option}: writing it would destroy the input"
                )
    for dir_option, folder in dirs.items():
        if folder is None:
            continue
        for option, path in files.items():
            if path is not None and folder.resolve() in path.resolve().parents:
                raise KdvfsError(
                    f"{option} {path} lies inside {dir_option} {folder}: the command writes there itself"
                )


def input_paths(args: argparse.Namespace) -> list[tuple[str, Path]]:
    """The files a command reads, each with its option: replay:CSV, trace:CSV, ops:FILE,
    --against, --token-file, a --job-noise file, a plan argument, a --db sqlite file."""
    found: list[tuple[str, Path]] = []
    for option, attr in (("--device", "device"), ("--workload", "workload")):
        value = getattr(args, attr, None)
        if isinstance(value, str):
            for prefix in ("replay:", "trace:", "ops:"):
                if value.startswith(prefix) and value[len(prefix) :]:
                    found.append((option, Path(value[len(prefix) :])))
    for option, attr in (
        ("--against", "against"),
        ("--token-file", "token_file"),
        ("--job-noise", "job_noise"),
        ("PLAN", "plan"),
        ("A", "first"),
        ("B", "second"),
    ):
        value = getattr(args, attr, None)
        if isinstance(value, (str, Path)) and str(value):
            found.append((option, Path(value)))
    db = getattr(args, "db", None)
    if isinstance(db, str) and db.startswith("sqlite:///") and db[len("sqlite:///") :]:
        found.append(("--db", Path(db[len("sqlite:///") :])))
    return found


def same_file(a: Path, b: Path) -> bool:
    """Whether paths `a` and `b` name one file (resolved, or the same inode where both exist)."""
    try:
        if a.resolve() == b.resolve():
            return True
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except (OSError, RuntimeError, ValueError):
        return False


def check_file_output(path: Path | None, option: str) -> None:
    """KdvfsError unless `path` can be written (checked before any work, so nothing is lost)."""
    if path is None:
        return
    from kdvfs.runtime.types import KdvfsError

    _check_not_pseudo(path, option)
    _check_name_lengths(path, option)
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

    _check_not_pseudo(path, option)
    _check_name_lengths(path, option)
    if path.exists():
        if not path.is_dir():
            raise KdvfsError(f"{option} {path}: not a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise KdvfsError(f"{option} {path}: not writable (permission denied)")
        _check_creatable_in(path, option, path / "x.json")
        return
    _check_creatable_in(path.parent, option, path)


def _check_not_pseudo(path: Path, option: str) -> None:
    from kdvfs.runtime.types import KdvfsError

    try:
        resolved = path.resolve()
    except (OSError, RuntimeError) as exc:
        raise KdvfsError(f"{option} {path}: cannot resolve the path ({exc})") from None
    for pseudo in _PSEUDO_FILESYSTEMS:
        if resolved == pseudo or pseudo in resolved.parents:
            raise KdvfsError(f"{option} {path}: {pseudo} is a kernel interface, not a place for files")


def _existing_ancestor(folder: Path) -> Path:
    """`folder` itself or its nearest ancestor that exists."""
    ancestor = folder.absolute()
    while ancestor != ancestor.parent:
        try:
            if ancestor.exists():
                break
        except OSError:  # a name too long to look up
            pass
        ancestor = ancestor.parent
    return ancestor


def _check_name_lengths(path: Path, option: str) -> None:
    """Every name of `path` within the filesystem's limit, with room for the temporary file
    written beside it (checked first: a longer name fails every other look-up)."""
    from kdvfs.runtime.types import KdvfsError

    ancestor = _existing_ancestor(path.parent)
    try:
        name_max = os.pathconf(ancestor, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    for name in path.absolute().relative_to(ancestor).parts:
        size = len(os.fsencode(name))
        if size + TEMP_NAME_EXTRA > name_max:
            raise KdvfsError(
                f"{option}: the name {name[:40]}... is {size} bytes; this filesystem allows {name_max}, "
                f"less {TEMP_NAME_EXTRA} for the temporary file written beside it"
            )


def _check_creatable_in(folder: Path, option: str, path: Path) -> None:
    """The nearest existing ancestor of `folder` must be a directory this user creates files
    in (a temporary file is created there and removed), and every name still to be created
    must fit the filesystem's limit, with room for the temporary file written beside it."""
    import tempfile

    from kdvfs.runtime.types import KdvfsError

    ancestor = _existing_ancestor(folder)
    if not ancestor.is_dir():
        raise KdvfsError(f"{option} {path}: {ancestor} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise KdvfsError(f"{option} {path}: cannot create files in {ancestor} (permission denied)")
    try:
        fd, probe = tempfile.mkstemp(dir=ancestor, prefix=".kdvfs-", suffix=".tmp")
    except OSError as exc:
        raise KdvfsError(
            f"{option} {path}: cannot create files in {ancestor} ({exc.strerror or exc})"
        ) from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)


def stdout_closed() -> None:
    """The reader of stdout left (`kdvfs tune | head -1`): what is still printed goes nowhere,
    and nothing else (an output being written) is taken to have failed."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


@contextlib.contextmanager
def printing() -> Iterator[None]:
    """Print in the block; a closed stdout pipe ends the block, not the command."""
    try:
        yield
    except BrokenPipeError:
        stdout_closed()


def write_all(outputs: list[tuple[str, Callable[[], None]]]) -> int:
    """Run each output step whatever the others do; a failure is one stderr line. Returns
    how many failed. Ctrl-C/SIGTERM meanwhile does not stop them. A closed stdout pipe met by
    a step's printed line is not the step failing: the step writes first, then prints."""
    from kdvfs.runtime.types import KdvfsError

    failed = 0
    with deferred_interrupts():
        for label, write in outputs:
            try:
                with printing():
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


class InterruptedAfterOutputs(KeyboardInterrupt):
    """A SIGINT or SIGTERM held while the outputs were written, delivered once they are:
    nothing was cut (cli/__init__.py: one line, exit 128 + the signal's number)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Hold SIGINT/SIGTERM while the block runs (one line says so): outputs are written whole.
    A signal held is delivered when the block ends: InterruptedAfterOutputs."""
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
    if caught:
        raise InterruptedAfterOutputs(caught[0])
