"""kdvfs.tune on a real training loop, dry run: overhead, the null test, the window noise.

    python3 -m kdvfs.experiments.tune_job_check --out $OUT [--callbacks]

NO clock, power-limit, persistence, compute-mode or MIG change is made: the device is
NvmlDevice(..., dry_run=True) (it records the clock calls it would make); everything else is a
read-only NVML query. The job is h200_validation's GPT-3-XL block (`Training`), trained
step after step: `--settle-s` bare (the card reaches its training temperature), `--bare-s`
bare, `--seconds` through kdvfs.tune (strategy `--strategy`, budget `--budget`, the tuner's
own timing), `--bare-s` bare again. Time per step is host time over blocks of `BLOCK_STEPS`
steps closed by a synchronisation, in both loops alike; overhead = the tuned run's time per
step against the mean of the two bare runs. Null test: since no clock is applied, every
candidate is stock; reported are the adoptions (none may claim a saving beyond its own bound),
the tuner's running saving (within +-0.3% of zero), and each trial's measured difference.
Window noise: the tuner's own (energy per step over its 2-s reference windows, step time over
1 s) beside data/h200-window-noise/README.md; what polling the counter cost
(`counter_polling`: reads a second, the period learnt). `--callbacks`: the Lightning and
Hugging Face callbacks tuning a small block (shortened timing), a smoke run
(`--only-callbacks`: that alone). Without a GPU
(`--device cpu`, small sizes) it runs against the fake NVML: KDVFS_NVML_MODULE=fake_pynvml
PYTHONPATH=.:tests/runtime. Prints JSON,
writes tune_job_check.json and the tuning's out_dir under --out. Results: docs/gpu-validation.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kdvfs.experiments.h200_validation import Training, _hf_run, _lightning_run
from kdvfs.runtime.nvml_device import NvmlDevice
from kdvfs.tuner.job_tuning import tune
from kdvfs.tuner.step_tuner import StepTiming

#: Steps per timed block, closed by a synchronisation (about 1 s of the GPT-3-XL block).
BLOCK_STEPS = 150
#: The callbacks' smoke run: the tuner's windows shortened to fit seconds.
SMOKE_TIMING = StepTiming(
    reference_s=3.0,
    trial_window_s=0.5,
    trial_blocks=2,
    trial_max_blocks=2,
    reference_max_s=3.0,
    verify_window_s=1.0,
    verify_blocks=2,
    max_trials_per_group=2,
)


def blocks_for(training: Training, seconds: float, step: Callable[[], None]) -> list[float]:
    """Time per step (s) of each block of BLOCK_STEPS steps, for about `seconds`."""
    per_step: list[float] = []
    training.sync()
    end_s = time.perf_counter() + seconds
    while time.perf_counter() < end_s:
        t0 = time.perf_counter()
        for _ in range(BLOCK_STEPS):
            step()
        training.sync()
        per_step.append((time.perf_counter() - t0) / BLOCK_STEPS)
    return per_step


def null_figures(summary: dict[str, Any]) -> dict[str, Any]:
    """The null test's figures: adoptions against their bounds, the trials' differences."""
    trials = [o for o in summary["outcomes"] if not o["abandoned"] and o["blocks"] > 0]
    diffs = [o["energy_diff"] for o in trials]
    return {
        "adopted": summary["adopted"],
        "adoptions_beyond_bound": [a for a in summary["adoptions"] if a["saving"] > 3.0 * a["saving_se"]],
        "plan_energy_saving": summary["plan_energy_saving"],
        "within_0_3_pct_of_zero": abs(summary["plan_energy_saving"]) <= 0.003,
        "trials": len(trials),
        "abandoned": sum(1 for o in summary["outcomes"] if o["abandoned"]),
        "trial_energy_diff_mean": statistics.fmean(diffs) if diffs else None,
        "trial_energy_diff_sd": statistics.stdev(diffs) if len(diffs) > 1 else None,
        "trial_z": [o["energy_diff"] / o["energy_se"] for o in trials if math.isfinite(o["energy_se"])],
    }


def tuned(args: argparse.Namespace, training: Training) -> tuple[list[float], dict[str, Any]]:
    with NvmlDevice(args.gpu, dry_run=True) as gpu:
        tuning = tune(
            training.model,
            training.optimizer,
            budget=args.budget,
            strategy=args.strategy,
            device=gpu,
            dry_run=True,
            out_dir=args.out / "tune",
            plan_store=False,
            track=False,
        )

        def step() -> None:
            with tuning.step():
                training.step()

        with tuning:
            per_step = blocks_for(training, args.seconds, step)
        summary = tuning.summary()
        summary["dry_run_calls"] = len(gpu.calls)
        summary["first_calls"] = [[round(t - gpu.calls[0][0], 4), n, list(a)] for t, n, a in gpu.calls[:6]]
    return per_step, summary


def callbacks_smoke(args: argparse.Namespace) -> dict[str, Any]:
    """kdvfs.tune driven by a real Lightning Trainer and a real Hugging Face Trainer."""
    results: dict[str, Any] = {}
    for name, run in (("lightning", _lightning_run), ("huggingface", _hf_run)):
        try:
            small = Training(args.device, d_model=256, heads=4, batch=4, seq=128)
            with NvmlDevice(args.gpu, dry_run=True) as gpu:
                tuning = tune(
                    device=gpu,
                    dry_run=True,
                    plan_store=False,
                    track=False,
                    timing=SMOKE_TIMING,
                    progress_s=2.0,
                )
                tuning.trainer.model = small.model  # the block inside the framework's module is hooked
                t0 = time.perf_counter()
                version = run(small, tuning, args.callback_steps)
                summary = tuning.summary()
            results[name] = {
                "version": version,
                "wall_s": round(time.perf_counter() - t0, 1),
                "steps": summary["steps"],
                "phases": summary["phases"],
                "trials": len(summary["outcomes"]),
                "adopted": summary["adopted"],
                "mismatched_steps": summary["mismatched_steps"],
                "tuner_error": summary["tuner_error"],
                "nvml_calls_recorded": len(gpu.calls),
            }
        except Exception:
            results[name] = {"error": traceback.format_exc(limit=8)}
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "tune-job-check")))
    p.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU")
    p.add_argument("--seconds", type=float, default=310.0, help="training through kdvfs.tune, s")
    p.add_argument("--bare-s", type=float, default=40.0, help="each bare run, s")
    p.add_argument("--settle-s", type=float, default=30.0, help="bare training before anything is timed, s")
    p.add_argument("--budget", type=float, default=0.01)
    p.add_argument("--strategy", default="botorch")
    p.add_argument("--callbacks", action="store_true", help="also the Lightning and Hugging Face smoke run")
    p.add_argument("--only-callbacks", action="store_true", help="the callbacks' smoke run alone")
    p.add_argument("--callback-steps", type=int, default=3000)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a check without a GPU")
    p.add_argument("--d-model", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.only_callbacks:
        text = json.dumps(
            {"source": "measured (dry run: no clock applied)", "callbacks": callbacks_smoke(args)}, indent=1
        )
        (args.out / "tune_job_check_callbacks.json").write_text(text + "\n")
        print(text)
        return 0
    training = Training(args.device, d_model=args.d_model, heads=args.heads, batch=args.batch, seq=args.seq)
    blocks_for(training, args.settle_s, training.step)
    bare_a = blocks_for(training, args.bare_s, training.step)
    tuned_blocks, summary = tuned(args, training)
    bare_b = blocks_for(training, args.bare_s, training.step)
    bare_s = statistics.fmean([*bare_a, *bare_b])
    tuned_s = statistics.fmean(tuned_blocks)
    report: dict[str, Any] = {
        "source": "measured on a real GPU (dry run: no clock applied)",
        "args": {k: str(v) for k, v in vars(args).items()},
        "overhead": {
            "bare_ms_per_step": [
                round(1e3 * statistics.fmean(bare_a), 4),
                round(1e3 * statistics.fmean(bare_b), 4),
            ],
            "tuned_ms_per_step": round(1e3 * tuned_s, 4),
            "overhead": tuned_s / bare_s - 1.0,
            "bare_block_cv": statistics.stdev([*bare_a, *bare_b]) / bare_s,
            "tuned_blocks": len(tuned_blocks),
        },
        "null_test": null_figures(summary),
        "window_noise": {
            "energy_per_step_cv_of_2s_windows": summary["window_energy_cv"],
            "readme_power_cv_at_2s": 0.0020,
            "step_time_cv_at_1s": summary["step_time_cv_per_root_s"],
            "readme_step_time_cv_at_1s": 0.0015,
        },
        "tuning": {k: v for k, v in summary.items() if k != "outcomes"},
        "outcomes": summary["outcomes"],
    }
    if args.callbacks:
        report["callbacks"] = callbacks_smoke(args)
    text = json.dumps(report, indent=1)
    (args.out / "tune_job_check.json").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
