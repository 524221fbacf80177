"""What a real training job adds to its steps on top of the GPU's own work, fitted from a recording.

A recorded step (data/h200/jobs/: the interval between CUDA events at consecutive step starts)
is the GPU's own work plus the time the GPU waits for the host: a DataLoader that feeds late,
a `.item()`, an evaluation pass, a checkpoint written to disk. `JobNoise` is that wait, small
enough to ship as a few numbers:

- **Stalls**: each step's wait as a share of the GPU's own step (`wait_rel`, >= 0), drawn from
  the recording's own distribution of it (`wait_rel_quantiles` at `WAIT_QUANTILE_LEVELS`,
  the heavy tail included), correlated from step to step by a Gaussian AR(1)
  (`wait_ar1_per_step`) through which the quantiles are read (a Gaussian copula). The AR(1)
  coefficient is fitted so that the variance of the recording's 1-s means is kept, not only
  its lag-1 correlation: the 1-s means are what a tuner's windows average.
- **Periodic syncs**: every `period_steps[i]` steps, a wait of `period_wait_s[i]` s more (an
  evaluation pass, a checkpoint), at the step whose index plus one is a multiple of the period
  (the recording's step 499 holds the wait of the 500th step's checkpoint).
- **Where the job sees it**: `seen_wait_share` of the relative wait is reported as the step's
  wait (StepReport.wait_s), the rest counts in the step's busy time as on the recorded jobs
  under kdvfs.tune; the card idles through all of it after the step's kernels either way.
- **Power**: the sampler returns only a wait; the device idles through it (SimulatedJob), so
  the card draws its own idle power at the clocks in effect. `wait_power_w` and
  `busy_power_w` are what the recording's energy counter says of the real card (fitted against
  the step series), kept to compare, not applied.

`fit_job_noise(steps_csv, nvml_csv)` fits one from a recording, and `seen_wait_share` how much
of its wait a job under kdvfs.tune sees after its steps (the rest lands inside them, in the
busy time the tuner holds to the budget); `job_noise(name)` reads the
fitted parameters of the three recordings that ship with kdvfs (`vision`, `hf`, `sync`, and
`vision-tuned`, `hf-tuned`: the same waits split as the job under kdvfs.tune saw them;
job_noise.json, written by `python -m kdvfs.experiments.fit_job_noise`) or a JSON file of
the same form; `JobNoiseSampler(noise, seed)` draws each step's wait, deterministic under
its seed; `mean_wait_rel`, `wait_rel_strata`, `mean_periodic_wait_s` and `after_periodic_share`
are a noise's wait per step as the yardstick (tuner/oracle.py's InStep) charges it. Design: docs/design-runtime.md ("Job noise").
"""

from __future__ import annotations

import csv
import gzip
import itertools
import json
import math
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from kdvfs.runtime.types import KdvfsError, check_file_size

WAIT_QUANTILE_LEVELS: tuple[float, ...] = (
    0.0,
    0.01,
    0.05,
    *(i / 20 for i in range(2, 19)),
    0.95,
    0.975,
    0.99,
    0.995,
    0.999,
    1.0,
)
"""Probability levels at which a step's relative wait is kept (denser in the tail)."""

FLOOR_QUANTILE = 0.01
"""The GPU's own step is taken as this quantile of the recorded steps outside the periodic
syncs: a step that fast had the GPU busy throughout (the recordings hold no clean busy time)."""

PERIODIC_OUTLIER_REL = 3.0
"""A step at least this many times the median is a candidate periodic sync."""

PERIOD_HIT_SHARE = 0.8
"""A period is kept when at least this share of its multiples in the recording are outliers."""

WAIT_STRATA = 10
"""Equally likely strata of the relative wait that JobNoise.wait_rel_strata gives (count)."""

MAX_PERIOD_CYCLE = 10_000_000
"""Longest cycle of the periodic syncs (steps) after_periodic_share counts step by step."""

BUILTIN_JSON = "job_noise.json"
"""The fitted parameters of the recordings that ship with kdvfs (in kdvfs.runtime)."""
MAX_JOB_NOISE_BYTES = 64 << 20
"""Largest job noise file read (a fitted job's parameters are a few KiB); bytes."""


@dataclass(frozen=True)
class JobNoise:
    """A recorded job's wait on top of the GPU's own work, per step.

    Args:
        name: what the noise is called (`vision`, `hf`, `sync`, or a file's own name).
        median_step_s: the recording's median step, s (for a workload that matches it).
        floor_step_s: the GPU's own step in the recording (FLOOR_QUANTILE of its steps outside
            the periodic syncs), s: a step's relative wait is its time over this, less one.
        wait_rel_quantiles: the relative wait (wait over the GPU's own step) at
            WAIT_QUANTILE_LEVELS, non-decreasing, >= 0.
        wait_ar1_per_step: the AR(1) coefficient, per step, of the Gaussian the quantiles are
            read through, in [0, 1).
        period_steps: the periodic syncs' periods, steps.
        period_wait_s: each periodic sync's wait, s (added at once where periods coincide).
        period_power_w: the recorded card's power through each periodic sync, W (measured;
            not applied: the simulated card idles through it).
        wait_power_w: the recorded card's power while it waits, W (fitted; not applied).
        busy_power_w: the recorded card's power while it runs the job's kernels, W (fitted;
            not applied).
        recorded_per_step_cv: the recording's per-step CV (for checks).
        recorded_window_1s_cv: the recording's CV of 1-s means, windows from the warm-up's
            end (data/h200/jobs/README.md's figure).
        recorded_window_1s_cv_phase_mean: the same averaged over window phases
            (window_1s_cv_phase_mean; for checks).
        seen_wait_share: the share of each step's relative wait that the job sees, in (0, 1]:
            it falls between the step's end and the next step's start, where kdvfs.tune
            measures a wait (StepReport.wait_s); the rest falls inside the step (the GPU
            starved by its host between kernels) and counts as the clocks' busy time. 1: all
            seen (the bare recordings hold no split); fitted from a recording under kdvfs.tune
            by `seen_wait_share` (the `-tuned` noises). The periodic syncs are always seen.
    """

    name: str
    median_step_s: float
    floor_step_s: float
    wait_rel_quantiles: tuple[float, ...]
    wait_ar1_per_step: float
    period_steps: tuple[int, ...] = ()
    period_wait_s: tuple[float, ...] = ()
    period_power_w: tuple[float, ...] = ()
    wait_power_w: float = math.nan
    busy_power_w: float = math.nan
    recorded_per_step_cv: float = math.nan
    recorded_window_1s_cv: float = math.nan
    recorded_window_1s_cv_phase_mean: float = math.nan
    seen_wait_share: float = 1.0

    def __post_init__(self) -> None:
        q = self.wait_rel_quantiles
        if len(q) != len(WAIT_QUANTILE_LEVELS):
            raise KdvfsError(
                f"job noise {self.name!r}: {len(q)} wait quantiles, expected {len(WAIT_QUANTILE_LEVELS)}"
            )
        if any(not math.isfinite(v) or v < 0.0 for v in q) or any(b < a for a, b in itertools.pairwise(q)):
            raise KdvfsError(
                f"job noise {self.name!r}: wait quantiles must be finite, >= 0 and non-decreasing"
            )
        if not 0.0 <= self.wait_ar1_per_step < 1.0:
            raise KdvfsError(f"job noise {self.name!r}: wait_ar1_per_step must be in [0, 1)")
        if len(self.period_steps) != len(self.period_wait_s):
            raise KdvfsError(f"job noise {self.name!r}: one wait per period expected")
        if any(p < 1 for p in self.period_steps) or any(w < 0.0 for w in self.period_wait_s):
            raise KdvfsError(f"job noise {self.name!r}: periods must be >= 1 step and waits >= 0 s")
        if not 0.0 < self.seen_wait_share <= 1.0:
            raise KdvfsError(f"job noise {self.name!r}: seen_wait_share must be in (0, 1]")

    @property
    def mean_wait_rel(self) -> float:
        """The mean relative wait per step (a share of the GPU's own step, >= 0): the mean of
        the distribution the sampler draws from (the quantiles read linearly between levels)."""
        return float(np.trapezoid(self.wait_rel_quantiles, WAIT_QUANTILE_LEVELS))

    @property
    def mean_periodic_wait_s(self) -> float:
        """The periodic syncs' wait per step on average, s: each period's wait over its period,
        summed (the waits of coinciding periods add up, as the sampler adds them)."""
        return float(sum(w / p for p, w in zip(self.period_steps, self.period_wait_s)))

    @property
    def after_periodic_share(self) -> float:
        """The share of steps that start after a periodic sync (one follows each step whose
        index plus one is a multiple of a period), a fraction: counted over one cycle of the
        periods (their least common multiple; coinciding syncs are one wait), or their periods'
        reciprocals summed where that cycle is longer than MAX_PERIOD_CYCLE steps."""
        if not self.period_steps:
            return 0.0
        cycle = math.lcm(*self.period_steps)
        if cycle > MAX_PERIOD_CYCLE:
            return min(1.0, sum(1.0 / p for p in self.period_steps))
        hit = np.zeros(cycle, dtype=bool)
        for period in self.period_steps:
            hit[period - 1 :: period] = True
        return float(hit.mean())

    def wait_rel_strata(self, strata: int = WAIT_STRATA) -> tuple[float, ...]:
        """The relative wait's mean in each of `strata` equally likely strata of its
        distribution (levels i/strata to (i + 1)/strata), fractions, low to high: their mean is
        mean_wait_rel. What the yardstick (InStep's wait_rel_strata) evaluates a schedule at
        where a switch in flight lands in long waits and not in short ones."""
        if strata < 1:
            raise KdvfsError(f"job noise {self.name!r}: strata must be >= 1, got {strata}")
        levels, quantiles = np.asarray(WAIT_QUANTILE_LEVELS), np.asarray(self.wait_rel_quantiles)
        out = []
        for i in range(strata):
            lo, hi = i / strata, (i + 1) / strata
            x = np.unique(np.concatenate(([lo, hi], levels[(levels > lo) & (levels < hi)])))
            out.append(float(np.trapezoid(np.interp(x, levels, quantiles), x) / (hi - lo)))
        return tuple(out)

    def yardstick_waits(self) -> dict[str, Any]:
        """The waits the yardstick charges after each step, as InStep's and the oracles'
        keywords (tuner/oracle.py): wait_rel (mean_wait_rel), wait_fixed_s
        (mean_periodic_wait_s), wait_rel_strata (wait_rel_strata()) and after_wait_share
        (after_periodic_share)."""
        return {
            "wait_rel": self.mean_wait_rel,
            "wait_fixed_s": self.mean_periodic_wait_s,
            "wait_rel_strata": self.wait_rel_strata(),
            "after_wait_share": self.after_periodic_share,
        }

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> JobNoise:
        try:
            return cls(
                name=str(d["name"]),
                median_step_s=float(d["median_step_s"]),
                floor_step_s=float(d["floor_step_s"]),
                wait_rel_quantiles=tuple(float(v) for v in d["wait_rel_quantiles"]),
                wait_ar1_per_step=float(d["wait_ar1_per_step"]),
                period_steps=tuple(int(v) for v in d.get("period_steps", ())),
                period_wait_s=tuple(float(v) for v in d.get("period_wait_s", ())),
                period_power_w=tuple(float(v) for v in d.get("period_power_w", ())),
                wait_power_w=float(d.get("wait_power_w", math.nan)),
                busy_power_w=float(d.get("busy_power_w", math.nan)),
                recorded_per_step_cv=float(d.get("recorded_per_step_cv", math.nan)),
                recorded_window_1s_cv=float(d.get("recorded_window_1s_cv", math.nan)),
                recorded_window_1s_cv_phase_mean=float(d.get("recorded_window_1s_cv_phase_mean", math.nan)),
                seen_wait_share=float(d.get("seen_wait_share", 1.0)),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise KdvfsError(f"job noise: not a job-noise record ({type(e).__name__}: {e})") from None


class JobNoiseSampler:
    """Each step's wait under a JobNoise, deterministic under its seed.

    Args:
        noise: the fitted noise.
        seed: seeds the draws (the same seed, the same waits for the same steps).
    """

    def __init__(self, noise: JobNoise, seed: int = 0) -> None:
        self.noise = noise
        self._rng = np.random.default_rng(seed)
        self._z = float(self._rng.standard_normal())  # the AR(1) starts in its stationary law
        self._levels = np.asarray(WAIT_QUANTILE_LEVELS)
        self._quantiles = np.asarray(noise.wait_rel_quantiles)
        self._block: list[float] = []  # the next steps' relative waits, drawn a block at a time
        self._next = 0

    def wait_s(self, step: int, step_s: float) -> float:
        """The host-side wait of step `step` (from 0) whose GPU work takes step_s s: the GPU idles
        this long after the step's kernels, before the next step's start. Each call is the next
        step's: the draws come in order, SAMPLER_BLOCK at a time (the same waits as one by one)."""
        rel, fixed_s = self.wait_parts(step)
        return rel * step_s + fixed_s

    def seen_s(self, rel: float, fixed_s: float, step_s: float) -> float:
        """The part of a wait (rel x step_s + fixed_s, wait_parts) that the job sees after its
        step (JobNoise.seen_wait_share of the relative part, all of the periodic), s."""
        return self.noise.seen_wait_share * rel * step_s + fixed_s

    def wait_parts(self, step: int) -> tuple[float, float]:
        """Step `step`'s wait as (share of its GPU work, periodic syncs' s): its wait is
        rel x step_s + fixed_s (wait_s; a call draws the step's wait as wait_s does)."""
        if self._next >= len(self._block):
            self._draw_block()
        rel = self._block[self._next]
        self._next += 1
        fixed_s = 0.0
        for period, period_s in zip(self.noise.period_steps, self.noise.period_wait_s):
            if (step + 1) % period == 0:
                fixed_s += period_s
        return rel, fixed_s

    def _draw_block(self) -> None:
        """The relative waits of the next SAMPLER_BLOCK steps: the AR(1) run on, each value read
        through the quantiles."""
        phi = self.noise.wait_ar1_per_step
        gain = math.sqrt(1.0 - phi * phi)
        z, us = self._z, []
        for eps in self._rng.standard_normal(SAMPLER_BLOCK).tolist():
            z = phi * z + gain * eps
            us.append(0.5 * (1.0 + math.erf(z / math.sqrt(2.0))))
        self._z = z
        self._block = np.interp(us, self._levels, self._quantiles).tolist()
        self._next = 0


SAMPLER_BLOCK = 1024
"""Steps whose waits a JobNoiseSampler draws at once (count)."""


# --- the shipped recordings --------------------------------------------------------------------
def job_noise_names() -> list[str]:
    """The names of the fitted recordings that ship with kdvfs."""
    return sorted(_builtin())


def job_noise(name_or_path: str | Path) -> JobNoise:
    """A shipped recording's noise by name (`vision`, `hf`, `sync`), or a JSON file of one
    (JobNoise.to_dict's form)."""
    builtin = _builtin()
    if str(name_or_path) in builtin:
        return JobNoise.from_dict(builtin[str(name_or_path)])
    path = Path(name_or_path)
    if not path.is_file():
        raise KdvfsError(
            f"job noise {str(name_or_path)!r}: neither a known name ({', '.join(sorted(builtin))}) nor a file"
        )
    check_file_size(path, MAX_JOB_NOISE_BYTES, "job noise file")
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise KdvfsError(f"job noise {path}: not readable JSON ({e})") from None
    if not isinstance(doc, dict):
        raise KdvfsError(f"job noise {path}: expected a JSON object")
    return JobNoise.from_dict(doc)


def _builtin() -> dict[str, dict]:
    text = resources.files("kdvfs.runtime").joinpath(BUILTIN_JSON).read_text()
    return json.loads(text)["jobs"]


# --- fitting -----------------------------------------------------------------------------------
SEEN_SKIP_STEPS = 5
"""A tuned recording's first steps left out of its seen share (the job's first, compiling)."""


def _read_csv(path: str | Path) -> dict[str, np.ndarray]:
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", newline="") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        raise KdvfsError(f"{path}: not readable ({e})") from None
    if len(rows) < 3:
        raise KdvfsError(f"{path}: fewer than two rows")
    header = rows[0]
    try:
        cols = np.asarray(rows[1:], dtype=float).T
    except ValueError as e:
        raise KdvfsError(f"{path}: a value is not a number ({e})") from None
    return dict(zip(header, cols))


def _need(table: dict[str, np.ndarray], path: str | Path, names: tuple[str, ...]) -> None:
    missing = [n for n in names if n not in table]
    if missing:
        raise KdvfsError(f"{path}: missing column(s) {', '.join(missing)}")


def cv(values: np.ndarray) -> float:
    """Coefficient of variation (sample s.d. over mean)."""
    values = np.asarray(values, dtype=float)
    return float(values.std(ddof=1) / values.mean()) if len(values) > 1 else math.nan


def window_1s_cv(start_s: np.ndarray, step_s: np.ndarray, origin_s: float | None = None) -> float:
    """The CV, across 1-s windows from origin_s (default: the first step's start), of the mean
    step time of the steps that start in each window (the last, partial window left out; empty
    ones skipped), as data/h200/jobs/README.md defines it."""
    start_s, step_s = np.asarray(start_s, dtype=float), np.asarray(step_s, dtype=float)
    window = np.floor(start_s - (start_s[0] if origin_s is None else origin_s)).astype(int)
    keep = window < window.max()
    sums = np.bincount(window[keep], weights=step_s[keep])
    counts = np.bincount(window[keep])
    return cv(sums[counts > 0] / counts[counts > 0])


WINDOW_PHASES = 100
"""Phases of the 1-s windows that window_1s_cv_phase_mean averages over (0, 0.01, ... 0.99 s)."""


def window_1s_cv_phase_mean(start_s: np.ndarray, step_s: np.ndarray) -> float:
    """window_1s_cv averaged over WINDOW_PHASES origins spread over one second: a job with
    long periodic steps (a 1.6-s checkpoint) has a CV of 1-s means that depends on where the
    windows fall (0.60 to 1.85 for the recorded `sync` job), the mean of them does not."""
    start_s = np.asarray(start_s, dtype=float)
    return float(
        np.mean([window_1s_cv(start_s, step_s, start_s[0] - k / WINDOW_PHASES) for k in range(WINDOW_PHASES)])
    )


def fit_job_noise(
    steps_csv: str | Path,
    nvml_csv: str | Path | None = None,
    *,
    name: str | None = None,
    warmup_end_s: float | None = None,
) -> JobNoise:
    """Fit a JobNoise to a recording (experiments/record_job.py's files).

    Args:
        steps_csv: `step, host_start_s, gpu_step_s, host_step_s` per step (gzip or plain).
        nvml_csv: the NVML samples (`host_s, energy_mj, counter_changed, ...`); None: the
            power figures are NaN.
        name: the noise's name (default: the file's name up to `_steps`).
        warmup_end_s: host time the warm-up ends (steps before it are left out); None: read
            `warmup_end_host_s` from the `<job>_meta.json` beside the file, else keep all.
    """
    steps_csv = Path(steps_csv)
    job = steps_csv.name.split("_steps")[0]
    name = name or job
    if warmup_end_s is None:
        meta = steps_csv.with_name(f"{job}_meta.json")
        warmup_end_s = json.loads(meta.read_text())["warmup_end_host_s"] if meta.is_file() else -math.inf
    table = _read_csv(steps_csv)
    _need(table, steps_csv, ("step", "host_start_s", "gpu_step_s"))
    order = np.argsort(table["step"])
    step_index = table["step"][order].astype(int)
    start_s, gpu_s = table["host_start_s"][order], table["gpu_step_s"][order]
    keep = start_s >= warmup_end_s
    keep[-1] = False  # the last step is closed by the recorder's end mark, not a step's start
    step_index, start_s, gpu_s = step_index[keep], start_s[keep], gpu_s[keep]
    if len(gpu_s) < 100:
        raise KdvfsError(f"{steps_csv}: {len(gpu_s)} steps after the warm-up; at least 100 needed")
    if not np.all(gpu_s > 0.0):
        raise KdvfsError(f"{steps_csv}: a step time is not > 0")

    median_s = float(np.median(gpu_s))
    periods, periodic = _periods(step_index, gpu_s, median_s)
    plain = gpu_s[~periodic]
    floor_s = float(np.quantile(plain, FLOOR_QUANTILE))
    typical_s = float(np.median(plain))
    period_wait_s = _period_waits(step_index, gpu_s, periodic, periods, typical_s)

    wait_rel = np.maximum(plain / floor_s - 1.0, 0.0)
    quantiles = np.maximum.accumulate(np.quantile(wait_rel, WAIT_QUANTILE_LEVELS))
    starts = start_s[~periodic]
    phi = _fit_ar1(wait_rel, quantiles, floor_s, starts)

    wait_w = busy_w = math.nan
    period_w = [math.nan] * len(periods)
    if nvml_csv is not None:
        wait_w, busy_w = _fit_power(nvml_csv, start_s, gpu_s, floor_s, periodic)
        period_w = _period_power(nvml_csv, step_index, start_s, gpu_s, periods)
    return JobNoise(
        name=name,
        median_step_s=median_s,
        floor_step_s=floor_s,
        wait_rel_quantiles=tuple(round(float(v), 6) for v in quantiles),
        wait_ar1_per_step=phi,
        period_steps=tuple(periods),
        period_wait_s=tuple(period_wait_s),
        period_power_w=tuple(period_w),
        wait_power_w=wait_w,
        busy_power_w=busy_w,
        recorded_per_step_cv=cv(gpu_s),
        recorded_window_1s_cv=window_1s_cv(
            start_s, gpu_s, warmup_end_s if math.isfinite(warmup_end_s) else None
        ),
        recorded_window_1s_cv_phase_mean=window_1s_cv_phase_mean(start_s, gpu_s),
    )


def seen_wait_share(reports_csv: str | Path, skip_steps: int = SEEN_SKIP_STEPS) -> float:
    """The share of a job's host wait that kdvfs.tune saw after the steps, from a recording
    under it (experiments/record_job.py's `<job>_tuned_reports.csv.gz`: `tuner_step_s` and the
    `wait_s` it measured, per step): each step's busy time (its step less that wait) over the
    busy steps' FLOOR_QUANTILE is the wait inside the step, and the share is the seen waits'
    sum over the seen and inside waits' sums. The first `skip_steps` steps (the job's first,
    compiling and warming) are left out. A job without a wait reads 1."""
    reports_csv = Path(reports_csv)
    table = _read_csv(reports_csv)
    _need(table, reports_csv, ("step", "tuner_step_s", "wait_s"))
    order = np.argsort(table["step"])
    step_s, seen_s = table["tuner_step_s"][order][skip_steps:], table["wait_s"][order][skip_steps:]
    if step_s.size < 2:
        raise KdvfsError(f"{reports_csv}: fewer than two steps after the first {skip_steps}")
    busy_s = step_s - seen_s
    inside_s = np.clip(busy_s - np.quantile(busy_s, FLOOR_QUANTILE), 0.0, None)
    total = float(seen_s.sum() + inside_s.sum())
    return float(seen_s.sum()) / total if total > 0.0 else 1.0


def _periods(step_index: np.ndarray, gpu_s: np.ndarray, median_s: float) -> tuple[list[int], np.ndarray]:
    """The periods of the long steps (a period kept when most of its multiples are long, and
    not a multiple of a shorter kept one) and which steps they explain."""
    long_ = set((step_index[gpu_s >= PERIODIC_OUTLIER_REL * median_s] + 1).tolist())
    first, last = int(step_index[0]) + 1, int(step_index[-1]) + 1
    periods: list[int] = []
    for period in range(2, (last - first) // 2 + 1):
        multiples = range(-(-first // period) * period, last + 1, period)
        if len(multiples) < 2 or any(period % p == 0 for p in periods):
            continue
        if sum(m in long_ for m in multiples) >= PERIOD_HIT_SHARE * len(multiples):
            periods.append(period)
    periodic = np.zeros(len(step_index), dtype=bool)
    for period in periods:
        periodic |= (step_index + 1) % period == 0
    return periods, periodic


def _period_waits(
    step_index: np.ndarray, gpu_s: np.ndarray, periodic: np.ndarray, periods: list[int], typical_s: float
) -> list[float]:
    """Each period's wait, s: least squares over the periodic steps' time beyond a typical step,
    the waits of coinciding periods adding up."""
    if not periods:
        return []
    rows = step_index[periodic] + 1
    design = np.array([[1.0 if r % p == 0 else 0.0 for p in periods] for r in rows])
    excess = gpu_s[periodic] - typical_s
    waits, *_ = np.linalg.lstsq(design, excess, rcond=None)
    return [round(max(float(w), 0.0), 4) for w in waits]


def _ar1_series(phi: float, n: int, seed: int) -> np.ndarray:
    """A stationary Gaussian AR(1) of n steps."""
    from scipy.signal import lfilter

    rng = np.random.default_rng(seed)
    eps = rng.standard_normal(n) * math.sqrt(1.0 - phi * phi)
    eps[0] = rng.standard_normal()
    return lfilter([1.0], [1.0, -phi], eps)


def _fit_ar1(wait_rel: np.ndarray, quantiles: np.ndarray, floor_s: float, starts: np.ndarray) -> float:
    """The AR(1) coefficient whose steps, read through the quantiles, give the recording's
    CV of 1-s means (window_1s_cv_phase_mean; bisection on a fixed-seed simulation 10 times
    the recording's length), the periodic syncs' steps left out of both."""
    from scipy.special import ndtr

    step_s = floor_s * (1.0 + wait_rel)
    target = window_1s_cv_phase_mean(starts, step_s)
    if not math.isfinite(target) or quantiles[-1] <= 0.0:
        return 0.0
    n = 10 * len(wait_rel)

    def window_cv(phi: float) -> float:
        steps = floor_s * (
            1.0 + np.interp(ndtr(_ar1_series(phi, n, seed=0)), WAIT_QUANTILE_LEVELS, quantiles)
        )
        return window_1s_cv_phase_mean(np.concatenate(([0.0], np.cumsum(steps)[:-1])), steps)

    lo, hi = 0.0, 0.999
    if window_cv(lo) >= target:
        return 0.0
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if window_cv(mid) < target else (lo, mid)
    return round(0.5 * (lo + hi), 4)


def _fit_power(
    nvml_csv: str | Path,
    start_s: np.ndarray,
    gpu_s: np.ndarray,
    floor_s: float,
    periodic: np.ndarray,
) -> tuple[float, float]:
    """The card's power while it waits and while it is busy, W: a line through the energy
    counter's power over each interval between its updates against the share of the interval
    the GPU waited (each step's wait, its time beyond floor_s, put at its end); intervals that
    touch a periodic sync's step are left out (period_power_w is theirs)."""
    table = _read_csv(nvml_csv)
    _need(table, nvml_csv, ("host_s", "energy_mj", "counter_changed"))
    changed = table["counter_changed"] > 0
    t, e_j = table["host_s"][changed], table["energy_mj"][changed] / 1e3
    inside = (t >= start_s[0]) & (t <= start_s[-1] + gpu_s[-1])
    t, e_j = t[inside], e_j[inside]
    if len(t) < 10:
        return math.nan, math.nan
    wait_start = start_s + np.minimum(floor_s, gpu_s)
    wait_end = start_s + gpu_s
    # waited seconds up to each time: cumulative over whole waits plus the one in progress
    cum = np.concatenate(([0.0], np.cumsum(wait_end - wait_start)))

    def waited(x: np.ndarray) -> np.ndarray:
        i = np.searchsorted(start_s, x, side="right") - 1
        i = np.clip(i, 0, len(start_s) - 1)
        return cum[i] + np.clip(x - wait_start[i], 0.0, wait_end[i] - wait_start[i])

    span = np.diff(t)
    share = np.diff(waited(t)) / span
    power = np.diff(e_j) / span
    ok = span > 0.0
    for a, b in zip(start_s[periodic], start_s[periodic] + gpu_s[periodic]):
        ok &= (t[1:] <= a) | (t[:-1] >= b)
    slope, intercept = np.polyfit(share[ok], power[ok], 1)
    return round(float(intercept + slope), 1), round(float(intercept), 1)


def _period_power(
    nvml_csv: str | Path, step_index: np.ndarray, start_s: np.ndarray, gpu_s: np.ndarray, periods: list[int]
) -> list[float]:
    """Each period's recorded power, W: the median NVML power sample inside the steps that only
    that period explains (their first and last 0.1 s left out: the reading trails)."""
    table = _read_csv(nvml_csv)
    _need(table, nvml_csv, ("host_s", "power_w"))
    t, power = table["host_s"], table["power_w"]
    out = []
    for period in periods:
        only = (step_index + 1) % period == 0
        for other in periods:
            if other != period:
                only &= (step_index + 1) % other != 0
        inside = np.zeros(len(t), dtype=bool)
        for a, g in zip(start_s[only], gpu_s[only]):
            inside |= (t >= a + 0.1) & (t <= a + g - 0.1)
        out.append(round(float(np.median(power[inside])), 1) if inside.any() else math.nan)
    return out
