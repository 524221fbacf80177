"""Priors of the step-driven tuner: where a job can switch, and a schedule of its groups before any trial.

- `switch_sites`: kernel indices where a job can change clocks: the step's start, each pass,
  and each submodule (the name's prefix before its first '.', as `l07.` of a layer).
- `Prior`: per-kernel time and energy per step at each pair and at stock (the last column),
  from the simulated card's own model (`model_prior`) or isolated measurements
  (`observed_prior`, tuner/observations.py), pessimistic fill-ins where nothing is known.
- `model_schedule`: the three above for a simulated card, as the experiments and tests use them.
- `prior_schedule`: grouping.py's least-energy grouping within the budget, its group starts
  moved to the nearest switch site: the groups the tuner explores and the schedule it
  verifies first. A prior, not a requirement: trials in training decide what is adopted.
- `sweep_prior`: a real card's measured table (the JSON of `kdvfs sweep --device nvml:N
  --workload ops:FILE`): its pass-level plan carried onto a job's pass sites.

Design: docs/design-step-tuner.md (groups).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kdvfs.runtime.schedule import Schedule
from kdvfs.runtime.types import ClockPair, KdvfsError, Workload, check_file_size
from kdvfs.tuner.grouping import group_kernels
from kdvfs.tuner.observations import Observations

#: Share of the budget a prior schedule may spend (trials in training add noise to its slowdown,
#: and verification adopts it only 3 standard errors inside the budget); a fraction.
PRIOR_BUDGET_SHARE = 0.5
#: Largest sweep JSON sweep_prior reads (a real card's sweep is well under 1 MiB); bytes.
MAX_SWEEP_BYTES = 64 << 20


def switch_sites(workload: Workload) -> list[int]:
    """The step's start, each pass's first kernel and each submodule's first kernel."""
    kernels = workload.kernels

    def module(i: int) -> str:
        name = kernels[i].name
        return name.split(".", 1)[0] if "." in name else ""

    return [0] + [
        i
        for i in range(1, len(kernels))
        if kernels[i].pass_name != kernels[i - 1].pass_name or module(i) != module(i - 1)
    ]


@dataclass(frozen=True)
class Prior:
    """What is known of each kernel before training: time_s[k, c], energy_j[k, c] per step
    (launches included) at pair c of `pairs`, the last column stock."""

    pairs: tuple[ClockPair, ...]
    time_s: np.ndarray
    energy_j: np.ndarray


def model_prior(device, workload: Workload) -> Prior:
    """The simulated (or replayed) card's own noiseless per-kernel model, one evaluation per
    distinct kernel; on a card with a thermal model, at the temperature the stock step runs
    at (leakage moves a kernel's energy by up to 15% between that and a generic temperature,
    enough to change the schedule)."""
    pairs = tuple(device.grid.pairs)
    columns = [*pairs, None]
    expected = device.expected
    if hasattr(device, "steady_temperature_c"):
        temp_c = device.steady_temperature_c([(k, None, k.launches) for k in workload.kernels])

        def expected(kernel, pair):
            return device.expected_at(kernel, pair, temp_c)

    cache: dict = {}
    rows_t, rows_e = [], []
    for k in workload.kernels:
        if k not in cache:
            figures = [expected(k, p) for p in columns]
            cache[k] = (np.array([f[0] for f in figures]), np.array([f[1] for f in figures]))
        t, e = cache[k]
        rows_t.append(t * k.launches)
        rows_e.append(e * k.launches)
    return Prior(pairs, np.array(rows_t), np.array(rows_e))


def observed_prior(obs: Observations) -> Prior:
    """Isolated measurements (a sweep, or what exists of one); unmeasured cells are filled in
    pessimistically: the kernel's stock time slowed by the pair's largest clock ratio, its
    stock energy unchanged, so that the schedule does not count on them."""
    time_m, energy_m = obs.plannable()
    stock_t = obs.ref_time_s
    stock_e = np.where(np.isnan(obs.stock_energy_j), np.nanmean(obs.stock_energy_j), obs.stock_energy_j)
    stock_e = np.where(np.isnan(stock_e), 1.0, stock_e)
    top_core = max(p.core_mhz for p in obs.pairs)
    top_mem = max(p.mem_mhz for p in obs.pairs)
    ratio = np.array([max(top_core / p.core_mhz, top_mem / p.mem_mhz) for p in obs.pairs])
    time_s = np.where(np.isnan(time_m), stock_t[:, None] * ratio[None, :], time_m)
    energy_j = np.where(np.isnan(energy_m), stock_e[:, None], energy_m)
    return Prior(tuple(obs.pairs), np.column_stack([time_s, stock_t]), np.column_stack([energy_j, stock_e]))


def prior_schedule(prior: Prior, sites: list[int], switch_latency_s: float, budget: float) -> Schedule:
    """The least-energy grouping within the budget (grouping.py, switches priced) of the
    prior's segments between switch sites (a segment's kernels summed: a switch lands at the
    first segment starting a latency after it, which is pessimistic by up to a segment). All
    stock, one group, when no grouping fits."""
    if not sites or sites[0] != 0 or any(b <= a for a, b in itertools.pairwise(sites)):
        raise KdvfsError(f"switch sites must start at kernel 0 and increase, got {sites[:5]}")
    ends = [*sites[1:], prior.time_s.shape[0]]
    time_s = np.array([prior.time_s[a:b].sum(axis=0) for a, b in zip(sites, ends)])
    energy_j = np.array([prior.energy_j[a:b].sum(axis=0) for a, b in zip(sites, ends)])
    grouping = group_kernels(time_s, energy_j, switch_latency_s, float(time_s[:, -1].sum()), budget)
    if not grouping.feasible:
        return Schedule(((0, None),))
    columns = [*prior.pairs, None]
    return Schedule(tuple((sites[g.start], columns[g.pair_index]) for g in grouping.groups))


def model_schedule(device, workload: Workload, budget: float, sites: list[int] | None = None) -> Schedule:
    """The prior schedule of a simulated card from its own model, within PRIOR_BUDGET_SHARE of the
    budget, its groups starting at switch sites (default: switch_sites)."""
    sites = switch_sites(workload) if sites is None else sites
    return prior_schedule(
        model_prior(device, workload), sites, device.switch_latency_s, PRIOR_BUDGET_SHARE * budget
    )


def sweep_prior(path: Path, workload: Workload) -> Schedule | None:
    """The pass-level plan of a real card's sweep (its JSON) as a schedule of `workload`'s
    segments: each segment at the pair the sweep planned for its pass (stock for a pass the
    sweep did not plan), consecutive equal pairs merged; None when the plan is all stock
    (nothing to verify). KdvfsError naming the problem for a file that is not such a sweep."""
    check_file_size(path, MAX_SWEEP_BYTES, "sweep")
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise KdvfsError(f"sweep {path}: cannot read ({exc.strerror or exc})") from None
    except ValueError:
        raise KdvfsError(f"sweep {path}: not JSON") from None
    if not isinstance(doc, dict) or doc.get("source") != "measured" or "cells" not in doc:
        raise KdvfsError(
            f"sweep {path}: not the JSON of a real card's sweep (kdvfs sweep --device nvml:N --workload ops:FILE --json)"
        )
    plan = doc.get("pass_level", {}).get("plan", {})
    by_pass: dict[str, ClockPair | None] = {}
    for cell in doc["cells"]:
        pair = plan.get(cell["kernel"])
        by_pass.setdefault(cell["pass"], None if pair is None else ClockPair(*pair))
    groups: list[tuple[int, ClockPair | None]] = []
    for i, kernel in enumerate(workload.kernels):
        pair = by_pass.get(kernel.pass_name)
        if not groups or groups[-1][1] != pair:
            groups.append((i, pair))
    if all(pair is None for _, pair in groups):
        return None
    if groups[0][0] != 0:
        groups.insert(0, (0, None))
    return Schedule(tuple(groups))
