"""The service's wire format: pydantic models of every request and reply, with their limits.

Shared by the server (service/app.py validates every body against these) and the
client (service/client.py builds them). Every field is bounded and unknown fields are
refused, so what reaches the database and the strategies is always well formed.

Parts: the limits, the session models, ask / tell / best, the plan store (and `plan_key`,
the key of a plan: the plan store's file name without .json), health.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_NAME_CHARS = 200  # longest GPU, workload, job or task name, characters
MAX_KEY_CHARS = 120  # longest task key or plan key, characters
MAX_GRID_PAIRS = 4096  # most clock pairs a session's grid may list
MAX_RANKS = 4096  # most ranks a session may declare (the pool gathers their reports in memory)
MAX_RANK = MAX_RANKS - 1  # highest rank index
MAX_BUDGET = 1.0  # largest slowdown budget a session may name, a fraction
MAX_TASK_BUDGET = 1e4  # largest budget of one task (a short group may take a step's whole slack), a fraction
MAX_PLAN_CHARS = 2_000_000  # longest plan document, characters of its JSON
MAX_POOLED_GROUPS = 4096  # most group times in one pooled step report
MAX_POOLED_READINGS = 64  # most energy-counter readings in one pooled step report
MAX_STEP = 2**62  # highest step index a pooled report may carry
WITHOUT_OPTIONS = ("sweep", "random")  # strategies that take neither tol nor margin
ID_PATTERN = r"^[0-9a-f]{32}$"  # a session id or tell id: 32 hex digits
NAME_PATTERN = r"^[\w .:@/+=()-]{1,200}$"  # names: letters, digits, spaces and . : @ / + = ( ) - _

# What a measurement can physically be. The fleet's models pool every job's observations, so a
# figure no GPU can produce (a buggy or hostile job's) is refused (422) before it is stored.
MAX_CORE_MHZ = 5_000  # highest SM clock a grid may name, MHz (GPUs top out near 3,000)
MAX_MEM_MHZ = 30_000  # highest memory clock a grid may name, MHz (NVML's GDDR7 figure is ~14,000)
MIN_TIME_S = 1e-7  # shortest time a step, group or launch may take, s (a kernel launch is ~2e-6)
MAX_TIME_S = 86_400.0  # longest time a step, group or launch may take, s (one day)
MIN_POWER_W = 0.1  # lowest mean power of a measurement (energy / time), W (an idle card: ~10 W)
MAX_POWER_W = 10_000.0  # highest mean power of a measurement, W (the largest card: ~1,200 W)
MAX_ENERGY_J = MAX_POWER_W * MAX_TIME_S  # largest energy of one measurement, J
MAX_COUNTER_J = 1e13  # largest energy-counter reading, J (10 kW for 30 years)
MAX_HOST_S = 1e10  # largest host-clock reading (end_s, a counter reading's time), s (epoch: ~1.8e9)
MIN_TEMPERATURE_C = -60.0  # coldest card temperature a report may carry, C
MAX_TEMPERATURE_C = 150.0  # hottest, C (cards shut down near 100)
GROUP_SLACK = 1e-3  # a group may take at most its step's time times (1 + GROUP_SLACK) + MIN_TIME_S

Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS, pattern=NAME_PATTERN)]
TaskKey = Annotated[str, Field(min_length=1, max_length=MAX_KEY_CHARS, pattern=NAME_PATTERN)]
Hex32 = Annotated[str, Field(pattern=ID_PATTERN)]
# integers are JSON integers: 1427.0 ranks or a config of 2.0 is refused (strict)
CoreMhz = Annotated[int, Field(strict=True, ge=1, le=MAX_CORE_MHZ)]
MemMhz = Annotated[int, Field(strict=True, ge=1, le=MAX_MEM_MHZ)]
Rank = Annotated[int, Field(strict=True, ge=0, le=MAX_RANK)]
TimeS = Annotated[float, Field(ge=MIN_TIME_S, le=MAX_TIME_S, allow_inf_nan=False)]
GroupTimeS = Annotated[float, Field(ge=0.0, le=MAX_TIME_S, allow_inf_nan=False)]
EnergyJ = Annotated[float, Field(gt=0.0, le=MAX_ENERGY_J, allow_inf_nan=False)]
HostS = Annotated[float, Field(ge=0.0, le=MAX_HOST_S, allow_inf_nan=False)]
CounterJ = Annotated[float, Field(ge=0.0, le=MAX_COUNTER_J, allow_inf_nan=False)]
TemperatureC = Annotated[float, Field(ge=MIN_TEMPERATURE_C, le=MAX_TEMPERATURE_C, allow_inf_nan=False)]
PowerW = Annotated[float, Field(gt=0.0, le=MAX_POWER_W, allow_inf_nan=False)]
Budget = Annotated[float, Field(ge=0.0, le=MAX_BUDGET, allow_inf_nan=False)]
TaskBudget = Annotated[float, Field(ge=0.0, le=MAX_TASK_BUDGET, allow_inf_nan=False)]
Fraction = Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)]


def _check_power(time_s: float, energy_j: float, what: str) -> None:
    """A measurement's mean power must be one a GPU can draw (MIN_POWER_W to MAX_POWER_W)."""
    power_w = energy_j / time_s
    if not MIN_POWER_W <= power_w <= MAX_POWER_W:
        raise ValueError(
            f"{what}: mean power {power_w:.3g} W is outside {MIN_POWER_W:g} to {MAX_POWER_W:g} W"
        )


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SessionRequest(_Body):
    """A job registers: its GPU model and clock grid, workload, budget and ranks.

    Jobs of one fleet with the same GPU, grid, workload signature and strategy feed one model.
    `parallel`: "data" (every rank runs the same schedule; each rank's reading is a sample)
    or "tensor" (the ranks share each decision; each rank's reading is still told)."""

    job: Name
    gpu_name: Name
    grid: Annotated[
        list[tuple[CoreMhz, MemMhz]],
        Field(min_length=1, max_length=MAX_GRID_PAIRS, json_schema_extra={"uniqueItems": True}),
    ]
    workload_name: Name
    workload_signature: Name
    budget: Budget
    ranks: Annotated[int, Field(strict=True, ge=1, le=MAX_RANKS)] = 1
    parallel: Literal["data", "tensor"] = "data"
    strategy: Literal["sweep", "random", "egreedy", "ucb", "thompson", "botorch", "crosskernel"] = "botorch"
    policy_options: dict[Literal["tol", "margin"], Fraction] = {}

    @field_validator("grid")
    @classmethod
    def _distinct(cls, grid: list[tuple[int, int]]) -> list[tuple[int, int]]:
        if len(set(grid)) != len(grid):
            raise ValueError("clock pairs repeat")
        return grid

    @model_validator(mode="after")
    def _options_fit(self) -> SessionRequest:
        if self.policy_options and self.strategy in WITHOUT_OPTIONS:
            raise ValueError(f"strategy {self.strategy} takes no policy_options")
        return self


class SessionReply(_Body):
    session_id: str
    model_key: str
    observations: int  # what the fleet's model held when the session opened
    joined: bool  # an open session of this job existed: this rank joined it


class SessionInfo(_Body):
    session_id: str
    job: str
    model_key: str
    ranks: int
    parallel: str
    ended: bool
    observations: int  # told in this session


class TaskSpec(_Body):
    """A policies.base.Task: the group tuned, its reference time and energy, its budget."""

    key: TaskKey
    ref_time_s: TimeS
    ref_energy_j: EnergyJ
    budget: TaskBudget

    @model_validator(mode="after")
    def _physical(self) -> TaskSpec:
        _check_power(self.ref_time_s, self.ref_energy_j, "task reference")
        return self


class AskRequest(_Body):
    rank: Rank = 0
    task: TaskSpec


class AskReply(_Body):
    config: int | None  # index into the session's grid; None: converged
    shared: bool  # another rank of this job had already asked: the same decision


class TellRequest(_Body):
    """One measurement of a task at a config, per launch; tell_id makes a retried tell count once.
    `pooled`: the ranks pooled their readings before telling (StepTuner's pool), so every rank
    tells the same figure for the decision: the first is stored, the others only complete it."""

    tell_id: Hex32
    rank: Rank = 0
    task: TaskSpec
    config: Annotated[int, Field(strict=True, ge=0, lt=MAX_GRID_PAIRS)]
    time_s: TimeS
    energy_j: EnergyJ
    pooled: bool = False  # the figure is the rank's data-parallel pool's, told alike by every rank

    @model_validator(mode="after")
    def _physical(self) -> TellRequest:
        _check_power(self.time_s, self.energy_j, "measurement")
        return self


class TellReply(_Body):
    stored: bool  # False: this tell_id was stored before (a retry), or a pooled rank's copy
    observations: int  # the task's observations in the fleet's model


class BestRequest(_Body):
    task: TaskSpec


class BestReply(_Body):
    config: int | None


class PlanPut(_Body):
    """A plan document (tuner/plan.py's JSON) and, optionally, the version it replaces: a put
    whose expected_version is not the newest is refused (409)."""

    plan: Annotated[dict[str, Any], Field(max_length=32)]
    expected_version: Annotated[int, Field(strict=True, ge=0, le=2**31 - 1)] | None = None


class PlanReply(_Body):
    key: str
    version: int
    plan: dict[str, Any]


class PlanVersion(_Body):
    key: str
    version: int


class Health(_Body):
    status: Literal["ok", "degraded"]
    database: Literal["ok", "read-only", "unavailable"]
    version: str


class ErrorReply(_Body):
    detail: str


def plan_key(gpu_name: str, grid, signature: str) -> str:
    """The store key of a plan: the plan store's file name without .json (tuner/plan_store.py)."""
    from kdvfs.tuner.plan_store import plan_file_name

    return plan_file_name(gpu_name, grid, signature).removesuffix(".json")


class RankStep(_Body):
    """One data-parallel rank's report of one step (runtime/steps.py: StepReport), pooled
    through the service (POST /v1/sessions/{id}/pool). None: the card did not say (NaN).
    Refused (422) unless physically possible: no group longer than its step, counter
    readings in time order that never run backwards."""

    step: Annotated[int, Field(strict=True, ge=0, le=MAX_STEP)]
    end_s: HostS
    step_time_s: TimeS
    group_times_s: Annotated[list[GroupTimeS], Field(max_length=MAX_POOLED_GROUPS)]
    counter_readings: Annotated[list[tuple[HostS, CounterJ]], Field(max_length=MAX_POOLED_READINGS)]
    temperature_c: TemperatureC | None = None
    throttle_reasons: Annotated[list[Name], Field(max_length=64)] = []
    power_limit_w: PowerW | None = None

    @model_validator(mode="after")
    def _physical(self) -> RankStep:
        longest_s = self.step_time_s * (1.0 + GROUP_SLACK) + MIN_TIME_S
        for i, group_s in enumerate(self.group_times_s):
            if group_s > longest_s:
                raise ValueError(
                    f"group_times_s.{i}: {group_s:g} s is longer than the step's {self.step_time_s:g} s"
                )
        for i in range(1, len(self.counter_readings)):
            (t0, e0), (t1, e1) = self.counter_readings[i - 1], self.counter_readings[i]
            if t1 < t0:
                raise ValueError(f"counter_readings.{i}: its time {t1:g} s is before the previous reading's")
            if e1 < e0:
                raise ValueError(
                    f"counter_readings.{i}: the energy counter ran backwards ({e0:g} -> {e1:g} J)"
                )
        return self


class PoolRequest(_Body):
    """This rank's report of a step; the reply waits (briefly) for every rank's."""

    rank: Rank = 0
    report: RankStep


class PoolReply(_Body):
    """complete: every rank's report of the step, in rank order. Not complete (a rank did
    not report within the pool's wait): status "incomplete", the ranks that did not report in
    `missing`, and no reports (the ranks then tune alone: runtime/ranks.py's PoolLost)."""

    status: Literal["complete", "incomplete"] = "complete"
    reports: list[RankStep]
    missing: list[int] = []
