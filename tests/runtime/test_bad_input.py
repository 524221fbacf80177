"""Bad input to the runtime's public names and data files: one KdvfsError line naming the
parameter or file, the value and what is allowed; what is valid goes through."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdvfs.cli.commands._common import MAX_NOISE_SCALE as CLI_MAX_NOISE_SCALE
from kdvfs.runtime.op_replay import MAX_OPS_BYTES, load_ops
from kdvfs.runtime.registry import MAX_NOISE_SCALE, nvml_index, open_device
from kdvfs.runtime.simulator import SimulatedDevice
from kdvfs.runtime.tables import MAX_CSV_BYTES, load_table, read_csv
from kdvfs.runtime.trace import load_trace
from kdvfs.runtime.types import ClockPair, KdvfsError
from kdvfs.tuner.calibration import calibrate
from kdvfs.tuner.plan import MAX_PLAN_BYTES, load_plan

PROBE = Path(__file__).resolve().parents[2] / "data" / "h200-probe" / "kernels_stock.csv"
BOM = b"\xef\xbb\xbf"

TABLE = b"""kernel,core_mhz,mem_mhz,time_s,energy_j
gemm,1000,5000,0.004,0.8
gemm,2000,5000,0.002,0.6
"""

GEMM = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT"
LN = "void at::native::vectorized_layer_norm_kernel<float>(int)"
TRACE = (
    "seq,name,start_us,duration_us\n"
    + "".join(f"{i},{name},{10.0 * i},{4.0 + i % 2}\n" for i, name in enumerate([GEMM, LN] * 3))
).encode()


# --- clock pairs ---------------------------------------------------------------------------------
def test_a_clock_pair_of_positive_whole_mhz_is_kept_as_given() -> None:
    pair = ClockPair(1980, 3201)
    assert (pair.core_mhz, pair.mem_mhz) == (1980, 3201) and str(pair) == "1980/3201 MHz"


def test_a_clock_pair_takes_numpy_integers_as_ints() -> None:
    pair = ClockPair(np.int64(1980), np.int32(3201))
    assert type(pair.core_mhz) is int and type(pair.mem_mhz) is int
    assert pair == ClockPair(1980, 3201) and hash(pair) == hash(ClockPair(1980, 3201))


@pytest.mark.parametrize(
    ("core", "mem", "named"),
    [("a", "b", "core_mhz"), (1980, "3201", "mem_mhz"), (1980.0, 3201, "core_mhz"), (True, 3201, "core_mhz"),
     (0, 3201, "core_mhz"), (1980, -5, "mem_mhz"), (None, 3201, "core_mhz")],
)  # fmt: skip
def test_a_clock_pair_that_is_not_two_positive_whole_numbers_is_refused_in_one_line(core, mem, named) -> None:
    with pytest.raises(KdvfsError, match=f"clock pair: {named} must be a whole number of MHz > 0") as exc:
        ClockPair(core, mem)
    assert "\n" not in str(exc.value)


@settings(derandomize=True)
@given(st.integers(min_value=1, max_value=10**6), st.integers(min_value=1, max_value=10**6))
def test_every_pair_of_positive_whole_numbers_is_a_clock_pair(core: int, mem: int) -> None:
    pair = ClockPair(core, mem)
    assert pair.as_list() == [core, mem]


@settings(derandomize=True)
@given(
    st.one_of(
        st.integers(max_value=0),
        st.floats(allow_nan=True, allow_infinity=True),
        st.booleans(),
        st.text(max_size=5),
        st.none(),
    )
)
def test_every_clock_that_is_not_a_positive_whole_number_is_refused(value) -> None:
    with pytest.raises(KdvfsError, match="core_mhz must be a whole number of MHz > 0"):
        ClockPair(value, 3201)
    with pytest.raises(KdvfsError, match="mem_mhz must be a whole number of MHz > 0"):
        ClockPair(1980, value)


# --- the noise scale of open_device ------------------------------------------------------------
def test_open_device_and_the_cli_share_one_noise_limit() -> None:
    assert MAX_NOISE_SCALE == CLI_MAX_NOISE_SCALE


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    st.one_of(
        st.floats(max_value=0.0, exclude_max=True),
        st.floats(min_value=MAX_NOISE_SCALE, exclude_min=True),
        st.just(math.nan),
        st.just(math.inf),
        st.just(-math.inf),
    )
)
def test_open_device_refuses_every_noise_scale_that_is_not_finite_or_out_of_range(noise: float) -> None:
    for spec in ("sim:rtx3080ti", "replay:unread.csv"):
        with pytest.raises(KdvfsError, match=r"noise must be a finite number >= 0 and <= 20, got ") as exc:
            open_device(spec, noise=noise)
        assert "\n" not in str(exc.value)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(st.floats(min_value=0.0, max_value=MAX_NOISE_SCALE))
def test_open_device_accepts_every_noise_scale_from_0_to_the_limit(noise: float) -> None:
    device = open_device("sim:rtx3080ti", noise=noise)
    assert isinstance(device, SimulatedDevice)


def test_open_device_refuses_a_noise_scale_that_is_not_a_number() -> None:
    with pytest.raises(KdvfsError, match=r"noise must be a finite number >= 0 and <= 20, got '1'"):
        open_device("sim:rtx3080ti", noise="1")


@pytest.mark.parametrize("spec", ["nvml:abc", "nvml:-1", "nvml:1.5", "nvml:0x1"])
def test_a_gpu_index_that_is_not_a_whole_number_is_named_as_such(spec: str) -> None:
    with pytest.raises(KdvfsError, match="the GPU index must be a whole number, as nvml:0"):
        nvml_index(spec)
    with pytest.raises(KdvfsError, match="the GPU index must be a whole number, as nvml:0"):
        open_device(spec)


def test_a_gpu_index_of_digits_is_the_index_and_none_is_gpu_0() -> None:
    assert nvml_index("nvml:3") == 3 and nvml_index("nvml") == 0 and nvml_index("nvml:") == 0


# --- CSV files saved with a byte-order mark ------------------------------------------------------
def _pair_of_files(tmp_path: Path, content: bytes, name: str) -> tuple[Path, Path]:
    plain, marked = tmp_path / f"plain_{name}", tmp_path / f"bom_{name}"
    plain.write_bytes(content)
    marked.write_bytes(BOM + content)
    return plain, marked


def test_a_csv_with_a_byte_order_mark_has_the_same_header_and_rows(tmp_path: Path) -> None:
    plain, marked = _pair_of_files(tmp_path, TABLE, "t.csv")
    header, rows = read_csv(marked)
    assert header[0] == "kernel"
    assert (header, [r.cells for r in rows]) == (read_csv(plain)[0], [r.cells for r in read_csv(plain)[1]])


def test_a_replay_table_with_a_byte_order_mark_loads_as_without_it(tmp_path: Path) -> None:
    plain, marked = _pair_of_files(tmp_path, TABLE, "t.csv")
    assert load_table(marked).costs == load_table(plain).costs


def test_a_trace_with_a_byte_order_mark_loads_as_without_it(tmp_path: Path) -> None:
    plain, marked = _pair_of_files(tmp_path, TRACE, "trace.csv")
    assert load_trace(marked).kernels == load_trace(plain).kernels


def test_a_probe_table_with_a_byte_order_mark_calibrates_as_without_it(tmp_path: Path) -> None:
    lines = PROBE.read_bytes().splitlines(keepends=True)
    plain, marked = _pair_of_files(tmp_path, b"".join(lines[:3]), "kernels_stock.csv")
    device = SimulatedDevice("h200", noise=0.0)
    assert calibrate(device, marked) == calibrate(device, plain)


# --- files read whole are refused by size first -------------------------------------------------
def _sparse(path: Path, size_bytes: int) -> Path:
    """A file of `size_bytes` that takes no disk space (it reads as zeros)."""
    with path.open("wb") as f:
        f.truncate(size_bytes)
    return path


@pytest.mark.parametrize(
    ("read", "limit_bytes", "name", "what", "limit_text"),
    [
        (load_plan, MAX_PLAN_BYTES, "plan.json", "plan", "64.0 MiB"),
        (load_table, MAX_CSV_BYTES, "table.csv", "CSV table", "1.0 GiB"),
        (load_trace, MAX_CSV_BYTES, "trace.csv", "CSV table", "1.0 GiB"),
        (load_ops, MAX_OPS_BYTES, "ops.json", "recording of ops", "256.0 MiB"),
    ],
)
def test_a_file_over_its_size_limit_is_refused_in_one_line_naming_file_size_and_limit(
    tmp_path: Path, read, limit_bytes: int, name: str, what: str, limit_text: str
) -> None:
    path = _sparse(tmp_path / name, limit_bytes + (1 << 20))
    with pytest.raises(KdvfsError) as exc:
        read(path)
    message = str(exc.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    assert f"is too large for a {what} (the limit is {limit_text})" in message


def test_a_plan_under_its_size_limit_is_read_and_validated(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"schema": "something else"}) + " " * 100)
    with pytest.raises(KdvfsError, match="not a kdvfs plan"):  # read and validated, not refused by size
        load_plan(path)
