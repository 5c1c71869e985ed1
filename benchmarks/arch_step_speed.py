"""Training-step speed of the architecture options of issue #20 against the vanilla block, at equal width.

Each variant is the tiny preset at --dim/--layers/--heads with one option changed (MoE top-2, Switch,
product-key memory in the middle layer, a Funnel encoder; Synthesizers, lightweight/dynamic
convolutions in place of self-attention, the weighted and the Evolved Transformer blocks). Variants are timed as in
benchmarks/ablation_speed.py: same batch, optimizer and thread count, one block of steps per variant
per round, rounds interleaved so that load changes hit every variant alike. Reported: Params, Ops
(training FLOPs per token, lm.model.flops: only active experts, pooled lengths), the median tokens/s
and its ratio to the vanilla model of the same family (decoder, or encoder for the Funnel).
The step is lm's training objective: cross-entropy plus the model's auxiliary loss (MoE).

    OMP_NUM_THREADS=2 python benchmarks/arch_step_speed.py --dim 256 --layers 4 --rounds 7
    python benchmarks/arch_step_speed.py --only vanilla,moe     # a subset
"""

import argparse
import statistics
import time

import torch

import lm.zoo  # noqa: F401 - registers the zoo's options (model/block=pkm, ...) that the rows name
from lm.core import objectives
from lm.model import build_model
from lm.model.config import model_preset
from lm.model.flops import flops_per_token, num_params

# name -> (family's vanilla variant, overrides). Append new options here.
VARIANTS = {
    "vanilla": ("vanilla", []),
    "moe": ("vanilla", ["model/ffn=moe"]),
    "switch": ("vanilla", ["model/ffn=switch"]),
    "pkm": ("vanilla", ["model/block=pkm", "model.block.layers=[{mid}]"]),
    "vanilla_encoder": ("vanilla_encoder", ["model.arch=encoder"]),
    "funnel": (
        "vanilla_encoder",
        ["model.arch=encoder", "model/stack=funnel", "model.stack.blocks={groups}", "model.stack.decoder_layers=0"],
    ),
    "synth_dense": ("vanilla", ["model/attn=synthesizer_dense"]),
    "synth_dense_plus_alpha": ("vanilla", ["model/attn=synthesizer_dense", "model.attn.mix=plus_alpha"]),
    "synth_random": ("vanilla", ["model/attn=synthesizer_random"]),
    "synth_factorized": ("vanilla", ["model/attn=synthesizer_factorized"]),
    "lightweight_conv": ("vanilla", ["model/attn=lightweight_conv"]),
    "dynamic_conv": ("vanilla", ["model/attn=dynamic_conv"]),
    "weighted": ("vanilla", ["model/block=weighted"]),
    "evolved": ("vanilla", ["model/block=evolved"]),
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=4, help="blocks; the Funnel splits them into two groups")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=5, help="steps per variant per round")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return p.parse_args()


def config(name: str, args):
    half = args.layers // 2
    fill = {"mid": args.layers // 2, "groups": f"[{half},{args.layers - half}]"}
    overrides = [o.format(**fill) for o in VARIANTS[name][1]]
    return model_preset(
        "tiny",
        overrides
        + [
            f"model.dim={args.dim}",
            f"model.n_layers={args.layers}",
            f"model.n_heads={args.heads}",
            f"model.max_seq_len={args.seq}",
        ],
    )


def make(name: str, args):
    torch.manual_seed(0)
    model = build_model(config(name, args)).to(args.device).train()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def steps(model, opt, batch, n: int) -> float:
    if batch["input_ids"].is_cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        objectives.loss(model, batch).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if batch["input_ids"].is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def main():
    args = parse_args()
    names = [n for n in (args.only.split(",") if args.only else VARIANTS) if n]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"--only: unknown variants {unknown}; choose from {sorted(VARIANTS)}")
    g = torch.Generator().manual_seed(0)
    x = torch.randint(8, 256, (args.batch, args.seq), generator=g).to(args.device)
    batch = {"input_ids": x, "labels": torch.roll(x, -1, dims=1)}
    runs = {n: make(n, args) for n in names}
    for model, opt in runs.values():  # warm-up: allocator, first-call dispatch
        steps(model, opt, batch, 1)
    times = {n: [] for n in names}
    for r in range(args.rounds):
        for name, (model, opt) in runs.items() if r % 2 == 0 else reversed(runs.items()):  # the order alternates
            times[name].append(steps(model, opt, batch, args.steps))
    tokens = args.batch * args.seq * args.steps
    rate = {n: tokens / statistics.median(t) for n, t in times.items()}
    print(
        f"dim {args.dim}, {args.layers} layers, batch {args.batch} x {args.seq}, {args.rounds} rounds x "
        f"{args.steps} steps, {torch.get_num_threads()} threads, {args.device}"
    )
    print(f"{'variant':<24} {'Params':>12} {'Ops/token':>12} {'tokens/s':>10} {'vs vanilla':>10}")
    for name in names:
        cfg, base = config(name, args), VARIANTS[name][0]
        ratio = f"{rate[name] / rate[base]:.3f}" if base in rate else "-"
        print(
            f"{name:<24} {num_params(cfg):>12,} {flops_per_token(cfg, args.seq):>12,} {rate[name]:>10.0f} {ratio:>10}"
        )


if __name__ == "__main__":
    main()
