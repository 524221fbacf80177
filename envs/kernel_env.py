"""KernelDVFS-v0: choose a clock pair for one kernel at a time; each step is one honest
isolated measurement of that kernel at that pair.

- `KernelDVFSEnv`: the environment (its class docstring documents it as Gymnasium documents
  its own); `step` measures with runtime.measure.measure_isolated, `_measure_reference`
  measures a kernel's reference when the episode first reaches it;
- `observation_features`: the observation's feature matrix of a workload.

Why it measures as it does: docs/design-envs.md.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from kdvfs.envs._common import ABSOLUTE_ZERO_C, EnvTarget, positive, scalar, scalar_box
from kdvfs.envs.reward import compute_waste_reward
from kdvfs.runtime.device import RunnableDevice
from kdvfs.runtime.measure import measure_isolated
from kdvfs.runtime.types import ClockPair, KdvfsError, Measurement, Workload

Observation = dict[str, Any]


def observation_features(workload: Workload) -> tuple[tuple[str, ...], np.ndarray]:
    """The observation's `features`: names (sorted union over the kernels) and a (kernels,
    features) float32 matrix, zero where a kernel lacks a feature. log10_flops / log10_bytes are
    added from a kernel's flops / bytes_moved where it has them and its features do not already."""
    per_kernel = []
    for k in workload.kernels:
        features = k.feature_dict()
        if k.flops > 0:
            features.setdefault("log10_flops", math.log10(k.flops))
        if k.bytes_moved > 0:
            features.setdefault("log10_bytes", math.log10(k.bytes_moved))
        per_kernel.append(features)
    names = tuple(sorted(set().union(*per_kernel)))
    matrix = np.array([[f.get(n, 0.0) for n in names] for f in per_kernel], dtype=np.float32)
    return names, matrix.reshape(len(per_kernel), len(names))


class KernelDVFSEnv(gym.Env[Observation, np.ndarray]):
    """
    ## Description

    Per-kernel GPU clock tuning (DVFS) for a training workload: spend the least energy on each
    kernel without running it slower than a budget allows. The episode walks the workload's
    kernels in order; for each kernel the agent picks `steps_per_kernel` (core, memory) clock
    pairs, and each pick is measured the way the full sweep measures it: the kernel repeated
    at that pair for `window_s` seconds of device time, energy from the card's counter read
    at its updates (`kdvfs.runtime.measure.measure_isolated`). The reference a measurement
    is judged against is the same kernel measured at stock clocks (boost + power cap; the
    highest pair on a recorded table) in the same episode.

    ## Action Space

    `MultiDiscrete([n_core_levels, n_mem_levels])`: indices into the device grid's sorted core
    and memory clock levels (`env.core_levels_mhz`, `env.mem_levels_mhz`). A grid need not be
    a full product: a combination the grid lacks is an invalid action, which is not measured
    and earns `invalid_reward`. `env.action_masks()` (and `info["action_mask"]`) is a boolean
    array of shape `(n_core_levels, n_mem_levels)`, True where the pair is in the grid.
    `env.action_for(pair)` gives the action of a `ClockPair`.

    ## Observation Space

    A `Dict`:

    | Key             | Space                          | Meaning                                                        |
    |-----------------|--------------------------------|----------------------------------------------------------------|
    | `kernel`        | `Discrete(n_kernels)`          | index of the current kernel in the workload                    |
    | `features`      | `Box(-inf, inf, (n_features,))`| its features (`env.feature_names`: the union over the workload, zero where a kernel lacks one, plus log10 flops / bytes where known) |
    | `temperature_c` | `Box(-273.15, inf, (1,))`      | GPU temperature now                                            |
    | `last`          | `Box(0, [inf, inf, 1, 1])`     | the current kernel's latest measurement: time / reference time, energy / reference energy, core / highest core clock, memory / highest memory clock |
    | `budget`        | `Box(0, inf, (1,))`            | the slowdown budget                                            |

    Before a kernel's first pick, `last` holds its reference: `[1, 1, ...]` with the clocks of
    the grid's highest pair.

    ## Rewards

    The compute-waste reward of `kdvfs.envs.reward.compute_waste_reward`:

        reward = (E_ref - E) / E_ref - penalty_scale * max(0, T / T_ref - 1 - budget) / budget

    the relative energy saved against the kernel's reference, less a penalty linear in the
    slowdown beyond the budget (a slowdown of 2 x budget costs `penalty_scale`). An invalid
    action earns `invalid_reward`.

    ## Starting State

    Kernel 0 (or `options={"kernel": NAME}`), its reference measured at reset. References are
    measured lazily, once per episode, when a kernel is first visited; `info` counts them and
    the device seconds they cost.

    ## Episode End

    1. Termination: after `steps_per_kernel` steps on the workload's last kernel.
    2. Truncation: `max_episode_steps` of the registration (1000) or of `gymnasium.make`.

    ## Arguments

    | Parameter          | Type                        | Default            | Description                                             |
    |--------------------|-----------------------------|--------------------|---------------------------------------------------------|
    | `device`           | **str \\| RunnableDevice**   | `"sim:rtx3080ti"`  | a `kdvfs.runtime.registry` spec (`sim:PRESET`, `replay:CSV`) or a device object |
    | `workload`         | **str \\| Workload**         | `"gpt3-xl-layer"`  | a registry spec (`gpt3-xl-layer`, `trace:CSV`, `table`) or a `Workload` |
    | `budget`           | **float**                   | `0.01`             | allowed slowdown (0.01: 1 %)                             |
    | `window_s`         | **float**                   | `1.0`              | device seconds per measurement                           |
    | `steps_per_kernel` | **int**                     | `8`                | measurements per kernel                                  |
    | `penalty_scale`    | **float**                   | `1.0`              | weight of the over-budget penalty                        |
    | `invalid_reward`   | **float**                   | `-1.0`             | reward of a pair the grid lacks                          |
    | `noise`            | **float \\| None**           | `None`             | measurement-noise scale of a spec'd device (None: its default) |

    `info` holds the kernel's name, the asked `clocks` (a `ClockPair`), the measurement
    (`time_s`, `energy_j` per launch, `throttled`) and its reference (`ref_time_s`,
    `ref_energy_j`), `invalid_action`, `action_mask`, `device_s` (device seconds this call
    cost), `episode_device_s`, `measurements` and `reference_measurements` (this episode),
    and `source` ("simulated" or "replayed").

    Seeding: a device given as a spec is re-opened, fresh, with the seed of each seeded reset,
    so an episode is a function of its seed and actions. A device given as an object keeps
    its state and noise across resets; seed it yourself (and pass a fresh one per episode)
    for repeatable episodes.

    ```python
    >>> import gymnasium as gym
    >>> import kdvfs.envs
    >>> env = gym.make("kdvfs/KernelDVFS-v0", device="sim:a100", workload="gpt3-xl-layer",
    ...                budget=0.01, window_s=0.2, steps_per_kernel=2)
    >>> obs, info = env.reset(seed=0)
    >>> info["kernel"], info["reference_measurements"]
    ('ln1_fwd', 1)
    >>> obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
    >>> info["source"]
    'simulated'

    ```
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(
        self,
        device: str | RunnableDevice = "sim:rtx3080ti",
        workload: str | Workload = "gpt3-xl-layer",
        budget: float = 0.01,
        *,
        window_s: float = 1.0,
        steps_per_kernel: int = 8,
        penalty_scale: float = 1.0,
        invalid_reward: float = -1.0,
        noise: float | None = None,
    ) -> None:
        positive("budget", budget)
        positive("window_s", window_s)
        positive("steps_per_kernel", steps_per_kernel)
        self._target = EnvTarget(device, workload, noise)
        self.budget = budget
        self.window_s = window_s
        self.steps_per_kernel = int(steps_per_kernel)
        self.penalty_scale = penalty_scale
        self.invalid_reward = invalid_reward
        grid = self.device.grid
        self.core_levels_mhz = grid.core_levels_mhz
        self.mem_levels_mhz = grid.mem_levels_mhz
        self._mask = np.array(
            [[ClockPair(c, m) in grid for m in self.mem_levels_mhz] for c in self.core_levels_mhz]
        )
        self.feature_names, self._features = observation_features(self.workload)
        top = grid.highest()
        self._reference_clocks = (
            top.core_mhz / max(self.core_levels_mhz),
            top.mem_mhz / max(self.mem_levels_mhz),
        )
        self.action_space = spaces.MultiDiscrete([len(self.core_levels_mhz), len(self.mem_levels_mhz)])
        self.observation_space = spaces.Dict(
            {
                "kernel": spaces.Discrete(len(self.workload)),
                "features": spaces.Box(-np.inf, np.inf, (len(self.feature_names),), np.float32),
                "temperature_c": scalar_box(ABSOLUTE_ZERO_C),
                "last": spaces.Box(np.zeros(4, np.float32), np.array([np.inf, np.inf, 1.0, 1.0], np.float32)),
                "budget": scalar_box(0.0),
            }
        )
        self._kernel_i = 0
        self._steps_done = 0
        self._refs: dict[int, Measurement] = {}
        self._last: dict[int, tuple[float, float, float, float]] = {}
        self._episode_device_s = 0.0
        self._measurements = 0

    @property
    def device(self) -> RunnableDevice:
        """The device measured on (a fresh one after each seeded reset of a spec'd device)."""
        return self._target.device

    @property
    def workload(self) -> Workload:
        return self._target.workload

    def action_masks(self) -> np.ndarray:
        """(n_core_levels, n_mem_levels) booleans: True where the pair is in the grid."""
        return self._mask.copy()

    def action_for(self, pair: ClockPair) -> np.ndarray:
        """The action that picks `pair` (KdvfsError if the grid lacks it)."""
        self.device.grid.index(pair)
        return np.array(
            [self.core_levels_mhz.index(pair.core_mhz), self.mem_levels_mhz.index(pair.mem_mhz)],
            dtype=np.int64,
        )

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        """Start at kernel 0 or options["kernel"] (a name), measuring its reference."""
        super().reset(seed=seed)
        self._target.reseed(seed)
        start = options.get("kernel") if options else None
        self._kernel_i = 0 if start is None else self.workload.kernels.index(self.workload.kernel(start))
        self._steps_done = 0
        self._refs.clear()
        self._last.clear()
        self._measurements = 0
        cost_s = self._measure_reference(self._kernel_i)
        self._episode_device_s = cost_s
        return self._observation(), self._info(cost_s)

    def step(self, action: np.ndarray) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        """Measure the current kernel at the picked pair (or refuse a pair the grid lacks)."""
        if not self.action_space.contains(np.asarray(action, dtype=np.int64)):
            raise KdvfsError(f"action {np.asarray(action).tolist()} is outside {self.action_space}")
        core_i, mem_i = (int(a) for a in action)
        pair = ClockPair(self.core_levels_mhz[core_i], self.mem_levels_mhz[mem_i])
        i = self._kernel_i
        ref = self._refs[i]
        info: dict[str, Any] = {
            "clocks": pair,
            "ref_time_s": float(ref.time_s),
            "ref_energy_j": float(ref.energy_j),
        }
        if self._mask[core_i, mem_i]:
            result = measure_isolated(self.device, self.workload.kernels[i], pair, self.window_s)
            m = result.measurement
            cost_s = result.cost_s
            self._measurements += 1
            reward = compute_waste_reward(
                m.time_s, m.energy_j, ref.time_s, ref.energy_j, self.budget, self.penalty_scale
            )
            self._last[i] = (
                m.time_s / ref.time_s,
                m.energy_j / ref.energy_j,
                pair.core_mhz / max(self.core_levels_mhz),
                pair.mem_mhz / max(self.mem_levels_mhz),
            )
            info.update(
                time_s=float(m.time_s),
                energy_j=float(m.energy_j),
                throttled=m.throttled,
                invalid_action=False,
            )
        else:
            cost_s = 0.0
            reward = float(self.invalid_reward)
            info["invalid_action"] = True
        self._steps_done += 1
        terminated = False
        if self._steps_done >= self.steps_per_kernel:
            if i + 1 == len(self.workload):
                terminated = True
            else:
                self._kernel_i, self._steps_done = i + 1, 0
                cost_s += self._measure_reference(i + 1)
        self._episode_device_s += cost_s
        info.update(self._info(cost_s), kernel=self.workload.kernels[i].name)
        return self._observation(), reward, terminated, False, info

    def _measure_reference(self, i: int) -> float:
        """Measure kernel i's reference as the episode reaches it; the device seconds spent."""
        result = measure_isolated(self.device, self.workload.kernels[i], None, self.window_s)
        self._refs[i] = result.measurement
        self._last[i] = (1.0, 1.0, *self._reference_clocks)
        return result.cost_s

    def _observation(self) -> Observation:
        i = self._kernel_i
        return {
            "kernel": i,
            "features": self._features[i].copy(),
            "temperature_c": scalar(self.device.temperature_c()),
            "last": np.array(self._last[i], dtype=np.float32),
            "budget": scalar(self.budget),
        }

    def _info(self, cost_s: float) -> dict[str, Any]:
        """What every reset and step reports; cost_s: device seconds of this call."""
        return {
            "kernel": self.workload.kernels[self._kernel_i].name,
            "action_mask": self.action_masks(),
            "device_s": float(cost_s),
            "episode_device_s": float(self._episode_device_s),
            "measurements": self._measurements,
            "reference_measurements": len(self._refs),
            "source": self.device.source,
        }
