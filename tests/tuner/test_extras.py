"""Optional parts and their extras (kdvfs/extras.py): a part whose extra is missing is refused
in one line that names the extra, exit 2, before any work; the core (`kdvfs.tune`, `kdvfs tune`)
imports no package that only an extra installs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kdvfs.cli import main
from kdvfs.extras import require_extra
from kdvfs.runtime.types import KdvfsError

#: Modules that only the extras install (service, agent, peers).
EXTRA_ONLY = ("fastapi", "uvicorn", "sqlalchemy", "httpx", "stable_baselines3", "sb3_contrib", "zeus")


def test_require_extra_names_the_extra_that_installs_a_missing_module(monkeypatch):
    monkeypatch.setitem(sys.modules, "fastapi", None)  # as if not installed
    with pytest.raises(KdvfsError) as err:
        require_extra("service", ["json", "fastapi"], "the tuning service")
    assert str(err.value) == "the tuning service needs the 'service' extra: pip install 'kdvfs[service]'"


@pytest.mark.parametrize(
    "argv, missing, line",
    [
        (
            ["serve", "--port", "0"],
            "fastapi",
            "kdvfs serve: error: the tuning service needs the 'service' extra: pip install 'kdvfs[service]'",
        ),
        (
            ["serve", "--port", "0", "--db", "postgresql+psycopg://kdvfs@127.0.0.1/kdvfs"],
            "psycopg",
            "kdvfs serve: error: a PostgreSQL database needs the 'postgres' extra: pip install 'kdvfs[postgres]'",
        ),
        (
            ["tune", "--service", "http://127.0.0.1:9", "--no-mlflow"],
            "httpx",
            "kdvfs tune: error: the tuning service's client (--service) needs the 'service' extra: "
            "pip install 'kdvfs[service]'",
        ),
        (
            ["compare", "--strategies", "ppo", "--no-mlflow"],
            "stable_baselines3",
            "kdvfs compare: error: the learning agent (ppo) needs the 'agent' extra: pip install 'kdvfs[agent]'",
        ),
        (
            ["peers", "kdvfs,zeus-power-limit", "--no-mlflow"],
            "zeus",
            "kdvfs peers: error: the zeus-power-limit peer needs the 'peers' extra: pip install 'kdvfs[peers]'",
        ),
    ],
    ids=["serve", "serve-postgres", "tune-service", "compare-ppo", "peers-zeus"],
)
def test_a_missing_extra_is_one_line_naming_it_and_exit_2(monkeypatch, capsys, argv, missing, line):
    monkeypatch.setitem(sys.modules, missing, None)  # as if not installed
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == line and captured.out == ""


def test_the_core_tune_imports_no_package_that_only_an_extra_installs(tmp_path):
    code = (
        "import sys, kdvfs; kdvfs.tune; from kdvfs.cli import main; "
        "code = main(['tune', '--device', 'sim:rtx3080ti', '--seconds', '20', '--no-mlflow']); "
        f"print('exit', code, 'loaded', ','.join(m for m in {EXTRA_ONLY!r} if m in sys.modules))"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=600
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "exit 0 loaded", res.stdout[-2000:]
