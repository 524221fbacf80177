"""`kdvfs calibrate`: the simulated card in auto mode against a stock-clock probe (interrupted,
the rows done so far, the JSON marked partial, exit 130)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kdvfs.cli.commands._common import (
    Phases,
    add_json,
    check_outputs,
    deferred_interrupts,
    write_all,
    write_json,
)
from kdvfs.tuner.text import pct


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device", default="sim:h200", help="a simulated card, sim:PRESET (default %(default)s)"
    )
    parser.add_argument(
        "--against", type=Path, required=True, help="kernels_stock.csv from a probe (kdvfs probe)"
    )
    add_json(parser)


def run(args: argparse.Namespace) -> int:
    from kdvfs.runtime.registry import open_device
    from kdvfs.runtime.simulator import SimulatedDevice
    from kdvfs.runtime.types import KdvfsError
    from kdvfs.tuner.calibration import calibration_rows

    check_outputs(args, {"--json": args.json})
    device = open_device(args.device, noise=0.0)
    if not isinstance(device, SimulatedDevice):
        raise KdvfsError(
            f"calibrate compares a simulated card with a probe: --device must be sim:PRESET, not {args.device!r}"
        )
    probe_gpu = _probe_gpu_name(args.against)
    if probe_gpu is not None and probe_gpu != device.name:
        raise KdvfsError(
            f"{args.against} was probed on {probe_gpu} (nvml.json beside it), but --device {args.device} "
            f"simulates {device.name}: calibrate a card against its own probe"
        )
    phases, rows = Phases("calibrate"), []
    with phases.interruptible():
        phases.enter("simulating the probe's kernels")
        rows.extend(calibration_rows(device, args.against))
    with deferred_interrupts():
        _print_rows(args, device, rows)
        doc = phases.mark(_doc(args, rows))
    return phases.exit_status(write_all([("JSON", lambda: write_json(args.json, doc))]))


def _print_rows(args: argparse.Namespace, device, rows) -> None:
    print(
        f"{device.name} (simulated, auto mode, at the probe's temperatures) against {args.against} (measured on a real GPU)"
    )
    print(
        f"  {'kernel':26s} {'power W meas/sim':>18s} {'err':>8s} {'SM MHz meas/sim':>17s} {'err':>8s} {'time us meas/sim':>20s} {'err':>8s}"
    )
    for r in rows:
        print(
            f"  {r.kernel:26s} {r.measured_power_w:8.0f}/{r.simulated_power_w:<8.0f} {pct(r.rel_error('power_w')):>8s}"
            f" {r.measured_sm_mhz:8.0f}/{r.simulated_sm_mhz:<7.0f} {pct(r.rel_error('sm_mhz')):>8s}"
            f" {r.measured_time_s * 1e6:9.1f}/{r.simulated_time_s * 1e6:<9.1f} {pct(r.rel_error('time_s')):>8s}"
            f"{'  (power-capped)' if r.capped else ''}"
        )


def _doc(args: argparse.Namespace, rows) -> dict:
    return {
        "device": args.device,
        "against": str(args.against),
        "source": "simulated vs measured",
        "rows": [
            {
                "kernel": r.kernel,
                "measured_power_w": r.measured_power_w,
                "simulated_power_w": r.simulated_power_w,
                "measured_sm_mhz": r.measured_sm_mhz,
                "simulated_sm_mhz": r.simulated_sm_mhz,
                "measured_time_s": r.measured_time_s,
                "simulated_time_s": r.simulated_time_s,
            }
            for r in rows
        ],
    }


def _probe_gpu_name(probe_csv: Path) -> str | None:
    """The GPU name that `kdvfs probe` recorded in nvml.json beside the table, if there is one."""
    import json

    info = probe_csv.parent / "nvml.json"
    try:
        name = json.loads(info.read_text()).get("name")
    except (OSError, ValueError, AttributeError):
        return None
    return name if isinstance(name, str) else None
