"""The service's database: sessions, the fleet's observations, task references and plans.

SQLAlchemy Core over any URL it supports; SQLite and PostgreSQL are the tested ones. A SQLite
file runs in WAL mode with synchronous=FULL, so a committed tell is in the WAL on disk before
the reply (a killed or crashed service loses nothing it acknowledged), and a busy timeout
lets concurrent writers queue instead of failing. Every write is one short transaction.

- `Database`: the engine and tables; `open_session`, `session`, `end_session`, `tell_async`
  (idempotent on (session, tell id); through `GroupCommit`, which writes the tells that
  arrive together in one transaction: one fsync for many), `observations` (a model's, in order), `task_reference`
  (the first reference a task was told with: the model's scale), `plan_put` (versioned,
  optimistic), `plan_get`, `ping`.
- `StorageError`: the database refused or is unreachable (the app answers 503).

Design: docs/service.md.
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    false,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

#: SQLite: how long a writer waits for another's lock before failing; ms.
SQLITE_BUSY_TIMEOUT_MS = 10_000
#: Connections kept open to the database (SQLite and PostgreSQL alike); connections.
POOL_SIZE = 8
#: Most tells written in one transaction by the group commit; tells.
MAX_BATCH_TELLS = 512

metadata = MetaData()

sessions = Table(
    "sessions",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("fleet", String(200), nullable=False, index=True),
    Column("job", String(200), nullable=False),
    Column("model_key", String(64), nullable=False),
    Column("spec", JSON, nullable=False),
    Column("created_s", Float, nullable=False),
    Column("ended", Boolean, nullable=False, default=False),
)
# one open session per job name and fleet: the ranks of a job join it
Index(
    "one_open_session",
    sessions.c.fleet,
    sessions.c.job,
    unique=True,
    sqlite_where=sessions.c.ended == false(),
    postgresql_where=sessions.c.ended == false(),
)

models = Table(
    "models",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("fleet", String(200), nullable=False),
    Column("spec", JSON, nullable=False),  # gpu_name, grid, workload_signature, strategy, options
)

tasks = Table(
    "tasks",
    metadata,
    Column("model_key", String(64), primary_key=True),
    Column("task_key", String(120), primary_key=True),
    Column("ref_time_s", Float, nullable=False),
    Column("ref_energy_j", Float, nullable=False),
)

observations = Table(
    "observations",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("model_key", String(64), nullable=False, index=True),
    Column("task_key", String(120), nullable=False),
    Column("session_id", String(32), nullable=False),
    Column("tell_id", String(32), nullable=False),
    Column("rank", Integer, nullable=False),
    Column("config", Integer, nullable=False),
    Column("time_ratio", Float, nullable=False),  # measured / the teller's reference
    Column("energy_ratio", Float, nullable=False),
    Column("created_s", Float, nullable=False),
    UniqueConstraint("session_id", "tell_id", name="one_tell"),
)

plans = Table(
    "plans",
    metadata,
    Column("fleet", String(200), primary_key=True),
    Column("key", String(120), primary_key=True),
    Column("version", Integer, primary_key=True),
    Column("doc", Text, nullable=False),
    Column("created_s", Float, nullable=False),
)


@dataclass(frozen=True)
class _Tell:
    model_key: str
    session_id: str
    tell_id: str
    rank: int
    obs: Observation


class _Waiting:
    """A tell waiting for its commit; its coroutine awaits `future`, resolved on `loop`."""

    def __init__(self, tell: _Tell, loop: asyncio.AbstractEventLoop) -> None:
        self.tell = tell
        self.stored = False
        self.error: BaseException | None = None
        self.loop = loop
        self.future = loop.create_future()

    def finish(self) -> None:
        self.loop.call_soon_threadsafe(self._resolve)

    def _resolve(self) -> None:
        if self.future.done():
            return
        if self.error is not None:
            self.future.set_exception(self.error)
        else:
            self.future.set_result(self.stored)


class GroupCommit:
    """One writer thread: the tells waiting when it is free are written in one transaction, so
    concurrent tells share one commit (one fsync) instead of queueing for one each.

    Args:
        write: stores a list of tells in one transaction, returns per tell whether it was new.
    """

    def __init__(self, write) -> None:
        self._write = write
        self._queue: queue.Queue[_Waiting | None] = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="kdvfs-commit", daemon=True)
        self._thread.start()

    async def submit_async(self, tell: _Tell) -> bool:
        """Whether the tell was new, once its commit is on disk; the event loop is not held
        while the commit runs."""
        waiting = _Waiting(tell, asyncio.get_running_loop())
        self._queue.put(waiting)
        return await waiting.future

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(5.0)

    def _work(self) -> None:
        while (first := self._queue.get()) is not None:
            batch = [first]
            while len(batch) < MAX_BATCH_TELLS:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)
                    break
                batch.append(item)
            try:
                for waiting, stored in zip(batch, self._write([w.tell for w in batch])):
                    waiting.stored = stored
            except BaseException as exc:  # every waiter hears it (a StorageError: 503)
                for waiting in batch:
                    waiting.error = exc
            for waiting in batch:
                waiting.finish()


probe = Table(
    "probe",  # written and rolled back by Database.ping: is the database writable?
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at_s", Float, nullable=False),
)


class StorageError(Exception):
    """The database refused a write or cannot be reached."""


class VersionConflict(Exception):
    """A plan put named a version that is not the newest (or lost a race for the next one)."""


@dataclass(frozen=True)
class Observation:
    task_key: str
    config: int
    time_ratio: float
    energy_ratio: float


def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    """WAL, durable commits, a busy timeout; transactions begun by _sqlite_begin, not pysqlite."""
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.close()


def _sqlite_begin(conn: Any) -> None:
    """A write transaction takes the write lock at once (BEGIN IMMEDIATE), so two writers that
    read first queue on the busy timeout instead of one failing on a stale snapshot."""
    conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("kdvfs_write") else "BEGIN")


class Database:
    """The service's tables on one database.

    Args:
        url: a SQLAlchemy URL (sqlite:///path.db, postgresql+psycopg://user@host/db).
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        options: dict[str, Any] = {"pool_pre_ping": not self.is_sqlite}
        if self.is_sqlite:
            options["connect_args"] = {"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}
        options |= {"pool_size": POOL_SIZE, "max_overflow": POOL_SIZE}
        self.engine: Engine = create_engine(url, **options)
        if self.is_sqlite:
            event.listen(self.engine, "connect", _sqlite_connect)
            event.listen(self.engine, "begin", _sqlite_begin)
        try:
            metadata.create_all(self.engine)
        except SQLAlchemyError as exc:
            raise StorageError(f"cannot open the database: {_one_line(exc)}") from None
        self._committer = GroupCommit(self.tell_many)

    def close(self) -> None:
        self._committer.close()
        self.engine.dispose()

    def ping(self) -> str:
        """ "ok", "read-only" (reads work, a write is refused) or "unavailable"."""
        try:
            with self.engine.connect() as conn:
                conn.execute(select(1))
        except SQLAlchemyError:
            return "unavailable"
        try:
            engine = self.engine.execution_options(kdvfs_write=True)
            with engine.connect() as conn, conn.begin() as txn:
                conn.execute(insert(probe).values(at_s=time.time()))
                txn.rollback()  # a real write, never kept
        except SQLAlchemyError:
            return "read-only"
        return "ok"

    # --- sessions and models ----------------------------------------------------------------
    def open_session(
        self, fleet: str, job: str, model_key: str, model_spec: dict, spec: dict
    ) -> tuple[str, bool]:
        """A new session, or the open session of this fleet's job of that name (the ranks of one
        job join one session): (its id, whether it existed)."""
        for _ in range(3):
            found = self._open_session_of(fleet, job)
            if found is not None:
                return found, True
            try:
                return self._new_session(fleet, job, model_key, model_spec, spec), False
            except StorageError as exc:
                if not isinstance(exc.__cause__, IntegrityError):
                    raise  # else another rank opened it (or registered the model) first
        raise StorageError("could not open a session")

    def _open_session_of(self, fleet: str, job: str) -> str | None:
        s = sessions.c
        with self._read() as conn:
            row = conn.execute(select(s.id).where(s.fleet == fleet, s.job == job, s.ended == false())).first()
        return None if row is None else str(row[0])

    def _new_session(self, fleet: str, job: str, model_key: str, model_spec: dict, spec: dict) -> str:
        session_id = uuid.uuid4().hex
        with self._write() as conn:
            if conn.execute(select(models.c.key).where(models.c.key == model_key)).first() is None:
                conn.execute(insert(models).values(key=model_key, fleet=fleet, spec=model_spec))
            conn.execute(
                insert(sessions).values(
                    id=session_id,
                    fleet=fleet,
                    job=job,
                    model_key=model_key,
                    spec=spec,
                    created_s=time.time(),
                    ended=False,
                )
            )
        return session_id

    def session(self, fleet: str, session_id: str) -> dict | None:
        """The session's row (id, job, model_key, spec, ended), None when this fleet has none."""
        with self._read() as conn:
            row = conn.execute(
                select(sessions).where(sessions.c.id == session_id, sessions.c.fleet == fleet)
            ).first()
        return None if row is None else dict(row._mapping)

    def end_session(self, session_id: str) -> None:
        with self._write() as conn:
            conn.execute(update(sessions).where(sessions.c.id == session_id).values(ended=True))

    def session_observations(self, session_id: str) -> int:
        with self._read() as conn:
            return int(
                conn.execute(
                    select(func.count())
                    .select_from(observations)
                    .where(observations.c.session_id == session_id)
                ).scalar_one()
            )

    def model_spec(self, model_key: str) -> dict | None:
        with self._read() as conn:
            row = conn.execute(select(models.c.spec).where(models.c.key == model_key)).first()
        return None if row is None else dict(row[0])

    # --- observations -----------------------------------------------------------------------
    def task_reference(
        self, model_key: str, task_key: str, ref_time_s: float, ref_energy_j: float
    ) -> tuple[float, float]:
        """The model's reference of this task: the first one told (stored now if none was)."""
        with self._read() as conn:
            row = conn.execute(
                select(tasks.c.ref_time_s, tasks.c.ref_energy_j).where(
                    tasks.c.model_key == model_key, tasks.c.task_key == task_key
                )
            ).first()
        if row is not None:
            return float(row[0]), float(row[1])
        try:
            with self._write() as conn:
                conn.execute(
                    insert(tasks).values(
                        model_key=model_key,
                        task_key=task_key,
                        ref_time_s=ref_time_s,
                        ref_energy_j=ref_energy_j,
                    )
                )
        except StorageError as exc:
            if not isinstance(exc.__cause__, IntegrityError):
                raise
            return self.task_reference(model_key, task_key, ref_time_s, ref_energy_j)  # lost a race
        return ref_time_s, ref_energy_j

    async def tell_async(
        self, model_key: str, session_id: str, tell_id: str, rank: int, obs: Observation
    ) -> bool:
        """Store one observation, committed (on disk) when this returns; False when this
        (session, tell id) was stored before. Tells arriving together share one commit."""
        return await self._committer.submit_async(_Tell(model_key, session_id, tell_id, rank, obs))

    def tell_many(self, tells: list[_Tell]) -> list[bool]:
        """Store tells in one transaction (one commit, one fsync); per tell, whether it is new."""
        o = observations.c
        keys = {(t.session_id, t.tell_id) for t in tells}
        with self._write() as conn:
            known = set()
            for session_id in {k[0] for k in keys}:
                ids = [k[1] for k in keys if k[0] == session_id]
                rows = conn.execute(
                    select(o.session_id, o.tell_id).where(o.session_id == session_id, o.tell_id.in_(ids))
                ).all()
                known |= {(r[0], r[1]) for r in rows}
            stored, rows = [], []
            for t in tells:
                new = (t.session_id, t.tell_id) not in known
                stored.append(new)
                if new:
                    known.add((t.session_id, t.tell_id))
                    rows.append(
                        {
                            "model_key": t.model_key,
                            "task_key": t.obs.task_key,
                            "session_id": t.session_id,
                            "tell_id": t.tell_id,
                            "rank": t.rank,
                            "config": t.obs.config,
                            "time_ratio": t.obs.time_ratio,
                            "energy_ratio": t.obs.energy_ratio,
                            "created_s": time.time(),
                        }
                    )
            if rows:
                conn.execute(insert(observations), rows)
        return stored

    def observations(
        self, model_key: str, after_id: int = 0
    ) -> list[tuple[int, tuple[str, str], Observation]]:
        """The model's observations with ids above after_id, oldest first: (id, (session id,
        tell id), observation)."""
        o = observations.c
        with self._read() as conn:
            rows = conn.execute(
                select(o.id, o.session_id, o.tell_id, o.task_key, o.config, o.time_ratio, o.energy_ratio)
                .where(o.model_key == model_key, o.id > after_id)
                .order_by(o.id)
            ).all()
        return [
            (int(r[0]), (r[1], r[2]), Observation(r[3], int(r[4]), float(r[5]), float(r[6]))) for r in rows
        ]

    # --- plans --------------------------------------------------------------------------------
    def plan_put(self, fleet: str, key: str, doc: dict, expected_version: int | None) -> int:
        """Store the plan as the key's next version (committed when this returns); VersionConflict
        when expected_version is given and is not the newest."""
        try:
            return self._plan_put(fleet, key, doc, expected_version)
        except StorageError as exc:
            if isinstance(exc.__cause__, IntegrityError):
                raise VersionConflict("another put of this key came first") from None
            raise

    def _plan_put(self, fleet: str, key: str, doc: dict, expected_version: int | None) -> int:
        with self._write() as conn:
            newest = conn.execute(
                select(func.max(plans.c.version)).where(plans.c.fleet == fleet, plans.c.key == key)
            ).scalar_one()
            newest = int(newest or 0)
            if expected_version is not None and expected_version != newest:
                raise VersionConflict(f"the newest version is {newest}, not {expected_version}")
            conn.execute(
                insert(plans).values(
                    fleet=fleet,
                    key=key,
                    version=newest + 1,
                    doc=json.dumps(doc, allow_nan=False),
                    created_s=time.time(),
                )
            )
        return newest + 1

    def plan_get(self, fleet: str, key: str, version: int | None = None) -> tuple[int, dict] | None:
        p = plans.c
        query = select(p.version, p.doc).where(p.fleet == fleet, p.key == key)
        query = query.where(p.version == version) if version is not None else query.order_by(p.version.desc())
        with self._read() as conn:
            row = conn.execute(query.limit(1)).first()
        return None if row is None else (int(row[0]), json.loads(row[1]))

    # --- transactions -------------------------------------------------------------------------
    def _write(self):
        return _Transaction(self.engine, write=True)

    def _read(self):
        return _Transaction(self.engine, write=False)


class _Transaction:
    """engine.begin() whose database errors become StorageError (the cause kept)."""

    def __init__(self, engine: Engine, write: bool) -> None:
        self.engine = engine
        self.write = write
        self._ctx = None

    def __enter__(self):
        try:
            engine = self.engine.execution_options(kdvfs_write=True) if self.write else self.engine
            self._ctx = engine.begin()
            return self._ctx.__enter__()
        except SQLAlchemyError as exc:
            raise StorageError(_one_line(exc)) from exc

    def __exit__(self, exc_type, exc, tb):
        try:
            result = self._ctx.__exit__(exc_type, exc, tb)
        except SQLAlchemyError as error:
            raise StorageError(_one_line(error)) from error
        if isinstance(exc, SQLAlchemyError):
            raise StorageError(_one_line(exc)) from exc
        return result


def _one_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).splitlines()
    return text[0] if text else type(exc).__name__
