"""The PyTorch integration on a real GPU, dry-run only: overhead, discovery, energy, clock calls.

    cd REPO && PYTHONPATH=. python3 -m kdvfs.experiments.h200_validation --out $OUT \
        --probe-trace .validation/gpt3xl_block_kernels.csv --callbacks

NO clock, power-limit, persistence, compute-mode or MIG change is made: the only device is
NvmlDevice(..., dry_run=True); everything else is a read-only NVML query. The workload is one
GPT-3-XL-sized transformer block (`Block`, `Training`), as in the H200 probe. `measure`:
(1) discover the step, compare it with the probe's trace (`compare_with_probe`); (2) make a
pass-level plan (`make_plan`, `PASS_CLOCKS_MHZ`); (3) alternate bare runs with runs under
KdvfsTrainer (`timed`, `tuned_run`): overhead = median over the pairs of tuned / bare - 1, per
step host time between two synchronisations; (4) the trainer's energy against the raw counter
(`RawCounter`) and the recorded clock calls; (5) optionally Lightning and Hugging Face
(`callbacks_check`). Prints JSON; writes validation.json, workload.json, clock_calls.json, the
last run's records and plan under --out. Results: docs/gpu-validation.md.
"""

from __future__ import annotations

import argparse
import difflib
import itertools
import json
import os
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from kdvfs.runtime.distributed import nvml_index
from kdvfs.runtime.nvml_device import NvmlDevice, load_nvml
from kdvfs.runtime.schedule import Schedule
from kdvfs.runtime.torch_discovery import discover_workload, workload_sites
from kdvfs.runtime.torch_integration import KdvfsTrainer, hf_callback, lightning_callback, site_schedule
from kdvfs.runtime.trace import load_trace
from kdvfs.runtime.types import ClockPair, Workload
from kdvfs.tuner.plan import Plan

PASS_CLOCKS_MHZ = {"forward": (1980, 3201), "backward": (1755, 3201), "optimizer": (1200, 3201)}
"""The dry-run plan's clocks per pass: a shape to exercise the controller, not a tuned plan."""


class Block(nn.Module):
    """A pre-norm transformer block: LN, QKV, causal SDPA, projection; LN, 4d GELU MLP.

    Args:
        d_model: model width (GPT-3 XL: 2048).
        heads: attention heads (GPT-3 XL: 16).
    """

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv, self.proj = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        self.fc1, self.fc2 = nn.Linear(d_model, 4 * d_model), nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Training:
    """The block, its AdamW and one batch; step() is one bf16-autocast training step.

    Args:
        device: torch device type, "cuda" or "cpu".
        d_model, heads: as Block.
        batch: sequences per batch.
        seq: tokens per sequence.
    """

    def __init__(self, device: str, d_model: int, heads: int, batch: int, seq: int) -> None:
        torch.manual_seed(0)
        self.device = device
        self.model = Block(d_model, heads).to(device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.x = torch.randn(batch, seq, d_model, device=device)

    def step(self) -> None:
        with torch.autocast(self.device, dtype=torch.bfloat16):
            out = self.model(self.x)
        out.float().pow(2).mean().backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()


class RawCounter:
    """NVML's total-energy counter, read directly (not through the device under test).

    Args:
        index: the GPU's NVML index.
    """

    def __init__(self, index: int) -> None:
        self.nvml = load_nvml()
        self.handle = self.nvml.nvmlDeviceGetHandleByIndex(index)

    def joules(self) -> float:
        return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1000.0


def timed(training: Training, counter: RawCounter, steps: int, run: Callable[[], None]) -> dict[str, float]:
    """Per-step wall time and raw-counter energy of `steps` calls of run()."""
    training.sync()
    e0, t0 = counter.joules(), time.perf_counter()
    for _ in range(steps):
        run()
    training.sync()
    t1, e1 = time.perf_counter(), counter.joules()
    return {
        "time_per_step_s": (t1 - t0) / steps,
        "energy_per_step_j": (e1 - e0) / steps,
        "wall_s": t1 - t0,
        "energy_j": e1 - e0,
    }


def tuned_run(
    training: Training,
    counter: RawCounter,
    gpu: NvmlDevice,
    workload: Workload,
    plan: Plan,
    steps: int,
    window_steps: int,
    out_dir: Path | None,
) -> dict[str, Any]:
    """One run under KdvfsTrainer; timing and raw energy from after set-up to before close."""
    calls_before = len(gpu.calls)
    t_setup = time.perf_counter()
    tuner = KdvfsTrainer(
        gpu,
        workload,
        plan,
        model=training.model,
        optimizer=training.optimizer,
        window_steps=window_steps,
        out_dir=out_dir,
    )
    setup_s = time.perf_counter() - t_setup

    def one() -> None:
        with tuner.step():
            training.step()

    figures = timed(training, counter, steps, one)
    t_close = time.perf_counter()
    tuner.close()
    figures["close_s"] = time.perf_counter() - t_close
    figures["setup_s"] = setup_s
    windows = tuner.windows
    records = tuner.records
    figures["trainer_energy_per_step_j"] = sum(w.energy_j for w in windows) / sum(w.steps for w in windows)
    figures["trainer_windows"] = [[w.steps, w.energy_j, w.wall_s, w.partial] for w in windows]
    figures["trainer_gpu_time_per_step_s"] = statistics.median(r.time_s for r in records)
    figures["steps_recorded"] = len(records)
    figures["mismatched_steps"] = len(tuner.controller.mismatched_steps)
    figures["clock_requests"] = len(tuner.controller.requests)
    figures["nvml_calls"] = len(gpu.calls) - calls_before
    return figures


def compare_with_probe(workload: Workload, probe: Workload) -> dict[str, Any]:
    """Kernel count, short-name sequence match, per-kernel time of the matched kernels."""
    mine = [k.name.split(".", 1)[1] for k in workload.kernels]
    theirs = [k.name.split(".", 1)[1] for k in probe.kernels]
    matcher = difflib.SequenceMatcher(a=theirs, b=mine, autojunk=False)
    pairs = [
        (i, j)
        for block in matcher.get_matching_blocks()
        for i, j in zip(range(block.a, block.a + block.size), range(block.b, block.b + block.size))
    ]
    ratios = sorted(workload.kernels[j].ref_time_s / probe.kernels[i].ref_time_s for i, j in pairs)
    differences = [
        {"op": tag, "probe": theirs[a0:a1], "discovered": mine[b0:b1]}
        for tag, a0, a1, b0, b1 in matcher.get_opcodes()
        if tag != "equal"
    ]
    by_pass = {
        p: {
            "probe_ms": 1e3 * sum(k.ref_time_s for k in probe.kernels if k.pass_name == p),
            "discovered_ms": 1e3 * sum(k.ref_time_s for k in workload.kernels if k.pass_name == p),
            "probe_kernels": sum(k.pass_name == p for k in probe.kernels),
            "discovered_kernels": sum(k.pass_name == p for k in workload.kernels),
        }
        for p in ("forward", "backward", "optimizer")
    }
    return {
        "kernels": {"probe": len(probe), "discovered": len(workload)},
        "distinct_short_names": {"probe": len(set(theirs)), "discovered": len(set(mine))},
        "name_sequence_similarity": matcher.ratio(),
        "matched_kernels": len(pairs),
        "differences": differences,
        "kernel_time_ms": {
            "probe": 1e3 * sum(k.ref_time_s for k in probe.kernels),
            "discovered": 1e3 * sum(k.ref_time_s for k in workload.kernels),
        },
        "matched_time_ratio_discovered_over_probe": {
            "median": statistics.median(ratios),
            "p10": ratios[len(ratios) // 10],
            "p90": ratios[(9 * len(ratios)) // 10],
        }
        if ratios
        else None,
        "by_pass": by_pass,
    }


def make_plan(gpu: NvmlDevice, workload: Workload, stock: dict[str, float]) -> tuple[Plan, Schedule]:
    """A pass-level plan at PASS_CLOCKS_MHZ (nearest supported pairs); its expected figures are
    the stock step's, split by kernel time: it claims no saving (it was not tuned)."""
    pairs = {p: gpu.nearest_pairs(ClockPair(*mhz), 1)[0] for p, mhz in PASS_CLOCKS_MHZ.items()}
    schedule = site_schedule(workload, pairs)
    bounds = [start for start, _ in schedule.groups] + [len(workload)]
    kernel_s = sum(k.ref_time_s for k in workload.kernels)
    spans = []
    for (start, pair), end in zip(schedule.groups, bounds[1:]):
        share = sum(k.ref_time_s for k in workload.kernels[start:end]) / kernel_s
        spans.append((start, end, pair, share * stock["time_per_step_s"], share * stock["energy_per_step_j"]))
    plan = Plan.from_groups(
        gpu_name=gpu.name,
        grid=gpu.grid,
        workload=workload,
        budget=0.0,
        groups=spans,
        reference_time_s=stock["time_per_step_s"],
        reference_energy_j=stock["energy_per_step_j"],
        source="measured",
        strategy="h200-validation: fixed pass-level clocks, dry run, not tuned",
        measurements=0,
    )
    return plan, schedule


def workload_doc(workload: Workload) -> dict[str, Any]:
    sites, kernel_sites = workload_sites(workload)
    meta = dict(workload.meta)
    ops, modules = meta["kernel_ops"].split("|"), meta["kernel_modules"].split("|")
    return {
        "name": workload.name,
        "signature": workload.signature,
        "meta": meta,
        "kernels": [
            {
                "name": k.name,
                "pass": k.pass_name,
                "ref_time_us": 1e6 * k.ref_time_s,
                "op": op,
                "module": module,
                "site": sites[s],
            }
            for k, op, module, s in zip(workload.kernels, ops, modules, kernel_sites)
        ],
    }


def callbacks_check(device: str, index: int, steps: int = 20) -> dict[str, Any]:
    """KdvfsTrainer driven by a real Lightning Trainer and a real Hugging Face Trainer (small
    block, dry-run device): did every step get recorded, and did every site fire?"""
    results: dict[str, Any] = {}
    for name, run in (("lightning", _lightning_run), ("huggingface", _hf_run)):
        try:
            small = Training(device, d_model=256, heads=4, batch=4, seq=128)
            workload = discover_workload(
                small.step, steps=2, model=small.model, optimizer=small.optimizer, name="small_block"
            )
            with NvmlDevice(index, dry_run=True) as gpu:
                schedule = site_schedule(
                    workload, {p: gpu.nearest_pairs(ClockPair(*m), 1)[0] for p, m in PASS_CLOCKS_MHZ.items()}
                )
                with KdvfsTrainer(gpu, workload, schedule, model=small.model, window_steps=5) as tuner:
                    version = run(small, tuner, steps)
            results[name] = {
                "version": version,
                "steps_recorded": len(tuner.records),
                "mismatched_steps": len(tuner.controller.mismatched_steps),
                "clock_requests": len(tuner.controller.requests),
                "nvml_calls": len(gpu.calls),
            }
        except Exception:
            results[name] = {"error": traceback.format_exc(limit=6)}
    return results


def _lightning_run(small: Training, tuner: KdvfsTrainer, steps: int) -> str:
    import lightning
    import lightning.pytorch as pl

    class Lit(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.block = small.model

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            with torch.autocast(small.device, dtype=torch.bfloat16):
                out = self.block(batch[0])
            return out.float().pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.block.parameters(), lr=1e-4)

    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(small.x.cpu().repeat(steps, 1, 1)), batch_size=small.x.shape[0]
    )
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="gpu" if small.device == "cuda" else "cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[lightning_callback(tuner)],
    )
    trainer.fit(Lit(), data)
    return lightning.__version__


def _hf_run(small: Training, tuner: KdvfsTrainer, steps: int) -> str:
    import transformers
    from transformers import Trainer, TrainingArguments

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = small.model

        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": self.block(x).float().pow(2).mean()}

    data = [{"x": row} for row in small.x.cpu().repeat(steps, 1, 1)]
    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(
            output_dir=tmp,
            max_steps=steps,
            per_device_train_batch_size=small.x.shape[0],
            bf16=small.device == "cuda",
            report_to=[],
            save_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        Trainer(model=Model(), args=args, train_dataset=data, callbacks=[hf_callback(tuner)]).train()
    return transformers.__version__


def _repeat_intervals(calls: list[Any]) -> dict[str, dict[str, float]]:
    """Per core clock locked: median and max time between one lock to it and the next (a
    controller that follows the GPU makes them one step apart)."""
    times: dict[str, list[float]] = {}
    for t, name, args in calls:
        if name == "nvmlDeviceSetGpuLockedClocks":
            times.setdefault(str(args[0]), []).append(t)
    return {
        core: {"median": 1e3 * statistics.median(gaps), "max": 1e3 * max(gaps)}
        for core, ts in times.items()
        if (gaps := [b - a for a, b in itertools.pairwise(ts)])
    }


def _call(call: list[Any], t0: float) -> str:
    """A recorded NVML call as `+SECONDS name(args)`."""
    t, name, args = call
    return f"+{t - t0:.4f}s {name}({', '.join(map(str, args))})"


def measure(args: argparse.Namespace, report: dict[str, Any]) -> None:
    """Steps 1-5 of the module docstring, filling `report`."""
    training = Training(args.device, args.d_model, args.heads, args.batch, args.seq)
    counter = RawCounter(args.gpu)
    with NvmlDevice(args.gpu, dry_run=True) as gpu:
        report["gpu"] = {
            "name": gpu.name,
            "driver": gpu.driver_version(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "grid_pairs": len(gpu.grid),
            "power_limit_w": gpu.power_limit_w(),
            "energy_counter": gpu.energy_counter,
            "clocks_idle_mhz": gpu.clocks_mhz().as_list(),
            "temperature_c": gpu.temperature_c(),
        }
        if args.device == "cuda":
            with _noting(report, "nvml_index"):
                report["gpu"]["nvml_index_of_cuda_0"] = nvml_index(0)
        for _ in range(20):
            training.step()
        t = time.perf_counter()
        workload = discover_workload(
            training.step,
            steps=3,
            warmup=2,
            model=training.model,
            optimizer=training.optimizer,
            name="gpt3xl_block",
        )
        report["discovery_s"] = time.perf_counter() - t
        (args.out / "workload.json").write_text(json.dumps(workload_doc(workload), indent=1) + "\n")
        if args.probe_trace is not None:
            with _noting(report, "probe_comparison"):
                report["probe_comparison"] = compare_with_probe(workload, load_trace(args.probe_trace))

        warm = timed(
            training, counter, max(args.steps, 200), training.step
        )  # thermal settling, and the stock figures
        plan, schedule = make_plan(gpu, workload, warm)
        report["plan"] = {
            "groups": [
                [g.kernels[0], g.kernels[-1], len(g.kernels), g.core_mhz, g.mem_mhz] for g in plan.groups
            ],
            "schedule": [[start, None if q is None else q.as_list()] for start, q in schedule.groups],
        }

        runs: list[dict[str, Any]] = report.setdefault("runs", [])
        for r in range(args.repeats):
            bare = timed(training, counter, args.steps, training.step)
            last = r == args.repeats - 1
            calls_from = len(gpu.calls)
            tuned = tuned_run(
                training,
                counter,
                gpu,
                workload,
                plan,
                args.steps,
                args.window_steps,
                args.out if last else None,
            )
            runs.append({"bare": bare, "tuned": tuned})
        calls = gpu.calls[calls_from:]
        (args.out / "clock_calls.json").write_text(json.dumps(calls) + "\n")
        report["temperature_end_c"] = gpu.temperature_c()
        report["throttle_reasons_end"] = sorted(gpu.throttle_reasons())

    overheads = [run["tuned"]["time_per_step_s"] / run["bare"]["time_per_step_s"] - 1.0 for run in runs]
    bare_s = statistics.median(run["bare"]["time_per_step_s"] for run in runs)
    tuned_s = statistics.median(run["tuned"]["time_per_step_s"] for run in runs)
    raw_j = sum(run["tuned"]["energy_j"] for run in runs) / (args.steps * len(runs))
    trainer_j = statistics.fmean(run["tuned"]["trainer_energy_per_step_j"] for run in runs)
    report["summary"] = {
        "bare_time_per_step_ms": 1e3 * bare_s,
        "tuned_time_per_step_ms": 1e3 * tuned_s,
        "overhead_per_pair": overheads,
        "overhead_median": statistics.median(overheads),
        "overhead_of_medians": tuned_s / bare_s - 1.0,
        "trainer_gpu_time_per_step_ms": 1e3
        * statistics.median(run["tuned"]["trainer_gpu_time_per_step_s"] for run in runs),
        "energy_per_step_j": {
            "trainer_windows": trainer_j,
            "raw_counter_tuned_runs": raw_j,
            "raw_counter_bare_runs": sum(run["bare"]["energy_j"] for run in runs) / (args.steps * len(runs)),
            "trainer_over_raw": trainer_j / raw_j - 1.0,
            "trainer_over_raw_per_run": [
                run["tuned"]["trainer_energy_per_step_j"] / run["tuned"]["energy_per_step_j"] - 1.0
                for run in runs
            ],
        },
        "clock_calls_last_run": {
            "count": len(calls),
            "per_step": len(calls) / args.steps,
            "repeat_interval_ms": _repeat_intervals(calls),
            "first": [_call(c, calls[0][0]) for c in calls[:8]],
            "last": [_call(c, calls[0][0]) for c in calls[-4:]],
        },
    }
    if args.callbacks:
        report["callbacks"] = callbacks_check(args.device, args.gpu)


@contextmanager
def _noting(report: dict[str, Any], key: str) -> Iterator[None]:
    """Record a failure of one optional part under report["errors"][key] and go on."""
    try:
        yield
    except Exception:
        report.setdefault("errors", {})[key] = traceback.format_exc(limit=8)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "h200-validation")))
    p.add_argument("--steps", type=int, default=400, help="training steps per run")
    p.add_argument("--repeats", type=int, default=6, help="pairs of runs (bare, tuned), alternating")
    p.add_argument("--window-steps", type=int, default=100)
    p.add_argument("--probe-trace", type=Path, default=None, help="the probe's gpt3xl_block_kernels.csv")
    p.add_argument(
        "--callbacks", action="store_true", help="also drive the trainer from Lightning and Hugging Face"
    )
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU")
    p.add_argument("--d-model", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    report: dict[str, Any] = {
        "command": vars(args) | {"out": str(args.out), "probe_trace": str(args.probe_trace)},
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(started)),
    }
    failed = False
    try:
        measure(args, report)
    except Exception:
        report.setdefault("errors", {})["measure"] = traceback.format_exc(limit=12)
        failed = True
    report["elapsed_s"] = time.time() - started
    (args.out / "validation.json").write_text(json.dumps(report, indent=1) + "\n")
    shown = report | {
        "probe_comparison": {
            k: v for k, v in report.get("probe_comparison", {}).items() if k != "differences"
        }
    }
    for key in (
        "gpu",
        "discovery_s",
        "plan",
        "probe_comparison",
        "summary",
        "callbacks",
        "errors",
        "elapsed_s",
    ):
        if key in shown:  # one JSON line per part
            print(json.dumps({key: shown[key]}))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
