"""Fit the simulated card's per-kind constants (presets.KindModel) to a size ladder.

    python -m kdvfs.experiments.fit_kinds [--ladder data/h200/kernels_ladder.csv] [--preset h200]

For each kernel kind of the ladder (`kdvfs probe --ladder`, measured on a real card), the
kind's constants -- its share of the peak FLOP rate or of the streaming bandwidth, its
small-launch floor, and its SM activity while streaming -- are fitted by least squares on the
log errors of time per call and power of every ladder kernel of that kind that ran 5 us or
more, the simulated card in auto mode at the temperature the probe recorded (so the power
cap and its clock pull-down act as on the card). One set of constants per kind, never per
kernel. Three card-wide constants are chosen on a grid (`MEM_W_GRID`, `FLOOR_BLEND_GRID`,
`L2_STREAM_GRID`: the DRAM power at full streaming, the work/floor blend, the L2-resident
stream rate), every kind refitted at each point, the point of least total cost kept (about 5
minutes of one core). Prints JSON: the card-wide constants, each kind's, and each kernel's
time and power error with them; the constants in runtime/presets.py cite this command.
"""

from __future__ import annotations

import argparse
import itertools
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from kdvfs.runtime.presets import ATTENTION_BLOCK_BYTES, KindModel, get_preset
from kdvfs.runtime.probe_kernels import parse_probe_kernel
from kdvfs.runtime.simulator import operating_point
from kdvfs.runtime.tables import read_csv, repo_data_file
from kdvfs.runtime.types import KdvfsError, Kernel

MIN_TIME_S = 5e-6  # s: the target holds kernels of 5 us or more
FLOOR_STARTS_US = (1.0, 5.0, 20.0)  # us: starting values of the floor for the least squares
MEM_W_GRID = (250.0, 300.0, 350.0, 400.0, 500.0)  # W: DRAM power at full streaming, tried
FLOOR_BLEND_GRID = (1.25, 1.5, 2.0, 4.0)  # p of the work/floor blend, tried
L2_STREAM_GRID = (
    0.4,
    0.5,
    0.6,
    0.8,
    1.0,
)  # share of the L2 ceiling an L2-resident working set streams at, tried
#: (start, lower bounds, upper bounds) of each kind's parameters; floor in us, wave latency in us.
STARTS = {
    "gemm": ([1.0, 2.0], [0.2, 0.0], [1.2, 50.0]),
    "attention": ([0.7, 2.0, 0.4, 2.0], [0.2, 0.0, 0.0, 0.0], [1.2, 50.0, 2.0, 20.0]),
    "stream": ([0.7, 2.0, 0.4], [0.2, 0.0, 0.0], [1.2, 50.0, 2.0]),
}


def rows_by_kind(path: Path) -> dict[str, list[tuple[Kernel, float, float, float]]]:
    """(kernel, measured time per call s, measured power W, temperature C) per kind."""
    _, rows = read_csv(path)
    out: dict[str, list[tuple[Kernel, float, float, float]]] = {}
    for row in rows:
        probe = parse_probe_kernel(row.cells["kernel"])
        kernel = probe.kernel()
        time_s = float(row.cells["per_call_us"]) * 1e-6
        out.setdefault(probe.kind, []).append(
            (kernel, time_s, float(row.cells["avg_power_W"]), float(row.cells["temp_end"]))
        )
    return out


def model_of(kind: str, x: np.ndarray) -> KindModel:
    """The parameter vector of the fit as a KindModel (a GEMM has no streaming part; attention
    runs in waves of ATTENTION_BLOCK_BYTES blocks, with a fitted latency per wave)."""
    if kind == "gemm":
        return KindModel(rate_eff=float(x[0]), floor_s=float(x[1]) * 1e-6)
    if kind == "attention":
        return KindModel(
            rate_eff=float(x[0]),
            floor_s=float(x[1]) * 1e-6,
            act_stream=float(x[2]),
            block_bytes=ATTENTION_BLOCK_BYTES,
            wave_s=float(x[3]) * 1e-6,
        )
    return KindModel(bw_eff=float(x[0]), floor_s=float(x[1]) * 1e-6, act_stream=float(x[2]))


def fit_kind(preset, kind: str, rows) -> tuple[KindModel, float]:
    """The kind's constants fitted to its rows of >= MIN_TIME_S, and the fit's cost."""
    fit_rows = [r for r in rows if r[1] >= MIN_TIME_S]
    x0, lo, hi = STARTS[kind] if kind in STARTS else STARTS["stream"]
    fits = [
        least_squares(
            lambda x: errors(preset, kind, model_of(kind, x), fit_rows),
            [x0[0], floor_us, *x0[2:]],
            bounds=(lo, hi),
        )
        for floor_us in FLOOR_STARTS_US  # the floor enters through a blend: start it at several values
    ]
    best = min(fits, key=lambda f: f.cost)
    return model_of(kind, best.x), float(best.cost)


def card_with(preset, mem_w: float, floor_blend: float, l2_stream_rel: float):
    """The card with a DRAM power at full streaming of mem_w (its zero-traffic watts kept)."""
    base_w = preset.mem_w * preset.mem_base_rel
    return replace(
        preset,
        mem_w=mem_w,
        mem_base_rel=base_w / mem_w,
        floor_blend=floor_blend,
        l2_stream_rel=l2_stream_rel,
        kinds=(),
    )


def errors(preset, kind: str, model: KindModel, rows) -> np.ndarray:
    card = replace(preset, kinds=((kind, model),))
    out = []
    for kernel, time_s, power_w, temp_c in rows:
        op = operating_point(card, kernel, None, temp_c, card.power_cap_w)
        out += [np.log(op.time_s / time_s), np.log(op.power_w / power_w)]
    return np.array(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--ladder",
        type=Path,
        default=None,
        help="probe CSV (default: the checkout's data/h200/kernels_ladder.csv)",
    )
    p.add_argument("--preset", default="h200", help="simulated card the ladder was measured on")
    args = p.parse_args(argv)

    try:
        preset = get_preset(args.preset)
        ladder = args.ladder or repo_data_file("h200/kernels_ladder.csv", "--ladder")
        by_kind = sorted(rows_by_kind(ladder).items())
    except KdvfsError as e:
        p.error(str(e))
    # the card-wide constants (DRAM power, blend, L2 rate) on a grid, each kind fitted at every point
    trials = []
    for card_wide in itertools.product(MEM_W_GRID, FLOOR_BLEND_GRID, L2_STREAM_GRID):
        card = card_with(preset, *card_wide)
        fits = {kind: fit_kind(card, kind, rows) for kind, rows in by_kind}
        trials.append((sum(cost for _, cost in fits.values()), card_wide, fits))
    cost, (mem_w, blend, l2_rel), fits = min(trials, key=lambda t: t[0])
    card = card_with(preset, mem_w, blend, l2_rel)
    result: dict[str, dict] = {}
    for kind, rows in by_kind:
        model = fits[kind][0]
        errs = errors(card, kind, model, rows)
        result[kind] = {
            "model": {
                k: (None if v is None else round(v, 9 if k.endswith("_s") else 3))
                for k, v in vars(model).items()
            },
            "kernels": {
                r[0].name: {
                    "time_err": round(float(np.expm1(errs[2 * i])), 4),
                    "power_err": round(float(np.expm1(errs[2 * i + 1])), 4),
                    "fitted": r[1] >= MIN_TIME_S,
                }
                for i, r in enumerate(rows)
            },
        }
    card_wide = {
        "mem_w": mem_w,
        "mem_base_rel": round(card.mem_base_rel, 4),
        "floor_blend": blend,
        "l2_stream_rel": l2_rel,
    }
    out = {"ladder": str(args.ladder), "preset": args.preset, "card": card_wide, "cost": round(cost, 4)}
    print(json.dumps({**out, "kinds": result}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
