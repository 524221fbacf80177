"""schemathesis against a real `kdvfs serve`: no 5xx, and no impossible value accepted.

    python -m kdvfs.experiments.service_fuzz [--examples 200] [--steps 400] [--seed 1]

Starts `kdvfs serve` on 127.0.0.1 twice (SQLite in a temporary folder; MLflow tracking off):
once open (no token file) and once with a token file, the second fuzzed both with the token
and without it. Each is fuzzed by schemathesis from its own OpenAPI document:

- stateless: `examples` cases per operation, schema-valid (positive) and schema-invalid
  (negative) bodies, paths and headers;
- stateful: schemathesis's state machine (sessions opened, then asked, told, pooled, ended
  through the links it infers), `steps` scenarios.

Checks on every reply: no 5xx (`not_a_server_error`), schema-invalid data refused
(`negative_data_rejection`), replies that match the OpenAPI document, and `no_impossible_value`:
a 2xx reply to a request that carries a figure no GPU can produce (independent of
service/schema.py's own validation: the bounds below are restated here) is a failure.
Afterwards the database itself is read: every stored observation must have finite, positive
ratios. A rejection as schema-valid data (422 for a cross-field rule such as mean power) is
not a failure: the physical rules go beyond what the OpenAPI document can say.

`fuzz(url, token, ...)` is what the test suite runs (tests/service/test_service_fuzz.py),
bounded and derandomized. Prints JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: Bounds restated from docs/service.md (not imported: this check must not share the
#: service's own code). A time, s; a mean power, W; a clock, MHz; a host time, s.
TIME_S = (1e-7, 86_400.0)
POWER_W = (0.1, 10_000.0)
CORE_MHZ = (1, 5_000)
MEM_MHZ = (1, 30_000)
HOST_S = (0.0, 1e10)
MAX_RANKS = 4096
START_TIMEOUT_S = 60.0


def impossible(path: str, body: Any) -> str | None:
    """Why the request body of `path` carries a value no GPU can produce, or None."""
    if not isinstance(body, dict):
        return None

    def figure(x: Any) -> bool:
        return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)

    def time_ok(x: Any) -> bool:
        return figure(x) and TIME_S[0] <= x <= TIME_S[1]

    def power_ok(t: Any, e: Any) -> bool:
        return time_ok(t) and figure(e) and e > 0 and POWER_W[0] <= e / t <= POWER_W[1]

    task = body.get("task")
    if isinstance(task, dict) and not power_ok(task.get("ref_time_s"), task.get("ref_energy_j")):
        return f"task reference {task.get('ref_time_s')} s, {task.get('ref_energy_j')} J"
    if path.endswith("/tell") and not power_ok(body.get("time_s"), body.get("energy_j")):
        return f"measurement {body.get('time_s')} s, {body.get('energy_j')} J"
    if path.endswith("/sessions"):
        ranks = body.get("ranks", 1)
        if type(ranks) is not int or not 1 <= ranks <= MAX_RANKS:
            return f"ranks {ranks!r}"
        for pair in body.get("grid") or []:
            core, mem = pair
            if not (type(core) is int and type(mem) is int):
                return f"clock pair {pair!r}"
            if not (CORE_MHZ[0] <= core <= CORE_MHZ[1] and MEM_MHZ[0] <= mem <= MEM_MHZ[1]):
                return f"clock pair {pair!r} MHz"
    report = body.get("report")
    if path.endswith("/pool") and isinstance(report, dict):
        step_s = report.get("step_time_s")
        if not time_ok(step_s):
            return f"step time {step_s!r} s"
        end_s = report.get("end_s")
        if not (figure(end_s) and HOST_S[0] <= end_s <= HOST_S[1]):
            return f"end_s {end_s!r}"
        for g in report.get("group_times_s") or []:
            if not (figure(g) and 0 <= g <= step_s * 1.001 + TIME_S[0]):
                return f"group time {g!r} s in a step of {step_s} s"
        readings = report.get("counter_readings") or []
        for i, (t, e) in enumerate(readings):
            if not (figure(t) and figure(e) and t >= 0 and e >= 0):
                return f"counter reading {t!r} s, {e!r} J"
            if i and (t < readings[i - 1][0] or e < readings[i - 1][1]):
                return "a counter that runs backwards"
    return None


def _checks():
    import schemathesis
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import negative_data_rejection, response_schema_conformance

    @schemathesis.check
    def no_impossible_value(ctx, response, case) -> bool | None:
        if 200 <= response.status_code < 300:
            why = impossible(case.formatted_path, case.body if isinstance(case.body, dict) else None)
            assert why is None, f"accepted an impossible value: {why}"
        return None

    return [not_a_server_error, negative_data_rejection, response_schema_conformance, no_impossible_value]


def stored_impossible(db_path: Path) -> list[str]:
    """Stored observations whose ratios are not finite and positive, and stored task references
    outside the physical bounds."""
    with sqlite3.connect(db_path) as db:
        bad = [
            f"observation {i}: time ratio {t}, energy ratio {e}"
            for i, t, e in db.execute("select id, time_ratio, energy_ratio from observations")
            if not (math.isfinite(t) and math.isfinite(e) and t > 0 and e > 0)
        ]
        for key, t, e in db.execute("select task_key, ref_time_s, ref_energy_j from tasks"):
            if not (TIME_S[0] <= t <= TIME_S[1] and e > 0 and POWER_W[0] <= e / t <= POWER_W[1]):
                bad.append(f"task {key}: reference {t} s, {e} J")
    return bad


def fuzz(
    url: str,
    token: str | None = None,
    *,
    examples: int = 20,
    steps: int = 20,
    seed: int = 1,
    stateful: bool = True,
) -> dict:
    """Fuzz the service at url (with the bearer token, if any): stateless positive and negative
    cases, `examples` of each; then `steps` stateful scenarios. Derandomized by `seed`.
    Returns {"cases": n, "failures": [one line each], "statuses": {operation: {status: count}}}."""
    import hypothesis
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis import GenerationMode

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    checks = _checks()
    failures: list[str] = []
    cases = 0
    statuses: dict[str, dict[str, int]] = {}

    def tally(case, response) -> None:
        counts = statuses.setdefault(case.operation.label, {})
        counts[str(response.status_code)] = counts.get(str(response.status_code), 0) + 1

    common = settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
    )

    def stateless(operation, mode) -> None:
        @common
        @hypothesis.seed(seed)
        @given(case=operation.as_strategy(generation_mode=mode))
        def one(case) -> None:
            nonlocal cases
            cases += 1
            response = case.call(headers=headers, timeout=30)
            tally(case, response)
            try:
                case.validate_response(response, checks=checks)
            except Exception as exc:  # every failure is one line of the report
                failures.append(f"{mode.value} {operation.label}: {_first_line(exc)}")

        with contextlib.suppress(hypothesis.errors.Unsatisfiable):  # nothing to negate (GET /health)
            one()

    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        for result in schema.get_all_operations():
            stateless(result.ok(), mode)
    if stateful:
        machine = schema.as_state_machine()

        class Workflow(machine):  # type: ignore[misc, valid-type]
            def get_call_kwargs(self, case) -> dict[str, Any]:
                return {"headers": headers, "timeout": 30}

            def validate_response(self, response, case, additional_checks=None, **kwargs) -> None:
                nonlocal cases
                cases += 1
                tally(case, response)
                for check in checks:
                    try:
                        case.validate_response(response, checks=[check], transport_kwargs=kwargs or None)
                    except Exception as exc:
                        failures.append(f"stateful {case.operation.label}: {_first_line(exc)}")

        Workflow.run(
            settings=settings(
                max_examples=steps,
                derandomize=True,
                database=None,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                stateful_step_count=6,
            )
        )
    return {"cases": cases, "failures": sorted(set(failures)), "statuses": statuses}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    lines = [line.strip() for line in text if line.strip() and not line.startswith("-")]
    head = next((line for line in lines if "accepted an impossible" in line or "5xx" in line.lower()), None)
    return (head or (lines[0] if lines else type(exc).__name__))[:300]


class Served:
    """A `kdvfs serve` on 127.0.0.1 (SQLite in `folder`), started and stopped.

    Args:
        folder: where its database, token file and log go.
        port: its TCP port.
        tokens: a token file's lines (`TOKEN FLEET JOB`); None: open.
    """

    def __init__(self, folder: Path, port: int, tokens: list[str] | None = None) -> None:
        self.folder, self.port = Path(folder), port
        self.url = f"http://127.0.0.1:{port}"
        self.db = self.folder / f"fuzz-{port}.db"
        cmd = [
            sys.executable,
            "-m",
            "kdvfs.cli",
            "serve",
            "--port",
            str(port),
            "--db",
            f"sqlite:///{self.db}",
        ]
        if tokens is not None:
            token_file = self.folder / f"tokens-{port}"
            token_file.write_text("\n".join(tokens) + "\n")
            cmd += ["--token-file", str(token_file)]
        self.cmd = [*cmd, "--no-tracking", "--no-preload"]
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Served:
        import httpx

        log = (self.folder / f"serve-{self.port}.log").open("ab")
        self.proc = subprocess.Popen(self.cmd, cwd=self.folder, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kdvfs serve exited {self.proc.returncode}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        self.__exit__()
        raise RuntimeError(f"kdvfs serve did not answer in {START_TIMEOUT_S} s")

    def __exit__(self, *_exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self) -> str:
        return (self.folder / f"serve-{self.port}.log").read_text(errors="replace")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=200, help="stateless cases per operation and mode")
    parser.add_argument("--steps", type=int, default=400, help="stateful scenarios")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    token = "fuzz-token-0123456789abcdef"
    runs = {}
    started_s = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        with Served(Path(tmp), _free_port()) as open_service:
            runs["open"] = fuzz(open_service.url, examples=args.examples, steps=args.steps, seed=args.seed)
            runs["open"]["stored_impossible"] = stored_impossible(open_service.db)
            runs["open"]["internal_errors_logged"] = open_service.log().count("internal error")
        with Served(Path(tmp), _free_port(), [f"{token} fleet-a job-1"]) as guarded:
            runs["token"] = fuzz(guarded.url, token, examples=args.examples, steps=args.steps, seed=args.seed)
            runs["without_token"] = fuzz(
                guarded.url, examples=args.examples, steps=args.steps, seed=args.seed
            )
            runs["token"]["stored_impossible"] = stored_impossible(guarded.db)
            runs["token"]["internal_errors_logged"] = guarded.log().count("internal error")
    print(
        json.dumps(
            {
                "what": "schemathesis against a real kdvfs serve on 127.0.0.1 (SQLite)",
                "examples_per_operation": args.examples,
                "stateful_scenarios": args.steps,
                "seed": args.seed,
                "wall_s": round(time.monotonic() - started_s, 1),
                "runs": runs,
                "ok": all(not r["failures"] and not r.get("stored_impossible") for r in runs.values()),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
