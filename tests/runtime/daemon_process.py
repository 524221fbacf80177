"""Test helper: a real `kdvfs daemon` process on the fake NVML card, and what it did to it.

`DaemonProcess(tmp_path, *args)` starts `python -m kdvfs.cli daemon --socket ...` with
the fake card (KDVFS_NVML_MODULE=fake_pynvml) and waits until it answers; `calls()` reads
the NVML Set/Reset calls the fake recorded (each with its time.monotonic()).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from kdvfs.runtime.daemon_client import DAEMON_SOCKET_ENV, DaemonClient
from kdvfs.runtime.types import KdvfsError

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
START_TIMEOUT_S = 20.0
LOCK_CALLS = ["nvmlDeviceSetGpuLockedClocks", "nvmlDeviceSetMemoryLockedClocks"]
RESET_CALLS = ["nvmlDeviceResetGpuLockedClocks", "nvmlDeviceResetMemoryLockedClocks"]


def fake_nvml_env(calls: Path, gpu_count: int = 1) -> dict[str, str]:
    """The environment of a process that should see the fake card and record calls to FILE."""
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(REPO), str(HERE)]),
        KDVFS_NVML_MODULE="fake_pynvml",
        KDVFS_FAKE_NVML_CALLS=str(calls),
        KDVFS_FAKE_NVML_GPU_COUNT=str(gpu_count),
    )
    env.pop(DAEMON_SOCKET_ENV, None)
    return env


class DaemonProcess:
    """`kdvfs daemon` serving the fake card on tmp_path/daemon.sock, leases in tmp_path/leases."""

    def __init__(self, tmp_path: Path, *args: str, gpu_count: int = 1, wait: bool = True) -> None:
        self.socket = tmp_path / "daemon.sock"
        self.lease_dir = tmp_path / "leases"
        self.calls_file = tmp_path / "calls.jsonl"
        self.log = (tmp_path / "daemon.log").open("a")
        command = [sys.executable, "-m", "kdvfs.cli", "daemon", "--socket", str(self.socket)]
        command += ["--lease-dir", str(self.lease_dir), *args]
        self.process = subprocess.Popen(
            command, env=fake_nvml_env(self.calls_file, gpu_count), stdout=self.log, stderr=subprocess.STDOUT
        )
        self.pid = self.process.pid
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the daemon exited with {self.process.returncode}: {self.log_text()}")
            try:
                with DaemonClient(self.socket, timeout_s=1.0) as client:
                    client.status()
                return
            except KdvfsError:
                time.sleep(0.02)
        raise RuntimeError(f"the daemon did not answer within {START_TIMEOUT_S} s: {self.log_text()}")

    def client(self) -> DaemonClient:
        return DaemonClient(self.socket)

    def calls(self) -> list[dict]:
        if not self.calls_file.exists():
            return []
        return [json.loads(line) for line in self.calls_file.read_text().splitlines()]

    def fns(self) -> list[str]:
        return [call["fn"] for call in self.calls()]

    def wait_for_calls(self, count: int, timeout_s: float = 5.0) -> list[dict]:
        """The recorded calls once there are at least `count` (or whatever is there at timeout)."""
        deadline = time.monotonic() + timeout_s
        while len(calls := self.calls()) < count and time.monotonic() < deadline:
            time.sleep(0.002)
        return calls

    def lease_files(self) -> list[Path]:
        return sorted(self.lease_dir.glob("*.json")) if self.lease_dir.exists() else []

    def log_text(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=10)

    def stop(self) -> int:
        """SIGTERM, then its exit status."""
        if self.process.poll() is None:
            self.process.terminate()
        try:
            return self.process.wait(timeout=10)
        finally:
            self.log.close()
