"""Named constants of the simulated GPUs, one preset per card, each with its source.

- `Preset`: everything a simulated card needs (clocks, rates, power parts, thermal, control,
  memory and link); `KindModel` and `LADDER_KINDS`: per-kind rates, floors and streaming
  activity, fitted to the H200 size ladder (experiments/fit_kinds.py);
- the presets `H200`, `RTX3080TI`, `A100`, `H100` (`PRESETS`), each with its sources;
- `get_preset`: a preset by name, NAME-fastswitch for a fast clock switch.
The model they feed is in simulator.py. Rates are whole-GPU figures at the stated clock;
power figures are the model's parts (static, dynamic core, memory) and were set so that the
whole card matches the cited totals, not fitted kernel by kernel; the per-kind constants are
fitted by kind, never by kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property


@dataclass(frozen=True)
class KindModel:
    """How one kind of kernel (types.KERNEL_KINDS) runs against the card's peak rates.

    Args:
        rate_eff: share of the card's peak FLOP rate (tensor or CUDA-core) the kind reaches
            at large sizes.
        bw_eff: share of the card's streaming DRAM bandwidth the kind reaches at large sizes.
        floor_s: time floor of a launch too small to fill the SMs, at the highest core clock,
            in seconds; it scales with 1 / core clock (the SMs' work, not the launch).
        act_stream: SM activity while the kind streams memory or waits out a wave's latency
            (None: the card's act_mem).
        block_bytes: bytes of input and output one thread block covers, for a kind that runs
            in waves of blocks (0: not modelled in waves).
        wave_s: fixed latency of one whole wave of blocks (loading its tiles, writing its
            results), at the highest core clock, in seconds; it scales with 1 / core clock.
        step_busy: share of the chip (dimensionless, in (0, 1]) a kernel of the kind keeps
            busy inside a recorded training step, against the ladder's kernels of its kind: a
            trace kernel's work runs at this share of the kind's rate over its recorded
            duration, and draws the activity of that share (runtime/trace.py busy_share);
            kernels whose work is counted (the ladder, the analytic workloads) run at 1.
    """

    rate_eff: float = 1.0
    bw_eff: float = 1.0
    floor_s: float = 0.0
    act_stream: float | None = None
    block_bytes: float = 0.0
    wave_s: float = 0.0
    step_busy: float = 1.0


GENERIC_KIND = KindModel()
"""The model of a kernel of unknown kind: peak rates, no floor beyond the launch."""


@dataclass(frozen=True)
class Preset:
    """Everything the simulated card needs. Units in every name."""

    gpu_name: str
    core_levels_mhz: tuple[int, ...]  # supported graphics clocks
    mem_levels_mhz: tuple[int, ...]  # supported memory clocks
    search_core_mhz: tuple[int, ...] | None  # default search grid (None: the full grid)
    search_mem_mhz: tuple[int, ...] | None
    # throughput
    tensor_flop_per_cycle: float  # dense bf16 tensor-core FLOP per core cycle, whole GPU
    simt_flop_per_cycle: float  # FP32 CUDA-core FLOP per core cycle, whole GPU
    mem_bw_bytes_per_s: float  # DRAM bandwidth reached by a streaming kernel at max mem clock
    core_bytes_per_cycle: float  # L2/load-store ceiling on bandwidth, per core cycle
    overlap: float  # share of the shorter of compute/memory time hidden under the longer
    launch_latency_s: float  # per-launch time that scales with neither clock
    floor_blend: float  # p of the p-norm that blends a launch's work with its kind's floor (inf: max)
    l2_stream_rel: float  # L2-resident stream rate over the L2 ceiling (core_bytes_per_cycle x clock)
    # voltage curve: flat at v_min_rel below the knee, linear to 1.0 at the highest clock
    v_min_rel: float
    v_knee_mhz: float
    # power
    static_w: float  # leakage at v=1, ref temperature
    leak_per_c: float  # relative growth of leakage per degree C
    leak_ref_c: float
    core_dyn_w: float  # dynamic core power at max clock, v=1, activity 1
    act_idle: float  # activity of a clocked but idle core (clock tree)
    act_tensor: float  # activity of tensor-core work
    act_simt: float  # activity of CUDA-core work
    act_mem: float  # SM activity while streaming memory (load/store, L2)
    mem_w: float  # memory power at max memory clock, full bandwidth
    mem_base_rel: float  # share of mem_w drawn at zero traffic (refresh, PHY)
    power_cap_w: float
    auto_hunt_rel: float  # +/- clock swing of the card's controller under the cap
    power_window_s: float  # the cap holds the mean power over windows this long, s (0: per launch)
    # thermal
    ambient_c: float
    r_th_c_per_w: float
    tau_s: float
    t_limit_c: float  # thermal slowdown above this
    # measurement and control
    energy_update_period_s: float
    switch_latency_s: float
    time_noise: float
    energy_noise: float
    # small kernels and per-kind rates (kinds of types.KERNEL_KINDS; others: GENERIC_KIND)
    kinds: tuple[tuple[str, KindModel], ...] = ()
    # what whole-step workloads size themselves by
    memory_bytes: float = 0.0  # device memory
    # on-chip memory
    sm_count: int = 1  # streaming multiprocessors: one wave of blocks is one block per SM
    l2_bytes: float = 0.0  # L2 capacity: a working set this small is served from L2
    link_bytes_per_s: float = 0.0  # all-reduce bus bandwidth between GPUs of one host (NCCL busbw)
    # a kernel after an idle gap: the share of its power above idle it does not draw after a long
    # gap, and the gap over which that sets in (simulator.after_gap_factor; 0: not modelled)
    after_gap_drop_share: float = 0.0
    after_gap_tau_s: float = 0.0

    def kind_model(self, kind: str) -> KindModel:
        """The model of a kernel kind on this card (GENERIC_KIND for an unknown one)."""
        return self._kind_models.get(kind, GENERIC_KIND)

    @cached_property
    def _kind_models(self) -> dict[str, KindModel]:
        return dict(self.kinds)

    @cached_property
    def max_core_mhz(self) -> int:
        return max(self.core_levels_mhz)

    @cached_property
    def max_mem_mhz(self) -> int:
        return max(self.mem_levels_mhz)


FLOOR_BLEND = 1.5
"""p of the p-norm (t_work^p + floor^p)^(1/p) that blends a launch's work with its kind's floor
(count): just above the floor a kernel does not fill the SMs at once, so neither a hard max
(inf) nor a sum (1) follows the ladder; fitted by experiments/fit_kinds.py."""


L2_STREAM_REL = 0.6
"""Share of the L2 ceiling (core_bytes_per_cycle x core clock) at which a kind streams a
working set that L2 holds, against its bw_eff of DRAM otherwise; fitted by
experiments/fit_kinds.py (on the H200 ladder a resident stream is no faster than DRAM at
stock, but it follows the core clock, not the memory clock)."""


POWER_WINDOW_S = 0.010
"""Window over which a data-centre card's power controller holds the mean power to the cap, s.
Not published; assumed: milliseconds, shorter than the probe's 100-ms sensor period (the capped
GEMM's clock swung within it) and longer than a training step's short kernels (the H200 ran a
7-ms block step at 689 W mean while its small kernels alone draw far less; capped launch by
launch the simulated step drew 646 W, held over 10-ms windows 700 W)."""


AFTER_GAP_DROP_SHARE = 0.203
"""Share of its power above idle a kernel does not draw after a long idle gap, against back to
back (dimensionless; simulator.after_gap_factor). Fitted with AFTER_GAP_TAU_S by `python -m
kdvfs.experiments.fit_gap_power` to an H100's bf16 GEMMs launched one at a time after idle gaps
of 5 us to 5 ms (data/h100/gap_power; chi2 13.9 for 9 degrees of freedom): the 1024^3 GEMM's
energy above idle a launch falls from 3.20 mJ after 5-us gaps to 2.93, 2.82 and 2.65 mJ after
17, 36 and 67 us, and the 2048^3 and 4096^3 GEMMs draw after their gaps 18% and 15% less than
the simulated card gives them back to back. Assumed the same on the H200 (the same die; its gaps
are not recorded); the 3080 Ti and A100 presets leave it out (unmeasured)."""
AFTER_GAP_TAU_S = 10.2e-6
"""Idle gap over which a kernel's drop after a gap sets in (1 - exp(-gap / tau)), s: fitted with
AFTER_GAP_DROP_SHARE. The launch gap back to back (launch_latency_s) is not counted as idle (the
ladder's kernels were fitted with it); a launch-bound step's kernels wait 10-30 us for their host."""


def _steps(lo: int, hi: int, step: int) -> tuple[int, ...]:
    return tuple(range(lo, hi + 1, step))


ATTENTION_BLOCK_BYTES = 4 * 128 * 128 * 2
"""Bytes of input and output one flash-attention thread block covers, B: 128-row tiles of q,
k, v and the output at head dim 128 in bf16 (FlashAttention-2's block on sm80/sm90)."""

STEP_BUSY_COMPUTE = 0.907
"""In-step busy share of a GEMM or attention kernel (KindModel.step_busy, dimensionless):
fitted, with STEP_BUSY_STREAM and STEP_BUSY_RAMP_S, to the time and energy of the whole steps
STEP_BUSY_FITTED_ON recorded at stock on an H200 by `python -m kdvfs.experiments.fit_step_power`
(least squares on log errors; with shares of 1 the simulated card drew its cap on every step)."""
STEP_BUSY_STREAM = 0.640
"""In-step busy share of every other kind (streaming: elementwise, norm, reduce, optimizer,
memory ops, other, communication; dimensionless): fitted with STEP_BUSY_COMPUTE."""
STEP_BUSY_RAMP_S = 8.57e-6
"""The time a recorded kernel takes to come up to its in-step busy share, s: a kernel of
duration d keeps d / (d + ramp) of it (runtime/trace.py `ramped`); fitted with the shares."""
STEP_BUSY_FITTED_ON = (
    "gpt2_small_sdpa_bf16",
    "mlp_fp32_sgd",
    "transformer_bf16_b64_powercap",
    "gpt3xl_block",
    "resnet18_bf16_b32_sgd",
)
"""The recorded steps the in-step busy shares were fitted to (data/h200/steps, and the probe's
GPT-3-XL block, data/h200-probe); every other recorded step is held out."""

# Per-kind rates, small-launch floors and streaming activity, fitted to the H200 size ladder
# (data/h200/kernels_ladder.csv, `kdvfs probe --ladder`) by
# `python -m kdvfs.experiments.fit_kinds`: one set per kind, never per kernel; the in-step busy
# shares (step_busy) to whole steps (data/h200/steps) by `python -m
# kdvfs.experiments.fit_step_power`, one per group of kinds. The other presets carry the same
# efficiencies and floors (they describe the kernels' implementations more than the card; no
# ladder of those cards exists here).
LADDER_KINDS = (
    (
        "attention",
        KindModel(
            rate_eff=0.934,
            floor_s=3.22e-06,
            act_stream=0.164,
            block_bytes=ATTENTION_BLOCK_BYTES,
            wave_s=4.58e-06,
            step_busy=STEP_BUSY_COMPUTE,
        ),
    ),
    ("communication", KindModel(step_busy=STEP_BUSY_STREAM)),
    ("elementwise", KindModel(bw_eff=0.718, floor_s=1.9e-06, act_stream=0.335, step_busy=STEP_BUSY_STREAM)),
    ("gemm", KindModel(rate_eff=1.034, floor_s=3.02e-06, step_busy=STEP_BUSY_COMPUTE)),
    ("memory_op", KindModel(bw_eff=0.802, act_stream=0.149, step_busy=STEP_BUSY_STREAM)),
    ("norm", KindModel(bw_eff=0.575, floor_s=2.23e-06, act_stream=0.345, step_busy=STEP_BUSY_STREAM)),
    ("optimizer", KindModel(bw_eff=0.851, floor_s=2.59e-05, act_stream=0.157, step_busy=STEP_BUSY_STREAM)),
    ("other", KindModel(step_busy=STEP_BUSY_STREAM)),
    ("reduce", KindModel(bw_eff=0.983, floor_s=5.42e-06, act_stream=0.221, step_busy=STEP_BUSY_STREAM)),
)

# NVIDIA H200 SXM. mem_w, mem_base_rel: DRAM power at full streaming fitted to the ladder by
# experiments/fit_kinds.py (350 W: a byte from DRAM costs ~75 pJ more than one L2 holds; the
# ladder's LayerNorm and softmax over 4k rows drew ~65 pJ/B less than at 256k rows), the 35 W
# at zero traffic kept. Clocks, cap, counter period: data/h200-probe (nvml.json,
# README.md). Rates: H200 datasheet (989 TFLOP/s dense bf16 at 1980 MHz boost -> 500k
# FLOP/cycle; the probe's 8192^3 GEMM reached 656 TFLOP/s at ~1470 MHz -> 446k, i.e. 89%);
# HBM3e 4.8 TB/s, the probe's copy reached 4.2 TB/s. Idle ~80 W cold at 345 MHz and ~127 W
# hot at 1980 MHz; GEMM capped at ~700 W; copy ~636 W at 1980 MHz (kernels_stock.csv).
H200 = Preset(
    gpu_name="NVIDIA H200",
    core_levels_mhz=_steps(345, 1980, 15),
    mem_levels_mhz=(2201, 3201),
    search_core_mhz=None,
    search_mem_mhz=None,
    tensor_flop_per_cycle=446_000.0,
    simt_flop_per_cycle=33_800.0,  # 67 TFLOP/s FP32 at 1980 MHz (datasheet)
    mem_bw_bytes_per_s=4.2e12,
    core_bytes_per_cycle=4.0e12 / 1.98e9 * 1.6,  # L2 keeps up with DRAM down to ~60% core clock
    overlap=0.9,  # a streaming kernel or a GEMM prefetches under its math
    launch_latency_s=1.0e-6,  # ladder: copy_256KiB and gelu_256KiB ran 1.2 and 1.5 us a call back to back
    floor_blend=FLOOR_BLEND,
    l2_stream_rel=L2_STREAM_REL,
    v_min_rel=0.70,
    v_knee_mhz=1000.0,
    static_w=50.0,
    leak_per_c=0.008,
    leak_ref_c=25.0,
    core_dyn_w=1100.0,
    act_idle=0.036,
    act_tensor=1.0,
    act_simt=0.55,
    act_mem=0.40,
    mem_w=350.0,
    mem_base_rel=0.1,
    power_cap_w=700.0,
    auto_hunt_rel=0.15,  # probe: GEMM swung 1095-1710 MHz around a 1470 median
    power_window_s=POWER_WINDOW_S,
    ambient_c=30.0,
    r_th_c_per_w=0.043,  # ~60 C at 700 W from a 30 C inlet (probe temp_end 52-62 C)
    tau_s=20.0,
    t_limit_c=87.0,
    energy_update_period_s=0.1,  # probe: energy counter median gap 100.5 ms
    switch_latency_s=0.010,
    time_noise=0.005,
    energy_noise=0.02,
    kinds=LADDER_KINDS,
    memory_bytes=143771 * 2**20,  # nvidia-smi on the H200: 143771 MiB
    sm_count=132,  # H200 SXM (GH100 as in the H100 SXM5): 132 SMs
    l2_bytes=50 * 2**20,  # 50 MiB L2 (H100 SXM5 whitepaper; cudaDeviceProp.l2CacheSize 52428800)
    link_bytes_per_s=400e9,  # NVLink 4 through NVSwitch: NCCL all-reduce busbw ~400 GB/s (8 GPUs)
    after_gap_drop_share=AFTER_GAP_DROP_SHARE,
    after_gap_tau_s=AFTER_GAP_TAU_S,
)

# NVIDIA GeForce RTX 3080 Ti (the founding paper's card). Datasheet: 80 SMs, 34.1 TFLOP/s
# FP32 and 68.2 TFLOP/s dense bf16 tensor (fp32 accumulate) at 1665 MHz boost; 912 GB/s
# GDDR6X at 19 Gbps (NVML memory clock 9501 MHz); 350 W board power. Graphics clocks
# 210-2100 MHz; memory 405/810/5001/9251/9501 MHz (simulator.md). The paper's search grid:
# core 210-2100 step 210 x those five memory clocks. Voltage: GA102 runs ~0.7 V up to
# ~900 MHz and ~1.08 V at 2100 MHz. GDDR6X is power hungry (~25-30% of board power at load).
RTX3080TI = Preset(
    gpu_name="NVIDIA GeForce RTX 3080 Ti",
    core_levels_mhz=_steps(210, 2100, 15),
    mem_levels_mhz=(405, 810, 5001, 9251, 9501),
    search_core_mhz=_steps(210, 2100, 210),
    search_mem_mhz=(405, 810, 5001, 9251, 9501),
    tensor_flop_per_cycle=68.2e12 / 1.665e9 * 0.85,  # 85% of peak reached by large GEMMs
    simt_flop_per_cycle=34.1e12 / 1.665e9,
    mem_bw_bytes_per_s=912e9 * 0.88,
    core_bytes_per_cycle=912e9 / 2.1e9 * 1.6,
    overlap=0.9,  # a streaming kernel or a GEMM prefetches under its math
    launch_latency_s=3.0e-6,
    floor_blend=FLOOR_BLEND,
    l2_stream_rel=L2_STREAM_REL,
    v_min_rel=0.65,
    v_knee_mhz=900.0,
    static_w=40.0,
    leak_per_c=0.008,
    leak_ref_c=25.0,
    core_dyn_w=420.0,
    act_idle=0.05,
    act_tensor=1.0,
    act_simt=0.55,
    act_mem=0.40,
    mem_w=115.0,  # GDDR6X at 19 Gbps: DRAM + controller/PHY ~100-120 W
    mem_base_rel=0.45,  # the PHY draws much of it at any traffic
    power_cap_w=350.0,
    auto_hunt_rel=0.15,  # boost hunts under the cap (H200 probe: +/-25%)
    # capped launch by launch: with a 10-ms window the GPT-3-XL layer's sweep saves 4.6% at
    # -2.6% where the founding paper measured 14.6% at 0.6% on this card; per launch: 11.8% at
    # 0.4% (docs/design-runtime.md, the power window); its controller is unmeasured
    power_window_s=0.0,
    ambient_c=30.0,
    r_th_c_per_w=0.13,  # ~75 C at 350 W on the stock cooler
    tau_s=30.0,
    t_limit_c=83.0,
    energy_update_period_s=0.1,  # assumed as measured on the H200 probe
    switch_latency_s=0.030,  # tens of ms for a locked-clock change on current cards
    time_noise=0.005,
    energy_noise=0.02,
    kinds=LADDER_KINDS,
    memory_bytes=12 * 2**30,  # 12 GiB GDDR6X
    sm_count=80,  # GA102 as in the 3080 Ti: 80 SMs (datasheet)
    l2_bytes=6 * 2**20,  # 6 MiB L2 (GA102 whitepaper)
    link_bytes_per_s=22e9,  # no NVLink: PCIe 4.0 x16, ~22 GB/s of NCCL busbw through the host
)

# NVIDIA A100 SXM 40GB. Datasheet: 312 TFLOP/s dense bf16 and 19.5 FP32 at 1410 MHz;
# 1555 GB/s HBM2 at 1215 MHz (its only memory clock); 400 W.
A100 = Preset(
    gpu_name="NVIDIA A100-SXM4-40GB",
    core_levels_mhz=_steps(210, 1410, 15),
    mem_levels_mhz=(1215,),
    search_core_mhz=None,
    search_mem_mhz=None,
    tensor_flop_per_cycle=312e12 / 1.41e9 * 0.85,
    simt_flop_per_cycle=19.5e12 / 1.41e9,
    mem_bw_bytes_per_s=1555e9 * 0.88,
    core_bytes_per_cycle=1555e9 / 1.41e9 * 1.6,
    overlap=0.9,  # a streaming kernel or a GEMM prefetches under its math
    launch_latency_s=3.0e-6,
    floor_blend=FLOOR_BLEND,
    l2_stream_rel=L2_STREAM_REL,
    v_min_rel=0.70,
    v_knee_mhz=800.0,
    static_w=45.0,
    leak_per_c=0.008,
    leak_ref_c=25.0,
    core_dyn_w=520.0,
    act_idle=0.04,
    act_tensor=1.0,
    act_simt=0.55,
    act_mem=0.40,
    mem_w=70.0,
    mem_base_rel=0.35,
    power_cap_w=400.0,
    auto_hunt_rel=0.12,
    power_window_s=0.0,  # unmeasured: per launch (only Hopper has evidence of a window)
    ambient_c=30.0,
    r_th_c_per_w=0.09,
    tau_s=20.0,
    t_limit_c=87.0,
    energy_update_period_s=0.1,
    switch_latency_s=0.015,
    time_noise=0.005,
    energy_noise=0.02,
    kinds=LADDER_KINDS,
    memory_bytes=40 * 2**30,  # 40 GiB HBM2
    sm_count=108,  # A100: 108 SMs (datasheet)
    l2_bytes=40 * 2**20,  # 40 MiB L2 (A100 whitepaper)
    link_bytes_per_s=230e9,  # NVLink 3 through NVSwitch: NCCL all-reduce busbw ~230 GB/s
)

# NVIDIA H100 SXM. Datasheet: 989 TFLOP/s dense bf16 at 1980 MHz, 3.35 TB/s HBM3 at
# 2619 MHz (its only memory clock), 700 W. Same Hopper power model as the H200.
H100 = replace(
    H200,
    gpu_name="NVIDIA H100 80GB HBM3",
    mem_levels_mhz=(2619,),
    mem_bw_bytes_per_s=3.35e12 * 0.88,
    core_bytes_per_cycle=3.35e12 / 1.98e9 * 1.6,
    mem_w=H200.mem_w * 0.85,  # HBM3 at 3.35 TB/s against HBM3e at 4.8: fewer stacks' traffic
    memory_bytes=80 * 2**30,  # 80 GiB HBM3
)

PRESETS: dict[str, Preset] = {"h200": H200, "rtx3080ti": RTX3080TI, "a100": A100, "h100": H100}

FAST_SWITCH_SUFFIX = "-fastswitch"
"""Appended to a preset's name: the same card with a fast clock switch."""
FAST_SWITCH_LATENCY_S = 50e-6
"""What newer parts promise for a clock change (on-die regulators, per-kernel DVFS): tens of µs."""


def get_preset(name: str) -> Preset:
    """A preset by name; NAME-fastswitch is the same card with a fast clock switch."""
    from kdvfs.runtime.types import KdvfsError

    base = name.removesuffix(FAST_SWITCH_SUFFIX)
    if base not in PRESETS:
        raise KdvfsError(
            f"unknown simulated GPU preset {name!r} (known: {', '.join(sorted(PRESETS))}, each also as NAME{FAST_SWITCH_SUFFIX})"
        )
    preset = PRESETS[base]
    if name.endswith(FAST_SWITCH_SUFFIX):
        preset = replace(preset, switch_latency_s=FAST_SWITCH_LATENCY_S)
    return preset
