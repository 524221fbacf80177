"""TrialDVFS-v0: the step-driven tuner's loop as a learning agent sees it. One env step is
one trial in training (A-B-B-A windows of whole steps, candidate against the incumbent) of
the pair the action picks for the group being explored, paid the compute-waste reward of the
tuner's own judgement of that trial.

- `TrialDVFSEnv`: the environment (its class docstring documents it as Gymnasium documents
  its own); everything it measures goes through runtime/trials.py (StockReference, Trial,
  judge, pass_boundaries, switchable_groups) on a runtime/steps.py SimulatedJob, and its
  reward is envs/reward.py's `trial_reward`: the same code as tuner/step_tuner.py's.
- The observation is policies/agent.py's `search_observation` of the group's task, so an
  agent trained here is a strategy (`AgentStrategy`) wherever a Task is searched.

Why it is built so: docs/agent-strategy.md.
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from kdvfs.envs._common import EnvTarget, positive
from kdvfs.envs.reward import trial_reward
from kdvfs.policies._common import GridFacts, TaskLog
from kdvfs.policies.agent import observation_space, search_mask, search_observation, task_log
from kdvfs.policies.base import SearchSpace, Task
from kdvfs.runtime.schedule import Schedule
from kdvfs.runtime.steps import SimulatedJob
from kdvfs.runtime.trials import (
    REFERENCE_S,
    TRIAL_BLOCKS,
    TRIAL_WINDOW_S,
    StepAccount,
    StockFigures,
    StockReference,
    Trial,
    judge,
    pass_boundaries,
    switchable_groups,
)
from kdvfs.runtime.types import KdvfsError, Workload

#: Trials of one group before the episode moves to the next group; trials.
TRIALS_PER_GROUP = 8


class TrialDVFSEnv(gym.Env[np.ndarray, np.int64]):
    """
    ## Description

    Per-group GPU clock tuning (DVFS) inside a running training job, as kdvfs's step-driven
    tuner does it (docs/design-step-tuner.md). A simulated job (`kdvfs.runtime.steps.SimulatedJob`)
    trains step after step on a simulated or replayed card. At reset the job runs at stock
    while the reference is measured in counter-aligned windows; the step is then split into
    groups where the job can switch clocks (its passes, merged until each lasts four
    switch latencies), explored one at a time, the longest first. Each env step is one
    trial: the incumbent schedule with the current group's pair replaced by the action's
    (B) runs against the incumbent (A) in `blocks` A-B-B-A blocks of `window_s` windows of
    whole steps. The trial is judged as the tuner judges it (`kdvfs.runtime.trials.judge`):
    B's energy per step against A's, its step time against stock, their standard errors;
    a candidate the judgement adopts becomes the incumbent. Every group gets
    `trials_per_group` trials (fewer once no pair is left to try).

    ## Action Space

    `Discrete(n_pairs)`: an index into `env.device.grid.pairs`, the pair for the group being
    explored. `env.action_masks()` is True where the pair is worth a trial (not yet tried in
    this group, not known or bounded too slow: `kdvfs.policies.agent.search_mask`); a masked
    pair is still measured if given.

    ## Observation Space

    `Box(-5, 5, (3 * n_pairs,), float32)`: `kdvfs.policies.agent.search_observation` of the
    group's search, per pair: 1 if tried in this group, else 0; the group's time at it as
    log(time / stock time) in units of log(1 + the group's budget) (1: at its limit); the
    step's energy at it as 10 x log(energy / the incumbent's). Untried pairs are zeros. The
    same view a kernel's search gives in `kdvfs compare`, so the trained agent is a strategy.

    ## Rewards

    The compute-waste reward (`kdvfs.envs.reward.trial_reward`) of B's judged figures against
    stock: with r = B's step energy / stock's and s = B's slowdown against stock,

        reward = (1 - r) - penalty_scale * max(0, s - budget) / budget

    B's saving against stock (an adopted incumbent's saving included) within the budget, a
    penalty linear in the slowdown beyond it.

    ## Starting State

    The reference measured at stock (at least `reference_s` s of training, three windows);
    the first (longest) group's search, nothing tried: all zeros.

    ## Episode End

    Termination: every group has had its trials. Truncation: `max_episode_steps` of the
    registration (200) or of `gymnasium.make`.

    ## Arguments

    | Parameter          | Type                      | Default           | Description |
    |--------------------|---------------------------|-------------------|-------------|
    | `device`           | **str \\| ModelDevice**   | `"sim:rtx3080ti"` | a `kdvfs.runtime.registry` spec (`sim:PRESET`, `replay:CSV`) or a device object |
    | `workload`         | **str \\| Workload**      | `"gpt3-xl-layer"` | a registry spec (`gpt3-xl-layer`, `trace:CSV`, `table`) or a `Workload` |
    | `budget`           | **float**                 | `0.01`            | the largest slowdown against stock (0.01: 1 %) |
    | `trials_per_group` | **int**                   | `8`               | trials of each group |
    | `window_s`         | **float**                 | `2.0`             | length of one window, s (the tuner's TRIAL_WINDOW_S) |
    | `blocks`           | **int**                   | `4`               | A-B-B-A blocks per trial (the tuner's TRIAL_BLOCKS; adoption needs >= 2) |
    | `reference_s`      | **float**                 | `20.0`            | training at stock measured as the reference, s |
    | `penalty_scale`    | **float**                 | `1.0`             | weight of the over-budget penalty |
    | `noise`            | **float \\| None**        | `None`            | measurement-noise scale of a spec'd device |

    `info` holds the trial's judgement (`saving`, `saving_se`, `slowdown`, `energy_ratio`,
    `adopted`), `group`, `pair`, `running_saving` (the incumbent's measured saving against
    stock), `run_slowdown` (the whole run's against stock so far, exploration included),
    `device_s` (training seconds this call ran), `source` ("simulated" or "replayed").
    `env.incumbent` is the schedule adopted so far. Seeding as StepDVFS-v0's: a spec'd
    device is re-opened, fresh, with each seeded reset's seed.

    ```python
    >>> import gymnasium as gym
    >>> import kdvfs.envs
    >>> env = gym.make("kdvfs/TrialDVFS-v0", device="sim:rtx3080ti", workload="gpt3-xl-layer",
    ...                window_s=0.5, blocks=2, reference_s=2.0, trials_per_group=2)
    >>> obs, info = env.reset(seed=0)
    >>> float(obs.sum())
    0.0
    >>> obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
    >>> info["source"], obs.shape == env.observation_space.shape
    ('simulated', True)

    ```
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(
        self,
        device="sim:rtx3080ti",
        workload: str | Workload = "gpt3-xl-layer",
        budget: float = 0.01,
        *,
        trials_per_group: int = TRIALS_PER_GROUP,
        window_s: float = TRIAL_WINDOW_S,
        blocks: int = TRIAL_BLOCKS,
        reference_s: float = REFERENCE_S,
        penalty_scale: float = 1.0,
        noise: float | None = None,
    ) -> None:
        for name, value in (
            ("budget", budget),
            ("trials_per_group", trials_per_group),
            ("window_s", window_s),
            ("blocks", blocks),
            ("reference_s", reference_s),
        ):
            positive(name, value)
        self._target = EnvTarget(device, workload, noise)
        if not hasattr(self.device, "expected_step"):
            raise KdvfsError("TrialDVFS-v0 needs a simulated (sim:) or replayed (replay:) device")
        self.budget = budget
        self.trials_per_group = int(trials_per_group)
        self.window_s = window_s
        self.blocks = int(blocks)
        self.reference_s = reference_s
        self.penalty_scale = penalty_scale
        self.pairs = list(self.device.grid.pairs)
        self.space = SearchSpace(
            np.array([[p.core_mhz, p.mem_mhz] for p in self.pairs], dtype=float),
            reference=None
            if self.device.source == "simulated"
            else self.pairs.index(self.device.grid.highest()),
        )
        self._facts = GridFacts(self.space)
        self.action_space = spaces.Discrete(len(self.pairs))
        self.observation_space = observation_space(len(self.pairs))
        self.trial: Trial | None = None
        """The last trial run (its windows and outcome)."""

    @property
    def device(self):
        """The device run on (a fresh one after each seeded reset of a spec'd device)."""
        return self._target.device

    @property
    def workload(self) -> Workload:
        return self._target.workload

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Train at stock until the reference is measured; the first group's search."""
        super().reset(seed=seed)
        self._target.reseed(seed)
        self.job = SimulatedJob(self.device, self.workload)
        self.account = StepAccount(self.budget)
        segments = pass_boundaries(self.workload)
        reference = StockReference(
            Schedule(tuple((s, None) for s in segments)), self.window_s, self.reference_s
        )
        start_s = self.job.seconds
        while not reference.add(self._run(reference.schedule)):
            pass
        self.stock: StockFigures = reference.figures()
        self.account.stock_step_s = self.stock.account_step_s
        starts = switchable_groups(segments, list(self.stock.segment_times_s), self.device.switch_latency_s)
        ends = [*starts[1:], len(self.workload)]
        self.group_times_s = [
            float(sum(t for s, t in zip(segments, self.stock.segment_times_s) if a <= s < b))
            for a, b in zip(starts, ends)
        ]
        self.incumbent = Schedule(tuple((s, None) for s in starts))
        self.incumbent_step_s = self.stock.step_s
        self.incumbent_energy_j = self.stock.energy_per_step_j
        self._order = [int(g) for g in np.argsort(self.group_times_s)[::-1]]
        self._position = -1
        self._next_group()
        self.trial = None
        return self._observation(), {"device_s": self.job.seconds - start_s, "source": self.device.source}

    def action_masks(self) -> np.ndarray:
        """True where the pair is worth a trial in the current group (the Action Space)."""
        return search_mask(self._facts, self._task, self._log)

    def step(self, action):
        """One trial of the action's pair for the current group against the incumbent."""
        if not self.action_space.contains(np.int64(action)):
            raise KdvfsError(f"action {action!r} is outside {self.action_space}")
        if self._position >= len(self._order):
            raise KdvfsError("the episode has ended: reset the env")
        start_s = self.job.seconds
        group, pair = self._order[self._position], self.pairs[int(action)]
        groups = list(self.incumbent.groups)
        groups[group] = (groups[group][0], pair)
        trial = Trial(self.incumbent, Schedule(tuple(groups)), self.blocks, self.window_s, self._settle_s)
        while not trial.done:
            if trial.current is None:
                trial.open(self.job.seconds)
            trial.add(self._run(trial.schedule()))
        self.trial = trial
        outcome = trial.outcome()
        judgement = judge(
            outcome,
            self.stock,
            incumbent_step_s=self.incumbent_step_s,
            incumbent_energy_j=self.incumbent_energy_j,
            budget=self.budget,
            window_s=self.window_s,
        )
        reward = trial_reward(judgement, self.budget, self.penalty_scale)
        energy_j = self.incumbent_energy_j * (1.0 + outcome.energy_diff)
        self._log.add(int(action), float(outcome.b_group_times_s[group]), energy_j)
        if judgement.adopted:
            self.incumbent = trial.candidate
            self.incumbent_energy_j *= 1.0 - judgement.saving
            self.incumbent_step_s *= 1.0 + outcome.time_diff
        self._trials += 1
        if self._trials >= self.trials_per_group or not self.action_masks().any():
            self._next_group()
        info = {
            "group": group,
            "pair": str(pair),
            "saving": judgement.saving,
            "saving_se": judgement.saving_se,
            "slowdown": judgement.slowdown,
            "energy_ratio": judgement.energy_ratio,
            "adopted": judgement.adopted,
            "running_saving": 1.0 - self.incumbent_energy_j / self.stock.energy_per_step_j,
            "run_slowdown": self.account.slowdown(),
            "device_s": self.job.seconds - start_s,
            "source": self.device.source,
        }
        terminated = self._position >= len(self._order)
        return self._observation(), reward, terminated, False, info

    # --- helpers -------------------------------------------------------------------------
    @property
    def _settle_s(self) -> float:
        return self.device.switch_latency_s + self.device.energy_update_period_s

    def _run(self, schedule: Schedule):
        report = self.job.step(schedule)
        self.account.charge(report.step_time_s)
        return report

    def _next_group(self) -> None:
        """The next group's search, as the tuner builds its Task: the group's stock time, the
        incumbent's step energy, the budget's extra time as a share of the group's."""
        self._position += 1
        self._trials = 0
        if self._position >= len(self._order):
            return
        g = self._order[self._position]
        group_s = self.group_times_s[g]
        extra_s = self.budget * self.stock.account_step_s - (
            self.incumbent_step_s - self.stock.account_step_s
        )
        self._task = Task(
            key=f"group{g}",
            ref_time_s=group_s,
            ref_energy_j=self.incumbent_energy_j,
            budget=max(extra_s / group_s, 1e-3),
        )
        self._log: TaskLog = task_log(self.space, self._task)
        if not self.action_masks().any():
            self._next_group()

    def _observation(self) -> np.ndarray:
        return search_observation(self._task, self._log)
