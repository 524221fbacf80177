"""Fit the job-noise model (runtime/job_noise.py) to the recorded H200 training jobs.

    python -m kdvfs.experiments.fit_job_noise [--jobs-dir data/h200/jobs] [--out FILE]

For each recorded job (`vision`, `hf`, `sync`: data/h200/jobs/, experiments/record_job.py's
files), `fit_job_noise` on its steps and NVML samples after the warm-up: the GPU's own step,
the relative waits' quantiles, the AR(1) coefficient that keeps the variance of 1-s means,
the periodic syncs, and the power the card drew while waiting and while busy; and for
`vision-tuned` and `hf-tuned`, the same fits with the share of the wait that the job under
kdvfs.tune saw after its steps (its `_tuned_20261205_reports`; the rest fell inside the steps,
in the busy time the tuner holds to the budget). Prints JSON
(the form of runtime/job_noise.json, which kdvfs ships and `kdvfs tune --job-noise NAME`
reads; `--out` writes it there too). About 5 s of one core.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kdvfs.runtime.job_noise import fit_job_noise, seen_wait_share
from kdvfs.runtime.tables import REPO_DATA_DIR
from kdvfs.runtime.types import KdvfsError

JOBS = ("vision", "hf", "sync")
"""The recorded jobs, by name."""

TUNED = {"vision-tuned": ("vision", "vision_tuned_20261205"), "hf-tuned": ("hf", "hf_tuned_20261205")}
"""Noises of a bare recording's waits split as the same job under kdvfs.tune saw them: name ->
(the bare job, the tuned recording whose reports give the seen share)."""


def fit_all(jobs_dir: Path) -> dict:
    """Every recorded job's fitted noise, as job_noise.json holds them."""
    fitted = {}
    for job in JOBS:
        steps, nvml = jobs_dir / f"{job}_steps.csv.gz", jobs_dir / f"{job}_nvml.csv.gz"
        if not steps.is_file():
            raise KdvfsError(f"{steps}: no such recording (pass --jobs-dir DIR)")
        fitted[job] = fit_job_noise(steps, nvml if nvml.is_file() else None).to_dict()
    for name, (job, tuned) in TUNED.items():
        reports = jobs_dir / f"{tuned}_reports.csv.gz"
        if not reports.is_file():
            raise KdvfsError(f"{reports}: no such recording (pass --jobs-dir DIR)")
        fitted[name] = {**fitted[job], "name": name, "seen_wait_share": seen_wait_share(reports)}
    return {
        "source": "data/h200/jobs (one NVIDIA H200, stock clocks, 300 s after a 30-s warm-up each)",
        "command": "python -m kdvfs.experiments.fit_job_noise --out runtime/job_noise.json",
        "jobs": fitted,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--jobs-dir",
        type=Path,
        default=REPO_DATA_DIR / "h200" / "jobs",
        help="folder of the recordings (default: the checkout's data/h200/jobs)",
    )
    p.add_argument("--out", type=Path, help="also write the JSON here (runtime/job_noise.json)")
    args = p.parse_args(argv)
    try:
        doc = fit_all(args.jobs_dir)
    except KdvfsError as e:
        p.error(str(e))
    text = json.dumps(doc, indent=1) + "\n"
    sys.stdout.write(text)
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
