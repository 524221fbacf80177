"""Record a whole training step of a small GPT with torch.profiler, as a `trace:` workload.

    python -m kdvfs.experiments.record_step_trace --out DIR [--layers 12 --d-model 768 ...]

Read-only on the GPU: it trains at stock clocks and changes no setting. The model is a
GPT-2-small-sized decoder (token and position embeddings, pre-LayerNorm blocks with causal
scaled-dot-product attention and a GELU MLP, tied LM head, cross-entropy loss) trained with
bf16 autocast and fused AdamW over fp32 weights, on random tokens. After `--warmup` steps,
`--steps` steps are profiled; every GPU-side event (kernels, memsets, memcpys and the
profiler's GPU annotations, which trace.py drops but uses to find the optimizer) goes to
DIR/small_gpt_step_kernels.csv in the columns trace.py reads (seq, name, start_us,
duration_us). DIR/small_gpt_step.json says what was trained and the step's time.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

TRACE_FILE = "small_gpt_step_kernels.csv"


class Block(nn.Module):
    """A pre-LayerNorm decoder block: causal self-attention and a 4x GELU MLP."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv, self.proj = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        self.fc, self.fc_proj = nn.Linear(d_model, 4 * d_model), nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x))))


class SmallGPT(nn.Module):
    """Token + position embeddings, `layers` blocks, a final LayerNorm and a tied LM head."""

    def __init__(self, vocab: int, seq: int, d_model: int, heads: int, layers: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d_model), nn.Embedding(seq, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.tok.weight.T


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="directory for the trace CSV and its JSON")
    p.add_argument("--layers", type=int, default=12, help="decoder blocks")
    p.add_argument("--d-model", type=int, default=768, help="model width")
    p.add_argument("--heads", type=int, default=12, help="attention heads")
    p.add_argument("--seq", type=int, default=1024, help="tokens per sequence")
    p.add_argument("--batch", type=int, default=8, help="sequences per step")
    p.add_argument("--vocab", type=int, default=50304, help="vocabulary size (GPT-2's, padded to 64)")
    p.add_argument("--warmup", type=int, default=20, help="steps before profiling")
    p.add_argument("--steps", type=int, default=3, help="steps profiled")
    args = p.parse_args(argv)

    torch.manual_seed(0)
    device = "cuda"
    model = SmallGPT(args.vocab, args.seq, args.d_model, args.heads, args.layers).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device=device)

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.float().view(-1, args.vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    t0_s = time.perf_counter()
    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    step_s = (time.perf_counter() - t0_s) / args.warmup

    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
    events = sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
        key=lambda e: e.time_range.start,
    )
    t0_us = events[0].time_range.start
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / TRACE_FILE).open("w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(("seq", "name", "start_us", "duration_us"))
        for seq, e in enumerate(events):
            writer.writerow(
                (seq, e.name, round(e.time_range.start - t0_us, 3), round(e.time_range.elapsed_us(), 3))
            )
    params = sum(p.numel() for p in model.parameters())
    summary = {
        "model": "small GPT (GPT-2-small sized), bf16 autocast, fused AdamW, random tokens",
        "layers": args.layers,
        "d_model": args.d_model,
        "heads": args.heads,
        "seq": args.seq,
        "batch": args.batch,
        "vocab": args.vocab,
        "parameters": params,
        "step_time_s": step_s,
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "events": len(events),
        "source": "measured on a real GPU (stock clocks, read-only)",
    }
    (args.out / "small_gpt_step.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
