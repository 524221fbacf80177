"""The end of a tuning session: its figures, its plan document, its table and plots.

Figures of the plans are the device's noiseless evaluation (simulated or replayed); figures
of the run are the tuner's own measurements (launch timings and the energy counter).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kdvfs.runtime.registry import open_device
from kdvfs.tuner.online import OnlineTuner, schedule_figures
from kdvfs.tuner.plan import Plan
from kdvfs.tuner.sweep import evaluate, run_sweep


@dataclass
class TuneReport:
    tuner: OnlineTuner
    doc: dict[str, Any]

    def plan(self, strategy: str) -> Plan:
        """The running schedule as a plan document (expected figures from the measurements)."""
        t = self.tuner
        st = t.state
        n = len(t.workload)
        ends = [s for s, _ in st.schedule.groups[1:]] + [n]
        refined = st.refinements[-1] if st.refinements else None
        if refined is not None and st.schedule.groups == ((0, refined.to_pair),):
            # a pair refined in training: its figures are the training run's, not isolated cells
            spans = [
                (
                    0,
                    n,
                    refined.to_pair,
                    (1.0 + refined.slowdown) * float(st.obs.ref_time_s.sum()),
                    refined.energy_j,
                )
            ]
        else:
            per_kernel_t, per_kernel_e = _schedule_cells(t)
            spans = [
                (start, end, pair, float(per_kernel_t[start:end].sum()), float(per_kernel_e[start:end].sum()))
                for (start, pair), end in zip(st.schedule.groups, ends)
            ]
        ideal = list(st.obs.kernel_level_choice(t.budget).values())
        return Plan.from_groups(
            gpu_name=t.device.name,
            grid=t.device.grid,
            workload=t.workload,
            budget=t.budget,
            groups=spans,
            reference_time_s=float(st.obs.ref_time_s.sum()),
            reference_energy_j=t.reference.iteration_energy_j,
            source=t.device.source,
            strategy=strategy,
            measurements=st.obs.measurements,
            per_kernel=None if any(p is None for p in ideal) else ideal,
        )

    def print(self, label: str) -> None:
        d = self.doc
        t = self.tuner
        print(
            f"tuned {t.workload.name} on {t.device.name}: {d['iterations']} iterations, {d['measurements']} measurements"
            f" [{label}]"
        )
        conv = d["converged_at_iteration"]
        print(
            f"  converged: {'after ' + str(conv) + ' iterations (' + format(d['converged_at_seconds'], '.0f') + ' s of training)' if conv else 'not yet'}"
        )
        print(
            f"  run so far (measured by the tuner): energy saving {_pct(d['run']['energy_saving'])}, slowdown "
            f"{_pct(d['run']['slowdown'])}, largest cumulative slowdown at any point {_pct(d['max_cumulative_slowdown'])}"
        )
        print(
            f"  ideal per-kernel plan (switch cost ignored):  saving {_pct(d['ideal_per_kernel']['energy_saving'])}, "
            f"slowdown {_pct(d['ideal_per_kernel']['slowdown'])} [{label}, noiseless]"
        )
        print(
            f"  running grouped plan ({d['grouped']['groups']} groups, switch latency "
            f"{t.device.switch_latency_s * 1e3:g} ms): saving {_pct(d['grouped']['energy_saving'])}, slowdown "
            f"{_pct(d['grouped']['slowdown'])} [{label}, noiseless]"
        )
        for r in d["refinements"]:
            what = (
                "grouped schedule beaten in training by one pair"
                if r["from"] == "grouped"
                else f"one pair {r['from']} refined in training"
            )
            trials = f"{r['trials']} trial" + ("s" if r["trials"] != 1 else "")
            print(
                f"  {what}: {r['to']} MHz after {r['iteration']} iterations, {trials} (measured slowdown "
                f"{_pct(r['slowdown'])}) [{label}]"
            )
        if "sweep" in d:
            s = d["sweep"]
            print(
                f"  full sweep for comparison: per-kernel saving {_pct(s['energy_saving'])} after {s['measurements']}"
                f" measurements ({s['explore_seconds']:.0f} s of pure measurement) [{label}]"
            )
        print(f"  {'#':>3s} {'kernels':>7s}  {'first .. last':36s} {'core/mem MHz':>13s}")
        n = len(t.workload)
        ends = [s for s, _ in t.state.schedule.groups[1:]] + [n]
        for i, ((start, pair), end) in enumerate(zip(t.state.schedule.groups, ends)):
            names = [k.name for k in t.workload.kernels[start:end]]
            span = names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]}"
            clocks = "stock" if pair is None else f"{pair.core_mhz}/{pair.mem_mhz}"
            print(f"  {i:3d} {len(names):7d}  {span[:36]:36s} {clocks:>13s}")

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
        ax2.legend(fontsize=7)
        fig2.tight_layout()
        return [("plots/convergence.png", fig), ("plots/time_energy_points.png", fig2)]


def _schedule_cells(t: OnlineTuner) -> tuple[np.ndarray, np.ndarray]:
    """Each kernel's measured time and energy per iteration at its group's pair (stock: the
    training reference and the stock measurement; unmeasured: the stock figures)."""
    obs = t.state.obs
    time_m, energy_m = obs.plannable()
    stock_e = np.where(
        np.isnan(obs.stock_energy_j),
        obs.ref_time_s * t.reference.iteration_energy_j / t.reference.iteration_time_s,
        obs.stock_energy_j,
    )
    tt, ee = obs.ref_time_s.copy(), stock_e.copy()
    for k, pair in enumerate(t.state.schedule.pair_per_kernel(len(t.workload))):
        if pair is not None:
            j = obs.pairs.index(pair)
            if not np.isnan(time_m[k, j]):
                tt[k], ee[k] = time_m[k, j], energy_m[k, j]
    return tt, ee


def tune_report(
    tuner: OnlineTuner, budget: float, *, sweep_device_spec: str | None, seed: int, full_grid: bool
) -> TuneReport:
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
    if sweep_device_spec is not None:
        device = open_device(sweep_device_spec, seed=seed, full_grid=full_grid)
        obs = run_sweep(device, tuner.workload)
        doc["sweep"] = {
            "energy_saving": evaluate(device, tuner.workload, obs.kernel_level_choice(budget)).energy_saving,
            "measurements": obs.measurements,
            "explore_seconds": obs.cost_s,
        }
    return TuneReport(tuner, doc)


def _pct(x: float) -> str:
    return f"{100.0 * x:+.2f}%"
