"""The plan store: keyed by GPU, grid and workload; a mismatched or corrupt file is an error."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kdvfs.runtime.types import ClockGrid, ClockPair, KdvfsError, Kernel, Workload
from kdvfs.tuner.plan import Plan
from kdvfs.tuner.plan_store import PlanStore, default_plan_dir

GRID = ClockGrid.product([1000, 1500], [5000, 7000])
OTHER_GRID = ClockGrid.product([1000, 1500, 1800], [5000, 7000])
WORKLOAD = Workload("tiny", tuple(Kernel(f"k{i}", flops=1e9) for i in range(3)))
BIGGER = Workload("tiny", tuple(Kernel(f"k{i}", flops=2e9) for i in range(3)))
FAST, SLOW = ClockPair(1500, 7000), ClockPair(1000, 7000)


def make_plan(
    gpu_name: str = "Test GPU", grid: ClockGrid = GRID, workload: Workload = WORKLOAD, strategy: str = "sweep"
) -> Plan:
    return Plan.from_choice(
        gpu_name=gpu_name,
        grid=grid,
        workload=workload,
        budget=0.01,
        choice=[FAST, SLOW, FAST],
        time_s=[1e-3, 2e-3, 1e-3],
        energy_j=[0.2, 0.3, 0.2],
        reference_time_s=4e-3,
        reference_energy_j=0.8,
        source="simulated",
        strategy=strategy,
        measurements=12,
    )


def test_round_trip_under_a_readable_hashed_name(tmp_path: Path):
    store = PlanStore(tmp_path / "plans")
    plan = make_plan()
    path = store.put(plan)
    assert path.parent == tmp_path / "plans" and path.name.startswith("test-gpu-") and path.suffix == ".json"
    assert store.get("Test GPU", GRID, WORKLOAD.signature) == plan
    newer = make_plan(strategy="botorch")
    assert store.put(newer) == path  # same key: replaced
    assert store.get("Test GPU", GRID, WORKLOAD.signature) == newer


def test_another_gpu_grid_or_workload_gets_nothing(tmp_path: Path):
    store = PlanStore(tmp_path)
    store.put(make_plan())
    store.put(make_plan(gpu_name="Other GPU"))
    assert store.get("Third GPU", GRID, WORKLOAD.signature) is None
    assert store.get("Test GPU", OTHER_GRID, WORKLOAD.signature) is None
    assert store.get("Test GPU", GRID, BIGGER.signature) is None
    assert store.get("Other GPU", GRID, WORKLOAD.signature).gpu_name == "Other GPU"
    assert PlanStore(tmp_path / "missing").get("Test GPU", GRID, WORKLOAD.signature) is None


def test_a_plan_filed_under_another_key_is_refused(tmp_path: Path):
    store = PlanStore(tmp_path)
    source = store.put(make_plan(gpu_name="NVIDIA H200"))
    # copied by hand to where the H100's plan belongs
    shutil.copy(source, store.path_for("NVIDIA H100 80GB HBM3", GRID, WORKLOAD.signature))
    with pytest.raises(
        KdvfsError,
        match=r"not the one its file name stands for.*GPU: plan 'NVIDIA H200', device 'NVIDIA H100 80GB HBM3'",
    ):
        store.get("NVIDIA H100 80GB HBM3", GRID, WORKLOAD.signature)
    assert store.get("NVIDIA H200", GRID, WORKLOAD.signature) is not None


def test_a_corrupt_plan_is_a_clear_error_and_listed_as_such(tmp_path: Path):
    store = PlanStore(tmp_path)
    good = store.put(make_plan(gpu_name="Good GPU"))
    bad = store.put(make_plan())
    bad.write_text(bad.read_text()[:100])  # truncated by a crash
    with pytest.raises(KdvfsError, match=f"{bad}: not valid JSON \\(truncated\\?\\)"):
        store.get("Test GPU", GRID, WORKLOAD.signature)
    entries = {e.path: e for e in store.entries()}
    assert entries[good].plan is not None and entries[good].problem is None
    assert entries[bad].plan is None and "not valid JSON" in entries[bad].problem


def test_listing_and_find(tmp_path: Path):
    store = PlanStore(tmp_path)
    a = store.put(make_plan())
    b = store.put(make_plan(workload=BIGGER))
    c = store.put(make_plan(gpu_name="Other GPU", grid=OTHER_GRID))
    renamed = tmp_path / "renamed.json"
    shutil.copy(a, renamed)
    assert [e.path for e in store.entries()] == sorted([a, b, c, renamed])
    assert "file name would be" in next(e.problem for e in store.entries() if e.path == renamed)
    assert {e.path for e in store.find()} == {a, b, c}
    assert {e.path for e in store.find(gpu_name="Test GPU")} == {a, b}
    assert {e.path for e in store.find(signature=WORKLOAD.signature)} == {a, c}
    assert {e.path for e in store.find(gpu_name="Test GPU", signature=BIGGER.signature)} == {b}
    assert {e.path for e in store.find(grid=OTHER_GRID)} == {c}
    assert store.find(gpu_name="Other GPU", grid=GRID) == []
    assert PlanStore(tmp_path / "missing").entries() == []


def test_default_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("KDVFS_PLAN_DIR", str(tmp_path / "mine"))
    assert PlanStore().root == tmp_path / "mine"
    monkeypatch.delenv("KDVFS_PLAN_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_plan_dir() == tmp_path / "cache" / "kdvfs" / "plans"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_plan_dir() == tmp_path / "home" / ".cache" / "kdvfs" / "plans"
