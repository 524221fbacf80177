"""Recorded measurement tables: per kernel and clock pair, the time and energy of one launch.

Two CSV layouts load into the same `MeasurementTable`:
- canonical: `kernel,core_mhz,mem_mhz,time_s,energy_j` (or `power_w` instead of `energy_j`),
  an optional `pass` column, and any extra numeric columns as kernel features;
- NV-DVFS raw (data/dvfs-real, Wang & Chu, ICPADS 2018): `appName, kernel, coreF,
  memF, time/ms, power/W` plus nvprof counters, recognised by those columns.
Every bad cell raises a one-line KdvfsError naming the file, the row and the column; so does a
value beyond physical plausibility (MAX_LAUNCH_TIME_S, MAX_POWER_W, MAX_CLOCK_MHZ).

`repo_data_file` finds a recording of the source checkout's data/ folder (the default of an
option that names a file), wherever the command runs from.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean

from kdvfs.runtime.types import PASSES, ClockGrid, ClockPair, KdvfsError, Kernel, Workload, check_file_size

CANONICAL_COLUMNS = ("kernel", "core_mhz", "mem_mhz", "time_s")
"""Required columns of the canonical layout (with energy_j or power_w)."""
NVDVFS_COLUMNS = ("appName", "kernel", "coreF", "memF", "time/ms", "power/W")
"""The columns that identify the NV-DVFS raw layout."""
MAX_LAUNCH_TIME_S = 60.0
"""Longest plausible time of one kernel launch; s (a longer one is a unit or typing error)."""
MIN_LAUNCH_TIME_S = 1e-9
"""Shortest plausible time of one kernel launch; s."""
MAX_POWER_W = 3000.0
"""Highest plausible average power of one GPU; W."""
MAX_CLOCK_MHZ = 100_000
"""Highest plausible clock value (memory clocks are given in effective MHz); MHz."""
MAX_CSV_BYTES = 1 << 30
"""Largest CSV file read_csv reads (a table of every kernel of a large model at every clock
pair is tens of MiB); bytes."""
REPO_DATA_DIR = Path(__file__).resolve().parents[1] / "data"
"""The source checkout's data/ folder (recorded probes, traces and tables), found from the
package; an installed wheel does not carry it."""
_NVDVFS_NOT_FEATURES = frozenset(NVDVFS_COLUMNS) | {"argNo"}
_CANONICAL_NOT_FEATURES = frozenset(CANONICAL_COLUMNS) | {"energy_j", "power_w", "pass"}


@dataclass(frozen=True)
class CsvRow:
    """One data row: its 1-based data row number, the file line it ends on, its cells."""

    row: int
    line: int
    cells: dict[str, str]


def read_csv(path: str | Path) -> tuple[tuple[str, ...], list[CsvRow]]:
    """Header and rows of a CSV file. Unnamed columns are dropped; a repeated column name gets
    a `.1`, `.2` suffix (as pandas does), so that no column silently overwrites another. A
    UTF-8 byte-order mark (as spreadsheets save a CSV) is skipped; a file larger than
    MAX_CSV_BYTES is refused before it is read."""
    path = Path(path)
    check_file_size(path, MAX_CSV_BYTES, "CSV table")
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            raw_header = next(reader, None)
            if raw_header is None:
                raise KdvfsError(f"{path}: file is empty")
            header = _unique(raw_header)
            rows: list[CsvRow] = []
            for cells in reader:
                if not any(c.strip() for c in cells):
                    continue
                number = len(rows) + 1
                if len(cells) > len(header):
                    raise KdvfsError(
                        f"{path}: row {number} (line {reader.line_num}): {len(cells)} fields, "
                        f"header has {len(header)}"
                    )
                named = {h: c.strip() for h, c in zip(header, cells) if h}
                rows.append(CsvRow(number, reader.line_num, named))
    except OSError as e:
        raise KdvfsError(f"{path}: cannot read ({e.strerror})") from None
    except (csv.Error, UnicodeDecodeError) as e:
        raise KdvfsError(f"{path}: not a readable CSV file ({e})") from None
    return tuple(h for h in header if h), rows


def repo_data_file(relative: str, flag: str) -> Path:
    """A file of the source checkout's data/ folder, found from the package, not from the
    working directory: the default of an option that names a file.

    Args:
        relative: the file's path under data/, such as `h200/kernels_ladder.csv`.
        flag: the option that names the file instead, such as `--ladder`; the error names it.

    Raises:
        KdvfsError: the file is not there (an installed wheel has no data/ folder).
    """
    path = REPO_DATA_DIR / relative
    if not path.is_file():
        raise KdvfsError(
            f"data/{relative} is not beside this kdvfs (only a source checkout has data/): pass {flag} FILE"
        )
    return path


def _unique(header: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for h in (h.strip() for h in header):
        if h and h in seen:
            seen[h] += 1
            out.append(f"{h}.{seen[h]}")
        else:
            seen.setdefault(h, 0)
            out.append(h)
    return out


def require_columns(path: Path, header: tuple[str, ...], required: tuple[str, ...]) -> None:
    missing = [c for c in required if c not in header]
    if missing:
        raise KdvfsError(f"{path}: header (line 1): missing required column {missing[0]!r}")


def number(path: Path, row: CsvRow, column: str) -> float:
    """A finite float from a cell, or a KdvfsError naming file, row and column."""
    text = row.cells.get(column, "")
    where = f"{path}: row {row.row} (line {row.line}), column {column!r}"
    if not text:
        raise KdvfsError(f"{where}: empty value")
    try:
        value = float(text)
    except ValueError:
        raise KdvfsError(f"{where}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise KdvfsError(f"{where}: {text!r} is not a finite number")
    return value


def positive(path: Path, row: CsvRow, column: str) -> float:
    value = number(path, row, column)
    if value <= 0:
        raise KdvfsError(
            f"{path}: row {row.row} (line {row.line}), column {column!r}: {value:g} must be positive"
        )
    return value


def within(path: Path, row: CsvRow, column: str, value: float, low: float, high: float, unit: str) -> float:
    """`value` (read from `column`), or a KdvfsError when it lies outside [low, high]."""
    if not low <= value <= high:
        raise KdvfsError(
            f"{path}: row {row.row} (line {row.line}), column {column!r}: {value:g} {unit} is not plausible "
            f"(expected {low:g} to {high:g} {unit})"
        )
    return value


def _time_s(path: Path, row: CsvRow, column: str, scale: float) -> float:
    """A launch time from `column` (in seconds times `scale`), within the plausible range."""
    value = positive(path, row, column)
    unit = "s" if scale == 1.0 else "ms"
    within(path, row, column, value, MIN_LAUNCH_TIME_S * scale, MAX_LAUNCH_TIME_S * scale, unit)
    return value / scale


def _energy_j(path: Path, row: CsvRow, time_s: float, energy_column: str | None, power_column: str) -> float:
    """Energy of one launch from an energy or a power column; its mean power must be plausible."""
    if energy_column is not None:
        energy_j = positive(path, row, energy_column)
        within(path, row, energy_column, energy_j / time_s, 0.0, MAX_POWER_W, "W (energy / time)")
        return energy_j
    power_w = within(path, row, power_column, positive(path, row, power_column), 0.0, MAX_POWER_W, "W")
    return time_s * power_w


def _clock_mhz(path: Path, row: CsvRow, column: str) -> int:
    value = within(path, row, column, positive(path, row, column), 1, MAX_CLOCK_MHZ, "MHz")
    if value != int(value):
        raise KdvfsError(
            f"{path}: row {row.row} (line {row.line}), column {column!r}: {value:g} is not a whole MHz"
        )
    return int(value)


@dataclass(frozen=True)
class _Record:
    """One parsed row: a kernel at a clock pair."""

    kernel: str
    pair: ClockPair
    time_s: float
    energy_j: float
    pass_name: str
    features: dict[str, float]
    row: CsvRow


@dataclass(frozen=True)
class MeasurementTable:
    """Recorded time and energy of one launch per kernel and clock pair.

    A kernel may lack pairs that others have; asking for a missing one is a KdvfsError.
    """

    name: str
    path: Path
    kernels: tuple[str, ...]
    costs: dict[str, dict[ClockPair, tuple[float, float]]]
    features: dict[str, tuple[tuple[str, float], ...]]
    passes: dict[str, str]
    grid: ClockGrid

    def cost(self, kernel: str, pair: ClockPair) -> tuple[float, float]:
        """(time_s, energy_j) of one launch of `kernel` at `pair`."""
        by_pair = self.costs.get(kernel)
        if by_pair is None:
            raise KdvfsError(f"{self.path}: no kernel {kernel!r} in the table")
        try:
            return by_pair[pair]
        except KeyError:
            raise KdvfsError(f"{self.path}: kernel {kernel!r} was not recorded at {pair}") from None

    @property
    def lowest_power_w(self) -> float:
        """The lowest average power of any recorded cell."""
        return min(e / t for by_pair in self.costs.values() for t, e in by_pair.values())

    def workload(self) -> Workload:
        """The table's kernels in order, one launch each, referenced at the highest pair."""
        top = self.grid.highest()
        kernels = tuple(
            Kernel(
                name=k,
                pass_name=self.passes[k],
                ref_time_s=self.cost(k, top)[0],
                features=self.features[k],
            )
            for k in self.kernels
        )
        return Workload(self.name, kernels, meta=(("source", "replayed"), ("table", str(self.path))))


def load_table(path: str | Path) -> MeasurementTable:
    """Load a canonical or NV-DVFS measurement CSV (the layout is recognised by its columns)."""
    path = Path(path)
    header, rows = read_csv(path)
    if not rows:
        raise KdvfsError(f"{path}: no data rows")
    if sum(c in header for c in NVDVFS_COLUMNS) >= 3 and not all(c in header for c in CANONICAL_COLUMNS):
        require_columns(path, header, NVDVFS_COLUMNS)  # an NV-DVFS table lacking some of its columns
        records = _nvdvfs_records(path, header, rows)
    else:
        records = _canonical_records(path, header, rows)
    return _build(path, records)


def _feature_columns(header: tuple[str, ...], rows: list[CsvRow], exclude: frozenset[str]) -> tuple[str, ...]:
    """Columns whose every non-empty cell is a finite number (and that have at least one)."""

    def numeric(text: str) -> bool:
        try:
            return math.isfinite(float(text))
        except ValueError:
            return False

    columns = []
    for c in header:
        if c in exclude:
            continue
        cells = [r.cells.get(c, "") for r in rows]
        present = [t for t in cells if t]
        if present and all(numeric(t) for t in present):
            columns.append(c)
    return tuple(columns)


def _features(row: CsvRow, columns: tuple[str, ...]) -> dict[str, float]:
    return {c: float(row.cells[c]) for c in columns if row.cells.get(c)}


def _canonical_records(path: Path, header: tuple[str, ...], rows: list[CsvRow]) -> list[_Record]:
    require_columns(path, header, CANONICAL_COLUMNS)
    if "energy_j" not in header and "power_w" not in header:
        raise KdvfsError(f"{path}: header (line 1): missing required column 'energy_j' (or 'power_w')")
    feature_columns = _feature_columns(header, rows, _CANONICAL_NOT_FEATURES)
    records = []
    for r in rows:
        kernel = r.cells.get("kernel", "")
        if not kernel:
            raise KdvfsError(f"{path}: row {r.row} (line {r.line}), column 'kernel': empty value")
        pass_name = r.cells.get("pass", "") or "forward"
        if pass_name not in PASSES:
            raise KdvfsError(
                f"{path}: row {r.row} (line {r.line}), column 'pass': {pass_name!r} is not one of {', '.join(PASSES)}"
            )
        time_s = _time_s(path, r, "time_s", 1.0)
        energy_j = _energy_j(path, r, time_s, "energy_j" if "energy_j" in header else None, "power_w")
        pair = ClockPair(_clock_mhz(path, r, "core_mhz"), _clock_mhz(path, r, "mem_mhz"))
        records.append(_Record(kernel, pair, time_s, energy_j, pass_name, _features(r, feature_columns), r))
    return records


def _nvdvfs_records(path: Path, header: tuple[str, ...], rows: list[CsvRow]) -> list[_Record]:
    """NV-DVFS rows: kernel = appName:kernel (plus [argNo] where an app ran several inputs)."""
    feature_columns = _feature_columns(header, rows, _NVDVFS_NOT_FEATURES)
    inputs: dict[tuple[str, str], set[str]] = {}
    for r in rows:
        inputs.setdefault((r.cells.get("appName", ""), r.cells.get("kernel", "")), set()).add(
            r.cells.get("argNo", "")
        )
    records = []
    for r in rows:
        app, name = r.cells.get("appName", ""), r.cells.get("kernel", "")
        for column, value in (("appName", app), ("kernel", name)):
            if not value:
                raise KdvfsError(f"{path}: row {r.row} (line {r.line}), column {column!r}: empty value")
        kernel = f"{app}:{name}"
        if len(inputs[(app, name)]) > 1:
            kernel += f"[{r.cells.get('argNo', '')}]"
        time_s = _time_s(path, r, "time/ms", 1000.0)
        energy_j = _energy_j(path, r, time_s, None, "power/W")
        pair = ClockPair(_clock_mhz(path, r, "coreF"), _clock_mhz(path, r, "memF"))
        records.append(_Record(kernel, pair, time_s, energy_j, "forward", _features(r, feature_columns), r))
    return records


def _build(path: Path, records: list[_Record]) -> MeasurementTable:
    costs: dict[str, dict[ClockPair, tuple[float, float]]] = {}
    first_row: dict[tuple[str, ClockPair], CsvRow] = {}
    passes: dict[str, str] = {}
    feature_values: dict[str, dict[str, list[float]]] = {}
    for rec in records:
        earlier = first_row.setdefault((rec.kernel, rec.pair), rec.row)
        if earlier is not rec.row:
            raise KdvfsError(
                f"{path}: row {rec.row.row} (line {rec.row.line}), columns kernel+clocks: {rec.kernel!r} at "
                f"{rec.pair} repeats row {earlier.row}"
            )
        if passes.setdefault(rec.kernel, rec.pass_name) != rec.pass_name:
            raise KdvfsError(
                f"{path}: row {rec.row.row} (line {rec.row.line}), column 'pass': {rec.kernel!r} is "
                f"{rec.pass_name!r} here but {passes[rec.kernel]!r} earlier"
            )
        costs.setdefault(rec.kernel, {})[rec.pair] = (rec.time_s, rec.energy_j)
        per_kernel = feature_values.setdefault(rec.kernel, {})
        for column, value in rec.features.items():
            per_kernel.setdefault(column, []).append(value)
    features = {k: tuple((c, fmean(v)) for c, v in cols.items()) for k, cols in feature_values.items()}
    return MeasurementTable(
        name=path.stem,
        path=path,
        kernels=tuple(costs),
        costs=costs,
        features=features,
        passes=passes,
        grid=ClockGrid(tuple(first_row_pair for _, first_row_pair in first_row)),
    )
