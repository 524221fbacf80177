"""The yardsticks of simulated cards: the one-knob, realisable and ideal per-kernel oracles, in the step.

    python -m kdvfs.experiments.oracles
    python -m kdvfs.experiments.oracles --devices sim:h200,sim:h200-fastswitch --workloads gpt3-xl-layer

For each workload and card (a noiseless copy: the simulator's own truth), tuner/oracle.py's
oracles: each schedule evaluated inside the step (device.expected_step, windowed cap and
steady temperature included) and held to the budget; the realisable oracle's groups at the
job's switch sites ("auto": kernels on a -fastswitch card, submodules else). The ideal
per-kernel oracle has free switches, so it is the same problem on a card and its -fastswitch
twin: the twin's search also starts from the ideal found for the card before it. Each row
says how it was computed (`method`) and how long it took on this machine (`seconds`).
Progress lines go to stderr; the JSON to stdout. Simulated figures, no GPU.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass

from kdvfs.runtime.presets import FAST_SWITCH_SUFFIX
from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.tuner.oracle import IN_STEP, oracles
from kdvfs.tuner.run import job_sites


@dataclass(frozen=True)
class Args:
    devices: str = (
        "sim:rtx3080ti,sim:rtx3080ti-fastswitch,sim:h200,sim:h200-fastswitch"  # cards, comma-separated
    )
    workloads: str = "gpt3-xl-layer,gpt3-xl"  # steps (kdvfs tune --workload), comma-separated
    budget: float = 0.01  # the largest slowdown against stock, a fraction


def parse_args() -> Args:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", default=Args.devices, help="simulated cards, comma-separated")
    p.add_argument("--workloads", default=Args.workloads, help="steps, comma-separated")
    p.add_argument("--budget", type=float, default=Args.budget, help="largest slowdown, a fraction")
    a = p.parse_args()
    return Args(a.devices, a.workloads, a.budget)


def commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None


def main() -> None:
    args = parse_args()
    started = time.perf_counter()

    def say(line: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f} s] {line}", file=sys.stderr, flush=True)

    rows = []
    for workload_spec in args.workloads.split(","):
        ideals: dict[str, object] = {}  # a card's ideal, by its name without the suffix
        for spec in args.devices.split(","):
            device = open_device(spec, noise=0.0)
            workload = open_workload(workload_spec, device)
            sites = job_sites(workload, device.switch_latency_s)
            twin = spec.removesuffix(FAST_SWITCH_SUFFIX)
            say(f"{spec} {workload_spec}: {len(workload)} kernels, {len(sites)} switch sites")
            t0 = time.perf_counter()
            o = oracles(
                device,
                workload,
                args.budget,
                sites=sites,
                ideal_starts=[ideals[twin].schedule] if twin in ideals else [],
                say=say,
            )
            ideals[twin] = o.ideal
            seconds = time.perf_counter() - t0
            say(
                f"{spec} {workload_spec}: one-knob {o.one_knob.energy_saving:.2%}, realisable "
                f"{o.realisable.energy_saving:.2%}, ideal {o.ideal.energy_saving:.2%} ({seconds:.0f} s)"
            )
            rows.append(
                {
                    "device": spec,
                    "gpu": device.name,
                    "workload": workload_spec,
                    "kernels": len(workload),
                    "switch_sites": len(sites),
                    "switch_latency_s": device.switch_latency_s,
                    "power_window_s": device.preset.power_window_s,
                    "seconds": round(seconds, 1),
                    **o.json(),
                }
            )
    doc = {
        "source": "simulated",
        "yardstick": IN_STEP,
        "budget": args.budget,
        "commit": commit(),
        "seconds": round(time.perf_counter() - started, 1),
        "rows": rows,
    }
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
