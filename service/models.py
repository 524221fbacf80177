"""The strategies the service runs: one per fleet model, fed by every job of that model.

A fleet model is keyed by (fleet, GPU name, clock grid, workload signature, strategy and its
options): jobs of one GPU model and workload feed one strategy, so a new job starts from what
the fleet measured. Observations are stored as ratios to the teller's own reference and told
to the strategy at the task's model reference (the first reference told for it), so jobs
whose measured stock differs a little pool on one scale.

- `model_key`: the key of a session's model.
- `FleetModel`: the strategy (rebuilt from the database on first use, then caught up with
  observations of other processes before each ask), each task's model reference, and each
  session's pending decision per task: the ranks of one job get the same config until every
  rank told it (data-parallel readings are independent samples; ranks that pooled their
  readings first tell one figure alike, stored once: `pooled`).
- `ModelBank`: the models of this process, created on first use.

Design: docs/service.md.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import json
import math
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from kdvfs.policies.base import SearchSpace, Strategy, Task
from kdvfs.service.schema import TaskSpec
from kdvfs.service.store import Database, Observation

#: Most measurements a task is told before the strategy stops asking (StepTuner's own cap); count.
MAX_PER_TASK = 20
#: Longest a model goes without reading the observations other processes stored; s.
CATCH_UP_S = 1.0
#: Longest a pooled rank's tell waits for the figure another rank's tell of the same decision
#: is storing; past it, the tell is stored itself (a second copy, never a lost figure); s.
POOLED_WAIT_S = 5.0
#: The module of policies/ that holds each strategy (policies/registry.py's names), imported
#: only when a model uses it: the registry imports BoTorch and torch, seconds of a service's start.
STRATEGY_MODULES = {
    "sweep": "sweep",
    "random": "random_search",
    "egreedy": "egreedy",
    "ucb": "bandits",
    "thompson": "bandits",
    "botorch": "botorch_bo",
    "crosskernel": "crosskernel",
}


def make_strategy(name: str, space: SearchSpace, *, seed: int, **opts) -> Strategy:
    """policies.registry.make_strategy, importing only the strategy's own module."""
    module = importlib.import_module(f"kdvfs.policies.{STRATEGY_MODULES[name]}")
    cls = next(c for c in vars(module).values() if isinstance(c, type) and getattr(c, "name", None) == name)
    return cls(space, seed, **opts)


def model_key(fleet: str, spec: dict) -> str:
    """32 hex digits of SHA-256 over the fleet and what makes jobs share a model."""
    parts = [fleet, spec["gpu_name"], spec["grid"], spec["workload_signature"], spec["strategy"]]
    parts.append(sorted(spec.get("policy_options", {}).items()))
    text = json.dumps(parts, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass
class Pending:
    """A decision given to a job's ranks: its config and the ranks that told it so far."""

    config: int | None
    number: int = 0  # the model's count of decisions given, when this one was made
    told: set[int] = field(default_factory=set)


@dataclass
class PooledFigure:
    """The figure data-parallel ranks that pooled their readings tell alike for one decision:
    the tell that holds it (the first to come), and whether it is stored and told."""

    tell_id: str
    config: int
    applied: bool = False


class FleetModel:
    """One strategy fed by every session of the model.

    Args:
        key: the model key.
        spec: gpu_name, grid ([[core_mhz, mem_mhz], ...]), workload_signature, strategy,
            policy_options.
        db: where its observations are.
    """

    def __init__(self, key: str, spec: dict, db: Database) -> None:
        self.key = key
        self.db = db
        self.grid = [tuple(p) for p in spec["grid"]]
        space = SearchSpace(np.array(self.grid, dtype=float))
        seed = int(key[:8], 16)
        self.policy: Strategy = make_strategy(
            spec["strategy"], space, seed=seed, max_per_task=MAX_PER_TASK, **spec.get("policy_options", {})
        )
        self.lock = threading.Lock()
        self.last_id = 0
        self.references: dict[str, tuple[float, float]] = {}
        self.pending: dict[tuple[str, str], Pending] = {}
        self.decisions = 0  # decisions given so far (Pending.number)
        self.given: dict[tuple[str, str, int], int] = {}  # (session, task, rank) -> its decision's number
        self.pooled: dict[tuple[str, str, int], PooledFigure] = {}  # (session, task, decision number)
        self.observations: dict[str, int] = {}  # per task key
        self.applied: set[tuple[str, str]] = set()  # (session id, tell id) told to the strategy
        self._caught_up_s = -math.inf  # when catch_up last read the database, monotonic s

    def reference(self, task: TaskSpec) -> tuple[float, float]:
        ref = self.references.get(task.key)
        if ref is None:
            ref = self.db.task_reference(self.key, task.key, task.ref_time_s, task.ref_energy_j)
            self.references[task.key] = ref
        return ref

    def _task(self, task: TaskSpec) -> Task:
        ref_t, ref_e = self.reference(task)
        return Task(task.key, ref_t, ref_e, task.budget)

    def catch_up(self) -> None:
        """Tell the strategy every stored observation it has not been told: those stored before
        this process (all of them, the first time) and those of other processes on the same
        database (read at most every CATCH_UP_S: this process's own tells are told at once).
        Call under the lock."""
        now_s = time.monotonic()
        if now_s - self._caught_up_s < CATCH_UP_S:
            return
        self._caught_up_s = now_s
        for obs_id, tell, obs in self.db.observations(self.key, self.last_id):
            self.last_id = obs_id
            self._apply(tell, obs)

    def _apply(self, tell: tuple[str, str], obs: Observation) -> None:
        """Tell the strategy once per (session id, tell id), whoever comes first: the tell
        itself or a catch-up that read it from the database."""
        if tell in self.applied:
            return
        ref_t, ref_e = self.references.get(obs.task_key) or self._stored_reference(obs.task_key)
        task = Task(obs.task_key, ref_t, ref_e, 0.0)
        if 0 <= obs.config < len(self.grid):
            self.policy.tell(task, obs.config, obs.time_ratio * ref_t, obs.energy_ratio * ref_e)
        self.observations[obs.task_key] = self.observations.get(obs.task_key, 0) + 1
        self.applied.add(tell)

    def _stored_reference(self, task_key: str) -> tuple[float, float]:
        ref = self.db.task_reference(self.key, task_key, 1.0, 1.0)  # stored with its first tell
        self.references[task_key] = ref
        return ref

    def ask(self, session_id: str, rank: int, task: TaskSpec) -> tuple[int | None, bool]:
        """The rank's next config for the task, and whether another rank had it already."""
        with self.lock:
            pending = self.pending.get((session_id, task.key))
            if pending is not None and rank not in pending.told:
                self.given[(session_id, task.key, rank)] = pending.number
                return pending.config, True
            self.reference(task)
            self.catch_up()
            config = self.policy.ask(self._task(task))
            self.decisions += 1
            self.pending[(session_id, task.key)] = Pending(config, self.decisions)
            self.given[(session_id, task.key, rank)] = self.decisions
            # a late rank tells at most the decision before: older pooled figures are done
            for key in [
                k for k in self.pooled if k[:2] == (session_id, task.key) and k[2] < self.decisions - 1
            ]:
                del self.pooled[key]
            return config, False

    def shared_decision(self, session_id: str, rank: int, task_key: str) -> int | bool | None:
        """The decision another rank of the job already has for the task (False: none yet);
        no database access, so a coroutine may call it."""
        with self.lock:
            pending = self.pending.get((session_id, task_key))
            if pending is None or rank in pending.told:
                return False
            self.given[(session_id, task_key, rank)] = pending.number
            return pending.config

    async def tell_async(
        self,
        session_id: str,
        tell_id: str,
        rank: int,
        ranks: int,
        task: TaskSpec,
        config: int,
        time_s: float,
        energy_j: float,
        pooled: bool = False,
    ) -> tuple[bool, int]:
        """Store the measurement (on disk before this returns: the commit is awaited) and tell
        the strategy; a pooled rank's copy of a figure another rank of the session stored only
        completes the decision."""
        if task.key not in self.references:
            await asyncio.to_thread(self.reference, task)
        obs = self._observation(task, config, time_s, energy_j)
        deadline_s = time.monotonic() + POOLED_WAIT_S
        while (
            pooled
            and (state := self._pooled_state(session_id, tell_id, rank, task.key, config, deadline_s))
            != "store"
        ):
            if state == "copy":
                return self._told(session_id, tell_id, rank, ranks, task, config, obs, False)
            await asyncio.sleep(0.005)
        try:
            stored = await self.db.tell_async(self.key, session_id, tell_id, rank, obs)
        except Exception:
            self._release_pooled(session_id, tell_id, rank, task.key)
            raise
        return self._told(session_id, tell_id, rank, ranks, task, config, obs, stored)

    def _pooled_state(
        self, session_id: str, tell_id: str, rank: int, task_key: str, config: int, deadline_s: float
    ) -> str:
        """What a pooled tell does: "store" (the first of its decision, whose figure it now
        holds; or of no decision known, as after a restart; or the wait ran out), "copy"
        (another rank's tell of the same figure is stored and told to the strategy: this one
        only completes the decision), "wait" (that tell is being stored: a rank that asks
        before it is told must not get a decision made without it)."""
        with self.lock:
            number = self.given.get((session_id, task_key, rank))
            if number is None:
                return "store"
            figure = self.pooled.setdefault((session_id, task_key, number), PooledFigure(tell_id, config))
            if figure.tell_id == tell_id or figure.config != config or time.monotonic() > deadline_s:
                return "store"
            return "copy" if figure.applied else "wait"

    def _release_pooled(self, session_id: str, tell_id: str, rank: int, task_key: str) -> None:
        """A pooled tell that failed to store no longer holds its decision's figure."""
        with self.lock:
            key = (session_id, task_key, self.given.get((session_id, task_key, rank), -1))
            if key in self.pooled and self.pooled[key].tell_id == tell_id:
                del self.pooled[key]

    @staticmethod
    def _observation(task: TaskSpec, config: int, time_s: float, energy_j: float) -> Observation:
        return Observation(task.key, config, time_s / task.ref_time_s, energy_j / task.ref_energy_j)

    def _told(
        self,
        session_id: str,
        tell_id: str,
        rank: int,
        ranks: int,
        task: TaskSpec,
        config: int,
        obs: Observation,
        stored: bool,
    ) -> tuple[bool, int]:
        """A committed tell: told to the strategy; the rank's share of the pending decision."""
        with self.lock:
            if stored:
                self._apply((session_id, tell_id), obs)
            figure = self.pooled.get((session_id, task.key, self.given.get((session_id, task.key, rank), -1)))
            if figure is not None and figure.tell_id == tell_id:
                figure.applied = True  # stored now, or before (a retry)
            pending = self.pending.get((session_id, task.key))
            if pending is not None and pending.config == config:
                pending.told.add(rank)
                if len(pending.told) >= ranks:
                    del self.pending[(session_id, task.key)]
            return stored, self.observations.get(task.key, 0)

    def best(self, task: TaskSpec) -> int | None:
        with self.lock:
            self.reference(task)
            self.catch_up()
            return self.policy.best(self._task(task))

    def held(self) -> int:
        """Observations the model holds."""
        with self.lock:
            self.catch_up()
            return sum(self.observations.values())


class ModelBank:
    """The fleet models of this process, each built on first use.

    Args:
        db: the service's database.
    """

    def __init__(self, db: Database) -> None:
        self.db = db
        self._models: dict[str, FleetModel] = {}
        self._lock = threading.Lock()

    def known(self, key: str) -> FleetModel | None:
        """The model if this process built it already."""
        return self._models.get(key)

    def get(self, key: str, spec: dict) -> FleetModel:
        with self._lock:
            model = self._models.get(key)
            if model is None:
                model = self._models[key] = FleetModel(key, spec, self.db)
            return model
