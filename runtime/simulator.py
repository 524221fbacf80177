"""The simulated GPU: a small physical model of kernel time and board power.

- `operating_point`: one launch at a locked pair or at stock (auto mode under the power cap),
  from `_time_parts` (launch, per-kind rates and floors, link waits) and `_power_w`
  (leakage, V^2 f x activity, memory traffic); `voltage_rel`, `effective_cap_w`,
  `idle_power_w`; `_mix` and `_hunting` for the cap controller's clock swing.
- `SimulatedDevice`: a ModelDevice (source "simulated") over a preset: noiseless figures at
  the iteration's own steady temperature (`expected`, `expected_iteration`), timed launches
  with a first-order thermal state, operator changes (`set_ambient_c`, `set_power_cap_w`) and
  the sensors NVML would give (temperature, power limit, SM clock, throttle reasons).
The constants and their sources: presets.py. The model's equations and reasoning:
docs/design-runtime.md#simulatorpy-presetspy-workloadspy-probe_kernelspy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kdvfs.runtime.model_device import ModelDevice
from kdvfs.runtime.presets import Preset, get_preset
from kdvfs.runtime.types import ClockGrid, ClockPair, Kernel


@dataclass(frozen=True)
class OperatingPoint:
    """What one launch costs at a setting, and what the card did to get there."""

    time_s: float
    energy_j: float
    core_mhz: float  # effective (mean) core clock
    mem_mhz: int
    power_w: float
    capped: bool  # the power cap pulled the clock below what was asked


def voltage_rel(p: Preset, core_mhz: float) -> float:
    """Core voltage relative to its value at the highest clock."""
    if core_mhz <= p.v_knee_mhz:
        return p.v_min_rel
    span = p.max_core_mhz - p.v_knee_mhz
    return p.v_min_rel + (1.0 - p.v_min_rel) * min(1.0, (core_mhz - p.v_knee_mhz) / span)


def _time_parts(p: Preset, k: Kernel, core_mhz: float, mem_mhz: float) -> tuple[float, float, float]:
    """(total time, busy compute time, busy memory time) of one launch. The busy times are
    what the work needs at the kind's full rate; a launch too small to fill the SMs takes
    the kind's floor instead (scaled by the core clock), and the chip idles meanwhile."""
    km = p.kind_model(k.kind)
    core_hz = core_mhz * 1e6
    rate = (p.tensor_flop_per_cycle if k.tensor_core else p.simt_flop_per_cycle) * km.rate_eff
    t_comp = k.flops / (rate * core_hz)
    bw = km.bw_eff * min(p.mem_bw_bytes_per_s * mem_mhz / p.max_mem_mhz, p.core_bytes_per_cycle * core_hz)
    t_mem = k.bytes_moved / bw
    floor_s = km.floor_s * p.max_core_mhz / core_mhz
    t_work = max(t_comp, t_mem) + (1.0 - p.overlap) * min(t_comp, t_mem)
    return p.launch_latency_s + max(t_work, floor_s, k.wait_s), t_comp, t_mem


def _power_w(p: Preset, k: Kernel, core_mhz: float, mem_mhz: float, temp_c: float) -> tuple[float, float]:
    """(time, power) of one launch at exactly these clocks: activity follows how busy the
    chip is (busy time over launch time), so a launch that cannot fill it draws far less."""
    t, t_comp, t_mem = _time_parts(p, k, core_mhz, mem_mhz)
    u_comp, u_mem = min(1.0, t_comp / t), min(1.0, t_mem / t)
    v = voltage_rel(p, core_mhz)
    static = p.static_w * v * (1.0 + p.leak_per_c * (temp_c - p.leak_ref_c))
    act_comp = p.act_tensor if k.tensor_core else p.act_simt
    act_stream = p.kind_model(k.kind).act_stream
    activity = p.act_idle + act_comp * u_comp + (p.act_mem if act_stream is None else act_stream) * u_mem
    core = p.core_dyn_w * v * v * (core_mhz / p.max_core_mhz) * activity
    traffic = u_mem * p.kind_model(k.kind).bw_eff  # DRAM traffic against the card's streaming peak
    mem = p.mem_w * (mem_mhz / p.max_mem_mhz) * (p.mem_base_rel + (1.0 - p.mem_base_rel) * traffic)
    return t, static + core + mem


def _mix(
    p: Preset, k: Kernel, lo_mhz: float, hi_mhz: float, share_hi: float, mem_mhz: float, temp_c: float
) -> tuple[float, float, float]:
    """(time, mean power, mean clock) of one launch while the clock alternates between two
    levels, share_hi of the time at hi (the mean rate is the time-weighted mean of rates)."""
    t_lo, p_lo = _power_w(p, k, lo_mhz, mem_mhz, temp_c)
    t_hi, p_hi = _power_w(p, k, hi_mhz, mem_mhz, temp_c)
    t = 1.0 / (share_hi / t_hi + (1.0 - share_hi) / t_lo)
    return t, share_hi * p_hi + (1.0 - share_hi) * p_lo, share_hi * hi_mhz + (1.0 - share_hi) * lo_mhz


def _hunting(
    p: Preset, k: Kernel, centre_mhz: float, ceiling_mhz: float, mem_mhz: float, temp_c: float
) -> tuple[float, float, float]:
    """The cap controller swinging +/- auto_hunt_rel around centre_mhz, half the time each side."""
    lo = max(min(p.core_levels_mhz), centre_mhz * (1.0 - p.auto_hunt_rel))
    hi = min(ceiling_mhz, centre_mhz * (1.0 + p.auto_hunt_rel))
    return _mix(p, k, lo, hi, 0.5, mem_mhz, temp_c)


def effective_cap_w(p: Preset, cap_w: float, temp_c: float) -> float:
    """The power limit the card enforces: its cap, shrinking 10%/C above the thermal limit."""
    if temp_c <= p.t_limit_c:
        return cap_w
    return cap_w * max(0.3, 1.0 - 0.1 * (temp_c - p.t_limit_c))


def operating_point(
    p: Preset, k: Kernel, pair: ClockPair | None, temp_c: float, cap_w: float
) -> OperatingPoint:
    """One launch at a locked pair, or at stock clocks (pair=None)."""
    ceiling = float(p.max_core_mhz if pair is None else pair.core_mhz)
    mem = p.max_mem_mhz if pair is None else pair.mem_mhz
    limit = effective_cap_w(p, cap_w, temp_c)
    t, power = _power_w(p, k, ceiling, mem, temp_c)
    if power <= limit:
        return OperatingPoint(t, t * power, ceiling, mem, power, capped=False)
    # Capped. Just over the cap the card dips from the ceiling to a swing below it for a
    # share of the time; further over, it hunts around a lower centre clock.
    lo_mhz = ceiling * (1.0 - p.auto_hunt_rel)
    _t_lo, p_lo = _power_w(p, k, lo_mhz, mem, temp_c)
    if p_lo <= limit:
        share_hi = (limit - p_lo) / (power - p_lo)
        t, mean_w, clock = _mix(p, k, lo_mhz, ceiling, share_hi, mem, temp_c)
        return OperatingPoint(t, t * mean_w, clock, mem, mean_w, capped=True)
    lo, hi = float(min(p.core_levels_mhz)), ceiling
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if _hunting(p, k, mid, ceiling, mem, temp_c)[1] > limit:
            hi = mid
        else:
            lo = mid
    t, mean_w, clock = _hunting(p, k, lo, ceiling, mem, temp_c)
    return OperatingPoint(t, t * mean_w, clock, mem, mean_w, capped=True)


def idle_power_w(p: Preset, core_mhz: float, mem_mhz: float, temp_c: float) -> float:
    """Board power with no kernel running at these clocks."""
    v = voltage_rel(p, core_mhz)
    static = p.static_w * v * (1.0 + p.leak_per_c * (temp_c - p.leak_ref_c))
    core = p.core_dyn_w * v * v * (core_mhz / p.max_core_mhz) * p.act_idle
    return static + core + p.mem_w * (mem_mhz / p.max_mem_mhz) * p.mem_base_rel


THERMAL_BISECTION_STEPS = 12
"""Bisection steps for the steady temperature (count): the bracket shrinks to ~0.03 C."""


class SimulatedDevice(ModelDevice):
    """A simulated GPU (source "simulated"), the embedded default.

    preset: a name of presets.PRESETS (NAME-fastswitch for a fast clock switch) or a Preset.
    full_grid: search every supported pair instead of the preset's default search grid.
    noise: scale of measurement noise (1.0 = the preset's; 0 = noiseless).
    """

    source = "simulated"
    costs_by_work = True  # a launch's cost depends on its kernel's work, not on its name

    def __init__(
        self,
        preset: str | Preset = "rtx3080ti",
        *,
        seed: int = 0,
        noise: float = 1.0,
        full_grid: bool = False,
        ambient_c: float | None = None,
        power_cap_w: float | None = None,
    ) -> None:
        p = get_preset(preset) if isinstance(preset, str) else preset
        self.preset = p
        self.preset_name = preset if isinstance(preset, str) else p.gpu_name
        if full_grid or p.search_core_mhz is None:
            grid = ClockGrid.product(p.core_levels_mhz, p.mem_levels_mhz)
        else:
            grid = ClockGrid.product(p.search_core_mhz, p.search_mem_mhz or p.mem_levels_mhz)
        super().__init__(
            p.gpu_name,
            grid,
            energy_update_period_s=p.energy_update_period_s,
            switch_latency_s=p.switch_latency_s,
            time_noise=p.time_noise * noise,
            energy_noise=p.energy_noise * noise,
            seed=seed,
        )
        self.ambient_c = p.ambient_c if ambient_c is None else ambient_c
        self.power_cap_w = p.power_cap_w if power_cap_w is None else power_cap_w
        self._temp_c = self.operating_temperature_c()
        self._last_point: OperatingPoint | None = None
        self._cache: dict[tuple, OperatingPoint] = {}

    # --- operator-side changes (drift scenarios) ---------------------------------------
    def set_ambient_c(self, ambient_c: float) -> None:
        self.ambient_c = ambient_c
        self._cache.clear()

    def set_power_cap_w(self, cap_w: float) -> None:
        self.power_cap_w = cap_w
        self._cache.clear()

    # --- sensing ------------------------------------------------------------------------
    def operating_temperature_c(self) -> float:
        """Steady temperature under a typical training load (85% of the cap): the
        temperature noiseless figures (expected()) are computed at."""
        return self.ambient_c + self.preset.r_th_c_per_w * 0.85 * self.power_cap_w

    def temperature_c(self) -> float:
        return self._temp_c

    def power_limit_w(self) -> float:
        """The operator's cap (as NVML's enforced limit: the thermal slowdown is not in it)."""
        return self.power_cap_w

    def sm_clock_mhz(self) -> float:
        """The (mean) core clock of the last launch run."""
        return self._last_point.core_mhz if self._last_point else float(self.preset.max_core_mhz)

    def throttle_reasons(self) -> frozenset[str]:
        reasons = set()
        if self._last_point is not None and self._last_point.capped:
            reasons.add("sw_power_cap")
        if self._temp_c > self.preset.t_limit_c:
            reasons.add("hw_thermal")
        return frozenset(reasons)

    def point(self, kernel: Kernel, pair: ClockPair | None, temp_c: float | None = None) -> OperatingPoint:
        """The operating point of one launch (cached by rounded temperature)."""
        t = self.operating_temperature_c() if temp_c is None else temp_c
        key = (kernel, pair, round(t * 2.0) / 2.0)
        op = self._cache.get(key)
        if op is None:
            op = operating_point(self.preset, kernel, pair, key[2], self.power_cap_w)
            self._cache[key] = op
        return op

    # --- ModelDevice hooks --------------------------------------------------------------
    def expected(self, kernel: Kernel, pair: ClockPair | None) -> tuple[float, float]:
        if pair is not None:
            self.grid.index(pair)
        op = self.point(kernel, pair)
        return op.time_s, op.energy_j

    def expected_iteration(
        self, items: Sequence[tuple[Kernel, ClockPair | None, float]]
    ) -> tuple[float, float]:
        """Noiseless time and energy of the items run over and over, at their own steady
        temperature (steady_temperature_c)."""
        return self._figures(items, self.steady_temperature_c(items))

    def steady_temperature_c(self, items: Sequence[tuple[Kernel, ClockPair | None, float]]) -> float:
        """The steady temperature T = ambient + R_th x mean power(T) of the items run over and
        over. The gap ambient + R_th x P(T) - T falls as T rises (leakage adds far less than a
        degree per degree; above the thermal limit the cap pulls power down), so its root is
        unique and bisection finds it, where plain iteration oscillates at the thermal limit."""
        for pair in {pair for _, pair, _ in items} - {None}:
            self.grid.index(pair)
        lo = self.ambient_c
        hi = self.ambient_c + self.preset.r_th_c_per_w * self.power_cap_w * 1.5
        for _ in range(THERMAL_BISECTION_STEPS):
            mid = 0.5 * (lo + hi)
            time_s, energy_j = self._figures(items, mid)
            if self.ambient_c + self.preset.r_th_c_per_w * energy_j / time_s > mid:
                lo = mid
            else:
                hi = mid
        return 0.5 * (lo + hi)

    def expected_at(self, kernel: Kernel, pair: ClockPair | None, temp_c: float) -> tuple[float, float]:
        """Noiseless time and energy of one launch at a given temperature, C."""
        if pair is not None:
            self.grid.index(pair)
        op = self.point(kernel, pair, temp_c)
        return op.time_s, op.energy_j

    def _figures(
        self, items: Sequence[tuple[Kernel, ClockPair | None, float]], temp_c: float
    ) -> tuple[float, float]:
        points = [(self.point(k, pair, temp_c), n) for k, pair, n in items]
        return sum(op.time_s * n for op, n in points), sum(op.energy_j * n for op, n in points)

    def _launch_cost(self, kernel: Kernel, pair: ClockPair | None) -> tuple[float, float]:
        op = self.point(kernel, pair, self._temp_c)
        self._last_point = op
        return op.time_s, op.energy_j

    def _idle_power_w(self) -> float:
        pair = self._clocks
        core = float(min(self.preset.core_levels_mhz)) if pair is None else float(pair.core_mhz)
        mem = self.preset.max_mem_mhz if pair is None else pair.mem_mhz
        return idle_power_w(self.preset, core, mem, self._temp_c)

    def _on_advance(self, duration_s: float, power_w: float) -> None:
        p = self.preset
        steady_c = self.ambient_c + p.r_th_c_per_w * power_w
        self._temp_c = steady_c + (self._temp_c - steady_c) * math.exp(-duration_s / p.tau_s)
