"""`kdvfs doctor` and `kdvfs probe` without a GPU: the fake NVML card, and the no-GPU paths.

The probe's CUDA measurement itself needs a GPU; here: kernel names to shapes and work,
the kernels on CPU at tiny sizes, the CSV format, and the no-CUDA error.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from dataclasses import astuple

import pynvml
import pytest

from kdvfs.cli.commands import doctor, probe
from kdvfs.cli.commands.doctor import energy_update_period_s
from kdvfs.cli.commands.probe import PROBE_COLUMNS, ProbeRow, write_probe_csv
from kdvfs.runtime import nvml_device
from kdvfs.runtime.probe_kernels import DEFAULT_PROBE_KERNELS, SIZE_LADDER, parse_probe_kernel
from kdvfs.runtime.types import KdvfsError
from tests.runtime import fake_pynvml


def run_command(module, argv: list[str]) -> int:
    """Parse and run one command module as kdvfs.cli does."""
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return module.run(parser.parse_args(argv))


@pytest.fixture
def fake(monkeypatch, tmp_path):
    state = fake_pynvml.configure()
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)
    monkeypatch.delenv(nvml_device.NVML_MODULE_ENV, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setattr(nvml_device, "admin_privilege", lambda: (False, "not root and no CAP_SYS_ADMIN"))
    return state


# --- doctor ---------------------------------------------------------------------------------
def test_doctor_reports_the_card_read_only(fake, tmp_path, capsys):
    fake.clock_event_reasons = pynvml.nvmlClocksEventReasonSwPowerCap
    report_path = tmp_path / "doctor.json"
    assert run_command(doctor, ["--json", str(report_path)]) == 0
    (gpu,) = json.loads(report_path.read_text())["gpus"]
    assert gpu["source"] == "measured"
    assert (gpu["name"], gpu["driver"]) == ("NVIDIA H200", "580.159.04")
    assert gpu["clocks"]["pairs"] == 10
    assert gpu["clocks"]["per_memory_clock"][0] == {
        "mem_mhz": 3201, "graphics_count": 5, "graphics_min_mhz": 345, "graphics_max_mhz": 1980,
    }  # fmt: skip
    energy = gpu["energy_counter"]
    assert energy["present"] and energy["update_period_s"] == pytest.approx(
        fake_pynvml.ENERGY_UPDATE_PERIOD_S, rel=0.3
    )
    assert gpu["set_clocks"] == {"allowed": False, "reason": "not root and no CAP_SYS_ADMIN"}
    assert gpu["power"] == {"draw_w": 82.799, "limit_w": 700.0, "limit_min_w": 200.0, "limit_max_w": 700.0}
    assert gpu["current"] == {
        "sm_mhz": 345,
        "mem_mhz": 3201,
        "temperature_c": 37.0,
        "throttle_reasons": ["sw_power_cap"],
    }
    assert gpu["lease"] is None
    assert fake.calls == [] and fake.init_count == 0  # nothing set or reset; NVML shut down

    out = capsys.readouterr().out
    figure_lines = [line for line in out.splitlines() if line.startswith(" ") or line.startswith("GPU")]
    assert len(figure_lines) == 8 and all(line.endswith("[measured]") for line in figure_lines)
    assert "memory 2201 MHz: 5 graphics clocks, 345-1980 MHz" in out
    assert "lock clocks: not allowed" in out and "sw_power_cap" in out


def test_doctor_without_energy_counter_says_so(fake, tmp_path, capsys):
    fake.not_supported = frozenset(
        {"nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetPowerManagementLimitConstraints"}
    )
    report_path = tmp_path / "doctor.json"
    assert run_command(doctor, ["--index", "0", "--json", str(report_path)]) == 0
    (gpu,) = json.loads(report_path.read_text())["gpus"]
    assert gpu["energy_counter"]["present"] is False and gpu["energy_counter"]["update_period_s"] is None
    assert gpu["power"]["limit_min_w"] is None
    out = capsys.readouterr().out
    assert "no total-energy counter" in out and "range n/a-n/a" in out


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        ("no_module", "(pynvml is not installed)"),
        ("library_not_found", "(NVMLError_LibraryNotFound)"),
        ("no_gpu", "(0 GPUs)"),
    ],
)
def test_doctor_without_nvml_or_gpu_is_one_line_and_exit_1(fake, monkeypatch, capsys, setup, reason):
    if setup == "no_module":
        monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    elif setup == "library_not_found":
        fake_pynvml.configure(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    else:
        fake_pynvml.configure(gpu_count=0)
    assert run_command(doctor, []) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"kdvfs doctor: no NVIDIA GPU or NVML library found {reason}\n"


def test_doctor_unknown_index_is_one_line_and_exit_1(fake, capsys):
    assert run_command(doctor, ["--index", "2"]) == 1
    assert capsys.readouterr().err == "kdvfs doctor: no NVIDIA GPU with index 2 (1 found)\n"


def test_energy_update_period_is_the_median_gap_between_changes():
    start = time.monotonic()

    def counter_every_50ms() -> float:
        return float(int((time.monotonic() - start) / 0.05))

    period_s, changes = energy_update_period_s(counter_every_50ms, poll_s=0.3)
    assert period_s == pytest.approx(0.05, rel=0.3) and changes >= 4
    assert energy_update_period_s(lambda: 1.0, poll_s=0.05) == (None, 0)


# --- probe ----------------------------------------------------------------------------------
def test_probe_names_give_the_work_the_recorded_probe_counts():
    kernels = {name: parse_probe_kernel(name) for name in DEFAULT_PROBE_KERNELS}
    assert kernels["gemm_bf16_8192"].flops == 2 * 8192**3
    assert kernels["gemm_bf16_2048"].bytes_moved == 0
    layernorm = kernels["layernorm_8k_x_2048"]
    assert (layernorm.size("rows"), layernorm.size("cols")) == (8192, 2048)
    assert layernorm.bytes_moved == 2 * 8192 * 2048 * 2  # bf16 read + write
    assert kernels["gelu_256MiB"].bytes_moved == kernels["copy_256MiB"].bytes_moved == 2 * 256 * 2**20
    sdpa = kernels["sdpa_causal_b8_h16_t1024"]
    assert sdpa.size("d") == 128 and sdpa.flops == 2 * 8 * 16 * 1024**2 * 128
    # h200-probe/kernels_stock.csv: 656.18 TFLOP/s at 1675.63 us per call for the 8192^3 GEMM
    assert kernels["gemm_bf16_8192"].flops / 1675.6321833683894e-6 / 1e12 == pytest.approx(656.1771960990507)
    assert parse_probe_kernel("sdpa_causal_b1_h2_t64_d32").size("d") == 32


@pytest.mark.parametrize(
    "name",
    [
        "gemm_fp8_128",
        "layernorm_8k",
        "gelu_256",
        "gelu_256MB2",
        "copy_1TiB",
        "adamw_3X",
        "conv_3x3",
        "gemm_bf16_8192x",
    ],
)
def test_unknown_probe_name_is_a_clear_error(name):
    with pytest.raises(KdvfsError, match=rf"probe kernel '{name}' has no known form \(gemm_bf16_N"):
        parse_probe_kernel(name)


@pytest.mark.parametrize(
    ("name", "size_b"),
    [
        ("gelu_512B", 512),
        ("gelu_256KiB", 256 * 2**10),
        ("gelu_4MiB", 4 * 2**20),
        ("gelu_1GiB", 2**30),
        ("gelu_3KB", 3_000),
        ("gelu_5MB", 5_000_000),
        ("gelu_2GB", 2_000_000_000),
    ],
)
def test_probe_names_take_the_byte_units_people_write(name, size_b):
    kernel = parse_probe_kernel(name)
    assert kernel.size("bytes") == size_b and kernel.bytes_moved == 2 * size_b  # read + write


def test_probe_names_of_the_ladder_kinds_give_their_work_and_kind():
    assert parse_probe_kernel("reduce_sum_1GiB").bytes_moved == 2**30  # read once
    adamw = parse_probe_kernel("adamw_64M")
    assert (
        adamw.size("params") == 64_000_000 and adamw.bytes_moved == 64e6 * 7 * 4 and adamw.kind == "optimizer"
    )
    assert parse_probe_kernel("adamw_1B").size("params") == 10**9
    softmax = parse_probe_kernel("softmax_64k_x_1024")
    assert softmax.size("rows") == 65536 and softmax.bytes_moved == 2 * 65536 * 1024 * 2
    kinds = {parse_probe_kernel(name).kind for name in SIZE_LADDER}
    assert kinds == {"gemm", "attention", "norm", "elementwise", "memory_op", "reduce", "optimizer"}
    with pytest.raises(KdvfsError, match="every size must be > 0"):
        parse_probe_kernel("copy_0MiB")


def test_the_size_ladder_spans_three_orders_of_magnitude_of_work_per_kind():
    by_op: dict[str, list[float]] = {}
    for name in SIZE_LADDER:
        kernel = parse_probe_kernel(name)
        by_op.setdefault(kernel.op, []).append(max(kernel.flops, kernel.bytes_moved))
    assert len(by_op) == 8
    for op, work in by_op.items():
        assert len(work) >= 5 and max(work) / min(work) >= 1000, op


def test_probe_kernels_run_on_cpu_at_tiny_sizes():
    torch = pytest.importorskip("torch")
    names = (
        "gemm_bf16_16", "layernorm_4_x_8", "softmax_4_x_8", "gelu_1MiB", "copy_1MiB", "reduce_sum_4KiB",
        "sdpa_causal_b1_h2_t16_d8", "adamw_1k",
    )  # fmt: skip
    for name in names:
        out = parse_probe_kernel(name).build("cpu")()
        if isinstance(out, torch.Tensor):
            assert torch.isfinite(out.float()).all(), name


def test_probe_csv_has_the_recorded_probe_columns(tmp_path):
    row = ProbeRow(
        "gemm_bf16_2048",
        48195,
        26.52,
        1.295,
        1.278,
        887.9,
        685.6,
        18.42,
        1710,
        1395,
        3201,
        690.9,
        62,
        647.7,
        0.0,
        1.2,
        "graph",
    )
    path = tmp_path / "out" / "kernels_stock.csv"
    write_probe_csv(path, [row])
    with path.open() as f:
        rows = list(csv.DictReader(f))
    header = (
        "kernel,iters,per_call_us,wall_s,gpu_s,energy_J,avg_power_W,energy_per_call_mJ,sm_clock_median,"
        "sm_clock_min,mem_clock,power_W_median,temp_end,tflops,gbps,window_s,mode"
    )  # the recorded probe's columns, then the counter-aligned window and the launch mode
    assert ",".join(PROBE_COLUMNS) == header and list(rows[0]) == header.split(",")
    assert rows[0]["kernel"] == "gemm_bf16_2048" and int(rows[0]["iters"]) == 48195
    assert float(rows[0]["energy_J"]) == 887.9 and int(rows[0]["sm_clock_min"]) == 1395


def test_probe_without_cuda_is_one_line_and_exit_1(tmp_path, monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert run_command(probe, ["--out", str(tmp_path), "--seconds", "0.1"]) == 1
    err = capsys.readouterr().err
    assert (
        err == "kdvfs probe: needs PyTorch with CUDA and an NVIDIA GPU (torch.cuda.is_available() is False)\n"
    )
    assert not (tmp_path / "kernels_stock.csv").exists()


def test_probe_bad_kernel_name_is_a_usage_error(tmp_path):
    with pytest.raises(KdvfsError, match="probe kernel 'warp_drive' has no known form"):
        run_command(probe, ["--out", str(tmp_path), "--kernels", "gemm_bf16_64,warp_drive"])


def test_an_interrupted_probe_writes_the_rows_it_has_and_exits_130(fake, tmp_path, monkeypatch, capsys):
    # no GPU here: CUDA is said to be there (the fake card's GPU 0, by UUID) and
    # measure_kernel stands in for the CUDA measurement; NVML is the fake card
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    gpu0 = argparse.Namespace(uuid="fa4e0000-0000-0000-0000-000000000000")  # the fake card's GPU 0
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: gpu0)
    row = ProbeRow("x", 1, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1980, 1980, 3201, 1.0, 40, 1.0, 1.0, 1.0, "graph")
    measured = []

    def measure(kernel, dev, seconds, cuda_device):
        if len(measured) == 2:
            raise KeyboardInterrupt  # Ctrl-C while the third kernel runs
        measured.append(kernel.name)
        return ProbeRow(kernel.name, *astuple(row)[1:])

    monkeypatch.setattr(probe, "measure_kernel", measure)
    kernels = "gemm_bf16_64,gelu_1MiB,copy_1MiB"
    assert run_command(probe, ["--out", str(tmp_path), "--kernels", kernels]) == 130
    with (tmp_path / "kernels_stock.csv").open() as f:
        assert [r["kernel"] for r in csv.DictReader(f)] == measured == ["gemm_bf16_64", "gelu_1MiB"]
    captured = capsys.readouterr()
    assert "kdvfs probe: interrupted while probing copy_1MiB" in captured.err
    assert "partial: 2 of 3 kernels probed" in captured.out
