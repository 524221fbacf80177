"""fit_step_power: the in-step busy shares fitted to recorded whole steps, on a small synthetic
recording whose shares are known; bad input in one line."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import pytest

from kdvfs.experiments import fit_step_power
from kdvfs.runtime.simulator import SimulatedDevice
from kdvfs.tuner.calibration import recorded_steps, simulate_step

GEMM = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT"
GELU = "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl<float>>()"
COPY = "void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda()>()"
#: two steps of different mixes (name, us): one a third GEMM, one mostly streaming
MIXES = {
    "gemm_heavy": [(GEMM, 300.0), (GELU, 200.0), (COPY, 150.0), (GELU, 250.0)],
    "stream_heavy": [(GEMM, 60.0), (GELU, 300.0), (COPY, 250.0), (GELU, 200.0), (COPY, 150.0)],
    "short_kernels": [(GEMM, 8.0), (GELU, 4.0), (COPY, 6.0), (GELU, 3.0)] * 8,
}
SHARES = (0.8, 0.5)  # compute, stream: what the synthetic recording is made with
RAMP_US = 20.0  # and its kernels' ramp, us


def _recording(folder: Path) -> Path:
    """A folder of recorded steps whose measured time and energy are the simulated card's at
    SHARES and RAMP_US, so that a fit should find them again."""
    folder.mkdir()
    with gzip.open(folder / "steps_kernels.csv.gz", "wt", newline="") as f:
        out = csv.writer(f)
        out.writerow(["shape", "name", "start_us", "duration_us"])
        for shape, mix in MIXES.items():
            for step in range(3):
                starts_us = [1000.0 * step + 10.0 * i + sum(d for _, d in mix[:i]) for i in range(len(mix))]
                out.writerows([shape, name, t, d] for t, (name, d) in zip(starts_us, mix, strict=True))
    summary = {"shapes": [{"shape": s, "step_s": 1.0, "energy_per_step_j": 1.0} for s in MIXES]}
    (folder / "steps_summary.json").write_text(json.dumps(summary))
    for entry, step in zip(summary["shapes"], recorded_steps(folder), strict=True):
        row = simulate_step(
            SimulatedDevice("h200", noise=0.0), step, fit_step_power.shares_of(*SHARES), ramp_s=RAMP_US * 1e-6
        )
        entry["step_s"], entry["energy_per_step_j"] = row.simulated_time_s, row.simulated_energy_j
    (folder / "steps_summary.json").write_text(json.dumps(summary))
    return folder


def test_the_fit_finds_the_busy_shares_a_recording_was_made_with(tmp_path, capsys):
    folder = _recording(tmp_path / "steps")
    doc = fit_step_power.main(
        [
            "--steps",
            str(folder),
            "--block-trace",
            "none",
            "--fit-on",
            "gemm_heavy,stream_heavy,short_kernels",
            "--fit-time-on",
            "",
            "--baseline",
            "0",
        ]
    )
    assert json.loads(capsys.readouterr().out) == doc
    assert (doc["shares"]["compute"], doc["shares"]["stream"]) == pytest.approx(SHARES, abs=0.02)
    assert doc["ramp"] == "fitted" and doc["ramp_us"] == pytest.approx(RAMP_US, rel=0.15)
    assert doc["fitted_on"] == list(MIXES) and doc["held_out"] == []
    assert doc["at_fit"]["largest_error_fitted"] < 0.005 and doc["at_fit"]["largest_error_held_out"] is None
    assert "simulated" in doc["source"] and "measured on a real" in doc["source"]


def test_a_step_not_fitted_on_is_reported_held_out_and_a_busier_card_draws_more(tmp_path, capsys):
    folder = _recording(tmp_path / "steps")
    doc = fit_step_power.main(
        [
            "--steps",
            str(folder),
            "--block-trace",
            "none",
            "--fit-on",
            "gemm_heavy",
            "--fit-time-on",
            "",
            "--ramp-us",
            str(RAMP_US),
        ]
    )
    capsys.readouterr()
    assert doc["ramp"] == "held" and doc["ramp_us"] == RAMP_US
    assert doc["held_out"] == ["stream_heavy", "short_kernels"]
    assert [r["shape"] for r in doc["at_fit"]["held_out"]] == ["stream_heavy", "short_kernels"]
    # kernels as busy as the ladder's (shares of 1) draw more than the recording's
    assert all(
        r["energy_error"] > 0.05 for r in doc["at_shares_1"]["fitted"] + doc["at_shares_1"]["held_out"]
    )


def test_a_step_to_fit_on_that_was_not_recorded_is_refused_in_one_line(tmp_path, capsys):
    folder = _recording(tmp_path / "steps")
    with pytest.raises(SystemExit) as exit_info:
        fit_step_power.main(
            ["--steps", str(folder), "--block-trace", "none", "--fit-on", "vit_fp32", "--fit-time-on", ""]
        )
    message = str(exit_info.value.code)
    assert message.startswith("fit_step_power: --fit-on and --fit-time-on name no recorded step vit_fp32 (")
    assert "\n" not in message
