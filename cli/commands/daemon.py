"""`kdvfs daemon`: the privileged clock daemon, and two clients of it (docs/clock-daemon.md).

    kdvfs daemon [serve] --socket PATH [--rules FILE] [--group G] [--lease-dir DIR] [--dry-run]
    kdvfs daemon status --socket PATH [--json [PATH]]
    kdvfs daemon lock --socket PATH --gpu N --core MHZ --mem MHZ

`serve` (the default) runs the daemon as root until SIGTERM/SIGINT; `status` prints every
GPU's lease; `lock` holds a lease until it is interrupted (an operator's tool, and a test
client). The runtime modules are imported inside run(), so `kdvfs --help` stays quick.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

DEFAULT_SOCKET = "/run/kdvfs/daemon.sock"  # kept equal to daemon_client.DEFAULT_SOCKET (tested)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action", nargs="?", choices=("serve", "status", "lock"), default="serve", help="default: serve"
    )
    parser.add_argument("--socket", type=Path, default=Path(DEFAULT_SOCKET), help="default %(default)s")
    parser.add_argument(
        "--rules",
        type=Path,
        metavar="FILE",
        help="serve: TOML or JSON rules file (default: root and the socket's group)",
    )
    parser.add_argument("--group", help="serve: the socket's group, a name or gid (default: the daemon's)")
    parser.add_argument(
        "--lease-dir", type=Path, help="serve: lease directory (default: SOCKET's folder/leases)"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="serve: record NVML Set/Reset calls, make none"
    )
    parser.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="PATH",
        help="status: print JSON (to PATH if given, else stdout)",
    )
    parser.add_argument("--gpu", type=int, metavar="N", help="lock: NVML index")
    parser.add_argument("--core", type=int, metavar="MHZ", help="lock: graphics clock")
    parser.add_argument("--mem", type=int, metavar="MHZ", help="lock: memory clock")


def run(args: argparse.Namespace) -> int:
    if args.action == "status":
        return _status(args)
    if args.action == "lock":
        return _lock(args)
    return _serve(args)


def _serve(args: argparse.Namespace) -> int:
    import logging

    from kdvfs.runtime import clock_daemon

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    clock_daemon.serve(
        args.socket, rules_path=args.rules, group=args.group, lease_dir=args.lease_dir, dry_run=args.dry_run
    )
    return 0


def _status(args: argparse.Namespace) -> int:
    from kdvfs.cli.commands._common import check_outputs
    from kdvfs.runtime.daemon_client import DaemonClient
    from kdvfs.runtime.types import KdvfsError

    out = Path(args.json) if args.json not in (None, "-") else None
    check_outputs(args, {"--json": out})

    with DaemonClient(args.socket) as client:
        status = client.status()
    payload = {
        "gpus": [
            {k: gpu.model_dump()[k] for k in ("index", "leased", "holder_pid", "core_mhz", "mem_mhz")}
            for gpu in status.gpus
        ],
        "resets": status.resets,
    }
    if args.json == "-":
        print(json.dumps(payload))
        return 0
    if out is not None:
        try:
            out.write_text(json.dumps(payload, indent=1) + "\n")
        except OSError as exc:
            raise KdvfsError(f"--json {out}: cannot write ({exc.strerror or exc})") from None
    for gpu in status.gpus:
        held = f"leased by pid {gpu.holder_pid} at {gpu.core_mhz}/{gpu.mem_mhz} MHz" if gpu.leased else "free"
        print(f"GPU {gpu.index} ({gpu.uuid}): {held}")
    print(f"resets since the daemon started: {status.resets}{' (dry-run)' if status.dry_run else ''}")
    return 0


def _lock(args: argparse.Namespace) -> int:
    from kdvfs.runtime.daemon_client import DaemonClient
    from kdvfs.runtime.types import ClockPair, KdvfsError

    missing = [f"--{name}" for name in ("gpu", "core", "mem") if getattr(args, name) is None]
    if missing:
        raise KdvfsError(f"daemon lock needs {', '.join(missing)}")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM releases like Ctrl-C
    with DaemonClient(args.socket) as client:
        pair = ClockPair(args.core, args.mem)
        client.lock(args.gpu, pair)
        try:  # an interrupt right after the lock is a release too
            print(f"GPU {args.gpu} locked at {pair}; interrupt to release", flush=True)
            signal.pause()
        except KeyboardInterrupt:
            client.reset(args.gpu)
    print(f"GPU {args.gpu} released", flush=True)
    return 0
