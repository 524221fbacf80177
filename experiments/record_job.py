"""Record a real training job's step times and the GPU's NVML readings, read-only, at stock clocks.

    python experiments/record_job.py --job vision|hf|sync|lightning --seconds 300 --out DIR
    python experiments/record_job.py --job vision --tune 1 --seconds 300 --out DIR   (under kdvfs.tune)

Standalone (torch, pynvml and the framework libraries only), so it runs on a bare GPU machine;
`--tune 1` runs the same job under `kdvfs.tune` in dry run and imports kdvfs. It never changes a
clock, power limit or any other GPU setting: every NVML call here is a query (the tuner's device
is NvmlDevice(dry_run=True): it records the clock calls it would make and makes none).
Map, top to bottom:
  Args          every knob, one line each, with its unit
  StepClock     per step: a CUDA event recorded at the step's start on the training stream and
                the host's perf_counter; events are resolved `lag` steps later with query(),
                so the recorder adds no synchronisation to the job
  NvmlSampler   a thread that reads, every `sample_ms`: the energy counter (mJ) and whether it
                changed, SM and memory clocks, power, temperature, throttle reasons, power limit
  run_vision    torchvision ResNet-50, bf16 autocast, channels_last, SGD with momentum, fed by a
                DataLoader whose workers decode JPEGs and augment them on the CPU
  run_hf        Hugging Face Trainer on GPT-2 small (random init, synthetic tokens); step starts
                come from a TrainerCallback's on_step_begin
  run_sync      a plain loop of an nn.TransformerEncoder LM, AdamW, with host synchronisation:
                loss.item() every 10 steps, a 20-batch evaluation every 200, a checkpoint every 500
  run_lightning a Lightning Trainer on timm's ViT-S/16, bf16-mixed, fed by the vision job's decode
                workers (4), loss.item() every 10 steps
  Tuning        --tune 1: kdvfs.tune around the job (dry run, strategy and budget from Args, no
                prior, warm-up = --warmup-s), the tuner's StepReports kept beside the steps
  summarise     step-time statistics after the warm-up, power, clocks, throttling, counter period
  noise_per_root_s  the step-time noise of a run from its per-step GPU times, as the tuner
                defines it: relative s.d. of window means x sqrt(window length)
  compare_tuned what the tuner measured against the same run's per-step GPU times
  main          parse, run the job, write <name>_steps.csv.gz, <name>_nvml.csv.gz, <name>_meta.json
                (<name>: the job, `<job>_tuned` under --tune 1, which adds _reports.csv.gz and
                _requests.csv.gz, the controller's clock requests)
  arms_against_stock  each trial arm's CUDA-event step times against the stock steps around it
Without CUDA (or with --device cpu) the step times come from perf_counter alone; without NVML
the sampler is skipped. Both are said in the meta file.
"""

from __future__ import annotations

import collections
import contextlib
import csv
import dataclasses
import datetime
import gc
import gzip
import itertools
import json
import logging
import math
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass
class Args:
    job: str = "vision"  # job kind: vision, hf, sync or lightning
    seconds: float = 300.0  # recorded time after the warm-up; s
    warmup_s: float = 30.0  # time run first and left out of the summary (still in the CSV); s
    out: str = "."  # directory for the three output files
    device: str = "cuda"  # torch device; cpu runs the job on the CPU with host timing only
    sample_ms: float = 10.0  # NVML sampling period; ms
    lag: int = 8  # steps between recording a step-start event and resolving it; steps
    batch: int = 0  # images or sequences per step; 0 = the job's standard size (128, 16, 32)
    workers: int = 8  # DataLoader worker processes (vision; hf uses 4 unless set lower); processes
    image_px: int = 224  # crop side of the vision job's images; px
    seq_len: int = 512  # tokens per sequence (hf, sync); tokens
    layers: int = 12  # transformer layers (hf, sync); layers
    d_model: int = 1024  # width of the sync job's transformer; features
    item_every: int = 10  # sync: loss.item() period; steps
    eval_every: int = 200  # sync: evaluation period; steps
    eval_batches: int = 20  # sync: batches per evaluation; batches
    ckpt_every: int = 500  # sync: checkpoint (torch.save of the state dict) period; steps
    seed: int = 0  # random seed for weights and synthetic data
    synthetic: int = 0  # vision: 1 = one fixed batch made on the GPU, no DataLoader (a GPU-bound loop)
    tune: int = 0  # 1 = run under kdvfs.tune in dry run (no clock is changed); 0 = bare
    strategy: str = "botorch"  # tune: the search strategy
    budget: float = 0.01  # tune: the slowdown budget; fraction
    track: int = 0  # tune: 1 = the MLflow run kdvfs.tune opens by default (a file store in a temp dir)
    reference_max_s: float = 0.0  # tune: the tuner's longest reference of a noisy job, s; 0 = its default
    bare: str = ""  # tune: a folder with the bare recording of the job (<job>_steps.csv.gz, _meta.json)


def parse_fields(cls: type, argv: list[str], prog: str, doc: str) -> Any:
    """`--name value` pairs (dashes or underscores) onto the dataclass `cls`, each value of its
    field's default's type; `--help` prints `doc` and lists the knobs. Bad input exits with one
    line naming `prog` and the option."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if "-h" in argv or "--help" in argv:
        print(doc)
        for f in fields.values():
            print(f"  --{f.name.replace('_', '-')} (default {f.default!r})")
        sys.exit(0)
    if len(argv) % 2:
        sys.exit(f"{prog}: expected --name value pairs, got {argv}")
    values: dict[str, Any] = {}
    for key, raw in zip(argv[::2], argv[1::2]):
        name = key.lstrip("-").replace("-", "_")
        if not key.startswith("--") or name not in fields:
            sys.exit(f"{prog}: unknown option {key}")
        kind = type(fields[name].default)
        try:
            values[name] = kind(raw)
        except ValueError:
            sys.exit(f"{prog}: {key} takes a {kind.__name__}, got {raw!r}")
    return cls(**values)


def parse_args(argv: list[str]) -> Args:
    """`--name value` pairs (dashes or underscores) onto Args; `--help` lists the knobs."""
    args = parse_fields(Args, argv, "record_job", __doc__)
    if args.job not in JOBS:
        sys.exit(f"record_job: --job must be one of {', '.join(JOBS)}, got {args.job!r}")
    return args


# ---------------------------------------------------------------------------------------------
# Step clock: CUDA events at each step's start, resolved off the hot path.


class StepClock:
    """Marks step starts; keeps host times and resolves GPU times `lag` steps later.

    Args:
        stream_device: the CUDA device whose current stream carries the training work, or None
            to time with the host clock only.
        lag: how many steps a recorded event waits before it is queried (query() never blocks).
        t0_s: perf_counter origin of every host time written out; s.
        run_s: how long the job runs, counted from its first step (warm-up included); s.
    """

    def __init__(self, stream_device: torch.device | None, lag: int, t0_s: float, run_s: float) -> None:
        self.cuda = stream_device is not None
        self.lag = max(1, lag)
        self.t0_s, self.run_s = t0_s, run_s
        self.host_s: list[float] = []  # step start, host; s since t0
        self.gpu_start_ms: list[float] = []  # step start, GPU; ms after the first event
        self._pending: collections.deque[torch.cuda.Event] = collections.deque()
        self._first: torch.cuda.Event | None = None
        self.finished = False

    def step_begin(self) -> None:
        self.host_s.append(time.perf_counter() - self.t0_s)
        if not self.cuda:
            return
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream())
        if self._first is None:
            self._first = event
        self._pending.append(event)
        while len(self._pending) > self.lag and self._pending[0].query():
            self.gpu_start_ms.append(self._first.elapsed_time(self._pending.popleft()))

    def done(self) -> bool:
        """Whether `run_s` has passed since the first step began (False before it)."""
        return bool(self.host_s) and time.perf_counter() - self.t0_s - self.host_s[0] >= self.run_s

    def finish(self) -> None:
        """Marks the end of the last step and resolves every pending event (one sync, at the end).

        Jobs call it as soon as their loop ends, so that teardown stays out of the last step;
        later calls do nothing.
        """
        if self.finished:
            return
        self.finished = True
        self.step_begin()
        if self.cuda:
            torch.cuda.synchronize()
            while self._pending:
                self.gpu_start_ms.append(self._first.elapsed_time(self._pending.popleft()))

    def rows(self) -> list[tuple[int, float, float, float]]:
        """(step, host_start_s, gpu_step_s, host_step_s) per complete step."""
        host = self.host_s
        gpu = [ms / 1e3 for ms in self.gpu_start_ms] if self.cuda else host
        return [(i, host[i], gpu[i + 1] - gpu[i], host[i + 1] - host[i]) for i in range(len(host) - 1)]


# ---------------------------------------------------------------------------------------------
# NVML sampler: read-only queries on a thread.

NVML_COLUMNS = (
    "host_s", "energy_mj", "counter_changed", "sm_mhz", "mem_mhz", "power_w",
    "temperature_c", "throttle_reasons", "power_limit_w",
)  # fmt: skip
#: Throttle-reason bits as NVML names them (nvmlClocksEventReason*).
REASON_BITS = {
    0x1: "gpu_idle", 0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake",
    0x100: "display_clocks",
}  # fmt: skip


class NvmlSampler(threading.Thread):
    """Reads the GPU's energy counter, clocks, power, temperature and throttle reasons.

    Args:
        index: NVML index of the GPU.
        period_s: time between samples; s.
        t0_s: perf_counter origin of the host times; s.
    """

    def __init__(self, index: int, period_s: float, t0_s: float) -> None:
        super().__init__(daemon=True)
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        self.reasons = reasons or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        self.period_s, self.t0_s = period_s, t0_s
        self.rows: list[tuple] = []
        self.stop_event = threading.Event()

    def info(self) -> dict:
        n, h = self.nvml, self.handle
        name = n.nvmlDeviceGetName(h)
        driver = n.nvmlSystemGetDriverVersion()
        as_text = lambda v: v.decode() if isinstance(v, bytes) else v  # noqa: E731
        return {
            "gpu_name": as_text(name),
            "driver": as_text(driver),
            "power_limit_w": n.nvmlDeviceGetEnforcedPowerLimit(h) / 1e3,
            "max_sm_mhz": n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_SM),
            "max_mem_mhz": n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_MEM),
        }

    def run(self) -> None:
        n, h = self.nvml, self.handle
        last = None
        while not self.stop_event.is_set():
            energy = n.nvmlDeviceGetTotalEnergyConsumption(h)
            host_s = time.perf_counter() - self.t0_s
            self.rows.append((
                round(host_s, 6), energy, int(last is not None and energy != last),
                n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM), n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM),
                n.nvmlDeviceGetPowerUsage(h) / 1e3, n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
                self.reasons(h), n.nvmlDeviceGetEnforcedPowerLimit(h) / 1e3,
            ))  # fmt: skip
            last = energy
            self.stop_event.wait(self.period_s)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=5)


def start_sampler(args: Args, device: torch.device, t0_s: float) -> NvmlSampler | None:
    """The NVML thread for the job's GPU, or None (said on stderr) without CUDA or NVML."""
    if device.type != "cuda":
        return None
    try:
        sampler = NvmlSampler(device.index or 0, args.sample_ms / 1e3, t0_s)
    except Exception as error:  # no pynvml, no driver: record step times only
        print(f"record_job: NVML unavailable, no power/clock samples ({error})", file=sys.stderr)
        return None
    sampler.start()
    return sampler


class GcLog:
    """Each garbage collection of the job's process: (host start s, generation, duration s,
    objects collected), from gc.callbacks (a full collection holds the interpreter: the
    training thread launches nothing meanwhile)."""

    def __init__(self, t0_s: float) -> None:
        self.t0_s = t0_s
        self.rows: list[tuple] = []
        self._start_s = 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._start_s = now
        else:
            self.rows.append((round(self._start_s - self.t0_s, 6), info["generation"],
                              round(now - self._start_s, 6), info["collected"]))  # fmt: skip

    def stop(self) -> None:
        if self._on in gc.callbacks:
            gc.callbacks.remove(self._on)


# ---------------------------------------------------------------------------------------------
# Under kdvfs.tune (--tune 1): dry run, read-only NVML.

REPORT_COLUMNS = (
    "step",
    "end_s",
    "tuner_step_s",
    "counter_readings",
    "wait_s",
    "answer_cpu_s",
    "sm_clock_mhz",
)
REQUEST_COLUMNS = ("step", "site", "core_mhz", "mem_mhz", "host_s")
"""The controller's clock requests (dry run: recorded, none made): the tuner's step, the site,
the pair (empty: stock), the host time on the recorder's clock."""


def _timing(reference_max_s: float):
    from kdvfs.tuner.step_tuner import StepTiming

    return StepTiming(reference_max_s=reference_max_s)


class Tuning:
    """kdvfs.tune around a job in dry run, or nothing (--tune 0): the job calls open() with its
    model and optimizer (or none: a framework callback hands them over), wraps each step in
    step() or adds callbacks(), and close() ends the tuning.

    Args:
        args: the recorder's arguments (tune, strategy, budget, track, warmup_s).
        index: NVML index of the GPU.
        t0_s: perf_counter origin of the host times written out; s.
    """

    def __init__(self, args: Args, index: int, t0_s: float) -> None:
        self.args, self.index = args, index
        # the tuner stamps with time.monotonic: its offset from the recorder's clock
        self.monotonic_minus_t0_s = time.monotonic() - time.perf_counter() + t0_s
        self.wall_minus_t0_s = time.time() - time.perf_counter() + t0_s  # clock requests: time.time
        self.session = None
        self.gpu = None
        self.reports: list[tuple] = []
        self.requests: list[tuple] = []
        self.summary: dict | None = None
        self.dry_run_calls = 0
        self._mlruns: str | None = None

    def open(self, model: nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None) -> None:
        if not self.args.tune:
            return
        import kdvfs
        from kdvfs.runtime.nvml_device import NvmlDevice

        self.gpu = NvmlDevice(self.index, dry_run=True)  # records clock calls, makes none
        if self.args.track:
            self._mlruns = tempfile.mkdtemp(prefix="record_job_mlruns_")
        self.session = kdvfs.tune(
            model,
            optimizer,
            budget=self.args.budget,
            strategy=self.args.strategy,
            device=self.gpu,
            dry_run=True,
            plan_store=False,  # no stored plan: the prior is none
            track=bool(self.args.track),
            tracking_uri=None if self._mlruns is None else Path(self._mlruns).as_uri(),
            warmup_s=self.args.warmup_s,
            timing=None if not self.args.reference_max_s else _timing(self.args.reference_max_s),
        )
        feed = self.session.on_step_end

        def kept(report):  # what the tuner was told, step by step, and the CPU its answer took
            started_s = time.thread_time()
            answer = feed(report)
            self.reports.append((
                report.step, round(report.end_s - self.monotonic_minus_t0_s, 6),
                round(report.step_time_s, 7), len(report.counter_readings), round(report.wait_s, 7),
                round(time.thread_time() - started_s, 7), report.sm_clock_mhz,
            ))  # fmt: skip
            return answer

        self.session.on_step_end = kept  # the controller calls its tuner's on_step_end

    def step(self):
        return self.session.step() if self.session is not None else contextlib.nullcontext()

    def hf_callbacks(self) -> list:
        if self.session is None:
            return []
        from kdvfs import hf_callback

        return [hf_callback(self.session)]

    def lightning_callbacks(self) -> list:
        if self.session is None:
            return []
        from kdvfs import lightning_callback

        return [lightning_callback(self.session)]

    def close(self) -> None:
        if self.session is None or self.summary is not None:
            return
        self.session.close()
        self.summary = json.loads(json.dumps(self.session.summary(), default=str))
        phase = self.session.tuner.phase
        if type(phase).__name__ == "Reference":  # still measuring stock: its noise so far
            from kdvfs.runtime.trials import NoiseMeter

            meter = NoiseMeter()
            meter.add_pairs(phase.measured.pairs())
            self.summary["reference_time_cv_per_root_s_so_far"] = meter.time_sd_per_root_s
            self.summary["reference_seconds_so_far"] = phase.measured.seconds
        self.dry_run_calls = len(self.gpu.calls)
        self.requests = [
            (r.step, r.site, *((r.pair.core_mhz, r.pair.mem_mhz) if r.pair else ("", "")),
             round(r.time_s - self.wall_minus_t0_s, 6))
            for r in self.session.trainer.controller.requests
        ]  # fmt: skip
        self.gpu.close()
        if self._mlruns is not None:
            shutil.rmtree(self._mlruns, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Job 1, vision: ResNet-50 fed by CPU decode and augmentation workers.


class SyntheticJpegs(torch.utils.data.Dataset):
    """Images 256x256 encoded once as JPEGs; each item is decoded and augmented on the CPU.

    Args:
        count: items per epoch.
        crop_px: side of the RandomResizedCrop; px.
        seed: seed of the source images.
    """

    def __init__(self, count: int, crop_px: int, seed: int) -> None:
        import torchvision
        from torchvision.transforms import v2

        self.count = count
        gen = torch.Generator().manual_seed(seed)
        # Smooth structure plus fine noise, so that each JPEG carries photo-like detail to decode.
        sources = [
            0.8 * F.interpolate(torch.rand(1, 3, 32, 32, generator=gen), size=256, mode="bilinear")[0]
            + 0.2 * torch.rand(3, 256, 256, generator=gen)
            for _ in range(32)
        ]
        sources = [(255 * s).clamp(0, 255).to(torch.uint8) for s in sources]
        try:
            self.jpegs = [torchvision.io.encode_jpeg(s, quality=90) for s in sources]
            self.decode = torchvision.io.decode_jpeg
        except Exception as error:  # torchvision without its image library: raw uint8 images
            print(f"record_job: JPEG codec unavailable, feeding raw uint8 images ({error})", file=sys.stderr)
            self.jpegs, self.decode = sources, lambda x: x.clone()
        self.transform = v2.Compose([
            v2.RandomResizedCrop(crop_px, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ])  # fmt: skip

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.transform(self.decode(self.jpegs[i % len(self.jpegs)])), i % 1000


def run_vision(args: Args, device: torch.device, clock: StepClock, tuning: Tuning) -> dict:
    import torchvision

    batch = args.batch or 128
    if args.synthetic:  # one batch made once on the GPU: the loop waits for no input
        gen = torch.Generator(device=device).manual_seed(args.seed)
        fixed = (torch.randn(batch, 3, args.image_px, args.image_px, device=device, generator=gen),
                 torch.randint(0, 1000, (batch,), device=device, generator=gen))  # fmt: skip
        loader = itertools.repeat(fixed)
    else:
        loader = torch.utils.data.DataLoader(
            SyntheticJpegs(10**7, args.image_px, args.seed),
            batch_size=batch,
            shuffle=True,
            num_workers=args.workers,
            pin_memory=device.type == "cuda",
            drop_last=True,
            persistent_workers=args.workers > 0,
            prefetch_factor=4 if args.workers > 0 else None,
        )
    model = torchvision.models.resnet50(weights=None).to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    model.train()
    tuning.open(model, optimizer)
    for images, labels in loader:
        clock.step_begin()
        with tuning.step():
            images = images.to(device, non_blocking=True, memory_format=torch.channels_last)
            labels = labels.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        if clock.done():
            break
    clock.finish()
    tuning.close()
    data = ("one fixed random batch on the GPU (no DataLoader)" if args.synthetic else
            "32 synthetic 256x256 JPEGs, decode + RandomResizedCrop + flip + normalize in workers")  # fmt: skip
    return {"model": "torchvision resnet50", "batch": batch, "image_px": args.image_px,
            "workers": 0 if args.synthetic else args.workers, "precision": "bf16 autocast, channels_last",
            "optimizer": "SGD momentum 0.9 lr 0.1 wd 1e-4", "data": data}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Job 2, hf: the Hugging Face Trainer on GPT-2 small.


class RandomTokens(torch.utils.data.Dataset):
    """Sequences of uniform random token ids, labels equal to the inputs.

    Args:
        count: items per epoch.
        seq_len: tokens per item.
        vocab: vocabulary size.
        seed: seed of the tokens.
    """

    def __init__(self, count: int, seq_len: int, vocab: int, seed: int) -> None:
        self.count, self.seq_len, self.vocab, self.seed = count, seq_len, vocab, seed

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        ids = torch.randint(0, self.vocab, (self.seq_len,), generator=gen)
        return {"input_ids": ids, "labels": ids.clone()}


def hf_training_arguments(out_dir: str, batch: int, workers: int, cuda: bool, seed: int) -> Any:
    """The Trainer's arguments of the recorded hf job (and tune_overhead's): bf16 and pinned
    memory on a card, no saving, no evaluation, no reporting, steps until stopped.

    Args:
        out_dir: the Trainer's output folder.
        batch: sequences per step.
        workers: DataLoader worker processes.
        cuda: whether the job trains on a card (else on the CPU).
        seed: the Trainer's seed.
    """
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=out_dir,
        per_device_train_batch_size=batch,
        max_steps=10**7,
        learning_rate=3e-4,
        bf16=cuda,
        dataloader_num_workers=workers,
        dataloader_pin_memory=cuda,
        logging_steps=10,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=not cuda,
        seed=seed,
    )


def run_hf(args: Args, device: torch.device, clock: StepClock, tuning: Tuning) -> dict:
    try:
        import transformers
        from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback
    except Exception as error:
        sys.exit(f"record_job: the hf job needs transformers (and accelerate): {error}")

    class Clock(TrainerCallback):
        def on_step_begin(self, targs, state, control, **kwargs):
            clock.step_begin()

        def on_step_end(self, targs, state, control, **kwargs):
            if clock.done():
                clock.finish()
                control.should_training_stop = True

    config = GPT2Config(n_layer=args.layers, n_positions=max(1024, args.seq_len))
    torch.manual_seed(args.seed)
    model = GPT2LMHeadModel(config)
    batch = args.batch or 16
    workers = min(args.workers, 4)
    cuda = device.type == "cuda"
    out_dir = tempfile.mkdtemp(prefix="record_job_hf_")
    try:
        targs = hf_training_arguments(out_dir, batch, workers, cuda, args.seed)
    except TypeError as error:
        sys.exit(f"record_job: this transformers ({transformers.__version__}) rejects an argument: {error}")
    tuning.open()  # the callback hands model and optimizer over
    trainer = Trainer(
        model=model,
        args=targs,
        train_dataset=RandomTokens(10**7, args.seq_len, config.vocab_size, args.seed),
        callbacks=[Clock(), *tuning.hf_callbacks()],
    )
    trainer.train()
    tuning.close()
    shutil.rmtree(out_dir, ignore_errors=True)
    return {"model": f"GPT-2 small (GPT2Config, n_layer={args.layers}, random init)", "batch": batch,
            "seq_len": args.seq_len, "workers": workers, "precision": "bf16 (Trainer)" if cuda else "fp32",
            "attn_implementation": getattr(model.config, "_attn_implementation", None),
            "optimizer": str(targs.optim), "logging_steps": 10, "trainer": "transformers.Trainer"}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Job 3, sync: a plain loop with host synchronisation, evaluation and checkpoints.


class EncoderLM(nn.Module):
    """Token embedding, an nn.TransformerEncoder (pre-norm, GELU) and a linear LM head.

    Args:
        vocab: vocabulary size.
        d_model: width; features.
        layers: encoder layers.
    """

    def __init__(self, vocab: int, d_model: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model, nhead=max(1, d_model // 64), dim_feedforward=4 * d_model, dropout=0.0,
            activation="gelu", batch_first=True, norm_first=True,
        )  # fmt: skip
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)))


def run_sync(args: Args, device: torch.device, clock: StepClock, tuning: Tuning) -> dict:
    vocab, batch = 32768, args.batch or 32
    torch.manual_seed(args.seed)
    model = EncoderLM(vocab, args.d_model, args.layers).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device.type == "cuda")
    gen = torch.Generator(device=device).manual_seed(args.seed)
    tokens = lambda: torch.randint(0, vocab, (batch, args.seq_len), device=device, generator=gen)  # noqa: E731
    ckpt = Path(tempfile.mkdtemp(prefix="record_job_ckpt_")) / "model.pt"
    step, losses = 0, []
    tuning.open(model, optimizer)
    while not clock.done():
        clock.step_begin()
        with tuning.step():  # the whole iteration: .item(), evaluation and checkpoint inside
            model.train()
            x = tokens()
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            if step % args.item_every == 0:
                losses.append(loss.item())
            if step % args.eval_every == 0:
                model.eval()
                with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
                    total = sum(F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten()).item()
                                for x in (tokens() for _ in range(args.eval_batches)))  # fmt: skip
                losses.append(total / args.eval_batches)
            if step % args.ckpt_every == 0:
                torch.save(model.state_dict(), ckpt)
    clock.finish()
    tuning.close()
    params = sum(p.numel() for p in model.parameters())
    ckpt_bytes = ckpt.stat().st_size if ckpt.exists() else 0
    shutil.rmtree(ckpt.parent, ignore_errors=True)
    return {"model": f"nn.TransformerEncoder LM d={args.d_model} layers={args.layers} vocab={vocab}",
            "params": params, "batch": batch, "seq_len": args.seq_len, "precision": "bf16 autocast",
            "optimizer": "AdamW" + (" fused" if device.type == "cuda" else ""),
            "item_every": args.item_every, "eval_every": args.eval_every,
            "eval_batches": args.eval_batches, "ckpt_every": args.ckpt_every,
            "ckpt_bytes": ckpt_bytes}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Job 4, lightning: a Lightning Trainer on timm's ViT-S/16.


def run_lightning(args: Args, device: torch.device, clock: StepClock, tuning: Tuning) -> dict:
    try:
        import lightning as L
        import timm
    except Exception as error:
        sys.exit(f"record_job: the lightning job needs lightning and timm: {error}")

    class ViT(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=1000)

        def training_step(self, batch, batch_idx):  # the inner model, not self(x): no forward of its own
            images, labels = batch
            loss = F.cross_entropy(self.net(images), labels)
            if batch_idx % args.item_every == 0:
                self.last_loss = loss.item()
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3, weight_decay=0.05)

    class Clock(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            clock.step_begin()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if clock.done():
                clock.finish()
                trainer.should_stop = True

    batch = args.batch or 128
    workers = min(args.workers, 4)
    cuda = device.type == "cuda"
    torch.manual_seed(args.seed)
    loader = torch.utils.data.DataLoader(
        SyntheticJpegs(10**7, args.image_px, args.seed),
        batch_size=batch,
        shuffle=True,
        num_workers=workers,
        pin_memory=cuda,
        drop_last=True,
        persistent_workers=workers > 0,
        prefetch_factor=4 if workers > 0 else None,
    )
    tuning.open()  # the callback hands the module over
    trainer = L.Trainer(
        accelerator="gpu" if cuda else "cpu",
        devices=1,
        precision="bf16-mixed",
        max_steps=10**7,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Clock(), *tuning.lightning_callbacks()],
    )
    trainer.fit(ViT(), loader)
    tuning.close()
    return {"model": "timm vit_small_patch16_224 (random init)", "batch": batch, "image_px": args.image_px,
            "workers": workers, "precision": "bf16-mixed (Lightning)", "optimizer": "AdamW lr 1e-3 wd 0.05",
            "item_every": args.item_every, "trainer": f"lightning.Trainer {L.__version__}",
            "timm": timm.__version__,
            "data": "32 synthetic 256x256 JPEGs, decode + RandomResizedCrop + flip + normalize in workers"}  # fmt: skip


JOBS = {"vision": run_vision, "hf": run_hf, "sync": run_sync, "lightning": run_lightning}


# ---------------------------------------------------------------------------------------------
# Summary and output.


def quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return math.nan
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def cv(values: list[float]) -> float:
    if len(values) < 2:
        return math.nan
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return math.sqrt(var) / mean if mean else math.nan


def summarise(steps: list[tuple], nvml: list[tuple], warmup_end_s: float) -> dict:
    """Statistics of the steps that start after the warm-up, and of the NVML samples then.

    The last step is left out: the end mark, not a next step's start, closes it. NVML samples
    count from the warm-up's end to the host end of the last step kept.
    """
    kept = [r for r in steps[:-1] if r[1] >= warmup_end_s]
    gpu = [r[2] for r in kept]
    windows: dict[int, list[float]] = collections.defaultdict(list)
    for r in kept:
        windows[int(r[1] - warmup_end_s)].append(r[2])
    if windows:
        windows.pop(max(windows))  # the last window is partial
    window_means = [sum(v) / len(v) for v in windows.values() if v]
    out = {
        "steps": len(kept),
        "gpu_step_median_s": quantile(gpu, 0.5),
        "gpu_step_p1_s": quantile(gpu, 0.01),
        "gpu_step_p99_s": quantile(gpu, 0.99),
        "gpu_step_mean_s": sum(gpu) / len(gpu) if gpu else math.nan,
        "per_step_cv": cv(gpu),
        "window_1s_mean_cv": cv(window_means),
        "windows_1s": len(window_means),
        "host_step_median_s": quantile([r[3] for r in kept], 0.5),
    }
    end_s = kept[-1][1] + kept[-1][3] if kept else math.inf  # host end of the last kept step
    samples = [r for r in nvml if warmup_end_s <= r[0] <= end_s]
    if samples:
        changes = [r[0] for r in samples if r[2]]
        gaps = [b - a for a, b in itertools.pairwise(changes)]
        energy_j = (samples[-1][1] - samples[0][1]) / 1e3
        span_s = samples[-1][0] - samples[0][0]
        busy = [r[7] & ~0x1 for r in samples]  # any reason but idle
        seen = 0
        for r in samples:
            seen |= r[7]
        out |= {
            "nvml_samples": len(samples),
            "sample_period_median_s": quantile([b[0] - a[0] for a, b in itertools.pairwise(samples)], 0.5),
            "power_mean_w": sum(r[5] for r in samples) / len(samples),
            "energy_power_mean_w": energy_j / span_s if span_s > 0 else math.nan,
            "energy_per_step_j": energy_j / len(kept) if kept else math.nan,
            "sm_mhz_median": quantile([r[3] for r in samples], 0.5),
            "sm_mhz_p1": quantile([r[3] for r in samples], 0.01),
            "mem_mhz_median": quantile([r[4] for r in samples], 0.5),
            "temperature_c_max": max(r[6] for r in samples),
            "temperature_c_median": quantile([r[6] for r in samples], 0.5),
            "throttle_share_any_but_idle": sum(1 for b in busy if b) / len(samples),
            "throttle_reasons_seen": [name for bit, name in REASON_BITS.items() if seen & bit],
            "throttle_share_by_reason": {
                name: sum(1 for r in samples if r[7] & bit) / len(samples)
                for bit, name in REASON_BITS.items()
                if seen & bit
            },
            "counter_updates": len(changes),
            "counter_period_median_s": quantile(gaps, 0.5),
            "counter_period_p1_s": quantile(gaps, 0.01),
            "counter_period_p99_s": quantile(gaps, 0.99),
            "power_limit_w": samples[-1][8],
        }
    return out


def noise_per_root_s(rows: list[tuple], window_s: float, robust: bool = False) -> float:
    """Step-time noise per root second, as the tuner defines it: the relative s.d. of the mean
    step time of consecutive windows of whole steps (`window_s` of GPU time each), times the
    root of their mean length. rows: (step, host_start_s, gpu_step_s, ...); robust: the s.d.
    from the median absolute deviation (1.4826 MAD) about the median instead."""
    means, lengths, current = [], [], []
    for r in rows:
        current.append(r[2])
        if sum(current) >= window_s:
            means.append(sum(current) / len(current))
            lengths.append(sum(current))
            current = []
    if len(means) < 3:
        return math.nan
    if robust:
        mid = quantile(means, 0.5)
        spread = 1.4826 * quantile([abs(m - mid) for m in means], 0.5) / mid
    else:
        spread = cv(means)
    return spread * math.sqrt(sum(lengths) / len(lengths))


def overhead_against(folder: Path, job: str, tuned: dict) -> dict | None:
    """The tuned run's median GPU step against the bare recording's (both after their warm-ups)."""
    meta_path = folder / f"{job}_meta.json"
    if not meta_path.exists():
        return None
    bare = json.loads(meta_path.read_text())
    bare_s = bare["summary"]["gpu_step_median_s"]
    return {
        "bare": str(meta_path),
        "bare_started_utc": bare.get("started_utc"),
        "bare_median_s": bare_s,
        "tuned_median_s": tuned["gpu_step_median_s"],
        "overhead": tuned["gpu_step_median_s"] / bare_s - 1.0,
        "bare_steps": bare["summary"]["steps"],
        "tuned_steps": tuned["steps"],
    }


def slow_steps(rows: list[tuple], collections: list[tuple], factor: float = 1.25) -> dict:
    """Steps over `factor` x the median GPU step, and how many of them held a garbage
    collection of 2 ms or more (started within the step's host span)."""
    median = quantile([r[2] for r in rows], 0.5)
    slow = [r for r in rows if r[2] > factor * median]
    long_gc = [c for c in collections if c[2] >= 0.002]
    with_gc = [r for r in slow if any(r[1] <= c[0] < r[1] + r[3] for c in long_gc)]
    return {"steps": len(rows), "slow": len(slow), "slow_with_gc": len(with_gc),
            "slow_excess_s": sum(r[2] - median for r in slow),
            "collections_2ms": len(long_gc), "collections_2ms_s": sum(c[2] for c in long_gc)}  # fmt: skip


def arms_against_stock(rows: list[tuple], requests: list[tuple], reports: list[tuple]) -> dict:
    """Each stretch of steps run under a requested pair (an arm of a trial), against the stock
    stretches on either side of it, in the recorder's own CUDA-event step times: in a dry run no
    clock moves, so any difference is something the run itself does in the arm. Also the CPU
    the tuner's answers took in those steps and in stock's (the reports' answer_cpu_s).

    rows: (step, host start s, GPU step s, host step s); requests: REQUEST_COLUMNS (the
    tuner's step numbers are the recorder's); reports: REPORT_COLUMNS.
    """
    pair_at: dict[int, str] = {}
    for step, _site, core, mem, _s in sorted(requests, key=lambda r: r[0]):
        pair_at[step] = f"{core}/{mem}" if core != "" else ""
    stretches: list[tuple[str, list[tuple]]] = []
    current = ""
    for r in rows:
        current = pair_at.get(r[0], current)
        if stretches and stretches[-1][0] == current:
            stretches[-1][1].append(r)
        else:
            stretches.append((current, [r]))
    answer_cpu = {r[0]: r[5] for r in reports if len(r) > 5}
    arms, diffs = [], []
    for i, (pair, arm) in enumerate(stretches):
        if not pair or len(arm) < 3:
            continue
        before = stretches[i - 1][1][-len(arm) :] if i > 0 and not stretches[i - 1][0] else []
        after = stretches[i + 1][1][: len(arm)] if i + 1 < len(stretches) and not stretches[i + 1][0] else []
        around = before + after  # stock's steps on either side, as many as the arm's on each
        if len(around) < 3:
            continue
        stock_s = quantile([r[2] for r in around], 0.5)
        diff = quantile([r[2] for r in arm], 0.5) / stock_s - 1.0
        first = arm[0][2] / stock_s - 1.0
        cpu = [answer_cpu[r[0]] for r in arm if r[0] in answer_cpu]
        cpu_stock = [answer_cpu[r[0]] for r in around if r[0] in answer_cpu]
        arms.append({"pair": pair, "first_step": arm[0][0], "steps": len(arm),
                     "median_step_diff": diff, "first_step_diff": first,
                     "answer_cpu_ms": 1e3 * sum(cpu) / len(cpu) if cpu else None,
                     "answer_cpu_ms_stock_around": 1e3 * sum(cpu_stock) / len(cpu_stock) if cpu_stock else None})  # fmt: skip
        diffs.append(diff)
    return {
        "arms": len(arms),
        "median_step_diff_median": quantile(diffs, 0.5) if diffs else None,
        "median_step_diff_mean": sum(diffs) / len(diffs) if diffs else None,
        "each": arms,
    }


def noise_pairs_per_root_s(rows: list[tuple], window_s: float) -> float:
    """Step-time noise per root second as the tuner's noise meter takes it (runtime/trials.py
    NoiseMeter over its reference), from the GPU step times: consecutive windows of whole steps
    (`window_s` of GPU time each), each window with the next as a pair, each pair's relative
    difference of mean step time x sqrt(window length / 2), the spread 1.4826 x their median
    absolute deviation."""
    windows, current = [], []
    for r in rows:
        current.append(r[2])
        if sum(current) >= window_s:
            windows.append((sum(current) / len(current), sum(current)))
            current = []
    diffs = [
        (b[0] / a[0] - 1.0) * math.sqrt(0.5 * (a[1] + b[1]) / 2.0) for a, b in itertools.pairwise(windows)
    ]
    if len(diffs) < 3:
        return math.nan
    mid = quantile(diffs, 0.5)
    return 1.4826 * quantile([abs(d - mid) for d in diffs], 0.5)


STALL_RATIO = 3.0  # regular_steps: a busy step over this x the median of the steps before is a stall
STALL_HISTORY = 31  # regular_steps: the latest regular steps the median is taken over
STALL_MIN = 8  # regular_steps: steps seen before one may count as a stall


def regular_steps(rows: list[tuple]) -> list[tuple]:
    """The rows (step, host start s, busy s) with each stall's busy time replaced by the median
    of the regular steps before it: a step over STALL_RATIO x the median of the latest
    STALL_HISTORY regular steps (after STALL_MIN). The same rule as the tuner's StallFilter,
    written here again over the whole series, so the offline noise does not take the tuner's word."""
    out, recent = [], collections.deque(maxlen=STALL_HISTORY)
    for r in rows:
        busy_s = r[2]
        if len(recent) >= STALL_MIN:
            typical_s = statistics.median(recent)
            if typical_s > 0.0 and busy_s > STALL_RATIO * typical_s:
                out.append((r[0], r[1], typical_s))
                continue
        recent.append(busy_s)
        out.append(r)
    return out


def compare_tuned(steps: list[tuple], reports: list[tuple], summary: dict, warmup_end_s: float) -> dict:
    """What the tuner measured against the same run's per-step GPU times (the recorder's
    events): its step times step by step, its time noise against the noise of the GPU times
    over its reference and over the whole tuned span, its trials, the null test."""
    gpu = {r[0]: r[2] for r in steps[:-1]}
    pairs = [(rep[2], gpu[rep[0]]) for rep in reports if rep[0] in gpu and gpu[rep[0]] > 0]
    ratios = [t / g for t, g in pairs]
    window_s = float(summary.get("trial_window_s") or 2.0)
    tuned = [r for r in steps[:-1] if r[1] >= warmup_end_s]
    reference = [r for r in tuned if r[1] < warmup_end_s + float(summary.get("reference_s") or 20.0)]
    measured = (summary.get("job_noise") or {}).get("time_cv_per_root_s")
    noise = measured if measured is not None else summary.get("reference_time_cv_per_root_s_so_far")
    offline = noise_pairs_per_root_s(tuned, window_s)
    # the tuner's own series, the job's waits for its host left out (what the clocks set)
    busy = [(rep[0], rep[1], rep[2] - rep[4]) for rep in reports if len(rep) > 4 and rep[1] >= warmup_end_s]
    offline_busy = noise_pairs_per_root_s(busy, window_s)
    offline_regular = noise_pairs_per_root_s(regular_steps(busy), window_s)  # stalls as the tuner takes them
    outcomes = summary.get("outcomes") or []
    trials = [o for o in outcomes if o.get("kind") == "trial"]
    completed = [o for o in trials if not o.get("abandoned") and (o.get("blocks") or 0) > 0]
    keys = (
        "kind",
        "step",
        "blocks",
        "abandoned",
        "energy_diff",
        "energy_se",
        "time_diff",
        "time_se",
        "adopted",
        "judged",  # the saving and slowdown the tuner read, with the errors it stated
    )
    return {
        "reports": len(reports),
        "tuner_vs_gpu_step": {
            "steps_matched": len(pairs),
            "ratio_median": quantile(ratios, 0.5),
            "ratio_p1": quantile(ratios, 0.01),
            "ratio_p99": quantile(ratios, 0.99),
        },
        "time_noise_per_root_s": {
            "tuner": noise,
            "tuner_source": "job_noise" if measured is not None else "reference so far (not ended)",
            "offline_pairs_of_windows": offline,
            "offline_pairs_of_windows_busy": offline_busy,
            "ratio_tuner_to_offline_busy": noise / offline_busy
            if noise and offline_busy and math.isfinite(offline_busy)
            else None,
            "offline_pairs_of_windows_regular": offline_regular,
            "ratio_tuner_to_offline_regular": noise / offline_regular
            if noise and offline_regular and math.isfinite(offline_regular)
            else None,
            "offline_pairs_of_windows_reference_span": noise_pairs_per_root_s(reference, window_s),
            "offline_sd_of_window_means": noise_per_root_s(tuned, window_s),
            "offline_mad_of_window_means": noise_per_root_s(tuned, window_s, robust=True),
            "tuner_pairs_of_windows": (summary.get("job_noise") or {}).get("pairs_of_windows"),
            "window_s": window_s,
            "ratio_tuner_to_offline": noise / offline
            if noise and offline and math.isfinite(offline)
            else None,
        },
        "trials_completed": len(completed),
        "trials": [{k: o.get(k) for k in keys} for o in outcomes],
        "null_test": {
            "adopted": summary.get("adopted"),
            "plan_energy_saving": summary.get("plan_energy_saving"),
            "run_energy_saving": (summary.get("run") or {}).get("energy_saving"),
            "slowdown": summary.get("slowdown"),
        },
        "mismatched_steps": summary.get("mismatched_steps"),
        "clock_requests": summary.get("clock_requests"),
        "tuned_gpu_step_median_s": quantile([r[2] for r in tuned], 0.5),
    }


def write_csv_gz(path: Path, header: tuple[str, ...], rows: list[tuple]) -> None:
    with gzip.open(path, "wt", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def versions() -> dict:
    found = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda}
    for name in ("torchvision", "transformers", "accelerate", "pynvml"):
        try:
            found[name] = getattr(__import__(name), "__version__", "present")
        except Exception:
            found[name] = None
    return found


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    if args.tune:  # the tuner's progress lines
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cuda = args.device.startswith("cuda") and torch.cuda.is_available()
    if args.device.startswith("cuda") and not cuda:
        print("record_job: CUDA unavailable, running on the CPU with host timing", file=sys.stderr)
    device = torch.device(args.device if cuda else "cpu")
    if cuda:
        device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    started_utc = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    t0_s = time.perf_counter()
    sampler = start_sampler(args, device, t0_s)
    clock = StepClock(device if cuda else None, args.lag, t0_s, args.warmup_s + args.seconds)
    tuning = Tuning(args, device.index or 0, t0_s)
    collections_log = GcLog(t0_s)
    job_info = JOBS[args.job](args, device, clock, tuning)
    clock.finish()
    tuning.close()
    collections_log.stop()
    if sampler is not None:
        sampler.stop()
    ended_utc = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")

    steps = [(i, round(h, 6), round(g, 7), round(s, 7)) for i, h, g, s in clock.rows()]
    nvml = sampler.rows if sampler is not None else []
    # The warm-up is timed from the first step, so model build and loader start do not eat it.
    first_step_s = steps[0][1] if steps else 0.0
    warmup_end_s = first_step_s + args.warmup_s
    summary = summarise(steps, nvml, warmup_end_s)
    name = f"{args.job}_tuned" if args.tune else args.job
    meta = {
        "job": args.job,
        "tuned": bool(args.tune),
        "args": dataclasses.asdict(args),
        "started_utc": started_utc,
        "ended_utc": ended_utc,
        "device": str(device),
        "gpu_timing": "cuda events at step start" if cuda else "host perf_counter (no CUDA)",
        "nvml": sampler.info() if sampler is not None else None,
        "gpu_name_torch": torch.cuda.get_device_name(device) if cuda else None,
        "versions": versions(),
        "cpu_count": os.cpu_count(),
        "steps_total": len(steps),
        "first_step_host_s": first_step_s,
        "warmup_end_host_s": warmup_end_s,
        "warmup_steps_excluded": sum(1 for r in steps if r[1] < warmup_end_s),
        "job_info": job_info,
        "summary": summary,
    }
    if tuning.summary is not None:
        meta["tuning"] = {"dry_run_calls_recorded": tuning.dry_run_calls, "summary": tuning.summary}
        meta["comparison"] = compare_tuned(steps, tuning.reports, tuning.summary, warmup_end_s)
        meta["comparison"]["overhead"] = (
            overhead_against(Path(args.bare), args.job, summary) if args.bare else None
        )
        meta["comparison"]["slow_steps"] = slow_steps(
            [r for r in steps[:-1] if r[1] >= warmup_end_s],
            [c for c in collections_log.rows if c[0] >= warmup_end_s],
        )
        meta["comparison"]["arms_against_stock"] = arms_against_stock(
            [r for r in steps[:-1] if r[1] >= warmup_end_s], tuning.requests, tuning.reports
        )
        write_csv_gz(out / f"{name}_reports.csv.gz", REPORT_COLUMNS, tuning.reports)
        write_csv_gz(out / f"{name}_requests.csv.gz", REQUEST_COLUMNS, tuning.requests)
    write_csv_gz(out / f"{name}_steps.csv.gz", ("step", "host_start_s", "gpu_step_s", "host_step_s"), steps)
    write_csv_gz(out / f"{name}_nvml.csv.gz", NVML_COLUMNS, nvml)
    write_csv_gz(out / f"{name}_gc.csv.gz", ("host_start_s", "generation", "duration_s", "collected"),
                 collections_log.rows)  # fmt: skip
    (out / f"{name}_meta.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    print(json.dumps({"job": name, **{k: summary.get(k) for k in (
        "steps", "gpu_step_median_s", "per_step_cv", "window_1s_mean_cv", "power_mean_w",
        "sm_mhz_median", "throttle_share_any_but_idle", "counter_period_median_s")}}))  # fmt: skip
    if "comparison" in meta:
        c = meta["comparison"]
        print(json.dumps({k: c[k] for k in ("tuner_vs_gpu_step", "time_noise_per_root_s", "trials_completed",
                                             "null_test", "mismatched_steps", "clock_requests",
                                             "slow_steps", "overhead")}))  # fmt: skip
        arms = c["arms_against_stock"]
        keys = ("arms", "median_step_diff_median", "median_step_diff_mean")
        print(json.dumps({"arms_against_stock": {k: arms[k] for k in keys}}))  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
