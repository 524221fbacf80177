"""kdvfs.cli: the `kdvfs` command line (`python -m kdvfs` or `python -m kdvfs.cli`).

Each subcommand lives in cli/commands/<name>.py with `add_arguments(parser)` and
`run(args) -> int`. Those modules import only the standard library at top level, so that
`kdvfs --help` and usage errors answer at once; torch, BoTorch and MLflow are imported inside
run() of the commands that need them.

main() is the one error path: a usage error or a KdvfsError is one stderr line and exit 2,
Ctrl-C and SIGTERM are KeyboardInterrupt (the command keeps what it has, exit 130), a closed
stdout pipe ends quietly, and anything else is one "internal error" line (KDVFS_DEBUG=1
shows the traceback). Run as the program, a SIGINT or SIGTERM after the command returned
(its outputs written, MLflow shutting down) is one line and exit 130 or 143: the outputs
are complete and say what happened (a JSON's partial: false stands).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys

from kdvfs.runtime.types import KdvfsError

COMMANDS: dict[str, str] = {
    "sweep": "full sweep of every clock pair of every kernel: the baseline plan and its cost",
    "calibrate": "simulated card in auto mode against a probe of a real card",
    "compare": "search strategies against the full sweep",
    "scenario": "the step-driven tuner through a drift scenario, against the new conditions' oracle",
    "peers": "kdvfs against Zeus, EnvPipe and the paper's sweep: whole runs on one simulated card",
    "tune": "tune clocks inside a (simulated) training run: the step-driven tuner",
    "demo": "run the main job on the simulated GPU (what `make demo` runs)",
    "plan": "show, diff or validate a plan file",
    "doctor": "what this machine's GPUs allow (read-only)",
    "probe": "read-only stock-clock measurements of reference kernels on a real GPU",
    "daemon": "the root clock daemon that locks clocks for unprivileged jobs, and its clients",
    "serve": "the tuning service: jobs and ranks of a fleet share observations and plans",
}

#: Environment variable that makes an internal error print its traceback.
DEBUG_ENV = "KDVFS_DEBUG"
#: Exit status after a closed stdout pipe (as a shell reports SIGPIPE: 128 + 13).
BROKEN_PIPE_EXIT = 141


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line usage error: `kdvfs CMD: error: ... (see kdvfs CMD --help)`."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from kdvfs import __version__

    parser = _Parser(
        prog="kdvfs",
        description="Per-kernel GPU clock tuning: least energy within a slowdown budget.",
    )
    parser.add_argument("--version", action="version", version=f"kdvfs {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        module = _command_module(name)
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(p)
    return parser


def _command_module(name: str):
    return importlib.import_module(f"kdvfs.cli.commands.{name}")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _after_outputs(command: str) -> None:
    """From the command's return to the process's exit (MLflow's and the interpreter's
    shutdown), SIGINT and SIGTERM cut nothing: every output is written and says what
    happened. One line, then exit 130 (SIGINT) or 143 (SIGTERM) at once."""

    def late(signum: int, _frame: object) -> None:
        name = "SIGTERM" if signum == signal.SIGTERM else "SIGINT"
        os.write(2, f"kdvfs {command}: {name} after every output was written (they are complete)\n".encode())
        os._exit(128 + signum)

    signal.signal(signal.SIGINT, late)
    signal.signal(signal.SIGTERM, late)


def _exit(code: int) -> None:
    """Exit now, as the interpreter would (threads joined, atexit run, streams flushed) but
    without its finalization, which puts the default signal handlers back first: a signal in
    that window killed the process with no word (exit -15)."""
    import atexit
    import threading

    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        code = int(_command_module(args.command).run(args) or 0)
        if argv is None:  # the program itself (not a caller of main): until it exits
            _after_outputs(args.command)
            _exit(code)
        return code
    except KdvfsError as exc:
        print(f"kdvfs {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        signum = getattr(exc, "signum", None)  # commands/_common.py: InterruptedAfterOutputs
        if signum is not None:
            name = "SIGTERM" if signum == signal.SIGTERM else "SIGINT"
            print(
                f"kdvfs {args.command}: {name} while the outputs were written: they are complete",
                file=sys.stderr,
            )
            return 128 + signum
        if getattr(args, "outputs_written", False):  # set by a command once every output is written
            print(
                f"kdvfs {args.command}: interrupted after every output was written (they are complete)",
                file=sys.stderr,
            )
        else:
            print(f"kdvfs {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader of stdout left (`kdvfs plan show PLAN | head`): say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE_EXIT
    except Exception as exc:
        if os.environ.get(DEBUG_ENV):
            raise
        print(
            f"kdvfs {args.command}: internal error: {type(exc).__name__}: {exc} "
            f"(a bug: {DEBUG_ENV}=1 shows the traceback)",
            file=sys.stderr,
        )
        return 1
    finally:
        if signal.getsignal(signal.SIGTERM) is _interrupt:
            signal.signal(signal.SIGTERM, previous)
