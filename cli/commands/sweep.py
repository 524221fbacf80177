"""`kdvfs sweep`: the exhaustive baseline, as the founding paper measured it.

Two phases (the stock reference, then every clock pair), then the report: the kernel-level,
pass-level and realisable plans. Interrupted, it reports the same from what it measured (the
JSON marked partial) and exits 130. On a real GPU (`--device nvml:N --workload ops:FILE`,
dry run: clock requests recorded, never applied) the kernels are a step's recorded ops,
rebuilt (runtime/op_device.py), and the plans are evaluated from the measured table; in a dry
run every cell ran at stock, so the plan must come out stock (a null test of the sweep)."""

from __future__ import annotations

import argparse

from kdvfs.cli.commands._common import (
    Phases,
    add_budget,
    add_device_workload,
    add_json,
    check_outputs,
    deferred_interrupts,
    duration_s,
    nonnegative_duration_s,
    open_from_args,
    positive_int,
    write_all,
    write_json,
)
from kdvfs.runtime.types import KdvfsError
from kdvfs.tuner.text import SOURCE_LABEL, pct, plan_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_device_workload(parser)
    add_budget(parser)
    add_json(parser)
    parser.add_argument(
        "--window-s",
        type=duration_s,
        default=1.0,
        help="seconds of repeats per measurement (default %(default)s)",
    )
    parser.add_argument("--table", action="store_true", help="print the per-kernel plan table")
    parser.add_argument(
        "--pairs",
        type=positive_int,
        default=None,
        help="sweep this many clock pairs spread over the grid (default: every pair)",
    )
    parser.add_argument(
        "--warmup-s",
        type=nonnegative_duration_s,
        default=120.0,
        help="seconds of stock steps before the reference is measured (default %(default)s)",
    )
    parser.add_argument(
        "--reference-s",
        type=duration_s,
        default=20.0,
        help="seconds of stock steps the reference is measured over (default %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    from kdvfs.tuner.progress import Progress
    from kdvfs.tuner.sweep import measure_every_pair, spread_pairs, sweep_reference

    check_outputs(args, {"--json": args.json})
    device, workload = _open(args)
    pairs = None if args.pairs is None else spread_pairs(device.grid.pairs, args.pairs)
    phases, obs = Phases("sweep"), None
    try:
        with phases.interruptible():
            phases.enter("measuring the stock reference")
            obs = sweep_reference(device, workload, pairs, args.warmup_s, args.reference_s)
            phases.enter("measuring every clock pair")
            with Progress("sweep", unit="measurements") as bar:
                measure_every_pair(device, obs, args.window_s, progress=bar.update)
        with deferred_interrupts():
            doc = phases.mark(_report(args, device, workload, obs, phases))
    finally:
        if callable(getattr(device, "close", None)):
            device.close()
    return phases.exit_status(write_all([("JSON", lambda: write_json(args.json, doc))]))


def _open(args: argparse.Namespace):
    """(device, workload): a simulated or replayed card, or a real one running recorded ops."""
    from kdvfs.runtime.registry import nvml_index, open_op_replay

    if args.workload.startswith("ops:"):
        return open_op_replay(args.device, args.workload)
    if args.device.partition(":")[0] == "nvml":
        nvml_index(args.device)  # a bad index is named first
        raise KdvfsError(
            f"device {args.device!r}: a real GPU sweeps the recorded ops of a training step, "
            "--workload ops:FILE (python -m kdvfs.experiments.record_step_ops writes one)"
        )
    return open_from_args(args)


def _report(args: argparse.Namespace, device, workload, obs, phases: Phases) -> dict:
    """Print the sweep's figures (of what was measured, when interrupted); its JSON document."""
    if device.source == "measured":
        return _measured_report(args, device, workload, obs, phases)
    from kdvfs.tuner.sweep import held_plan, held_realisable, pass_level_choice

    doc = {
        "device": args.device,
        "gpu": device.name,
        "workload": workload.name,
        "signature": workload.signature,
        "budget": args.budget,
        "source": device.source,
    }
    if obs is None:
        return doc
    swept = int((obs.counts > 0).all(axis=1).sum())
    # each plan held to the budget in the step (a windowed-cap card runs a plan chosen from
    # isolated measurements slower than they say: tuner/sweep.py, held_to_budget)
    kernel_held = held_plan(device, obs, obs.kernel_level_choice, args.budget)
    passes_held = held_plan(device, obs, lambda b: pass_level_choice(obs, b), args.budget)
    # grouping needs every kernel at every pair: an interrupted sweep has no realisable plan
    best_held = held_realisable(device, obs, args.budget) if swept == len(workload) else None
    kernel, passes = kernel_held.plan, passes_held.plan
    best = best_held.plan if best_held is not None else None
    ref_time_s, ref_energy_j = device.expected_step([(k, None, k.launches) for k in workload.kernels])
    label = SOURCE_LABEL[device.source]
    print(
        f"full sweep: {device.name} ({args.device}), workload {workload.name} ({len(workload)} kernels, signature {workload.signature}), budget {pct(args.budget)}"
    )
    if phases.interrupted:
        print(
            f"  partial: interrupted, {swept} of {len(workload)} kernels measured at every pair "
            "(the others are planned at stock)"
        )
    print(f"  cost: {obs.measurements} measurements, {obs.cost_s:.0f} s of device time [{label}]")
    if obs.throttled:
        print(
            f"  {obs.throttled} pair measurements throttled (power cap or thermal): the card did not hold those clocks"
        )
    print(
        f"  kernel-level plan: energy saving {pct(kernel.energy_saving)}, slowdown {pct(kernel.slowdown)} [{label}, noiseless evaluation, switch cost ignored]"
        + _held_note(kernel_held, args.budget)
    )
    print(
        f"  pass-level plan:   energy saving {pct(passes.energy_saving)}, slowdown {pct(passes.slowdown)} [{label}, noiseless evaluation]"
        + _held_note(passes_held, args.budget)
    )
    if best is None:
        print("  realisable plan:   none (grouping needs every kernel measured at every pair)")
    else:
        print(
            f"  realisable plan:   energy saving {pct(best.energy_saving)}, slowdown {pct(best.slowdown)}, "
            f"{best.groups} group{'s' if best.groups != 1 else ''} with {device.switch_latency_s * 1e3:g}-ms clock switches"
            + (
                f" ({best.energy_saving / kernel.energy_saving:.0%} of the kernel-level saving)"
                if kernel.energy_saving > 0
                else ""
            )
            + f" [{label}, noiseless evaluation, switches included]"
            + _held_note(best_held, args.budget)
        )
    print(
        f"  reference (stock): {ref_time_s * 1e3:.2f} ms and {ref_energy_j:.3f} J a step [{label}, noiseless]"
    )
    if args.table:
        print_plan_table(device, workload, kernel.choice)
    return {
        **doc,
        "measurements": obs.measurements,
        "kernels_swept": swept,
        "explore_seconds": obs.cost_s,
        **plans_json(kernel, passes, best, workload, device),
        "held_to_budget": {
            name: {
                "planned_budget": held.planned_budget,
                "planned_at_the_budget": {
                    "energy_saving": held.first.energy_saving,
                    "slowdown": held.first.slowdown,
                },
            }
            for name, held in (
                ("kernel_level", kernel_held),
                ("pass_level", passes_held),
                ("realisable", best_held),
            )
            if held is not None
        },
        "reference": {"step_time_s": ref_time_s, "step_energy_j": ref_energy_j},
    }


def _held_note(held, budget: float) -> str:
    """What the step made of the plan planned at the budget (a sweep.Held), where it was
    planned again."""
    if held.planned_budget == budget:
        return ""
    first = (
        f"the plan of the {pct(budget)} budget ran {pct(held.first_slowdown)} in the step (isolated "
        "measurements misjudge it)"
    )
    if held.planned_budget == 0.0:
        return f"\n    stock: {first}, and so did every tighter planning budget tried"
    return f"\n    planned at a budget of {pct(held.planned_budget)}: {first}"


def plans_json(kernel, passes, best, workload, device) -> dict:
    """The JSON of a sweep's three plans: kernel level, pass level and the realisable schedule
    (None where grouping could not run)."""
    return {
        "kernel_level": {
            "energy_saving": kernel.energy_saving,
            "slowdown": kernel.slowdown,
            "plan": plan_json(kernel.choice),
        },
        "pass_level": {
            "energy_saving": passes.energy_saving,
            "slowdown": passes.slowdown,
            "plan": plan_json(passes.choice),
        },
        "realisable": None
        if best is None
        else {
            "energy_saving": best.energy_saving,
            "slowdown": best.slowdown,
            "groups": [
                {
                    "start": start,
                    "kernel": workload.kernels[start].name,
                    "pair": None if pair is None else pair.as_list(),
                }
                for start, pair in best.schedule.groups
            ],
            "switch_latency_s": device.switch_latency_s,
        },
    }


def print_plan_table(device, workload, choice) -> None:
    """Per kernel: pass, reference time, chosen clocks, energy saving of that kernel."""
    print(f"  {'kernel':28s} {'pass':9s} {'ref time':>10s} {'core/mem MHz':>13s} {'saving':>8s}")
    for k in workload.kernels:
        rt, re = device.expected(k, None)
        pair = choice[k.name]
        _, e = device.expected(k, pair)
        clocks = "stock" if pair is None else f"{pair.core_mhz}/{pair.mem_mhz}"
        print(
            f"  {k.name[:28]:28s} {k.pass_name:9s} {rt * k.launches * 1e3:8.3f}ms {clocks:>13s} {pct(1 - e / re):>8s}"
        )


def _measured_report(args: argparse.Namespace, device, workload, obs, phases: Phases) -> dict:
    """The report of a sweep on a real card: plans evaluated from the measured table; in a
    dry run, whether the null test held (every cell ran at stock: no plan may save)."""
    import numpy as np

    from kdvfs.tuner.sweep import measured_figures, measured_realisable, pass_level_choice

    dry_run = bool(getattr(device.card, "dry_run", False))
    requests = len(getattr(device.card, "calls", ()))
    doc = {
        "device": args.device,
        "gpu": device.name,
        "workload": workload.name,
        "signature": workload.signature,
        "budget": args.budget,
        "source": "measured",
        "measured_on": "a real GPU"
        if device.torch_device.startswith("cuda")
        else "the CPU (recorded CPU ops, fake NVML)",
        "dry_run": dry_run,
        "ops_recorded": device.ops_recorded,
        "ops_rebuilt": len(workload),
        "share_of_step_time_rebuilt": device.share_rebuilt,
        "energy_update_period_s": device.energy_update_period_s,
    }
    if obs is None:
        return doc
    swept = int((obs.counts > 0).all(axis=1).sum())
    kernel = measured_figures(obs, obs.kernel_level_choice(args.budget))
    passes = measured_figures(obs, pass_level_choice(obs, args.budget))
    margin = obs.energy_margin()
    best = (
        measured_realisable(obs, args.budget, device.switch_latency_s)
        if swept == len(workload) and np.isfinite(margin)
        else None
    )
    label = f"measured on {doc['measured_on']}" + (", dry run: every cell at stock clocks" if dry_run else "")
    time_m, energy_m = obs.measured_cells()
    raw_best = 1.0 - np.nanmin(
        energy_m / obs.stock_energy_j[:, None], axis=1
    )  # per kernel: its best cell's apparent saving
    chosen = sum(p is not None for p in kernel.choice.values())
    print(
        f"full sweep: {device.name} ({args.device}), recorded ops {workload.name} ({len(workload)} of "
        f"{device.ops_recorded} ops rebuilt, {device.share_rebuilt:.1%} of the step's time), "
        f"{len(obs.pairs)} clock pairs, budget {pct(args.budget)}"
    )
    if phases.interrupted:
        print(
            f"  partial: interrupted, {swept} of {len(workload)} ops measured at every pair (the others are planned at stock)"
        )
    print(f"  cost: {obs.measurements} measurements, {obs.cost_s:.0f} s [{label}]")
    print(
        f"  noise: one cell's energy s.d. {pct(obs.null_sd())} (A/A stock pairs of {int(np.sum(~np.isnan(obs.stock_repeat_energy_j)))} ops); "
        f"a pair must save {pct(margin)} to be planned (family-wise {obs_alpha():.0%})"
    )
    print(
        f"  kernel-level plan: {chosen} of {len(workload)} ops off stock, energy saving {pct(kernel.energy_saving)}, "
        f"slowdown {pct(kernel.slowdown)} [{label}, from the measured table, switch cost ignored]"
    )
    print(
        f"  pass-level plan:   energy saving {pct(passes.energy_saving)}, slowdown {pct(passes.slowdown)} [{label}]"
    )
    if best is None:
        print("  realisable plan:   none (grouping needs every op measured at every pair)")
    else:
        print(
            f"  realisable plan:   energy saving {pct(best.energy_saving)}, slowdown {pct(best.slowdown)}, "
            f"{best.groups} group{'s' if best.groups != 1 else ''} with {device.switch_latency_s * 1e3:g}-ms clock switches [{label}, switches included]"
        )
    if dry_run:
        held = (
            chosen == 0
            and all(p is None for p in passes.choice.values())
            and (best is None or (best.groups == 1 and best.schedule.groups[0][1] is None))
        )
        print(
            f"  null test: {requests} clock requests recorded, none applied; the plan is "
            f"{'stock (held)' if held else 'NOT stock (failed)'}; best single cell's apparent saving, median over ops "
            f"{pct(float(np.nanmedian(raw_best)))}, largest {pct(float(np.nanmax(raw_best)))} (noise)"
        )
        doc["null_test"] = {
            "held": held,
            "clock_requests_recorded": requests,
            "ops_off_stock": chosen,
            "apparent_best_cell_saving_median": float(np.nanmedian(raw_best)),
            "apparent_best_cell_saving_max": float(np.nanmax(raw_best)),
        }
    if args.table:
        _print_measured_table(obs, kernel.choice)
    return {
        **doc,
        "measurements": obs.measurements,
        "kernels_swept": swept,
        "pairs": [p.as_list() for p in obs.pairs],
        "explore_seconds": obs.cost_s,
        "null_sd": obs.null_sd(),
        "energy_margin": margin,
        "throttled": obs.throttled,
        **plans_json(kernel, passes, best, workload, device),
        "reference": {
            "step_time_s": obs.reference.step_time_s,
            "step_energy_j": obs.reference.step_energy_j,
            "time_rel_sd": obs.reference.time_rel_sd,
        },
        "cells": [
            {
                "kernel": k.name,
                "pass": k.pass_name,
                "in_step_s": k.ref_time_s,
                "reference_s": float(obs.ref_time_s[i]),
                "stock_energy_j": _num(obs.stock_energy_j[i]),
                "stock_repeat_energy_j": _num(obs.stock_repeat_energy_j[i]),
                "time_s": [_num(x) for x in time_m[i]],
                "energy_j": [_num(x) for x in energy_m[i]],
            }
            for i, k in enumerate(workload.kernels)
        ],
    }


def obs_alpha() -> float:
    from kdvfs.tuner.observations import FAMILY_ALPHA

    return FAMILY_ALPHA


def _num(x: float) -> float | None:
    return None if x != x else float(x)


def _print_measured_table(obs, choice) -> None:
    """Per op: pass, training reference time, chosen clocks, its measured saving there."""
    _, energy_m = obs.measured_cells()
    index = {p: j for j, p in enumerate(obs.pairs)}
    print(f"  {'op':28s} {'pass':9s} {'ref time':>10s} {'core/mem MHz':>13s} {'saving':>8s}")
    for i, k in enumerate(obs.workload.kernels):
        pair = choice[k.name]
        saving = 0.0 if pair is None else 1.0 - energy_m[i, index[pair]] / obs.stock_energy_j[i]
        clocks = "stock" if pair is None else f"{pair.core_mhz}/{pair.mem_mhz}"
        print(
            f"  {k.name[:28]:28s} {k.pass_name:9s} {obs.ref_time_s[i] * 1e3:8.3f}ms {clocks:>13s} {pct(saving):>8s}"
        )
