"""The whole-step workloads: structure, parameter count, the all-reduce, the batch that fits."""

from __future__ import annotations

import collections

import pytest

from kdvfs.runtime.registry import open_device, open_workload
from kdvfs.runtime.types import KdvfsError
from kdvfs.runtime.workloads import GPT3_XL, gpt3_xl, gpt3_xl_layer, gpt3_xl_params


def test_the_whole_step_has_every_layer_forward_and_backward_in_order():
    step = gpt3_xl(batch=1)
    layer = gpt3_xl_layer(batch=1)
    per_pass = collections.Counter(k.pass_name for k in step.kernels)
    layer_fwd = sum(k.pass_name == "forward" for k in layer.kernels)
    layer_bwd = sum(k.pass_name == "backward" for k in layer.kernels)
    assert per_pass == {"forward": 1 + 24 * layer_fwd + 3, "backward": 4 + 24 * layer_bwd + 1, "optimizer": 8}
    names = [k.name for k in step.kernels]
    assert names[0] == "embed_fwd" and names[1] == "l00.ln1_fwd" and names[-1] == "zero_grad"
    assert names.index("l23.residual_fwd") < names.index("lm_head_fwd") < names.index("l23.fcproj_dinp_bwd")
    assert names.index("l23.fcproj_dinp_bwd") < names.index(
        "l00.fcproj_dinp_bwd"
    )  # backward runs last to first


def test_the_optimizer_moves_the_bytes_of_every_parameter():
    step = gpt3_xl(batch=1)
    params = gpt3_xl_params(GPT3_XL["layers"], GPT3_XL["d_model"], GPT3_XL["vocab"], GPT3_XL["seq"])
    assert 1.3e9 < params < 1.33e9  # GPT-3 XL
    adamw_bytes = sum(k.bytes_moved for k in step.kernels if k.kind == "optimizer")
    assert adamw_bytes == pytest.approx(
        params * 4 * 7.5
    )  # fp32: read p, g, m, v; write p, m, v, half a bf16 copy
    grad_norm = next(k for k in step.kernels if k.name == "grad_norm")
    assert grad_norm.bytes_moved == pytest.approx(params * 4, rel=1e-6)


def test_data_parallel_ranks_wait_on_a_ring_all_reduce_of_the_gradients():
    params = gpt3_xl_params(GPT3_XL["layers"], GPT3_XL["d_model"], GPT3_XL["vocab"], GPT3_XL["seq"])
    step = gpt3_xl(batch=1, ranks=8, link_bytes_per_s=100e9)
    allreduce = step.kernel("allreduce_grads")
    assert allreduce.pass_name == "communication" and allreduce.kind == "communication"
    assert allreduce.wait_s == pytest.approx(4 * params * 2 * 7 / 8 / 100e9)
    assert step.signature != gpt3_xl(batch=1, ranks=8, link_bytes_per_s=200e9).signature
    h200 = open_device("sim:h200", noise=0.0)
    op = h200.point(allreduce, None)
    assert op.time_s >= allreduce.wait_s and op.power_w < 0.5 * h200.power_cap_w  # a waiting GPU idles
    with pytest.raises(KdvfsError, match="needs a link bandwidth"):
        gpt3_xl(batch=1, ranks=2)


def test_the_batch_is_what_fits_the_cards_memory():
    h200_step = open_workload("gpt3-xl", open_device("sim:h200"))
    rtx_step = open_workload("gpt3-xl-dp8", open_device("sim:rtx3080ti"))
    assert dict(h200_step.meta)["batch"] == "8"
    assert dict(rtx_step.meta)["batch"] == "1"  # 21 GB of training state: more than its 12 GiB
    assert float(dict(rtx_step.meta)["link_bytes_per_s"]) == 22e9
    assert dict(open_workload("gpt3-xl-dp4:batch=2,link_gbs=50", None).meta)["link_bytes_per_s"] == "5e+10"
