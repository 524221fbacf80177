"""The real-GPU inputs experiment runs end to end against the fake NVML, on the CPU, and
changes no setting."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_h200_inputs_smoke_run_reads_only(tmp_path):
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests" / "runtime")]),
        KDVFS_NVML_MODULE="fake_pynvml",
    )
    out = subprocess.run(
        [sys.executable, "-m", "kdvfs.experiments.h200_inputs", "--device", "cpu", "--size", "32",
         "--steady-s", "1.5", "--step-s", "1", "--out", str(tmp_path)],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "h200_inputs.json").read_text())
    assert doc["source"] == "measured" and doc["clock_calls_made"] == 0
    assert doc["power_limit_w_seen"] == [700.0] and doc["steady"]["alarms_at_s"] == []
    readings = json.loads((tmp_path / "readings.json").read_text())
    # polled in both phases (each starts with a read: at least one each however busy the host;
    # 0.1 s apart on a quiet one), the step phase after the 1.5 s of steady load
    assert len(readings) >= 2 and readings[-1][0] >= 1.5 and all(r[2] == 700.0 for r in readings)
