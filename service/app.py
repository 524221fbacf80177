"""The FastAPI application of `kdvfs serve`: sessions, ask / tell / best, the plan store, health.

- `ServiceConfig`: database URL, tokens (None: open, loopback only), MLflow, limits.
- `load_tokens`: the token file: one `TOKEN FLEET JOB` per line (# comments); a token reads and
  writes only its fleet's sessions, models and plans.
- `create_app(config) -> FastAPI`: routes under /v1 (OpenAPI at /openapi.json, docs at /docs),
  /health; the auth and rate-limit dependency (`Scope`); `Gate`, ahead of every route: the
  token before any byte of the body is read (401), then the body-size limit (413, chunked too);
  error handlers that answer one line and never the internals (a database error is 503
  "storage unavailable", anything unexpected 500 "internal error", both logged here).
- `SessionLog`: one MLflow run per session, written by one background thread (a slow or
  absent store never delays a reply).

Routes: POST /v1/sessions; GET /v1/sessions/{id}; POST /v1/sessions/{id}/ask|tell|best|end;
POST /v1/sessions/{id}/pool (data-parallel ranks' step reports, gathered in memory: `StepPools`;
a pool that cannot complete answers 200 with status "incomplete"); every measurement that no
GPU can produce is refused 422 by schema.py before it reaches a model or the store;
GET /v1/plans/{key}[/versions/{v}]; PUT /v1/plans/{key}. Design: docs/service.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi import Path as PathParam
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from kdvfs import __version__
from kdvfs.runtime.types import KdvfsError
from kdvfs.service.models import ModelBank, model_key
from kdvfs.service.schema import (
    ID_PATTERN,
    MAX_KEY_CHARS,
    MAX_PLAN_CHARS,
    NAME_PATTERN,
    AskReply,
    AskRequest,
    BestReply,
    BestRequest,
    ErrorReply,
    Health,
    PlanPut,
    PlanReply,
    PlanVersion,
    PoolReply,
    PoolRequest,
    SessionInfo,
    SessionReply,
    SessionRequest,
    TellReply,
    TellRequest,
    plan_key,
)
from kdvfs.service.store import Database, StorageError, VersionConflict

#: Largest request body; bytes (a 905-kernel plan is ~100 kB).
MAX_BODY_BYTES = 1_048_576
#: Requests a token may make per second, sustained; requests/s.
RATE_PER_S = 200.0
#: Requests a token may make at once above the sustained rate; requests.
RATE_BURST = 400.0
#: The fleet every request belongs to when the service runs without tokens.
OPEN_FLEET = "local"
#: Longest error detail in a reply; characters.
MAX_DETAIL_CHARS = 300
#: Longest a rank's pooled step waits for the other ranks' (they run in lockstep); s.
POOL_WAIT_S = 0.5
#: Most steps being gathered at once, over all sessions (beyond: 429); steps.
MAX_OPEN_POOLS = 10_000

_log = logging.getLogger("kdvfs.service")


class StepPools:
    """Data-parallel ranks' step reports, gathered in memory per (session, step): each rank
    posts its report and waits (POOL_WAIT_S at most) until every rank's is in; a step is
    forgotten once every rank has it. A pool that cannot complete in time answers the ranks
    that did not report (`missing`), not an error: the ranks then tune alone. One event loop:
    no lock."""

    def __init__(self, wait_s: float = POOL_WAIT_S) -> None:
        self.wait_s = wait_s  # longest a rank's report waits for the others', s
        self.open: dict[tuple[str, int], tuple[dict[int, Any], set[int], asyncio.Event]] = {}
        self.counters: dict[tuple[str, int], float] = {}  # (session, rank) -> its last counter reading, J

    def check_counter(self, session_id: str, rank: int, report: Any) -> None:
        """422 when the rank's energy counter reads below what it read in an earlier report of
        the session: a counter never runs backwards."""
        if not report.counter_readings:
            return
        last_j = self.counters.get((session_id, rank))
        first_j = report.counter_readings[0][1]
        if last_j is not None and first_j < last_j:
            raise HTTPException(
                422,
                f"report.counter_readings: the energy counter ran backwards ({last_j:g} -> {first_j:g} J)",
            )
        if len(self.counters) >= MAX_OPEN_POOLS and (session_id, rank) not in self.counters:
            self.counters.pop(next(iter(self.counters)))
        self.counters[(session_id, rank)] = report.counter_readings[-1][1]

    async def gather(
        self, session_id: str, ranks: int, rank: int, report: Any
    ) -> tuple[list[Any], list[int]]:
        """Every rank's report of the step in rank order and no missing rank; or, when the
        others did not report within wait_s, no reports and the ranks missing."""
        self.check_counter(session_id, rank, report)
        key = (session_id, report.step)
        if key not in self.open and len(self.open) >= MAX_OPEN_POOLS:
            raise HTTPException(429, "pool: too many steps being gathered", {"Retry-After": "1"})
        reports, fetched, complete = self.open.setdefault(key, ({}, set(), asyncio.Event()))
        reports[rank] = report
        if len(reports) >= ranks:
            complete.set()
        try:
            await asyncio.wait_for(complete.wait(), self.wait_s)
        except TimeoutError:
            missing = [r for r in range(ranks) if r not in reports]
            reports.pop(rank, None)
            if not reports:
                self.open.pop(key, None)
            return [], missing
        fetched.add(rank)
        if len(fetched) >= ranks:
            self.open.pop(key, None)
        return [reports[r] for r in range(ranks)], []


@dataclass(frozen=True)
class TokenScope:
    fleet: str
    job: str


@dataclass
class ServiceConfig:
    """What a service runs with.

    Args:
        db_url: the SQLAlchemy URL of its database.
        tokens: SHA-256 hex of each token -> its scope; None: no tokens (every request is in
            the fleet OPEN_FLEET; only allowed on loopback, which `kdvfs serve` enforces).
        mlflow_uri: the MLflow tracking URI; None: MLflow's default store.
        tracking: whether sessions are logged to MLflow at all.
        spool_dir: where MLflow items wait when the store is down.
        rate_per_s, rate_burst: each token's rate limit, requests/s and requests.
        max_body_bytes: the largest request body, bytes.
        preload: import the BoTorch strategy in the background at start (else on first use).
        pool_wait_s: longest a rank's pooled step report waits for the other ranks', s (ranks
            run in lockstep; a host that falls further behind tunes alone from then on).
    """

    db_url: str
    tokens: dict[str, TokenScope] | None = None
    mlflow_uri: str | None = None
    tracking: bool = True
    spool_dir: Path = Path("kdvfs-spool")
    rate_per_s: float = RATE_PER_S
    rate_burst: float = RATE_BURST
    max_body_bytes: int = MAX_BODY_BYTES
    preload: bool = False
    pool_wait_s: float = POOL_WAIT_S


def load_tokens(path: Path) -> dict[str, TokenScope]:
    """The token file: `TOKEN FLEET JOB` per line, blank lines and # comments ignored; a
    token of fewer than 16 characters, a malformed line or a repeated token is a KdvfsError."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise KdvfsError(
            f"{path}: cannot read the token file: {getattr(exc, 'strerror', None) or exc}"
        ) from None
    tokens: dict[str, TokenScope] = {}
    for number, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) != 3:
            raise KdvfsError(f"{path}:{number}: expected `TOKEN FLEET JOB`, found {len(words)} words")
        token, fleet, job = words
        if len(token) < 16:
            raise KdvfsError(f"{path}:{number}: token shorter than 16 characters")
        digest = _digest(token)
        if digest in tokens:
            raise KdvfsError(f"{path}:{number}: token repeated")
        tokens[digest] = TokenScope(fleet, job)
    if not tokens:
        raise KdvfsError(f"{path}: no tokens")
    return tokens


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


# --- auth and rate limits --------------------------------------------------------------------
@dataclass
class _Bucket:
    tokens: float
    at_s: float


class RateLimiter:
    """A token bucket per caller."""

    def __init__(self, rate_per_s: float, burst: float) -> None:
        self.rate_per_s, self.burst = rate_per_s, burst
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    def allow(self, caller: str) -> bool:
        now = time.monotonic()
        with self._lock:
            b = self._buckets.setdefault(caller, _Bucket(self.burst, now))
            b.tokens = min(self.burst, b.tokens + (now - b.at_s) * self.rate_per_s)
            b.at_s = now
            if b.tokens < 1.0:
                return False
            b.tokens -= 1.0
            return True


@dataclass(frozen=True)
class Scope:
    """Who is asking: the fleet whose sessions, models and plans it may read and write."""

    fleet: str
    job: str


# --- the gate: token, then body size ------------------------------------------------------------
class Gate:
    """ASGI middleware ahead of every route: the bearer token is checked first (401 before any
    byte of the body is read), then the body is read whole up to `limit` bytes (413 past it,
    whether declared by Content-Length or streamed in chunks) and handed to the app.

    Args:
        app: the ASGI app behind it.
        limit: the largest body, bytes.
        tokens: the service's token digests (ServiceConfig.tokens); None: no tokens.
    """

    def __init__(self, app: Any, limit: int, tokens: dict[str, TokenScope] | None) -> None:
        self.app, self.limit, self.tokens = app, limit, tokens

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if self.tokens is not None and scope["path"].startswith("/v1/"):
            kind, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
            if kind.lower() != "bearer" or _digest(token.strip()) not in self.tokens:
                await _reply(
                    send, 401, "a valid bearer token is required", [(b"www-authenticate", b"Bearer")]
                )
                return
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await _reply(send, 413, f"request body over {self.limit} bytes")
            return
        chunks: list[bytes] = []
        seen, more = 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.limit:
                await _reply(send, 413, f"request body over {self.limit} bytes")
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body, replayed = b"".join(chunks), False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _reply(send: Any, status: int, detail: str, headers: list[tuple[bytes, bytes]] = ()) -> None:
    body = ErrorReply(detail=detail).model_dump_json().encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


# --- MLflow ----------------------------------------------------------------------------------
class SessionLog:
    """One MLflow run per session, logged by one background thread through tuner/tracking.py.

    Args:
        config: the service's configuration (mlflow_uri, tracking, spool_dir).
    """

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self._queue: queue.Queue = queue.Queue()
        self._runs: dict[str, Any] = {}
        self.run_ids: dict[str, str | None] = {}
        self._thread: threading.Thread | None = None
        if config.tracking:
            self._thread = threading.Thread(target=self._work, name="kdvfs-mlflow", daemon=True)
            self._thread.start()

    def start(self, session_id: str, params: dict[str, Any]) -> None:
        self._put(("start", session_id, params))

    def metrics(self, session_id: str, step: int, values: dict[str, float]) -> None:
        self._put(("metrics", session_id, (step, values)))

    def end(self, session_id: str) -> None:
        self._put(("end", session_id, None))

    def close(self, timeout_s: float = 10.0) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout_s)

    def _put(self, item: tuple) -> None:
        if self._thread is not None:
            self._queue.put(item)

    def _work(self) -> None:
        from kdvfs.tuner.tracking import Tracker

        tracker = Tracker(self.config.mlflow_uri, experiment="kdvfs-service", spool_dir=self.config.spool_dir)
        while (item := self._queue.get()) is not None:
            kind, session_id, data = item
            try:
                if kind == "start":
                    run = tracker.start_run(
                        f"session-{session_id[:8]}", data, tags={"kdvfs.session": session_id}
                    )
                    self._runs[session_id] = run
                    self.run_ids[session_id] = run.run_id
                elif session_id in self._runs and kind == "metrics":
                    self._runs[session_id].log_metrics(*data)
                elif session_id in self._runs and kind == "end":
                    self._runs.pop(session_id).end()
            except Exception:  # tracking never stops the service
                _log.exception("MLflow logging failed")
        for run in self._runs.values():
            run.end("KILLED")


# --- the app -----------------------------------------------------------------------------------
async def scope(request: Request) -> Scope:
    """The caller's fleet from its bearer token (401 without a valid one), rate-limited (429)."""
    config: ServiceConfig = request.app.state.config
    if config.tokens is None:
        caller, found = f"open:{request.client.host if request.client else '-'}", TokenScope(OPEN_FLEET, "-")
    else:
        header = request.headers.get("authorization", "")
        kind, _, token = header.partition(" ")
        found = config.tokens.get(_digest(token.strip())) if kind.lower() == "bearer" else None
        if found is None:
            raise HTTPException(401, "a valid bearer token is required", {"WWW-Authenticate": "Bearer"})
        caller = f"{found.fleet}/{found.job}"
    if not request.app.state.limiter.allow(caller):
        raise HTTPException(429, "rate limit exceeded", {"Retry-After": "1"})
    return Scope(found.fleet, found.job)


Caller = Annotated[Scope, Depends(scope)]
SessionId = Annotated[str, PathParam(pattern=ID_PATTERN)]
PlanKey = Annotated[str, PathParam(min_length=1, max_length=MAX_KEY_CHARS, pattern=NAME_PATTERN)]
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorReply} for code in (400, 401, 404, 409, 413, 422, 429, 503)
}


def create_app(config: ServiceConfig) -> FastAPI:
    """The service on config's database (opened now: StorageError when it cannot be)."""
    db = Database(config.db_url)
    bank = ModelBank(db)
    limiter = RateLimiter(config.rate_per_s, config.rate_burst)
    tracking = SessionLog(config)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        tracking.close()
        db.close()

    app = FastAPI(
        lifespan=lifespan,
        title="kdvfs tuning service",
        version=__version__,
        description="Jobs and ranks of one fleet share what they learn: ask/tell, plans (docs/service.md).",
        responses=_ERRORS,
    )
    app.state.db, app.state.bank, app.state.tracking = db, bank, tracking
    app.state.config, app.state.limiter = config, limiter
    app.add_middleware(Gate, limit=config.max_body_bytes, tokens=config.tokens)
    if config.preload:
        threading.Thread(target=_preload, name="kdvfs-preload", daemon=True).start()

    known: dict[str, dict] = {}  # session rows read before (they change only on end)
    pools = StepPools(config.pool_wait_s)

    def own_session(caller: Scope, session_id: str) -> dict:
        row = known.get(session_id)
        if row is None:
            row = db.session(caller.fleet, session_id)
            if row is not None:
                known[session_id] = row
        if row is None or row["fleet"] != caller.fleet:
            raise HTTPException(404, "no such session")
        return row

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in first.get("loc", ())) or "request"
        return JSONResponse({"detail": f"{where}: {first.get('msg', 'invalid')}"[:MAX_DETAIL_CHARS]}, 422)

    @app.exception_handler(StorageError)
    async def storage(_request: Request, exc: StorageError) -> JSONResponse:
        _log.error("database error: %s", exc)
        why = ": the database is read-only" if "readonly" in str(exc).replace("-", "").lower() else ""
        return JSONResponse({"detail": f"storage unavailable{why}"}, 503, {"Retry-After": "1"})

    @app.exception_handler(Exception)
    async def internal(_request: Request, exc: Exception) -> JSONResponse:
        _log.exception("internal error", exc_info=exc)
        return JSONResponse({"detail": "internal error"}, 500)

    @app.get("/health", response_model=Health, tags=["health"])
    def health() -> Health:
        database = db.ping()
        return Health(status="ok" if database == "ok" else "degraded", database=database, version=__version__)

    @app.post("/v1/sessions", response_model=SessionReply, status_code=201, tags=["sessions"])
    def open_session(body: SessionRequest, caller: Caller) -> SessionReply:
        spec = body.model_dump(mode="json")
        key = model_key(caller.fleet, spec)
        model_spec = {
            k: spec[k] for k in ("gpu_name", "grid", "workload_signature", "strategy", "policy_options")
        }
        try:
            model = bank.get(key, model_spec)
        except (ValueError, TypeError):
            _log.exception("strategy %s refused its options", body.strategy)
            raise HTTPException(422, f"strategy: {body.strategy} cannot be made with these options") from None
        session_id, joined = db.open_session(caller.fleet, body.job, key, model_spec, spec)
        if joined:
            row = own_session(caller, session_id)
            if row["model_key"] != key or row["spec"]["ranks"] != body.ranks:
                raise HTTPException(409, f"job {body.job} has an open session of another model or rank count")
            return SessionReply(session_id=session_id, model_key=key, observations=model.held(), joined=True)
        tracking.start(
            session_id,
            {"fleet": caller.fleet, "model_key": key}
            | {k: v for k, v in spec.items() if k != "grid"}
            | {"grid_pairs": len(body.grid)},
        )
        return SessionReply(session_id=session_id, model_key=key, observations=model.held(), joined=False)

    async def own_session_async(caller: Scope, session_id: str) -> dict:
        """own_session without holding the event loop: a row read before needs no database."""
        row = known.get(session_id)
        if row is not None and row["fleet"] == caller.fleet:
            return row
        return await run_in_threadpool(own_session, caller, session_id)

    async def model_async(row: dict):
        """model_of without holding the event loop: a model built before is at hand."""
        model = bank.known(row["model_key"])
        return model if model is not None else await run_in_threadpool(model_of, row)

    def model_of(row: dict):
        return bank.get(
            row["model_key"],
            {
                k: row["spec"][k]
                for k in ("gpu_name", "grid", "workload_signature", "strategy", "policy_options")
            },
        )

    @app.get("/v1/sessions/{session_id}", response_model=SessionInfo, tags=["sessions"])
    def session_info(session_id: SessionId, caller: Caller) -> SessionInfo:
        row = own_session(caller, session_id)
        return SessionInfo(
            session_id=session_id,
            job=row["job"],
            model_key=row["model_key"],
            ranks=row["spec"]["ranks"],
            parallel=row["spec"]["parallel"],
            ended=bool(row["ended"]),
            observations=db.session_observations(session_id),
        )

    @app.post("/v1/sessions/{session_id}/ask", response_model=AskReply, tags=["ask and tell"])
    async def ask(session_id: SessionId, body: AskRequest, caller: Caller) -> AskReply:
        row = await own_session_async(caller, session_id)
        _check_rank(row, body.rank)
        model = await model_async(row)
        shared = model.shared_decision(session_id, body.rank, body.task.key)
        if shared is not False:
            return AskReply(config=shared, shared=True)
        config, shared = await run_in_threadpool(model.ask, session_id, body.rank, body.task)
        return AskReply(config=config, shared=shared)

    @app.post("/v1/sessions/{session_id}/tell", response_model=TellReply, tags=["ask and tell"])
    async def tell(session_id: SessionId, body: TellRequest, caller: Caller) -> TellReply:
        row = await own_session_async(caller, session_id)
        _check_rank(row, body.rank)
        if body.config >= len(row["spec"]["grid"]):
            raise HTTPException(
                422, f"config: {body.config} is outside the session's grid of {len(row['spec']['grid'])}"
            )
        model = await model_async(row)
        stored, held = await model.tell_async(
            session_id,
            body.tell_id,
            body.rank,
            row["spec"]["ranks"],
            body.task,
            body.config,
            body.time_s,
            body.energy_j,
            pooled=body.pooled,
        )
        if stored:
            tracking.metrics(
                session_id,
                held,
                {
                    "time_ratio": body.time_s / body.task.ref_time_s,
                    "energy_ratio": body.energy_j / body.task.ref_energy_j,
                    "config": float(body.config),
                    "rank": float(body.rank),
                },
            )
        return TellReply(stored=stored, observations=held)

    @app.post("/v1/sessions/{session_id}/pool", response_model=PoolReply, tags=["ask and tell"])
    async def pool(session_id: SessionId, body: PoolRequest, caller: Caller) -> PoolReply:
        """This data-parallel rank's step report in, every rank's report of the step out
        (runtime/ranks.py: RankPool), once all are in; after POOL_WAIT_S without them,
        status "incomplete" and the ranks missing (200: the pool is not an error)."""
        row = await own_session_async(caller, session_id)
        _check_rank(row, body.rank)
        reports, missing = await pools.gather(session_id, row["spec"]["ranks"], body.rank, body.report)
        if missing:
            return PoolReply(status="incomplete", reports=[], missing=missing)
        return PoolReply(reports=reports)

    @app.post("/v1/sessions/{session_id}/best", response_model=BestReply, tags=["ask and tell"])
    def best(session_id: SessionId, body: BestRequest, caller: Caller) -> BestReply:
        row = own_session(caller, session_id)
        return BestReply(config=model_of(row).best(body.task))

    @app.post("/v1/sessions/{session_id}/end", response_model=SessionInfo, tags=["sessions"])
    def end(session_id: SessionId, caller: Caller) -> SessionInfo:
        own_session(caller, session_id)
        db.end_session(session_id)
        known.pop(session_id, None)
        tracking.end(session_id)
        return session_info(session_id, caller)

    @app.get("/v1/plans/{key}", response_model=PlanReply, tags=["plans"])
    def plan_get(key: PlanKey, caller: Caller) -> PlanReply:
        return _plan(db.plan_get(caller.fleet, key), key)

    @app.get("/v1/plans/{key}/versions/{version}", response_model=PlanReply, tags=["plans"])
    def plan_version(
        key: PlanKey, version: Annotated[int, PathParam(ge=1, le=2**31 - 1)], caller: Caller
    ) -> PlanReply:
        return _plan(db.plan_get(caller.fleet, key, version), key)

    @app.put("/v1/plans/{key}", response_model=PlanVersion, tags=["plans"])
    def plan_put(key: PlanKey, body: PlanPut, caller: Caller) -> PlanVersion:
        doc = checked_plan(key, body.plan)
        try:
            version = db.plan_put(caller.fleet, key, doc, body.expected_version)
        except VersionConflict as exc:
            raise HTTPException(409, str(exc)) from None
        return PlanVersion(key=key, version=version)

    return app


def _preload() -> None:
    """Import the default strategy's module (BoTorch and torch: seconds) while the service
    starts answering, so that the first session of it does not wait for the import."""
    import importlib

    from kdvfs.service.models import STRATEGY_MODULES

    importlib.import_module(f"kdvfs.policies.{STRATEGY_MODULES['botorch']}")


def _check_rank(row: dict, rank: int) -> None:
    if rank >= row["spec"]["ranks"]:
        raise HTTPException(422, f"rank: {rank} is not below the session's {row['spec']['ranks']} ranks")


def _plan(found: tuple[int, dict] | None, key: str) -> PlanReply:
    if found is None:
        raise HTTPException(404, "no such plan")
    return PlanReply(key=key, version=found[0], plan=found[1])


def checked_plan(key: str, doc: dict) -> dict:
    """The plan file rules: a plan that does not load is refused (422, the reader's message),
    and so is one whose GPU, grid and workload are not the ones its key stands for."""
    import json

    from kdvfs.tuner.plan import plan_from_dict

    if len(json.dumps(doc, default=str)) > MAX_PLAN_CHARS:
        raise HTTPException(413, "plan document too long")
    try:
        plan = plan_from_dict(doc, "plan")
        text = json.dumps(plan.to_dict(), allow_nan=False)
    except (KdvfsError, ValueError) as exc:
        raise HTTPException(422, str(exc)[:MAX_DETAIL_CHARS]) from None
    expected = plan_key(plan.gpu_name, plan.grid, plan.workload_signature)
    if expected != key:
        raise HTTPException(
            422, f"plan does not fit key {key}: its GPU, grid and workload make key {expected}"
        )
    return json.loads(text)
