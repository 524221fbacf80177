"""Workload discovery from a live PyTorch step (CPU ops stand in for CUDA kernels in CI)."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from kdvfs.runtime.torch_discovery import StepSites, discover_workload, workload_sites
from kdvfs.runtime.types import PASSES, KdvfsError, Kernel, Workload


def tiny_mlp(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer, object]:
    """A Linear/LayerNorm/GELU MLP with AdamW and its training step."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 8))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(4, 8)

    def step() -> None:
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return model, optimizer, step


@pytest.fixture(scope="module")
def discovered() -> Workload:
    model, optimizer, step = tiny_mlp()
    return discover_workload(step, steps=2, model=model, optimizer=optimizer, site_modules=("3",))


def short(kernel: Kernel) -> str:
    return kernel.name.split(".", 1)[1]


def test_kernels_are_named_by_position_and_ordered_by_pass(discovered):
    names = [k.name for k in discovered.kernels]
    assert all(re.fullmatch(r"\d{3}\.[a-z0-9_]+", n) for n in names)
    assert [int(n[:3]) for n in names] == list(range(len(names)))
    passes = [k.pass_name for k in discovered.kernels]
    assert sorted(passes, key=PASSES.index) == passes
    assert set(passes) == {"forward", "backward", "optimizer"}  # one process: no all-reduce
    assert all(k.ref_time_s > 0 for k in discovered.kernels)
    assert dict(discovered.meta)["steps"] == "2"


def test_forward_backward_and_optimizer_ops_are_the_models(discovered):
    by_pass = {p: [short(k) for k in discovered.kernels if k.pass_name == p] for p in PASSES}
    assert by_pass["forward"][:4] == ["linear", "layer_norm", "gelu", "linear"]
    assert {"native_layer_norm_backward", "gelu_backward", "mm"} <= set(by_pass["backward"])
    # AdamW updates each of the 6 parameters with an addcdiv_
    assert by_pass["optimizer"].count("addcdiv") == 6


def test_kernels_carry_their_op_and_module(discovered):
    meta = dict(discovered.meta)
    ops, modules = meta["kernel_ops"].split("|"), meta["kernel_modules"].split("|")
    assert len(ops) == len(modules) == len(discovered)
    first_linear = discovered.kernels[0]
    assert (ops[0], modules[0]) == ("aten::linear", "0")
    assert first_linear.feature_dict()["op.aten::linear"] == 1.0
    assert first_linear.feature_dict()["module.Linear"] == 1.0
    # backward kernels find their module through the autograd node's sequence number
    ln_backward = next(
        i for i, k in enumerate(discovered.kernels) if short(k) == "native_layer_norm_backward"
    )
    assert (ops[ln_backward], modules[ln_backward]) == ("NativeLayerNormBackward0", "1")
    assert discovered.kernels[ln_backward].feature_dict()["module.LayerNorm"] == 1.0
    assert all(m == "" for m, k in zip(modules, discovered.kernels) if k.pass_name == "optimizer")


def test_sites_split_the_step_in_order(discovered):
    sites, kernel_sites = workload_sites(discovered)
    assert sites == ("step", "forward", "module:3", "backward", "optimizer")
    assert list(kernel_sites) == sorted(kernel_sites)
    by_site = {
        s: [short(k) for k, i in zip(discovered.kernels, kernel_sites) if sites[i] == s] for s in sites
    }
    assert by_site["step"] == []
    assert by_site["forward"] == ["linear", "layer_norm", "gelu"]
    assert by_site["module:3"][0] == "linear"  # the last Linear, then the loss and its backward
    assert by_site["optimizer"] == [short(k) for k in discovered.kernels if k.pass_name == "optimizer"]


def test_a_step_that_changes_is_refused():
    model, optimizer, step = tiny_mlp()
    calls = [0]

    def changing_step() -> None:
        calls[0] += 1
        step()
        if calls[0] % 2:
            torch.zeros(3).add_(1)

    with pytest.raises(KdvfsError, match="profiled step 2 differs from step 1"):
        discover_workload(changing_step, steps=2, warmup=0, model=model, optimizer=optimizer)


def test_bad_arguments_are_clear_errors():
    model, optimizer, step = tiny_mlp()
    with pytest.raises(KdvfsError, match="no submodule 'nope'"):
        StepSites(model, optimizer, ("nope",))
    with pytest.raises(KdvfsError, match="steps >= 1"):
        discover_workload(step, steps=0)
    with pytest.raises(KdvfsError, match="has no step sites"):
        workload_sites(Workload("recorded", (Kernel("a"),)))
