"""Shared fixtures for tuner tests: a real sqlite MLflow store and a real `mlflow server`."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

SERVER_START_TIMEOUT_S = 60.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listened on a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class MlflowServer:
    """A real `mlflow server` subprocess on 127.0.0.1 that a test can kill and restart.

    The store (sqlite) and the artifacts live in `root`, so a restart finds the same runs.
    `store_template`: an sqlite store file to start from (its tables made: the server's first
    start then skips MLflow's migrations).
    """

    def __init__(self, root: Path, store_template: Path | None = None) -> None:
        self.root = root
        if store_template is not None:
            shutil.copyfile(store_template, root / "server.db")
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.log_path = root / "server.log"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # The server's background job runner is not needed for tracking and costs start time.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        env.pop("MLFLOW_TRACKING_URI", None)
        command = [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            f"sqlite:///{self.root / 'server.db'}",
            "--artifacts-destination",
            str(self.root / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            "1",
        ]
        with self.log_path.open("ab") as log:
            # A session of its own, so kill() reaches the uvicorn worker the CLI spawns.
            self._process = subprocess.Popen(command, stdout=log, stderr=log, env=env, start_new_session=True)
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                pytest.fail(f"mlflow server exited early: {self.log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=1) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        self.kill()
        pytest.fail(f"mlflow server did not answer /health within {SERVER_START_TIMEOUT_S} s")

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def kill(self) -> None:
        """SIGKILL the server's process group: a crash, not a clean shutdown."""
        if self._process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, signal.SIGKILL)
        self._process.wait()
        self._process = None


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory, empty_store_file: Path) -> Iterator[MlflowServer]:
    """One server per test session (it takes several seconds to start); alive at the start of
    each use. Tests sharing it use experiments of their own."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"), empty_store_file)
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def live_mlflow_server(mlflow_server: MlflowServer) -> MlflowServer:
    """The module's server, restarted if an earlier test killed it."""
    if not mlflow_server.running:
        mlflow_server.start()
    return mlflow_server


@pytest.fixture(scope="session")
def empty_store_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An sqlite MLflow store with its tables made, once per session: MLflow's migrations take
    2 s for each new store on an idle machine (18 s on a loaded one), a copy of the file 0.3 s.
    Its Default experiment was made by MLflow's own client, as a user's store would have it.
    (A store that kdvfs itself creates is tested in test_tracking.)"""
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


def copy_store(template: Path, folder: Path) -> str:
    """A fresh sqlite store at folder/mlflow.db (a copy of `template`), as a tracking URI."""
    target = folder / "mlflow.db"
    shutil.copyfile(template, target)
    return f"sqlite:///{target}"


@pytest.fixture
def sqlite_store_uri(tmp_path: Path, empty_store_file: Path) -> str:
    """This test's own sqlite store, tmp_path/mlflow.db, empty but for MLflow's Default experiment."""
    return copy_store(empty_store_file, tmp_path)


@pytest.fixture(scope="module")
def sqlite_tracking_uri(tmp_path_factory: pytest.TempPathFactory, empty_store_file: Path) -> str:
    """A sqlite store shared by a module; use one experiment per test."""
    return copy_store(empty_store_file, tmp_path_factory.mktemp("mlflow-sqlite"))


@pytest.fixture
def http_client_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fast-failing MLflow HTTP settings for this test only (restored afterwards)."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
