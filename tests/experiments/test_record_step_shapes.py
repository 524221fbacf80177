"""The step-shape recorder's --shapes option (experiments/record_step_shapes.py), on the CPU."""

from __future__ import annotations

import pytest

from kdvfs.experiments import record_step_shapes


def test_no_shapes_named_selects_every_shape_in_order():
    assert record_step_shapes.select_shapes(None) == list(record_step_shapes.SHAPES)
    assert record_step_shapes.select_shapes("") == list(record_step_shapes.SHAPES)


def test_named_shapes_come_in_the_table_order_once_each():
    names = record_step_shapes.select_shapes(
        "resnet18_bf16_b32_sgd, vit_b16_fp32_adamw_b64,resnet18_bf16_b32_sgd"
    )
    assert names == ["vit_b16_fp32_adamw_b64", "resnet18_bf16_b32_sgd"]


def test_an_unknown_shape_exits_non_zero_with_one_line_naming_it(capsys):
    with pytest.raises(SystemExit) as stop:
        record_step_shapes.main(["--out", "unused", "--shapes", "resnet50_bf16_b128,vit_huge"])
    message = str(stop.value.code)
    assert "vit_huge" in message and "\n" not in message and stop.value.code != 0
    assert not capsys.readouterr().out


def test_a_list_of_commas_only_is_refused():
    with pytest.raises(SystemExit):
        record_step_shapes.select_shapes(",")


def test_a_kernels_launch_shape_is_its_grid_and_block_as_products_and_its_blocks_per_sm():
    args = {"grid": [40, 2, 1], "block": [128, 2, 1], "blocks per SM": 0.61, "device": 0}
    assert record_step_shapes.launch_shape(args) == (80, 256, 0.61)


def test_a_copy_without_a_launch_shape_gets_empty_fields():
    assert record_step_shapes.launch_shape({"bytes": 4096}) == ("", "", "")


def test_a_grids_only_value_other_than_0_or_1_exits_non_zero_with_one_line_naming_it(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        record_step_shapes.main(["--out", str(tmp_path / "unused"), "--grids-only", "yes"])
    message = str(stop.value.code)
    assert "--grids-only" in message and "'yes'" in message and "\n" not in message
    assert not (tmp_path / "unused").exists() and not capsys.readouterr().out


def test_a_gpu_event_gets_the_start_of_the_host_call_of_its_correlation_id():
    events = [
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 95.0, "args": {"correlation": 7}},
        {"cat": "cuda_driver", "name": "cuLaunchKernel", "ts": 120.0, "args": {"correlation": 8}},
        {"cat": "kernel", "name": "k1", "ts": 100.0, "dur": 4.0, "args": {"correlation": 7}},
        {"cat": "kernel", "name": "k2", "ts": 130.0, "dur": 2.0, "args": {"correlation": 8}},
        {"cat": "gpu_memset", "name": "Memset", "ts": 110.0, "dur": 1.0, "args": {"correlation": 9}},
        {"cat": "cpu_op", "name": "aten::mm", "ts": 90.0, "dur": 9.0, "args": {}},
    ]
    assert record_step_shapes.gpu_events(events) == [
        ("k1", 0.0, 4.0, -5.0),
        ("Memset", 10.0, 1.0, ""),
        ("k2", 30.0, 2.0, 20.0),
    ]


def test_a_graphs_value_other_than_0_or_1_exits_non_zero_with_one_line_naming_it(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        record_step_shapes.main(["--out", str(tmp_path), "--graphs", "yes"])
    assert exit_.value.code != 0 and "--graphs is 0 or 1, got 'yes'" in str(exit_.value.code)
