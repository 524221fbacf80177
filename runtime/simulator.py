"""The simulated GPU: a small physical model of kernel time and board power.

- `operating_point`: one launch at a locked pair or at stock (auto mode under the power cap),
  from `_time_parts` (launch, per-kind rates, L2 residency `l2_resident`, whole waves of
  blocks `waves`, a recorded kernel's work at its in-step busy share (Kernel.busy_share), the
  work blended with the kind's floor, link waits) and `_power_w`
  (leakage, V^2 f x activity, DRAM traffic; less above idle after an idle gap,
  `after_gap_factor`); `voltage_rel`, `effective_cap_w`,
  `idle_power_w`; `_mix` and `_hunting` for the cap controller's clock swing.
- The windowed cap: `CapControl` (the controller's clock limit over one window),
  `window_control` (the control that holds a window's mean power at the cap),
  `controlled_point`, `windows`; `control_level` / `level_control` (a control as one number).
- `SimulatedDevice`: a ModelDevice (source "simulated") over a preset: noiseless figures at
  the step's own steady temperature (`expected`, `expected_step`, the latter with the cap held
  per window and a job's waits after the kernels), its idle power at held clocks
  (`idle_power_at`), timed launches with a first-order thermal state and a controller whose
  level is carried from window to window (`_close_window`), operator changes
  (`set_ambient_c`, `set_power_cap_w`) and the sensors NVML would give (temperature, power
  limit, SM clock, throttle reasons); a whole step at once (`step_cost`: each kernel under the
  control that holds its window at the cap, as a settled controller does; `_after_step`: the
  temperature moves and the controller is left settled there).
The constants and their sources: presets.py. The model's equations and reasoning:
docs/design-runtime.md#simulatorpy-presetspy-workloadspy-probe_kernelspy; its fidelity:
docs/benchmarks.md ("The simulator's calibration").
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kdvfs.runtime.model_device import STATE_STEP_S, ModelDevice, StepCost
from kdvfs.runtime.presets import Preset, get_preset
from kdvfs.runtime.types import ClockGrid, ClockPair, HostWait, Kernel


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


def _time_parts(p: Preset, k: Kernel, core_mhz: float, mem_mhz: float) -> tuple[float, float, float, float]:
    """(total time, busy compute time, busy memory time, wave latency time) of one launch.
    The busy times are what the work needs at the kind's full rate; a working set that fits
    in L2 streams from it (at the core clock) rather than from DRAM; a kind that runs in
    waves of thread blocks pays a fixed latency per whole wave over the SMs; a recorded
    kernel's work runs at its busy share of the kind's rate (so the busy times over the
    launch's time fall by that share); a launch too small to fill the SMs blends into the
    kind's floor (scaled by the core clock)."""
    km = p.kind_model(k.kind)
    core_hz = core_mhz * 1e6
    rate = (p.tensor_flop_per_cycle if k.tensor_core else p.simt_flop_per_cycle) * km.rate_eff
    t_comp = k.flops / (rate * core_hz)
    l2_bw = p.core_bytes_per_cycle * core_hz
    dram_bw = min(p.mem_bw_bytes_per_s * mem_mhz / p.max_mem_mhz, l2_bw)
    t_mem = k.bytes_moved / (km.bw_eff * (l2_bw * p.l2_stream_rel if l2_resident(p, k) else dram_bw))
    t_wave = waves(p, k) * km.wave_s * p.max_core_mhz / core_mhz
    floor_s = km.floor_s * p.max_core_mhz / core_mhz
    t_busy = t_comp + t_wave
    t_work = (max(t_busy, t_mem) + (1.0 - p.overlap) * min(t_busy, t_mem)) / k.busy_share
    t_run = (t_work**p.floor_blend + floor_s**p.floor_blend) ** (1.0 / p.floor_blend)
    return p.launch_latency_s + max(t_run, k.wait_s), t_comp, t_mem, t_wave


def l2_resident(p: Preset, k: Kernel) -> bool:
    """Whether a launch's working set (every byte it moves) fits in L2, so that launches back
    to back find it there and DRAM carries none of its traffic."""
    return 0.0 < k.bytes_moved <= p.l2_bytes


def waves(p: Preset, k: Kernel) -> int:
    """Whole waves of thread blocks a launch runs over the SMs (0 for a kind not modelled in
    waves): blocks of the kind's block_bytes of input and output, sm_count at a time."""
    km = p.kind_model(k.kind)
    if km.block_bytes <= 0.0 or k.bytes_moved <= 0.0:
        return 0
    return math.ceil(math.ceil(k.bytes_moved / km.block_bytes) / p.sm_count)


def _power_w(p: Preset, k: Kernel, core_mhz: float, mem_mhz: float, temp_c: float) -> tuple[float, float]:
    """(time, power) of one launch at exactly these clocks: activity follows how busy the
    chip is (busy time over launch time), so a launch that cannot fill it draws far less;
    DRAM draws for traffic only when the working set does not fit in L2."""
    t, t_comp, t_mem, t_wave = _time_parts(p, k, core_mhz, mem_mhz)
    u_comp, u_mem, u_wave = min(1.0, t_comp / t), min(1.0, t_mem / t), min(1.0, t_wave / t)
    v = voltage_rel(p, core_mhz)
    static = p.static_w * v * (1.0 + p.leak_per_c * (temp_c - p.leak_ref_c))
    km = p.kind_model(k.kind)
    act_comp = p.act_tensor if k.tensor_core else p.act_simt
    act_stream = p.act_mem if km.act_stream is None else km.act_stream
    after_gap = after_gap_factor(p, k.idle_before_s)
    activity = p.act_idle + after_gap * act_comp * u_comp + after_gap * act_stream * max(u_mem, u_wave)
    core = p.core_dyn_w * v * v * (core_mhz / p.max_core_mhz) * activity
    # DRAM traffic against the card's streaming peak (none when L2 holds the working set)
    traffic = 0.0 if l2_resident(p, k) else after_gap * u_mem * km.bw_eff
    mem = p.mem_w * (mem_mhz / p.max_mem_mhz) * (p.mem_base_rel + (1.0 - p.mem_base_rel) * traffic)
    return t, static + core + mem


def after_gap_factor(p: Preset, idle_before_s: float) -> float:
    """The share of its power above idle (activity over the clocked idle core, DRAM traffic) a
    launch draws after the GPU idled `idle_before_s` (s) before it, against the same launch back
    to back: 1 - after_gap_drop_share x (1 - exp(-gap / after_gap_tau_s)); 1 with no gap or on a
    preset that does not model it (presets.Preset.after_gap_drop_share 0)."""
    if idle_before_s <= 0.0 or p.after_gap_drop_share <= 0.0 or p.after_gap_tau_s <= 0.0:
        return 1.0
    return 1.0 - p.after_gap_drop_share * -math.expm1(-idle_before_s / p.after_gap_tau_s)


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


def _mean_clock_mhz(ops: Sequence[OperatingPoint], times_s: Sequence[float]) -> float:
    """The time-weighted mean core clock of launches, MHz."""
    total_s = sum(times_s)
    if total_s <= 0.0:
        return ops[-1].core_mhz
    return sum(op.core_mhz * t for op, t in zip(ops, times_s)) / total_s


@dataclass(frozen=True)
class CapControl:
    """What the cap controller does over one window, the same for every launch in it: its clock
    limit dips from the card's maximum to hunt_top_mhz for 1 - share_hi of the time, or,
    further over the cap (share_hi None), hunts +/- auto_hunt_rel around a centre clock, half
    the time each side. Each launch runs at the lower of its own ceiling and the limit."""

    share_hi: float | None
    centre_mhz: float = 0.0


UNCAPPED = CapControl(share_hi=1.0)


def controlled_point(
    p: Preset, k: Kernel, pair: ClockPair | None, temp_c: float, control: CapControl
) -> OperatingPoint:
    """One launch under a window's cap control: at the lower of its own ceiling (the stock
    maximum or its locked clock) and the controller's clock limit; a locked clock under the
    limit runs as it is."""
    ceiling = float(p.max_core_mhz if pair is None else pair.core_mhz)
    mem = p.max_mem_mhz if pair is None else pair.mem_mhz
    if control.share_hi is not None:
        lo_mhz, hi_mhz, share_hi = hunt_top_mhz(p), float(p.max_core_mhz), control.share_hi
    else:
        lo_mhz = max(min(p.core_levels_mhz), control.centre_mhz * (1.0 - p.auto_hunt_rel))
        hi_mhz, share_hi = control.centre_mhz * (1.0 + p.auto_hunt_rel), 0.5
    if ceiling <= lo_mhz or (share_hi >= 1.0 and ceiling <= hi_mhz):
        t, power = _power_w(p, k, ceiling, mem, temp_c)
        return OperatingPoint(t, t * power, ceiling, mem, power, capped=False)
    t, mean_w, clock = _mix(p, k, lo_mhz, min(hi_mhz, ceiling), share_hi, mem, temp_c)
    return OperatingPoint(t, t * mean_w, clock, mem, mean_w, capped=True)


WindowEntry = tuple[Kernel, ClockPair | None, float]
"""(kernel, clocks or None for stock, launches) of one stretch of a window."""
IdlePart = tuple[float, ClockPair | None]
"""(s, clocks held or None for stock) of a stretch the card idles after a step's kernels."""


def window_control(
    p: Preset,
    entries: Sequence[WindowEntry],
    temp_c: float,
    cap_w: float,
    fixed: tuple[float, float] = (0.0, 0.0),
    point: Callable[[Kernel, ClockPair | None, CapControl], OperatingPoint] | None = None,
) -> CapControl:
    """The control that holds the window's mean power (its launches, and a stretch the control
    does not change, `fixed` = (s, W): idle, or what was spent already) at the card's limit;
    UNCAPPED when its mean is under it. The
    controller's settings are discrete (shares in steps of 1 / SHARE_STEPS, centres in whole
    MHz), so `point` (a launch under a control; default controlled_point) can be cached."""
    limit = effective_cap_w(p, cap_w, temp_c)
    point = point or (lambda k, pair, control: controlled_point(p, k, pair, temp_c, control))

    def mean_w(control: CapControl) -> float:
        time_s, energy_j = fixed[0], fixed[0] * fixed[1]
        for k, pair, n in entries:
            op = point(k, pair, control)
            time_s += n * op.time_s
            energy_j += n * op.energy_j
        return energy_j / time_s

    if mean_w(UNCAPPED) <= limit:
        return UNCAPPED
    if mean_w(CapControl(share_hi=0.0)) <= limit:  # the mean rises with the share at the ceiling
        step = _last_under(lambda i: mean_w(CapControl(i / SHARE_STEPS)) <= limit, 0, SHARE_STEPS)
        return CapControl(step / SHARE_STEPS)
    lowest, highest = min(p.core_levels_mhz), p.max_core_mhz
    return CapControl(
        None, float(_last_under(lambda c: mean_w(CapControl(None, float(c))) <= limit, lowest, highest))
    )


def _last_under(ok: Callable[[int], bool], lo: int, hi: int) -> int:
    """The largest integer in [lo, hi] where ok holds, ok(lo) assumed, ok monotone falling."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo


def windows(durations_s: Sequence[float], window_s: float) -> list[list[tuple[int, float]]]:
    """Cut a sequence of stretches (their durations, s) into consecutive windows of window_s:
    per window, (stretch index, share of that stretch in it)."""
    out: list[list[tuple[int, float]]] = [[]]
    room_s = window_s
    for i, d in enumerate(durations_s):
        left_s = d
        while left_s > 0.0:
            take_s = min(left_s, room_s)
            out[-1].append((i, take_s / d))
            left_s -= take_s
            room_s -= take_s
            if room_s <= 0.0:
                out.append([])
                room_s = window_s
    return [w for w in out if w]


SHARE_STEPS = 200
"""Steps of the share at the ceiling a window's control can set (count): 0.5% each."""
STRETCH_LOG = 20_000
"""Stretches of launches a simulated card remembers for a fast-forward (count): more than a
whole GPT-3-XL step's (~1,000)."""
CONTROL_CACHE = 20_000
"""Windows' controls a simulated card keeps cached before it forgets them all (count): a long
timed run's windows are nearly all distinct."""
HOLD_GAIN = 0.01
"""Share of each window's power over the cap (under it: less) that the timed runs' cap
controller adds to how far below the cap it holds its windows after (dimensionless; never
below 0): an integral term, so that the card's mean power is held at the cap, as a limit holds
it and as the noiseless figures (each window held at the cap) have it. Without it the
controller's lag (CONTROL_GAIN) let the simulated H200's whole GPT-3-XL step draw 714 W at
stock under its 700-W cap and run 1.0% faster than the noiseless figures of the same step;
with it, 699 W and within 0.1% (the layer's too). Assumed, as the gain is."""
HOLD_MAX_SHARE = 0.2
"""Most the cap controller holds its windows below the cap, a share of the cap."""
CONTROL_GAIN = 0.5
"""Share of the way from its level to the last window's own level the timed runs' cap
controller moves at each window's end (dimensionless): settled in ~3 windows. Assumed (no
measurement of the controller's response exists here); 0.5 keeps a 7-ms step's time as
quiet as the card's own noise and settles a 1-ms GEMM step within 30 ms."""


def control_level(p: Preset, control: CapControl) -> float:
    """A control as one number that rises with the power it lets through: the share at the
    ceiling (0..1), or, hunting, how far its centre sits below the stock ceiling's dip
    (hunt_top_mhz, where hunting meets a share of 0) towards the lowest clock (-1..0)."""
    if control.share_hi is not None:
        return control.share_hi
    top_mhz, lowest = hunt_top_mhz(p), min(p.core_levels_mhz)
    return min(-1.0 / (top_mhz - lowest), (control.centre_mhz - top_mhz) / (top_mhz - lowest))


def level_control(p: Preset, level: float) -> CapControl:
    """The control on the controller's discrete grid nearest a level (control_level's inverse)."""
    if level >= 0.0:
        share = round(min(level, 1.0) * SHARE_STEPS) / SHARE_STEPS
        return UNCAPPED if share >= 1.0 else CapControl(share)
    top_mhz, lowest = hunt_top_mhz(p), min(p.core_levels_mhz)
    return CapControl(
        None, float(min(math.floor(top_mhz), round(top_mhz + max(level, -1.0) * (top_mhz - lowest))))
    )


def hunt_top_mhz(p: Preset) -> float:
    """The hunting centre whose mean clock is the stock ceiling's dip (a share of 0 at the
    ceiling), MHz: where the two regimes of the cap controller meet."""
    return p.max_core_mhz * (1.0 - p.auto_hunt_rel)


def idle_power_w(p: Preset, core_mhz: float, mem_mhz: float, temp_c: float) -> float:
    """Board power with no kernel running at these clocks."""
    v = voltage_rel(p, core_mhz)
    static = p.static_w * v * (1.0 + p.leak_per_c * (temp_c - p.leak_ref_c))
    core = p.core_dyn_w * v * v * (core_mhz / p.max_core_mhz) * p.act_idle
    return static + core + p.mem_w * (mem_mhz / p.max_mem_mhz) * p.mem_base_rel


IDLE_QUANTA = 20
"""A step's idle time is placed to 1/IDLE_QUANTA of the power window when its costs are looked
up (count): costs are cached by it."""
THERMAL_BISECTION_STEPS = 12
"""Bisection steps for the steady temperature (count): the bracket shrinks to ~0.03 C."""
SM_CLOCK_TAU_S = 0.05
"""Time over which the SM clock sensor averages the launches' clocks, s (a poller samples the
clock many times a step; a step's kernels last 10-100 ms)."""


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
        self._clock_mhz = float(self.preset.max_core_mhz)  # the core clock, averaged over SM_CLOCK_TAU_S
        self._cache: dict[tuple, OperatingPoint] = {}
        self._controls: dict[tuple, CapControl] = {}  # noiseless windows' controls
        # the cap controller of timed runs: its level (control_level), the control it sets,
        # and the window it is watching
        self._level = 1.0
        self._control = UNCAPPED
        self._launched: tuple[Kernel, ClockPair | None, float, CapControl] | None = None
        self._window: dict[tuple[Kernel, ClockPair | None], float] = {}  # launches in the window
        self._window_s = 0.0
        self._idle_s = 0.0  # idle time in the window, s
        self._idle_j = 0.0  # energy spent idle in the window, J
        self._window_j = 0.0  # energy its launches drew in the window, J
        # how far below the cap the controller holds its windows, so that the windows it caps
        # average the cap (its lag lets a window past the cap where a step's power rises), W
        self._hold_w = 0.0
        self._fast_forward = False
        # the launches run lately, (start s, kernel, clocks, launches, control), for a fast-forward
        self._stretches: deque[tuple[float, Kernel, ClockPair | None, float, CapControl]] = deque(
            maxlen=STRETCH_LOG
        )
        # (kernel, clocks, control, temperature) of a window that held one launch alone and left
        # the controller at its own control: a run of it then needs no window by window watch
        self._settled_on: tuple[Kernel, ClockPair | None, CapControl, float] | None = None

    # --- operator-side changes (drift scenarios) ---------------------------------------
    def set_ambient_c(self, ambient_c: float) -> None:
        self.ambient_c = ambient_c
        self._cache.clear()
        self._controls.clear()

    def set_power_cap_w(self, cap_w: float) -> None:
        self.power_cap_w = cap_w
        self._hold_w = 0.0
        self._cache.clear()
        self._controls.clear()

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
        """The (mean) core clock of the last launch run: NVML's reading now."""
        return self._last_point.core_mhz if self._last_point else float(self.preset.max_core_mhz)

    def mean_sm_clock_mhz(self) -> float:
        """The core clock the card ran at, the cap controller's included: its launches' clocks
        averaged over the last SM_CLOCK_TAU_S of their time, as a poller sampling NVML through
        the steps reads it (a simulated job reports this: its sensors are read at each step's
        end, where the last launch is the same small kernel every step)."""
        return self._clock_mhz

    def _ran_at(self, clock_mhz: float, duration_s: float) -> None:
        """Launches ran `duration_s` at a mean core clock: the averaged clock follows."""
        self._clock_mhz += (clock_mhz - self._clock_mhz) * -math.expm1(-duration_s / SM_CLOCK_TAU_S)

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

    def expected_step(
        self,
        items: Sequence[tuple[Kernel, ClockPair | None, float]],
        waits: Sequence[Sequence[IdlePart]] = (),
        rare_idle: Sequence[IdlePart] = (),
        host_waits: Sequence[HostWait] = (),
    ) -> tuple[float, float]:
        """Noiseless time and energy of the items run over and over, at their own steady
        temperature (steady_temperature_c). A job's waits for its host, at the idle power of
        the clocks held (idle_power_at), included in the time, energy and temperature: `waits`,
        equally likely waits each step ends with (each as (s, clocks) parts in order; the
        figures their mean), in the cap's window that holds the kernels' end (a controller
        lets more through a window that idles, as step_cost places a step's idle); or
        `host_waits`, equally likely waits each a share of the kernels' time, as a simulated
        job waits them (_figures); `rare_idle`, (s, clocks) of idle per step on average in
        long waits of their own (a checkpoint every N steps), whose windows hold no kernel."""
        temp_c = self.steady_temperature_c(items, waits, rare_idle, host_waits)
        return self._figures(items, temp_c, waits, rare_idle, host_waits)

    def steady_temperature_c(
        self,
        items: Sequence[tuple[Kernel, ClockPair | None, float]],
        waits: Sequence[Sequence[IdlePart]] = (),
        rare_idle: Sequence[IdlePart] = (),
        host_waits: Sequence[HostWait] = (),
    ) -> float:
        """The steady temperature T = ambient + R_th x mean power(T) of the items (and the
        waits after them, expected_step) run over and over. The gap ambient + R_th x P(T) - T
        falls as T rises (leakage adds far less than a degree per degree; above the thermal
        limit the cap pulls power down), so its root is unique and bisection finds it, where
        plain step oscillates at the thermal limit."""
        idle_pairs = {pair for wait in waits for _, pair in wait} | {pair for _, pair in rare_idle}
        idle_pairs |= {pair for wait in host_waits for pair in wait.pairs}
        for pair in ({pair for _, pair, _ in items} | idle_pairs) - {None}:
            self.grid.index(pair)
        lo = self.ambient_c
        hi = self.ambient_c + self.preset.r_th_c_per_w * self.power_cap_w * 1.5
        for _ in range(THERMAL_BISECTION_STEPS):
            mid = 0.5 * (lo + hi)
            time_s, energy_j = self._figures(items, mid, waits, rare_idle, host_waits)
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
        self,
        items: Sequence[tuple[Kernel, ClockPair | None, float]],
        temp_c: float,
        waits: Sequence[Sequence[IdlePart]] = (),
        rare_idle: Sequence[IdlePart] = (),
        host_waits: Sequence[HostWait] = (),
    ) -> tuple[float, float]:
        """Time and energy of the items in order, the cap held over windows of the preset's
        power_window_s (a window of one kernel: that kernel's own capped point), then the
        waits (expected_step): each wait's start in the room the kernels leave in their last
        window, the mean over the waits; the rare idle on its own. A host wait is costed as
        SimulatedJob.step_until_update costs a step: its window sees rel x the kernels' time
        with no wait after them, idle at the clocks the kernels end at (step_cost), and the
        wait is rel x the kernels' time under that window's control."""
        temp_c = round(temp_c * 2.0) / 2.0
        rare_s = sum(s for s, _ in rare_idle if s > 0.0)
        rare_j = sum(s * self.idle_power_at(pair, temp_c) for s, pair in rare_idle if s > 0.0)
        if host_waits:
            return self._host_waited(items, temp_c, host_waits, rare_s, rare_j)
        waits = [[(s, pair) for s, pair in wait if s > 0.0] for wait in waits] or [[]]
        wait_s = [sum(s for s, _ in wait) for wait in waits]
        wait_j = [sum(s * self.idle_power_at(pair, temp_c) for s, pair in wait) for wait in waits]
        idle_s = sum(wait_s) / len(waits) + rare_s
        idle_j = sum(wait_j) / len(waits) + rare_j
        if self.preset.power_window_s <= 0.0:
            points = [(self.point(k, pair, temp_c), n) for k, pair, n in items]
            return (
                sum(op.time_s * n for op, n in points) + idle_s,
                sum(op.energy_j * n for op, n in points) + idle_j,
            )
        cut, head_s, head_j, room_s = self._windows_but_last(items, temp_c)
        last_s = last_j = 0.0
        for s, j in zip(wait_s, wait_j, strict=True):
            idle_in_s = min(s, room_s) if room_s > 1e-12 else 0.0
            fixed = (round(idle_in_s, 6), round(j / s, 1)) if idle_in_s > 0.0 else (0.0, 0.0)
            t, e = self._window_cost(items, cut[-1], temp_c, fixed)
            last_s += t / len(waits)
            last_j += e / len(waits)
        return head_s + last_s + idle_s, head_j + last_j + idle_j

    def _windows_but_last(
        self, items: Sequence[tuple[Kernel, ClockPair | None, float]], temp_c: float
    ) -> tuple[list[list[tuple[int, float]]], float, float, float]:
        """The items cut into windows (windows, by their uncapped times), the time and energy
        of every window but the last (s, J), and the room the last leaves for idle, s."""
        free_s = [n * self._controlled(k, pair, temp_c, UNCAPPED).time_s for k, pair, n in items]
        cut = windows(free_s, self.preset.power_window_s)
        head_s = head_j = 0.0
        for window in cut[:-1]:
            t, e = self._window_cost(items, window, temp_c)
            head_s += t
            head_j += e
        room_s = self.preset.power_window_s - sum(free_s[i] * share for i, share in cut[-1])
        return cut, head_s, head_j, room_s

    def _host_waited(
        self,
        items: Sequence[tuple[Kernel, ClockPair | None, float]],
        temp_c: float,
        host_waits: Sequence[HostWait],
        rare_s: float,
        rare_j: float,
    ) -> tuple[float, float]:
        """_figures of the items and the host waits after them (their mean), the rare idle's
        rare_s s and rare_j J added."""
        if self.preset.power_window_s <= 0.0:
            kernels = [(self.point(k, pair, temp_c), n) for k, pair, n in items]
            kernels_s = sum(op.time_s * n for op, n in kernels)
            kernels_j = sum(op.energy_j * n for op, n in kernels)
            costs = [(kernels_s, kernels_j)] * len(host_waits)
        else:
            cut, head_s, head_j, room_s = self._windows_but_last(items, temp_c)
            alone_s = head_s + self._window_cost(items, cut[-1], temp_c)[0]  # no wait after them
            costs = []
            for wait in host_waits:
                seen_s = wait.rel * alone_s
                idle_in_s = min(seen_s, room_s) if room_s > 1e-12 else 0.0
                idle_w = self.idle_power_at(wait.pair, temp_c)
                fixed = (round(idle_in_s, 6), round(idle_w, 1)) if idle_in_s > 0.0 else (0.0, 0.0)
                t, e = self._window_cost(items, cut[-1], temp_c, fixed)
                costs.append((head_s + t, head_j + e))
        time_s = energy_j = 0.0
        for wait, (kernels_s, kernels_j) in zip(host_waits, costs, strict=True):
            parts = wait.parts(kernels_s)
            time_s += kernels_s + sum(s for s, _ in parts)
            energy_j += kernels_j + sum(s * self.idle_power_at(pair, temp_c) for s, pair in parts if s > 0.0)
        n = len(host_waits)
        return time_s / n + rare_s, energy_j / n + rare_j

    def _window_cost(
        self,
        items: Sequence[tuple[Kernel, ClockPair | None, float]],
        window: list[tuple[int, float]],
        temp_c: float,
        fixed: tuple[float, float] = (0.0, 0.0),
    ) -> tuple[float, float]:
        """Time and energy of one window's share of the items (windows), `fixed` its idle
        (s, W) as the controller sees it."""
        entries = [(items[i][0], items[i][1], items[i][2] * share) for i, share in window]
        if len(entries) == 1 and fixed[0] == 0.0:
            ops = [self.point(entries[0][0], entries[0][1], temp_c)]
        else:
            control = self._window_control(entries, temp_c, fixed)
            ops = [self._controlled(k, pair, temp_c, control) for k, pair, _ in entries]
        return (
            sum(op.time_s * n for op, (_, _, n) in zip(ops, entries, strict=True)),
            sum(op.energy_j * n for op, (_, _, n) in zip(ops, entries, strict=True)),
        )

    def step_cost_key(self, idle_s: float = 0.0) -> tuple[float, float, float]:
        """(temperature to 0.5 C, power cap W, the idle after the kernels that a window sees,
        to 1/IDLE_QUANTA of the window, s): what a step's noiseless costs depend on."""
        return round(self._temp_c * 2.0) / 2.0, self.power_cap_w, self._idle_bucket_s(idle_s)

    def _idle_bucket_s(self, idle_s: float) -> float:
        window_s = self.preset.power_window_s
        if window_s <= 0.0 or idle_s <= 0.0:
            return 0.0
        quantum_s = window_s / IDLE_QUANTA
        return round(min(idle_s, window_s) / quantum_s) * quantum_s

    def launch_time_s(self, kernel: Kernel, pair: ClockPair | None) -> float:
        """Noiseless time of one launch now: under the cap controller's control now (per launch
        when the preset has no window), at the temperature now (0.5 C)."""
        if self.preset.power_window_s <= 0.0:
            return self.point(kernel, pair, self._temp_c).time_s
        return self._controlled(kernel, pair, round(self._temp_c * 2.0) / 2.0, self._control).time_s

    def step_cost(
        self, items: Sequence[tuple[Kernel, ClockPair | None, int]], idle_s: float = 0.0
    ) -> StepCost:
        """Each item's noiseless cost at the temperature now (0.5 C), the cap held over windows
        of power_window_s from the step's start as in _figures (a settled controller), idle_s
        (to its bucket, step_cost_key) idle after the kernels at the last kernel's clocks in the
        windows that hold it (a controller lets more through a window that idles); state:
        (the last launch's operating point, the control of the step's last window of launches)."""
        temp_c = round(self._temp_c * 2.0) / 2.0
        items = list(items)
        if self.preset.power_window_s <= 0.0:
            ops = [self.point(k, pair, temp_c) for k, pair, _ in items]
            times_s = [op.time_s * n for op, (_, _, n) in zip(ops, items)]
            return StepCost.of(
                times_s,
                [op.energy_j * n for op, (_, _, n) in zip(ops, items)],
                (ops[-1], UNCAPPED, _mean_clock_mhz(ops, times_s)),
            )
        idle_s = self._idle_bucket_s(idle_s)
        p = self.preset
        idle_w = self.idle_power_at(items[-1][1], temp_c)
        times_s, energies_j = [0.0] * len(items), [0.0] * len(items)
        free_s = [n * self._controlled(k, pair, temp_c, UNCAPPED).time_s for k, pair, n in items]
        control, last = None, None
        ran: list[OperatingPoint] = []  # every stretch's point and its time, for the mean clock
        ran_s: list[float] = []
        for window in windows([*free_s, idle_s] if idle_s > 0.0 else free_s, p.power_window_s):
            entries = [
                (items[i][0], items[i][1], items[i][2] * share) for i, share in window if i < len(items)
            ]
            idle_in_s = sum(idle_s * share for i, share in window if i == len(items))
            if not entries:
                continue
            if len(entries) == 1 and idle_in_s == 0.0:
                control = None
                ops = [self.point(entries[0][0], entries[0][1], temp_c)]
            else:
                control = self._window_control(entries, temp_c, (round(idle_in_s, 6), round(idle_w, 1)))
                ops = [self._controlled(k, pair, temp_c, control) for k, pair, _ in entries]
            for (i, _), op, (_, _, n) in zip(window, ops, entries):
                times_s[i] += op.time_s * n
                energies_j[i] += op.energy_j * n
                ran.append(op)
                ran_s.append(op.time_s * n)
                last = op
        if control is None:  # the last window held one kernel alone: its own capped point
            control = self._window_control([(items[-1][0], items[-1][1], 1.0)], temp_c)
        return StepCost.of(times_s, energies_j, (last, control, _mean_clock_mhz(ran, ran_s)))

    def _after_step(self, duration_s: float, power_w: float, cost: StepCost) -> None:
        """A step run at once: the temperature moves over it at its mean power; the last launch's
        point is the step's last; the cap controller is left settled at the control of the
        step's last window, watching a fresh window."""
        p = self.preset
        steady_c = self.ambient_c + p.r_th_c_per_w * power_w
        self._temp_c = steady_c + (self._temp_c - steady_c) * math.exp(-duration_s / p.tau_s)
        last, control, clock_mhz = cost.state
        self._ran_at(clock_mhz, cost.time_s)
        self._last_point = last
        if p.power_window_s > 0.0:
            if self._control != control:
                self._level = control_level(p, control)
                self._control = control
            self._clear_window()
            self._launched, self._settled_on = None, None
            self._stretches.clear()

    def _window_control(
        self, entries: Sequence[WindowEntry], temp_c: float, fixed: tuple[float, float] = (0.0, 0.0)
    ) -> CapControl:
        """window_control of a noiseless window (cached), `fixed` its idle (s, W)."""
        key = (tuple(entries), temp_c, fixed)
        control = self._controls.get(key)
        if control is None:
            if len(self._controls) >= CONTROL_CACHE:
                self._controls.clear()
            control = window_control(
                self.preset, entries, temp_c, self.power_cap_w, fixed, point=self._point_at(temp_c)
            )
            self._controls[key] = control
        return control

    def _steady_control(self, items: Sequence[WindowEntry], temp_c: float) -> CapControl:
        """The control the items' last window runs under when they repeat over and over: the
        one the noiseless figures (_figures) give that window."""
        free_s = [n * self._controlled(k, pair, temp_c, UNCAPPED).time_s for k, pair, n in items]
        last = windows(free_s, self.preset.power_window_s)[-1]
        return self._window_control(
            [(items[i][0], items[i][1], items[i][2] * share) for i, share in last], temp_c
        )

    def _controlled(
        self, k: Kernel, pair: ClockPair | None, temp_c: float, control: CapControl
    ) -> OperatingPoint:
        key = (k, pair, temp_c, control)
        op = self._cache.get(key)
        if op is None:
            op = controlled_point(self.preset, k, pair, temp_c, control)
            self._cache[key] = op
        return op

    def _point_at(self, temp_c: float) -> Callable[[Kernel, ClockPair | None, CapControl], OperatingPoint]:
        return lambda k, pair, control: self._controlled(k, pair, temp_c, control)

    def _launch_cost(self, kernel: Kernel, pair: ClockPair | None) -> tuple[float, float]:
        """A timed launch: under the control the cap controller set from the last window it
        watched (per launch when the preset has no window)."""
        temp_c = round(self._temp_c * 2.0) / 2.0
        if self.preset.power_window_s <= 0.0:
            op = self.point(kernel, pair, self._temp_c)
        else:
            op = self._controlled(kernel, pair, temp_c, self._control)
            self._launched = (kernel, pair, op.time_s, self._control)
            # the controller acts between stretches: none outlasts its window unless it is
            # settled on this very launch (an isolated measurement's run of one kernel)
            settled = self._settled(kernel, pair)
            self.state_step_s = STATE_STEP_S if settled else min(STATE_STEP_S, self.preset.power_window_s)
        self._last_point = op
        self._ran_at(op.core_mhz, op.time_s)
        return op.time_s, op.energy_j

    def repeat_since(self, start_s: float, start_true_energy_j: float, times: int) -> float:
        """As ModelDevice's, the repeats run as that many identical windows settle the cap
        controller (_steady_correction), and the controller ends there: at the control of the
        stretch's last window in the noiseless figures, so the next stretch run launch by launch
        starts where the repeats left it, whatever its phase was in the one repeated."""
        if times <= 0 or self._now_s <= start_s:
            return 0.0
        items = self._items_since(start_s)
        self._fast_forward = True
        try:
            added_s = super().repeat_since(start_s, start_true_energy_j, times)
        finally:
            self._fast_forward = False
        if added_s > 0.0 and items and self.preset.power_window_s > 0.0:
            temp_c = round(self._temp_c * 2.0) / 2.0
            self._level = control_level(self.preset, self._steady_control(items, temp_c))
            self._control = level_control(self.preset, self._level)
            self._clear_window()
            self._stretches.clear()
        return added_s

    def _steady_correction(self, start_s: float) -> tuple[float, float]:
        """What one repeat of the stretch since start_s runs differently from the stretch itself
        (noiseless s, J): its launches under the controls of the noiseless figures (_figures:
        the cap held over each window, as a settled controller holds it) less the same launches
        under the controls they ran under."""
        stretches = [st for st in self._stretches if st[0] >= start_s - 1e-12]
        if not stretches or self.preset.power_window_s <= 0.0:
            return 0.0, 0.0
        temp_c = round(self._temp_c * 2.0) / 2.0
        steady_s, steady_j = self._figures(self._items_since(start_s), temp_c)
        ran = [(self._controlled(k, pair, temp_c, control), n) for _, k, pair, n, control in stretches]
        return steady_s - sum(op.time_s * n for op, n in ran), steady_j - sum(
            op.energy_j * n for op, n in ran
        )

    def _items_since(self, start_s: float) -> list[WindowEntry]:
        """The launches run since start_s in order, (kernel, clocks, launches), a kernel's
        consecutive stretches at the same clocks merged."""
        items: list[WindowEntry] = []
        for t_s, k, pair, n, _ in self._stretches:
            if t_s < start_s - 1e-12:
                continue
            if items and items[-1][0] == k and items[-1][1] == pair:
                items[-1] = (k, pair, items[-1][2] + n)
            else:
                items.append((k, pair, n))
        return items

    def _watch_window(self, duration_s: float, power_w: float) -> None:
        """The cap controller's view: what ran in its window (launches, idle time), a stretch
        longer than the window's rest split across windows. At each window's end
        (_close_window) it sets the next window's control."""
        if self._fast_forward:
            return
        launched, self._launched = self._launched, None
        if launched is not None:
            launches = duration_s / (launched[2] * self._noise[0])  # whole launches, as run() ran them
            self._stretches.append(
                (self._now_s - duration_s, launched[0], launched[1], launches, launched[3])
            )
        window_s = self.preset.power_window_s
        left_s = duration_s
        if launched is not None:
            left_s = self._skip_settled_windows(launched[0], launched[1], left_s)
        while left_s > 0.0:
            take_s = min(left_s, window_s - self._window_s)
            if launched is not None:
                key = (launched[0], launched[1])
                self._window[key] = self._window.get(key, 0.0) + take_s / (launched[2] * self._noise[0])
                self._window_j += take_s * power_w
            else:
                self._idle_s += take_s
                self._idle_j += take_s * power_w
            self._window_s += take_s
            left_s -= take_s
            if self._window_s >= window_s * (1.0 - 1e-9):
                self._close_window()

    def _skip_settled_windows(self, kernel: Kernel, pair: ClockPair | None, left_s: float) -> float:
        """A stretch of one launch the controller has settled on, alone in its window: its whole
        windows but the last change nothing but the level's rest, so they are closed at once.
        Returns the stretch's time left to watch window by window, s."""
        window_s = self.preset.power_window_s
        alone = set(self._window) <= {(kernel, pair)} and not self._idle_s
        whole = math.floor((self._window_s + left_s) / window_s * (1.0 + 1e-9))
        if not (alone and whole > 1 and self._settled(kernel, pair)):
            return left_s
        target_level = control_level(self.preset, self._settled_on[2])
        self._level = target_level + (self._level - target_level) * (1.0 - CONTROL_GAIN) ** (whole - 1)
        self._control = level_control(self.preset, self._level)
        skipped_s = (whole - 1) * window_s - self._window_s
        self._clear_window()  # alone: nothing idled in it
        return left_s - skipped_s

    def _close_window(self) -> None:
        """Move the controller's level CONTROL_GAIN of the way to the level that would have held
        the window's mean power at the cap, and set the next window's control from it; a window
        with no launch releases the cap. Carried from window to window, the level settles where
        the windows' mean power is at the cap, whatever the phase of the windows against the
        step, as a real controller's state does."""
        target = None
        if not self._window:
            self._level = 1.0
        else:
            target = self._window_target()
            self._level += CONTROL_GAIN * (control_level(self.preset, target) - self._level)
            # every window's power against the cap, integrated: held under the cap while the
            # card's mean power is over it
            power_w = (self._window_j + self._idle_j) / self._window_s
            self._hold_w += HOLD_GAIN * (power_w - self.power_cap_w)
            self._hold_w = min(max(self._hold_w, 0.0), HOLD_MAX_SHARE * self.power_cap_w)
        self._control = level_control(self.preset, self._level)
        only = next(iter(self._window)) if len(self._window) == 1 and self._idle_s == 0.0 else None
        self._settled_on = None
        if only is not None and self._control == target:
            self._settled_on = (only[0], only[1], target, round(self._temp_c * 2.0) / 2.0)
        self._clear_window()

    def _clear_window(self) -> None:
        """A new window for the controller to watch: no launch, no idle, no energy yet."""
        self._window, self._window_s, self._idle_s, self._idle_j, self._window_j = {}, 0.0, 0.0, 0.0, 0.0

    def _settled(self, kernel: Kernel, pair: ClockPair | None) -> bool:
        """Whether the last window held this launch alone, at this temperature (0.5 C), and
        left the controller at that window's own control."""
        on = self._settled_on
        return (
            on is not None and on[0] == kernel and on[1] == pair and on[3] == round(self._temp_c * 2.0) / 2.0
        )

    def _window_target(self) -> CapControl:
        """The control that would have held the watched window's mean power at the cap: its mix
        per second of window (3 significant digits) and idle share, cached by them."""
        temp_c = round(self._temp_c * 2.0) / 2.0
        per_s = 1.0 / self._window_s
        entries = tuple((k, pair, float(f"{n * per_s:.3g}")) for (k, pair), n in self._window.items())
        idle_w = round(self._idle_j / self._idle_s) if self._idle_s > 0.0 else 0.0
        idle = (float(f"{self._idle_s * per_s:.3g}"), float(idle_w))
        limit_w = round(self.power_cap_w - self._hold_w, 1)
        key = (entries, idle, temp_c, limit_w)
        control = self._controls.get(key)
        if control is None:
            if len(self._controls) >= CONTROL_CACHE:
                self._controls.clear()
            control = window_control(
                self.preset, entries, temp_c, limit_w, idle, point=self._point_at(temp_c)
            )
            self._controls[key] = control
        return control

    def idle_power_at(self, pair: ClockPair | None, temp_c: float | None = None) -> float:
        """Board power with no kernel running while the clocks are held at `pair`, W.

        Args:
            pair: the clocks held, or None for stock (which idles at the lowest core clock and
                the highest memory clock).
            temp_c: the card's temperature, C; None: its temperature now.
        """
        p = self.preset
        core_mhz = float(min(p.core_levels_mhz)) if pair is None else float(pair.core_mhz)
        mem_mhz = p.max_mem_mhz if pair is None else pair.mem_mhz
        return idle_power_w(p, core_mhz, mem_mhz, self._temp_c if temp_c is None else temp_c)

    def _idle_power_w(self) -> float:
        return self.idle_power_at(self._clocks)

    def _on_advance(self, duration_s: float, power_w: float) -> None:
        p = self.preset
        if p.power_window_s > 0.0:
            self._watch_window(duration_s, power_w)
        steady_c = self.ambient_c + p.r_th_c_per_w * power_w
        self._temp_c = steady_c + (self._temp_c - steady_c) * math.exp(-duration_s / p.tau_s)
