"""Replay the real jobs recorded on an H200 (data/h200/jobs/; an H100's: data/h100/jobs/)
through the tuner of `kdvfs.tune`, as a dry run: what the tuner decides on a real job's noise,
on the CPU, in seconds.

Each recording holds a real job's step-start times, each step's GPU time (CUDA events between
step starts) and the energy counter's updates, at stock clocks. Here they are fed, step by step,
to a TuningRun built as `kdvfs.tune` builds it (botorch, budget 1%, no prior, the recording
card's simulated clock grid: `grid_device`, the default switch latency and counter period of a
real card), exactly as a dry run would see them: the tuner's clock requests change nothing, so
what it measures is the recording.

The recordings carry no per-site split, so the step is one segment (site "step"): the trials are
whole-step trials. A bare recording's steps count whole as the clocks' (wait 0: the bare recorder
did not split the GPU's wait for the host from its work), the noisiest reading of the job; a
recording made under kdvfs.tune (`<job>_tuned`) carries the wait kdvfs.tune measured per step. A run longer than the
recording replays it again from its first recorded step after the warm-up, counter and host
clock carried on ("looped").

Per job: completed and abandoned trials with their standard errors, adoptions (a null test: 0
expected, the clocks never changed), the run's measured saving, the tuner's time noise against
the same series' noise computed offline by the tuner's own estimator (NoiseMeter over
consecutive 2-s windows of whole steps; `noise_ratio` against the regular steps, each stall at
its typical step as the tuner's StallFilter takes it, `noise_ratio_all_steps` against every
step as recorded), and what the job allows (the run's summary).

Every figure is replayed from recorded data (the card and date in each recording's meta), prior none, yardstick: none (a
null test: the right answer is no change).

    python -m kdvfs.experiments.replay_jobs [--seconds 300] [--jobs vision hf sync] [--seed 0] [--recordings DIR]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

JOBS_DIR = Path(__file__).resolve().parent.parent / "data" / "h200" / "jobs"
JOBS = ("vision", "hf", "sync")
WINDOW_S = 2.0  # offline noise: consecutive windows of whole steps this long, s (the tuner's)


@dataclass(frozen=True)
class Args:
    seconds: float = 300.0  # training replayed per job, s (longer than the recording: looped)
    jobs: tuple[str, ...] = JOBS  # recordings in data/h200/jobs to replay
    seed: int = 0  # seeds the strategy
    strategy: str = "botorch"  # the search strategy
    budget: float = 0.01  # largest cumulative slowdown, a fraction
    expected_s: float = 0.0  # how long the job says it trains (kdvfs.tune's expected_s), s; 0 = not said
    recordings: str = ""  # the recordings' folder; "": the checkout's data/h200/jobs


@dataclass(frozen=True)
class Recording:
    """One bare recording after its warm-up: per step (host start s, GPU step s), and the
    counter's updates (host s, J), temperature C and throttle mask by sample."""

    job: str
    steps: list[tuple[float, float]]
    waits: dict[int, float]  # step index -> the wait kdvfs.tune measured (tuned recordings only), s
    counter: list[tuple[float, float]]
    samples: list[tuple[float, float, int, float]]  # host s, temperature C, throttle mask, limit W
    gpu_name: str = "NVIDIA H200"  # the recording card's name (its meta's)


def recordings_folder(recordings: str) -> Path:
    """The recordings' folder Args.recordings names ("": the checkout's data/h200/jobs)."""
    return Path(recordings) if recordings else JOBS_DIR


def load(job: str, folder: Path = JOBS_DIR) -> Recording:
    meta = json.loads((folder / f"{job}_meta.json").read_text())
    warm_s = float(meta["warmup_end_host_s"])
    with gzip.open(folder / f"{job}_steps.csv.gz", "rt") as f:
        kept = [
            (int(r["step"]), float(r["host_start_s"]), float(r["gpu_step_s"]))
            for r in csv.DictReader(f)
            if float(r["host_start_s"]) >= warm_s and r["gpu_step_s"] not in ("", "nan")
        ]
    steps = [(start_s, gpu_s) for _, start_s, gpu_s in kept]
    measured: dict[int, float] = {}
    reports_csv = folder / f"{job}_reports.csv.gz"
    if reports_csv.exists():  # a run under kdvfs.tune: the wait it measured, step by step
        with gzip.open(reports_csv, "rt") as f:
            measured = {int(r["step"]): float(r["wait_s"]) for r in csv.DictReader(f) if r.get("wait_s")}
    # by position in `steps`, as reports() and offline_noise() count them
    waits = {i: measured[step] for i, (step, _, _) in enumerate(kept) if step in measured}
    counter, samples = [], []
    with gzip.open(folder / f"{job}_nvml.csv.gz", "rt") as f:
        for r in csv.DictReader(f):
            t = float(r["host_s"])
            if t < warm_s:
                continue
            if r["counter_changed"] == "1":
                counter.append((t, float(r["energy_mj"]) / 1000.0))
            samples.append(
                (t, float(r["temperature_c"]), int(r["throttle_reasons"]), float(r["power_limit_w"]))
            )
    gpu_name = str((meta.get("nvml") or {}).get("gpu_name") or meta.get("gpu_name_torch") or "NVIDIA H200")
    return Recording(job, steps, waits, counter, samples, gpu_name)


def grid_device(rec: Recording) -> str:
    """The simulated card whose clock grid the replay's tuner searches: the H100's for a
    recording made on an H100 (its memory clock at 2619 MHz alone; the real card also offers
    1593), else the H200's."""
    return "sim:h100" if "H100" in rec.gpu_name else "sim:h200"


def reports(rec: Recording, seconds: float) -> Iterator:
    """The recording as StepReports of a one-segment step, looped until `seconds` of training."""
    from kdvfs.runtime.steps import StepReport

    span_s = rec.steps[-1][0] - rec.steps[0][0]
    energy_span_j = rec.counter[-1][1] - rec.counter[0][1]
    t0 = rec.steps[0][0]
    step, lap = 0, 0
    while True:
        shift_s, shift_j = lap * span_s, lap * energy_span_j
        ci = si = 0
        for i, ((start_s, gpu_s), (end_s, _)) in enumerate(zip(rec.steps, rec.steps[1:])):
            # gpu_s: the step's GPU time (events at step starts); the host's clock places the
            # step and the counter's updates
            readings = []
            while ci < len(rec.counter) and rec.counter[ci][0] <= end_s:
                t, j = rec.counter[ci]
                if t > start_s or step == 0:
                    readings.append((t + shift_s, j + shift_j))
                ci += 1
            while si + 1 < len(rec.samples) and rec.samples[si + 1][0] <= end_s:
                si += 1
            _, temp_c, mask, limit_w = rec.samples[si]
            yield StepReport(
                step=step,
                end_s=end_s + shift_s,
                step_time_s=gpu_s,
                group_times_s=(gpu_s,),
                counter_readings=tuple(readings),
                temperature_c=temp_c,
                throttle_reasons=frozenset({"sw_power_cap"}) if mask & 0x4 else frozenset(),
                power_limit_w=limit_w,
                wait_s=min(rec.waits.get(i, 0.0), gpu_s),
            )
            step += 1
            if end_s + shift_s - t0 >= seconds:
                return
        lap += 1


def offline_noise(rec: Recording, seconds: float) -> tuple[float, float]:
    """The series' time noise per root s by the tuner's estimator (record_job's
    noise_pairs_per_root_s: consecutive WINDOW_S windows of whole steps, each with the next),
    over the steps' GPU times less the waits kdvfs.tune measured (a tuned recording's): over all
    steps, and over the regular steps (record_job's regular_steps: each stall at its typical
    step, as the tuner's StallFilter takes it)."""
    from kdvfs.experiments.record_job import noise_pairs_per_root_s, regular_steps

    t0 = rec.steps[0][0]
    rows = [  # busy: a tuned recording's measured waits left out
        (i, a[0], a[1] - min(rec.waits.get(i, 0.0), a[1]))
        for i, (a, b) in enumerate(zip(rec.steps, rec.steps[1:]))
        if b[0] - t0 <= seconds
    ]
    return noise_pairs_per_root_s(rows, WINDOW_S), noise_pairs_per_root_s(regular_steps(rows), WINDOW_S)


def replay(job: str, args: Args) -> dict:
    from kdvfs.runtime.registry import open_device
    from kdvfs.runtime.step_feed import site_workload
    from kdvfs.tuner.run import DEFAULT_ENERGY_UPDATE_PERIOD_S, DEFAULT_SWITCH_LATENCY_S, Card, TuningRun

    rec = load(job, recordings_folder(args.recordings))
    card = Card(
        name=f"{rec.gpu_name} (replayed: {args.recordings or 'data/h200/jobs'}/{job})",
        grid=open_device(grid_device(rec)).grid,
        switch_latency_s=DEFAULT_SWITCH_LATENCY_S,
        energy_update_period_s=DEFAULT_ENERGY_UPDATE_PERIOD_S,
        source="replayed",
    )
    run = TuningRun(
        card,
        site_workload(("step",)),
        budget=args.budget,
        strategy=args.strategy,
        seed=args.seed,
        start_s=rec.steps[0][0],
        expected_s=args.expected_s or None,
    )
    requests = 0
    last = None
    for report in reports(rec, args.seconds):
        schedule = run.on_step_end(report)
        requests += schedule != last and last is not None
        last = schedule
    summary = run.summary()
    outcomes = summary["outcomes"]
    done = [o for o in outcomes if o["kind"] == "trial" and not o["abandoned"]]
    tuner_noise = summary["job_noise"]["time_cv_per_root_s"]
    offline, regular = offline_noise(rec, args.seconds)
    return {
        "job": job,
        "seconds": round(run.seconds, 1),
        "recorded_s": round(rec.steps[-1][0] - rec.steps[0][0], 1),
        "steps": summary["steps"],
        "phase": summary["phase"],
        "phases": summary["phases"],
        "trials_completed": len(done),
        "trials_abandoned": sum(o["abandoned"] for o in outcomes if o["kind"] == "trial"),
        "trials_undecided": sum(bool(o["undecided"]) for o in done),
        "trial_se": [
            {"blocks": o["blocks"], "energy_se": o["energy_se"], "time_se": o["time_se"]} for o in done
        ],
        "adopted": summary["adopted"],
        "schedule_changes": requests,
        "run_energy_saving": summary["run"]["energy_saving"],
        "run_slowdown": summary["run"]["slowdown"],
        "max_cumulative_slowdown": summary["max_cumulative_slowdown"],
        "time_noise_tuner_per_root_s": tuner_noise,
        "time_noise_offline_per_root_s": offline,
        "time_noise_offline_regular_per_root_s": regular,
        "noise_ratio": tuner_noise / regular if tuner_noise and regular and math.isfinite(regular) else None,
        "noise_ratio_all_steps": tuner_noise / offline
        if tuner_noise and offline and math.isfinite(offline)
        else None,
        "job_noise": summary["job_noise"],
        "source": "replayed",
        "prior": "none",
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="replay_jobs", description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=Args.seconds, help="training replayed per job, s")
    p.add_argument("--jobs", nargs="+", default=list(Args.jobs), help="recordings in the recordings' folder")
    p.add_argument("--recordings", default=Args.recordings,
                   help="the recordings' folder (NAME_meta.json, NAME_steps.csv.gz, ...); default: data/h200/jobs")  # fmt: skip
    p.add_argument("--seed", type=int, default=Args.seed, help="seeds the strategy")
    p.add_argument("--expected-s", type=float, default=Args.expected_s,
                   help="how long the job says it trains (kdvfs.tune's expected_s), s; 0: not said")  # fmt: skip
    ns = p.parse_args(argv)
    if not (math.isfinite(ns.seconds) and ns.seconds > 0):
        p.error(f"--seconds must be a positive number, got {ns.seconds}")
    folder = recordings_folder(ns.recordings)
    if not folder.is_dir():
        p.error(f"--recordings: no folder {str(folder)!r}")
    have = sorted(f.name.removesuffix("_meta.json") for f in folder.glob("*_meta.json"))
    for job in ns.jobs:
        if not (folder / f"{job}_meta.json").exists():
            p.error(f"--jobs: no recording {job!r} in {folder} (have: {', '.join(have)})")
    if not (math.isfinite(ns.expected_s) and ns.expected_s >= 0):
        p.error(f"--expected-s must be a number >= 0, got {ns.expected_s}")
    args = Args(
        seconds=ns.seconds,
        jobs=tuple(ns.jobs),
        seed=ns.seed,
        expected_s=ns.expected_s,
        recordings=ns.recordings,
    )
    rows = [replay(job, args) for job in args.jobs]
    json.dump({"source": "replayed", "prior": "none", "yardstick": "none (null test)", "rows": rows},
              sys.stdout, indent=1)  # fmt: skip
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
