"""The gap-power recorder's options and its counter arithmetic (experiments/record_gap_power.py), on the CPU."""

from __future__ import annotations

import math

import pytest

from kdvfs.experiments import record_gap_power


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--kernels", "add_4mib,gemm_huge"], "gemm_huge"),
        (["--gaps-us", "b2b,fifty"], "'b2b,fifty'"),
        (["--gaps-us", "0,-20"], "at least 0 us"),
    ],
)
def test_bad_kernels_or_gaps_exit_non_zero_with_one_line_before_the_gpu_or_the_folder(
    argv, named, tmp_path, capsys
):
    with pytest.raises(SystemExit) as stop:
        record_gap_power.main(["--out", str(tmp_path / "unused"), *argv])
    message = str(stop.value.code)
    assert named in message and "\n" not in message and stop.value.code != 0
    assert not (tmp_path / "unused").exists() and not capsys.readouterr().out


def test_the_counters_power_is_its_first_to_last_update_over_their_time():
    # (host s, energy mJ, updated, ...): two updates 0.1 s apart 50 J apart: 500 W
    rows = [(0.00, 1_000, 0), (0.05, 2_000, 1), (0.10, 2_000, 0), (0.15, 52_000, 1)]
    assert record_gap_power.counter_power_w(rows) == pytest.approx(500.0)
    assert math.isnan(record_gap_power.counter_power_w(rows[:2]))
