"""Fit how busy a recorded kernel keeps the simulated H200 inside a training step.

    python -m kdvfs.experiments.fit_step_power [--steps DIR] [--fit-on a,b,...]     (CPU, ~3 min)

Map, top to bottom:
  Args        every knob, one line each, with its unit
  load_steps  the recorded whole steps (data/h200/steps, tuner/calibration.py recorded_steps)
              and the probe's GPT-3-XL block with the real card's time and energy a step
  shares_of   the model's busy shares by kind: one for gemm and attention, one for the rest;
              a kernel of duration d keeps d / (d + ramp) of its share (the ramp fitted too)
  simulate    each step as calibrate runs it (tuner/calibration.py simulate_step: kernels at
              their shares after their launch gaps, at the host's pace where slower, at stock
              on the simulated H200 with its windowed cap): time and energy against measured
  residuals   log errors of time and energy of the steps fitted (`fit_on`), of time alone of
              any named in `fit_time_on`; a launch-bound step's time shows the profiler's overhead
  main        least squares over the two shares, the ramp and the overhead; every step's errors at the
              fit and at shares of 1, fitted, time-fitted and held out apart; prints JSON
Every step not named to fit on is held out. presets.STEP_BUSY_* and tuner/calibration.py
PROFILER_OVERHEAD_S cite this run; the model: docs/design-runtime.md, "Inside a recorded step".
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from kdvfs.experiments.record_job import parse_fields
from kdvfs.runtime.simulator import SimulatedDevice
from kdvfs.runtime.tables import read_csv, repo_data_file, require_columns
from kdvfs.runtime.trace import TRACE_COLUMNS
from kdvfs.runtime.types import KERNEL_KINDS, KdvfsError
from kdvfs.tuner.calibration import RecordedStep, recorded_steps, simulate_step

COMPUTE_KINDS = ("gemm", "attention")
"""Kinds whose kernels compute (flops): they share the first busy share; every other kind the second."""


FIT_ON = "gpt2_small_sdpa_bf16,mlp_fp32_sgd,transformer_bf16_b64_powercap,gpt3xl_block,resnet18_bf16_b32_sgd"
"""The steps fitted on by default, time and energy: an fp32 MLP (CUDA-core GEMMs), GPT-2 small
with SDPA, a TransformerEncoder at the cap, the probe's GPT-3-XL block, and ResNet-18 at batch
32, launch-bound (its short kernels are what sets the ramp; until the ramp its time alone was
fitted, for the profiler's overhead, and its energy held out). Held out: ResNet-50 (convolutions
and batch norms, which no fitted step has) and GPT-2 small with eager attention (a fitted model
on another attention path), both chosen before the first fit, and every step recorded after it
(ViT-B/16, GPT-2 medium)."""


@dataclasses.dataclass
class Args:
    steps: str = ""  # recorded steps' folder; "": the checkout's data/h200/steps
    block_trace: str = ""  # the GPT-3-XL block's trace; "": data/h200-probe's; "none": left out
    block_step_ms: float = 6.87  # the real H200's block step (6.7-7.04 in two recordings); ms
    block_energy_j: float = 4.78  # its energy a block step (4.7-4.86); J
    fit_on: str = FIT_ON  # steps whose time and energy are fitted, commas
    fit_time_on: str = ""  # steps whose time alone is fitted, commas
    start_compute: float = 0.9  # least squares' start of the compute share; share
    start_stream: float = 0.5  # its start of the stream share; share
    start_overhead_us: float = 5.0  # its start of the profiler's host overhead a GPU event; us
    start_ramp_us: float = 5.0  # its start of the time a kernel takes to come up to its share; us
    ramp_us: float = -1.0  # the ramp held at this value, not fitted; -1: fitted; us
    lowest_share: float = 0.05  # lower bound of either share; share
    diff_step: float = 0.02  # finite differences' relative step (the cap's controls are discrete)
    baseline: int = 1  # 1: also every step at shares of 1 (as busy as the ladder's); 0: not
    out: str = ""  # also write the JSON to this file; "": print only


BLOCK = "gpt3xl_block"
"""The probe's GPT-3-XL block's name among the steps."""


def load_steps(args: Args) -> list[RecordedStep]:
    """The recorded steps of args.steps, then the GPT-3-XL block unless left out."""
    folder = (
        Path(args.steps) if args.steps else repo_data_file("h200/steps/steps_summary.json", "--steps").parent
    )
    steps = recorded_steps(folder)
    if args.block_trace != "none":
        path = (
            Path(args.block_trace)
            if args.block_trace
            else repo_data_file("h200-probe/gpt3xl_block_kernels.csv", "--block-trace")
        )
        header, rows = read_csv(path)
        require_columns(path, header, TRACE_COLUMNS)
        steps.append(RecordedStep(BLOCK, path, tuple(rows), args.block_step_ms * 1e-3, args.block_energy_j))
    return steps


def shares_of(compute: float, stream: float) -> dict[str, float]:
    """Each kind's in-step busy share: `compute` for COMPUTE_KINDS, `stream` for the rest."""
    return {kind: compute if kind in COMPUTE_KINDS else stream for kind in KERNEL_KINDS}


def simulate(
    steps: list[RecordedStep], shares: dict[str, float], overhead_s: float, ramp_s: float
) -> list[dict]:
    """Each step's simulated time and energy (stock, noiseless, steady temperature; the host's
    pace with `overhead_s` a GPU event; each kernel's share ramped over `ramp_s`) against its
    measured ones, unrounded."""
    out = []
    for step in steps:
        row = simulate_step(SimulatedDevice("h200", noise=0.0), step, shares, overhead_s, ramp_s)
        out.append(
            {
                "shape": step.shape,
                "kernels": row.kernels,
                "measured_step_ms": row.measured_step_s * 1e3,
                "simulated_step_ms": row.simulated_time_s * 1e3,
                "time_error": row.time_error,
                "measured_energy_j": row.measured_energy_j,
                "simulated_energy_j": row.simulated_energy_j,
                "energy_error": row.energy_error,
                "measured_power_w": row.measured_energy_j / row.measured_step_s,
                "simulated_power_w": row.simulated_energy_j / row.simulated_time_s,
            }
        )
    return out


def residuals(rows: list[dict]) -> np.ndarray:
    """Log errors of time and of energy a step, in order."""
    return np.array([math.log1p(e) for r in rows for e in (r["time_error"], r["energy_error"])])


def rounded(row: dict) -> dict:
    """A step's row as printed: errors to 4 decimals, the rest to 3."""
    return {
        k: round(v, 4 if k.endswith("error") else 3) if isinstance(v, float) else v for k, v in row.items()
    }


def main(argv: list[str]) -> dict:
    args = parse_fields(Args, argv, "fit_step_power", __doc__)
    if not 0.0 < args.lowest_share <= min(args.start_compute, args.start_stream) <= 1.0:
        sys.exit("fit_step_power: the starts must lie in [--lowest-share, 1] and --lowest-share above 0")
    try:
        steps = load_steps(args)
    except KdvfsError as e:
        sys.exit(f"fit_step_power: {e}")
    names = [s.shape for s in steps]
    fit_on = [n for n in args.fit_on.split(",") if n]
    time_on = [n for n in args.fit_time_on.split(",") if n and n not in fit_on]
    unknown = [n for n in fit_on + time_on if n not in names]
    if unknown or not fit_on:
        sys.exit(
            f"fit_step_power: --fit-on and --fit-time-on name no recorded step {', '.join(unknown) or '(none)'} "
            f"(steps: {', '.join(names)})"
        )
    fitted = [s for s in steps if s.shape in fit_on]
    time_fitted = [s for s in steps if s.shape in time_on]
    held_out = [s for s in steps if s.shape not in fit_on + time_on]

    started = time.process_time()
    evaluations = 0

    held_ramp = args.ramp_us >= 0.0

    def ramp_of(x: np.ndarray) -> float:
        return (args.ramp_us if held_ramp else x[3]) * 1e-6

    def cost(x: np.ndarray) -> np.ndarray:
        nonlocal evaluations
        evaluations += 1
        at = shares_of(x[0], x[1])
        times = [math.log1p(r["time_error"]) for r in simulate(time_fitted, at, x[2] * 1e-6, ramp_of(x))]
        return np.concatenate([residuals(simulate(fitted, at, x[2] * 1e-6, ramp_of(x))), times])

    start = [args.start_compute, args.start_stream, args.start_overhead_us]
    lower, upper = [args.lowest_share] * 2 + [0.0], [1.0, 1.0, np.inf]
    if not held_ramp:
        start, lower, upper = [*start, args.start_ramp_us], [*lower, 0.0], [*upper, np.inf]
    fit = least_squares(cost, start, bounds=(lower, upper), diff_step=args.diff_step)
    compute, stream = (round(float(v), 3) for v in fit.x[:2])
    overhead_us = round(float(fit.x[2]), 2)
    ramp_us = args.ramp_us if held_ramp else round(float(fit.x[3]), 2)
    shares = shares_of(compute, stream)

    def report(at: dict[str, float], ramp_us: float) -> dict:
        rows = {r["shape"]: r for r in simulate(steps, at, overhead_us * 1e-6, ramp_us * 1e-6)}
        both = ("time_error", "energy_error")
        errors_fitted = [rows[s.shape][e] for s in fitted for e in both] + [
            rows[s.shape]["time_error"] for s in time_fitted
        ]
        errors_held_out = [rows[s.shape][e] for s in held_out for e in both] + [
            rows[s.shape]["energy_error"] for s in time_fitted
        ]
        return {
            "fitted": [rounded(rows[s.shape]) for s in fitted],
            "time_fitted": [rounded(rows[s.shape]) for s in time_fitted],
            "held_out": [rounded(rows[s.shape]) for s in held_out],
            "largest_error_fitted": round(max(abs(e) for e in errors_fitted), 4),
            "largest_error_held_out": round(max(abs(e) for e in errors_held_out), 4)
            if errors_held_out
            else None,
        }

    doc = {
        "source": "simulated (sim:h200, stock clocks, noiseless) against measured on a real H200",
        "model": "a recorded kernel's work runs at its kind's in-step busy share of the kind's ladder rate over its "
        "duration, a kernel of duration d at d / (d + ramp) of that share",
        "fitted_on": [s.shape for s in fitted],
        "time_fitted_on": [s.shape for s in time_fitted],
        "held_out": [s.shape for s in held_out],
        "shares": {"compute": compute, "stream": stream, "compute_kinds": list(COMPUTE_KINDS)},
        "profiler_overhead_us": overhead_us,
        "ramp_us": ramp_us,
        "ramp": "held" if held_ramp else "fitted",
        "cost": round(float(fit.cost), 6),
        "evaluations": evaluations,
        "at_fit": report(shares, ramp_us),
    }
    if args.baseline:
        doc["at_shares_1"] = report(shares_of(1.0, 1.0), 0.0)
    doc["cpu_s"] = round(time.process_time() - started, 1)
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return doc


if __name__ == "__main__":
    main(sys.argv[1:])
