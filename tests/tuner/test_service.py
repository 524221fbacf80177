"""The tuning service (`kdvfs serve`) as a real process on loopback: sessions, ask/tell shared
by ranks and jobs, plans, auth, validation, limits, and the kill -9 restart."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
import uuid

import pytest

from kdvfs.service.schema import plan_key
from tests.tuner.service_process import ServiceProcess

GRID = [[900, 5000], [1200, 5000], [1500, 9000], [1800, 9000], [2100, 9500]]
TASK = {"key": "group0@0/0", "ref_time_s": 0.05, "ref_energy_j": 20.0, "budget": 0.02}
TOKENS = {
    "a1": "tok-fleet-a-job-1-0123456789",
    "a2": "tok-fleet-a-job-2-0123456789",
    "b1": "tok-fleet-b-job-1-0123456789",
    "rate": "tok-fleet-c-rated-0123456789",
}


def session_body(job: str, ranks: int = 1, signature: str = "sig0") -> dict:
    return {
        "job": job,
        "gpu_name": "NVIDIA GeForce RTX 3080 Ti",
        "grid": GRID,
        "workload_name": "gpt3-xl-layer",
        "workload_signature": signature,
        "budget": 0.01,
        "ranks": ranks,
        "strategy": "ucb",
    }


def tell_body(config: int, energy_j: float, rank: int = 0, tell_id: str | None = None) -> dict:
    return {
        "tell_id": tell_id or uuid.uuid4().hex,
        "rank": rank,
        "task": TASK,
        "config": config,
        "time_s": 0.05,
        "energy_j": energy_j,
    }


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("service")
    server = ServiceProcess(tmp, f"sqlite:///{tmp / 'service.db'}").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("guarded")
    lines = [
        "# token fleet job",
        *(f"{t} fleet-{k[0] if k != 'rate' else 'c'} {k}" for k, t in TOKENS.items()),
    ]
    (tmp / "tokens").write_text("\n".join(lines) + "\n")
    mlflow_uri = f"sqlite:///{tmp / 'mlflow.db'}"
    server = ServiceProcess(
        tmp,
        f"sqlite:///{tmp / 'service.db'}",
        *("--token-file", "tokens", "--rate", "5", "--burst", "12", "--mlflow-uri", mlflow_uri),
    )
    server.mlflow_uri = mlflow_uri
    from mlflow import MlflowClient

    MlflowClient(mlflow_uri).search_experiments()  # the store made before the service opens it
    yield server.start(tracking=True)
    server.stop()


def open_session(http, body: dict) -> str:
    reply = http.post("/v1/sessions", json=body)
    assert reply.status_code == 201, reply.text
    return reply.json()["session_id"]


def test_health_answers_and_the_api_is_documented_in_openapi(service):
    with service.http() as http:
        assert http.get("/health").json()["database"] == "ok"
        paths = http.get("/openapi.json").json()["paths"]
    assert {"/v1/sessions", "/v1/sessions/{session_id}/ask", "/v1/plans/{key}"} <= set(paths)


def test_ranks_of_one_job_join_one_session_share_each_decision_and_pool_their_readings(service):
    with service.http() as http:
        first = open_session(http, session_body("dp-job", ranks=2, signature="sig-dp"))
        second = http.post("/v1/sessions", json=session_body("dp-job", ranks=2, signature="sig-dp")).json()
        assert second["session_id"] == first and second["joined"]
        a = http.post(f"/v1/sessions/{first}/ask", json={"rank": 0, "task": TASK}).json()
        b = http.post(f"/v1/sessions/{first}/ask", json={"rank": 1, "task": TASK}).json()
        assert a["config"] == b["config"] and b["shared"]
        told = [
            http.post(f"/v1/sessions/{first}/tell", json=tell_body(a["config"], 19.0, r)).json()
            for r in (0, 1)
        ]
        assert [t["observations"] for t in told] == [1, 2]  # two ranks: two samples of one config
        after = http.post(f"/v1/sessions/{first}/ask", json={"rank": 0, "task": TASK}).json()
        assert after["config"] != a["config"] and not after["shared"]


def test_a_new_job_of_the_same_gpu_and_workload_starts_from_what_the_fleet_measured(service):
    with service.http() as http:
        first = open_session(http, session_body("job-1", signature="sig-share"))
        for config, energy in ((4, 20.0), (3, 18.5), (2, 17.0)):
            http.post(f"/v1/sessions/{first}/tell", json=tell_body(config, energy))
        http.post(f"/v1/sessions/{first}/end")
        reply = http.post("/v1/sessions", json=session_body("job-2", signature="sig-share")).json()
        assert reply["observations"] == 3 and not reply["joined"]
        best = http.post(f"/v1/sessions/{reply['session_id']}/best", json={"task": TASK}).json()
        assert best["config"] == 2
        other = http.post("/v1/sessions", json=session_body("job-3", signature="sig-other")).json()
        assert other["observations"] == 0  # another workload: another model


def test_a_retried_tell_is_stored_once(service):
    with service.http() as http:
        sid = open_session(http, session_body("retry-job", signature="sig-retry"))
        body = tell_body(1, 19.0)
        replies = [http.post(f"/v1/sessions/{sid}/tell", json=body).json() for _ in range(3)]
        assert [r["stored"] for r in replies] == [True, False, False]
        assert http.get(f"/v1/sessions/{sid}").json()["observations"] == 1


def test_concurrent_writers_lose_no_tell(service):
    with service.http() as http:
        sid = open_session(http, session_body("many-writers", ranks=8, signature="sig-conc"))

    def rank(r: int) -> None:
        with service.http() as http:
            for _ in range(10):
                assert (
                    http.post(f"/v1/sessions/{sid}/tell", json=tell_body(r % 5, 19.0, r)).status_code == 200
                )

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with service.http() as http:
        assert http.get(f"/v1/sessions/{sid}").json()["observations"] == 80


def plan_doc(grid=GRID, signature: str = "sig0") -> dict:
    return {
        "schema": "kdvfs-plan",
        "schema_version": 1,
        "gpu": {"name": "NVIDIA GeForce RTX 3080 Ti", "grid": grid},
        "workload": {"name": "w", "signature": signature, "kernels": ["k0", "k1"]},
        "budget": 0.01,
        "groups": [
            {
                "kernels": ["k0", "k1"],
                "core_mhz": 1500,
                "mem_mhz": 9000,
                "expected_time_s": 1.0,
                "expected_energy_j": 90.0,
            }
        ],
        "expected": {
            "energy_saving": 0.1,
            "slowdown": 0.005,
            "reference_time_s": 1.0,
            "reference_energy_j": 100.0,
        },
        "source": "simulated",
        "strategy": "botorch",
        "measurements": 12,
        "created": "2026-12-01T00:00:00+00:00",
    }


def key_of(doc: dict) -> str:
    from kdvfs.tuner.plan import plan_from_dict

    plan = plan_from_dict(doc, "test")
    return plan_key(plan.gpu_name, plan.grid, plan.workload_signature)


def test_plans_are_versioned_and_a_stale_put_is_refused(service):
    doc = plan_doc(signature="sig-plans")
    key = key_of(doc)
    with service.http() as http:
        assert http.get(f"/v1/plans/{key}").status_code == 404
        assert http.put(f"/v1/plans/{key}", json={"plan": doc}).json()["version"] == 1
        doc["measurements"] = 20
        assert http.put(f"/v1/plans/{key}", json={"plan": doc, "expected_version": 1}).json()["version"] == 2
        stale = http.put(f"/v1/plans/{key}", json={"plan": doc, "expected_version": 1})
        assert stale.status_code == 409
        assert http.get(f"/v1/plans/{key}").json()["plan"]["measurements"] == 20
        assert http.get(f"/v1/plans/{key}/versions/1").json()["plan"]["measurements"] == 12


def test_a_job_stores_and_fetches_its_fleets_plan_through_the_client(service):
    from kdvfs.runtime.types import ClockGrid, ClockPair
    from kdvfs.service.client import ServiceClient, fetch_plan, store_plan
    from kdvfs.tuner.plan import plan_from_dict

    plan = plan_from_dict(plan_doc(signature="sig-client"), "test")
    client = ServiceClient(service.url)
    assert fetch_plan(client, plan.gpu_name, plan.grid, "sig-client") is None
    assert store_plan(client, plan) == 1 and store_plan(client, plan, expected_version=0) is None
    assert fetch_plan(client, plan.gpu_name, plan.grid, "sig-client") == plan
    other_grid = ClockGrid((*plan.grid.pairs, ClockPair(600, 5000)))
    assert fetch_plan(client, plan.gpu_name, other_grid, "sig-client") is None  # another key


def test_a_plan_is_refused_as_a_plan_file_would_be(service):
    doc = plan_doc(signature="sig-refuse")
    with service.http() as http:
        wrong_key = http.put(f"/v1/plans/{key_of(plan_doc(signature='sig-else'))}", json={"plan": doc})
        assert wrong_key.status_code == 422 and "does not fit" in wrong_key.json()["detail"]
        broken = dict(doc, groups=[dict(doc["groups"][0], core_mhz=1234)])  # a pair off the grid
        reply = http.put(f"/v1/plans/{key_of(doc)}", json={"plan": broken})
        assert reply.status_code == 422 and "1234" in reply.json()["detail"]


@pytest.mark.parametrize(
    "path, body, status",
    [
        ("/v1/sessions", {"job": "x"}, 422),
        ("/v1/sessions", dict(session_body("x"), grid=[[900, 5000], [900, 5000]]), 422),
        ("/v1/sessions", dict(session_body("x"), budget=float("nan")), 422),
        ("/v1/sessions", dict(session_body("x"), extra=1), 422),
        ("/v1/sessions", dict(session_body("x"), job="a;drop table"), 422),
    ],
)
def test_invalid_requests_are_refused_in_one_line_without_internals(service, path, body, status):
    with service.http() as http:
        reply = http.post(
            path, content=json.dumps(body, allow_nan=True), headers={"content-type": "application/json"}
        )
    assert reply.status_code == status
    detail = reply.json()["detail"]
    assert isinstance(detail, str) and "Traceback" not in detail and "sqlalchemy" not in detail.lower()


def test_a_tell_outside_the_grid_or_the_ranks_is_refused(service):
    with service.http() as http:
        sid = open_session(http, session_body("bounds-job", signature="sig-bounds"))
        assert http.post(f"/v1/sessions/{sid}/tell", json=tell_body(len(GRID), 19.0)).status_code == 422
        assert http.post(f"/v1/sessions/{sid}/tell", json=tell_body(0, 19.0, rank=1)).status_code == 422
        assert http.post(f"/v1/sessions/{uuid.uuid4().hex}/tell", json=tell_body(0, 19.0)).status_code == 404


def test_a_body_over_the_limit_is_refused_before_it_is_read(service):
    with service.http() as http:
        reply = http.post(
            "/v1/sessions",
            content=b"{" + b" " * 2_000_000 + b"}",
            headers={"content-type": "application/json"},
        )
    assert reply.status_code == 413


def test_without_a_token_or_with_a_wrong_one_nothing_is_read_or_written(guarded):
    with guarded.http() as http:
        assert http.post("/v1/sessions", json=session_body("x")).status_code == 401
        assert http.get("/health").status_code == 200  # health tells nothing about sessions
    with guarded.http("not-a-token-0123456789") as http:
        assert http.post("/v1/sessions", json=session_body("x")).status_code == 401
        assert http.get(f"/v1/plans/{key_of(plan_doc())}").status_code == 401


def test_another_fleets_token_reads_and_writes_nothing_of_this_fleet(guarded):
    doc = plan_doc(signature="sig-fleet")
    key = key_of(doc)
    with guarded.http(TOKENS["a1"]) as a1, guarded.http(TOKENS["a2"]) as a2, guarded.http(TOKENS["b1"]) as b1:
        sid = open_session(a1, session_body("fleet-a-job", signature="sig-fleet"))
        a1.post(f"/v1/sessions/{sid}/tell", json=tell_body(2, 17.0))
        assert a1.put(f"/v1/plans/{key}", json={"plan": doc}).status_code == 200
        assert b1.get(f"/v1/sessions/{sid}").status_code == 404
        assert b1.post(f"/v1/sessions/{sid}/tell", json=tell_body(1, 1.0)).status_code == 404
        assert b1.post(f"/v1/sessions/{sid}/ask", json={"task": TASK}).status_code == 404
        assert b1.get(f"/v1/plans/{key}").status_code == 404
        assert b1.put(f"/v1/plans/{key}", json={"plan": doc}).json()["version"] == 1  # its own store
        assert (
            b1.post("/v1/sessions", json=session_body("fleet-b-job", signature="sig-fleet")).json()[
                "observations"
            ]
            == 0
        )
        assert a2.get(f"/v1/sessions/{sid}").json()["observations"] == 1  # same fleet, other job
        assert a2.get(f"/v1/plans/{key}").json()["version"] == 1


def test_every_session_is_one_mlflow_run_logged_by_the_service(guarded):
    from mlflow import MlflowClient

    with guarded.http(TOKENS["a2"]) as http:
        sid = open_session(http, session_body("tracked-job", signature="sig-tracked"))
        for energy in (19.0, 18.0):
            http.post(f"/v1/sessions/{sid}/tell", json=tell_body(1, energy))
        http.post(f"/v1/sessions/{sid}/end")
    client = MlflowClient(guarded.mlflow_uri)
    deadline = time.monotonic() + 90.0
    runs = []
    while time.monotonic() < deadline:
        experiment = client.get_experiment_by_name("kdvfs-service")
        if experiment is not None:
            runs = client.search_runs([experiment.experiment_id], f"tags.`kdvfs.session` = '{sid}'")
            if runs and runs[0].info.status == "FINISHED":
                break
        time.sleep(0.5)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    history = client.get_metric_history(runs[0].info.run_id, "energy_ratio")
    assert [m.value for m in sorted(history, key=lambda m: m.step)] == [19.0 / 20.0, 18.0 / 20.0]
    assert runs[0].data.params["workload_signature"] == "sig-tracked"


def test_a_token_over_its_rate_is_answered_429_and_others_are_not(guarded):
    with guarded.http(TOKENS["rate"]) as rated, guarded.http(TOKENS["a2"]) as other:
        codes = [rated.get(f"/v1/plans/{'k' * 20}").status_code for _ in range(30)]
        assert 429 in codes and codes[0] == 404
        assert other.get(f"/v1/plans/{'k' * 20}").status_code == 404


def test_a_call_with_room_in_its_timeout_waits_out_the_rate_limit_and_a_plain_one_fails_at_it(guarded):
    from kdvfs.service.client import ServiceClient, ServiceDown, ServiceRefused

    plan = f"/v1/plans/{'k' * 20}"
    patient = ServiceClient(guarded.url, TOKENS["rate"])
    for _ in range(20):  # beyond the token's burst of 12 at 5 requests/s: the service answers each
        with pytest.raises(ServiceRefused, match="HTTP 404"):
            patient.call("GET", plan, timeout_s=10.0)
    assert patient.failures == 0
    hasty = ServiceClient(guarded.url, TOKENS["rate"])
    with pytest.raises(ServiceDown, match="HTTP 429"):
        for _ in range(40):
            with contextlib.suppress(ServiceRefused):
                hasty.call("GET", plan)


def test_a_non_loopback_bind_without_a_token_file_is_refused(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kdvfs.cli",
            "serve",
            "--host",
            "0.0.0.0",
            "--db",
            f"sqlite:///{tmp_path}/x.db",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "without --token-file" in result.stderr


def test_after_kill_9_and_a_restart_no_acknowledged_tell_is_lost(tmp_path):
    server = ServiceProcess(tmp_path, f"sqlite:///{tmp_path / 'service.db'}").start()
    acknowledged = []
    try:
        with server.http() as http:
            sid = open_session(http, session_body("killed-job", ranks=4))
            stop = threading.Event()

            def rank(r: int) -> None:
                with server.http() as h:
                    while not stop.is_set():
                        body = tell_body(r, 19.0, r)
                        try:
                            reply = h.post(f"/v1/sessions/{sid}/tell", json=body)
                        except Exception:
                            return
                        if reply.status_code == 200:
                            acknowledged.append(body["tell_id"])

            threads = [threading.Thread(target=rank, args=(r,)) for r in range(4)]
            for t in threads:
                t.start()
            while len(acknowledged) < 20:
                threads[0].join(0.02)
            server.kill()
            stop.set()
            for t in threads:
                t.join()
        server.start()
        with server.http() as http:
            held = http.post("/v1/sessions", json=session_body("killed-job", ranks=4)).json()
            assert held["joined"] and held["observations"] >= len(acknowledged)
            for tell_id in acknowledged[-5:]:  # a retry after the restart counts once
                body = dict(tell_body(0, 19.0), tell_id=tell_id)
                assert http.post(f"/v1/sessions/{sid}/tell", json=body).json()["stored"] is False
    finally:
        server.stop()


# --- the job's client ------------------------------------------------------------------------------
class Clock:
    """Monotonic seconds a test moves by hand (the client's back-off)."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def simulated_job_tuner(policy_of=None, seconds: float = 90.0):
    """A StepTuner with the ucb strategy on the simulated 3080 Ti layer after `seconds` of
    training; policy_of(device, workload) makes its policy (None: the tuner's own)."""
    from kdvfs.runtime.registry import open_device, open_workload
    from kdvfs.runtime.steps import SimulatedJob
    from kdvfs.tuner.run import Card, TuningRun

    device = open_device("sim:rtx3080ti", seed=3)
    workload = open_workload("gpt3-xl-layer", device)
    tuner = TuningRun(
        Card.of(device),
        workload,
        strategy="ucb" if policy_of is None else policy_of(device, workload),
        seed=3,
    ).tuner
    job = SimulatedJob(device, workload)
    job.run(tuner, seconds=seconds)
    return tuner, job


def job_strategy(url: str, device, workload, job: str, token: str | None = None, clock=None):
    from kdvfs.service.client import ServiceClient, service_strategy

    client = ServiceClient(url, token, **({"clock": clock} if clock else {}))
    return service_strategy(
        client,
        job=job,
        gpu_name=device.name,
        pairs=device.grid.pairs,
        workload=workload,
        budget=0.01,
        strategy="ucb",
        seed=3,
    )


def test_a_job_whose_service_is_down_tunes_exactly_as_it_would_alone(tmp_path):
    from tests.tuner.conftest import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    policies = []

    def through_dead_service(device, workload):
        policies.append(job_strategy(dead, device, workload, "lonely-job"))
        return policies[0]

    alone, alone_job = simulated_job_tuner()
    served, served_job = simulated_job_tuner(through_dead_service)
    assert served_job.requests == alone_job.requests and served.phases == alone.phases
    assert policies[0].answers["local"] >= 1 and policies[0].answers["service"] == 0
    assert policies[0].client.failures <= 2  # the back-off spared the other calls
    assert len(policies[0].outbox) >= 1  # its tells wait to be reported


def test_a_job_tunes_through_the_service_and_every_trial_is_stored(service):
    policies = []

    def served(device, workload):
        policies.append(job_strategy(service.url, device, workload, "served-job"))
        return policies[0]

    tuner, _ = simulated_job_tuner(served, seconds=150.0)  # past the reference (20-60 s) and a trial
    policy = policies[0]
    policy.end()
    assert policy.answers["service"] >= 1 and policy.answers["local"] == 0 and not policy.outbox
    with service.http() as http:
        info = http.get(f"/v1/sessions/{policy.session_id}").json()
    assert info["ended"] and info["observations"] == len(policy.local.log(tuner.phase.task).order) >= 1


def test_tells_made_while_the_service_was_down_reach_it_when_it_returns(tmp_path):
    from kdvfs.policies.base import Task
    from kdvfs.runtime.registry import open_device, open_workload

    server = ServiceProcess(tmp_path, f"sqlite:///{tmp_path / 'service.db'}")
    device = open_device("sim:rtx3080ti")
    workload = open_workload("gpt3-xl-layer", device)
    clock = Clock()
    policy = job_strategy(server.url, device, workload, "late-job", clock=clock)
    task = Task("group0@0/0", 0.05, 20.0, 0.02)
    first = policy.ask(task)
    policy.tell(task, first, 0.05, 19.0)
    second = policy.ask(task)
    policy.tell(task, second, 0.05, 18.0)
    assert policy.answers == {"service": 0, "local": 2} and len(policy.outbox) == 2
    server.start()
    try:
        clock.now_s = 1e6  # past the back-off
        policy.ask(task)
        assert policy.answers["service"] == 1 and not policy.outbox
        with server.http() as http:
            assert http.get(f"/v1/sessions/{policy.session_id}").json()["observations"] == 2
    finally:
        server.stop()


def test_a_job_whose_token_is_refused_tunes_locally(guarded):
    from kdvfs.policies.base import Task
    from kdvfs.runtime.registry import open_device, open_workload

    device = open_device("sim:rtx3080ti")
    workload = open_workload("gpt3-xl-layer", device)
    policy = job_strategy(guarded.url, device, workload, "no-token-job", token="wrong-token-0123456789")
    task = Task("group0@0/0", 0.05, 20.0, 0.02)
    assert policy.ask(task) is not None
    assert policy.answers == {"service": 0, "local": 1} and "401" in policy.refused


def test_the_jobs_client_loads_no_server_library():
    code = "import sys, kdvfs.service.client; print(sorted({'fastapi', 'uvicorn', 'sqlalchemy'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "[]", result.stderr


@pytest.mark.parametrize(
    "content, problem",
    [
        (None, "cannot read the token file"),
        ("tok-0123456789abcdef fleet\n", "expected `TOKEN FLEET JOB`"),
        ("short fleet job\n", "shorter than 16"),
        ("# nothing\n", "no tokens"),
    ],
    ids=["missing", "two-words", "short", "empty"],
)
def test_a_bad_token_file_is_one_line_and_exit_2(tmp_path, capsys, content, problem):
    from kdvfs import cli

    tokens = tmp_path / "tokens"
    if content is not None:
        tokens.write_text(content)
    code = cli.main(["serve", "--token-file", str(tokens), "--db", f"sqlite:///{tmp_path / 'x.db'}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and problem in err
