"""The tuning service refuses every observation no GPU can produce, before it reaches the store;
the token is checked before the body is read; bodies over the limit (chunked too) are 413; a
pool that cannot complete is a status in a 200 body; schemathesis finds no 5xx and no accepted
impossible value (a real `kdvfs serve` on 127.0.0.1)."""

from __future__ import annotations

import json
import math
import socket
import uuid

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("schemathesis")

from kdvfs.experiments.service_fuzz import Served, fuzz, stored_impossible

GRID = [[900, 5000], [1200, 5000], [1500, 9000]]
TASK = {"key": "group0", "ref_time_s": 0.05, "ref_energy_j": 20.0, "budget": 0.02}
TOKEN = "tok-physical-0123456789abcdef"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    with Served(tmp_path_factory.mktemp("open"), _port()) as served:
        yield served


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    with Served(tmp_path_factory.mktemp("guarded"), _port(), [f"{TOKEN} fleet-a job-1"]) as served:
        yield served


def session(job: str, **change) -> dict:
    body = {
        "job": job,
        "gpu_name": "NVIDIA GeForce RTX 3080 Ti",
        "grid": GRID,
        "workload_name": "w",
        "workload_signature": f"sig-{job}",
        "budget": 0.01,
        "ranks": 2,
        "strategy": "ucb",
    }
    return body | change


def post(served, path: str, body: dict, token: str | None = None):
    import httpx

    headers = {"content-type": "application/json"} | ({"authorization": f"Bearer {token}"} if token else {})
    return httpx.post(
        f"{served.url}{path}", content=json.dumps(body, allow_nan=True), headers=headers, timeout=10
    )


def open_session(served, job: str) -> str:
    reply = post(served, "/v1/sessions", session(job))
    assert reply.status_code == 201, reply.text
    return reply.json()["session_id"]


def report(**change) -> dict:
    body = {
        "step": 0,
        "end_s": 12.5,
        "step_time_s": 0.4,
        "group_times_s": [0.1, 0.3],
        "counter_readings": [[12.2, 5000.0], [12.4, 5080.0]],
        "temperature_c": 60.0,
        "throttle_reasons": [],
        "power_limit_w": 350.0,
    }
    return body | change


@pytest.mark.parametrize(
    "change",
    [
        {"grid": [[82_329, 5000]]},
        {"grid": [[900, 0]]},
        {"ranks": 1427.0},
        {"ranks": 0},
        {"ranks": -3},
        {"ranks": 10**9},
    ],
    ids=["clock-82329-mhz", "memory-0-mhz", "ranks-1427.0", "ranks-0", "ranks-negative", "ranks-huge"],
)
def test_a_session_of_an_impossible_card_or_rank_count_is_refused_422(service, change):
    reply = post(service, "/v1/sessions", session("impossible", **change))
    assert reply.status_code == 422, reply.text
    assert "\n" not in reply.json()["detail"]


@pytest.mark.parametrize(
    "change",
    [
        {"time_s": 3e-100},
        {"time_s": 8e8},
        {"time_s": -0.05},
        {"time_s": math.nan},
        {"time_s": math.inf},
        {"energy_j": -20.0},
        {"energy_j": math.inf},
        {"energy_j": 1e-12},  # 20 pW over 50 ms: no card draws so little
        {"energy_j": 1e6},  # 20 MW over 50 ms
        {"config": 1.0},
        {"task": TASK | {"ref_time_s": 3e-100}},
        {"task": TASK | {"ref_energy_j": math.nan}},
    ],
    ids=lambda change: "-".join(f"{k}={v if not isinstance(v, dict) else 'task'}" for k, v in change.items()),
)
def test_a_tell_that_no_gpu_could_measure_is_refused_before_it_is_stored(service, change):
    sid = open_session(service, "tells")
    body = {
        "tell_id": uuid.uuid4().hex,
        "rank": 0,
        "task": TASK,
        "config": 0,
        "time_s": 0.05,
        "energy_j": 19.0,
    }
    reply = post(service, f"/v1/sessions/{sid}/tell", body | change)
    assert reply.status_code == 422, reply.text
    assert stored_impossible(service.db) == []
    good = post(service, f"/v1/sessions/{sid}/tell", body)
    assert good.status_code == 200 and good.json()["stored"], good.text


@pytest.mark.parametrize(
    "change",
    [
        {"step_time_s": 3e-100},
        {"group_times_s": [8e8]},
        {"group_times_s": [0.1, 0.5]},  # a group longer than its 0.4-s step
        {"group_times_s": [-0.1]},
        {"end_s": -1e9},
        {"end_s": math.inf},
        {"counter_readings": [[12.2, -5.0]]},
        {"counter_readings": [[12.2, 5080.0], [12.4, 5000.0]]},  # the counter runs backwards
        {"counter_readings": [[12.4, 5000.0], [12.2, 5080.0]]},  # time runs backwards
        {"temperature_c": 900.0},
        {"power_limit_w": -1.0},
        {"step": 1.0},
    ],
    ids=lambda change: "-".join(f"{k}" for k in change),
)
def test_a_step_report_that_no_gpu_could_produce_is_refused_422(service, change):
    sid = open_session(service, "pools")
    reply = post(service, f"/v1/sessions/{sid}/pool", {"rank": 0, "report": report(**change)})
    assert reply.status_code == 422, reply.text


def test_a_ranks_energy_counter_that_runs_backwards_across_its_reports_is_refused(service):
    sid = open_session(service, "counter")
    first = post(service, f"/v1/sessions/{sid}/pool", {"rank": 0, "report": report()})
    assert first.status_code == 200
    later = report(step=1, counter_readings=[[13.0, 4000.0]])
    reply = post(service, f"/v1/sessions/{sid}/pool", {"rank": 0, "report": later})
    assert reply.status_code == 422 and "backwards" in reply.json()["detail"]


def test_a_pool_that_cannot_complete_answers_incomplete_in_a_200_naming_the_missing_ranks(service):
    sid = open_session(service, "lonely")
    reply = post(service, f"/v1/sessions/{sid}/pool", {"rank": 0, "report": report()})
    assert reply.status_code == 200
    assert reply.json() == {"status": "incomplete", "reports": [], "missing": [1]}


def test_a_chunked_body_over_the_limit_is_refused_413(service):
    import httpx

    def chunks():
        for _ in range(3):
            yield b" " * 1_000_000

    reply = httpx.post(
        f"{service.url}/v1/sessions",
        content=chunks(),
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert reply.status_code == 413


def test_without_a_token_the_body_is_not_read_even_when_it_is_over_the_limit(guarded):
    import httpx

    def chunks():
        yield b" " * 3_000_000

    no_token = httpx.post(f"{guarded.url}/v1/sessions", content=chunks(), timeout=30)
    assert no_token.status_code == 401
    declared = httpx.post(f"{guarded.url}/v1/sessions", content=b" " * 3_000_000, timeout=30)
    assert declared.status_code == 401
    with_token = httpx.post(
        f"{guarded.url}/v1/sessions",
        content=b" " * 3_000_000,
        headers={"authorization": f"Bearer {TOKEN}"},
        timeout=30,
    )
    assert with_token.status_code == 413


def test_schemathesis_finds_no_server_error_and_no_accepted_impossible_value(service, guarded):
    """Bounded and derandomized: a few cases of each operation, positive and negative, open
    and with and without a token, then a few stateful scenarios
    (experiments/service_fuzz.py runs the long version)."""
    runs = {
        "open": fuzz(service.url, examples=4, steps=4, seed=1),
        "token": fuzz(guarded.url, TOKEN, examples=4, steps=4, seed=1),
        "without token": fuzz(guarded.url, examples=2, steps=2, seed=1, stateful=False),
    }
    assert {name: run["failures"] for name, run in runs.items()} == {name: [] for name in runs}
    assert all(run["cases"] > 20 for run in runs.values())
    assert set(runs["without token"]["statuses"]["POST /v1/sessions"]) == {"401"}
    assert stored_impossible(service.db) == stored_impossible(guarded.db) == []
