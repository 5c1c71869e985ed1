"""The CPU kernel choices inside the model, each against the form it replaced, side by side in one run.

Three pairs (docs/results.md, "CPU kernel choices inside the model"):
- rope:   RoPE's rotation as lm writes it (lm/model/position.py: one roll and one fused multiply-add per
          tensor) against Hugging Face's rotate_half form (negation, concatenation, two products and a sum),
          forward + backward of q and k at the CPU speedrun's shape;
- glu:    the GLU's gate and up projections as one (2h, d) matmul (lm/model/ffn.py) against two (h, d) ones,
          forward + backward of the feed-forward block;
- linear: a whole training step (forward, backward, AdamW) with model.linear=onednn against model.linear=torch.
Each pair alternates within every round (a block of calls of one, then of the other), so a change in the
machine's load hits both sides alike; reported are the medians over rounds and their ratio (the old form's
time over lm's: above 1 means lm's choice is faster).

    OMP_NUM_THREADS=2 python benchmarks/cpu_kernels.py --rounds 15
    python benchmarks/cpu_kernels.py --only rope
"""

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from lm.core import objectives
from lm.model import build_model
from lm.model.config import model_preset
from lm.model.linear import onednn_available
from lm.model.position import RoPE


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=20, help="calls per side per round (rope, glu)")
    p.add_argument("--steps", type=int, default=3, help="training steps per side per round (linear)")
    p.add_argument("--only", default="rope,glu,linear", help="comma-separated pairs")
    return p.parse_args()


def rotate_half_rope(cos: torch.Tensor, sin: torch.Tensor) -> Callable:
    """Hugging Face Llama's apply_rotary_pos_emb: x * cos + rotate_half(x) * sin."""

    def rotate_half(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    def rotate(q, k):
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin

    return rotate


def rope_pair(batch=12, heads=4, seq=64, head_dim=32) -> dict[str, Callable[[], None]]:
    """The speedrun's attention shape: q and k (B, H, T, Dh), forward + backward through the rotation."""
    rope = RoPE(heads * head_dim, heads, head_dim, seq, causal=True)
    positions = torch.arange(seq)
    ours = rope.rotary(positions)
    freqs = positions.float()[:, None] * rope.inv_freq[None, :]  # (T, Dh/2)
    theirs = rotate_half_rope(freqs.cos().repeat(1, 2), freqs.sin().repeat(1, 2))  # (T, Dh) each
    q, k = (torch.randn(batch, heads, seq, head_dim, requires_grad=True) for _ in range(2))
    g = torch.randn(batch, heads, seq, head_dim)
    torch.testing.assert_close(torch.stack(ours(q, k)), torch.stack(theirs(q, k)))  # the same maths

    def call(rotate):
        def run():
            rq, rk = rotate(q, k)
            torch.autograd.backward((rq, rk), (g, g))

        return run

    return {"lm": call(ours), "old": call(theirs)}


class SplitGLU(nn.Module):
    """SwiGLU with W_gate and W_up as two matmuls: the form lm's one gate_up matmul replaced."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate, self.up = nn.Linear(dim, hidden), nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.down(nn.functional.silu(self.gate(x)) * self.up(x))


class FusedGLU(SplitGLU):
    """The same weights stacked in one (2h, d) matrix (lm/model/ffn.py), activation as the plain ops."""

    def __init__(self, split: SplitGLU):
        nn.Module.__init__(self)
        self.gate_up = nn.Linear(split.gate.in_features, 2 * split.gate.out_features)
        with torch.no_grad():
            self.gate_up.weight.copy_(torch.cat((split.gate.weight, split.up.weight)))
            self.gate_up.bias.copy_(torch.cat((split.gate.bias, split.up.bias)))
        self.down = split.down

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)  # (N, 2h) -> 2 x (N, h)
        return self.down(nn.functional.silu(gate) * up)


def glu_pair(tokens=2048, dim=384, hidden=1024) -> dict[str, Callable[[], None]]:
    """The feed-forward block of a 6 x 384 model at 2048 tokens per micro-batch, forward + backward."""
    torch.manual_seed(0)
    split = SplitGLU(dim, hidden)
    fused = FusedGLU(split)
    x = torch.randn(tokens, dim, requires_grad=True)
    torch.testing.assert_close(fused(x), split(x))

    def call(ffn):
        def run():
            ffn(x).sum().backward()

        return run

    return {"lm": call(fused), "old": call(split)}


def linear_pair(steps: int, dim=384, layers=6, batch=8, seq=256) -> dict[str, Callable[[], None]]:
    """Whole training steps of the tiny preset (heads of 64), 6 x 384, T=256, B=8: model.linear=onednn vs torch."""
    x = torch.randint(8, 256, (batch, seq), generator=torch.Generator().manual_seed(0))
    data = {"input_ids": x, "labels": torch.roll(x, -1, dims=1)}

    def call(kind):
        torch.manual_seed(0)
        cfg = model_preset(
            "tiny",
            [
                f"model.dim={dim}",
                f"model.n_layers={layers}",
                f"model.n_heads={max(1, dim // 64)}",
                f"model.max_seq_len={seq}",
            ]
            + [f"model.linear={kind}"],
        )
        model = build_model(cfg).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def run():
            for _ in range(steps):
                objectives.loss(model, data).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

        return run

    return {"lm": call("onednn"), "old": call("torch")}


def alternate(pair: dict[str, Callable[[], None]], rounds: int, calls: int) -> dict[str, float]:
    """Median seconds per call of each side over `rounds` rounds, the sides alternating within each round."""
    for run in pair.values():  # warm-up: allocator, first-call dispatch, oneDNN's primitive cache
        run()
    times = {side: [] for side in pair}
    for r in range(rounds):
        order = list(pair) if r % 2 == 0 else list(pair)[::-1]  # neither side always runs first
        for side in order:
            t0 = time.perf_counter()
            for _ in range(calls):
                pair[side]()
            times[side].append((time.perf_counter() - t0) / calls)
    return {side: statistics.median(t) for side, t in times.items()}


def main():
    args = parse_args()
    pairs = {
        "rope": (lambda: rope_pair(), args.calls, "RoPE rotation, roll + addcmul vs rotate_half (µs per q,k fwd+bwd)"),
        "glu": (lambda: glu_pair(), args.calls, "GLU gate+up, one matmul vs two (ms per fwd+bwd)"),
        "linear": (
            lambda: linear_pair(args.steps),
            1,
            f"model.linear=onednn vs torch (ms per step, {args.steps}/call)",
        ),
    }
    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - set(pairs))
    if unknown:
        raise SystemExit(f"--only: unknown pairs {unknown}; choose from {sorted(pairs)}")
    if "linear" in names and not onednn_available():
        raise SystemExit("--only linear: this torch build has no oneDNN linear (torch.ops.mkldnn._linear_pointwise)")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.rounds} rounds, alternated")
    print(f"{'pair':<8} {'lm':>10} {'old':>10} {'old/lm':>8}  what")
    for name in names:
        make, calls, what = pairs[name]
        pair = make()
        per_call = alternate(pair, args.rounds, calls)
        unit = 1e6 if name == "rope" else 1e3 / (args.steps if name == "linear" else 1)
        lm_t, old_t = per_call["lm"] * unit, per_call["old"] * unit
        print(f"{name:<8} {lm_t:>10.1f} {old_t:>10.1f} {old_t / lm_t:>8.3f}  {what}")


if __name__ == "__main__":
    main()
