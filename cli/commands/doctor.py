"""`kdvfs doctor`: what this machine's GPUs allow, read-only.

Name, driver, supported clocks, the energy counter and how often it updates (polled for
~0.5 s), permission to lock clocks, power limit, current clocks, temperature, throttle
reasons, and any clock lease left on the GPU; then whether a clock daemon answers and what
this user may lock through it (docs/clock-daemon.md). Every figure is measured on this machine; the
GPU is opened in dry-run, so nothing is changed.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kdvfs.runtime.types import KdvfsError

#: How long the energy counter is polled to find its update period; s.
ENERGY_POLL_S = 0.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="PATH", type=Path, help="also write the report as JSON to PATH")
    parser.add_argument("--index", metavar="N", type=int, help="only GPU N (NVML index; default: all)")


def run(args: argparse.Namespace) -> int:
    from kdvfs.cli.commands._common import check_outputs, write_json
    from kdvfs.runtime.nvml_device import NvmlUnavailable

    check_outputs(args, {"--json": args.json})
    try:
        reports = [gpu_report(i) for i in _indices(args.index)]
    except NvmlUnavailable as exc:
        print(f"kdvfs doctor: {exc}", file=sys.stderr)
        return 1
    for report in reports:
        print(format_report(report))
    daemon = daemon_report()
    print(format_daemon(daemon))
    write_json(args.json, {"source": "measured", "gpus": reports, "daemon": daemon})
    return 0


def _indices(index: int | None) -> list[int]:
    from kdvfs.runtime.nvml_device import NvmlUnavailable, list_gpu_uuids

    count = len(list_gpu_uuids())
    if count == 0:
        raise NvmlUnavailable("no NVIDIA GPU or NVML library found (0 GPUs)")
    if index is None:
        return list(range(count))
    if not 0 <= index < count:
        raise NvmlUnavailable(f"no NVIDIA GPU with index {index} ({count} found)")
    return [index]


def gpu_report(index: int, energy_poll_s: float = ENERGY_POLL_S) -> dict[str, Any]:
    """Read-only report of one GPU as a JSON-ready dict."""
    from kdvfs.runtime.clock_lease import LeaseDir
    from kdvfs.runtime.nvml_device import NvmlDevice

    with NvmlDevice(index, dry_run=True) as dev:
        allowed, why = dev.can_set_clocks()
        period_s, changes = (
            energy_update_period_s(dev.energy_j, energy_poll_s) if dev.energy_counter else (None, 0)
        )
        clocks = _maybe(dev.clocks_mhz)
        limit_range = _maybe(dev.power_limit_range_w)
        lease = LeaseDir().read(dev.uuid)
        return {
            "source": "measured",
            "index": index,
            "name": dev.name,
            "uuid": dev.uuid,
            "driver": _maybe(dev.driver_version),
            "clocks": {
                "pairs": len(dev.grid),
                "per_memory_clock": [
                    {
                        "mem_mhz": mem,
                        "graphics_count": len(cores),
                        "graphics_min_mhz": min(cores),
                        "graphics_max_mhz": max(cores),
                    }
                    for mem in sorted(dev.grid.mem_levels_mhz, reverse=True)
                    for cores in [[p.core_mhz for p in dev.grid.pairs if p.mem_mhz == mem]]
                ],
            },
            "energy_counter": {
                "present": dev.energy_counter,
                "update_period_s": period_s,
                "changes_seen": changes,
                "poll_s": energy_poll_s,
            },
            "set_clocks": {"allowed": allowed, "reason": why},
            "power": {
                "draw_w": _maybe(dev.power_w),
                "limit_w": _maybe(dev.power_limit_w),
                "limit_min_w": limit_range[0] if limit_range else None,
                "limit_max_w": limit_range[1] if limit_range else None,
            },
            "current": {
                "sm_mhz": clocks.core_mhz if clocks else None,
                "mem_mhz": clocks.mem_mhz if clocks else None,
                "temperature_c": _maybe(dev.temperature_c),
                "throttle_reasons": sorted(_maybe(dev.throttle_reasons) or []),
            },
            "lease": None if lease is None else {"pid": lease.pid, "owner_alive": lease.owner_alive()},
        }


def daemon_report() -> dict[str, Any]:
    """Whether a clock daemon answers ($KDVFS_DAEMON_SOCKET, else the default socket), who it
    takes this process for, and what it may lock through it."""
    from kdvfs.runtime.daemon_client import DAEMON_SOCKET_ENV, DEFAULT_SOCKET, DaemonClient

    path = Path(os.environ.get(DAEMON_SOCKET_ENV) or DEFAULT_SOCKET)
    report: dict[str, Any] = {"socket": str(path), "answers": False, "reason": None}
    if not path.exists():
        return report | {"reason": "no socket there"}
    try:
        with DaemonClient(path, timeout_s=2.0) as client:
            hello = client.hello()
    except KdvfsError as exc:
        return report | {"reason": str(exc)}
    return report | {
        "answers": True,
        "uid": hello.uid,
        "dry_run": hello.dry_run,
        "may_lock": [r.model_dump() for r in hello.may_lock],
    }


def format_daemon(a: dict[str, Any]) -> str:
    if not a["answers"]:
        return f"clock daemon: none at {a['socket']} ({a['reason']})"
    may = "; ".join(
        f"GPU {r['gpu']}: core {r['core_mhz'][0]}-{r['core_mhz'][1]} MHz, memory {r['mem_mhz'][0]}-{r['mem_mhz'][1]} MHz"
        for r in a["may_lock"]
    )
    dry = " (dry-run: it records clock changes, makes none)" if a["dry_run"] else ""
    return f"clock daemon: {a['socket']} answers{dry}; uid {a['uid']} may lock {may or 'nothing'}"


def energy_update_period_s(read_energy_j: Callable[[], float], poll_s: float) -> tuple[float | None, int]:
    """Poll the energy counter for poll_s; return the median gap between its changes (None
    with fewer than two changes) and the number of changes seen."""
    change_times_s: list[float] = []
    last = read_energy_j()
    end_s = time.monotonic() + poll_s
    while time.monotonic() < end_s:
        value = read_energy_j()
        if value != last:
            change_times_s.append(time.monotonic())
            last = value
        time.sleep(0.001)
    gaps_s = [b - a for a, b in itertools.pairwise(change_times_s)]
    return (statistics.median(gaps_s) if gaps_s else None), len(change_times_s)


def format_report(r: dict[str, Any]) -> str:
    """The report as text; every figure tagged [measured]."""
    energy = r["energy_counter"]
    if not energy["present"]:
        energy_text = "no total-energy counter (energy is integrated from power samples)"
    elif energy["update_period_s"] is None:
        energy_text = (
            f"present; changed {energy['changes_seen']} times in {energy['poll_s']} s (period unknown)"
        )
    else:
        energy_text = (
            f"present; updates every {energy['update_period_s']:.3f} s (median over {energy['poll_s']} s)"
        )
    power, cur = r["power"], r["current"]
    lines = [
        f"GPU {r['index']}: {r['name']} ({r['uuid']}), driver {_na(r['driver'])}  [measured]",
        f"  supported clocks: {r['clocks']['pairs']} pairs  [measured]",
        *(
            f"    memory {m['mem_mhz']} MHz: {m['graphics_count']} graphics clocks, "
            f"{m['graphics_min_mhz']}-{m['graphics_max_mhz']} MHz  [measured]"
            for m in r["clocks"]["per_memory_clock"]
        ),
        f"  energy counter: {energy_text}  [measured]",
        f"  lock clocks: {'allowed' if r['set_clocks']['allowed'] else 'not allowed'} "
        f"({r['set_clocks']['reason']}; not tried: doctor changes nothing)  [measured]",
        f"  power: {_na(power['draw_w'], ' W')} draw; limit {_na(power['limit_w'], ' W')} "
        f"(range {_na(power['limit_min_w'])}-{_na(power['limit_max_w'], ' W')})  [measured]",
        f"  now: SM {_na(cur['sm_mhz'], ' MHz')}, memory {_na(cur['mem_mhz'], ' MHz')}, "
        f"{_na(cur['temperature_c'], ' C')}; throttle reasons: {', '.join(cur['throttle_reasons']) or 'none'}"
        "  [measured]",
    ]
    if r["lease"] is not None:
        state = "live" if r["lease"]["owner_alive"] else "dead: its clocks may still be locked"
        lines.append(f"  clock lease: held by pid {r['lease']['pid']} ({state})")
    return "\n".join(lines)


def _maybe(read: Callable[[], Any]) -> Any:
    """A reading, or None where the card does not answer it."""
    try:
        return read()
    except KdvfsError:
        return None


def _na(value: Any, unit: str = "") -> str:
    if value is None:
        return "n/a"
    return f"{value:g}{unit}" if isinstance(value, float) else f"{value}{unit}"
