"""Training-step speed of the ffn x norm variants, timed in interleaved rounds in one process.

A sweep runs its cells one after another, so on a shared machine their steps/s columns measure the
load at the time each cell ran. This times the same variants the way benchmarks/hf_step.py does: the same batch,
optimizer, dtype and thread count, one block of steps per variant per round, rounds interleaved, so
load changes hit every variant alike. Reports the median tokens/s per variant and its ratio to the
first variant (GELU + LayerNorm). Then the norms alone (forward + backward on one activation):
lm's LayerNorm (torch's fused layer_norm), lm's RMSNorm, and torch's F.rms_norm for reference.

    OMP_NUM_THREADS=1 python benchmarks/ablation_speed.py --dim 128 --layers 2 --rounds 7
"""

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

from lm.model import build_model
from lm.model.config import model_preset

VARIANTS = [("gelu", "layernorm"), ("gelu", "rmsnorm"), ("swiglu", "layernorm"), ("swiglu", "rmsnorm")]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=5, help="steps per variant per round")
    p.add_argument("--rounds", type=int, default=7)
    return p.parse_args()


def make(ffn: str, norm: str, args):
    torch.manual_seed(0)
    cfg = model_preset(
        "tiny",
        [
            f"model/ffn={ffn}",
            f"model/norm={norm}",
            f"model.dim={args.dim}",
            f"model.n_layers={args.layers}",
            f"model.n_heads={args.heads}",
        ],
    )
    model = build_model(cfg)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def steps(model, opt, x, y, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        loss = model(input_ids=x, labels=y).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def norm_ops(args, calls: int = 200) -> dict:
    """Microseconds per forward + backward of each norm on a (batch, seq, dim) activation."""
    from lm.model.norms import LayerNorm, RMSNorm

    x = torch.randn(args.batch, args.seq, args.dim, requires_grad=True)
    rms = RMSNorm(args.dim)
    ops = {
        "LayerNorm (lm, F.layer_norm)": LayerNorm(args.dim),
        "RMSNorm (lm)": rms,
        "F.rms_norm (torch)": lambda h: F.rms_norm(h, (args.dim,), rms.weight, rms.eps),
    }
    assert torch.equal(ops["RMSNorm (lm)"](x), ops["F.rms_norm (torch)"](x))  # the same function
    times = {k: [] for k in ops}
    for r in range(args.rounds):
        for k, f in ops.items() if r % 2 == 0 else reversed(ops.items()):  # neither side always runs first
            t0 = time.perf_counter()
            for _ in range(calls):
                f(x).sum().backward()
            times[k].append((time.perf_counter() - t0) / calls * 1e6)
    return {k: statistics.median(v) for k, v in times.items()}


def main():
    args = parse_args()
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 65, (args.batch, args.seq), generator=g)
    y = torch.roll(x, -1, dims=1)
    runs = {v: make(*v, args) for v in VARIANTS}
    for model, opt in runs.values():  # warm-up: allocator, optimizer state
        steps(model, opt, x, y, 2)
    rates = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        for v, (model, opt) in runs.items() if r % 2 == 0 else reversed(runs.items()):  # the order alternates
            rates[v].append(args.steps * args.batch * args.seq / steps(model, opt, x, y, args.steps))
    base = statistics.median(rates[VARIANTS[0]])
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, OMP_NUM_THREADS="
        f"{os.environ.get('OMP_NUM_THREADS')}, dim {args.dim}, layers {args.layers}, batch {args.batch}x{args.seq}, "
        f"{args.rounds} rounds x {args.steps} steps, load average {os.getloadavg()[0]:.1f}"
    )
    print("| variant | params | tokens/s (median) | min–max over rounds | vs gelu+layernorm |")
    print("|---|---|---|---|---|")
    for v, r in rates.items():
        n = sum(p.numel() for p in runs[v][0].parameters())
        print(
            f"| ffn={v[0]} norm={v[1]} | {n / 1e3:.1f}k | {statistics.median(r):.0f} | {min(r):.0f}–{max(r):.0f} | "
            f"{statistics.median(r) / base:.3f} |"
        )
    us = norm_ops(args)
    print(f"\n| norm, forward + backward on ({args.batch}, {args.seq}, {args.dim}) | µs (median) | vs LayerNorm |")
    print("|---|---|---|")
    first = next(iter(us.values()))
    for k, t in us.items():
        print(f"| {k} | {t:.0f} | {t / first:.2f}x |")


if __name__ == "__main__":
    main()
