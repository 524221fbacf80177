"""The tuning service under load: simulated ranks asking and telling, and its faults.

    python -m kdvfs.experiments.service_load [--jobs 32 --ranks-per-job 8] [--seconds 30] [--think-s 1]
    python -m kdvfs.experiments.service_load --fault kill        # SIGKILL under load, then restart
    python -m kdvfs.experiments.service_load --fault read-only   # the database file made read-only

Starts a real `kdvfs serve` on loopback (SQLite in a temporary folder, one token per job) and
runs jobs x ranks simulated ranks in one asyncio process: each joins its job's session, asks
for its next config, "trains" think-s, tells a synthetic measurement (with a tell id), and
asks again (a new task once its strategy converged). A tell is retried until acknowledged; a
failed ask is answered by the rank itself (the job tunes locally), so ranks carry on through
a fault. Reported: per operation p50 / p99 / max latency, the error count by kind, requests
per second, and, from the database afterwards, acknowledged tells that are missing (lost).
--fault kill: SIGKILL at half time and a restart at once. --fault read-only: after half
time the service is stopped, its database file made read-only (0444) and the service started
again (under root, without the capabilities that let root ignore file modes: setpriv); what
the ranks see then.
Prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import numpy as np

from kdvfs.runtime.registry import open_device

#: Longest wait for the service to answer /health after a start; s.
START_TIMEOUT_S = 60.0
#: Longest a rank waits for one reply; s.
CALL_TIMEOUT_S = 10.0
#: Wait before a rank retries a failed call; s.
RETRY_S = 0.2
#: Root without the capabilities that override file modes: a read-only file is read-only to it.
UNPRIVILEGED = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner"]
#: Time a rank's job may still deliver its last tells after the run; s.
GRACE_S = 30.0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Service:
    """A `kdvfs serve` process in `folder` (without root's file overrides once `unprivileged`)."""

    def __init__(self, folder: Path, port: int, tokens: Path) -> None:
        self.folder, self.port, self.tokens = folder, port, tokens
        self.unprivileged = False
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> float:
        """Start it; seconds until /health answered (nan when it exited: see output)."""
        cmd = [sys.executable, "-m", "kdvfs.cli", "serve", "--port", str(self.port)]
        cmd += [
            "--db",
            f"sqlite:///{self.folder / 'service.db'}",
            "--token-file",
            str(self.tokens),
            "--no-tracking",
            "--no-preload",
        ]
        if self.unprivileged and os.geteuid() == 0:
            cmd = [*UNPRIVILEGED, *cmd]
        self.out = (self.folder / "serve.log").open("ab")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, cwd=self.folder, stdout=self.out, stderr=subprocess.STDOUT)
        while time.monotonic() - t0 < START_TIMEOUT_S:
            if self.proc.poll() is not None:
                return float("nan")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return time.monotonic() - t0
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError("kdvfs serve did not answer")

    def cpu_s(self) -> float:
        """CPU seconds (user + system) of the service process so far (Linux /proc)."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self) -> str:
        return (self.folder / "serve.log").read_text(errors="replace")[-400:]


class Stats:
    def __init__(self) -> None:
        self.latency_s: dict[str, list[float]] = {"session": [], "ask": [], "tell": []}
        self.errors: dict[str, int] = {}
        self.details: dict[str, str] = {}
        self.acknowledged: list[str] = []
        self.local_answers = 0

    def error(self, kind: str, detail: str = "") -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1
        if detail:
            self.details.setdefault(kind, detail[:160])


def synthetic(config: int, grid: np.ndarray, rng: random.Random) -> tuple[float, float]:
    """A measurement of a group at a config: time and energy ratios to stock, 1% noise."""
    core, mem = grid[config] / grid.max(axis=0)
    time_ratio = 0.7 / core + 0.3 / mem
    energy_ratio = time_ratio * (0.35 + 0.45 * core**2 + 0.2 * mem)
    return time_ratio * (1 + 0.01 * rng.gauss(0, 1)), energy_ratio * (1 + 0.01 * rng.gauss(0, 1))


class Connection:
    """One rank's keep-alive HTTP/1.1 connection, written by hand on asyncio streams: httpx's
    async pool spends more CPU per request than the service does, so with it the load
    generator, not the service, set the latency on this 2-core machine."""

    def __init__(self, url: str, token: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.host, self.port = host, int(port)
        self.head = f"Host: {host}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: dict) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port), CALL_TIMEOUT_S
            )
        data = json.dumps(body).encode()
        self.writer.write(
            f"POST {path} HTTP/1.1\r\n{self.head}Content-Length: {len(data)}\r\n\r\n".encode() + data
        )
        await self.writer.drain()
        line = await self.reader.readline()
        if not line:
            raise ConnectionResetError("closed by the service")
        status = int(line.split()[1])
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def call(conn: Connection, stats: Stats, op: str, path: str, body: dict) -> dict | None:
    t0 = time.perf_counter()
    try:
        status, reply = await asyncio.wait_for(conn.post(path, body), CALL_TIMEOUT_S)
    except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError, IndexError) as exc:
        conn.close()
        stats.error(f"{op}: {type(exc).__name__}")
        return None
    if status >= 300:
        stats.error(f"{op}: HTTP {status}", reply.decode(errors="replace"))
        return None
    stats.latency_s[op].append(time.perf_counter() - t0)
    return json.loads(reply)


async def rank(
    args, job: int, r: int, url: str, token: str, grid: np.ndarray, stats: Stats, end_s: float
) -> None:
    """One rank: join the job's session, then ask, train think-s, tell, until end_s."""
    rng = random.Random(job * 1000 + r)
    http = Connection(url, token)
    session = {
        "job": f"job-{job}",
        "gpu_name": "load-gpu",
        "grid": grid.astype(int).tolist(),
        "workload_name": "load",
        "workload_signature": "load-signature",
        "budget": 0.01,
        "ranks": args.ranks_per_job,
        "strategy": args.strategy,
    }
    await asyncio.sleep(rng.uniform(0.0, args.ramp_s))  # jobs do not all start in one instant
    sid = None
    while sid is None and time.monotonic() < end_s:
        reply = await call(http, stats, "session", "/v1/sessions", session)
        sid = reply["session_id"] if reply else await asyncio.sleep(RETRY_S)
    group, outbox = 0, []
    while time.monotonic() < end_s:
        task = {"key": f"group{group}", "ref_time_s": 0.01, "ref_energy_j": 3.0, "budget": 0.05}
        reply = await call(http, stats, "ask", f"/v1/sessions/{sid}/ask", {"rank": r, "task": task})
        if reply is None:
            stats.local_answers += 1
            config = rng.randrange(len(grid))  # the job tunes locally meanwhile
        elif reply["config"] is None:
            group += 1
            continue
        else:
            config = reply["config"]
        await asyncio.sleep(args.think_s * rng.uniform(0.5, 1.5))
        t, e = synthetic(config, grid, rng)
        outbox.append(
            {
                "tell_id": uuid.uuid4().hex,
                "rank": r,
                "task": task,
                "config": config,
                "time_s": 0.01 * t,
                "energy_j": 3.0 * e,
            }
        )
        while outbox and time.monotonic() < end_s + GRACE_S:
            if await call(http, stats, "tell", f"/v1/sessions/{sid}/tell", outbox[0]) is None:
                if time.monotonic() >= end_s:
                    await asyncio.sleep(RETRY_S)
                    continue
                break  # deliver later; train on
            stats.acknowledged.append(outbox.pop(0)["tell_id"])


def percentiles(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    a = np.array(values) * 1000.0
    return {
        "n": len(values),
        "p50_ms": round(float(np.percentile(a, 50)), 2),
        "p99_ms": round(float(np.percentile(a, 99)), 2),
        "max_ms": round(float(a.max()), 2),
    }


async def _ranks(
    args,
    url: str,
    mine: list[tuple[int, int]],
    tokens: list[str],
    grid: np.ndarray,
    stats: Stats,
    end_s: float,
) -> None:
    await asyncio.gather(*(rank(args, j, r, url, tokens[j], grid, stats, end_s) for j, r in mine))


def _worker(
    args, url: str, mine: list[tuple[int, int]], tokens: list[str], grid: np.ndarray, end_s: float, out
) -> None:
    """One load process: its ranks on one event loop and one connection pool; its stats to out."""
    stats = Stats()
    asyncio.run(_ranks(args, url, mine, tokens, grid, stats, end_s))
    out.put((stats.latency_s, stats.errors, stats.details, stats.acknowledged, stats.local_answers))


def load(args, url: str, tokens: list[str], grid: np.ndarray, stats: Stats, fault) -> None:
    """Ranks spread over args.procs processes (one asyncio loop each); the fault in this one."""
    end_s = time.monotonic() + args.seconds
    everyone = [(j, r) for j in range(args.jobs) for r in range(args.ranks_per_job)]
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(args, url, everyone[i :: args.procs], tokens, grid, end_s, out))
        for i in range(args.procs)
    ]
    for proc in procs:
        proc.start()
    asyncio.run(fault(end_s))
    for _ in procs:
        latency, errors, details, acknowledged, local = out.get()
        for op, values in latency.items():
            stats.latency_s[op] += values
        for kind, n in errors.items():
            stats.errors[kind] = stats.errors.get(kind, 0) + n
        stats.details |= details
        stats.acknowledged += acknowledged
        stats.local_answers += local
    for proc in procs:
        proc.join()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=32)
    p.add_argument("--ranks-per-job", type=int, default=8)
    p.add_argument("--seconds", type=float, default=30.0, help="length of the load, s")
    p.add_argument(
        "--think-s", type=float, default=1.0, help="mean training time between a rank's ask and tell, s"
    )
    p.add_argument("--strategy", default="ucb")
    p.add_argument("--procs", type=int, default=4, help="load processes the ranks are spread over")
    p.add_argument("--ramp-s", type=float, default=5.0, help="ranks start spread over this, s")
    p.add_argument("--fault", choices=("none", "kill", "read-only"), default="none")
    args = p.parse_args()
    load_before = os.getloadavg()
    grid = np.array([[q.core_mhz, q.mem_mhz] for q in open_device("sim:rtx3080ti").grid.pairs], dtype=float)
    folder = Path(tempfile.mkdtemp(prefix="kdvfs-load-"))
    tokens = [f"load-token-{j:04d}-{uuid.uuid4().hex}" for j in range(args.jobs)]
    (folder / "tokens").write_text("".join(f"{t} load job-{j}\n" for j, t in enumerate(tokens)))
    os.chmod(folder / "tokens", 0o644)
    service = Service(folder, _free_port(), folder / "tokens")
    start_s = service.start()
    stats = Stats()
    fault_doc: dict = {"kind": args.fault}

    async def fault(end_s: float) -> None:
        if args.fault == "none":
            return
        await asyncio.sleep(args.seconds / 2)
        t0 = time.monotonic()
        if args.fault == "kill":
            service.kill()
        else:
            service.stop()
            os.chmod(folder / "service.db", 0o444)
            service.unprivileged = True
        up_s = await asyncio.to_thread(service.start)
        fault_doc["restart_to_health_s"] = round(up_s, 2) if up_s == up_s else None
        fault_doc["down_s"] = round(time.monotonic() - t0, 2)
        if up_s != up_s:
            fault_doc["service_output"] = service.log_tail()
        else:
            fault_doc["health"] = httpx.get(f"{service.url}/health").json()

    t0, cpu0_s = time.monotonic(), service.cpu_s()
    try:
        load(args, service.url, tokens, grid, stats, fault)
    finally:
        wall_s = time.monotonic() - t0
        cpu_s = service.cpu_s() - cpu0_s
        service.stop()
    db = sqlite3.connect(f"file:{folder / 'service.db'}?mode=ro", uri=True)
    stored = {row[0] for row in db.execute("select tell_id from observations")}
    db.close()
    requests = sum(len(v) for v in stats.latency_s.values()) + sum(stats.errors.values())
    doc = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_avg_before": load_before,
            "load_avg_at_end": os.getloadavg(),
        },
        "jobs": args.jobs,
        "ranks": args.jobs * args.ranks_per_job,
        "seconds": args.seconds,
        "think_s": args.think_s,
        "ramp_s": args.ramp_s,
        "load_processes": args.procs,
        "strategy": args.strategy,
        "service_start_s": round(start_s, 2),
        "requests_per_s": round(requests / wall_s, 1),
        "service_cpu_ms_per_request": round(1000 * cpu_s / max(requests, 1), 2),
        "latency": {op: percentiles(v) for op, v in stats.latency_s.items()},
        "errors": stats.errors,
        "error_details": stats.details,
        "ranks_answered_locally": stats.local_answers,
        "tells_acknowledged": len(stats.acknowledged),
        "acknowledged_tells_lost": len(set(stats.acknowledged) - stored),
        "fault": fault_doc,
    }
    print(json.dumps(doc, indent=2))
    if not os.environ.get("KDVFS_KEEP"):
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
