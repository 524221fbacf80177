"""`kdvfs tune --service`: a job asks and tells through a real `kdvfs serve` on loopback, stores
its converged plan there, and the next job starts from it; a service that is down costs the
job nothing but the service's answers."""

from __future__ import annotations

import json

import pytest

from kdvfs.cli import main
from tests.tuner.conftest import free_port
from tests.tuner.service_process import ServiceProcess

TOKEN = "tune-cli-token-0123456789abcdef"
ARGS = [
    "tune",
    "--device",
    "sim:rtx3080ti",
    "--strategy",
    "ucb",
    "--no-sweep",
    "--no-mlflow",
    "--prior",
    "none",
]


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tune-service")
    (tmp / "tokens").write_text(f"# token fleet job\n{TOKEN} fleet-t tune-jobs\n")
    server = ServiceProcess(tmp, f"sqlite:///{tmp / 'service.db'}", "--token-file", "tokens").start()
    yield server
    server.stop()


def tune(tmp_path, url: str, seed: int, seconds: int, *extra: str) -> dict:
    token_file = tmp_path / "token"
    token_file.write_text(f"{TOKEN}\n")
    out = tmp_path / f"tune-{seed}.json"
    args = [*ARGS, "--seed", str(seed), "--seconds", str(seconds), "--json", str(out)]
    assert main([*args, "--service", url, "--token-file", str(token_file), *extra]) == 0
    return json.loads(out.read_text())


def test_a_job_tunes_through_the_service_and_the_next_starts_from_the_plan_it_stored(service, tmp_path):
    first = tune(tmp_path, service.url, 0, 400)
    assert first["service"]["answers"]["service"] >= 3 and first["service"]["answers"]["local"] == 0
    assert first["service"]["tells_waiting"] == 0
    assert first["converged_after_s"] is not None and first["energy_saving"] > 0.02
    assert first["plan_stored"] == f"{service.url} version 1"
    with service.http(TOKEN) as http:
        info = http.get(f"/v1/sessions/{first['service']['session_id']}").json()
    # the service holds every measurement the job told it (its verifications, and a trial still
    # running when training ends, tell none)
    assert info["observations"] == first["service"]["told"] >= 3

    second = tune(tmp_path, service.url, 100, 150)
    assert second["prior"]["source"] == "store"
    assert second["prior"]["energy_saving"] == pytest.approx(first["energy_saving"])
    assert second["phases"][:2] == ["Reference", "Verifying"]  # the fleet's plan verified first
    assert second["converged_after_s"] < first["converged_after_s"]


def test_a_job_whose_service_is_down_tunes_alone_and_says_so(tmp_path, caplog):
    doc = tune(tmp_path, f"http://127.0.0.1:{free_port()}", 1, 60)
    assert doc["service"]["answers"]["service"] == 0 and doc["service"]["answers"]["local"] >= 1
    assert doc["max_cumulative_slowdown"] <= 0.01
    assert "tuning locally until it answers" in caplog.text


def test_a_token_file_without_a_service_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "token").write_text(TOKEN)
    assert main([*ARGS, "--seconds", "10", "--token-file", str(tmp_path / "token")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "need --service" in err
