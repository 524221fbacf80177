"""Micro-benchmark of the BoTorch strategy's own cost: CPU milliseconds per ask.

Runs on an H200-like grid (110 core x 2 memory clocks) with an analytic kernel (time from
compute and memory parts, energy U-shaped in the core clock), so it needs no device.
"""

from __future__ import annotations

import numpy as np

from kdvfs.policies.base import SearchSpace, Task
from kdvfs.policies.botorch_bo import BotorchStrategy

CORE_MHZ = np.arange(345, 1981, 15)
"""Core clocks of the H200-like benchmark grid, MHz (110 of them, 15 MHz apart)."""
MEM_MHZ = np.array([2201, 3201])
"""Memory clocks of the benchmark grid, MHz."""


def _surface(space: SearchSpace) -> tuple[np.ndarray, np.ndarray]:
    """(time_s, energy_j) per config of a mixed compute / memory kernel."""
    f_core, f_mem = space.configs_mhz[:, 0] / 1000.0, space.configs_mhz[:, 1] / 1000.0
    time_s = 1e-3 * (0.6 * 1.98 / f_core + 0.4 * 3.201 / f_mem + 0.05)
    volt = 0.7 + 0.4 * np.clip((f_core - 1.2) / 0.78, 0.0, None)
    power_w = 100.0 + 250.0 * f_core * volt**2 + 40.0 * f_mem
    return time_s, power_w * time_s


def botorch_ask_cpu_ms(n_obs: int = 60, asks: int = 20, seed: int = 0) -> dict[str, float]:
    """CPU ms per BotorchStrategy.ask once a task holds n_obs observations.

    Seeds the task with n_obs measurements at random configs, then alternates ask / tell for
    `asks` steps (convergence disabled) so that refits fall where they would in use.
    Returns median, mean and max ms, the number of asks timed and of observations at the end.
    """
    configs = np.array([(c, m) for m in MEM_MHZ for c in CORE_MHZ], dtype=float)
    space = SearchSpace(configs, reference=len(configs) - 1)
    time_s, energy_j = _surface(space)
    ref = space.reference
    task = Task("bench", float(time_s[ref]), float(energy_j[ref]), budget=0.5)
    policy = BotorchStrategy(space, seed, tol=0.0, margin=10.0)
    rng = np.random.default_rng(seed)
    for config in rng.choice(np.delete(np.arange(len(space)), ref), size=n_obs - 1, replace=False):
        policy.tell(task, int(config), float(time_s[config]), float(energy_j[config]))
    policy.ask_cpu_s.clear()
    for _ in range(asks):
        config = policy.ask(task)
        if config is None:
            break
        policy.tell(task, config, float(time_s[config]), float(energy_j[config]))
    ms = np.array(policy.ask_cpu_s) * 1e3
    return {
        "median_ms": float(np.median(ms)),
        "mean_ms": float(ms.mean()),
        "max_ms": float(ms.max()),
        "asks": float(ms.size),
        "n_obs_end": float(policy.log(task).measured.sum()),
    }
