"""`kdvfs calibrate --against-steps DIR`: each recorded whole training step (data/h200/steps/)
simulated at stock against its measured time and energy."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import pytest

from kdvfs.cli import main

STEPS = Path(__file__).resolve().parents[2] / "data" / "h200" / "steps"


def _one_step(folder: Path, shape: str) -> Path:
    """A folder of recorded steps holding only `shape` (the recording's own rows)."""
    folder.mkdir()
    summary = json.loads((STEPS / "steps_summary.json").read_text())
    summary["shapes"] = [s for s in summary["shapes"] if s["shape"] == shape]
    (folder / "steps_summary.json").write_text(json.dumps(summary))
    with gzip.open(STEPS / "steps_kernels.csv.gz", "rt", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["shape"] == shape]
    with gzip.open(folder / "steps_kernels.csv.gz", "wt", newline="") as f:
        out = csv.DictWriter(f, fieldnames=list(rows[0]))
        out.writeheader()
        out.writerows(rows)
    return folder


def test_a_recorded_step_is_printed_and_written_with_its_simulated_and_measured_time_and_energy(
    tmp_path, capsys
):
    folder = _one_step(tmp_path / "steps", "mlp_fp32_sgd")
    code = main(["calibrate", "--against-steps", str(folder), "--json", str(tmp_path / "c.json")])
    assert code == 0
    out = capsys.readouterr().out
    assert "simulated, stock clocks" in out and "measured on a real GPU" in out and "mlp_fp32_sgd" in out
    (row,) = json.loads((tmp_path / "c.json").read_text())["rows"]
    assert row["measured_step_s"] == pytest.approx(0.12464, rel=1e-3)  # the recording's own figure
    assert row["time_error"] == pytest.approx(row["simulated_time_s"] / row["measured_step_s"] - 1.0)
    assert abs(row["time_error"]) <= 0.05  # the simulated H200 holds this step's time to 5%
    assert row["energy_error"] == pytest.approx(row["simulated_energy_j"] / row["measured_energy_j"] - 1.0)


def test_a_folder_without_its_kernel_trace_is_refused_in_one_line(tmp_path, capsys):
    folder = _one_step(tmp_path / "steps", "mlp_fp32_sgd")
    (folder / "steps_kernels.csv.gz").unlink()
    assert main(["calibrate", "--against-steps", str(folder)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no steps_kernels.csv.gz" in err[0]
