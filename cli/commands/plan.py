"""`kdvfs plan show|diff|validate`: read plan files, compare them, check one against a device."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from kdvfs.tuner.text import SOURCE_LABEL, pct, slowdown_text

if TYPE_CHECKING:
    from kdvfs.tuner.plan import Plan


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="plan_command", metavar="ACTION", required=True)
    show = sub.add_parser("show", help="print a plan: groups, clocks, expected figures")
    show.add_argument("plan", type=Path, metavar="PLAN")
    show.add_argument("--json", action="store_true", help="print the plan document as JSON instead")
    diff = sub.add_parser("diff", help="what differs between two plans")
    diff.add_argument("first", type=Path, metavar="A")
    diff.add_argument("second", type=Path, metavar="B")
    validate = sub.add_parser(
        "validate",
        help="check a plan fits a device and workload; re-evaluate it on a simulated or recorded device "
        "(exit 1 when it then exceeds its budget)",
    )
    validate.add_argument("plan", type=Path, metavar="PLAN")
    validate.add_argument("--device", required=True, help="sim:PRESET | replay:CSV | nvml:INDEX")
    validate.add_argument("--workload", required=True, help="gpt3-xl-layer | trace:CSV | table")
    validate.add_argument(
        "--full-grid",
        action="store_true",
        help="the device's every supported pair (as the plan was made with --full-grid)",
    )


def run(args: argparse.Namespace) -> int:
    from kdvfs.tuner.plan import diff_plans, load_plan

    if args.plan_command == "show":
        plan = load_plan(args.plan)
        if args.json:
            import json

            print(json.dumps(plan.to_dict(), indent=2))
        else:
            show(args.plan, plan)
        return 0
    if args.plan_command == "diff":
        lines = diff_plans(load_plan(args.first), load_plan(args.second))
        print(
            f"{args.first} -> {args.second}: " + ("same plan" if not lines else f"{len(lines)} differences")
        )
        for line in lines:
            print(f"  {line}")
        return 0
    return 0 if validate(args, load_plan(args.plan)) else 1


def show(path: Path, plan: Plan) -> None:
    from kdvfs.tuner.plan import describe_grid

    print(f"plan {path}")
    print(f"  GPU         {plan.gpu_name} ({describe_grid(plan.grid)})")
    print(
        f"  workload    {plan.workload_name}: {len(plan.kernels)} kernels, signature {plan.workload_signature}"
    )
    print(f"  budget      {pct(plan.budget)} slowdown allowed")
    print(f"  made by     {plan.strategy}, {plan.measurements} measurements, {plan.created}")
    print(
        f"  expected    energy saving {pct(plan.energy_saving)}, slowdown {pct(plan.slowdown)} against the reference "
        f"({plan.reference_time_s * 1e3:.3f} ms, {plan.reference_energy_j:.4f} J per step)"
    )
    print(f"  figures     {SOURCE_LABEL[plan.source]} (as the plan file states them)")
    print(
        f"  {'#':>3s} {'kernels':>7s}  {'first .. last':40s} {'core/mem MHz':>13s} {'time ms':>10s} {'energy J':>10s}"
    )
    for i, g in enumerate(plan.groups):
        span = g.kernels[0] if len(g.kernels) == 1 else f"{g.kernels[0]} .. {g.kernels[-1]}"
        clocks = "stock" if g.pair is None else f"{g.core_mhz}/{g.mem_mhz}"
        print(
            f"  {i:3d} {len(g.kernels):7d}  {span[:40]:40s} {clocks:>13s} "
            f"{g.expected_time_s * 1e3:10.4f} {g.expected_energy_j:10.4f}"
        )


def validate(args: argparse.Namespace, plan: Plan) -> bool:
    """Compatibility (KdvfsError if not), then, on a device that runs kernels itself, a
    noiseless re-evaluation with its own clock-switch latency: False when over budget."""
    import numpy as np

    from kdvfs.runtime.device import RunnableDevice
    from kdvfs.runtime.registry import open_device, open_workload
    from kdvfs.runtime.schedule import Schedule, schedule_figures
    from kdvfs.tuner.plan import check_compatible

    device = open_device(args.device, seed=0, full_grid=args.full_grid)
    workload = open_workload(args.workload, device)
    check_compatible(plan, device.name, device.grid, workload.signature)
    print(
        f"plan {args.plan} fits {device.name} ({args.device}) and workload {workload.name} (signature {workload.signature})"
    )
    if not isinstance(device, RunnableDevice):
        print("  no re-evaluation: a real GPU has no noiseless model; measure the plan with `kdvfs tune`")
        return True
    starts = np.cumsum([0] + [len(g.kernels) for g in plan.groups[:-1]])
    schedule = Schedule(tuple((int(s), g.pair) for s, g in zip(starts, plan.groups)))
    saving, slowdown = schedule_figures(device, workload, schedule)
    label = SOURCE_LABEL[device.source]
    print(
        f"  re-evaluated [{label}, noiseless, switch latency {device.switch_latency_s * 1e3:g} ms included]: "
        f"energy saving {pct(saving)}, {slowdown_text(slowdown)}"
    )
    print(
        f"  the plan expected [{SOURCE_LABEL[plan.source]}]: energy saving {pct(plan.energy_saving)}, {slowdown_text(plan.slowdown)}"
    )
    if slowdown > plan.budget:
        print(f"  over budget: the plan allows {pct(plan.budget)} slowdown")
        return False
    return True
