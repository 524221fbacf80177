"""What kdvfs.tune costs a host-bound training job per step: bare and tuned runs, alternated.

    python -m kdvfs.experiments.tune_overhead                                (CPU, fake NVML)
    python -m kdvfs.experiments.tune_overhead --device cuda --job hf         (a card, dry run)
    python -m kdvfs.experiments.tune_overhead --device cuda --job hf --interleave-s 6 --rounds 36

Map, top to bottom:
  Args          every knob, one line each, with its unit
  make_mlp      job "mlp": a deep, narrow network (Linear, GELU, LayerNorm blocks) and AdamW at
                a small batch, a plain loop: a step of many small operations, paced by the host
  fake_card     on the CPU, the tests' fake NVML card (tests/runtime/fake_pynvml.py) as the NVML
                module; each energy read takes `fake_read_ms` with the GIL released, as a card's
                NVML call does, so the counter poller reads as often as on a card
  timed_steps   host time of each step (perf_counter), and each thread's CPU time and context
                switches per step (/proc, on Linux): where the tuned step's time goes
  mlp_arm       the plain loop for `arm_s`: bare, or under kdvfs.tune after its `warmup_s`,
                driven through the Hugging Face callback's hooks or `tuning.step()`
  hf_arm        job "hf": GPT-2 small under a Hugging Face Trainer (transformers), as the H200
                recordings ran it (experiments/record_job.py), bare or with
                hf_callback(kdvfs.tune(...)); a step is the time between two step starts, timed
                after `warmup_s`
  Blocks        `--interleave-s`: one running job whose blocks alternate bare and tuned (a
                kdvfs.tune opened and closed in each tuned block), paired bare-tuned-tuned-bare,
                so that the host's drift over a pair's seconds, not an arm's minute, is the noise
  main          `rounds` of a bare arm then a tuned one per counter poller (`pollers`: thread,
                process or both, each round's order reversed every other round); prints JSON:
                the per-step medians, the overhead (tuned over bare, less 1) for each poller,
                each round's, and the threads' figures
kdvfs.tune runs as the recorded jobs used it: NvmlDevice in dry run (no clock is changed), no
plan store, no MLflow run; the tuner stays in its Reference phase (its default timing measures
stock for the first minute). Arms alternate because a shared host's speed drifts by tens of
percent over seconds: read the rounds beside the medians.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import itertools
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from torch import nn

import kdvfs
from kdvfs.experiments.record_job import parse_fields
from kdvfs.runtime.counter_process import COUNTER_POLLER_ENV, POLLER_KINDS
from kdvfs.runtime.nvml_device import NVML_MODULE_ENV, NvmlDevice
from kdvfs.runtime.torch_integration import HFTrainerHooks

FAKE_NVML_DIR = Path(__file__).resolve().parents[1] / "tests" / "runtime"


@dataclasses.dataclass
class Args:
    job: str = "mlp"  # mlp: the narrow network in a plain loop; hf: GPT-2 small under a Hugging Face Trainer
    device: str = "cpu"  # cpu: the fake NVML card; cuda: the real card of `index` through NVML, dry run
    index: int = 0  # NVML index and CUDA device of the card; index
    rounds: int = 5  # bare-then-tuned pairs; pairs
    arm_s: float = 3.0  # steps timed in each arm; s
    warmup_s: float = 1.0  # each arm's first seconds, not timed (under kdvfs.tune: its warm-up); s
    driver: str = (
        "hf"  # mlp: hf drives it through the Hugging Face callback's hooks, step through tuning.step()
    )
    layers: int = 24  # blocks of the mlp network, transformer layers of GPT-2 (12: GPT-2 small); layers
    width: int = 128  # mlp: features of each block; features
    batch: int = 16  # rows (mlp) or sequences (hf) of a step; rows
    seq_len: int = 512  # hf: tokens of a sequence; tokens
    workers: int = 4  # hf: data-loader worker processes; processes
    threads: int = 1  # torch CPU threads; threads
    fake_read_ms: float = 4.0  # CPU: one fake energy read, the GIL released (an H200's NVML read: ~4 ms); ms
    seed: int = 0  # seeds the weights and the data
    pollers: str = "thread"  # a round's tuned arms, one per counter poller: thread, process (comma-separated)
    interleave_s: float = 0.0  # >0: one job, its blocks of this length alternate bare and tuned (bare, tuned, tuned, bare, ...), `rounds` pairs of them; s
    settle_s: float = 1.0  # interleaved: each block's first seconds, not timed (kdvfs.tune opens or closes in them), and a tuned block's kdvfs.tune warm-up; s
    out: str = ""  # also write the JSON to this file; "": print only


def parse_args(argv: list[str]) -> Args:
    """`--name value` pairs (dashes or underscores) onto Args; `--help` lists the knobs."""
    args = parse_fields(Args, argv, "tune_overhead", __doc__)
    if (
        args.job not in ("mlp", "hf")
        or args.device not in ("cpu", "cuda")
        or args.driver not in ("hf", "step")
    ):
        sys.exit("tune_overhead: --job is mlp or hf, --device cpu or cuda, --driver hf or step")
    if (
        args.interleave_s < 0
        or args.settle_s < 0
        or (args.interleave_s and args.settle_s >= args.interleave_s)
    ):
        sys.exit(f"tune_overhead: --interleave-s must be 0 or more than --settle-s ({args.settle_s} s), got {args.interleave_s}")  # fmt: skip
    if args.interleave_s and (args.pollers != "thread" or args.driver != "hf"):
        sys.exit("tune_overhead: --interleave-s drives the job through the Hugging Face hooks with the thread poller")  # fmt: skip
    kinds = poller_kinds(args)
    if not kinds or any(k not in POLLER_KINDS for k in kinds) or len(set(kinds)) < len(kinds):
        sys.exit(f"tune_overhead: --pollers is a comma-separated list of distinct {', '.join(POLLER_KINDS)}, got {args.pollers!r}")  # fmt: skip
    return args


def poller_kinds(args: Args) -> list[str]:
    """The tuned arms' counter pollers, in the order of the first round."""
    return [k.strip() for k in args.pollers.split(",") if k.strip()]


# --- the job and the card ----------------------------------------------------------------------
def make_mlp(args: Args, device: torch.device) -> tuple[nn.Module, torch.optim.Optimizer, Callable[[], None]]:
    """The network, its optimizer and one training step (forward, backward, optimizer step)."""
    torch.manual_seed(args.seed)
    blocks = [
        m
        for _ in range(args.layers)
        for m in (nn.Linear(args.width, args.width), nn.GELU(), nn.LayerNorm(args.width))
    ]
    model = nn.Sequential(*blocks).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(args.batch, args.width, device=device)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        optimizer.step()

    return model, optimizer, step


@contextlib.contextmanager
def fake_card(read_ms: float) -> Iterator[None]:
    """The fake NVML card as the NVML module NvmlDevice loads, its energy reads taking read_ms."""
    if str(FAKE_NVML_DIR) not in sys.path:
        sys.path.append(str(FAKE_NVML_DIR))
    fake = importlib.import_module("fake_pynvml")
    fake.configure()  # a counter that moves every 100 ms, as a card's
    read = fake.nvmlDeviceGetTotalEnergyConsumption

    def slow_read(handle: Any) -> int:
        time.sleep(read_ms / 1e3)  # a C call's time, the GIL released
        return read(handle)

    with mock.patch.dict(os.environ, {NVML_MODULE_ENV: "fake_pynvml"}):
        fake.nvmlDeviceGetTotalEnergyConsumption = slow_read
        try:
            yield
        finally:
            fake.nvmlDeviceGetTotalEnergyConsumption = read


def open_tuning(args: Args, model: nn.Module | None = None, optimizer: Any = None) -> tuple[Any, NvmlDevice]:
    """kdvfs.tune as the recorded jobs opened it: the card in dry run, no plan store, no MLflow;
    its warm-up `warmup_s` (interleaved: `settle_s`, so that a block is timed in its Reference)."""
    card = NvmlDevice(
        args.index, dry_run=True, lease_dir=tempfile.mkdtemp() if args.device == "cpu" else None
    )
    tuning = kdvfs.tune(
        model,
        optimizer,
        device=card,
        dry_run=True,
        plan_store=False,
        track=False,
        warmup_s=args.settle_s if args.interleave_s else args.warmup_s,
    )
    return tuning, card


# --- timing ------------------------------------------------------------------------------------
def thread_figures() -> dict[str, tuple[float, int]]:
    """Each thread of this process by name: (CPU time in ms, context switches); {} off Linux."""
    figures = {}
    for thread in threading.enumerate():
        task = Path(f"/proc/self/task/{thread.native_id}")
        try:
            run_ms = int((task / "schedstat").read_text().split()[0]) / 1e6
            status = (task / "status").read_text().splitlines()
        except (OSError, ValueError, IndexError):
            continue
        switches = sum(int(line.split()[1]) for line in status if "ctxt_switches" in line)
        figures["training" if thread is threading.main_thread() else thread.name] = (run_ms, switches)
    return figures


def arm_figures(times_s: list[float], wall_s: float, before: dict, after: dict) -> dict[str, Any]:
    """The per-step median, the mean step over the arm, and kdvfs's and the training thread's
    CPU time and context switches per step."""
    n = len(times_s)
    threads = {
        name: {
            "cpu_ms_per_step": round((after[name][0] - before[name][0]) / n, 4),
            "switches_per_step": round((after[name][1] - before[name][1]) / n, 3),
        }
        for name in after
        if name in before and (name == "training" or name.startswith("kdvfs"))
    }
    if "training" in threads:  # waiting for the GIL, or for a core
        threads["training"]["off_cpu_ms_per_step"] = round(
            1e3 * wall_s / n - threads["training"]["cpu_ms_per_step"], 4
        )
    return {
        "steps": n,
        "step_ms": 1e3 * statistics.median(times_s),
        "mean_step_ms": 1e3 * wall_s / n,
        "threads": threads,
    }


def timed_steps(seconds: float, step: Callable[[], None], sync: Callable[[], None]) -> dict[str, Any]:
    """Steps for `seconds`, each timed on the host (the mean step synchronised at both ends)."""
    sync()
    before = thread_figures()
    times_s = []
    start_s = time.perf_counter()
    while time.perf_counter() - start_s < seconds:
        t0_s = time.perf_counter()
        step()
        times_s.append(time.perf_counter() - t0_s)
    sync()
    wall_s = time.perf_counter() - start_s
    return arm_figures(times_s, wall_s, before, thread_figures())


def tuner_figures(tuning: Any) -> dict[str, Any]:
    summary = tuning.summary()
    answer_s = summary["tuner_answer_s"]["median"]
    return {
        "phase": summary["phase"],
        "counter_reads_per_s": (summary["counter_polling"] or {}).get("reads_per_s"),
        "counter_in_process": bool((summary["counter_polling"] or {}).get("process")),
        "answer_median_ms": None if answer_s is None else 1e3 * answer_s,
        "mismatched_steps": summary["mismatched_steps"],
    }


# --- the arms ----------------------------------------------------------------------------------
def mlp_arm(args: Args, tuned: bool, job: tuple, sync: Callable[[], None]) -> dict[str, Any]:
    """The plain loop, bare or under kdvfs.tune (its warm-up first, then timed)."""
    model, optimizer, step = job
    if not tuned:
        timed_steps(args.warmup_s, step, sync)
        return timed_steps(args.arm_s, step, sync)
    if (
        args.driver == "hf"
    ):  # as hf_callback(kdvfs.tune()) under a Trainer: the hooks hand model and optimizer over
        tuning, card = open_tuning(args)
        hooks = HFTrainerHooks(tuning)
        hooks.on_train_begin(None, None, None, model=model, optimizer=optimizer)

        def tuned_step() -> None:
            hooks.on_step_begin(None, None, None)
            step()
            hooks.on_step_end(None, None, None)

    else:
        tuning, card = open_tuning(args, model, optimizer)

        def tuned_step() -> None:
            with tuning.step():
                step()

    try:
        with tuning:
            timed_steps(args.warmup_s, tuned_step, sync)
            arm = timed_steps(args.arm_s, tuned_step, sync)
    finally:
        card.close()
    return arm | {"tuner": tuner_figures(tuning)}


def hf_arm(args: Args, tuned: bool, model: nn.Module, sync: Callable[[], None]) -> dict[str, Any]:
    """GPT-2 under a fresh Hugging Face Trainer, bare or with hf_callback(kdvfs.tune()): the
    time between step starts after warmup_s, for arm_s."""
    from transformers import Trainer, TrainerCallback

    from kdvfs.experiments.record_job import RandomTokens, hf_training_arguments

    starts_s: list[float] = []
    figures: list[dict] = []

    class Timer(TrainerCallback):  # first in the list: its step start comes before kdvfs's
        def on_step_begin(self, targs: Any, state: Any, control: Any, **kwargs: Any) -> None:
            now_s = time.perf_counter()
            if not starts_s:
                starts_s.append(now_s)
            elif now_s - starts_s[0] >= args.warmup_s:
                if not figures:
                    sync()
                    figures.append(thread_figures())
                    now_s = time.perf_counter()
                starts_s.append(now_s)
                if now_s - starts_s[1] >= args.arm_s:
                    figures.append(thread_figures())
                    control.should_training_stop = True

    cuda = args.device == "cuda"
    out_dir = tempfile.mkdtemp(prefix="tune_overhead_hf_")
    targs = hf_training_arguments(out_dir, args.batch, args.workers, cuda, args.seed)
    callbacks: list[Any] = [Timer()]
    tuning = card = None
    if tuned:
        tuning, card = open_tuning(args)
        callbacks.append(kdvfs.hf_callback(tuning))
    data = RandomTokens(10**7, args.seq_len, model.config.vocab_size, args.seed)
    try:
        Trainer(model=model, args=targs, train_dataset=data, callbacks=callbacks).train()
    finally:
        if tuning is not None:
            tuning.close()
            card.close()
        shutil.rmtree(out_dir, ignore_errors=True)
    steps_s = [b - a for a, b in itertools.pairwise(starts_s[1:])]
    arm = arm_figures(steps_s, starts_s[-1] - starts_s[1], figures[0], figures[-1])
    return arm | ({"tuner": tuner_figures(tuning)} if tuning is not None else {})


# --- one job, bare and tuned blocks alternated ---------------------------------------------------
class Blocks:
    """Blocks of `interleave_s` of one running job, alternately bare and under a kdvfs.tune
    opened at the block's first step and closed at the next block's first (bare, tuned, tuned,
    bare, ...: a linear drift of the host cancels within each pair of pairs). A step is the
    time between two step starts of the same block after its first `settle_s`.

    Args:
        args: the run's knobs (interleave_s, settle_s, rounds: pairs of blocks).
        model: the network kdvfs.tune attaches to in a tuned block.
        optimizer: its optimizer.
    """

    def __init__(self, args: Args, model: Any, optimizer: Any) -> None:
        self.args = args
        self.model = model
        self.optimizer = optimizer
        self.index = -1  # the block running now
        self.block_start_s = 0.0
        self.hooks: HFTrainerHooks | None = None  # a tuned block's hooks, None in a bare one
        self.tuning: Any = None
        self.card: NvmlDevice | None = None
        self.starts_s: list[list[float]] = [[] for _ in range(2 * args.rounds)]
        self.tuners: list[dict[str, Any]] = []  # each tuned block's tuner_figures
        self.first_s: float | None = None  # the job's first step start: warmup_s bare, untimed, from it

    @staticmethod
    def tuned(index: int) -> bool:
        return index % 4 in (1, 2)

    def step_start(self, now_s: float) -> bool:
        """A step starts at now_s (host time): it ends the last step; False once every block ran."""
        if self.first_s is None:  # a kdvfs.tune opened and closed once: its imports and first NVML calls
            tuning, card = open_tuning(self.args)
            tuning.close()
            card.close()
            self.first_s = now_s = time.perf_counter()
        if self.index < 0 and now_s - self.first_s < self.args.warmup_s:
            return True
        in_block_s = now_s - self.block_start_s
        if self.index >= 0 and in_block_s >= self.args.settle_s:
            self.starts_s[self.index].append(now_s)
        if self.index < 0 or in_block_s >= self.args.interleave_s:
            self.close()
            self.index += 1
            if self.index >= len(self.starts_s):
                return False
            self.block_start_s = now_s
            if self.tuned(self.index):
                self.tuning, self.card = open_tuning(self.args)
                self.hooks = HFTrainerHooks(self.tuning)
                self.hooks.on_train_begin(None, None, None, model=self.model, optimizer=self.optimizer)
        if self.hooks is not None:
            self.hooks.on_step_begin(None, None, None)
        return True

    def step_end(self) -> None:
        if self.hooks is not None:
            self.hooks.on_step_end(None, None, None)

    def close(self) -> None:
        """Close a tuned block's kdvfs.tune (its figures kept); nothing in a bare one."""
        if self.tuning is not None:
            self.tuning.close()
            self.tuners.append(tuner_figures(self.tuning))
            self.card.close()
        self.tuning = self.card = self.hooks = None

    def figures(self) -> dict[str, Any]:
        """Each block's median step; each pair's overhead (its tuned block over its bare one,
        less 1); their mean, standard error and median; the tuned blocks' mismatched steps."""
        blocks = []
        for index, starts_s in enumerate(self.starts_s):
            steps_s = [b - a for a, b in itertools.pairwise(starts_s)]
            blocks.append({
                "tuned": self.tuned(index),
                "steps": len(steps_s),
                "step_ms": round(1e3 * statistics.median(steps_s), 4) if steps_s else None,
            })  # fmt: skip
        pairs = []
        for a, b in zip(blocks[::2], blocks[1::2], strict=True):
            bare, tuned = (b, a) if a["tuned"] else (a, b)
            if bare["step_ms"] and tuned["step_ms"]:
                pairs.append(tuned["step_ms"] / bare["step_ms"] - 1.0)
        se = statistics.stdev(pairs) / len(pairs) ** 0.5 if len(pairs) > 1 else None
        return {
            "block_s": self.args.interleave_s,
            "settle_s": self.args.settle_s,
            "pairs": len(pairs),
            "overhead_mean": round(statistics.fmean(pairs), 5) if pairs else None,
            "overhead_se": None if se is None else round(se, 5),
            "overhead_median": round(statistics.median(pairs), 5) if pairs else None,
            "overhead_per_pair": [round(x, 5) for x in pairs],
            "mismatched_steps": sum(t["mismatched_steps"] for t in self.tuners),
            "tuned_blocks": len(self.tuners),
            "blocks": blocks,
        }


def mlp_interleaved(args: Args, job: tuple) -> dict[str, Any]:
    """The plain loop through the Hugging Face hooks, its blocks alternately bare and tuned."""
    model, optimizer, step = job
    blocks = Blocks(args, model, optimizer)
    try:
        while blocks.step_start(time.perf_counter()):
            step()
            blocks.step_end()
    finally:
        blocks.close()
    return blocks.figures()


def hf_interleaved(args: Args, model: nn.Module) -> dict[str, Any]:
    """GPT-2 under one Hugging Face Trainer, its blocks alternately bare and tuned."""
    from transformers import Trainer, TrainerCallback

    from kdvfs.experiments.record_job import RandomTokens, hf_training_arguments

    class Gate(TrainerCallback):
        def __init__(self) -> None:
            self.blocks: Blocks | None = None

        def on_train_begin(self, targs: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.blocks = Blocks(args, kwargs.get("model"), kwargs.get("optimizer"))

        def on_step_begin(self, targs: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if not self.blocks.step_start(time.perf_counter()):
                control.should_training_stop = True

        def on_step_end(self, targs: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.blocks.step_end()

    out_dir = tempfile.mkdtemp(prefix="tune_overhead_hf_")
    targs = hf_training_arguments(out_dir, args.batch, args.workers, args.device == "cuda", args.seed)
    gate = Gate()
    data = RandomTokens(10**7, args.seq_len, model.config.vocab_size, args.seed)
    try:
        Trainer(model=model, args=targs, train_dataset=data, callbacks=[gate]).train()
    finally:
        if gate.blocks is not None:
            gate.blocks.close()
        shutil.rmtree(out_dir, ignore_errors=True)
    return gate.blocks.figures()


# --- main --------------------------------------------------------------------------------------
def tuned_key(kind: str, kinds: list[str]) -> str:
    """A round's key of the tuned arm with that poller: "tuned" where there is one poller."""
    return "tuned" if len(kinds) == 1 else f"tuned_{kind}"


def main(argv: list[str]) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("tune_overhead: --device cuda, but CUDA is unavailable")
    device = torch.device("cuda", args.index) if cuda else torch.device("cpu")
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    if args.job == "hf":
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(args.seed)
        model = GPT2LMHeadModel(GPT2Config(n_layer=args.layers, n_positions=max(1024, args.seq_len)))

        def arm(tuned: bool) -> dict[str, Any]:
            return hf_arm(args, tuned, model, sync)

    else:
        job = make_mlp(args, device)

        def arm(tuned: bool) -> dict[str, Any]:
            return mlp_arm(args, tuned, job, sync)

    if cuda:
        measured_on = f"{torch.cuda.get_device_name(device)} (NVML index {args.index}, dry run)"
    else:
        measured_on = f"measured on CPU, fake NVML (energy reads of {args.fake_read_ms} ms)"
    if args.interleave_s:
        with contextlib.ExitStack() as stack:
            if not cuda:
                stack.enter_context(fake_card(args.fake_read_ms))
            stack.enter_context(mock.patch.dict(os.environ, {COUNTER_POLLER_ENV: "thread"}))
            figures = hf_interleaved(args, model) if args.job == "hf" else mlp_interleaved(args, job)
        return report({
            "measured_on": measured_on,
            "host": platform.processor() or platform.machine(),
            "args": dataclasses.asdict(args),
            "overhead": figures["overhead_mean"],
            "interleaved": figures,
        }, args)  # fmt: skip
    with contextlib.ExitStack() as stack:
        if not cuda:
            stack.enter_context(fake_card(args.fake_read_ms))
        kinds = poller_kinds(args)
        rounds = []
        for r in range(args.rounds):
            # each round: bare, then one tuned arm per poller, their order reversed every other round
            this_round = {"bare": arm(False)}
            for kind in kinds if r % 2 == 0 else kinds[::-1]:
                # where kdvfs.tune reads the counter
                with mock.patch.dict(os.environ, {COUNTER_POLLER_ENV: kind}):
                    this_round[tuned_key(kind, kinds)] = arm(True)
            rounds.append(this_round)
    bare_ms = statistics.median(r["bare"]["step_ms"] for r in rounds)
    by_poller = {
        kind: statistics.median(r[tuned_key(kind, kinds)]["step_ms"] for r in rounds) for kind in kinds
    }
    per_round = {
        kind: [round(r[tuned_key(kind, kinds)]["step_ms"] / r["bare"]["step_ms"] - 1.0, 4) for r in rounds]
        for kind in kinds
    }
    tuned_ms = by_poller[kinds[0]]
    result = {
        "measured_on": measured_on,
        "host": platform.processor() or platform.machine(),
        "args": dataclasses.asdict(args),
        "bare_step_ms": round(bare_ms, 4),
        "tuned_step_ms": round(tuned_ms, 4),
        "overhead": round(tuned_ms / bare_ms - 1.0, 4),
        "overhead_per_round": per_round[kinds[0]],
        "pollers": kinds,
        "overhead_by_poller": {kind: round(ms / bare_ms - 1.0, 4) for kind, ms in by_poller.items()},
        "overhead_per_round_by_poller": per_round,
        "rounds": rounds,
    }
    return report(result, args)


def report(result: dict[str, Any], args: Args) -> dict[str, Any]:
    """Print the JSON, and write it to `out` where given."""
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
