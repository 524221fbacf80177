"""`kdvfs sweep`: the exhaustive baseline, as the founding paper measured it.

Two phases (the stock reference, then every clock pair), then the report: the kernel-level,
pass-level and realisable plans. Interrupted, it reports the same from what it measured (the
JSON marked partial) and exits 130."""

from __future__ import annotations

import argparse

from kdvfs.tuner.commands._common import (
    SOURCE_LABEL,
    Phases,
    add_budget,
    add_device_workload,
    add_json,
    check_file_output,
    deferred_interrupts,
    open_from_args,
    pct,
    plan_json,
    positive_float,
    write_all,
    write_json,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_device_workload(parser)
    add_budget(parser)
    add_json(parser)
    parser.add_argument(
        "--window-s",
        type=positive_float,
        default=1.0,
        help="seconds of repeats per measurement (default %(default)s)",
    )
    parser.add_argument("--table", action="store_true", help="print the per-kernel plan table")


def run(args: argparse.Namespace) -> int:
    from kdvfs.tuner.progress import Progress
    from kdvfs.tuner.sweep import measure_every_pair, sweep_reference

    check_file_output(args.json, "--json")
    device, workload = open_from_args(args)
    phases, obs = Phases("sweep"), None
    with phases.interruptible():
        phases.enter("measuring the stock reference")
        obs = sweep_reference(device, workload)
        phases.enter("measuring every clock pair")
        with Progress("sweep", unit="measurements") as bar:
            measure_every_pair(device, obs, args.window_s, progress=bar.update)
    with deferred_interrupts():
        doc = phases.mark(_report(args, device, workload, obs, phases))
    return phases.exit_status(write_all([("JSON", lambda: write_json(args.json, doc))]))


def _report(args: argparse.Namespace, device, workload, obs, phases: Phases) -> dict:
    """Print the sweep's figures (of what was measured, when interrupted); its JSON document."""
    from kdvfs.tuner.sweep import evaluate, pass_level_choice, realisable

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
    kernel = evaluate(device, workload, obs.kernel_level_choice(args.budget))
    passes = evaluate(device, workload, pass_level_choice(obs, args.budget))
    # grouping needs every kernel at every pair: an interrupted sweep has no realisable plan
    best = realisable(device, obs, args.budget) if swept == len(workload) else None
    ref_time_s, ref_energy_j = device.expected_iteration([(k, None, k.launches) for k in workload.kernels])
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
    )
    print(
        f"  pass-level plan:   energy saving {pct(passes.energy_saving)}, slowdown {pct(passes.slowdown)} [{label}, noiseless evaluation]"
    )
    if best is None:
        print("  realisable plan:   none (grouping needs every kernel measured at every pair)")
    else:
        share = best.energy_saving / kernel.energy_saving if kernel.energy_saving > 0 else float("nan")
        print(
            f"  realisable plan:   energy saving {pct(best.energy_saving)}, slowdown {pct(best.slowdown)}, "
            f"{best.groups} group{'s' if best.groups != 1 else ''} with {device.switch_latency_s * 1e3:g}-ms clock switches "
            f"({share:.0%} of the kernel-level saving) [{label}, noiseless evaluation, switches included]"
        )
    print(
        f"  reference (stock): {ref_time_s * 1e3:.2f} ms and {ref_energy_j:.3f} J an iteration [{label}, noiseless]"
    )
    if args.table:
        print_plan_table(device, workload, kernel.choice)
    return {
        **doc,
        "measurements": obs.measurements,
        "kernels_swept": swept,
        "explore_seconds": obs.cost_s,
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
        "reference": {"iteration_time_s": ref_time_s, "iteration_energy_j": ref_energy_j},
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
