"""Measurement tables: canonical and NV-DVFS CSVs, features, workloads, and every bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from kdvfs.runtime.tables import load_table
from kdvfs.runtime.types import ClockPair, KdvfsError

DVFS_REAL = Path(__file__).resolve().parents[2] / "data" / "dvfs-real"
GTX1080TI = DVFS_REAL / "gtx1080ti-dvfs-real-Performance-Power.csv"
RTX2070S = DVFS_REAL / "gtx2070s-dvfs-real-Performance-Power.csv"


def write(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


CANONICAL = """kernel,core_mhz,mem_mhz,time_s,energy_j,occupancy,label
gemm,1000,5000,0.004,0.8,0.5,big
gemm,2000,5000,0.002,0.6,0.7,big
ln,1000,5000,0.003,0.3,0.2,small
ln,2000,5000,0.0025,0.4,0.4,small
"""


def test_canonical_table_costs_grid_order_and_feature_means(tmp_path: Path) -> None:
    table = load_table(write(tmp_path, CANONICAL, "mytable.csv"))
    assert table.name == "mytable"
    assert table.kernels == ("gemm", "ln")
    assert table.grid.pairs == (ClockPair(1000, 5000), ClockPair(2000, 5000))
    assert table.cost("ln", ClockPair(2000, 5000)) == (0.0025, 0.4)
    # the non-numeric "label" column is ignored, the numeric one averaged per kernel
    assert dict(table.features["gemm"]) == pytest.approx({"occupancy": 0.6})
    assert dict(table.features["ln"]) == pytest.approx({"occupancy": 0.3})
    assert table.lowest_power_w == pytest.approx(0.3 / 0.003)


def test_power_column_gives_energy_as_time_times_power(tmp_path: Path) -> None:
    table = load_table(write(tmp_path, "kernel,core_mhz,mem_mhz,time_s,power_w\nk,900,800,0.5,200\n"))
    assert table.cost("k", ClockPair(900, 800)) == pytest.approx((0.5, 100.0))
    assert table.features["k"] == ()  # power_w is a measurement, not a feature


def test_workload_in_table_order_referenced_at_highest_pair(tmp_path: Path) -> None:
    text = "kernel,core_mhz,mem_mhz,time_s,energy_j,pass\n" + "\n".join(
        [
            "b,1000,900,0.004,1.0,backward",
            "a,1000,900,0.003,1.0,forward",
            "b,1500,900,0.002,1.0,backward",
            "a,1500,900,0.001,1.0,forward",
            "b,2000,800,0.009,1.0,backward",
            "a,2000,800,0.008,1.0,forward",
        ]
    )
    workload = load_table(write(tmp_path, text)).workload()
    assert [k.name for k in workload.kernels] == ["b", "a"]
    assert [k.pass_name for k in workload.kernels] == ["backward", "forward"]
    assert [k.launches for k in workload.kernels] == [1, 1]
    # highest = highest memory clock first (900), then the highest core at it (1500)
    assert [k.ref_time_s for k in workload.kernels] == [0.002, 0.001]


def test_pass_defaults_to_forward(tmp_path: Path) -> None:
    workload = load_table(write(tmp_path, CANONICAL)).workload()
    assert {k.pass_name for k in workload.kernels} == {"forward"}
    assert workload.kernel("gemm").feature_dict() == pytest.approx({"occupancy": 0.6})


def test_missing_pair_allowed_in_table_but_an_error_when_asked(tmp_path: Path) -> None:
    path = write(tmp_path, CANONICAL + "gemm,1500,5000,0.003,0.7,0.6,big\n")
    table = load_table(path)
    assert ClockPair(1500, 5000) in table.grid
    with pytest.raises(KdvfsError) as err:
        table.cost("ln", ClockPair(1500, 5000))
    assert str(path) in str(err.value) and "'ln'" in str(err.value) and "1500/5000 MHz" in str(err.value)
    with pytest.raises(KdvfsError, match="no kernel 'nope'"):
        table.cost("nope", ClockPair(1000, 5000))


def test_workload_fails_when_a_kernel_lacks_the_highest_pair(tmp_path: Path) -> None:
    path = write(tmp_path, CANONICAL + "gemm,2500,5000,0.001,0.7,0.6,big\n")
    with pytest.raises(KdvfsError, match=r"'ln' was not recorded at 2500/5000 MHz"):
        load_table(path).workload()


def test_gtx1080ti_nvdvfs_file() -> None:
    table = load_table(GTX1080TI)
    assert len(table.kernels) == 30
    assert table.kernels[0] == "BlackScholes:BlackScholesGPU"
    assert table.grid.core_levels_mhz == (1600, 1700, 1800, 1900, 2000)
    assert table.grid.mem_levels_mhz == (4000, 4500, 5000, 5500)
    assert len(table.grid) == 20
    # first data row: 1.9886 ms at 201.853 W
    assert table.cost("BlackScholes:BlackScholesGPU", ClockPair(1600, 4000)) == pytest.approx(
        (1.9886e-3, 1.9886e-3 * 201.85300000000004)
    )
    features = dict(table.features["BlackScholes:BlackScholesGPU"])
    assert {"achieved_occupancy", "dram_read_throughput", "executed_ipc", "warps"} <= features.keys()
    assert not {"blocks", "coreF", "memF", "time/ms", "power/W", "argNo"} & features.keys()
    assert "l2_tex_write_throughput.1" in features  # the file repeats that column name
    workload = table.workload()
    assert len(workload) == 30
    assert workload.kernels[0].ref_time_s == table.cost(workload.kernels[0].name, ClockPair(2000, 5500))[0]


def test_rtx2070s_nvdvfs_file_without_counters() -> None:
    table = load_table(RTX2070S)
    assert len(table.kernels) == 20
    assert table.grid.highest() == ClockPair(2080, 7300)
    assert all(f == () for f in table.features.values())  # blocks / warps are empty there


def test_nvdvfs_argno_names_kernels_only_when_an_app_ran_several_inputs(tmp_path: Path) -> None:
    text = ",appName,coreF,memF,argNo,kernel,time/ms,blocks,power/W\n" + "\n".join(
        [
            "0,app,1000,500,in0,k,2.0,(1 1 1),100",
            "1,app,1000,500,in1,k,4.0,(1 1 1),100",
            "2,other,1000,500,in0,j,1.0,(1 1 1),50",
        ]
    )
    table = load_table(write(tmp_path, text))
    assert table.kernels == ("app:k[in0]", "app:k[in1]", "other:j")
    assert table.cost("app:k[in1]", ClockPair(1000, 500)) == pytest.approx((4e-3, 0.4))
    assert table.features["other:j"] == ()  # the unnamed index column is not a feature


HEADER = "kernel,core_mhz,mem_mhz,time_s,energy_j\n"
GOOD = "k,1000,500,0.001,0.1\n"


@pytest.mark.parametrize(
    ("text", "row", "column"),
    [
        ("kernel,core_mhz,mem_mhz,energy_j\nk,1000,500,0.1\n", "header (line 1)", "time_s"),
        ("kernel,core_mhz,mem_mhz,time_s\nk,1000,500,0.1\n", "header (line 1)", "energy_j"),
        (HEADER + GOOD + "k2,1000,500,fast,0.1\n", "row 2 (line 3)", "time_s"),
        (HEADER + GOOD + "k2,1000,500,0.001,-0.1\n", "row 2 (line 3)", "energy_j"),
        (HEADER + GOOD + "k2,1000,500,nan,0.1\n", "row 2 (line 3)", "time_s"),
        (HEADER + GOOD + "k2,1000,500,0.001,inf\n", "row 2 (line 3)", "energy_j"),
        (HEADER + GOOD + "k2,1000,500,0,0.1\n", "row 2 (line 3)", "time_s"),
        (HEADER + GOOD + "k2,1000,,0.001,0.1\n", "row 2 (line 3)", "mem_mhz"),
        (HEADER + GOOD + "k2,1000.5,500,0.001,0.1\n", "row 2 (line 3)", "core_mhz"),
        (HEADER + GOOD + ",1000,500,0.001,0.1\n", "row 2 (line 3)", "kernel"),
        (HEADER + GOOD + "k2,1000,500,0.001,0.1\n" + GOOD, "row 3 (line 4)", "kernel+clocks"),
        (HEADER + GOOD + "k2,1000,500,0.001,0.1,7\n", "row 2 (line 3)", "fields"),
        (
            "kernel,core_mhz,mem_mhz,time_s,power_w\n" + GOOD + "k2,1000,500,0.001,0\n",
            "row 2 (line 3)",
            "power_w",
        ),
        (HEADER.rstrip() + ",pass\n" + GOOD.rstrip() + ",sideways\n", "row 1 (line 2)", "pass"),
        (HEADER.rstrip() + ",pass\n" + "k,1,1,1,1,forward\nk,2,2,1,1,backward\n", "row 2 (line 3)", "pass"),
        (",appName,coreF,memF,kernel,time/ms,power/W\n0,a,1000,500,k,1.0,x\n", "row 1 (line 2)", "power/W"),
        (",appName,coreF,memF,kernel,time/ms,power/W\n0,a,1000,500,,1.0,1\n", "row 1 (line 2)", "kernel"),
    ],
)
def test_bad_rows_name_file_row_and_column(tmp_path: Path, text: str, row: str, column: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(KdvfsError) as err:
        load_table(path)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    assert row in message
    assert column in message


def test_blank_lines_are_not_counted_as_rows(tmp_path: Path) -> None:
    path = write(tmp_path, HEADER + GOOD + "\n" + "k2,1000,500,x,0.1\n")
    with pytest.raises(KdvfsError, match=r"row 2 \(line 4\), column 'time_s'"):
        load_table(path)


@pytest.mark.parametrize(("text", "problem"), [("", "file is empty"), (HEADER, "no data rows")])
def test_empty_tables_are_errors(tmp_path: Path, text: str, problem: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(KdvfsError, match=problem) as err:
        load_table(path)
    assert str(path) in str(err.value)


def test_missing_file_is_a_kdvfs_error(tmp_path: Path) -> None:
    with pytest.raises(KdvfsError, match="cannot read"):
        load_table(tmp_path / "absent.csv")
