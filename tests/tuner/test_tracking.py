"""Tracker against real MLflow stores: a sqlite file, and a real `mlflow server` that dies and comes back."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from matplotlib.figure import Figure
from mlflow import MlflowClient

from kdvfs.runtime.types import KdvfsError
from kdvfs.tuner.tracking import LOCAL_ID_TAG, Tracker
from tests.tuner.conftest import MlflowServer, free_port

PARENT_TAG = "mlflow.parentRunId"


def tracking_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "kdvfs.tuner.tracking" and r.levelno >= logging.WARNING
    ]


def history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def spool_records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def small_figure() -> Figure:
    fig = Figure()
    fig.add_subplot().plot([0, 1, 2], [3.0, 2.0, 2.5])
    return fig


def test_sqlite_run_holds_params_metrics_and_artifacts(sqlite_tracking_uri: str, tmp_path: Path) -> None:
    tracker = Tracker(sqlite_tracking_uri, experiment="full", spool_dir=tmp_path / "spool")
    note = tmp_path / "note.txt"
    note.write_text("hello")
    with tracker.start_run("session", {"budget": 0.01, "policy": "ucb"}, tags={"gpu": "h200"}) as run:
        for step in range(3):
            run.log_metrics(step, {"energy_j": 10.0 - step, "slowdown": 0.001 * step})
        run.log_dict({"groups": [1, 2]}, "plan/plan.json")
        run.log_figure(small_figure(), "plots/convergence.png")
        run.log_artifact(note)

    client = MlflowClient(sqlite_tracking_uri)
    record = client.get_run(run.run_id)
    assert record.info.status == "FINISHED"
    assert record.info.run_name == "session"
    assert record.data.params == {"budget": "0.01", "policy": "ucb"}
    assert record.data.tags["gpu"] == "h200"
    assert history(client, run.run_id, "energy_j") == [(0, 10.0), (1, 9.0), (2, 8.0)]
    assert {f.path for f in client.list_artifacts(run.run_id)} == {"plan", "plots", "note.txt"}
    assert [f.path for f in client.list_artifacts(run.run_id, "plots")] == ["plots/convergence.png"]
    plan = Path(client.download_artifacts(run.run_id, "plan/plan.json", str(tmp_path)))
    assert json.loads(plan.read_text()) == {"groups": [1, 2]}
    # Artifacts of a local sqlite store sit next to the database, not in the working directory.
    db_dir = Path(sqlite_tracking_uri.removeprefix("sqlite:///")).parent
    assert record.info.artifact_uri.startswith((db_dir / "mlruns").as_uri())
    assert run.run_id in run.url_or_path
    assert f"mlflow ui --backend-store-uri {sqlite_tracking_uri}" in run.url_or_path
    assert not (tmp_path / "spool").exists()


def test_nested_runs_carry_the_parent_tag_and_stay_open_together(
    sqlite_tracking_uri: str, tmp_path: Path
) -> None:
    tracker = Tracker(sqlite_tracking_uri, experiment="nested", spool_dir=tmp_path)
    parent = tracker.start_run("compare", {"strategies": 2})
    children = [tracker.start_run(name, {"policy": name}, parent=parent) for name in ("ucb", "bo")]
    for index, child in enumerate(children):
        child.log_metrics(0, {"energy_j": float(index)})
    for child in children:
        child.end()
    parent.end()

    client = MlflowClient(sqlite_tracking_uri)
    assert PARENT_TAG not in client.get_run(parent.run_id).data.tags
    for index, child in enumerate(children):
        assert client.get_run(child.run_id).data.tags[PARENT_TAG] == parent.run_id
        assert history(client, child.run_id, "energy_j") == [(0, float(index))]


@pytest.mark.parametrize(
    ("error", "status"), [(None, "FINISHED"), (ValueError, "FAILED"), (KeyboardInterrupt, "KILLED")]
)
def test_context_manager_ends_with_the_matching_status_and_reraises(
    sqlite_tracking_uri: str, tmp_path: Path, error: type[BaseException] | None, status: str
) -> None:
    tracker = Tracker(sqlite_tracking_uri, experiment="status", spool_dir=tmp_path)
    if error is None:
        with tracker.start_run("ok", {}) as run:
            run.log_metrics(0, {"x": 1.0})
    else:
        with pytest.raises(error), tracker.start_run("interrupted", {}) as run:
            raise error("stop")
    assert MlflowClient(sqlite_tracking_uri).get_run(run.run_id).info.status == status


def test_end_rejects_an_unknown_status_and_ignores_a_second_end(
    sqlite_tracking_uri: str, tmp_path: Path
) -> None:
    run = Tracker(sqlite_tracking_uri, experiment="status", spool_dir=tmp_path).start_run("twice", {})
    with pytest.raises(KdvfsError, match="'DONE'"):
        run.end("DONE")  # type: ignore[arg-type]
    run.end("FAILED")
    run.end("FINISHED")
    assert MlflowClient(sqlite_tracking_uri).get_run(run.run_id).info.status == "FAILED"


def test_a_new_sqlite_store_keeps_no_empty_default_experiment_and_prints_no_info_lines(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    uri = f"sqlite:///{tmp_path / 'new.db'}"
    Tracker(uri, experiment="kdvfs-x", spool_dir=tmp_path).start_run("one", {}).end()
    assert "INFO" not in capfd.readouterr().err  # MLflow's "Creating initial MLflow database tables"
    client = MlflowClient(uri)
    assert [e.name for e in client.search_experiments()] == ["kdvfs-x"]
    client.restore_experiment("0")  # deleted softly: a user who wants it back has it
    assert client.get_experiment("0").name == "Default"


def test_a_store_that_had_a_default_experiment_keeps_it(sqlite_store_uri: str, tmp_path: Path) -> None:
    uri = sqlite_store_uri  # a store made by MLflow's own client
    assert [e.name for e in MlflowClient(uri).search_experiments()] == ["Default"]
    Tracker(uri, experiment="kdvfs-x", spool_dir=tmp_path).start_run("one", {}).end()
    assert sorted(e.name for e in MlflowClient(uri).search_experiments()) == ["Default", "kdvfs-x"]


def test_a_parent_and_child_left_running_by_sigkill_are_marked_failed_by_the_next_tracker(
    sqlite_store_uri: str, tmp_path: Path
) -> None:
    script = (
        "import os, sys\n"
        "from kdvfs.tuner.tracking import Tracker\n"
        "tracker = Tracker(sys.argv[1], experiment='killed', spool_dir=sys.argv[2])\n"
        "parent = tracker.start_run('compare', {})\n"
        "tracker.start_run('ucb-seed0', {}, parent=parent)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    killed = subprocess.run([sys.executable, "-c", script, sqlite_store_uri, str(tmp_path)], check=False)
    assert killed.returncode == -9
    Tracker(sqlite_store_uri, experiment="killed", spool_dir=tmp_path).start_run("next", {}).end()
    client = MlflowClient(sqlite_store_uri)
    runs = client.search_runs([client.get_experiment_by_name("killed").experiment_id])
    assert {r.info.run_name: r.info.status for r in runs} == {
        "compare": "FAILED",
        "ucb-seed0": "FAILED",
        "next": "FINISHED",
    }


def test_rejected_items_are_dropped_with_a_warning_and_do_not_block_later_ones(
    sqlite_tracking_uri: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tracker = Tracker(sqlite_tracking_uri, experiment="rejects", spool_dir=tmp_path / "spool")
    with tracker.start_run("rejects", {}) as run:
        run.log_metrics(0, {"../escape": 1.0})  # MLflow refuses path-like metric names
        run.log_metrics(1, {"ok": 2.0, "not_a_number": "fast"})

    client = MlflowClient(sqlite_tracking_uri)
    assert history(client, run.run_id, "ok") == [(1, 2.0)]
    assert set(client.get_run(run.run_id).data.metrics) == {"ok"}
    warnings = tracking_warnings(caplog)
    assert any("rejected metrics" in line for line in warnings)
    assert any("'not_a_number'" in line for line in warnings)
    assert not (tmp_path / "spool").exists()


def test_replay_uploads_a_long_spool_in_batches_and_drops_only_the_rejected_item(
    sqlite_tracking_uri: str, http_client_env: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool_dir = tmp_path / "spool"
    offline = Tracker(f"http://127.0.0.1:{free_port()}", experiment="long-outage", spool_dir=spool_dir)
    run = offline.start_run("session", {})
    for step in range(3000):
        run.log_metrics(step, {"energy_j": float(step)} if step != 1234 else {"../escape": 1.0})
    run.end()

    replayer = Tracker(sqlite_tracking_uri, spool_dir=tmp_path / "unused")
    batch_sizes: list[int] = []
    real_log_batch = replayer.client.log_batch

    def counting_log_batch(run_id: str, metrics: list[Any] = (), **kwargs: Any) -> None:  # type: ignore[assignment]
        batch_sizes.append(len(metrics))
        real_log_batch(run_id, metrics=metrics, **kwargs)

    replayer.client.log_batch = counting_log_batch  # type: ignore[method-assign]
    [run_id] = replayer.replay_spool(spool_dir)
    # Whole batches of 1000 metrics; the rejected one is bisected down to the bad item (~15 requests).
    assert batch_sizes[:2] == [1000, 1000] and len(batch_sizes) < 25

    steps = [step for step, _ in history(MlflowClient(sqlite_tracking_uri), run_id, "energy_j")]
    assert steps == [step for step in range(3000) if step != 1234]
    assert any("rejected metrics" in line for line in tracking_warnings(caplog))


def test_uri_is_the_argument_else_the_env_var_else_mlflows_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///from-env.db")
    assert Tracker("sqlite:///explicit.db").uri == "sqlite:///explicit.db"
    assert Tracker().uri == "sqlite:///from-env.db"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    # mlflow 3.x's own default: an absolute sqlite file in the working directory.
    assert Tracker().uri == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert list(tmp_path.iterdir()) == []  # nothing is opened before the first run


def test_http_uri_cuts_mlflow_retries_unless_the_user_set_them(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.setenv(name, "placeholder")  # so that the deletion below is undone after the test
        monkeypatch.delenv(name)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "9")
    Tracker("http://127.0.0.1:1")
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "0"
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "9"


def test_a_server_that_never_answers_costs_one_timeout_not_one_per_call(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
    with socket.socket() as silent:  # accepts TCP connections (backlog), never answers HTTP
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        tracker = Tracker(f"http://127.0.0.1:{silent.getsockname()[1]}", spool_dir=tmp_path)
        started = time.monotonic()
        run = tracker.start_run("session", {"budget": 0.01})
        first_call_s = time.monotonic() - started
        started = time.monotonic()
        for step in range(50):
            run.log_metrics(step, {"energy_j": float(step)})
        later_calls_s = time.monotonic() - started
    assert 0.9 < first_call_s < 3.0
    assert later_calls_s < 0.5
    steps = [r["step"] for r in spool_records(run.spool_path) if r["kind"] == "metrics"]
    assert steps == list(range(50))


def test_server_run_is_readable_through_the_server(
    live_mlflow_server: MlflowServer, http_client_env: None, tmp_path: Path
) -> None:
    uri = live_mlflow_server.uri
    tracker = Tracker(uri, experiment="server-basic", spool_dir=tmp_path / "spool")
    with tracker.start_run("session", {"budget": 0.02}) as run:
        run.log_metrics(0, {"energy_j": 5.0})
        run.log_metrics(1, {"energy_j": 4.0})
        run.log_dict({"clocks_mhz": [1980, 4800]}, "plan.json")

    client = MlflowClient(uri)
    record = client.get_run(run.run_id)
    assert record.info.status == "FINISHED"
    assert record.data.params == {"budget": "0.02"}
    assert history(client, run.run_id, "energy_j") == [(0, 5.0), (1, 4.0)]
    assert [f.path for f in client.list_artifacts(run.run_id)] == ["plan.json"]
    assert run.url_or_path == f"{uri}/#/experiments/{record.info.experiment_id}/runs/{run.run_id}"
    assert not (tmp_path / "spool").exists()
    assert client.get_experiment("0").lifecycle_stage == "active"  # the server's Default: not ours to delete


def test_server_killed_mid_run_spools_then_uploads_after_restart(
    live_mlflow_server: MlflowServer, http_client_env: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = live_mlflow_server
    tracker = Tracker(server.uri, experiment="server-crash", spool_dir=tmp_path / "spool")
    parent = tracker.start_run("session", {"budget": 0.01})
    for step in range(3):
        parent.log_metrics(step, {"energy_j": float(step)})

    server.kill()
    started = time.monotonic()
    for step in range(3, 8):
        parent.log_metrics(step, {"energy_j": float(step)})
    parent.log_figure(small_figure(), "plots/energy.png")
    child = tracker.start_run("ucb", {"policy": "ucb"}, parent=parent)
    child.log_metrics(0, {"energy_j": 1.5})
    assert time.monotonic() - started < 2.0  # no MLflow retry loop per call
    assert child.run_id is None
    [warning] = tracking_warnings(caplog)
    assert server.uri in warning
    spooled = spool_records(parent.spool_path)
    assert [r["step"] for r in spooled if r["kind"] == "metrics"] == [3, 4, 5, 6, 7]
    assert [r["kind"] for r in spool_records(child.spool_path)] == ["run", "params", "metrics"]

    server.start()  # same port and store; takes longer than the first back-off
    parent.log_metrics(8, {"energy_j": 8.0})
    child.log_metrics(1, {"energy_j": 2.5})

    client = MlflowClient(server.uri)  # the spool arrived before end()
    assert history(client, parent.run_id, "energy_j") == [(step, float(step)) for step in range(9)]
    assert [f.path for f in client.list_artifacts(parent.run_id, "plots")] == ["plots/energy.png"]
    assert client.get_run(child.run_id).data.tags[PARENT_TAG] == parent.run_id
    assert history(client, child.run_id, "energy_j") == [(0, 1.5), (1, 2.5)]
    assert not parent.spool_path.exists() and not child.spool_path.exists()
    child.end()
    parent.end()
    assert client.get_run(parent.run_id).info.status == "FINISHED"
    assert len(tracking_warnings(caplog)) == 1


def test_unreachable_server_spools_everything_and_replay_uploads_it(
    live_mlflow_server: MlflowServer, http_client_env: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool_dir = tmp_path / "spool"
    dead_uri = f"http://127.0.0.1:{free_port()}"
    tracker = Tracker(dead_uri, experiment="offline", spool_dir=spool_dir)
    parent = tracker.start_run("session", {"budget": 0.01})
    for step in range(5):
        parent.log_metrics(step, {"energy_j": 10.0 + step})
    parent.log_dict({"clocks_mhz": [1980, 4800]}, "plan.json")
    child = tracker.start_run("ucb", {"policy": "ucb"}, parent=parent)
    child.log_metrics(0, {"energy_j": 3.0})  # never ended: as if the process died here
    parent.end()

    unreachable, kept = tracking_warnings(caplog)
    assert dead_uri in unreachable
    assert str(parent.spool_path) in kept and "replay_spool" in kept
    assert parent.run_id is None and str(parent.spool_path) in parent.url_or_path
    records = spool_records(parent.spool_path)
    assert records[0]["name"] == "session"
    assert [r["step"] for r in records if r["kind"] == "metrics"] == [0, 1, 2, 3, 4]
    assert records[-1] == {"kind": "end", "status": "FINISHED", "end_time_ms": records[-1]["end_time_ms"]}
    with child.spool_path.open("a") as spool:
        spool.write('{"kind": "metr')  # the process died while writing a line

    run_ids = Tracker(live_mlflow_server.uri, spool_dir=tmp_path / "unused").replay_spool(spool_dir)

    client = MlflowClient(live_mlflow_server.uri)
    runs = {client.get_run(run_id).info.run_name: client.get_run(run_id) for run_id in run_ids}
    assert set(runs) == {"session", "ucb"}
    session, ucb = runs["session"], runs["ucb"]
    assert session.info.status == "FINISHED"
    assert session.data.params == {"budget": "0.01"}
    assert session.data.tags[LOCAL_ID_TAG] == parent.local_id
    assert history(client, session.info.run_id, "energy_j") == [(step, 10.0 + step) for step in range(5)]
    assert [f.path for f in client.list_artifacts(session.info.run_id)] == ["plan.json"]
    assert ucb.info.status == "KILLED"
    assert ucb.data.tags[PARENT_TAG] == session.info.run_id
    assert history(client, ucb.info.run_id, "energy_j") == [(0, 3.0)]
    assert list(spool_dir.glob("*.jsonl")) == []
