"""How fast simulated training runs: CPU seconds per simulated hour of `kdvfs tune`-style
training (TuneSession.run_until) for several presets x workloads x job noise.

Each row opens a simulated card (sim:PRESET, its own noise, seed 0), a workload, the job noise
(none, or a shipped recording), and trains under the tuner (strategy botorch, budget 1%, no
prior: `--prior none`) for --seconds of simulated training, stretches of steps simulated at once
up to each energy-counter update (TuneSession(aggregate_steps=True); --step-by-step for the
old path). Printed (JSON): per row the CPU seconds of run_until, simulated seconds, steps,
reports fed to the tuner and CPU seconds per simulated hour. Figures are simulated, prior none;
the yardstick is process CPU time on this machine.

    python -m kdvfs.experiments.sim_speed [--seconds 3600] [--rows h200:gpt3-xl-layer:none ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from kdvfs.runtime.job_noise import job_noise
from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.tuner.run import NO_PRIOR, job_sites
from kdvfs.tuner.session import TuneSession

DEFAULT_ROWS = [
    "h200:gpt3-xl-layer:none",
    "h200:gpt3-xl-layer:vision",
    "h200:gpt3-xl-layer:sync",
    "h200:gpt3-xl:none",
    "h200:gpt3-xl:hf",
    "h200:gpt3-xl-dp8:none",
    "rtx3080ti:gpt3-xl-layer:hf",
    "a100:gpt3-xl-layer:none",
    "h100:gpt3-xl-layer:vision",
]

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--seconds", type=float, default=3600.0, help="simulated training per row, s")
parser.add_argument(
    "--rows", nargs="*", default=DEFAULT_ROWS, help="PRESET:WORKLOAD:JOBNOISE (none: no job noise)"
)
parser.add_argument(
    "--step-by-step", action="store_true", help="one report per step, each step kernel by kernel"
)
parser.add_argument("--strategy", default="botorch")
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
args = parser.parse_args()

commit = subprocess.run(
    ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
).stdout.strip()

rows = []
for spec in args.rows:
    preset, workload_name, noise_name = spec.split(":")
    device = open_device(f"sim:{preset}", seed=args.seed)
    workload = open_workload(workload_name, device)
    session = TuneSession(
        device,
        workload,
        strategy=args.strategy,
        budget=0.01,
        seed=args.seed,
        prior=NO_PRIOR,
        sites=job_sites(workload, device.switch_latency_s, None),
        job_noise=None if noise_name == "none" else job_noise(noise_name),
        aggregate_steps=not args.step_by_step,
    )
    reports: list[int] = []
    count = reports.append

    cpu0, wall0 = time.process_time(), time.perf_counter()
    session.run_until(args.seconds, on_report=lambda _r, count=count: count(1))
    cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    row = {
        "preset": preset,
        "workload": workload_name,
        "job_noise": noise_name,
        "simulated_s": round(session.seconds, 1),
        "steps": session.job.steps,
        "reports": len(reports),
        "cpu_s": round(cpu_s, 2),
        "wall_s": round(wall_s, 2),
        "cpu_s_per_sim_hour": round(cpu_s * 3600.0 / session.seconds, 2),
        "phase": session.phase_log[-1][1],
    }
    rows.append(row)
    print(json.dumps(row), file=sys.stderr, flush=True)

result = {
    "what": "CPU seconds of TuneSession.run_until per simulated hour (simulated, prior none, yardstick: process CPU time)",
    "commit": commit,
    "aggregate_steps": not args.step_by_step,
    "strategy": args.strategy,
    "seconds": args.seconds,
    "rows": rows,
    "max_cpu_s_per_sim_hour": max(r["cpu_s_per_sim_hour"] for r in rows),
}
print(json.dumps(result, indent=1))
if args.out is not None:
    args.out.write_text(json.dumps(result, indent=1) + "\n")
