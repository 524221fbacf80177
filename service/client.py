"""The tuner's side of the service: a job asks and tells through it, and never waits on it.

- `ServiceClient`: JSON over HTTP with a short timeout, a retry with a short backoff, then a
  circuit: after a failed call the service is not tried again for a back-off that doubles
  (FIRST_DOWN_S .. MAX_DOWN_S), so a dead or hung service costs a job at most one timeout per
  back-off. A 429 whose Retry-After fits in the call's own timeout (a pooled rank's long calls)
  is waited out and tried again instead. `ServiceDown` (unreachable, 5xx, 429) and
  `ServiceRefused` (4xx: the request is wrong, or the token) are its two errors.
- `ServiceStrategy`: a policies.base.Strategy for a TuningRun (strategy=...): asks the fleet's model in
  the service; when the service is down (or refuses), the job's own local strategy answers, fed
  with every tell of the job. Tells wait in an outbox (with their ids, so a retried tell counts
  once) and reach the service when it answers again: the job reports later.
- `service_strategy`: builds one for a job (its session request and its local strategy).
- `fetch_plan`, `store_plan`: the fleet's plan store (None when the service does not answer:
  the local PlanStore is the fallback; a served plan that does not fit is refused).
- `ServiceRankPool`: runtime/ranks.py's RankPool through the service: each step's report of
  this data-parallel rank posted to the job's session, every rank's back (PoolLost when the
  service does not answer: the rank tunes alone from then on).
- `ServicePlanStore`: the two as a plan store for run.choose_prior and `kdvfs tune
  --service` (the service first, a local PlanStore behind it); `read_token`: a token file; `check_service_url`: a --service URL.

Design: docs/service.md.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from kdvfs.policies.base import SearchSpace, Strategy, Task
from kdvfs.runtime.steps import StepReport
from kdvfs.runtime.types import ClockGrid, ClockPair, Workload
from kdvfs.service.schema import (
    MAX_POOLED_READINGS,
    AskReply,
    BestReply,
    PoolReply,
    RankStep,
    SessionReply,
    SessionRequest,
    TaskSpec,
    TellReply,
)
from kdvfs.tuner.plan import Plan

#: How long one call may take before the service counts as down; s.
TIMEOUT_S = 1.0
#: Attempts of one call before it fails (the first included); attempts.
ATTEMPTS = 2
#: Wait before the second attempt (doubling for any further one); s.
RETRY_BACKOFF_S = 0.02
#: First back-off after a failed call, during which the service is not tried; s.
FIRST_DOWN_S = 1.0
#: Longest one ask or best of a pooled rank may take, and each tell it sends first: pooled
#: ranks must run the same decision, so each waits this long for the service's (the others get
#: it as the shared one) before it answers from its local strategy, which may differ from
#: theirs, and leaves the pool; s.
POOLED_ASK_TIMEOUT_S = 10.0
#: Longest one pooled step report may take: the service holds it until every rank's is in (its
#: `kdvfs serve --pool-wait-s`, 0.5 s by default), so it needs longer than a plain call; s.
POOL_CALL_TIMEOUT_S = 10.0
#: Longest back-off; s.
MAX_DOWN_S = 60.0
#: Most tells kept in the outbox while the service is down (the oldest dropped beyond); tells.
MAX_OUTBOX = 100_000

_log = logging.getLogger("kdvfs.service.client")


class ServiceDown(Exception):
    """The service did not answer (unreachable, timed out, 5xx, 429), or is in its back-off."""


class ServiceRefused(Exception):
    """The service answered that the request is wrong (4xx): retrying will not help."""


class ServiceClient:
    """Calls to one service, with retries, a back-off circuit and a bearer token.

    Args:
        url: the service's base URL, e.g. http://127.0.0.1:8470.
        token: the job's bearer token (None: a service without tokens).
        timeout_s: the longest one attempt may take, s.
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self, url: str, token: str | None = None, *, timeout_s: float = TIMEOUT_S, clock=time.monotonic
    ) -> None:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)
        self._clock = clock
        self._down_until_s = -1.0
        self._down_s = FIRST_DOWN_S
        self.failures = 0

    @property
    def up(self) -> bool:
        """Not in a back-off (the next call will be tried)."""
        return self._clock() >= self._down_until_s

    def call(
        self, method: str, path: str, body: dict | None = None, *, timeout_s: float | None = None
    ) -> dict:
        """One call's JSON reply; ServiceDown or ServiceRefused. timeout_s: this call's longest
        attempt, and the longest it waits out a 429's Retry-After (None: the client's timeout,
        and a 429 is a failed attempt), s."""
        if not self.up:
            raise ServiceDown("in back-off")
        wait_s = RETRY_BACKOFF_S
        problem = ""
        # a 429's Retry-After is waited out while the call's own timeout has room for it: ranks
        # that share one caller's rate (one host, no token) slow down instead of leaving a pool
        deadline_s = time.monotonic() + timeout_s if timeout_s is not None else -math.inf
        attempt = 0
        while attempt < ATTEMPTS:
            if attempt:
                time.sleep(wait_s)
                wait_s *= 2
            attempt += 1
            try:
                reply = self._http.request(
                    method,
                    path,
                    json=body,
                    timeout=httpx.USE_CLIENT_DEFAULT if timeout_s is None else timeout_s,
                )
            except httpx.HTTPError as exc:
                problem = f"{type(exc).__name__}: {exc}"
                continue
            if reply.status_code == 429 or reply.status_code >= 500:
                problem = f"HTTP {reply.status_code}: {_detail(reply)}"
                after_s = _retry_after_s(reply) if reply.status_code == 429 else None
                if after_s is not None and time.monotonic() + after_s < deadline_s:
                    time.sleep(after_s)
                    attempt -= 1  # a rate limit waited out is not a failed attempt
                continue
            if reply.status_code >= 400:
                raise ServiceRefused(f"HTTP {reply.status_code}: {_detail(reply)}")
            self._down_s = FIRST_DOWN_S
            return reply.json()
        self.failures += 1
        self._down_until_s = self._clock() + self._down_s
        self._down_s = min(2 * self._down_s, MAX_DOWN_S)
        raise ServiceDown(problem)

    def close(self) -> None:
        self._http.close()


def _retry_after_s(reply: httpx.Response) -> float | None:
    """A reply's Retry-After in seconds (None: absent, zero, an HTTP date, or not a number)."""
    try:
        after_s = float(reply.headers.get("retry-after", ""))
    except ValueError:
        return None
    return after_s if 0.0 < after_s < math.inf else None


def _detail(reply: httpx.Response) -> str:
    try:
        return str(reply.json().get("detail", ""))[:200]
    except (ValueError, AttributeError):
        return reply.text[:200]


@dataclass(frozen=True)
class _Tell:
    tell_id: str
    task: TaskSpec
    config: int
    time_s: float
    energy_j: float
    pooled: bool = False


class ServiceStrategy:
    """A Strategy whose strategy runs in the service, with the job's own strategy as fallback.

    Args:
        client: the service.
        session: what the job registers (its model: GPU, grid, workload, strategy).
        local: the job's own strategy over the same grid (told every measurement; answers
            whenever the service does not).
        rank: this process's rank in the job.
    """

    def __init__(
        self, client: ServiceClient, session: SessionRequest, local: Strategy, rank: int = 0
    ) -> None:
        self.client = client
        self.session = session
        self.local = local
        self.name = getattr(local, "name", "service")
        self.rank = rank
        self.session_id: str | None = None
        self.outbox: list[_Tell] = []
        self.answers = {"service": 0, "local": 0}
        self.told = 0  # measurements told (each to the local strategy and into the outbox)
        self.refused: str | None = None  # why the service refused this job; it is not asked again
        self.pooled = False  # the ranks pool their readings first: every rank tells one figure alike
        self.left_pool: str | None = None  # why this pooled rank answered alone (it pools no more)
        self._warned = False

    # --- Strategy ----------------------------------------------------------------------------------
    def ask(self, task: Task) -> int | None:
        timeout_s = POOLED_ASK_TIMEOUT_S if self.pooled else None
        try:
            self._flush(timeout_s)
            body = {"rank": self.rank, "task": _spec(task).model_dump()}
            reply = AskReply(**self._call("ask", body, timeout_s))
        except (ServiceDown, ServiceRefused) as exc:
            return self._local("ask", exc, task)
        self.answers["service"] += 1
        return reply.config

    def tell(self, task: Task, config: int, time_s: float, energy_j: float) -> None:
        self.local.tell(task, config, time_s, energy_j)
        self.told += 1
        self.outbox.append(
            _Tell(uuid.uuid4().hex, _spec(task), int(config), float(time_s), float(energy_j), self.pooled)
        )
        del self.outbox[:-MAX_OUTBOX]
        try:
            self._flush()
        except (ServiceDown, ServiceRefused) as exc:
            self._note(exc)

    def best(self, task: Task) -> int | None:
        timeout_s = POOLED_ASK_TIMEOUT_S if self.pooled else None
        try:
            self._flush(timeout_s)
            reply = BestReply(**self._call("best", {"task": _spec(task).model_dump()}, timeout_s))
        except (ServiceDown, ServiceRefused) as exc:
            return self._local("best", exc, task)
        self.answers["service"] += 1
        return reply.config

    # --- the session ------------------------------------------------------------------------------
    def end(self) -> None:
        """Deliver what waits and end the session (best effort: never raises)."""
        try:
            self._flush()
            if self.session_id is not None:
                self.client.call("POST", f"/v1/sessions/{self.session_id}/end")
        except (ServiceDown, ServiceRefused) as exc:
            self._note(exc)

    def _open(self) -> str:
        if self.refused is not None:
            raise ServiceRefused(self.refused)
        if self.session_id is None:
            try:
                reply = SessionReply(
                    **self.client.call("POST", "/v1/sessions", self.session.model_dump(mode="json"))
                )
            except ServiceRefused as exc:
                self.refused = str(exc)
                raise
            self.session_id = reply.session_id
        return self.session_id

    def _call(self, op: str, body: dict, timeout_s: float | None = None) -> dict:
        return self.client.call("POST", f"/v1/sessions/{self._open()}/{op}", body, timeout_s=timeout_s)

    def _flush(self, timeout_s: float | None = None) -> None:
        """Send the outbox in order; a tell the service already has (a retry) counts once.
        timeout_s: each tell's longest call, s (None: the client's)."""
        while self.outbox:
            t = self.outbox[0]
            body = {
                "tell_id": t.tell_id,
                "rank": self.rank,
                "task": t.task.model_dump(),
                "config": t.config,
                "time_s": t.time_s,
                "energy_j": t.energy_j,
                "pooled": t.pooled,
            }
            try:
                TellReply(**self._call("tell", body, timeout_s))
            except ServiceRefused as exc:
                if self.refused is None and "session" not in str(exc):
                    self.outbox.pop(0)  # this tell is refused (invalid): drop it, keep the rest
                    self._note(exc)
                    continue
                raise
            self.outbox.pop(0)

    def _local(self, op: str, exc: Exception, task: Task) -> int | None:
        self._note(exc)
        if self.pooled:  # the other ranks may run the service's answer: pool no readings with them
            self.pooled = False
            self.left_pool = f"its {op} was answered locally ({exc})"
        self.answers["local"] += 1
        return self.local.ask(task) if op == "ask" else self.local.best(task)

    def _note(self, exc: Exception) -> None:
        if not self._warned:
            _log.warning("tuning service %s: %s; tuning locally until it answers", self.client.url, exc)
            self._warned = True


def _spec(task: Task) -> TaskSpec:
    return TaskSpec(
        key=task.key, ref_time_s=task.ref_time_s, ref_energy_j=task.ref_energy_j, budget=task.budget
    )


def service_strategy(
    client: ServiceClient,
    *,
    job: str,
    gpu_name: str,
    pairs: Sequence[ClockPair],
    workload: Workload,
    budget: float,
    strategy: str | None = None,
    seed: int = 0,
    ranks: int = 1,
    rank: int = 0,
    parallel: str = "data",
) -> ServiceStrategy:
    """A ServiceStrategy for a StepTuner of this job, its local strategy made as StepTuner makes its own."""
    from kdvfs.policies.registry import make_strategy, takes_option
    from kdvfs.tuner.step_tuner import DEFAULT_STRATEGY, MAX_TRIALS_PER_GROUP, STRATEGY_TOL

    strategy = strategy or DEFAULT_STRATEGY
    space = SearchSpace(np.array([[p.core_mhz, p.mem_mhz] for p in pairs], dtype=float))
    tol = {"tol": STRATEGY_TOL} if takes_option(strategy, "tol") else {}
    local = make_strategy(strategy, space, seed=seed, max_per_task=MAX_TRIALS_PER_GROUP, **tol)
    session = SessionRequest(
        job=job,
        gpu_name=gpu_name,
        grid=[(p.core_mhz, p.mem_mhz) for p in pairs],
        workload_name=workload.name,
        workload_signature=workload.signature,
        budget=budget,
        ranks=ranks,
        parallel=parallel,
        strategy=strategy,
        policy_options=tol,
    )
    return ServiceStrategy(client, session, local, rank)


# --- plans ---------------------------------------------------------------------------------------
def fetch_plan(client: ServiceClient, gpu_name: str, grid: ClockGrid, signature: str) -> Plan | None:
    """The fleet's newest plan for this GPU, grid and workload; None when it has none or the
    service does not answer (the caller's local PlanStore is the fallback). A served plan that
    does not fit is a KdvfsError, as a plan file's would be."""
    from kdvfs.service.schema import plan_key
    from kdvfs.tuner.plan import check_compatible, plan_from_dict

    key = plan_key(gpu_name, grid, signature)
    try:
        reply = client.call("GET", f"/v1/plans/{key}")
    except (ServiceDown, ServiceRefused):
        return None
    plan = plan_from_dict(reply["plan"], f"{client.url} plan {key} v{reply['version']}")
    check_compatible(plan, gpu_name, grid, signature)
    return plan


def store_plan(client: ServiceClient, plan: Plan, expected_version: int | None = None) -> int | None:
    """Put the plan as its key's next version; the version, or None when the service does not
    take it (down, refused, or a newer version than expected_version exists)."""
    from kdvfs.service.schema import plan_key

    body: dict = {"plan": plan.to_dict()}
    if expected_version is not None:
        body["expected_version"] = expected_version
    try:
        reply = client.call(
            "PUT", f"/v1/plans/{plan_key(plan.gpu_name, plan.grid, plan.workload_signature)}", body
        )
    except (ServiceDown, ServiceRefused) as exc:
        _log.warning("tuning service %s did not store the plan: %s", client.url, exc)
        return None
    return int(reply["version"])


class ServicePlanStore:
    """The fleet's plans through the service, with a local PlanStore behind it: what
    run.choose_prior and `kdvfs tune` ask of a plan store (get, newest_for_other_gpu, put).

    Args:
        client: the service.
        local: a local PlanStore, asked when the service has no plan or does not answer, and
            given every plan put (None: none).
    """

    def __init__(self, client: ServiceClient, local=None) -> None:
        self.client = client
        self.local = local
        self.fetched_version: int | None = None  # the served plan's version (None: none served)

    def get(self, gpu_name: str, grid: ClockGrid, signature: str) -> Plan | None:
        plan = fetch_plan(self.client, gpu_name, grid, signature)
        if plan is not None:
            return plan
        return None if self.local is None else self.local.get(gpu_name, grid, signature)

    def newest_for_other_gpu(self, gpu_name: str, signature: str) -> Plan | None:
        """Another GPU's plan for the workload: the local store's (the service serves by key only)."""
        return None if self.local is None else self.local.newest_for_other_gpu(gpu_name, signature)

    def put(self, plan: Plan) -> str:
        """Where the plan went: the service's next version of its key, and the local store."""
        where = []
        version = store_plan(self.client, plan)
        if version is not None:
            where.append(f"{self.client.url} version {version}")
        if self.local is not None:
            where.append(str(self.local.put(plan)))
        return ", ".join(where) or "nowhere (the service did not take it and there is no local store)"


def check_service_url(url: str) -> None:
    """A service URL: http:// or https://, a host, a valid port; else a one-line KdvfsError."""
    from kdvfs.runtime.types import KdvfsError

    try:
        parsed = httpx.URL(url)
        parsed.port  # noqa: B018 (parses the port)
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        raise KdvfsError(f"--service {url!r}: not a valid URL ({exc})") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise KdvfsError(f"--service {url!r}: not an http:// or https:// URL with a host")


def read_token(path: str | Path) -> str:
    """The token in a token file: the first word of its first line that is not blank or a
    comment (a line of the service's own token file, TOKEN FLEET JOB, reads as its token)."""
    from kdvfs.runtime.types import KdvfsError

    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise KdvfsError(f"token file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise KdvfsError(f"token file {path}: not a text file (not UTF-8)") from None
    for line in lines:
        words = line.split("#", 1)[0].split()
        if words:
            if not all(33 <= ord(c) < 127 for c in words[0]):
                raise KdvfsError(f"token file {path}: the token has characters other than printable ASCII")
            return words[0]
    raise KdvfsError(f"token file {path}: no token in it")


class ServiceRankPool:
    """The job's data-parallel ranks' step reports through the service (a RankPool): one
    call a step; the ranks share a session (the same job name in service_strategy). A rank whose
    ask or best the service did not answer in time decided alone: its next gather raises
    PoolLost (so no rank pools readings of a schedule the others may not run), and the
    others', missing its report, time out and raise it too.

    Args:
        policy: this rank's ServiceStrategy (its session, rank and ranks).
    """

    def __init__(self, policy: ServiceStrategy) -> None:
        self.policy = policy
        self.ranks = policy.session.ranks
        policy.pooled = True  # the ranks' tells now carry one pooled figure: the service stores it once

    def gather(self, report: StepReport) -> list[StepReport]:
        from kdvfs.runtime.ranks import PoolLost

        if self.policy.left_pool is not None:  # the others' gathers then time out: each goes on alone
            raise PoolLost(f"tuning service {self.policy.client.url}: {self.policy.left_pool}")
        body = {"rank": self.policy.rank, "report": _rank_step(report)}
        try:
            reply = PoolReply(**self.policy._call("pool", body, POOL_CALL_TIMEOUT_S))
        except (ServiceDown, ServiceRefused) as exc:
            self.policy.pooled = False  # the rank tunes alone from here: its figures are its own
            raise PoolLost(f"tuning service {self.policy.client.url}: {exc}") from None
        if reply.status != "complete":
            self.policy.pooled = False
            raise PoolLost(
                f"tuning service {self.policy.client.url}: ranks {reply.missing} did not report step {report.step}"
            )
        return [_step_report(r) for r in reply.reports]


def _rank_step(report: StepReport) -> dict:
    def finite(x: float) -> float | None:
        return float(x) if math.isfinite(x) else None

    return {
        "step": report.step,
        "end_s": report.end_s,
        "step_time_s": report.step_time_s,
        "group_times_s": list(report.group_times_s),
        # the latest readings: a window takes a step's last alone, and a long step (a
        # checkpoint) holds more updates than the service takes
        "counter_readings": [list(r) for r in report.counter_readings[-MAX_POOLED_READINGS:]],
        "temperature_c": finite(report.temperature_c),
        "throttle_reasons": sorted(report.throttle_reasons),
        "power_limit_w": finite(report.power_limit_w),
    }


def _step_report(r: RankStep) -> StepReport:
    return StepReport(
        step=r.step,
        end_s=r.end_s,
        step_time_s=r.step_time_s,
        group_times_s=tuple(r.group_times_s),
        counter_readings=tuple(tuple(c) for c in r.counter_readings),
        temperature_c=math.nan if r.temperature_c is None else r.temperature_c,
        throttle_reasons=frozenset(r.throttle_reasons),
        power_limit_w=math.nan if r.power_limit_w is None else r.power_limit_w,
    )
