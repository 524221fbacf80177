"""Measurement as a real card allows it: isolated replay of one kernel at one clock setting,
and the reference measured as training steps at stock clocks.

- `measure_isolated` / `IsolatedResult`: one kernel run back to back in chunks (`CHUNK_S`),
  the energy window opened and closed at observed counter updates; energy per launch is the
  window's mean power times the time per launch; `THROTTLES` marks clocks that did not hold;
- `measure_reference_steps` / `StepReference`: whole steps at stock clocks,
  with the spread of sub-windows (`SUB_WINDOW_S`) as the noise estimate.

Why windows end at counter updates, and what that resolves: docs/design-runtime.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kdvfs.runtime.device import KernelRunner
from kdvfs.runtime.types import ClockPair, KdvfsError, Kernel, Measurement

THROTTLES = frozenset({"sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"})
"""Clock-event reasons that mean the card ran below the asked clocks (NVML's names)."""

SUB_WINDOW_S = 1.0
"""Sub-window of a reference run whose spread estimates the measurement noise."""

CHUNK_S = 0.01
"""Kernel time between counter reads (the NVML energy read itself takes ~4 ms on an H200)."""

COUNTER_WAIT_S = 60.0
"""Longest device time to wait for the energy counter to update before giving up; s."""


@dataclass(frozen=True)
class IsolatedResult:
    """A measurement and the device seconds it cost (warm-up and alignment included)."""

    measurement: Measurement
    cost_s: float


def measure_isolated(
    device: KernelRunner,
    kernel: Kernel,
    pair: ClockPair | None,
    window_s: float = 1.0,
) -> IsolatedResult:
    """Measure one launch of `kernel` at a locked pair (None: stock clocks)."""
    start_s = device.now_s()
    if pair is None:
        device.reset_clocks()
    else:
        device.set_clocks(pair)
    first_s = device.run(kernel, 1)
    # a real card's cells of one kernel run in chunks of one size: per-chunk overheads alike
    fixed = getattr(device, "chunk_launches", None)
    launches = fixed(kernel, CHUNK_S) if callable(fixed) else max(1, int(CHUNK_S / first_s))
    # warm up past the switch latency, then wait for a counter update to open the window
    _run_for(device, kernel, launches, device.switch_latency_s + 2 * CHUNK_S)
    _await_counter(device, lambda: device.run(kernel, launches))
    energy_a, t_a = device.energy_j(), device.now_s()
    busy_s, count = 0.0, 0
    while device.now_s() - t_a < window_s:
        busy_s += _step(device, lambda: device.run(kernel, launches))
        count += launches
    extra_s, extra_runs = _await_counter(device, lambda: device.run(kernel, launches))
    busy_s += extra_s
    count += extra_runs * launches
    energy_b, t_b = device.energy_j(), device.now_s()
    time_s = busy_s / count
    power_w = (energy_b - energy_a) / (t_b - t_a)
    throttled = bool(device.throttle_reasons() & THROTTLES)
    return IsolatedResult(
        Measurement(time_s, power_w * time_s, device.source, throttled), device.now_s() - start_s
    )


def _run_for(device: KernelRunner, kernel: Kernel, launches: int, duration_s: float) -> None:
    end_s = device.now_s() + duration_s
    while device.now_s() < end_s:
        _step(device, lambda: device.run(kernel, launches))


def _step(device: KernelRunner, work):
    """Do `work` (which runs kernels); KdvfsError when the device's clock did not advance, as
    with absurd recorded times, so that no loop waits on a time that cannot come."""
    before_s = device.now_s()
    result = work()
    if not device.now_s() > before_s:
        raise KdvfsError(
            f"device time stopped advancing at {before_s:g} s (recorded kernel times too large or too small?)"
        )
    return result


def _await_counter(device: KernelRunner, work) -> tuple[float, int]:
    """Do `work` until the energy counter updates (at most COUNTER_WAIT_S of device time);
    the summed float results of `work` and how many times it ran."""
    energy_s, start_s = device.energy_j(), device.now_s()
    total, runs = 0.0, 0
    while device.energy_j() == energy_s:
        if device.now_s() - start_s > COUNTER_WAIT_S:
            raise KdvfsError(f"the energy counter did not update in {COUNTER_WAIT_S:g} s of device time")
        total += float(np.sum(_step(device, work)))
        runs += 1
    return total, runs


@dataclass(frozen=True)
class StepReference:
    """The reference measured in training conditions: steps at stock clocks after the
    card has settled to its training temperature. kernel_time_s: each kernel's time per
    step (launches included), from launch timings; time_rel_sd: relative s.d. of the
    step time between 1-s sub-windows (the measurement noise, without thermal drift)."""

    kernel_time_s: np.ndarray
    step_time_s: float
    step_energy_j: float
    time_rel_sd: float
    steps: int  # in the measured window
    all_steps: int  # warm-up included
    cost_s: float


def measure_reference_steps(
    device: KernelRunner, kernels: Sequence[Kernel], warmup_s: float = 120.0, window_s: float = 20.0
) -> StepReference:
    """Run the step at stock clocks for warmup_s (thermal settling: four time constants of
    a card's ~20-30 s), then measure window_s of it (an energy counter read over 20 s averages
    20 one-second noise periods). In a training job these are ordinary steps at stock."""
    start_s = device.now_s()
    device.reset_clocks()
    warmup = 0
    while device.now_s() - start_s < warmup_s or warmup == 0:
        _step(device, lambda: _one_step(device, kernels))
        warmup += 1
    warmup += _await_counter(device, lambda: _one_step(device, kernels))[1]
    energy_a, t_a = device.energy_j(), device.now_s()
    totals = np.zeros(len(kernels))
    sub_means: list[float] = []
    sub_t, sub_n, steps = 0.0, 0, 0
    while device.now_s() - t_a < window_s or device.energy_j() == energy_a:
        if device.now_s() - t_a > window_s + COUNTER_WAIT_S:
            raise KdvfsError(f"the energy counter did not update in {COUNTER_WAIT_S:g} s of device time")
        times = _step(device, lambda: _one_step(device, kernels))
        totals += times
        steps += 1
        sub_t += times.sum()
        sub_n += 1
        if sub_t >= SUB_WINDOW_S:
            sub_means.append(sub_t / sub_n)
            sub_t, sub_n = 0.0, 0
        if device.now_s() - t_a >= window_s and device.energy_j() != energy_a:
            break
    power_w = (device.energy_j() - energy_a) / (device.now_s() - t_a)
    kernel_time_s = totals / steps
    rel_sd = float(np.std(sub_means, ddof=1) / np.mean(sub_means)) if len(sub_means) > 1 else 0.0
    return StepReference(
        kernel_time_s,
        float(kernel_time_s.sum()),
        power_w * float(kernel_time_s.sum()),
        rel_sd,
        steps,
        warmup + steps,
        device.now_s() - start_s,
    )


def _one_step(device: KernelRunner, kernels: Sequence[Kernel]) -> np.ndarray:
    return np.array([device.run(k, k.launches) for k in kernels])
