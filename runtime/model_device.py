"""Shared mechanics of devices whose kernels we run ourselves (simulated, replayed).

`ModelDevice` keeps its own clock, applies a clock switch only after the switch latency
(the old clocks run meanwhile, as on a real card), adds measurement noise drawn once per
`noise_period_s` of device time, and reports energy the way NVML does: a cumulative counter
that advances only every `energy_update_period_s`; `counter_updates_since` gives every update
(as a poller reading back to back sees them, several inside a long wait). Subclasses supply the physics:
`_launch_cost(kernel, pair_or_None)`.

A whole step can also run at once (`step_noise`, `step_cost`, `advance_step`): its kernels'
noiseless costs under a StepPattern (runtime/schedule.py), cached by the job per
`step_cost_key`, scaled by the noise of the epoch the step starts in; the counter, the clocks
and the state (temperature, cap controller: `_after_step`) then move as the launches would have
moved them. `StepCost` holds a step's costs.
Why noise is correlated over time: docs/design-runtime.md.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kdvfs.runtime.types import ClockGrid, ClockPair, HostWait, KdvfsError, Kernel, Source

STATE_STEP_S = 0.05
"""Longest stretch of launches costed at one state (temperature, noise) before it is updated."""

UPDATES_KEPT = 4096
"""The energy counter's latest updates the device keeps for counter_updates_since (count)."""


@dataclass(frozen=True)
class StepCost:
    """Noiseless costs of one step's kernels under a pattern, run back to back.

    Attributes:
        times_s: each kernel's time, launches included, s (in the workload's order).
        energies_j: each kernel's energy, J.
        cum_time_s: 0 then the running sum of times_s, s (one longer than times_s).
        cum_energy_j: 0 then the running sum of energies_j, J.
        time_s: the kernels' time, s.
        energy_j: the kernels' energy, J.
        last_power_w: the last kernel's power, W.
        state: what the device needs to leave its state as the launches would (a simulated
            card: the last launch's operating point and the cap controller's steady control).
    """

    times_s: np.ndarray
    energies_j: np.ndarray
    cum_time_s: np.ndarray
    cum_energy_j: np.ndarray
    time_s: float
    energy_j: float
    last_power_w: float
    state: Any = None

    @classmethod
    def of(cls, times_s: Sequence[float], energies_j: Sequence[float], state: Any = None) -> StepCost:
        t, e = np.asarray(times_s, dtype=float), np.asarray(energies_j, dtype=float)
        cum_t, cum_e = np.concatenate(([0.0], np.cumsum(t))), np.concatenate(([0.0], np.cumsum(e)))
        last_w = float(e[-1] / t[-1]) if len(t) and t[-1] > 0.0 else 0.0
        return cls(t, e, cum_t, cum_e, float(cum_t[-1]), float(cum_e[-1]), last_w, state)


class ModelDevice:
    """Base for SimulatedDevice and ReplayDevice. `None` as clocks means stock (auto).

    Args:
        name: the card's name, as plans and figures name it.
        grid: the supported clock pairs.
        energy_update_period_s: how often the energy counter advances, s (NVML: ~0.1).
        switch_latency_s: time from a clock request to the new clocks, s.
        time_noise: relative s.d. of a launch's time (0.005 = 0.5 %).
        energy_noise: relative s.d. of a launch's energy.
        seed: seeds the noise.
        noise_period_s: device seconds over which one noise draw holds.
    """

    source: Source
    state_step_s: float = STATE_STEP_S  # longest stretch costed at one state, s

    def __init__(
        self,
        name: str,
        grid: ClockGrid,
        *,
        energy_update_period_s: float,
        switch_latency_s: float,
        time_noise: float,
        energy_noise: float,
        seed: int,
        noise_period_s: float = 1.0,
    ) -> None:
        self.name = name
        self.grid = grid
        self.energy_update_period_s = energy_update_period_s
        self.switch_latency_s = switch_latency_s
        self.time_noise = time_noise
        self.energy_noise = energy_noise
        self.noise_period_s = noise_period_s
        self._rng = np.random.default_rng(seed)
        self._noise_epoch = -1
        self._noise = (1.0, 1.0)
        self._now_s = 0.0
        self._true_energy_j = 0.0
        self._reported_energy_j = 0.0
        self._last_tick = 0
        self._updates: deque[tuple[float, float]] = deque(maxlen=UPDATES_KEPT)
        self._last_power_w = 0.0
        self._clocks: ClockPair | None = None
        self._pending: tuple[float, ClockPair | None] | None = None
        self.switches = 0

    # --- Device -------------------------------------------------------------------------
    def set_clocks(self, pair: ClockPair) -> None:
        if pair not in self.grid:
            raise KdvfsError(f"{self.name}: unsupported clock pair {pair}")
        self._request(pair)

    def reset_clocks(self) -> None:
        self._request(None)

    def energy_j(self) -> float:
        return self._reported_energy_j

    def power_w(self) -> float:
        return self._last_power_w

    def counter_updates_since(self, after_s: float) -> tuple[tuple[float, float], ...]:
        """The counter's updates after device time after_s, as (time of the update s, counter
        J), oldest first: each one, as a poller reading back to back sees them (the latest
        UPDATES_KEPT)."""
        out = []
        for update in reversed(self._updates):
            if update[0] <= after_s:
                break
            out.append(update)
        return tuple(reversed(out))

    def now_s(self) -> float:
        return self._now_s

    def switch_requested_s(self) -> float | None:
        """When the clock switch still in flight was requested; None when none is."""
        return None if self._pending is None else self._pending[0] - self.switch_latency_s

    def clocks_in_effect(self) -> ClockPair | None:
        return self._clocks

    def pending_switch(self) -> tuple[float, ClockPair | None] | None:
        """The switch in flight, as (s until it lands, pair), or None."""
        return None if self._pending is None else (self._pending[0] - self._now_s, self._pending[1])

    def true_energy_j(self) -> float:
        """The energy actually spent (not observable on a real card; for evaluation only)."""
        return self._true_energy_j

    # --- running ------------------------------------------------------------------------
    def run(self, kernel: Kernel, launches: int = 1) -> float:
        """Run launches back to back; a pending clock switch takes effect between launches."""
        elapsed_s = 0.0
        left = int(launches)
        while left > 0:
            self._apply_due_switch()
            time_s, energy_j = self._noisy_cost(kernel, self._clocks)
            n = min(left, max(1, math.ceil(self.state_step_s / time_s)))
            if self._pending is not None:
                until_switch_s = self._pending[0] - self._now_s
                n = min(n, max(1, math.ceil(until_switch_s / time_s)))
            self._advance(n * time_s, energy_j / time_s)
            elapsed_s += n * time_s
            left -= n
        return elapsed_s

    def idle(self, duration_s: float) -> None:
        end_s = self._now_s + duration_s
        while self._now_s < end_s:
            self._apply_due_switch()
            step_s = end_s - self._now_s
            if self._pending is not None:
                step_s = min(step_s, max(self._pending[0] - self._now_s, 0.0))
            self._advance(step_s, self._idle_power_w())
            if step_s == 0.0:
                self._apply_due_switch()

    def repeat_since(self, start_s: float, start_true_energy_j: float, times: int) -> float:
        """Fast-forward: what the device did since start_s happens `times` more times (steady
        state: a training step repeated). Its noise is redrawn for the whole stretch, with
        the s.d. of a mean over the noise periods it spans, as that many steps would
        average. Returns the seconds added."""
        span_s = self._now_s - start_s
        if times <= 0 or span_s <= 0:
            return 0.0
        time_f, energy_f = self._noise
        extra_s, extra_j = self._steady_correction(start_s)
        repeat_s = span_s / time_f + extra_s  # one repeat, noiseless
        repeat_j = (self._true_energy_j - start_true_energy_j) / energy_f + extra_j
        periods = max(1.0, span_s * times / self.noise_period_s)
        z_time, z_energy = self._rng.standard_normal(2) / math.sqrt(periods)
        new_time_f = max(0.5, 1.0 + self.time_noise * z_time)
        new_energy_f = max(0.5, 1.0 + self.energy_noise * z_energy)
        duration_s = repeat_s * new_time_f * times
        self._advance(duration_s, repeat_j * new_energy_f / (repeat_s * new_time_f))
        if self._pending is not None:  # a switch still in flight stays in flight, as it would each time
            self._pending = (self._pending[0] + duration_s, self._pending[1])
        return duration_s

    def expected(self, kernel: Kernel, pair: ClockPair | None) -> tuple[float, float]:
        if pair is not None and pair not in self.grid:
            raise KdvfsError(f"{self.name}: unsupported clock pair {pair}")
        return self._launch_cost(kernel, pair)

    def expected_step(
        self,
        items: Sequence[tuple[Kernel, ClockPair | None, float]],
        waits: Sequence[Sequence[tuple[float, ClockPair | None]]] = (),
        rare_idle: Sequence[tuple[float, ClockPair | None]] = (),
        host_waits: Sequence[HostWait] = (),
    ) -> tuple[float, float]:
        """The items' noiseless time and energy, then the job's waits at idle_power_at: the
        mean of `waits` (equally likely, each as (s, clocks) parts) or of `host_waits` (equally
        likely, each a share of the items' time), and `rare_idle` ((s, clocks) per step on
        average)."""
        time_s = energy_j = 0.0
        for kernel, pair, launches in items:
            t, e = self.expected(kernel, pair)
            time_s += t * launches
            energy_j += e * launches
        parts = [(s / len(waits), pair) for wait in waits for s, pair in wait]
        parts += [(s / len(host_waits), pair) for wait in host_waits for s, pair in wait.parts(time_s)]
        for idle_s, pair in [*parts, *rare_idle]:
            time_s += idle_s
            energy_j += idle_s * self.idle_power_at(pair)
        return time_s, energy_j

    def idle_power_at(self, pair: ClockPair | None, temp_c: float | None = None) -> float:
        """Power with no kernel running while the clocks are held at `pair` (None: stock), W,
        at temp_c (C; None: the card's temperature now): the subclass's model."""
        raise NotImplementedError

    # --- a whole step at once -----------------------------------------------------------
    def step_cost_key(self, idle_s: float = 0.0) -> Any:
        """What a step's noiseless costs depend on besides its pattern (a simulated card: its
        temperature to 0.5 C, its power cap and, under a windowed cap, the idle time after the
        kernels as its windows see it); costs are cached by it."""
        return None

    def step_cost(
        self, items: Sequence[tuple[Kernel, ClockPair | None, int]], idle_s: float = 0.0
    ) -> StepCost:
        """Noiseless costs of one step's items (kernel, pair in effect, launches) run back to
        back now, idle_s idle after them (the wait's own cost is not in it)."""
        costs = [self._launch_cost(k, pair) for k, pair, _ in items]
        return StepCost.of(
            [t * n for (t, _), (_, _, n) in zip(costs, items)],
            [e * n for (_, e), (_, _, n) in zip(costs, items)],
        )

    def launch_time_s(self, kernel: Kernel, pair: ClockPair | None) -> float:
        """Noiseless time of one launch at the clocks now (the card's state left as it is), s."""
        return self._launch_cost(kernel, pair)[0]

    def step_noise(self) -> tuple[float, float]:
        """The (time, energy) noise factors a step starting now runs under: the epoch's draw."""
        return self._noise_now()

    def advance_step(self, pattern: Any, cost: StepCost, noise: tuple[float, float], wait_s: float) -> None:
        """One step's kernels at once (a StepPattern and its StepCost, times x noise[0], energy
        x noise[1]), then wait_s idle: the clocks end as the pattern leaves them (a switch still
        in flight lands in the wait if it is due), the counter catches up at its last tick (the
        energy up to it read off the kernels' running sums), the state moves (_after_step)."""
        time_f, energy_f = noise
        start_s = self._now_s
        kernels_s, kernels_j = cost.time_s * time_f, cost.energy_j * energy_f
        self.switches += pattern.switches
        self._clocks = pattern.end_clocks
        kernels_end_s = start_s + kernels_s
        self._pending = None
        if pattern.end_pending is not None:
            self._pending = (kernels_end_s + pattern.end_pending[0], pattern.end_pending[1])
        idle_j, idle_w, idle_parts = 0.0, 0.0, []
        if wait_s > 0.0:
            first_s = wait_s
            if self._pending is not None and self._pending[0] - kernels_end_s < wait_s:
                first_s = max(0.0, self._pending[0] - kernels_end_s)
            idle_w = self._idle_power_w()
            idle_parts.append((first_s, idle_w))
            if first_s < wait_s:
                self._now_s = self._pending[0]
                self._apply_due_switch()
                idle_w = self._idle_power_w()
                idle_parts.append((wait_s - first_s, idle_w))
            idle_j = sum(d * w for d, w in idle_parts)
        end_s = kernels_end_s + wait_s
        period_s = self.energy_update_period_s
        for tick in self._ticks_until(end_s):
            offset_s = tick * period_s - start_s
            if offset_s <= kernels_s:
                at_j = float(np.interp(offset_s / time_f, cost.cum_time_s, cost.cum_energy_j)) * energy_f
            else:
                at_j, left_s = kernels_j, offset_s - kernels_s
                for d, w in idle_parts:
                    at_j += min(d, left_s) * w
                    left_s -= d
                    if left_s <= 0.0:
                        break
            self._reported_energy_j = self._true_energy_j + at_j
            self._updates.append((tick * period_s, self._reported_energy_j))
        self._true_energy_j += kernels_j + idle_j
        self._now_s = end_s
        self._last_power_w = idle_w if wait_s > 0.0 else cost.last_power_w * energy_f / time_f
        duration_s = kernels_s + wait_s
        self._after_step(duration_s, (kernels_j + idle_j) / duration_s if duration_s > 0 else 0.0, cost)

    # --- for subclasses -----------------------------------------------------------------
    def _launch_cost(self, kernel: Kernel, pair: ClockPair | None) -> tuple[float, float]:
        """Noiseless (time_s, energy_j) of one launch; None = stock clocks."""
        raise NotImplementedError

    def _idle_power_w(self) -> float:
        raise NotImplementedError

    def _on_advance(self, duration_s: float, power_w: float) -> None:
        """Hook: state that evolves with time and power (temperature)."""

    def _after_step(self, duration_s: float, power_w: float, cost: StepCost) -> None:
        """Hook: state that evolves with time and power after a step run at once (advance_step):
        duration_s at a mean of power_w."""
        self._on_advance(duration_s, power_w)

    def _steady_correction(self, start_s: float) -> tuple[float, float]:
        """Hook: what one repeat of the stretch since start_s runs differently from the stretch
        itself (noiseless s, J): a simulated card's cap controller settles over the repeats."""
        return 0.0, 0.0

    # --- internals ----------------------------------------------------------------------
    def _request(self, pair: ClockPair | None) -> None:
        self._apply_due_switch()
        if self.switch_latency_s <= 0.0:
            self._pending = None
            self._set_in_effect(pair)
        else:
            self._pending = (self._now_s + self.switch_latency_s, pair)

    def _set_in_effect(self, pair: ClockPair | None) -> None:
        if pair != self._clocks:
            self.switches += 1
        self._clocks = pair

    def _apply_due_switch(self) -> None:
        if self._pending is not None and self._pending[0] <= self._now_s + 1e-15:
            self._set_in_effect(self._pending[1])
            self._pending = None

    def _ticks_until(self, end_s: float) -> range:
        """The counter's ticks (multiples of its period) up to end_s not yet passed, oldest
        first (the latest UPDATES_KEPT), marked passed."""
        end_tick = math.floor(end_s / self.energy_update_period_s)
        ticks = range(max(self._last_tick + 1, end_tick - UPDATES_KEPT + 1), end_tick + 1)
        self._last_tick = max(self._last_tick, end_tick)
        return ticks

    def _noisy_cost(self, kernel: Kernel, pair: ClockPair | None) -> tuple[float, float]:
        time_s, energy_j = self._launch_cost(kernel, pair)
        time_f, energy_f = self._noise_now()
        return time_s * time_f, energy_j * energy_f

    def _noise_now(self) -> tuple[float, float]:
        """The noise factors of the epoch now, drawn when a new epoch begins."""
        epoch = math.floor(self._now_s / self.noise_period_s)
        if epoch != self._noise_epoch:
            self._noise_epoch = epoch
            z_time, z_energy = self._rng.standard_normal(2)
            self._noise = (
                max(0.5, 1.0 + self.time_noise * z_time),
                max(0.5, 1.0 + self.energy_noise * z_energy),
            )
        return self._noise

    def _advance(self, duration_s: float, power_w: float) -> None:
        """Advance time at constant power; the reported counter catches up at each tick."""
        start_s = self._now_s
        end_s = start_s + duration_s
        period_s = self.energy_update_period_s
        for tick in self._ticks_until(end_s):
            self._reported_energy_j = self._true_energy_j + power_w * (tick * period_s - start_s)
            self._updates.append((tick * period_s, self._reported_energy_j))
        self._true_energy_j += power_w * duration_s
        self._now_s = end_s
        self._last_power_w = power_w
        self._on_advance(duration_s, power_w)
