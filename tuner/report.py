"""The end of a tuning run (tuner/session.py): its figures, its plan document, its text and plots.

- `tune_report(session, oracle, strategy)`: the figures as a JSON-ready document (`doc`);
- `TuneReport.plan`: the running schedule as a plan document; `headline` and `print`: what a
  person reads; `figures`: the convergence plot logged to MLflow.

Figures of schedules (the running plan, the prior, the oracle) are the device's noiseless
evaluation as the card runs them (runtime/schedule.py: schedule_figures, switches
included; with a job noise's waits, tuner/oracle.py's InStep charging them as the oracles do); figures of the run are the tuner's own measurements (step times and the energy
counter). Every one is of a simulated or replayed card: the caller labels them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kdvfs.runtime.schedule import Schedule, schedule_figures
from kdvfs.tuner.plan import Plan
from kdvfs.tuner.run import ORACLE_SHARE, Oracle, reached_after_s
from kdvfs.tuner.session import TuneSession
from kdvfs.tuner.text import pct, slowdown_text

#: Stock's SM clock this far under the grid's top is said to be held there (a power limit, heat);
#: a fraction.
STOCK_CLOCK_HELD = 0.02


@dataclass
class TuneReport:
    session: TuneSession
    oracle: Oracle | None
    doc: dict[str, Any]

    def plan(self, strategy: str) -> Plan:
        """The running schedule as a plan document (TuningRun.plan). Its expected figures are
        the device's noiseless evaluation of the schedule as the card runs it (switches
        included): the figure `plan show` and `plan validate` print and MLflow's
        final_energy_saving holds."""
        return self.session.plan(strategy)

    def headline(self) -> str:
        """One sentence: what this run saved at what slowdown, what its plan saves from now on."""
        d = self.doc
        run = d["run"]
        state = (
            "the plan it converged to"
            if d["converged_after_s"] is not None
            else "the plan it has so far (not converged yet)"
        )
        ended = " (interrupted)" if d.get("partial") else ""
        return (
            f"This run {_saved(run['energy_saving'])} at {_at(run['slowdown'])} over "
            f"{d['seconds']:.0f} s of training{ended}; {state} {_saves(d['energy_saving'])} from now on, "
            f"at {_at(d['slowdown'])}."
        )

    def print(self, label: str) -> None:
        d, s = self.doc, self.session
        print(self.headline())
        print(
            f"  tuned {s.workload.name} on {s.device.name}: {d['seconds']:.0f} s of training, {d['steps']} steps, "
            f"{d['trials']} trials, {len(d['adoptions'])} adopted"
            + (" (dry run: no clock applied)" if d["dry_run"] else "")
            + f" [{label}]"
        )
        conv = d["converged_after_s"]
        print("  converged: " + (f"after {conv:.0f} s of training" if conv is not None else "not yet"))
        print(
            f"  phases: {' -> '.join(d['phases'])}; prior: {d['prior']['source']}"
            + (f" ({d['prior']['note']})" if d["prior"]["note"] else "")
        )
        print(
            f"  this run (measured by the tuner; time on the GPU's busy time, the job's own waits left out): "
            f"energy saving {pct(d['run']['energy_saving'])}, "
            f"{slowdown_text(d['run']['slowdown'])}; largest cumulative slowdown "
            f"{pct(d['max_cumulative_slowdown'])}"
        )
        clock_mhz = d["tuner"].get("stock_sm_clock_mhz")
        if clock_mhz is not None:
            top_mhz = max(s.device.grid.core_levels_mhz)
            held = clock_mhz < (1.0 - STOCK_CLOCK_HELD) * top_mhz
            print(
                f"  stock's SM clock (measured by the tuner at its reference): {clock_mhz:.0f} MHz"
                + (
                    f", under the grid's top {top_mhz} MHz: the power limit or the card's heat holds it"
                    if held
                    else ""
                )
                + f" [{label}]"
            )
        noise = d["tuner"]["job_noise"]
        if noise["time_cv_per_root_s"] is not None:
            res, eta = noise["resolvable"], noise["expected_time_to_plan_s"]
            print(
                f"  what this job allows (measured by the tuner): step-time noise "
                f"{pct(noise['time_cv_per_root_s'])} and energy noise "
                f"{pct(noise['energy_cv_per_root_s'] or 0.0)} per root second; a {res['trial_s']:.0f}-s trial "
                f"resolves {pct(res['energy_diff'] or 0.0)} of energy and {pct(res['time_diff'] or 0.0)} of time "
                f"at {res['z']:g} standard errors"
                + (
                    f", the budget's {100 * s.budget:g}% of time after {noise['budget_trial_s']:.0f} s"
                    if noise.get("budget_trial_s") is not None
                    else ""
                )
                + f"; the budget is held at 95% confidence (stock's margin {pct(noise['stock_margin_95'] or 0.0)})"
                + ("" if eta is None or eta == 0 else f"; expected time to a plan {eta:.0f} s")
            )
        groups = d["running"]["groups"]
        print(
            f"  the plan from now on ({groups} group{'s' if groups != 1 else ''}, switch latency "
            f"{s.device.switch_latency_s * 1e3:g} ms): energy saving {pct(d['energy_saving'])}, "
            f"{slowdown_text(d['slowdown'])} [{label}, noiseless]"
        )
        if d["realisable_oracle"] is not None:
            r, ideal = d["realisable_oracle"], d["ideal_per_kernel"]
            share = d["share_of_oracle"]
            print(
                f"  realisable oracle (the best schedule this card can run within the budget, "
                f"{r['groups']} group{'s' if r['groups'] != 1 else ''}): energy saving {pct(r['energy_saving'])}, "
                f"{slowdown_text(r['slowdown'])}; the plan reaches "
                + ("-" if share is None else f"{100 * share:.0f}%")
                + f" of it [{label}, noiseless]"
            )
            print(
                f"  ideal per-kernel plan (switch cost ignored): energy saving {pct(ideal['energy_saving'])}, "
                f"{slowdown_text(ideal['slowdown'])} [{label}, noiseless]"
            )
            if d.get("one_knob_oracle") is not None:
                k = d["one_knob_oracle"]
                print(
                    f"  one-knob optimum (the whole step at one pair): energy saving {pct(k['energy_saving'])}, "
                    f"{slowdown_text(k['slowdown'])} [{label}, noiseless]"
                )
            if d.get("oracles") is not None:
                print(f"  oracles: {d['oracles']['evaluated']}; searched, not proven optimal")
        for a in d["drift_alarms"]:
            print(
                f"  drift after {a['end_s']:.0f} s: {', '.join(a['reasons'])}"
                + (" (plan kept while the card warmed)" if a["held"] else "; re-tuned")
            )
        print(f"  {'#':>3s} {'kernels':>7s}  {'first .. last':36s} {'core/mem MHz':>13s}")
        schedule = s.tuner.incumbent
        ends = [start for start, _ in schedule.groups[1:]] + [len(s.workload)]
        for i, ((start, pair), end) in enumerate(zip(schedule.groups, ends)):
            names = [k.name for k in s.workload.kernels[start:end]]
            span = names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]}"
            clocks = "stock" if pair is None else f"{pair.core_mhz}/{pair.mem_mhz}"
            print(f"  {i:3d} {len(names):7d}  {span[:36]:36s} {clocks:>13s}")

    def figures(self):
        """(artifact name, figure): the run's saving and slowdown so far, training second by second."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        pts = self.session.points
        t = [p.end_s for p in pts]
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(t, [100 * p.energy_saving for p in pts], label="energy saving so far (%)")
        ax.plot(t, [100 * p.slowdown for p in pts], label="cumulative slowdown (%)")
        ax.axhline(100 * self.session.budget, color="k", ls=":", lw=1, label="budget")
        for a in self.doc["adoptions"]:
            ax.axvline(a["end_s"], color="g", lw=0.5)
        ax.set_xlabel("training seconds (green: a candidate adopted)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        return [("plots/convergence.png", fig)]


def tune_report(
    session: TuneSession, oracle: Oracle | None, strategy: str, *, waits: dict[str, Any] | None = None
) -> TuneReport:
    """The figures of a tuning run (oracle: from tuner/session.py's oracle, None to leave out).
    waits: the job's waits for its host charged after each step (tuner/oracle.py InStep's
    wait_rel, wait_fixed_s, wait_rel_strata), so a run carrying a job noise measures its
    running plan and prior as its oracles were computed; None: the step alone."""
    s, t = session, session.tuner
    device, workload = s.device, s.workload
    if waits:
        from kdvfs.tuner.oracle import InStep

        step = InStep(device, workload, s.budget, **waits)

        def figures(schedule: Schedule) -> tuple[float, float]:
            return step.figures(*step.schedule(schedule))
    else:

        def figures(schedule: Schedule) -> tuple[float, float]:
            return schedule_figures(device, workload, schedule)

    saving, slowdown = figures(t.incumbent)
    summary = s.run.summary()  # what the tuner measured, as kdvfs.tune reports it
    reached = None
    if oracle is not None:
        reached = reached_after_s(t.adoptions, lambda x: figures(x)[0], ORACLE_SHARE * oracle.energy_saving)
    prior = s.prior
    prior_figures = figures(prior.schedule) if prior.schedule is not None else (0.0, 0.0)
    doc: dict[str, Any] = {
        "device": device.name,
        "workload": workload.name,
        "signature": workload.signature,
        "strategy": strategy,
        "budget": s.budget,
        "source": device.source,
        "dry_run": s.dry_run,
        "seconds": s.seconds,
        "steps": t.account.steps,
        "energy_saving": saving,
        "slowdown": slowdown,
        "running": {"energy_saving": saving, "slowdown": slowdown, "groups": len(t.incumbent.groups)},
        "run": summary["run"],
        "max_cumulative_slowdown": summary["max_cumulative_slowdown"],
        "tuner_claimed_saving": t.plan_energy_saving(),
        "converged_after_s": summary["converged_after_s"],
        "reached_95pct_oracle_after_s": reached,
        "job_waits_charged": dict(waits) if waits else None,
        "realisable_oracle": None
        if oracle is None
        else {
            "energy_saving": oracle.energy_saving,
            "slowdown": oracle.slowdown,
            "groups": len(oracle.schedule.groups),
        },
        "ideal_per_kernel": None
        if oracle is None
        else {"energy_saving": oracle.ideal_energy_saving, "slowdown": oracle.ideal_slowdown},
        "one_knob_oracle": None
        if getattr(oracle, "one_knob", None) is None
        else {"energy_saving": oracle.one_knob.energy_saving, "slowdown": oracle.one_knob.slowdown},
        "oracles": oracle.json() if hasattr(oracle, "json") else None,  # each with how it was computed
        "share_of_oracle": None
        if oracle is None or oracle.energy_saving <= 0
        else saving / oracle.energy_saving,
        "prior": {
            "source": prior.source,
            "note": prior.note,
            "energy_saving": prior_figures[0],
            "slowdown": prior_figures[1],
            "groups": 0 if prior.schedule is None else len(prior.schedule.groups),
        },
        "phases": list(t.phases),
        "trials": t.trials,
        "adoptions": [
            {
                "end_s": a.end_s,
                "groups": len(a.schedule.groups),
                "measured_saving": a.saving,
                "measured_saving_se": a.saving_se,
                "measured_slowdown": a.slowdown,
            }
            for a in t.adoptions
        ],
        "drift_alarms": [{"end_s": a.end_s, "reasons": list(a.reasons), "held": a.held} for a in t.alarms],
        "clock_requests": len(s.job.requests),
        "tuner": summary,
    }
    return TuneReport(session, oracle, doc)


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
