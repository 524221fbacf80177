"""The plan document: which clock pair each group of consecutive kernels runs at.

A versioned JSON file that names the GPU and clock grid, the workload (by signature), the
budget, the groups with their clocks and expected figures, the expected saving against the
reference, and where the figures came from. Loading validates everything and names the file
and the JSON path of the first problem; check_compatible refuses a plan made for another GPU,
grid or workload, so a plan is never silently applied where it does not belong.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, get_args

from kdvfs.runtime.schedule import Schedule
from kdvfs.runtime.types import ClockGrid, ClockPair, KdvfsError, Source, Workload, check_file_size

#: The "schema" field every plan file carries.
SCHEMA = "kdvfs-plan"
#: The plan file format's version this code reads and writes.
SCHEMA_VERSION = 1
#: Most per-kernel clock changes diff_plans lists one by one (the rest are counted).
DIFF_KERNEL_LINES = 10
#: Largest plan file load_plan reads (a plan of a 100,000-kernel step is a few MiB); bytes.
MAX_PLAN_BYTES = 64 << 20

GroupSpan = tuple[int, int, ClockPair, float, float]
"""(start, end, pair, expected_time_s, expected_energy_j): kernels [start, end) of a workload."""


@dataclass(frozen=True)
class PlanGroup:
    """Consecutive kernels that run at one clock pair, or at stock clocks (the card's auto
    mode; core_mhz and mem_mhz None, null in JSON); expected figures per step."""

    kernels: tuple[str, ...]
    core_mhz: int | None
    mem_mhz: int | None
    expected_time_s: float
    expected_energy_j: float

    @property
    def pair(self) -> ClockPair | None:
        return None if self.core_mhz is None else ClockPair(self.core_mhz, self.mem_mhz)


@dataclass(frozen=True)
class Plan:
    """A plan as the JSON document holds it. energy_saving = 1 - energy / reference energy and
    slowdown = time / reference time - 1 of the whole step, both expected. per_kernel:
    optional per-kernel clocks (e.g. the per-kernel optimum the groups were merged from)."""

    gpu_name: str
    grid: ClockGrid
    workload_name: str
    workload_signature: str
    kernels: tuple[str, ...]
    budget: float
    groups: tuple[PlanGroup, ...]
    energy_saving: float
    slowdown: float
    reference_time_s: float
    reference_energy_j: float
    source: Source
    strategy: str
    measurements: int
    created: str
    per_kernel: tuple[tuple[str, ClockPair], ...] = ()

    def kernel_pairs(self) -> dict[str, ClockPair | None]:
        """The pair each kernel's group runs at."""
        return {name: g.pair for g in self.groups for name in g.kernels}

    @property
    def expected_time_s(self) -> float:
        return sum(g.expected_time_s for g in self.groups)

    @property
    def expected_energy_j(self) -> float:
        return sum(g.expected_energy_j for g in self.groups)

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "gpu": {"name": self.gpu_name, "grid": self.grid.as_lists()},
            "workload": {
                "name": self.workload_name,
                "signature": self.workload_signature,
                "kernels": list(self.kernels),
            },
            "budget": self.budget,
            "groups": [
                {
                    "kernels": list(g.kernels),
                    "core_mhz": g.core_mhz,
                    "mem_mhz": g.mem_mhz,
                    "expected_time_s": g.expected_time_s,
                    "expected_energy_j": g.expected_energy_j,
                }
                for g in self.groups
            ],
            "expected": {
                "energy_saving": self.energy_saving,
                "slowdown": self.slowdown,
                "reference_time_s": self.reference_time_s,
                "reference_energy_j": self.reference_energy_j,
            },
            "source": self.source,
            "strategy": self.strategy,
            "measurements": self.measurements,
            "created": self.created,
        }
        if self.per_kernel:
            doc["per_kernel"] = {name: pair.as_list() for name, pair in self.per_kernel}
        return doc

    @classmethod
    def from_groups(
        cls,
        *,
        gpu_name: str,
        grid: ClockGrid,
        workload: Workload,
        budget: float,
        groups: Sequence[GroupSpan],
        reference_time_s: float,
        reference_energy_j: float,
        source: Source,
        strategy: str,
        measurements: int,
        per_kernel: Sequence[ClockPair] | None = None,
    ) -> Plan:
        """A plan from groups as index spans of the workload (e.g. grouping.Group values with
        their pairs); the expected saving and slowdown are the groups' sums against the
        reference. Validated like a loaded plan."""
        names = [k.name for k in workload.kernels]
        if per_kernel is not None and len(per_kernel) != len(names):
            raise KdvfsError(f"per_kernel has {len(per_kernel)} pairs for {len(names)} kernels")
        if not (reference_time_s > 0 and reference_energy_j > 0):
            raise KdvfsError(
                f"reference time and energy must be > 0, got {reference_time_s} s and {reference_energy_j} J"
            )
        built = tuple(
            PlanGroup(tuple(names[s:e]), p and p.core_mhz, p and p.mem_mhz, float(t), float(en))
            for s, e, p, t, en in groups
        )
        time_s = sum(g.expected_time_s for g in built)
        energy_j = sum(g.expected_energy_j for g in built)
        plan = cls(
            gpu_name=gpu_name,
            grid=grid,
            workload_name=workload.name,
            workload_signature=workload.signature,
            kernels=tuple(names),
            budget=float(budget),
            groups=built,
            energy_saving=1.0 - energy_j / reference_energy_j,
            slowdown=time_s / reference_time_s - 1.0,
            reference_time_s=float(reference_time_s),
            reference_energy_j=float(reference_energy_j),
            source=source,
            strategy=strategy,
            measurements=int(measurements),
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            per_kernel=tuple(zip(names, per_kernel)) if per_kernel is not None else (),
        )
        return plan_from_dict(plan.to_dict(), "new plan")

    @classmethod
    def from_choice(
        cls,
        *,
        choice: Sequence[ClockPair],
        time_s: Sequence[float],
        energy_j: Sequence[float],
        **plan: Any,
    ) -> Plan:
        """A plan from a pair per kernel (workload order) and each kernel's expected figures:
        runs of equal pairs become groups. Other arguments as for from_groups (but per_kernel,
        which the groups already say)."""
        spans: list[GroupSpan] = []
        for k, pair in enumerate(choice):
            if spans and spans[-1][2] == pair:
                s, _, p, t, e = spans[-1]
                spans[-1] = (s, k + 1, p, t + time_s[k], e + energy_j[k])
            else:
                spans.append((k, k + 1, pair, time_s[k], energy_j[k]))
        return cls.from_groups(groups=spans, **plan)


def save_plan(plan: Plan, path: Path) -> None:
    """Write atomically (a temporary file in the same folder, then os.replace); the plan is
    validated first, so what is written always loads."""
    path = Path(path)
    doc = plan_from_dict(plan.to_dict(), str(path)).to_dict()
    text = json.dumps(doc, indent=2, allow_nan=False) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a plan is as readable as any file
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def load_plan(path: Path) -> Plan:
    """Read and validate a plan file; any problem is a KdvfsError naming the file and field."""
    path = Path(path)
    check_file_size(path, MAX_PLAN_BYTES, "plan")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise KdvfsError(f"{path}: cannot read plan: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise KdvfsError(f"{path}: not a text file (not a kdvfs plan)") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise KdvfsError(
            f"{path}: not valid JSON (truncated?): {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    return plan_from_dict(doc, str(path))


def plan_from_dict(doc: Any, where: str) -> Plan:
    """Validate a parsed plan document; `where` (the file) prefixes every error."""
    return _Reader(where).plan(doc)


def check_compatible(plan: Plan, device_name: str, grid: ClockGrid, workload_signature: str) -> None:
    """KdvfsError naming each of GPU / clock grid / workload signature that differs, both values."""
    problems = []
    if plan.gpu_name != device_name:
        problems.append(f"GPU: plan {plan.gpu_name!r}, device {device_name!r}")
    if plan.grid.pairs != grid.pairs:
        only_plan = sorted(set(plan.grid.pairs) - set(grid.pairs))
        only_device = sorted(set(grid.pairs) - set(plan.grid.pairs))
        example = f"plan has {only_plan[0]}" if only_plan else f"device has {only_device[0]}"
        problems.append(
            f"clock grid: plan {describe_grid(plan.grid)}, device {describe_grid(grid)} ({example} and the other does not)"
        )
    if plan.workload_signature != workload_signature:
        problems.append(
            f"workload signature: plan {plan.workload_signature} ({plan.workload_name}), workload {workload_signature}"
        )
    if problems:
        raise KdvfsError("plan does not fit: " + "; ".join(problems))


def describe_grid(grid: ClockGrid) -> str:
    core = grid.core_levels_mhz
    mem = "/".join(str(m) for m in grid.mem_levels_mhz)
    return f"{len(grid)} pairs, core {core[0]}-{core[-1]} MHz, memory {mem} MHz"


def diff_plans(a: Plan, b: Plan) -> list[str]:
    """What differs from plan a to plan b, one line each (empty: the same plan; the creation
    time is not compared)."""
    grid_a, grid_b = describe_grid(a.grid), describe_grid(b.grid)
    if a.grid != b.grid and grid_a == grid_b:
        grid_b += " (other pairs)"
    lines = [
        f"{label}: {x} -> {y}"
        for label, x, y in [
            ("GPU", a.gpu_name, b.gpu_name),
            ("clock grid", grid_a, grid_b),
            (
                "workload",
                f"{a.workload_name} ({a.workload_signature})",
                f"{b.workload_name} ({b.workload_signature})",
            ),
            ("budget", _pct(a.budget), _pct(b.budget)),
            ("source", a.source, b.source),
            ("strategy", a.strategy, b.strategy),
            ("measurements", a.measurements, b.measurements),
            ("groups", len(a.groups), len(b.groups)),
            ("expected energy saving", _pct(a.energy_saving), _pct(b.energy_saving)),
            ("expected slowdown", _pct(a.slowdown), _pct(b.slowdown)),
            ("expected time", f"{a.expected_time_s * 1e3:.4f} ms", f"{b.expected_time_s * 1e3:.4f} ms"),
            ("expected energy", f"{a.expected_energy_j:.4f} J", f"{b.expected_energy_j:.4f} J"),
            ("reference time", f"{a.reference_time_s * 1e3:.4f} ms", f"{b.reference_time_s * 1e3:.4f} ms"),
            ("reference energy", f"{a.reference_energy_j:.4f} J", f"{b.reference_energy_j:.4f} J"),
        ]
        if x != y
    ]
    pairs_a, pairs_b = a.kernel_pairs(), b.kernel_pairs()
    clock_changes = [
        f"kernel {name}: {_clocks(pairs_a[name])} -> {_clocks(pairs_b[name])}"
        for name in a.kernels
        if name in pairs_b and pairs_a[name] != pairs_b[name]
    ]
    lines += clock_changes[:DIFF_KERNEL_LINES]
    if len(clock_changes) > DIFF_KERNEL_LINES:
        lines.append(f"... and {len(clock_changes) - DIFF_KERNEL_LINES} more kernels at other clocks")
    for label, plan, other in (
        ("only in the first plan", a, pairs_b),
        ("only in the second plan", b, pairs_a),
    ):
        missing = [name for name in plan.kernels if name not in other]
        if missing:
            lines.append(
                f"{len(missing)} kernels {label}: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}"
            )
    same_kernels = a.kernels == b.kernels
    if same_kernels and not clock_changes and [g.kernels for g in a.groups] != [g.kernels for g in b.groups]:
        lines.append("group boundaries differ (same clocks per kernel)")
    return lines


def _clocks(pair: ClockPair | None) -> str:
    return "stock" if pair is None else f"{pair.core_mhz}/{pair.mem_mhz} MHz"


def _pct(x: float) -> str:
    return f"{100.0 * x:+.2f}%"


class _Reader:
    """Strict, path-naming validation of a plan document."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, path: str, problem: str) -> KdvfsError:
        return KdvfsError(f"{self.where}: {path}: {problem}" if path else f"{self.where}: {problem}")

    def obj(
        self, value: Any, path: str, required: set[str], optional: frozenset[str] = frozenset()
    ) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(path, f"expected an object, found {_kind(value)}")
        for key in sorted(required):
            if key not in value:
                raise self.fail(_join(path, key), "missing field")
        for key in value:
            if key not in required | optional:
                raise self.fail(_join(path, key), "unexpected field")
        return value

    def text(self, value: Any, path: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(path, f"expected a non-empty string, found {_kind(value)}")
        return value

    def integer(self, value: Any, path: str, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(path, f"expected an integer, found {_kind(value)}")
        if value < minimum:
            raise self.fail(path, f"{value} is below {minimum}")
        return value

    def number(
        self, value: Any, path: str, low: float = 0.0, high: float = math.inf, *, open_low: bool = False
    ) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(path, f"expected a number, found {_kind(value)}")
        if not math.isfinite(value):
            raise self.fail(path, f"{value} is not a finite number")
        if value < low or (open_low and value == low) or value > high:
            bound = f"> {low}" if open_low else f">= {low}"
            raise self.fail(
                path,
                f"{value} is out of range (must be {bound}"
                + (f" and <= {high})" if high < math.inf else ")"),
            )
        return float(value)

    def array(
        self, value: Any, path: str, empty: str = "expected a non-empty array, found an empty one"
    ) -> list[Any]:
        """A non-empty JSON array; `empty`: the problem an empty one is."""
        if not isinstance(value, list):
            raise self.fail(path, f"expected a non-empty array, found {_kind(value)}")
        if not value:
            raise self.fail(path, empty)
        return value

    def names(self, value: Any, path: str) -> tuple[str, ...]:
        names = tuple(self.text(v, f"{path}[{i}]") for i, v in enumerate(self.array(value, path)))
        seen: set[str] = set()
        for i, name in enumerate(names):
            if name in seen:
                raise self.fail(f"{path}[{i}]", f"kernel {name!r} appears twice")
            seen.add(name)
        return names

    def pair(self, value: Any, path: str, grid: ClockGrid | None) -> ClockPair:
        if not isinstance(value, list) or len(value) != 2:
            raise self.fail(path, f"expected [core_mhz, mem_mhz], found {_kind(value)}")
        pair = ClockPair(self.integer(value[0], f"{path}[0]", 1), self.integer(value[1], f"{path}[1]", 1))
        if grid is not None and pair not in grid:
            raise self.fail(path, f"{pair} is not in the plan's clock grid")
        return pair

    def plan(self, doc: Any) -> Plan:
        top = {
            "schema",
            "schema_version",
            "gpu",
            "workload",
            "budget",
            "groups",
            "expected",
            "source",
            "strategy",
            "measurements",
            "created",
        }
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            found = doc.get("schema") if isinstance(doc, dict) else _kind(doc)
            raise self.fail("schema", f"not a kdvfs plan (expected {SCHEMA!r}, found {found!r})")
        version = self.integer(doc.get("schema_version"), "schema_version", 1)
        if version > SCHEMA_VERSION:
            raise self.fail(
                "schema_version",
                f"version {version} is newer than this kdvfs reads ({SCHEMA_VERSION}): upgrade kdvfs",
            )
        self.obj(doc, "", top, frozenset({"per_kernel"}))
        gpu = self.obj(doc["gpu"], "gpu", {"name", "grid"})
        grid_pairs = [
            self.pair(v, f"gpu.grid[{i}]", None) for i, v in enumerate(self.array(gpu["grid"], "gpu.grid"))
        ]
        if len(set(grid_pairs)) != len(grid_pairs):
            dup = next(p for p in grid_pairs if grid_pairs.count(p) > 1)
            raise self.fail(
                f"gpu.grid[{grid_pairs.index(dup, grid_pairs.index(dup) + 1)}]", f"{dup} appears twice"
            )
        grid = ClockGrid(tuple(grid_pairs))
        workload = self.obj(doc["workload"], "workload", {"name", "signature", "kernels"})
        kernels = self.names(workload["kernels"], "workload.kernels")
        groups = tuple(
            self.group(g, f"groups[{i}]", grid)
            for i, g in enumerate(self.array(doc["groups"], "groups", "a plan needs at least one group"))
        )
        self.coverage(groups, kernels)
        expected = self.obj(
            doc["expected"],
            "expected",
            {"energy_saving", "slowdown", "reference_time_s", "reference_energy_j"},
        )
        source = doc["source"]
        if source not in get_args(Source):
            raise self.fail("source", f"{source!r} is not one of {', '.join(get_args(Source))}")
        created = self.text(doc["created"], "created")
        try:
            datetime.fromisoformat(created)
        except ValueError:
            raise self.fail("created", f"{created!r} is not an ISO 8601 time") from None
        return Plan(
            gpu_name=self.text(gpu["name"], "gpu.name"),
            grid=grid,
            workload_name=self.text(workload["name"], "workload.name"),
            workload_signature=self.text(workload["signature"], "workload.signature"),
            kernels=kernels,
            budget=self.number(doc["budget"], "budget"),
            groups=groups,
            energy_saving=self.number(expected["energy_saving"], "expected.energy_saving", -math.inf, 1.0),
            slowdown=self.number(expected["slowdown"], "expected.slowdown", -1.0),
            reference_time_s=self.number(
                expected["reference_time_s"], "expected.reference_time_s", open_low=True
            ),
            reference_energy_j=self.number(
                expected["reference_energy_j"], "expected.reference_energy_j", open_low=True
            ),
            source=source,
            strategy=self.text(doc["strategy"], "strategy"),
            measurements=self.integer(doc["measurements"], "measurements", 0),
            created=created,
            per_kernel=self.per_kernel(doc.get("per_kernel"), kernels, grid),
        )

    def group(self, value: Any, path: str, grid: ClockGrid) -> PlanGroup:
        g = self.obj(value, path, {"kernels", "core_mhz", "mem_mhz", "expected_time_s", "expected_energy_j"})
        if g["core_mhz"] is None and g["mem_mhz"] is None:
            core = mem = None  # stock clocks
        else:
            core = self.integer(g["core_mhz"], f"{path}.core_mhz", 1)
            mem = self.integer(g["mem_mhz"], f"{path}.mem_mhz", 1)
            if core not in grid.core_levels_mhz:
                raise self.fail(f"{path}.core_mhz", f"{core} MHz is not a core clock of the plan's grid")
            if ClockPair(core, mem) not in grid:
                raise self.fail(
                    f"{path}.mem_mhz", f"{ClockPair(core, mem)} is not a pair of the plan's clock grid"
                )
        return PlanGroup(
            kernels=tuple(
                self.text(v, f"{path}.kernels[{i}]")
                for i, v in enumerate(self.array(g["kernels"], f"{path}.kernels"))
            ),
            core_mhz=core,
            mem_mhz=mem,
            expected_time_s=self.number(g["expected_time_s"], f"{path}.expected_time_s"),
            expected_energy_j=self.number(g["expected_energy_j"], f"{path}.expected_energy_j"),
        )

    def coverage(self, groups: tuple[PlanGroup, ...], kernels: tuple[str, ...]) -> None:
        """The groups hold the workload's kernels exactly once, in order."""
        position = 0
        for i, group in enumerate(groups):
            for j, name in enumerate(group.kernels):
                if position >= len(kernels):
                    raise self.fail(
                        f"groups[{i}].kernels[{j}]",
                        f"{name!r} is beyond the workload's {len(kernels)} kernels",
                    )
                if name != kernels[position]:
                    raise self.fail(
                        f"groups[{i}].kernels[{j}]",
                        f"expected {kernels[position]!r} (workload kernel {position}), found {name!r}",
                    )
                position += 1
        if position < len(kernels):
            raise self.fail(
                "groups",
                f"cover {position} of the workload's {len(kernels)} kernels (missing from {kernels[position]!r})",
            )

    def per_kernel(
        self, value: Any, kernels: tuple[str, ...], grid: ClockGrid
    ) -> tuple[tuple[str, ClockPair], ...]:
        if value is None:
            return ()
        if not isinstance(value, dict):
            raise self.fail("per_kernel", f"expected an object, found {_kind(value)}")
        known = set(kernels)
        for name in value:
            if name not in known:
                raise self.fail(f"per_kernel.{name}", "not a kernel of the workload")
        return tuple(
            (name, self.pair(value[name], f"per_kernel.{name}", grid)) for name in kernels if name in value
        )


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _kind(value: Any) -> str:
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else "a long string"
    if isinstance(value, (bool, int, float)) or value is None:
        return (
            json.dumps(value) if not (isinstance(value, float) and not math.isfinite(value)) else str(value)
        )
    return {dict: "an object", list: "an array"}.get(type(value), type(value).__name__)


def plan_schedule(plan: Plan) -> Schedule:
    """A plan document's groups as the schedule a StepRunner applies."""
    groups, start = [], 0
    for g in plan.groups:
        groups.append((start, g.pair))
        start += len(g.kernels)
    return Schedule(tuple(groups))
