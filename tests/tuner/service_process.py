"""Test helper: a real `kdvfs serve` process on loopback that a test can start, kill and restart.

`ServiceProcess(tmp_path, db_url, *args)` runs `python -m kdvfs.cli serve --port P`
(a free port chosen here, or the one given), waits for /health, and `kill()` sends SIGKILL;
`http()` is an httpx client on its base URL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.tuner.conftest import free_port

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30.0


class ServiceProcess:
    """A `kdvfs serve` subprocess (MLflow tracking off unless start(tracking=True); strategies
    imported on first use: the tests use ucb, which needs no torch)."""

    def __init__(self, tmp: Path, db_url: str, *args: str, port: int | None = None) -> None:
        self.tmp, self.db_url, self.args = tmp, db_url, args
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, tracking: bool = False) -> ServiceProcess:
        cmd = [
            sys.executable,
            "-m",
            "kdvfs.cli",
            "serve",
            "--port",
            str(self.port),
            "--db",
            self.db_url,
        ]
        cmd += [*self.args, "--no-preload", *([] if tracking else ["--no-tracking"])]
        self.log = (self.tmp / f"serve-{self.port}.log").open("ab")
        self.proc = subprocess.Popen(cmd, cwd=self.tmp, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kdvfs serve exited {self.proc.returncode}: {self.output()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"kdvfs serve did not answer in {START_TIMEOUT_S} s: {self.output()}")

    def output(self) -> str:
        return (self.tmp / f"serve-{self.port}.log").read_text(errors="replace")

    def http(self, token: str | None = None) -> httpx.Client:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=10.0)

    def kill(self) -> None:
        """SIGKILL: no shutdown handler runs."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()
