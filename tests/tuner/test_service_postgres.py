"""The tuning service on a real PostgreSQL server started in a temporary directory (initdb and
pg_ctl; as the user nobody when the tests run as root, which PostgreSQL refuses). Skipped,
with the reason, where psycopg is missing or no server can start."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from kdvfs.service.store import Database
from tests.tuner.conftest import free_port
from tests.tuner.service_process import ServiceProcess
from tests.tuner.test_service import TASK, key_of, open_session, plan_doc, session_body, tell_body

PG_START_TIMEOUT_S = 60


def _as_server_user(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    runuser = shutil.which("runuser")
    if runuser is None:
        pytest.skip("running as root and no runuser to start PostgreSQL as another user")
    return [runuser, "-u", "nobody", "--", *cmd]


@pytest.fixture(scope="module")
def postgres():
    pytest.importorskip("psycopg", reason="psycopg is not installed (pip install psycopg[binary])")
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if initdb is None or pg_ctl is None:
        pytest.skip("PostgreSQL's initdb and pg_ctl are not on PATH")
    # not under pytest's own tmp folder: that is 0700, closed to the server's user
    tmp = Path(tempfile.mkdtemp(prefix="kdvfs-pg-"))
    os.chmod(tmp, 0o777)
    data, port = tmp / "data", free_port()
    made = subprocess.run(
        _as_server_user([initdb, "-D", str(data), "-A", "trust", "-U", "kdvfs", "--no-sync"]),
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        pytest.skip(f"initdb failed: {made.stderr.strip().splitlines()[-1:]}")
    options = f"-k {tmp} -p {port} -c listen_addresses='' -c fsync=on"
    started = subprocess.run(
        _as_server_user(
            [
                pg_ctl,
                "-D",
                str(data),
                "-o",
                options,
                "-l",
                str(tmp / "log"),
                "-w",
                "-t",
                str(PG_START_TIMEOUT_S),
                "start",
            ]
        ),
        capture_output=True,
        text=True,
    )
    if started.returncode != 0:
        pytest.skip(f"PostgreSQL did not start: {(tmp / 'log').read_text()[-300:]}")
    yield f"postgresql+psycopg://kdvfs@/postgres?host={tmp}&port={port}"
    subprocess.run(_as_server_user([pg_ctl, "-D", str(data), "-m", "immediate", "stop"]), capture_output=True)
    shutil.rmtree(tmp, ignore_errors=True)


def test_the_service_on_postgresql_shares_decisions_stores_tells_once_and_versions_plans(postgres, tmp_path):
    server = ServiceProcess(tmp_path, postgres).start()
    try:
        with server.http() as http:
            sid = open_session(http, session_body("pg-job", ranks=2, signature="sig-pg"))
            assert http.post("/v1/sessions", json=session_body("pg-job", ranks=2, signature="sig-pg")).json()[
                "joined"
            ]
            a = http.post(f"/v1/sessions/{sid}/ask", json={"rank": 0, "task": TASK}).json()
            b = http.post(f"/v1/sessions/{sid}/ask", json={"rank": 1, "task": TASK}).json()
            assert a["config"] == b["config"] and b["shared"]
            body = tell_body(a["config"], 19.0)
            assert [http.post(f"/v1/sessions/{sid}/tell", json=body).json()["stored"] for _ in range(2)] == [
                True,
                False,
            ]
            doc = plan_doc(signature="sig-pg")
            key = key_of(doc)
            assert http.put(f"/v1/plans/{key}", json={"plan": doc}).json()["version"] == 1
            assert http.put(f"/v1/plans/{key}", json={"plan": doc, "expected_version": 0}).status_code == 409
            assert http.get(f"/v1/plans/{key}").json()["version"] == 1
            assert http.get(f"/v1/sessions/{uuid.uuid4().hex}").status_code == 404
            model = http.get(f"/v1/sessions/{sid}").json()["model_key"]
        server.kill()
        committed = Database(postgres).observations(model)  # another connection, the service gone
        assert [obs.config for _, _, obs in committed] == [a["config"]]
    finally:
        server.stop()
