"""Stored plans, found again by GPU name, clock grid and workload signature.

A restarted job asks the store for the plan of its card, grid and workload and verifies it
with a few measurements instead of tuning from scratch. One JSON plan file per key in one
directory (default $KDVFS_PLAN_DIR, else $XDG_CACHE_HOME/kdvfs/plans, else
~/.cache/kdvfs/plans); the file name is the GPU name made readable plus a hash of the whole
key, so a plan for another GPU, grid or workload is another file and is never returned for
this one. A file that does not load, or whose plan is not the one its name stands for (copied
or renamed by hand), is a KdvfsError naming the file: never silently used.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from kdvfs.runtime.types import ClockGrid, KdvfsError
from kdvfs.tuner.plan import Plan, check_compatible, load_plan, save_plan

#: Environment variable naming the default plan store directory.
PLAN_DIR_ENV = "KDVFS_PLAN_DIR"


def default_plan_dir() -> Path:
    env = os.environ.get(PLAN_DIR_ENV)
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "kdvfs" / "plans"


def plan_file_name(gpu_name: str, grid: ClockGrid, signature: str) -> str:
    """GPU name as a slug, then 20 hex digits of SHA-256 over (GPU name, grid pairs, signature)."""
    key = json.dumps([gpu_name, grid.as_lists(), signature], separators=(",", ":"))
    slug = re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-") or "gpu"
    return f"{slug}-{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"


@dataclass(frozen=True)
class StoredPlan:
    """A file of the store: its plan, or why it cannot be used."""

    path: Path
    plan: Plan | None
    problem: str | None


class PlanStore:
    """A directory of plans, one per (GPU name, clock grid, workload signature).

    Args:
        root: the directory; None: default_plan_dir() ($KDVFS_PLAN_DIR, else the user's cache).
    """

    def __init__(self, root: Path | str | None = None) -> None:
        self.root = default_plan_dir() if root is None else Path(root).expanduser()

    def path_for(self, gpu_name: str, grid: ClockGrid, signature: str) -> Path:
        return self.root / plan_file_name(gpu_name, grid, signature)

    def put(self, plan: Plan) -> Path:
        """Store a plan (atomically), replacing the one of its key; returns its file."""
        path = self.path_for(plan.gpu_name, plan.grid, plan.workload_signature)
        save_plan(plan, path)
        return path

    def get(self, gpu_name: str, grid: ClockGrid, signature: str) -> Plan | None:
        """The plan for this GPU, grid and workload, None when there is none; KdvfsError when
        its file is corrupt or holds a plan for something else."""
        path = self.path_for(gpu_name, grid, signature)
        if not path.exists():
            return None
        plan = load_plan(path)
        try:
            check_compatible(plan, gpu_name, grid, signature)
        except KdvfsError as exc:
            raise KdvfsError(f"{path}: stored plan is not the one its file name stands for: {exc}") from None
        return plan

    def entries(self) -> list[StoredPlan]:
        """Every plan file of the store, with its problem if it has one, sorted by name."""
        out = []
        for path in sorted(self.root.glob("*.json")) if self.root.is_dir() else []:
            try:
                plan = load_plan(path)
            except KdvfsError as exc:
                out.append(StoredPlan(path, None, str(exc)))
                continue
            expected = plan_file_name(plan.gpu_name, plan.grid, plan.workload_signature)
            problem = (
                None if path.name == expected else f"{path}: holds a plan whose file name would be {expected}"
            )
            out.append(StoredPlan(path, plan if problem is None else None, problem))
        return out

    def find(
        self, *, gpu_name: str | None = None, grid: ClockGrid | None = None, signature: str | None = None
    ) -> list[StoredPlan]:
        """The usable stored plans that match every criterion given (all of them when none is)."""
        return [
            e
            for e in self.entries()
            if e.plan is not None
            and gpu_name in (None, e.plan.gpu_name)
            and (grid is None or grid.pairs == e.plan.grid.pairs)
            and signature in (None, e.plan.workload_signature)
        ]

    def newest_for_other_gpu(self, gpu_name: str, signature: str) -> Plan | None:
        """The most recent usable plan for this workload made on another GPU (tuner/transfer.py
        carries it over), None when the store has none."""
        others = [e.plan for e in self.find(signature=signature) if e.plan.gpu_name != gpu_name]
        return max(others, key=lambda plan: plan.created, default=None)
