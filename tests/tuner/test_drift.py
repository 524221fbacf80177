"""Drift detection: quick on a 2-3 sigma step, silent on long stable runs, names the stream."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from kdvfs.runtime.schedule import Schedule, StepRunner
from kdvfs.runtime.simulator import SimulatedDevice
from kdvfs.runtime.types import ClockPair, KdvfsError
from kdvfs.runtime.workloads import gpt3_xl_layer
from kdvfs.tuner.drift import (
    DEFAULT_H,
    ConditionWatch,
    CusumDetector,
    DriftMonitor,
    cusum_arl0,
    cusum_threshold,
    group_stream,
    stream_group,
)
from kdvfs.tuner.step_tuner import WATCH_CONFIRM_WINDOWS


def first_alarm(detector: CusumDetector, xs: np.ndarray, after: int) -> int | None:
    """Windows from `after` to the first alarm at or past it (1 = the first window after)."""
    hits = [i for i, x in enumerate(xs) if detector.update(float(x)) and i >= after]
    return hits[0] - after + 1 if hits else None


def test_threshold_design_matches_the_published_cusum_tables():
    # Montgomery's table of the two-sided tabular CUSUM, k = 0.5: ARL0 168 at h = 4, 465 at h = 5
    assert cusum_arl0(4.0) == pytest.approx(168, rel=0.02)
    assert cusum_arl0(5.0) == pytest.approx(465, rel=0.02)
    assert cusum_threshold(465.0) == pytest.approx(5.0, abs=0.01)
    assert cusum_arl0(DEFAULT_H) == pytest.approx(1e7, rel=1e-6)
    assert 14.0 < DEFAULT_H < 16.0
    with pytest.raises(KdvfsError, match="arl0 > 1"):
        cusum_threshold(0.5)


@pytest.mark.parametrize("shift_sd, within", [(2.0, 30), (-2.0, 30), (3.0, 15), (-3.0, 15)])
def test_step_change_of_two_to_three_sigma_is_detected_within_a_few_dozen_windows(shift_sd, within):
    sd, centre, change_at = 0.004, 0.07, 200  # a steady 7% bias against the plan is no change
    for seed in range(10):
        xs = centre + sd * np.random.default_rng(seed).standard_normal(change_at + 100)
        xs[change_at:] += shift_sd * sd
        delay = first_alarm(CusumDetector(), xs, change_at)
        assert delay is not None and delay <= within, f"seed {seed}: detected after {delay} windows"


def test_no_false_alarm_over_2500_stable_windows_of_twenty_gaussian_streams():
    streams = [f"group{i}" for i in range(19)] + ["energy"]
    rng = np.random.default_rng(7)
    sd = rng.uniform(0.002, 0.03, len(streams))
    bias = rng.uniform(-0.1, 0.1, len(streams))
    expected = dict(zip(streams, rng.uniform(1e-4, 5.0, len(streams))))
    monitor = DriftMonitor(streams)
    for _ in range(2500):
        noise = bias + sd * rng.standard_normal(len(streams))
        values = {name: expected[name] * (1.0 + z) for name, z in zip(streams, noise)}
        assert monitor.update(values, expected) == []
    assert monitor.ready


def test_a_single_wild_window_neither_alarms_nor_blinds_the_stream():
    rng = np.random.default_rng(3)
    d = CusumDetector()
    for x in 0.01 * rng.standard_normal(100):
        assert not d.update(float(x))
    sd_before = d.sd
    assert not d.update(50.0)  # a counter glitch, 5000 sigma
    assert d.sd == pytest.approx(sd_before)  # not learned
    xs = 0.01 * rng.standard_normal(100)
    xs[50:] += 0.03
    assert first_alarm(d, xs, 50) <= 15


def test_a_glitch_among_the_first_windows_is_screened_out_at_the_end_of_the_warmup():
    rng = np.random.default_rng(8)
    d = CusumDetector(warmup=20)
    d.update(3.0)  # a switch transient in the first window
    for x in 0.01 * rng.standard_normal(19):
        assert not d.update(float(x))
    assert not d.ready  # one window short once the glitch is dropped
    assert not d.update(0.0)
    assert d.ready and d.sd < 0.02 and abs(d.mean) < 0.01
    xs = 0.01 * rng.standard_normal(100)
    xs[50:] += 0.03
    assert first_alarm(d, xs, 50) <= 15


def test_gross_change_is_caught_in_two_windows():
    d = CusumDetector()
    for x in 0.01 * np.random.default_rng(4).standard_normal(60):
        d.update(float(x))
    assert not d.update(0.5)
    assert d.update(0.5)


def test_noiseless_stream_uses_the_scale_floor():
    d = CusumDetector(min_scale=1e-3)
    assert not any(d.update(0.0) for _ in range(500))
    delay = first_alarm(d, np.full(50, 0.01), 0)  # a 1% step is 10 x the floor
    assert delay is not None and delay <= 3


def test_reset_forgets_the_baseline_and_alarms_only_once_warm():
    d = CusumDetector(warmup=20)
    for x in np.random.default_rng(5).normal(0.0, 0.01, 100):
        d.update(float(x))
    d.reset()
    assert not d.ready and d.n == 0
    # a new level: learned as the baseline after the reset, so no alarm
    assert not any(d.update(float(x)) for x in np.random.default_rng(6).normal(0.2, 0.01, 500))
    assert d.mean == pytest.approx(0.2, abs=0.002)


def test_monitor_reports_only_the_stream_that_moved_and_resets_it():
    streams = ["group0", "group1", "group2", "energy"]
    expected = {"group0": 2e-3, "group1": 5e-3, "group2": 1e-3, "energy": 4.0}
    rng = np.random.default_rng(11)
    monitor = DriftMonitor(streams)

    def window(shift: float) -> list[str]:
        values = {k: v * (1.0 + 0.005 * rng.standard_normal()) for k, v in expected.items()}
        values["group1"] *= 1.0 + shift
        return monitor.update(values, expected)

    assert all(window(0.0) == [] for _ in range(100))
    reported = [window(0.015) for _ in range(40)]  # group1 3 sigma slower
    assert {name for r in reported for name in r} == {"group1"}
    monitor.reset(["group1"])
    assert not monitor.detectors["group1"].ready and monitor.detectors["group0"].ready
    # a stream may sit a window out
    assert monitor.update({"energy": 4.0}, expected) == []


def test_with_confirmation_a_burst_of_wild_windows_is_not_reported_and_a_lasting_shift_is():
    expected = {"g0": 1e-2, "g1": 2e-2}
    rng = np.random.default_rng(12)
    monitor = DriftMonitor(list(expected), confirm=30)

    def window(shift: float = 0.0) -> list[str]:
        values = {k: v * (1.0 + 0.005 * rng.standard_normal()) for k, v in expected.items()}
        values["g1"] *= 1.0 + shift
        return monitor.update(values, expected)

    assert all(window() == [] for _ in range(200))
    # a kernel of g1 ran at the other pair in three windows (its switch landed before it): +4%
    assert window(0.04) == [] and window(0.04) == [] and window(0.04) == []
    assert monitor.detectors["g1"].alarms == 1 and monitor.unconfirmed == 0  # suspected
    learned = monitor.detectors["g1"].n
    assert all(window() == [] for _ in range(20))
    assert monitor.detectors["g1"].n == learned < monitor.detectors["g0"].n  # nothing learned while suspected
    assert all(window() == [] for _ in range(10))
    assert monitor.unconfirmed == 1  # not confirmed: nothing reported
    reported = [window(0.015) for _ in range(60)]  # a lasting 3-sigma shift
    at = next(i for i, r in enumerate(reported) if r)
    assert reported[at] == ["g1"] and 2 <= at < 40  # after two alarms: about twice a plain CUSUM's delay
    with pytest.raises(KdvfsError, match="confirm=-1"):
        DriftMonitor(["a"], confirm=-1)


def test_monitor_rejects_bad_input_with_one_line():
    with pytest.raises(KdvfsError, match="distinct stream names"):
        DriftMonitor(["a", "a"])
    monitor = DriftMonitor(["a"])
    with pytest.raises(KdvfsError, match="unknown stream 'b'"):
        monitor.update({"b": 1.0}, {"b": 1.0})
    with pytest.raises(KdvfsError, match="no expected value"):
        monitor.update({"a": 1.0}, {})
    with pytest.raises(KdvfsError, match=r"expected value of stream 'a' is 0\.0"):
        monitor.update({"a": 1.0}, {"a": 0.0})
    with pytest.raises(KdvfsError, match="value of stream 'a' is nan, not a finite number"):
        monitor.update({"a": math.nan}, {"a": 1.0})
    with pytest.raises(KdvfsError, match="CUSUM input inf is not a finite number"):
        CusumDetector().update(math.inf)
    with pytest.raises(KdvfsError, match="unknown stream 'c'"):
        monitor.reset(["c"])
    with pytest.raises(KdvfsError, match="bad CUSUM settings"):
        CusumDetector(clip=0.1, k=0.5)


class SimulatedWindows:
    """Windows of ~2 s of training on a noisy simulated H200 (fast clock switch) under a
    four-group schedule: each group's time per step from launch timings and the
    step's energy from the counter, against the device's noiseless expectation."""

    # group 1 starts at a 670-us GEMM, so its switch (50 us) lands inside that kernel: from
    # kernel 12 (a 50-us add at 900 MHz, a tie with the switch) a 1-s noise draw decided
    # whether the next GEMM ran at 900 MHz or stock, and group 1's time flipped by 10%
    SCHEDULE = Schedule(
        ((0, ClockPair(900, 3201)), (11, None), (30, ClockPair(1200, 3201)), (36, ClockPair(900, 3201)))
    )

    def __init__(self, seed: int) -> None:
        self.device = SimulatedDevice("h200-fastswitch", seed=seed)
        self.workload = gpt3_xl_layer()
        self.runner = StepRunner(self.device, self.workload)
        pairs = self.SCHEDULE.pair_per_kernel(len(self.workload))
        starts = [s for s, _ in self.SCHEDULE.groups] + [len(self.workload)]
        self.spans = list(itertools.pairwise(starts))
        kernels = self.workload.kernels
        self.expected = {
            f"group{g}": sum(
                self.device.expected(kernels[k], pairs[k])[0] * kernels[k].launches for k in range(a, b)
            )
            for g, (a, b) in enumerate(self.spans)
        }
        step_s, self.expected["energy"] = self.device.expected_step(
            [(k, p, k.launches) for k, p in zip(kernels, pairs)]
        )
        self.steps = max(1, int(2.0 / step_s))
        self.runner.run(self.SCHEDULE, int(120.0 / step_s))  # settle to the training temperature

    def next(self) -> dict[str, float]:
        energy_j = self.device.energy_j()
        times, _ = self.runner.run(self.SCHEDULE, self.steps)
        values = {f"group{g}": float(times[a:b].sum()) for g, (a, b) in enumerate(self.spans)}
        values["energy"] = (self.device.energy_j() - energy_j) / self.steps
        return values


@pytest.mark.parametrize("seed", [0, 1])
def test_simulated_device_stream_is_quiet_for_2000_windows_then_names_the_capped_group(seed):
    windows = SimulatedWindows(seed)
    # confirmed alarms, as the tuner watches output streams
    monitor = DriftMonitor(list(windows.expected), confirm=WATCH_CONFIRM_WINDOWS)
    false_alarms = [
        (w, changed) for w in range(2000) if (changed := monitor.update(windows.next(), windows.expected))
    ]
    assert false_alarms == []
    windows.device.set_power_cap_w(500.0)  # stock GEMMs at 700 W are held to 500 W: slower
    first: dict[str, int] = {}
    for w in range(100):
        for name in monitor.update(windows.next(), windows.expected):
            first.setdefault(name, w + 1)
    assert first.get("group1", 999) <= 10
    # the groups locked at 900 MHz draw < 450 W (and follow a group below the cap): untouched
    assert "group0" not in first and "group3" not in first


def test_condition_watch_alarms_on_a_new_power_limit_at_once_and_on_a_temperature_step_not_a_wander():
    watch = ConditionWatch()
    rng = np.random.default_rng(0)
    t = 0.0
    for _ in range(40):  # 40 s settled at 70 C, +/- 0.05 C
        t += 1.0
        assert watch.update(t, 70.0 + 0.05 * rng.standard_normal(), 350.0) == []
    assert watch.centre_c is not None and abs(watch.centre_c - 70.0) < 0.05 and 1.5 < watch.half_width_c < 1.7
    for i in range(2000):  # a long stable run that wanders 1.5 C: silent
        t += 1.0
        assert watch.update(t, 70.0 + 1.5 * math.sin(i / 600.0) + 0.05 * rng.standard_normal(), 350.0) == []
    assert watch.update(t + 1.0, watch.centre_c, 250.0) == ["power_limit"]
    assert watch.update(t + 2.0, 70.0, 250.0) == []  # the new limit is the one in force
    watch.centre_c = 70.0
    t += 2.0
    for i in range(20):  # within the margin
        assert watch.update(t + i, 71.4, 250.0) == []
    t += 20.0
    for i in range(3):  # a 3-s dip, as a checkpoint's idle seconds: within the median's span
        assert watch.update(t + i, 60.0, 250.0) == []
    t += 3.0
    centre_c = watch.centre_c
    moved = [watch.update(t + 0.5 * i, 73.0, 250.0) for i in range(40)]
    assert moved.index(["temperature"]) >= 4  # a step held for half the span
    assert watch.centre_c is None and 1.6 < watch.step_c <= 73.0 - centre_c  # warmed; learns anew


def test_condition_watch_waits_for_a_warming_card_to_settle_and_ignores_an_absent_limit():
    watch = ConditionWatch()
    temps = [80.0 - 20.0 * math.exp(-t / 30.0) for t in range(300)]  # warming, time constant 30 s
    armed_at = next(
        t for t, temp in enumerate(temps) if watch.update(float(t), temp, math.inf) == [] and watch.centre_c
    )
    assert armed_at > 100  # not while it still rises by 0.1 C in 10 s
    assert all(watch.update(300.0 + i, 80.0, math.inf) == [] for i in range(100))
    with pytest.raises(KdvfsError, match="not a finite number"):
        watch.update(401.0, math.nan, math.inf)


def test_a_group_stream_name_parses_back_to_its_group_and_no_other_stream_does():
    assert [stream_group(group_stream(i)) for i in (0, 7, 12)] == [0, 7, 12]
    assert [stream_group(name) for name in ("step", "energy", "power_limit", "g", "gx")] == [None] * 5
