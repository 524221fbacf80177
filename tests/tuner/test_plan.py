"""Plan documents: round trip, every rejection path, compatibility, diff, and the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kdvfs import cli
from kdvfs.runtime.types import ClockGrid, ClockPair, KdvfsError, Kernel, Workload
from kdvfs.tuner.plan import Plan, PlanGroup, check_compatible, diff_plans, load_plan, save_plan

GRID = ClockGrid.product([1000, 1500], [5000, 7000])
WORKLOAD = Workload("tiny", tuple(Kernel(f"k{i}", launches=i + 1) for i in range(4)))
FAST, SLOW = ClockPair(1500, 7000), ClockPair(1000, 7000)


def make_plan(choice=(FAST, FAST, SLOW, FAST), budget=0.01) -> Plan:
    return Plan.from_choice(
        gpu_name="Test GPU",
        grid=GRID,
        workload=WORKLOAD,
        budget=budget,
        choice=list(choice),
        time_s=[1e-3, 2e-3, 3e-3, 1e-3],
        energy_j=[0.2, 0.4, 0.5, 0.2],
        reference_time_s=7e-3,
        reference_energy_j=1.5,
        source="simulated",
        strategy="sweep",
        measurements=16,
    )


def merged_args() -> dict:
    """Two groups merged from a per-kernel choice that had three."""
    return dict(
        gpu_name="Test GPU",
        grid=GRID,
        workload=WORKLOAD,
        budget=0.01,
        groups=[(0, 3, FAST, 5.5e-3, 1.2), (3, 4, SLOW, 1.5e-3, 0.15)],
        reference_time_s=7e-3,
        reference_energy_j=1.5,
        source="measured",
        strategy="bo",
        measurements=80,
        per_kernel=[FAST, FAST, SLOW, SLOW],
    )


def merged_plan() -> Plan:
    return Plan.from_groups(**merged_args())


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    path = tmp_path / "plan.json"
    save_plan(make_plan(), path)
    return path


def edited(path: Path, edit) -> Path:
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    return path


def test_round_trip_keeps_every_field(tmp_path: Path):
    for plan in (make_plan(), merged_plan()):
        path = tmp_path / "round.json"
        save_plan(plan, path)
        assert load_plan(path) == plan
    plan = load_plan(path)
    assert [(g.kernels, g.pair) for g in plan.groups] == [(("k0", "k1", "k2"), FAST), (("k3",), SLOW)]
    assert plan.per_kernel == (("k0", FAST), ("k1", FAST), ("k2", SLOW), ("k3", SLOW))
    assert (plan.energy_saving, plan.slowdown) == pytest.approx((1 - 1.35 / 1.5, 0.0))
    doc = json.loads(path.read_text())
    assert (doc["schema"], doc["schema_version"], doc["gpu"]["grid"][0]) == ("kdvfs-plan", 1, [1000, 5000])


def test_from_choice_merges_runs_of_one_pair(plan_file: Path):
    plan = load_plan(plan_file)
    assert [(g.kernels, g.pair) for g in plan.groups] == [
        (("k0", "k1"), FAST),
        (("k2",), SLOW),
        (("k3",), FAST),
    ]
    assert [g.expected_time_s for g in plan.groups] == pytest.approx([3e-3, 3e-3, 1e-3])
    assert plan.per_kernel == () and "per_kernel" not in json.loads(plan_file.read_text())
    assert plan.energy_saving == pytest.approx(1 - 1.3 / 1.5)


def test_save_replaces_atomically_and_leaves_no_temporary_file(plan_file: Path):
    save_plan(make_plan(budget=0.05), plan_file)
    assert load_plan(plan_file).budget == 0.05
    assert [p.name for p in plan_file.parent.iterdir()] == ["plan.json"]


def test_an_invalid_plan_is_never_written(tmp_path: Path):
    bad = Plan(**{**make_plan().__dict__, "groups": make_plan().groups[:1]})
    with pytest.raises(KdvfsError, match="groups: cover 2 of the workload's 4 kernels"):
        save_plan(bad, tmp_path / "bad.json")
    assert not list(tmp_path.iterdir())


def test_building_a_plan_checks_its_inputs():
    with pytest.raises(KdvfsError, match="per_kernel has 3 pairs for 4 kernels"):
        Plan.from_groups(**{**merged_args(), "per_kernel": [FAST] * 3})
    with pytest.raises(KdvfsError, match="reference time and energy must be > 0"):
        Plan.from_groups(**{**merged_args(), "reference_energy_j": 0.0})
    with pytest.raises(KdvfsError, match=r"new plan: groups\[1\]\.mem_mhz: 1000/9000 MHz is not a pair"):
        Plan.from_groups(
            **{**merged_args(), "groups": [(0, 3, FAST, 1e-3, 1.0), (3, 4, ClockPair(1000, 9000), 1e-3, 0.1)]}
        )


def _set(path, value):
    def edit(doc):
        *parents, last = path
        for key in parents:
            doc = doc[key]
        doc[last] = value

    return edit


def _delete(path):
    def edit(doc):
        *parents, last = path
        for key in parents:
            doc = doc[key]
        del doc[last]

    return edit


REJECTIONS = [
    (_set(["schema"], "other-plan"), "schema: not a kdvfs plan"),
    (_set(["schema_version"], 2), "schema_version: version 2 is newer than this kdvfs reads"),
    (_set(["schema_version"], "1"), "schema_version: expected an integer"),
    (_delete(["budget"]), "budget: missing field"),
    (_delete(["gpu", "name"]), "gpu.name: missing field"),
    (_set(["extra"], 1), "extra: unexpected field"),
    (_set(["budget"], -0.01), "budget: -0.01 is out of range"),
    (_set(["budget"], True), "budget: expected a number, found true"),
    (_set(["groups", 1, "core_mhz"], "1000"), "groups[1].core_mhz: expected an integer, found '1000'"),
    (_set(["groups", 1, "core_mhz"], 1234), "groups[1].core_mhz: 1234 MHz is not a core clock"),
    (_set(["groups", 2, "mem_mhz"], 6000), "groups[2].mem_mhz: 1500/6000 MHz is not a pair"),
    (_set(["groups", 0, "expected_time_s"], -1e-3), "groups[0].expected_time_s: -0.001 is out of range"),
    (
        _set(["groups", 0, "expected_energy_j"], math.nan),
        "groups[0].expected_energy_j: nan is not a finite number",
    ),
    (
        _set(["groups", 0, "kernels"], ["k0"]),
        "groups[1].kernels[0]: expected 'k1' (workload kernel 1), found 'k2'",
    ),
    (_set(["groups", 0, "kernels"], ["k1", "k0"]), "groups[0].kernels[0]: expected 'k0'"),
    (
        _set(["groups", 2, "kernels"], ["k3", "k4"]),
        "groups[2].kernels[1]: 'k4' is beyond the workload's 4 kernels",
    ),
    (_set(["groups", 2, "kernels"], []), "groups[2].kernels: expected a non-empty array"),
    (_set(["groups"], []), "groups: a plan needs at least one group"),
    (
        _set(["workload", "kernels"], ["k0", "k1", "k2", "k3", "k4"]),
        "groups: cover 4 of the workload's 5 kernels (missing from 'k4')",
    ),
    (
        _set(["workload", "kernels"], ["k0", "k1", "k1", "k3"]),
        "workload.kernels[2]: kernel 'k1' appears twice",
    ),
    (_set(["gpu", "grid"], [[1000, 5000], [1000, 5000]]), "gpu.grid[1]: 1000/5000 MHz appears twice"),
    (_set(["gpu", "grid"], [[1000, 5000], [1000]]), "gpu.grid[1]: expected [core_mhz, mem_mhz]"),
    (_set(["expected", "slowdown"], -1.5), "expected.slowdown: -1.5 is out of range"),
    (_set(["expected", "energy_saving"], 1.5), "expected.energy_saving: 1.5 is out of range"),
    (
        _set(["expected", "reference_time_s"], 0),
        "expected.reference_time_s: 0 is out of range (must be > 0.0)",
    ),
    (_set(["measurements"], -1), "measurements: -1 is below 0"),
    (_set(["measurements"], 1.5), "measurements: expected an integer, found 1.5"),
    (_set(["source"], "guessed"), "source: 'guessed' is not one of simulated, replayed, measured"),
    (_set(["created"], "yesterday"), "created: 'yesterday' is not an ISO 8601 time"),
    (_set(["per_kernel"], {"k9": [1000, 5000]}), "per_kernel.k9: not a kernel of the workload"),
    (
        _set(["per_kernel"], {"k0": [1200, 5000]}),
        "per_kernel.k0: 1200/5000 MHz is not in the plan's clock grid",
    ),
]


@pytest.mark.parametrize(("edit", "message"), REJECTIONS)
def test_an_edited_invalid_plan_names_the_file_and_the_field(plan_file: Path, edit, message):
    edited(plan_file, edit)
    with pytest.raises(KdvfsError) as caught:
        load_plan(plan_file)
    text = str(caught.value)
    assert text.startswith(f"{plan_file}: ") and message in text and "\n" not in text


def test_a_truncated_or_missing_or_non_object_file_is_rejected(plan_file: Path, tmp_path: Path):
    plan_file.write_text(plan_file.read_text()[:200])
    with pytest.raises(KdvfsError, match=r"plan.json: not valid JSON \(truncated\?\)"):
        load_plan(plan_file)
    with pytest.raises(KdvfsError, match=r"missing\.json: cannot read plan"):
        load_plan(tmp_path / "missing.json")
    plan_file.write_text("[1, 2]")
    with pytest.raises(KdvfsError, match="schema: not a kdvfs plan"):
        load_plan(plan_file)


def test_compatibility_names_what_differs_with_both_values():
    plan = make_plan()
    check_compatible(plan, "Test GPU", GRID, WORKLOAD.signature)
    with pytest.raises(KdvfsError, match="GPU: plan 'Test GPU', device 'Other GPU'") as caught:
        check_compatible(plan, "Other GPU", GRID, WORKLOAD.signature)
    assert "grid" not in str(caught.value) and "workload" not in str(caught.value)
    other_grid = ClockGrid.product([1000, 1500], [5000, 9000])
    with pytest.raises(
        KdvfsError,
        match=r"clock grid: plan 4 pairs, core 1000-1500 MHz, memory 5000/7000 MHz, "
        r"device 4 pairs, core 1000-1500 MHz, memory 5000/9000 MHz",
    ):
        check_compatible(plan, "Test GPU", other_grid, WORKLOAD.signature)
    other = Workload("tiny", WORKLOAD.kernels[:3])
    with pytest.raises(
        KdvfsError,
        match=rf"workload signature: plan {WORKLOAD.signature} \(tiny\), workload {other.signature}",
    ):
        check_compatible(plan, "Test GPU", GRID, other.signature)
    with pytest.raises(KdvfsError, match=r"GPU: .*; clock grid: .*; workload signature: "):
        check_compatible(plan, "Other GPU", other_grid, other.signature)


def test_diff_lists_what_changed():
    a, b = make_plan(), make_plan(choice=(FAST, SLOW, SLOW, FAST), budget=0.02)
    assert diff_plans(a, a) == []
    lines = diff_plans(a, b)
    assert "budget: +1.00% -> +2.00%" in lines
    assert "groups: 3 -> 3" not in lines
    assert "kernel k1: 1500/7000 MHz -> 1000/7000 MHz" in lines
    assert not any(line.startswith("kernel k0") for line in lines)
    split = Plan(
        **{
            **a.__dict__,
            "groups": (
                PlanGroup(("k0",), 1500, 7000, 1e-3, 0.2),
                PlanGroup(("k1",), 1500, 7000, 2e-3, 0.4),
                *a.groups[1:],
            ),
        }
    )
    assert diff_plans(a, split) == ["groups: 3 -> 4", "group boundaries differ (same clocks per kernel)"]


@pytest.fixture
def run_cli(monkeypatch, capsys):
    """kdvfs.cli.main with the plan command registered (the dispatcher lists each command)."""
    monkeypatch.setitem(cli.COMMANDS, "plan", "show, diff or validate a plan file")

    def run(*argv: str) -> tuple[int, str, str]:
        code = cli.main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_cli_show_prints_groups_and_the_source_of_the_figures(run_cli, plan_file: Path):
    code, out, _ = run_cli("plan", "show", str(plan_file))
    assert code == 0
    assert "Test GPU (4 pairs, core 1000-1500 MHz, memory 5000/7000 MHz)" in out
    assert "energy saving +13.33%, slowdown +0.00%" in out
    assert "figures     simulated" in out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith(("0 ", "1 ", "2 "))]
    assert rows == [
        ["0", "2", "k0", "..", "k1", "1500/7000", "3.0000", "0.6000"],
        ["1", "1", "k2", "1000/7000", "3.0000", "0.5000"],
        ["2", "1", "k3", "1500/7000", "1.0000", "0.2000"],
    ]


def test_cli_rejects_a_bad_plan_with_exit_2(run_cli, plan_file: Path):
    edited(plan_file, _set(["groups", 0, "core_mhz"], 999))
    code, out, err = run_cli("plan", "show", str(plan_file))
    assert code == 2 and out == ""
    assert (
        err.strip()
        == f"kdvfs plan: error: {plan_file}: groups[0].core_mhz: 999 MHz is not a core clock of the plan's grid"
    )


def test_cli_diff(run_cli, plan_file: Path, tmp_path: Path):
    other = tmp_path / "other.json"
    save_plan(make_plan(choice=(FAST, SLOW, SLOW, FAST)), other)
    code, out, _ = run_cli("plan", "diff", str(plan_file), str(plan_file))
    assert code == 0 and out.strip().endswith("same plan")
    code, out, _ = run_cli("plan", "diff", str(plan_file), str(other))
    assert code == 0
    assert "  kernel k1: 1500/7000 MHz -> 1000/7000 MHz" in out.splitlines()


def sim_plan(pair_of, budget: float) -> tuple[Plan, object]:
    from kdvfs.runtime.registry import open_device, open_workload

    device = open_device("sim:rtx3080ti", seed=0)
    workload = open_workload("gpt3-xl-layer", device)
    choice = [pair_of(device.grid) for _ in workload.kernels]
    figures = [device.expected(k, p) for k, p in zip(workload.kernels, choice)]
    reference = [device.expected(k, None) for k in workload.kernels]
    plan = Plan.from_choice(
        gpu_name=device.name,
        grid=device.grid,
        workload=workload,
        budget=budget,
        choice=choice,
        time_s=[t * k.launches for (t, _), k in zip(figures, workload.kernels)],
        energy_j=[e * k.launches for (_, e), k in zip(figures, workload.kernels)],
        reference_time_s=sum(t * k.launches for (t, _), k in zip(reference, workload.kernels)),
        reference_energy_j=sum(e * k.launches for (_, e), k in zip(reference, workload.kernels)),
        source="simulated",
        strategy="test",
        measurements=0,
    )
    return plan, device


def test_cli_validate_re_evaluates_on_the_simulated_device(run_cli, tmp_path: Path):
    plan, _ = sim_plan(lambda grid: grid.highest(), budget=0.5)
    path = tmp_path / "sim.json"
    save_plan(plan, path)
    code, out, _ = run_cli(
        "plan", "validate", str(path), "--device", "sim:rtx3080ti", "--workload", "gpt3-xl-layer"
    )
    assert code == 0
    assert f"fits {plan.gpu_name} (sim:rtx3080ti)" in out
    # one group at one pair: no switch, so the re-evaluation is the plan's own figures
    assert (
        f"re-evaluated [simulated, noiseless, switch latency 30 ms included]: "
        f"energy saving {100 * plan.energy_saving:+.2f}%, slowdown {100 * plan.slowdown:+.2f}%" in out
    )


def test_cli_validate_fails_an_over_budget_plan_and_refuses_another_gpu(run_cli, tmp_path: Path):
    slow, _ = sim_plan(lambda grid: min(grid.pairs), budget=0.01)
    path = tmp_path / "slow.json"
    save_plan(slow, path)
    code, out, _ = run_cli(
        "plan", "validate", str(path), "--device", "sim:rtx3080ti", "--workload", "gpt3-xl-layer"
    )
    assert code == 1 and "over budget" in out
    code, _, err = run_cli(
        "plan", "validate", str(path), "--device", "sim:a100", "--workload", "gpt3-xl-layer"
    )
    assert (
        code == 2 and f"GPU: plan {slow.gpu_name!r}, device 'NVIDIA A100" in err and "clock grid: plan" in err
    )
