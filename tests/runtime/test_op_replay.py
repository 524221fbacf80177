"""Ops of a training step recorded by torch.profiler and rebuilt alone, on the CPU."""

from __future__ import annotations

import torch

from kdvfs.runtime.op_replay import RecordedOp, rebuild, record_ops, time_rebuilt


def small_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(8, 16)

    def step() -> None:
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def test_every_op_of_a_small_training_step_is_recorded_once_and_rebuilt():
    ops = record_ops(small_step(), steps=2, cuda=False)
    names = [op.name for op in ops]
    assert [op.position for op in ops] == list(range(len(ops)))
    assert {"aten::linear", "aten::layer_norm", "aten::mm", "aten::native_layer_norm_backward"} <= set(names)
    assert any(
        n.startswith(("aten::_foreach", "aten::_fused_adam", "aten::addcdiv")) for n in names
    )  # the optimizer
    assert all(op.device_time_s > 0 for op in ops)  # on the CPU: the op's own time in the step
    rebuilt = [rebuild(op, "cpu") for op in ops]
    assert all(fn is not None for fn in rebuilt), [op.name for op, fn in zip(ops, rebuilt) if fn is None]


def test_a_rebuilt_op_has_the_recorded_shapes_dtypes_and_layout():
    op = RecordedOp(
        name="aten::addmm",
        overload="",
        shapes=([4], [3, 5], [5, 4]),
        dtypes=("c10::BFloat16", "c10::BFloat16", "c10::BFloat16"),
        strides=([0], [5, 1], [1, 5]),  # an expanded bias and a transposed weight, as in a Linear
        values=(None, None, None),
        position=0,
        device_time_s=1e-6,
    )
    out = rebuild(op, "cpu")()
    assert out.shape == (3, 4) and out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()
    assert time_rebuilt(rebuild(op, "cpu"), "cpu", min_time_s=0.001) > 0


def test_keyword_only_and_scalar_inputs_are_passed_as_the_schema_says():
    # add_(self, other, *, alpha): the profiler records alpha in schema order
    op = RecordedOp(
        "aten::add_", "", ([2, 2], [2, 2], []), ("float", "float", "Scalar"), (), (None, None, 2), 0, 1e-6
    )
    assert rebuild(op, "cpu") is not None


def test_an_op_that_cannot_be_rebuilt_is_none_not_an_error():
    unknown = RecordedOp("aten::no_such_op", "", ([2],), ("float",), (), (None,), 0, 1e-6)
    wrong = RecordedOp("aten::mm", "", ([2, 3], [4, 5]), ("float", "float"), (), (None, None), 1, 1e-6)
    odd = RecordedOp("aten::mm", "", ([2, 3], [3, 5]), ("SomeStruct", "float"), (), (None, None), 2, 1e-6)
    assert rebuild(unknown, "cpu") is None and rebuild(wrong, "cpu") is None and rebuild(odd, "cpu") is None


def test_the_optimizers_foreach_ops_are_rebuilt_on_lists_of_the_parameters_shapes():
    # the profiler records no shapes inside a list of tensors: the last warm-up step notes them
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)).to(torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    x = torch.randn(8, 16, dtype=torch.bfloat16)

    def step() -> None:
        model(x).float().pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    ops = [op for op in record_ops(step, steps=2, cuda=False) if op.name.startswith("aten::_foreach_")]
    shapes = [list(p.shape) for p in model.parameters()]
    assert {"aten::_foreach_lerp_", "aten::_foreach_addcdiv_", "aten::_foreach_sqrt"} <= {
        op.name for op in ops
    }
    for op in ops:
        lists = [i for i, d in enumerate(op.dtypes) if d == "TensorList"]
        assert lists and all(len(op.shapes[i]) == len(shapes) for i in lists), op
        assert rebuild(op, "cpu") is not None, op.name
    sqrt = next(op for op in ops if op.name == "aten::_foreach_sqrt")
    out = rebuild(sqrt, "cpu")()
    assert [list(t.shape) for t in out] == shapes and {t.dtype for t in out} == {torch.bfloat16}
