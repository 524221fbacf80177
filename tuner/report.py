"""The end of a tuning session: its figures, its plan document, its table and plots.

Figures of the plans are the device's noiseless evaluation (simulated or replayed); figures
of the run are the tuner's own measurements (launch timings and the energy counter).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kdvfs.runtime.device import RunnableDevice
from kdvfs.runtime.iteration import Schedule, schedule_figures, schedule_items
from kdvfs.runtime.registry import open_device
from kdvfs.runtime.types import Workload
from kdvfs.tuner.commands._common import pct, slowdown_text
from kdvfs.tuner.online import OnlineTuner
from kdvfs.tuner.plan import Plan
from kdvfs.tuner.sweep import evaluate, realisable, run_sweep


@dataclass
class TuneReport:
    tuner: OnlineTuner
    doc: dict[str, Any]

    def plan(self, strategy: str) -> Plan:
        """The running schedule as a plan document. Its expected figures are the device's
        noiseless evaluation of the schedule as the card runs it (schedule_figures, switches
        included): the figure `plan show` and `plan validate` print and MLflow's
        final_energy_saving holds."""
        t = self.tuner
        st = t.state
        n = len(t.workload)
        ends = [s for s, _ in st.schedule.groups[1:]] + [n]
        group_t, group_e, ref_t, ref_e = schedule_group_figures(t.device, t.workload, st.schedule)
        spans = [
            (start, end, pair, gt, ge)
            for ((start, pair), end), gt, ge in zip(zip(st.schedule.groups, ends), group_t, group_e)
        ]
        ideal = list(st.obs.kernel_level_choice(t.budget).values())
        return Plan.from_groups(
            gpu_name=t.device.name,
            grid=t.device.grid,
            workload=t.workload,
            budget=t.budget,
            groups=spans,
            reference_time_s=ref_t,
            reference_energy_j=ref_e,
            source=t.device.source,
            strategy=strategy,
            measurements=st.obs.measurements,
            per_kernel=None if any(p is None for p in ideal) else ideal,
        )

    def headline(self) -> str:
        """One sentence: what this run saved at what slowdown, what its plan saves from now on."""
        d = self.doc
        run = d["run"]
        state = (
            "the plan it converged to"
            if d["converged_at_iteration"] is not None
            else "the plan it has so far (not converged yet)"
        )
        ended = " (interrupted)" if d.get("partial") else ""
        return (
            f"This run {_saved(run['energy_saving'])} at {_at(run['slowdown'])} over "
            f"{d['iterations']} iterations{ended}; {state} {_saves(d['energy_saving'])} from now on, "
            f"at {_at(d['slowdown'])}."
        )

    def print(self, label: str) -> None:
        d = self.doc
        t = self.tuner
        print(self.headline())
        print(
            f"  tuned {t.workload.name} on {t.device.name}: {d['iterations']} iterations, "
            f"{d['measurements']} measurements [{label}]"
        )
        conv = d["converged_at_iteration"]
        print(
            "  converged: "
            + (
                f"after {conv} iterations ({d['converged_at_seconds']:.0f} s of training)"
                if conv is not None
                else "not yet"
            )
        )
        print(
            f"  this run (measured by the tuner): energy saving {_pct(d['run']['energy_saving'])}, "
            f"{slowdown_text(d['run']['slowdown'])}; largest cumulative slowdown "
            f"{_pct(d['max_cumulative_slowdown'])}"
        )
        groups = d["grouped"]["groups"]
        print(
            f"  the plan from now on ({groups} group{'s' if groups != 1 else ''}, switch latency "
            f"{t.device.switch_latency_s * 1e3:g} ms): energy saving {_pct(d['energy_saving'])}, "
            f"{slowdown_text(d['slowdown'])} [{label}, noiseless]"
        )
        print(
            f"  ideal per-kernel plan (switch cost ignored): energy saving "
            f"{_pct(d['ideal_per_kernel']['energy_saving'])}, "
            f"{slowdown_text(d['ideal_per_kernel']['slowdown'])} [{label}, noiseless]"
        )
        for r in d["refinements"]:
            what = (
                "grouped schedule beaten in training by one pair"
                if r["from"] == "grouped"
                else f"one pair {r['from']} refined in training"
            )
            trials = f"{r['trials']} trial" + ("s" if r["trials"] != 1 else "")
            print(
                f"  {what}: {r['to']} MHz after {r['iteration']} iterations, {trials}, measured "
                f"{slowdown_text(r['slowdown'])} [{label}]"
            )
        if "sweep" in d:
            s = d["sweep"]
            print(
                f"  full sweep (ideal per-kernel, for comparison): energy saving {_pct(s['energy_saving'])}; "
                f"it took {s['measurements']} measurements, {s['explore_seconds']:.0f} s of pure measurement [{label}]"
            )
            r = s["realisable"]
            print(
                f"  realisable oracle (the sweep's best plan with switches, {r['groups']} "
                f"group{'s' if r['groups'] != 1 else ''}): energy saving {_pct(r['energy_saving'])}, "
                f"{slowdown_text(r['slowdown'])} [{label}, noiseless]"
            )
        print(f"  {'#':>3s} {'kernels':>7s}  {'first .. last':36s} {'core/mem MHz':>13s}")
        n = len(t.workload)
        ends = [s for s, _ in t.state.schedule.groups[1:]] + [n]
        for i, ((start, pair), end) in enumerate(zip(t.state.schedule.groups, ends)):
            names = [k.name for k in t.workload.kernels[start:end]]
            span = names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]}"
            clocks = "stock" if pair is None else f"{pair.core_mhz}/{pair.mem_mhz}"
            print(f"  {i:3d} {len(names):7d}  {span[:36]:36s} {clocks:>13s}")

    def add_sweep(
        self,
        device_spec: str,
        *,
        seed: int,
        full_grid: bool,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        """Run the full sweep on a fresh device of `device_spec` for comparison: its ideal
        per-kernel saving and its realisable oracle go to doc["sweep"]."""
        device = open_device(device_spec, seed=seed, full_grid=full_grid)
        obs = run_sweep(device, self.tuner.workload, progress=progress)
        budget = self.tuner.budget
        best = realisable(device, obs, budget)
        self.doc["sweep"] = {
            "energy_saving": evaluate(
                device, self.tuner.workload, obs.kernel_level_choice(budget)
            ).energy_saving,
            "measurements": obs.measurements,
            "explore_seconds": obs.cost_s,
            "realisable": {
                "energy_saving": best.energy_saving,
                "slowdown": best.slowdown,
                "groups": best.groups,
            },
        }

    def figures(self):
        """(artifact name, figure): convergence of the run, and time-energy points per kernel."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        pts = self.tuner.state.points
        it = [p.iteration for p in pts]
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(it, [100 * p.energy_saving for p in pts], label="energy saving so far (%)")
        ax.plot(it, [100 * p.slowdown for p in pts], label="cumulative slowdown (%)")
        ax.axhline(100 * self.tuner.budget, color="k", ls=":", lw=1, label="budget")
        ax.set_xlabel("training iterations")
        ax.legend(fontsize=8)
        fig.tight_layout()
        obs = self.tuner.state.obs
        time_m, energy_m = obs.plannable()
        fig2, ax2 = plt.subplots(figsize=(7, 5))
        for k in np.argsort(-obs.ref_time_s)[:8]:
            measured = ~np.isnan(time_m[k])
            if measured.any() and not np.isnan(obs.stock_energy_j[k]):
                ax2.scatter(
                    time_m[k, measured] / obs.ref_time_s[k],
                    energy_m[k, measured] / obs.stock_energy_j[k],
                    s=12,
                    label=self.tuner.workload.kernels[k].name,
                )
        ax2.axvline(1 + self.tuner.budget, color="k", ls=":", lw=1)
        ax2.set_xlabel("time / stock")
        ax2.set_ylabel("energy / stock")
        if ax2.get_legend_handles_labels()[0]:  # no kernel measured yet: no legend (and no warning)
            ax2.legend(fontsize=7)
        fig2.tight_layout()
        return [("plots/convergence.png", fig), ("plots/time_energy_points.png", fig2)]


def schedule_group_figures(
    device: RunnableDevice, workload: Workload, schedule: Schedule
) -> tuple[list[float], list[float], float, float]:
    """Noiseless time and energy per iteration of each group of a schedule as the card runs it,
    and of the stock iteration: (group times s, group energies J, stock time s, stock energy J).
    The totals are schedule_figures'; a group's share is its kernels' share at the pair in effect."""
    ref_t, ref_e = device.expected_iteration([(k, None, k.launches) for k in workload.kernels])
    items = schedule_items(device, workload, schedule)
    total_t, total_e = device.expected_iteration(items)
    cells = np.array([device.expected(k, pair) for k, pair, _ in items]) * [[n] for _, _, n in items]
    starts = [s for s, _ in schedule.groups]
    ends = [*starts[1:], len(workload)]
    scale_t, scale_e = total_t / cells[:, 0].sum(), total_e / cells[:, 1].sum()
    group_t = [float(cells[s:e, 0].sum() * scale_t) for s, e in zip(starts, ends)]
    group_e = [float(cells[s:e, 1].sum() * scale_e) for s, e in zip(starts, ends)]
    return group_t, group_e, float(ref_t), float(ref_e)


def tune_report(tuner: OnlineTuner, budget: float) -> TuneReport:
    """The figures of a tuning run (add_sweep adds the full sweep's for comparison)."""
    st = tuner.state
    ideal = evaluate(tuner.device, tuner.workload, st.obs.kernel_level_choice(budget))
    g_saving, g_slowdown = schedule_figures(tuner.device, tuner.workload, st.schedule)
    last = st.points[-1] if st.points else tuner._point()
    doc: dict[str, Any] = {
        "device": tuner.device.name,
        "workload": tuner.workload.name,
        "signature": tuner.workload.signature,
        "strategy": tuner.strategy,
        "budget": budget,
        "source": tuner.device.source,
        "energy_saving": g_saving,
        "slowdown": g_slowdown,
        "measurements": st.obs.measurements,
        "iterations": tuner.account.iterations,
        "ideal_per_kernel": {"energy_saving": ideal.energy_saving, "slowdown": ideal.slowdown},
        "grouped": {"energy_saving": g_saving, "slowdown": g_slowdown, "groups": len(st.schedule.groups)},
        "max_cumulative_slowdown": max((p.slowdown for p in st.points), default=0.0),
        "run": {
            "energy_saving": last.energy_saving,
            "slowdown": last.slowdown,
            "device_seconds": last.device_s,
        },
        "converged_at_iteration": st.converged_at_iteration,
        "converged_at_seconds": (st.converged_at_iteration or 0) * tuner.reference.iteration_time_s,
        "kernels_converged": len(st.converged),
        "refinements": [
            {
                "iteration": r.iteration,
                "from": "grouped" if r.from_pair is None else f"{r.from_pair.core_mhz}/{r.from_pair.mem_mhz}",
                "to": f"{r.to_pair.core_mhz}/{r.to_pair.mem_mhz}",
                "trials": r.trials,
                "slowdown": r.slowdown,
            }
            for r in st.refinements
        ],
    }
    return TuneReport(tuner, doc)


def _at(slowdown: float) -> str:
    text = slowdown_text(slowdown)  # "slowdown +0.42%" or "slowdown -0.10% (faster than stock)"
    value, _, note = text.removeprefix("slowdown ").partition(" ")
    return f"{value} slowdown" + (f" {note}" if note else "")


def _saved(x: float) -> str:
    return (
        f"saved {max(100 * x, 0.0):.2f}% energy"
        if x > -5e-5
        else f"used {-100 * x:.2f}% more energy than stock"
    )


def _saves(x: float) -> str:
    return (
        f"saves {max(100 * x, 0.0):.2f}% energy"
        if x > -5e-5
        else f"uses {-100 * x:.2f}% more energy than stock"
    )


def _pct(x: float) -> str:
    return pct(x)
