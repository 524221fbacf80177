"""`kdvfs calibrate`: the simulated card in auto mode against a stock-clock probe (--against
kernels_stock.csv), or against whole training steps recorded on the card (--against-steps DIR:
each step's simulated time and energy against the measured, and whether the in-step model
was fitted to it or it is held out; tuner/calibration.py step_rows).
Interrupted: the rows done so far, the JSON marked partial, exit 130."""

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
    against = parser.add_mutually_exclusive_group(required=True)
    against.add_argument("--against", type=Path, help="kernels_stock.csv from a probe (kdvfs probe)")
    against.add_argument(
        "--against-steps",
        type=Path,
        metavar="DIR",
        help="recorded whole training steps (steps_summary.json and steps_kernels.csv.gz, "
        "as data/h200/steps/): each step's simulated time and energy against the measured",
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
    if args.against_steps is not None:
        return _run_steps(args, device)
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


#: The largest error of a step's simulated time or energy that the simulated card is held to; a fraction.
STEP_TARGET = 0.05


def _run_steps(args: argparse.Namespace, device) -> int:
    from kdvfs.tuner.calibration import AFTER_GAP_FITTED_ON, AFTER_GAP_NOTE, fit_role, step_rows

    phases, rows = Phases("calibrate"), []
    with phases.interruptible():
        phases.enter("simulating the recorded steps' kernels")
        for row in step_rows(device, args.against_steps):
            rows.append(row)
    with deferred_interrupts():
        print(
            f"{device.name} (simulated, stock clocks, noiseless, each step's kernels in order, the launch gap "
            f"before each, busy for its kind's in-step share, at the host's pace where slower"
            f"{AFTER_GAP_NOTE if device.preset.after_gap_drop_share > 0.0 else ''}) against "
            f"{args.against_steps} (measured on a real GPU, energy from its counter); 'at meas. time': the "
            "simulated energy where the step lasts its measured time; host: what paced the simulated host"
        )
        print(
            f"  {'step':32s} {'kernels':>7s} {'time ms meas/sim':>20s} {'err':>8s} {'energy J meas/sim':>20s} {'err':>8s}"
            f" {'at meas. time':>13s}  {'host':13s}  in-step model"
        )
        for r in rows:
            within = abs(r.time_error) <= STEP_TARGET and abs(r.energy_error) <= STEP_TARGET
            print(
                f"  {r.shape:32s} {r.kernels:7d} {r.measured_step_s * 1e3:9.2f}/{r.simulated_time_s * 1e3:<9.2f} "
                f"{pct(r.time_error):>8s} {r.measured_energy_j:9.2f}/{r.simulated_energy_j:<9.2f} "
                f"{pct(r.energy_error):>8s} {pct(r.energy_error_at_measured_time):>13s}  {r.wait_source:13s}"
                f"  {fit_role(r.shape)}"
                f"{'' if within else f'  (beyond {100 * STEP_TARGET:g}%)'}"
            )
        doc = phases.mark(
            {
                "device": args.device,
                "against_steps": str(args.against_steps),
                "source": "simulated vs measured",
                "target": STEP_TARGET,
                "after_gap_fitted_on": AFTER_GAP_FITTED_ON
                if device.preset.after_gap_drop_share > 0.0
                else None,
                "rows": [
                    {
                        "shape": r.shape,
                        "kernels": r.kernels,
                        "measured_step_s": r.measured_step_s,
                        "measured_busy_s": r.measured_busy_s,
                        "measured_energy_j": r.measured_energy_j,
                        "measured_power_w": r.measured_power_w,
                        "simulated_time_s": r.simulated_time_s,
                        "simulated_energy_j": r.simulated_energy_j,
                        "time_error": r.time_error,
                        "energy_error": r.energy_error,
                        "energy_at_measured_time_j": r.energy_at_measured_time_j,
                        "energy_error_at_measured_time": r.energy_error_at_measured_time,
                        "host_paced_by": r.wait_source,
                        "fit": fit_role(r.shape),
                    }
                    for r in rows
                ],
            }
        )
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
