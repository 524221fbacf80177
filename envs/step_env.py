"""StepDVFS-v0: choose a clock pair for every kernel of a training step at once;
each env step runs the training step with them and measures it.

- `StepDVFSEnv`: the environment (its class docstring documents it as Gymnasium
  documents its own);
- `measure_steps` / `StepMeasurement`: one step's time and energy under a
  per-kernel plan, read at the energy counter's updates;
- `_KernelStream`: the kernels run back to back, switching clocks synchronously.

Why each switch is waited out: docs/design-envs.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from kdvfs.envs._common import ABSOLUTE_ZERO_C, EnvTarget, positive, scalar, scalar_box
from kdvfs.envs.reward import compute_waste_reward
from kdvfs.runtime.device import RunnableDevice
from kdvfs.runtime.measure import THROTTLES
from kdvfs.runtime.types import ClockPair, KdvfsError, Kernel, Workload

Observation = dict[str, np.ndarray]

_NOTHING_ASKED = object()  # the stream's last request before its first: differs from every pair


@dataclass(frozen=True)
class StepMeasurement:
    """Measured time and energy of one step, whether the card throttled, and the device
    seconds the measurement cost.

    Attributes:
        time_s: one step's time, s (kernel run times plus clock-switch waits).
        energy_j: one step's energy, J (the window's mean power times time_s).
        throttled: a throttle reason of runtime.measure.THROTTLES was seen in the window.
        cost_s: device seconds the measurement took, warm-up and counter alignment included.
    """

    time_s: float
    energy_j: float
    throttled: bool
    cost_s: float


class _KernelStream:
    """The step's kernels run back to back, over and over, each at its planned clocks
    (None: stock). Before a kernel whose pair differs from the previous kernel's, the stream
    asks for it and waits the device's switch latency (idle, at the old clocks) so that the
    kernel runs at its own pair (why: docs/design-envs.md).

    Args:
        device: runs the kernels.
        kernels: one step's kernels, in order.
        plan: per kernel, its clock pair (None: stock clocks).
    """

    def __init__(
        self, device: RunnableDevice, kernels: Sequence[Kernel], plan: Sequence[ClockPair | None]
    ) -> None:
        self._device = device
        self._kernels = kernels
        self._plan = plan
        self._asked: object = _NOTHING_ASKED
        self.position = 0
        self.throttled = False

    def next_kernel(self) -> float:
        """Switch clocks if the plan says so, run the next kernel (all its launches); the
        seconds both took."""
        kernel, pair = self._kernels[self.position], self._plan[self.position]
        waited_s = 0.0
        if pair != self._asked:
            if pair is None:
                self._device.reset_clocks()
            else:
                self._device.set_clocks(pair)
            self._asked = pair
            waited_s = self._device.switch_latency_s
            self._device.idle(waited_s)
        elapsed_s = self._device.run(kernel, kernel.launches)
        self.throttled |= bool(self._device.throttle_reasons() & THROTTLES)
        self.position = (self.position + 1) % len(self._kernels)
        return waited_s + elapsed_s

    def to_step_end(self) -> None:
        while self.position != 0:
            self.next_kernel()


def measure_steps(
    device: RunnableDevice,
    kernels: Sequence[Kernel],
    plan: Sequence[ClockPair | None],
    steps: int,
) -> StepMeasurement:
    """Run the step with `plan` and measure one step's time and energy.

    As measure.measure_isolated does for one kernel: after a warm-up step, a window is
    opened and closed at observed updates of the energy counter (checked after each kernel),
    `steps` steps' worth of kernels run inside it, their run() times plus the
    clock-switch waits give the step time, and the window's mean power times that time
    its energy. The stream then finishes the step it is in, as training would.
    """
    start_s = device.now_s()
    stream = _KernelStream(device, kernels, plan)
    stream.next_kernel()
    stream.to_step_end()
    energy_a = device.energy_j()
    while device.energy_j() == energy_a:
        stream.next_kernel()
    energy_a, t_a = device.energy_j(), device.now_s()
    stream.throttled = False
    busy_s = sum(stream.next_kernel() for _ in range(steps * len(kernels)))
    energy_b = device.energy_j()
    while device.energy_j() == energy_b:
        stream.next_kernel()
    energy_b, t_b = device.energy_j(), device.now_s()
    stream.to_step_end()
    time_s = busy_s / steps
    power_w = (energy_b - energy_a) / (t_b - t_a)
    return StepMeasurement(
        float(time_s), float(power_w * time_s), stream.throttled, float(device.now_s() - start_s)
    )


class StepDVFSEnv(gym.Env[Observation, np.ndarray]):
    """
    ## Description

    Per-kernel GPU clock tuning (DVFS) judged where it matters: on the whole training
    step. At each env step the agent gives every kernel of the workload a clock pair; the
    device then runs the step with those clocks `steps_per_action` times (after one
    warm-up step). Before each kernel whose pair differs from the previous kernel's,
    the clocks are switched and the device's switch latency waited out, so that every kernel
    runs at its own pair: switching per kernel on a card that takes tens of ms to change
    clocks costs far more time than it saves energy, which is the physics, not an artefact.
    Time is the sum of the kernels' run times and the switch waits; energy comes from the
    card's counter, read at its updates (`measure_steps`). The reference is the step at stock clocks (boost + power
    cap; the highest pair on a recorded table), measured at reset.

    ## Action Space

    `MultiDiscrete([n_pairs] * n_kernels)`: for each kernel of the workload, in order, an
    index into `env.device.grid.pairs`. `env.action_for({name: ClockPair})` builds one.

    ## Observation Space

    A `Dict`:

    | Key             | Space                     | Meaning                                                           |
    |-----------------|---------------------------|-------------------------------------------------------------------|
    | `last`          | `Box(0, inf, (2,))`       | last step's time / reference time, energy / reference energy |
    | `temperature_c` | `Box(-273.15, inf, (1,))` | GPU temperature now                                               |
    | `budget`        | `Box(0, inf, (1,))`       | the slowdown budget                                               |

    ## Rewards

    The compute-waste reward of `kdvfs.envs.reward.compute_waste_reward` on the step:

        reward = (E_ref - E) / E_ref - penalty_scale * max(0, T / T_ref - 1 - budget) / budget

    the relative energy saved against the reference step, less a penalty linear in the
    slowdown beyond the budget (a slowdown of 2 x budget costs `penalty_scale`).

    ## Starting State

    The reference step measured at reset; `last` is `[1, 1]`.

    ## Episode End

    No termination: training goes on. Truncation: `max_episode_steps` of the registration
    (200) or of `gymnasium.make`.

    ## Arguments

    | Parameter             | Type                       | Default           | Description                                           |
    |-----------------------|----------------------------|-------------------|-------------------------------------------------------|
    | `device`              | **str \\| RunnableDevice**  | `"sim:rtx3080ti"` | a `kdvfs.runtime.registry` spec (`sim:PRESET`, `replay:CSV`) or a device object |
    | `workload`            | **str \\| Workload**        | `"gpt3-xl-layer"` | a registry spec (`gpt3-xl-layer`, `trace:CSV`, `table`) or a `Workload` |
    | `budget`              | **float**                  | `0.01`            | allowed slowdown of the step (0.01: 1 %)          |
    | `steps_per_action` | **int**                    | `10`              | steps in a measurement window (make it span several energy-counter updates, >= ~0.5 s, for a precise reading) |
    | `penalty_scale`       | **float**                  | `1.0`             | weight of the over-budget penalty                      |
    | `noise`               | **float \\| None**          | `None`            | measurement-noise scale of a spec'd device (None: its default) |

    `info` holds the measured step (`time_s`, `energy_j`, `throttled`), the reference
    (`ref_time_s`, `ref_energy_j`), the noiseless figures of the plan from the device's model
    (`expected_saving`, `expected_slowdown`: each step at its own steady temperature,
    switch cost ignored), `device_s` (device seconds this call cost), `episode_device_s` and
    `source` ("simulated" or "replayed").

    Seeding: a device given as a spec is re-opened, fresh, with the seed of each seeded reset,
    so an episode is a function of its seed and actions. A device given as an object keeps
    its state and noise across resets; seed it yourself (and pass a fresh one per episode)
    for repeatable episodes.

    ```python
    >>> import gymnasium as gym
    >>> import kdvfs.envs
    >>> env = gym.make("kdvfs/StepDVFS-v0", device="sim:a100", workload="gpt3-xl-layer",
    ...                budget=0.01, steps_per_action=2)
    >>> obs, info = env.reset(seed=0)
    >>> obs["last"].tolist()
    [1.0, 1.0]
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
        steps_per_action: int = 10,
        penalty_scale: float = 1.0,
        noise: float | None = None,
    ) -> None:
        positive("budget", budget)
        positive("steps_per_action", steps_per_action)
        self._target = EnvTarget(device, workload, noise)
        self.budget = budget
        self.steps_per_action = int(steps_per_action)
        self.penalty_scale = penalty_scale
        self.action_space = spaces.MultiDiscrete([len(self.device.grid)] * len(self.workload))
        self.observation_space = spaces.Dict(
            {
                "last": spaces.Box(0.0, np.inf, (2,), np.float32),
                "temperature_c": scalar_box(ABSOLUTE_ZERO_C),
                "budget": scalar_box(0.0),
            }
        )
        self._ref = StepMeasurement(1.0, 1.0, False, 0.0)
        self._expected_ref = (1.0, 1.0)
        self._last = (1.0, 1.0)
        self._episode_device_s = 0.0

    @property
    def device(self) -> RunnableDevice:
        """The device run on (a fresh one after each seeded reset of a spec'd device)."""
        return self._target.device

    @property
    def workload(self) -> Workload:
        return self._target.workload

    def action_for(self, choice: Mapping[str, ClockPair]) -> np.ndarray:
        """The action giving each kernel its pair in `choice` (by kernel name)."""
        grid = self.device.grid
        return np.array([grid.index(choice[k.name]) for k in self.workload.kernels], dtype=np.int64)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        """Measure the reference step (stock clocks)."""
        super().reset(seed=seed)
        self._target.reseed(seed)
        kernels = self.workload.kernels
        self._ref = measure_steps(self.device, kernels, [None] * len(kernels), self.steps_per_action)
        self._expected_ref = self.device.expected_step([(k, None, k.launches) for k in kernels])
        self._last = (1.0, 1.0)
        self._episode_device_s = self._ref.cost_s
        return self._observation(), self._info(self._ref.cost_s)

    def step(self, action: np.ndarray) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        """Run and measure the step with a pair per kernel."""
        if not self.action_space.contains(np.asarray(action, dtype=np.int64)):
            raise KdvfsError(f"action {np.asarray(action).tolist()} is outside {self.action_space}")
        pairs = self.device.grid.pairs
        plan = [pairs[int(a)] for a in action]
        kernels = self.workload.kernels
        m = measure_steps(self.device, kernels, plan, self.steps_per_action)
        self._episode_device_s += m.cost_s
        ref = self._ref
        reward = compute_waste_reward(
            m.time_s, m.energy_j, ref.time_s, ref.energy_j, self.budget, self.penalty_scale
        )
        self._last = (m.time_s / ref.time_s, m.energy_j / ref.energy_j)
        expected_t, expected_e = self.device.expected_step(
            [(k, p, k.launches) for k, p in zip(kernels, plan)]
        )
        info = self._info(m.cost_s)
        info.update(
            time_s=m.time_s,
            energy_j=m.energy_j,
            throttled=m.throttled,
            expected_saving=float(1.0 - expected_e / self._expected_ref[1]),
            expected_slowdown=float(expected_t / self._expected_ref[0] - 1.0),
        )
        return self._observation(), reward, False, False, info

    def _observation(self) -> Observation:
        return {
            "last": np.array(self._last, dtype=np.float32),
            "temperature_c": scalar(self.device.temperature_c()),
            "budget": scalar(self.budget),
        }

    def _info(self, cost_s: float) -> dict[str, Any]:
        """What every reset and step reports; cost_s: device seconds of this call."""
        return {
            "ref_time_s": self._ref.time_s,
            "ref_energy_j": self._ref.energy_j,
            "device_s": cost_s,
            "episode_device_s": self._episode_device_s,
            "source": self.device.source,
        }
