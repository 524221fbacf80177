"""MLflow logging that never stops training.

- Tracker: opens runs (and nested runs) on one tracking store through MlflowClient, keeps the
  store's health (back-off, one warning) and uploads spooled runs (replay_spool).
- RunHandle: one run; params, metrics, dicts, files and figures are delivered in order, and
  what the store did not take waits in a local JSONL spool (<spool_dir>/<local_id>.jsonl).
- _never_raises: every logging call returns normally whatever the store does.

Design (the spool, the tracking URI, the HTTP settings):
docs/design-tuner.md#tracking-mlflow-logging-that-never-stops-training
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import sqlite3
import time
import uuid
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, Literal, ParamSpec, TypeVar, get_args
from urllib.parse import unquote

import mlflow
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, ViewType
from mlflow.exceptions import MlflowException
from mlflow.tracking.default_experiment import DEFAULT_EXPERIMENT_ID
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID
from mlflow.utils.validation import MAX_METRICS_PER_BATCH

from kdvfs.runtime.types import KdvfsError

RunEndStatus = Literal["FINISHED", "FAILED", "KILLED"]
END_STATUSES: tuple[RunEndStatus, ...] = get_args(RunEndStatus)

LOCAL_ID_TAG = "kdvfs.local_run_id"
"""Tag naming the spool id of a run, so a replay finds a run that an earlier attempt created."""
PID_TAG = "kdvfs.pid"
"""Tag naming the process that runs a run (nested ones too), so a later one can tell it is gone."""
HOST_TAG = "kdvfs.host"
"""Tag naming the host of that process (a pid means nothing on another host)."""

#: Where runs the store did not take wait, relative to the working directory.
DEFAULT_SPOOL_DIR = Path("kdvfs-spool")
#: MLflow HTTP settings set for http(s) stores unless the user set them: no retries, 3-s timeout.
HTTP_ENV_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "3"}
#: First wait before an unreachable store is tried again (doubling up to MAX_BACKOFF_S); s.
FIRST_BACKOFF_S = 1.0
#: Longest wait before an unreachable store is tried again; s.
MAX_BACKOFF_S = 30.0

_log = logging.getLogger(__name__)

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _now_ms() -> int:
    return int(time.time() * 1000)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _is_rejection(exc: Exception) -> bool:
    """True when the store answered and refused the item (4xx): retrying cannot help."""
    if not isinstance(exc, MlflowException):
        return False
    status = exc.get_http_status_code()
    return 400 <= status < 500 and status not in (408, 429)


def _sqlite_artifact_location(uri: str) -> str | None:
    """`<db dir>/mlruns` as a file URI for a local sqlite store; None for any other store."""
    if not uri.startswith("sqlite:///"):
        return None
    db_path = unquote(uri[len("sqlite:///") :])
    if not db_path or db_path == ":memory:":
        return None
    return (Path(db_path).resolve().parent / "mlruns").as_uri()


def _sqlite_problem(uri: str) -> str | None:
    """Why a local sqlite store cannot be written (None when it can, or is not sqlite): found
    at once, where MLflow would retry for minutes."""
    if not uri.startswith("sqlite:///"):
        return None
    db_path = unquote(uri[len("sqlite:///") :])
    if not db_path or db_path == ":memory:":
        return None
    path = Path(db_path)
    if path.is_dir():
        return f"{path} is a directory, not a database file"
    if path.exists():
        return None if os.access(path, os.R_OK | os.W_OK) else f"{path} is not writable"
    folder = path.parent
    if not folder.is_dir():
        return f"{folder} does not exist"
    return None if os.access(folder, os.W_OK | os.X_OK) else f"cannot create {path} (folder not writable)"


def _sqlite_without_default(uri: str) -> bool:
    """True when `uri` is a local sqlite store that has no experiment 0 yet: opening it will
    create MLflow's "Default" experiment (a missing file, a file without MLflow's tables)."""
    if not uri.startswith("sqlite:///"):
        return False
    db_path = unquote(uri[len("sqlite:///") :])
    if not db_path or db_path == ":memory:":
        return False
    if not Path(db_path).exists():
        return True
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)) as db:
            return db.execute("SELECT 1 FROM experiments WHERE experiment_id = 0").fetchone() is None
    except sqlite3.Error:
        return True  # not MLflow's tables yet (or not readable: opening it will fail anyway)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _never_raises(method: Callable[_P, _R]) -> Callable[_P, _R | None]:
    """Turn any failure of a RunHandle logging method into a (deduplicated) warning."""

    @wraps(method)
    def guarded(*args: _P.args, **kwargs: _P.kwargs) -> _R | None:
        try:
            return method(*args, **kwargs)
        except Exception as exc:
            run: RunHandle = args[0]  # type: ignore[assignment]
            run.tracker._warn_once(
                f"MLflow logging ({method.__name__}) failed and was skipped: {_one_line(exc)}"
            )
            return None

    return guarded


class Tracker:
    """Opens MLflow runs on one tracking store and keeps the store's health (back-off, warning).

    Args:
        tracking_uri: the MLflow tracking URI; None: MLFLOW_TRACKING_URI, else MLflow's default.
        experiment: the MLflow experiment runs are opened in.
        spool_dir: directory of the local spool for items the store did not take.
    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment: str = "kdvfs",
        spool_dir: Path | str = DEFAULT_SPOOL_DIR,
    ) -> None:
        self._uri = tracking_uri or mlflow.get_tracking_uri()
        if self._uri.startswith(("http://", "https://")):
            for name, value in HTTP_ENV_DEFAULTS.items():
                if not os.environ.get(name):
                    os.environ[name] = value
        self.experiment = experiment
        self.spool_dir = Path(spool_dir).resolve()
        self._client: MlflowClient | None = None
        self._experiment_ids: dict[str, str] = {}
        self._down_until_s = 0.0
        self._backoff_s = FIRST_BACKOFF_S
        self._failure_warned = False
        self._warned: set[str] = set()
        self._reaped: set[str] = set()
        self._creates_default = False  # this tracker opens a new sqlite store (and its Default)
        logging.getLogger("mlflow").setLevel(logging.WARNING)  # no INFO lines on a new store
        self._unusable = _sqlite_problem(self._uri)
        if self._unusable:
            self._mark_down(KdvfsError(self._unusable))

    @property
    def uri(self) -> str:
        """The effective tracking URI (docs/design-tuner.md, tracking URI)."""
        return self._uri

    @property
    def client(self) -> MlflowClient:
        """The MlflowClient, built on first use: building one opens (and migrates) a sqlite store."""
        if self._client is None:
            self._creates_default = _sqlite_without_default(self._uri)
            self._client = MlflowClient(self._uri)
        return self._client

    def _retire_default_experiment(self) -> None:
        """Delete (softly: `mlflow experiments restore --experiment-id 0` brings it back) the
        empty "Default" experiment that opening a new sqlite store made: kdvfs never logs there,
        and an empty experiment in the UI is noise. A store that had one before is left alone."""
        if not self._creates_default:
            return
        self._creates_default = False
        default = self.client.get_experiment(DEFAULT_EXPERIMENT_ID)
        empty = not self.client.search_runs(
            [DEFAULT_EXPERIMENT_ID], run_view_type=ViewType.ALL, max_results=1
        )
        if default.lifecycle_stage == "active" and empty:
            self.client.delete_experiment(DEFAULT_EXPERIMENT_ID)

    def start_run(
        self,
        name: str,
        params: dict[str, Any],
        tags: dict[str, Any] | None = None,
        parent: RunHandle | None = None,
    ) -> RunHandle:
        """Open a run (nested under `parent` via the mlflow.parentRunId tag); never raises."""
        local_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
        header = {
            "kind": "run",
            "local_id": local_id,
            "name": name,
            "experiment": self.experiment,
            "tracking_uri": self._uri,
            "tags": {
                PID_TAG: str(os.getpid()),
                HOST_TAG: socket.gethostname(),
                **{str(k): str(v) for k, v in (tags or {}).items()},
            },
            "start_time_ms": _now_ms(),
            "parent_local_id": parent.local_id if parent else None,
            "parent_run_id": parent.run_id if parent else None,
            "run_id": None,
            "experiment_id": None,
        }
        pending = (
            [{"kind": "params", "params": {str(k): str(v) for k, v in params.items()}}] if params else []
        )
        run = RunHandle(self, header, pending, self.spool_dir / f"{local_id}.jsonl", parent)
        run._start()
        return run

    def replay_spool(self, path: Path | str) -> list[str]:
        """Upload spools left by an earlier process (one .jsonl file or a directory of them).

        Parents are uploaded before their children; a spool without an end record (the process
        died) ends its run KILLED. Returns the run ids; raises KdvfsError if the store fails.
        """
        path = Path(path)
        files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
        runs = [RunHandle._from_spool(self, file) for file in files]
        by_local_id = {run.local_id: run for run in runs}
        for run in runs:
            run._parent = by_local_id.get(run._header["parent_local_id"])
        for run in sorted(runs, key=RunHandle._depth):
            if not run.flush(force=True):
                raise KdvfsError(f"{run.spool_path}: upload to {self._uri} failed: {run._last_error}")
        return [str(run.run_id) for run in runs]

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            _log.warning(message)

    def _available(self, force: bool = False) -> bool:
        """False while backing off after a failure (unless `force`), and always for a store that
        cannot work (an unwritable sqlite file): calls then go straight to the spool."""
        if self._unusable:
            return False
        return force or time.monotonic() >= self._down_until_s

    def _reap_abandoned(self, experiment_id: str) -> None:
        """Mark FAILED the RUNNING runs of `experiment_id` whose process (on this host) is gone:
        a SIGKILL left them RUNNING. Said in one warning line each."""
        if experiment_id in self._reaped:
            return
        self._reaped.add(experiment_id)
        host = socket.gethostname()
        for run in self.client.search_runs(
            [experiment_id], filter_string="attributes.status = 'RUNNING'", max_results=100
        ):
            tags = run.data.tags
            if tags.get(HOST_TAG) != host or not tags.get(PID_TAG, "").isdigit():
                continue
            pid = int(tags[PID_TAG])
            if pid == os.getpid() or _process_alive(pid):
                continue
            self.client.set_terminated(run.info.run_id, "FAILED")
            _log.warning(
                "MLflow run %s (%s) was left RUNNING by process %d, which is gone: marked FAILED",
                run.info.run_name,
                run.info.run_id,
                pid,
            )

    def _mark_up(self) -> None:
        if self._down_until_s:
            _log.info("MLflow tracking at %s answers again; spooled items uploaded", self._uri)
        self._down_until_s = 0.0
        self._backoff_s = FIRST_BACKOFF_S

    def _mark_down(self, exc: Exception) -> None:
        self._down_until_s = time.monotonic() + self._backoff_s
        self._backoff_s = min(2 * self._backoff_s, MAX_BACKOFF_S)
        if not self._failure_warned:
            self._failure_warned = True
            _log.warning(
                "MLflow tracking at %s failed (%s); training continues, logging is spooled under %s and retried",
                self._uri,
                _one_line(exc),
                self.spool_dir,
            )

    def _experiment_id(self, name: str) -> str:
        """The id of experiment `name`, created on first use."""
        if name not in self._experiment_ids:
            experiment = self.client.get_experiment_by_name(name)
            self._experiment_ids[name] = (
                experiment.experiment_id
                if experiment is not None
                else self.client.create_experiment(
                    name, artifact_location=_sqlite_artifact_location(self._uri)
                )
            )
            self._retire_default_experiment()
        return self._experiment_ids[name]

    def _find_run(self, experiment_id: str, local_id: str) -> str | None:
        """The run id tagged with `local_id`, if an earlier attempt created it."""
        runs = self.client.search_runs(
            [experiment_id], filter_string=f"tags.`{LOCAL_ID_TAG}` = '{local_id}'", max_results=1
        )
        return runs[0].info.run_id if runs else None


class RunHandle:
    """One MLflow run. Items are delivered in order; what the store did not take waits in the spool.

    Spool file: a header line (the run: name, tags, parent, run id once created) then one JSON
    line per pending item (params, metrics, dict, file, end). Opened by Tracker.start_run.

    Args:
        tracker: the tracker whose store the run goes to.
        header: the run's spool header (name, tags, parent, run id once created).
        pending: items not yet delivered, in order.
        spool_path: the run's spool file.
        parent: the enclosing run of a nested run; None for a top-level run.
    """

    def __init__(
        self,
        tracker: Tracker,
        header: dict[str, Any],
        pending: list[dict[str, Any]],
        spool_path: Path,
        parent: RunHandle | None,
    ) -> None:
        self.tracker = tracker
        self._header = header
        self.spool_path = spool_path
        self._parent = parent
        self._last_error = ""
        self._pending = pending
        self._on_disk = 0  # leading pending items already written to the spool file
        self._disk_stale = False  # the spool file holds delivered items or an old header
        self._create_tried = False
        self._ended = False

    @classmethod
    def _from_spool(cls, tracker: Tracker, path: Path) -> RunHandle:
        """A handle over a spool file written by an earlier process."""
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            raise KdvfsError(f"{path}: cannot read spool: {exc.strerror}") from exc
        records: list[dict[str, Any]] = []
        for number, line in enumerate(lines, start=1):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                if number < len(lines):
                    raise KdvfsError(f"{path}:{number}: not a JSON spool line: {line[:60]!r}") from None
                _log.warning(
                    "%s:%d: ignoring a truncated last line (the process died while writing it)", path, number
                )
        if not records or records[0].get("kind") != "run":
            raise KdvfsError(f"{path}:1: not a kdvfs spool (no run header line)")
        run = cls(tracker, records[0], records[1:], path, parent=None)
        run._on_disk = len(run._pending)
        run._create_tried = True
        run._ended = any(item["kind"] == "end" for item in run._pending)
        if not run._ended:
            run._pending.append({"kind": "end", "status": "KILLED", "end_time_ms": _now_ms()})
        return run

    @property
    def local_id(self) -> str:
        return self._header["local_id"]

    @property
    def run_id(self) -> str | None:
        """The MLflow run id; None while the store has not been reachable since start_run."""
        return self._header["run_id"]

    @property
    def written(self) -> bool:
        """Whether everything logged so far is in the store or in the spool file (False when
        the store did not take it and the spool could not be written either)."""
        if not self._pending:
            return self.run_id is not None or self.spool_path.exists()
        return self.spool_path.exists() and self._on_disk == len(self._pending) and not self._disk_stale

    @property
    def url_or_path(self) -> str:
        """Where a user finds this run: the UI URL, the local store and how to view it, the
        spool, or that neither the store nor the spool took it."""
        if not self.written:
            return f"neither the store at {self.tracker.uri} nor the spool at {self.spool_path} took it" + (
                f" ({self._last_error})" if self._last_error else ""
            )
        if self.run_id is None:
            return f"not uploaded yet: spooled at {self.spool_path}"
        uri = self.tracker.uri
        if uri.startswith(("http://", "https://")):
            return f"{uri.rstrip('/')}/#/experiments/{self._header['experiment_id']}/runs/{self.run_id}"
        return f"run {self.run_id} in {uri} (view: mlflow ui --backend-store-uri {uri})"

    def _depth(self) -> int:
        """How many ancestors this run has among the handles it is linked to."""
        return 0 if self._parent is None else 1 + self._parent._depth()

    @_never_raises
    def _start(self) -> None:
        self.flush(force=False)

    @_never_raises
    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        values: dict[str, float] = {}
        for key, value in metrics.items():
            try:
                values[str(key)] = float(value)
            except (TypeError, ValueError):
                self.tracker._warn_once(
                    f"metric {key!r} of run {self._header['name']!r} is not a number ({value!r}); dropped"
                )
        if values:
            self._submit({"kind": "metrics", "step": int(step), "timestamp_ms": _now_ms(), "metrics": values})

    @_never_raises
    def log_artifact(self, path: Path | str, artifact_path: str | None = None) -> None:
        """Log a file or directory (copied into the spool if the store is down)."""
        source = Path(path)
        if not source.exists():
            self.tracker._warn_once(f"artifact {source} does not exist; not logged")
            return
        self._submit({"kind": "file", "local_path": str(source.resolve()), "artifact_path": artifact_path})

    @_never_raises
    def log_dict(self, obj: Any, artifact_file: str) -> None:
        """Log `obj` as JSON or YAML (by the extension of `artifact_file`, as mlflow does)."""
        self._submit({"kind": "dict", "obj": obj, "artifact_file": artifact_file})

    @_never_raises
    def log_figure(self, fig: Any, artifact_file: str) -> None:
        """Log a matplotlib figure (rendered into the spool if the store is down)."""
        self._submit({"kind": "figure", "figure": fig, "artifact_file": artifact_file})

    def end(self, status: RunEndStatus = "FINISHED") -> None:
        """Mark the run ended and upload what is spooled; if the store is still down, say where the spool is."""
        if status not in END_STATUSES:
            raise KdvfsError(f"run status {status!r} is not one of {', '.join(END_STATUSES)}")
        if not self._ended:
            self._ended = True
            self._finish(status)

    def __enter__(self) -> RunHandle:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc_type is None:
            self.end("FINISHED")
        elif issubclass(exc_type, KeyboardInterrupt):
            self.end("KILLED")
        else:
            self.end("FAILED")

    @_never_raises
    def _finish(self, status: RunEndStatus) -> None:
        self._pending.append({"kind": "end", "status": status, "end_time_ms": _now_ms()})
        if not self.flush(force=True):
            _log.warning(
                "MLflow run %r not uploaded to %s; spool kept at %s; upload it later with "
                "kdvfs.tuner.tracking.Tracker(%r).replay_spool(%r)",
                self._header["name"],
                self.tracker.uri,
                self.spool_path,
                self.tracker.uri,
                str(self.spool_path),
            )

    def _submit(self, item: dict[str, Any]) -> None:
        if self._ended:
            self.tracker._warn_once(f"run {self._header['name']!r} already ended; {item['kind']} not logged")
            return
        self._pending.append(item)
        self.flush(force=False)

    def flush(self, force: bool) -> bool:
        """Deliver pending items (unless backing off and not `force`); spool what stays. True when all went."""
        if not self.tracker._available(force):
            self._spool()
            return False
        try:
            self._deliver()
        except Exception as exc:
            self._last_error = _one_line(exc)
            self.tracker._mark_down(exc)
            self._spool()
            return False
        self.tracker._mark_up()
        self._remove_spool()
        return True

    def _deliver(self) -> None:
        if self.run_id is None:
            self._create()
        limit = MAX_METRICS_PER_BATCH  # halved after a rejected batch, to find and drop only the bad item
        while self._pending:
            count = min(self._batch_length(), limit)
            try:
                self._send(self._pending[:count])
            except Exception as exc:
                if not _is_rejection(exc):
                    raise
                if count > 1:
                    limit = count // 2
                    continue
                self.tracker._warn_once(
                    f"MLflow rejected {self._pending[0]['kind']} of run {self._header['name']!r}: "
                    f"{_one_line(exc)}; dropped"
                )
                limit = MAX_METRICS_PER_BATCH
            del self._pending[:count]
            delivered_from_disk = min(count, self._on_disk)
            self._on_disk -= delivered_from_disk
            self._disk_stale = self._disk_stale or delivered_from_disk > 0

    def _batch_length(self) -> int:
        """How many leading pending items go in one request: consecutive metric items up to one log_batch."""
        length, metric_count = 0, 0
        for item in self._pending:
            if item["kind"] != "metrics" or (
                length and metric_count + len(item["metrics"]) > MAX_METRICS_PER_BATCH
            ):
                break
            length += 1
            metric_count += len(item["metrics"])
        return max(length, 1)

    def _create(self) -> None:
        header = self._header
        experiment_id = self.tracker._experiment_id(header["experiment"])
        if self._parent is None and header["parent_local_id"] is None:
            self.tracker._reap_abandoned(experiment_id)
        run_id = self.tracker._find_run(experiment_id, self.local_id) if self._create_tried else None
        if run_id is None:
            tags = {**header["tags"], LOCAL_ID_TAG: self.local_id}
            parent_run_id = self._parent_run_id(experiment_id)
            if parent_run_id is not None:
                tags[MLFLOW_PARENT_RUN_ID] = parent_run_id
            self._create_tried = True
            run = self.tracker.client.create_run(
                experiment_id, start_time=header["start_time_ms"], tags=tags, run_name=header["name"]
            )
            run_id = run.info.run_id
        header["run_id"] = run_id
        header["experiment_id"] = experiment_id
        self._disk_stale = True

    def _parent_run_id(self, experiment_id: str) -> str | None:
        if self._parent is not None:
            if self._parent.run_id is None:
                self._parent._create()
            return self._parent.run_id
        parent_local_id = self._header["parent_local_id"]
        if parent_local_id is None or self._header["parent_run_id"] is not None:
            return self._header["parent_run_id"]
        found = self.tracker._find_run(experiment_id, parent_local_id)
        if found is None:
            raise KdvfsError(
                f"parent run {parent_local_id} is not in {self.tracker.uri}; replay its spool first"
            )
        return found

    def _send(self, items: list[dict[str, Any]]) -> None:
        """Deliver one item, or several metric items in one log_batch."""
        client, run_id, item = self.tracker.client, str(self.run_id), items[0]
        match item["kind"]:
            case "metrics":
                metrics = [
                    Metric(key, value, each["timestamp_ms"], each["step"])
                    for each in items
                    for key, value in each["metrics"].items()
                ]
                client.log_batch(run_id, metrics=metrics, synchronous=True)
            case "params":
                params = [Param(key, value) for key, value in item["params"].items()]
                client.log_batch(run_id, params=params, synchronous=True)
            case "dict":
                client.log_dict(run_id, item["obj"], item["artifact_file"])
            case "figure":
                client.log_figure(run_id, item["figure"], item["artifact_file"])
            case "file":
                client.log_artifact(
                    run_id, str(self.spool_path.parent / item["local_path"]), item["artifact_path"]
                )
            case "end":
                client.set_terminated(run_id, item["status"], item["end_time_ms"])

    def _spool(self) -> None:
        """Write pending items to the spool file: append new ones, or rewrite it when stale."""
        self.spool_path.parent.mkdir(parents=True, exist_ok=True)
        rewrite = self._disk_stale or not self.spool_path.exists()
        start = 0 if rewrite else self._on_disk
        lines = [json.dumps(self._materialize(i), default=str) for i in range(start, len(self._pending))]
        if rewrite:
            tmp = self.spool_path.with_suffix(".tmp")
            tmp.write_text("".join(line + "\n" for line in [json.dumps(self._header), *lines]))
            os.replace(tmp, self.spool_path)
        else:
            with self.spool_path.open("a") as spool:
                spool.writelines(line + "\n" for line in lines)
        self._on_disk = len(self._pending)
        self._disk_stale = False

    def _materialize(self, index: int) -> dict[str, Any]:
        """Make pending item `index` self-contained on disk: render a figure, copy a file."""
        item = self._pending[index]
        is_figure = item["kind"] == "figure"
        if not is_figure and not (item["kind"] == "file" and Path(item["local_path"]).is_absolute()):
            return item  # already self-contained (or already copied into the spool)
        files_dir = self.spool_path.with_suffix(".files") / uuid.uuid4().hex[:8]
        files_dir.mkdir(parents=True)
        if is_figure:
            target = files_dir / Path(item["artifact_file"]).name
            item["figure"].savefig(target)
            artifact_dir = str(Path(item["artifact_file"]).parent)
            artifact_path = None if artifact_dir == "." else artifact_dir
        else:
            source = Path(item["local_path"])
            target = files_dir / source.name
            if source.is_dir():
                shutil.copytree(source, target)
            else:
                shutil.copy2(source, target)
            artifact_path = item["artifact_path"]
        spooled = {
            "kind": "file",
            "local_path": str(target.relative_to(self.spool_path.parent)),
            "artifact_path": artifact_path,
        }
        self._pending[index] = spooled
        return spooled

    def _remove_spool(self) -> None:
        if self.spool_path.exists():
            self.spool_path.unlink()
            shutil.rmtree(self.spool_path.with_suffix(".files"), ignore_errors=True)
        self._on_disk = 0
        self._disk_stale = False
