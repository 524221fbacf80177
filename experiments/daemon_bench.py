"""The clock daemon's targets: round trip, reset after a client's SIGKILL, recovery.

Starts a real `kdvfs daemon` process on a temporary socket and measures, with real client
processes:
- the round trip of a clock change (`lock` on a held lease, alternating pairs), and of status;
- client SIGKILL while holding a lease -> the daemon's reset, per trial;
- daemon SIGKILL while a lease is held, then a restart -> whether the new daemon resets it
  before it answers (fake NVML only: a dry-run daemon writes no leases).

    python -m kdvfs.experiments.daemon_bench [--round-trips 5000] [--kill-trials 50]
    python -m kdvfs.experiments.daemon_bench --nvml real   # a real card, daemon in dry-run

With the fake NVML card (tests/runtime/fake_pynvml.py, the default) a reset's time is the
one the fake stamps on the call; with `--nvml real` the daemon runs in dry-run (it changes
nothing) and the reset is seen by polling status. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kdvfs.runtime.daemon_client import DAEMON_SOCKET_ENV, DaemonClient
from kdvfs.runtime.types import ClockPair, KdvfsError

FAKE_NVML_DIR = Path(__file__).resolve().parents[1] / "tests" / "runtime"
START_TIMEOUT_S = 30.0  # longest wait for a daemon to answer, s
RESET_TIMEOUT_S = 5.0  # longest wait for a reset after a kill, s
CLIENT = """
import sys, time
from kdvfs.runtime.daemon_client import DaemonClient
from kdvfs.runtime.types import ClockPair
client = DaemonClient(sys.argv[1])
client.lock(0, ClockPair(int(sys.argv[2]), int(sys.argv[3])))
print("locked", flush=True)
time.sleep(120)
"""


class Daemon:
    """A `kdvfs daemon` process in `folder`."""

    def __init__(self, folder: Path, fake: bool) -> None:
        self.socket = folder / "daemon.sock"
        self.calls_file = folder / "calls.jsonl"
        self.env = dict(os.environ)
        self.env.pop(DAEMON_SOCKET_ENV, None)
        if fake:
            self.env |= {
                "PYTHONPATH": os.pathsep.join(
                    filter(None, [str(FAKE_NVML_DIR), os.environ.get("PYTHONPATH")])
                ),
                "KDVFS_NVML_MODULE": "fake_pynvml",
                "KDVFS_FAKE_NVML_CALLS": str(self.calls_file),
            }
        command = [sys.executable, "-m", "kdvfs.cli", "daemon", "--socket", str(self.socket)]
        command += ["--lease-dir", str(folder / "leases")] + ([] if fake else ["--dry-run"])
        self.started_s = time.monotonic()
        self.process = subprocess.Popen(command, env=self.env, stderr=subprocess.DEVNULL)
        self.ready_s = self._wait_ready()

    def _wait_ready(self) -> float:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"daemon_bench: the daemon exited with status {self.process.returncode}")
            try:
                with DaemonClient(self.socket, timeout_s=1.0) as client:
                    client.status()
                return time.monotonic()
            except KdvfsError:
                time.sleep(0.01)
        raise SystemExit(f"daemon_bench: no daemon answered within {START_TIMEOUT_S} s")

    def resets_since(self, since_s: float) -> list[float]:
        """The fake's monotonic times of the GPU-lock resets after `since_s`."""
        if not self.calls_file.exists():
            return []
        calls = [json.loads(line) for line in self.calls_file.read_text().splitlines()]
        return [
            c["monotonic_s"]
            for c in calls
            if c["fn"] == "nvmlDeviceResetGpuLockedClocks" and c["monotonic_s"] >= since_s
        ]

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def summary_ms(values_s: list[float]) -> dict[str, float | int]:
    ms = sorted(v * 1000.0 for v in values_s)
    p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
    return {
        "n": len(ms),
        "p50": round(statistics.median(ms), 3),
        "p99": round(p99, 3),
        "max": round(ms[-1], 3),
        "mean": round(statistics.fmean(ms), 3),
    }


def pairs_of(client: DaemonClient) -> list[ClockPair]:
    """Two clock pairs this uid may lock on GPU 0: the floor and the ceiling of its range."""
    ranges = [r for r in client.hello().may_lock if r.gpu == 0]
    if not ranges:
        raise SystemExit("daemon_bench: this uid may lock nothing on GPU 0 (rules)")
    r = ranges[0]
    return [ClockPair(r.core_mhz[1], r.mem_mhz[1]), ClockPair(r.core_mhz[0], r.mem_mhz[1])]


def round_trips(daemon: Daemon, count: int) -> dict[str, object]:
    """Clock changes on a held lease, alternating pairs; and status requests."""
    with DaemonClient(daemon.socket) as client:
        pairs = pairs_of(client)
        for i in range(200):  # warm-up
            client.lock(0, pairs[i % 2])
        lock_s = []
        for i in range(count):
            start = time.perf_counter()
            client.lock(0, pairs[i % 2])
            lock_s.append(time.perf_counter() - start)
        status_s = []
        for _ in range(count // 5):
            start = time.perf_counter()
            client.status()
            status_s.append(time.perf_counter() - start)
        client.reset(0)
    return {"lock_ms": summary_ms(lock_s), "status_ms": summary_ms(status_s)}


def client_kills(daemon: Daemon, trials: int, fake: bool) -> dict[str, object]:
    """SIGKILL a client holding a lease; the time until the daemon has reset the clocks."""
    with DaemonClient(daemon.socket) as watcher:
        pair = pairs_of(watcher)[0]
        delays_s = []
        for _ in range(trials):
            client = subprocess.Popen(
                [sys.executable, "-c", CLIENT, str(daemon.socket), str(pair.core_mhz), str(pair.mem_mhz)],
                env=daemon.env,
                stdout=subprocess.PIPE,
                text=True,
            )
            if client.stdout.readline().strip() != "locked":
                raise SystemExit("daemon_bench: the client could not lock")
            killed_s = time.monotonic()
            client.send_signal(signal.SIGKILL)
            delays_s.append(_reset_seen(daemon, watcher, killed_s, fake) - killed_s)
            client.wait(timeout=10)
    how = "reset time stamped by the fake NVML" if fake else "status polled until the lease is gone"
    return {"reset_after_kill_ms": summary_ms(delays_s), "measured_as": how}


def _reset_seen(daemon: Daemon, watcher: DaemonClient, killed_s: float, fake: bool) -> float:
    deadline = killed_s + RESET_TIMEOUT_S
    while time.monotonic() < deadline:
        if fake:
            resets = daemon.resets_since(killed_s)
            if resets:
                return resets[0]
            time.sleep(0.0005)
        elif not watcher.status().gpus[0].leased:
            return time.monotonic()
    raise SystemExit(f"daemon_bench: no reset within {RESET_TIMEOUT_S} s of the kill")


def daemon_kills(folder: Path, trials: int) -> dict[str, object]:
    """SIGKILL the daemon while a client holds a lease; restart it; was the GPU reset before
    the new daemon answered?"""
    reset_before_ready, restart_to_reset_s = 0, []
    for _ in range(trials):
        first = Daemon(folder, fake=True)
        client = DaemonClient(first.socket)
        client.lock(0, pairs_of(client)[0])
        first.process.kill()
        first.process.wait(timeout=10)
        client.close()
        second = Daemon(folder, fake=True)
        resets = second.resets_since(second.started_s)
        if resets and resets[0] <= second.ready_s:
            reset_before_ready += 1
            restart_to_reset_s.append(resets[0] - second.started_s)
        second.stop()
    return {
        "trials": trials,
        "reset_before_the_new_daemon_answered": reset_before_ready,
        "restart_to_reset_ms": summary_ms(restart_to_reset_s) if restart_to_reset_s else None,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nvml", choices=("fake", "real"), default="fake")
    parser.add_argument("--round-trips", type=int, default=5000)
    parser.add_argument("--kill-trials", type=int, default=50)
    parser.add_argument("--restart-trials", type=int, default=5)
    args = parser.parse_args(argv)
    fake = args.nvml == "fake"
    with tempfile.TemporaryDirectory(prefix="kdvfs-daemon-bench-") as tmp:
        daemon = Daemon(Path(tmp), fake)
        try:
            result: dict[str, object] = {
                "nvml": "fake (tests/runtime/fake_pynvml.py)" if fake else "real, daemon in dry-run",
                "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs",
                "load_average_1min_at_start": round(os.getloadavg()[0], 2),
                "round_trip": round_trips(daemon, args.round_trips),
                "client_sigkill": client_kills(daemon, args.kill_trials, fake),
            }
        finally:
            daemon.stop()
        if fake:
            restart_dir = Path(tmp) / "restart"
            restart_dir.mkdir()
            result["daemon_sigkill_restart"] = daemon_kills(restart_dir, args.restart_trials)
    result["load_average_1min_at_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
