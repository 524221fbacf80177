"""Peers in the same run: what users would pick instead of kdvfs, on one simulated card.

Every peer runs on a fresh, identically seeded simulated card with the same workload, the same
number of training steps and the same budget, and is scored the same way: energy saving and
slowdown against stock over the whole run, its tuning (exploration) included, from the card's
true energy and clock (run_peers). The peers:
- `kdvfs`: the step-driven tuner (tuner/session.py) with its default strategy, no prior (run_kdvfs);
- `zeus-power-limit`: Zeus's GlobalPowerLimitOptimizer, unchanged, driven through its step
  hooks on the simulated card through runtime/sim_pynvml.py (run_zeus; needs the `peers` extra);
- `envpipe-sm-stepdown`: EnvPipe's online SM-clock step-down (run_envpipe);
- `paper-sweep`: the founding paper's offline sweep and its per-kernel plan (run_paper_sweep).
Once a peer has settled, the rest of the run is fast-forwarded under what it settled on
(_hold): chunks of HOLD_CHUNK_S after a thermal settling in SETTLE_CHUNK_S chunks.
Findings: docs/benchmarks.md#peers
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kdvfs.extras import require_extra
from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.runtime.schedule import Schedule, StepRunner
from kdvfs.runtime.simulator import SimulatedDevice
from kdvfs.runtime.types import ClockPair, KdvfsError, Workload

#: Default length of every peer's run: a day of training at stock; s.
DEFAULT_TRAINING_S = 86_400.0

PEERS = ("kdvfs", "zeus-power-limit", "envpipe-sm-stepdown", "paper-sweep")

#: Training chunk while a held setting's card settles thermally (a third of its ~30-s time constant); s.
SETTLE_CHUNK_S = 10.0
#: Training held in thermal settling chunks before the long ones; s.
SETTLE_S = 300.0
#: Training chunk once settled (the steady step repeated); s.
HOLD_CHUNK_S = 600.0
#: Zeus's profiling settings (its defaults): warm-up and profiled steps per power limit, the
#: power-limit stride (W), steps waited before profiling.
ZEUS_WARMUP_STEPS, ZEUS_PROFILE_STEPS, ZEUS_PL_STEP_W, ZEUS_WAIT_STEPS = 10, 40, 25, 1
#: EnvPipe: steps profiled per SM clock, and the shortest profiled window (100 energy-counter periods); s.
ENVPIPE_STEP_ITERATIONS, ENVPIPE_MIN_WINDOW_S = 20, 10.0
#: Training the step-driven tuner runs past settling before the rest is fast-forwarded under
#: its schedule (its drift watch learns in it); a share of the run.
KDVFS_TAIL_SHARE = 0.05


@dataclass(frozen=True)
class PeerResult:
    """One peer's whole run against stock's."""

    name: str
    energy_saving: float  # 1 - energy / stock's energy over the same steps
    slowdown: float  # training time / stock's - 1
    training_s: float  # the whole run on the card's clock, tuning included
    source: str  # where the method comes from
    detail: dict[str, Any] = field(default_factory=dict)

    def json(self) -> dict[str, Any]:
        return {
            "energy_saving": self.energy_saving,
            "slowdown": self.slowdown,
            "training_s": self.training_s,
            "source": self.source,
            **self.detail,
        }


# --- the card's training loop ----------------------------------------------------------------
class Loop:
    """A training job on a simulated card: steps under a schedule, the card's clock and energy.

    Args:
        device: the card.
        workload: the kernels of one training step.
    """

    def __init__(self, device: SimulatedDevice, workload: Workload) -> None:
        self.device, self.workload = device, workload
        self.runner = StepRunner(device, workload)
        self.steps = 0
        self.held_from: tuple[float, float, int] | None = (
            None  # clock s, true energy J, steps when the hold began
        )
        self._last: tuple[float, float, float] | None = (
            None  # start s, true energy, cap of the last exact step
        )

    def train(self, schedule: Schedule, steps: int) -> None:
        """`steps` steps under a schedule, the steady one repeated (StepRunner.run)."""
        if steps > 0:
            self.runner.run(schedule, steps)
            self.steps += steps

    def step(self, schedule: Schedule) -> None:
        """One step, kernel by kernel: a power limit set between steps holds from its next
        kernel on. (Repeating the last step instead would chain ModelDevice.repeat_since's
        noise redraws into a random walk of the step time: 3% over 40 steps.)"""
        self.runner.run(schedule, 1)
        self.steps += 1

    def forget(self) -> None:
        """Someone else set the clocks: the next step requests its schedule's again."""
        self.runner.forget_requests()


def _hold(loop: Loop, schedule: Schedule, steps: int) -> None:
    """The rest of the run under one setting: thermal settling chunks, then long chunks."""
    iter_s = max(loop.device.expected_step([(k, None, k.launches) for k in loop.workload.kernels])[0], 1e-9)
    d = loop.device
    if loop.held_from is None:
        loop.held_from = (d.now_s(), d.true_energy_j(), loop.steps)
    left, held_s = steps, 0.0
    while left > 0:
        chunk_s = SETTLE_CHUNK_S if held_s < SETTLE_S else HOLD_CHUNK_S
        n = min(left, max(1, math.ceil(chunk_s / iter_s)))
        loop.train(schedule, n)
        left -= n
        held_s += n * iter_s


# --- the peers -------------------------------------------------------------------------------
def run_kdvfs(loop: Loop, steps: int, budget: float, seed: int) -> dict[str, Any]:
    """The step-driven tuner (tuner/session.py) from no prior, as the peers start from none, at
    the job's sites as `kdvfs tune` places them (job_sites), until it has settled and a tail
    past it; then its schedule held."""
    from kdvfs.tuner.run import job_sites
    from kdvfs.tuner.session import TuneSession

    sites = job_sites(loop.workload, loop.device.switch_latency_s)
    session = TuneSession(loop.device, loop.workload, budget=budget, seed=seed, sites=sites)
    stock_s = loop.device.expected_step([(k, None, k.launches) for k in loop.workload.kernels])[0]
    session.tuner.expected_run_s = steps * stock_s  # the run's length, known to the job
    tail_s = KDVFS_TAIL_SHARE * steps * stock_s
    while session.job.steps < steps:
        # never past the run's steps: the last chunks shrink with the steps left (a chunk runs
        # one step at least), so that the run is scored over the same steps as stock's
        left_s = 0.98 * (steps - session.job.steps) * stock_s
        session.run_until(session.seconds + min(tail_s, left_s))
        settled_s = session.converged_after_s
        if settled_s is not None and session.seconds >= settled_s + tail_s:
            break
    ran = session.job.steps
    loop.steps = ran
    loop.forget()
    _hold(loop, session.tuner.incumbent, steps - ran)
    return {
        "strategy": session.strategy,
        "converged_at_step": next(
            (p.step for p in session.points if settled_s is not None and p.end_s >= settled_s), None
        ),
        "measurements": session.tuner.trials,
        "groups": len(session.tuner.incumbent.groups),
    }


class _ZeusOnSimulator(contextlib.AbstractContextManager):
    """Zeus's `pynvml` is sim_pynvml bound to the card, its clock the card's, its GPU cache fresh."""

    def __init__(self, device: SimulatedDevice) -> None:
        self.device = device

    def __enter__(self) -> _ZeusOnSimulator:
        import zeus.device.gpu as zeus_gpu
        import zeus.device.gpu.nvidia as zeus_nvidia
        import zeus.monitor.energy as zeus_energy

        from kdvfs.runtime import sim_pynvml

        sim_pynvml.bind(self.device)
        self._saved = (sys.modules.get("pynvml"), zeus_nvidia.pynvml, zeus_energy.time, zeus_gpu._gpus)
        sys.modules["pynvml"] = sim_pynvml
        zeus_nvidia.pynvml = sim_pynvml
        zeus_energy.time = self.device.now_s  # Zeus times its windows with time.time()
        zeus_gpu._gpus = None
        zeus_nvidia.nvml_is_available.cache_clear()
        return self

    def __exit__(self, *exc: object) -> None:
        import zeus.device.gpu as zeus_gpu
        import zeus.device.gpu.nvidia as zeus_nvidia
        import zeus.monitor.energy as zeus_energy

        from kdvfs.runtime import sim_pynvml

        real, zeus_nvidia.pynvml, zeus_energy.time, zeus_gpu._gpus = self._saved
        if real is not None:
            sys.modules["pynvml"] = real
        zeus_nvidia.nvml_is_available.cache_clear()
        sim_pynvml.unbind()


def require_zeus() -> None:
    """KdvfsError naming the `peers` extra unless zeus can be imported."""
    require_extra("peers", ["zeus"], "the zeus-power-limit peer")


def run_zeus(loop: Loop, steps: int, budget: float, seed: int) -> dict[str, Any]:
    """Zeus's GlobalPowerLimitOptimizer with MaxSlowdownConstraint(1 + budget), one epoch
    over the run, through on_epoch_begin/on_step_begin/on_step_end; once Done, its power limit held."""
    require_zeus()
    from zeus.monitor import ZeusMonitor
    from zeus.optimizer.power_limit import Done, GlobalPowerLimitOptimizer, MaxSlowdownConstraint

    class SimMonitor(ZeusMonitor):
        """No torch.cuda.synchronize: the simulated card's kernels end when they are run."""

        def begin_window(self, key: str, sync_execution: bool = True, restart: bool = False) -> None:
            super().begin_window(key, sync_execution=False, restart=restart)

        def end_window(self, key: str, sync_execution: bool = True, cancel: bool = False):
            return super().end_window(key, sync_execution=False, cancel=cancel)

    stock = Schedule.stock()
    with _ZeusOnSimulator(loop.device):
        monitor = SimMonitor(gpu_indices=[0], cpu_indices=[])
        plo = GlobalPowerLimitOptimizer(
            monitor,
            MaxSlowdownConstraint(factor=1.0 + budget),
            wait_steps=ZEUS_WAIT_STEPS,
            warmup_steps=ZEUS_WARMUP_STEPS,
            profile_steps=ZEUS_PROFILE_STEPS,
            pl_step=ZEUS_PL_STEP_W,
        )
        plo.on_epoch_begin()
        while loop.steps < steps and not isinstance(plo.state, Done):
            plo.on_step_begin()
            loop.step(stock)
            plo.on_step_end()
        done = isinstance(plo.state, Done)
        chosen_w = plo.state.optimal_power_limit / 1000 if done else None
        measurements = [m.dict() for m in plo.measurements]
        plo._set_power_limit = lambda power_limit: (
            None
        )  # its atexit hook would set whatever card NVML shows then
    profiled = loop.steps
    _hold(loop, stock, steps - loop.steps)
    return {
        "done": done,
        "power_limit_w": chosen_w,
        "profiling_steps": profiled,
        "limits_profiled": len(measurements),
        "profile": [[m["power_limit"], m["time"], m["energy"]] for m in measurements],  # W, s, J per window
    }


def run_envpipe(loop: Loop, steps: int, budget: float, seed: int) -> dict[str, Any]:
    """EnvPipe's online profiling: stock measured first, then the SM clock (memory at its top)
    stepped down one supported level at a time, each profiled for a few steps (at least
    ENVPIPE_MIN_WINDOW_S) by the energy counter and the job's clock; the lowest clock whose
    step time stays within (1 + budget) x stock's is kept, the descent stopping at the
    first clock beyond it. Written from Choi et al., "EnvPipe: Performance-preserving DNN
    Training Framework for Saving Energy", USENIX ATC 2023 (sec. 4, online SM-frequency
    profiling; github.com/casys-kaist/EnvPipe)."""
    d = loop.device
    mem = max(p.mem_mhz for p in d.grid.pairs)
    cores = sorted((p.core_mhz for p in d.grid.pairs if p.mem_mhz == mem), reverse=True)
    iter_s = d.expected_step([(k, None, k.launches) for k in loop.workload.kernels])[0]
    n = max(ENVPIPE_STEP_ITERATIONS, math.ceil(ENVPIPE_MIN_WINDOW_S / iter_s))

    def profile(schedule: Schedule) -> float:
        loop.forget()
        loop.train(schedule, 1)  # the switch lands; not profiled
        t0 = d.now_s()
        loop.train(schedule, n)
        return (d.now_s() - t0) / n

    stock_s = profile(Schedule.stock())
    kept: ClockPair | None = None
    tried = 0
    for core in cores:
        if loop.steps + n + 1 > steps:
            break
        pair = ClockPair(core, mem)
        tried += 1
        if profile(Schedule(((0, pair),))) > (1.0 + budget) * stock_s:
            break
        kept = pair
    schedule = Schedule.stock() if kept is None else Schedule(((0, kept),))
    profiled = loop.steps
    loop.forget()
    _hold(loop, schedule, steps - loop.steps)
    return {
        "pair": None if kept is None else str(kept),
        "clocks_profiled": tried,
        "profiling_steps": profiled,
    }


def run_paper_sweep(loop: Loop, steps: int, budget: float, seed: int) -> dict[str, Any]:
    """The founding paper's offline sweep on the card (every kernel at every pair, in
    isolation), then its per-kernel plan for the whole run as the card must run it (a switch
    at each change of pair, each landing after the card's switch latency). The sweep's device
    time and energy are counted as they were spent on the card (at the pairs it measured),
    and it trains no step: the run is the sweep, then `steps` steps under the plan.
    `as_paper_ran_it`: the same run with the plan's steps at its switch-free figures (sweep.evaluate)."""
    from kdvfs.tuner.sweep import evaluate, run_sweep

    d = loop.device
    t0, e0 = d.now_s(), d.true_energy_j()
    obs = run_sweep(d, loop.workload)
    sweep_s, sweep_j = d.now_s() - t0, d.true_energy_j() - e0
    choice = obs.kernel_level_choice(budget)
    plan = [choice[k.name] for k in loop.workload.kernels]
    groups = tuple((i, p) for i, p in enumerate(plan) if i == 0 or p != plan[i - 1])
    loop.forget()
    switches = d.switches
    _hold(loop, Schedule(groups), steps)
    paper = evaluate(d, loop.workload, choice)
    return {
        "sweep_s": sweep_s,
        "sweep_energy_j": sweep_j,
        "switches_per_step": len(groups) - (groups[0][1] == groups[-1][1]),
        "switches_landed": d.switches - switches,  # a request replaced before it lands never does
        "_paper": (sweep_s, sweep_j, paper.time_s, paper.energy_j),
    }


RUNNERS: dict[str, tuple[Callable[[Loop, int, float, int], dict[str, Any]], str]] = {
    "kdvfs": (run_kdvfs, "kdvfs step-driven tuner (tuner/step_tuner.py), default strategy, no prior"),
    "zeus-power-limit": (
        run_zeus,
        "Zeus 0.16 GlobalPowerLimitOptimizer + MaxSlowdownConstraint (pip zeus, ml.energy), unchanged",
    ),
    "envpipe-sm-stepdown": (run_envpipe, "EnvPipe online SM-clock step-down (Choi et al., USENIX ATC'23)"),
    "paper-sweep": (run_paper_sweep, "founding paper's offline per-kernel sweep (tuner/sweep.py)"),
}


def check_peers(names: list[str]) -> None:
    """KdvfsError for an empty list, an unknown peer or a peer whose extra is missing."""
    known = ",".join(PEERS)
    if not names:
        raise KdvfsError(f"no peer named (known: {known})")
    bad = [n for n in names if n not in PEERS]
    if bad:
        raise KdvfsError(f"unknown peer {bad[0]!r} (known: {known})")
    if "zeus-power-limit" in names:
        require_zeus()


@contextlib.contextmanager
def _fresh(device_spec: str, workload_spec: str, seed: int, noise: float | None) -> Iterator[Loop]:
    device = open_device(device_spec, seed=seed, noise=noise)
    if not isinstance(device, SimulatedDevice):
        raise KdvfsError(f"the peers run on a simulated card (sim:PRESET), not {device_spec!r}")
    yield Loop(device, open_workload(workload_spec, device))


def _settled(loop: Loop, steps: int, stock_s: float, stock_j: float) -> dict[str, float] | None:
    """What the peer held after tuning, measured over the held steps (the card's true energy
    and clock) against stock's mean step: its setting's worth without its tuning."""
    if loop.held_from is None or loop.steps <= loop.held_from[2]:
        return None
    t0, e0, n0 = loop.held_from
    n = loop.steps - n0
    held_s, held_j = (loop.device.now_s() - t0) / n, (loop.device.true_energy_j() - e0) / n
    return {
        "energy_saving": 1.0 - held_j / (stock_j / steps),
        "slowdown": held_s / (stock_s / steps) - 1.0,
        "steps": n,
    }


def run_peers(
    device_spec: str,
    workload_spec: str,
    names: list[str],
    *,
    budget: float,
    steps: int | None = None,
    seed: int = 0,
    noise: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Stock and each peer over `steps` steps on identically seeded cards: the JSON document's
    `peers` part and the stock run's figures. steps None: DEFAULT_TRAINING_S at stock.
    `progress(name)` is called as each peer starts."""
    check_peers(names)
    if steps is not None and steps <= 0:
        raise KdvfsError(f"steps must be a positive whole number, not {steps}")
    with _fresh(device_spec, workload_spec, seed, noise) as loop:
        if steps is None:
            kernels = loop.workload.kernels
            steps = math.ceil(
                DEFAULT_TRAINING_S / loop.device.expected_step([(k, None, k.launches) for k in kernels])[0]
            )
        _hold(loop, Schedule.stock(), steps)
        stock_s, stock_j = loop.device.now_s(), loop.device.true_energy_j()
        gpu, workload = loop.device.name, loop.workload.name
    peers: dict[str, Any] = {}
    for name in names:
        if progress is not None:
            progress(name)
        run, source = RUNNERS[name]
        with _fresh(device_spec, workload_spec, seed, noise) as loop:
            detail = run(loop, steps, budget, seed)
            time_s, energy_j = loop.device.now_s(), loop.device.true_energy_j()
            detail["settled"] = _settled(loop, steps, stock_s, stock_j)
        paper = detail.pop("_paper", None)
        if paper is not None:
            sweep_s, sweep_j, step_s, step_j = paper
            detail["as_paper_ran_it"] = {
                "energy_saving": 1.0 - (sweep_j + steps * step_j) / stock_j,
                "slowdown": (sweep_s + steps * step_s) / stock_s - 1.0,
            }
        peers[name] = PeerResult(
            name, 1.0 - energy_j / stock_j, time_s / stock_s - 1.0, time_s, source, detail
        ).json()
    return {
        "device": device_spec,
        "gpu": gpu,
        "workload": workload,
        "budget": budget,
        "steps": steps,
        "seed": seed,
        "source": "simulated",
        "stock": {"training_s": stock_s, "energy_j": stock_j},
        "peers": peers,
    }
