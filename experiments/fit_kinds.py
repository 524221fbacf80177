"""Fit the simulated card's per-kind constants (presets.KindModel) to a size ladder.

    python -m kdvfs.experiments.fit_kinds [--ladder data/h200/kernels_ladder.csv] [--preset h200]

For each kernel kind of the ladder (`kdvfs probe --ladder`, measured on a real card), the
kind's constants -- its share of the peak FLOP rate or of the streaming bandwidth, its
small-launch floor, and its SM activity while streaming -- are fitted by least squares on the
log errors of time per call and power of every ladder kernel of that kind that ran 5 us or
more, the simulated card in auto mode at the temperature the probe recorded (so the power
cap and its clock pull-down act as on the card). One set of constants per kind, never per
kernel. Prints JSON: the constants, and each kernel's time and power error with them; the
preset's constants in runtime/presets.py cite this command.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from kdvfs.runtime.presets import KindModel, get_preset
from kdvfs.runtime.probe_kernels import parse_probe_kernel
from kdvfs.runtime.simulator import operating_point
from kdvfs.runtime.tables import read_csv
from kdvfs.runtime.types import Kernel

MIN_TIME_S = 5e-6  # s: the target holds kernels of 5 us or more
FLOOR_STARTS_US = (1.0, 5.0, 20.0)  # us: starting values of the floor for the least squares


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
    """The parameter vector of the fit as a KindModel (compute kinds have no streaming part)."""
    if kind in ("gemm", "attention"):
        return KindModel(rate_eff=float(x[0]), floor_s=float(x[1]) * 1e-6)
    return KindModel(bw_eff=float(x[0]), floor_s=float(x[1]) * 1e-6, act_stream=float(x[2]))


def errors(preset, kind: str, model: KindModel, rows) -> np.ndarray:
    card = replace(preset, kinds=((kind, model),))
    out = []
    for kernel, time_s, power_w, temp_c in rows:
        op = operating_point(card, kernel, None, temp_c, card.power_cap_w)
        out += [np.log(op.time_s / time_s), np.log(op.power_w / power_w)]
    return np.array(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ladder", type=Path, default=Path("data/h200/kernels_ladder.csv"), help="probe CSV")
    p.add_argument("--preset", default="h200", help="simulated card the ladder was measured on")
    args = p.parse_args(argv)

    preset = replace(get_preset(args.preset), kinds=())
    result: dict[str, dict] = {}
    for kind, rows in sorted(rows_by_kind(args.ladder).items()):
        fit_rows = [r for r in rows if r[1] >= MIN_TIME_S]
        if kind in ("gemm", "attention"):
            x0, lo, hi = [1.0, 2.0], [0.2, 0.0], [1.2, 50.0]
        else:
            x0, lo, hi = [0.7, 2.0, 0.4], [0.2, 0.0, 0.0], [1.2, 50.0, 2.0]
        fits = [
            least_squares(
                lambda x, kind=kind, rows=fit_rows: errors(preset, kind, model_of(kind, x), rows),
                [x0[0], floor_us, *x0[2:]],
                bounds=(lo, hi),
            )
            for floor_us in FLOOR_STARTS_US  # the floor enters through max(): start it at several values
        ]
        model = model_of(kind, min(fits, key=lambda f: f.cost).x)
        errs = errors(preset, kind, model, rows)
        result[kind] = {
            "model": {
                k: (None if v is None else round(v, 9 if k == "floor_s" else 3))
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
    print(json.dumps({"ladder": str(args.ladder), "preset": args.preset, "kinds": result}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
