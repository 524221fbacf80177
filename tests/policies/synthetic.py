"""A small analytic GPU-kernel model for policy tests: time and energy on a clock grid.

time = t0 x (p-norm overlap of compute x f_core_max / f_core and memory x f_mem_max / f_mem,
plus a fixed part), scaled so the top pair takes t0; power = static + core activity x f x V(f)^2
(V flat below a knee) + memory activity x f_mem.
Energy is U-shaped in the core clock; compute-, memory-bound and mixed kinds arise from shares.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kdvfs.policies.base import SearchSpace, Strategy, Task

SMALL_CORE_MHZ = (800, 1040, 1280, 1520, 1760, 2000)
SMALL_MEM_MHZ = (5000, 7000, 9000)


@dataclass(frozen=True)
class Kind:
    """A kernel kind: compute and memory work (top-clock time units), a fixed part, activities."""

    compute: float
    memory: float
    core_activity: float
    mem_activity: float
    fixed: float = 0.05
    t0_s: float = 1e-3


OVERLAP_P = 4.0

KINDS = {
    "gemm": Kind(compute=0.9, memory=0.3, core_activity=1.0, mem_activity=0.5, fixed=0.1),
    "norm": Kind(compute=0.25, memory=0.9, core_activity=0.5, mem_activity=1.0),
    "mixed": Kind(compute=0.65, memory=0.65, core_activity=0.8, mem_activity=0.8, fixed=0.1),
}


def grid_space(core_mhz: tuple[int, ...], mem_mhz: tuple[int, ...]) -> SearchSpace:
    """A full product grid, reference = the highest pair."""
    configs = np.array([(c, m) for c in core_mhz for m in mem_mhz], dtype=float)
    top = max(range(len(configs)), key=lambda i: (configs[i, 1], configs[i, 0]))
    return SearchSpace(configs, reference=top)


def table(kind: Kind, space: SearchSpace) -> tuple[np.ndarray, np.ndarray]:
    """(time_s, energy_j) per config of the space for one kernel kind."""
    f_core, f_mem = space.configs_mhz[:, 0] / 1000.0, space.configs_mhz[:, 1] / 1000.0
    core_max, mem_max = f_core.max(), f_mem.max()
    work = (
        (kind.compute * core_max / f_core) ** OVERLAP_P + (kind.memory * mem_max / f_mem) ** OVERLAP_P
    ) ** (1.0 / OVERLAP_P) + kind.fixed
    time_s = kind.t0_s * work / work.min()
    volt = 0.7 + 0.4 * np.clip((f_core - 1.3) / (core_max - 1.3), 0.0, None)
    power_w = 60.0 + 100.0 * kind.core_activity * f_core * volt**2 + 15.0 * kind.mem_activity * f_mem
    return time_s, power_w * time_s


def task_for(key: str, kind: Kind, space: SearchSpace, budget: float) -> Task:
    time_s, energy_j = table(kind, space)
    ref = space.reference
    return Task(key, float(time_s[ref]), float(energy_j[ref]), budget, features=(kind.compute, kind.memory))


def optimum(time_s: np.ndarray, energy_j: np.ndarray, task: Task) -> int:
    """The known constrained optimum: least energy with time within budget."""
    ok = time_s <= (1.0 + task.budget) * task.ref_time_s
    return int(np.argmin(np.where(ok, energy_j, np.inf)))


def run(
    policy: Strategy,
    task: Task,
    time_s: np.ndarray,
    energy_j: np.ndarray,
    steps: int = 10_000,
    noise: float = 0.0,
    seed: int = 0,
) -> list[int]:
    """Ask/tell until the policy converges or `steps` measurements; returns the asked configs."""
    rng = np.random.default_rng(seed)
    asked: list[int] = []
    for _ in range(steps):
        config = policy.ask(task)
        if config is None:
            break
        asked.append(config)
        jitter = 1.0 + noise * rng.standard_normal(2)
        policy.tell(task, config, float(time_s[config] * jitter[0]), float(energy_j[config] * jitter[1]))
    return asked
