"""TrialDVFS-v0: the step-driven tuner's loop as a learning agent sees it. One env step is
one trial in training (A-B-B-A windows of whole steps, candidate against the incumbent) of
the pair the action picks for the group being explored, paid the compute-waste reward of the
tuner's own judgement of that trial.

- `TrialDVFSEnv`: the environment (its class docstring documents it as Gymnasium documents
  its own). It is a tuning run (tuner/run.py: TuningRun, the one every caller feeds) on a
  runtime/steps.py SimulatedJob, whose strategy is the agent: the tuner asks it for the
  current group's pair (`StepTuner.current_task`), the env answers with the action, and the
  run's TrialFinished event carries the outcome the tuner judges (`StepTuner.judge`); the
  reward is envs/reward.py's `trial_reward` of that judgement.
- The observation is policies/agent.py's `search_observation` of the group's task, so an
  agent trained here is a strategy (`AgentStrategy`) wherever a Task is searched.

Layers: this env sits above tuner/ (it feeds a TuningRun); tuner/compare.py makes it only to
train the learning agent. Why it is built so: docs/agent-strategy.md.
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from kdvfs.envs._common import EnvTarget, positive
from kdvfs.envs.reward import trial_reward
from kdvfs.policies._common import BaseStrategy, GridFacts, TaskLog
from kdvfs.policies.agent import observation_space, search_mask, search_observation
from kdvfs.policies.base import ASK_LATER, SearchSpace, Task
from kdvfs.runtime.schedule import Schedule
from kdvfs.runtime.steps import SimulatedJob
from kdvfs.runtime.trials import REFERENCE_S, TRIAL_BLOCKS, TRIAL_WINDOW_S, Judgement, Outcome, StockFigures
from kdvfs.runtime.types import KdvfsError, Workload
from kdvfs.tuner.run import Card, TuningRun
from kdvfs.tuner.step_tuner import Settled, StepTiming, StepTuner, TrialFinished

#: Trials of one group before its best is verified and the next group explored; trials.
TRIALS_PER_GROUP = 8
#: Most steps the env trains between two of the agent's decisions before it stops with an
#: error (a run that neither asks nor settles); steps.
MAX_STEPS_BETWEEN_ACTIONS = 1_000_000


class _AgentAnswers(BaseStrategy):
    """The agent as the tuner's strategy: `ask` answers the env's action once, ASK_LATER while
    the agent has not acted, None once the group has had its trials or no pair is left worth
    a trial (search_mask); `tell` and `best` are BaseStrategy's (the group's TaskLog)."""

    name = "agent"

    def __init__(self, space: SearchSpace, trials_per_group: int) -> None:
        super().__init__(space, 0, max_per_task=trials_per_group)
        self.facts = GridFacts(space)
        self.action: int | None = None
        self.waiting = False  # the tuner asked and waits for the agent's action

    def mask(self, task: Task) -> np.ndarray:
        return search_mask(self.facts, task, self.log(task))

    def ask(self, task: Task) -> int | None:
        log = self.log(task)
        if len(log.order) >= self.max_per_task or (self.action is None and not self.mask(task).any()):
            return None
        if self.action is None:
            self.waiting = True
            return ASK_LATER
        action, self.action, self.waiting = self.action, None, False
        return action

    def _choose(self, task: Task, log: TaskLog) -> int | None:  # ask() answers for the agent
        raise NotImplementedError


class TrialDVFSEnv(gym.Env[np.ndarray, np.int64]):
    """
    ## Description

    Per-group GPU clock tuning (DVFS) inside a running training job, as kdvfs's step-driven
    tuner does it (docs/design-step-tuner.md): the env is a tuning run of the tuner itself,
    with the agent as its search strategy. A simulated job
    (`kdvfs.runtime.steps.SimulatedJob`) trains step after step on a simulated or replayed
    card. At reset the job runs at stock while the tuner measures its reference in
    counter-aligned windows; the step is then split into groups where the job can switch
    clocks (its passes, merged until each lasts four switch latencies), explored one at a
    time, the longest first. Each env step is one trial: the incumbent schedule with the
    current group's pair replaced by the action's (B) runs against the incumbent (A) in
    `blocks` A-B-B-A blocks of `window_s` windows of whole steps. The trial is judged as the
    tuner judges it (`StepTuner.judge`): B's energy per step against A's, its step time
    against stock, their standard errors. Once a group has had `trials_per_group` trials (or
    no pair is left worth one), the tuner verifies the group's best against the incumbent over
    longer windows and adopts it when the verification shows its saving, as in training.

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
    the first (longest) group's search with only the incumbent's own pair known (at stock the
    grid's top pair, the trial's A arm: tried 1, its time and energy those of the reference,
    0), every other pair zeros.

    ## Episode End

    Termination: the tuner has settled (every group had its trials and its verification).
    Truncation: `max_episode_steps` of the registration (200) or of `gymnasium.make`.

    ## Arguments

    | Parameter          | Type                      | Default           | Description |
    |--------------------|---------------------------|-------------------|-------------|
    | `device`           | **str \\| ModelDevice**   | `"sim:rtx3080ti"` | a `kdvfs.runtime.registry` spec (`sim:PRESET`, `replay:CSV`) or a device object |
    | `workload`         | **str \\| Workload**      | `"gpt3-xl-layer"` | a registry spec (`gpt3-xl-layer`, `trace:CSV`, `table`) or a `Workload` |
    | `budget`           | **float**                 | `0.01`            | the largest slowdown against stock (0.01: 1 %) |
    | `trials_per_group` | **int**                   | `8`               | trials of each group |
    | `window_s`         | **float**                 | `2.0`             | length of one trial window, s (the tuner's TRIAL_WINDOW_S); verification windows are twice as long |
    | `blocks`           | **int**                   | `4`               | A-B-B-A blocks per trial and per verification (the tuner's TRIAL_BLOCKS) |
    | `reference_s`      | **float**                 | `20.0`            | training at stock measured as the reference, s |
    | `penalty_scale`    | **float**                 | `1.0`             | weight of the over-budget penalty |
    | `noise`            | **float \\| None**        | `None`            | measurement-noise scale of a spec'd device |

    `info` holds the trial's judgement (`saving`, `saving_se`, `slowdown`, `energy_ratio`,
    each None where the trial could not measure it; `adopted`: whether the judgement would
    adopt it), `abandoned` (the tuner stopped B to keep the budget), `group`, `pair`, `plan_energy_saving` (the
    incumbent's measured saving against stock), `run_slowdown` (the whole run's against stock
    so far, exploration included), `device_s` (training seconds this call ran), `source`
    ("simulated" or "replayed"). `env.incumbent` is the schedule adopted so far, `env.tuner`
    the tuner. Seeding as StepDVFS-v0's: a spec'd device is re-opened, fresh, with each
    seeded reset's seed.

    ```python
    >>> import gymnasium as gym
    >>> import kdvfs.envs
    >>> env = gym.make("kdvfs/TrialDVFS-v0", device="sim:rtx3080ti", workload="gpt3-xl-layer",
    ...                window_s=0.5, blocks=2, reference_s=2.0, trials_per_group=2)
    >>> obs, info = env.reset(seed=0)
    >>> float(obs.sum())  # the incumbent's own pair: known, not a candidate
    1.0
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
        self.timing = StepTiming(
            reference_s=reference_s,
            trial_window_s=window_s,
            trial_blocks=self.blocks,
            verify_window_s=2.0 * window_s,
            verify_blocks=self.blocks,
            verify_max_blocks=3 * self.blocks,
            max_trials_per_group=self.trials_per_group,
        )
        """How long the env's tuner measures (the tuner's own lengths at the defaults)."""
        self.pairs = list(self.device.grid.pairs)
        self.space = SearchSpace(
            np.array([[p.core_mhz, p.mem_mhz] for p in self.pairs], dtype=float),
            reference=None
            if self.device.source == "simulated"
            else self.pairs.index(self.device.grid.highest()),
        )
        self.action_space = spaces.Discrete(len(self.pairs))
        self.observation_space = observation_space(len(self.pairs))
        self.outcome: Outcome | None = None
        """The last trial's outcome (its blocks' differences and standard errors)."""
        self.run: TuningRun | None = None

    @property
    def device(self):
        """The device run on (a fresh one after each seeded reset of a spec'd device)."""
        return self._target.device

    @property
    def workload(self) -> Workload:
        return self._target.workload

    @property
    def tuner(self) -> StepTuner:
        """The tuner of this episode's run."""
        return self.run.tuner

    @property
    def incumbent(self) -> Schedule:
        """The schedule adopted so far."""
        return self.run.tuner.incumbent

    @property
    def stock(self) -> StockFigures:
        """Stock as the tuner's reference measured it."""
        return self.run.tuner.stock

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Train at stock until the reference is measured and the tuner asks for the first
        group's pair."""
        super().reset(seed=seed)
        self._target.reseed(seed)
        self.job = SimulatedJob(self.device, self.workload)
        self._agent = _AgentAnswers(self.space, self.trials_per_group)
        self.run = TuningRun(
            Card.of(self.device),
            self.workload,
            budget=self.budget,
            strategy=self._agent,
            timing=self.timing,
            start_s=self.job.seconds,
        )
        self.run.subscribe(self._follow)
        self._schedule = self.run.tuner.incumbent
        self._finished: TrialFinished | None = None
        self._judged: Judgement | None = None
        self._task: Task | None = None
        start_s = self.job.seconds
        self._train_until_asked()
        if self._task is None:
            raise KdvfsError("the tuner settled without a group to explore: nothing for the agent to choose")
        return self._observation(), {"device_s": self.job.seconds - start_s, "source": self.device.source}

    def action_masks(self) -> np.ndarray:
        """True where the pair is worth a trial in the current group (the Action Space)."""
        return self._agent.mask(self._task)

    def step(self, action):
        """One trial of the action's pair for the current group against the incumbent (and,
        when it was the group's last, the group's verification)."""
        if not self.action_space.contains(np.int64(action)):
            raise KdvfsError(f"action {action!r} is outside {self.action_space}")
        if self._terminated:
            raise KdvfsError("the episode has ended: reset the env")
        start_s = self.job.seconds
        self._agent.action = int(action)
        self._finished = None
        self._train_until_asked()
        finished = self._finished
        if finished is None:
            raise KdvfsError("the tuner settled before the action's trial ended")
        judgement = self._judged  # against the incumbent the trial ran against
        reward = trial_reward(judgement, self.budget, self.penalty_scale)
        info = {
            "group": finished.group,
            "pair": str(self.pairs[int(action)]),
            "saving": _measured(judgement.saving),
            "saving_se": _measured(judgement.saving_se),
            "slowdown": _measured(judgement.slowdown),
            "energy_ratio": _measured(judgement.energy_ratio),
            "adopted": judgement.adopted,
            "abandoned": finished.outcome.abandoned,
            "plan_energy_saving": self.run.tuner.plan_energy_saving(),
            "run_slowdown": self.run.tuner.account.slowdown(),
            "device_s": self.job.seconds - start_s,
            "source": self.device.source,
        }
        return self._observation(), reward, self._terminated, False, info

    # --- helpers -------------------------------------------------------------------------
    @property
    def _terminated(self) -> bool:
        return isinstance(self.run.tuner.phase, Settled)

    def _follow(self, event: object) -> None:
        """The run's events: the action's trial ended (its reward is judged when it is told)."""
        if isinstance(event, TrialFinished) and event.kind == "trial" and self._finished is None:
            self._finished = event
            self.outcome = event.outcome
            self._judged = self.run.tuner.judge(event.outcome, self.window_s)

    def _train_until_asked(self) -> None:
        """Train until the tuner waits for the agent (its trial, if one was asked, ended), or
        settles."""
        for _ in range(MAX_STEPS_BETWEEN_ACTIONS):
            if self._agent.waiting and self._agent.action is None:
                self._task = self.run.tuner.current_task()
                return
            if self._terminated:
                return
            self._schedule = self.run.on_step_end(self.job.step(self._schedule))
        raise KdvfsError(f"the tuner neither asked nor settled in {MAX_STEPS_BETWEEN_ACTIONS} steps")

    def _observation(self) -> np.ndarray:
        return search_observation(self._task, self._agent.log(self._task))


def _measured(x: float) -> float | None:
    """A figure of the trial, None where it could not be measured (abandoned before a block)."""
    return float(x) if np.isfinite(x) else None
