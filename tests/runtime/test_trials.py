"""The stock reference measured in training (runtime/trials.py StockReference)."""

from __future__ import annotations

import pytest

from kdvfs.runtime.schedule import Schedule
from kdvfs.runtime.steps import StepReport
from kdvfs.runtime.trials import StockReference

STEP_S = 0.010
POWER_W = 300.0
UPDATE_S = 0.1


def _reports(step_times_s: list[float]):
    """Steps back to back at constant power, the counter advancing every UPDATE_S."""
    end_s, last_update_s = 0.0, 0.0
    for i, step_s in enumerate(step_times_s):
        end_s += step_s
        readings = []
        while last_update_s + UPDATE_S <= end_s:
            last_update_s += UPDATE_S
            readings.append((last_update_s, POWER_W * last_update_s))
        yield StepReport(i, end_s, step_s, (step_s,), tuple(readings), 40.0, frozenset(), 700.0)


def _reference(step_times_s: list[float]) -> StockReference:
    ref = StockReference(Schedule.stock(), window_s=0.5, min_s=5.0)
    for report in _reports(step_times_s):
        if ref.add(report):
            return ref
    raise AssertionError("the reference did not complete")


def test_one_stalled_step_leaves_the_stock_step_and_energy_where_the_other_windows_put_them():
    steps = [STEP_S] * 1000
    steps[150] = 0.160  # the host paused once, as in a kdvfs.tune run on the H200
    figures = _reference(steps).figures()
    assert figures.step_s == pytest.approx(STEP_S, rel=1e-3)
    assert figures.energy_per_step_j == pytest.approx(POWER_W * STEP_S, rel=5e-3)
    assert figures.segment_times_s[0] == pytest.approx(STEP_S, rel=1e-3)


def test_a_stalled_step_makes_the_reference_noise_larger_not_smaller():
    steady = _reference([STEP_S * (1 + 0.001 * (i % 3)) for i in range(1000)]).figures()
    steps = [STEP_S * (1 + 0.001 * (i % 3)) for i in range(1000)]
    steps[150] = 0.160
    stalled = _reference(steps).figures()
    assert stalled.time_sd_per_root_s > steady.time_sd_per_root_s
