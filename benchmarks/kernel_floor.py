"""The kernel floor of a Hugging Face training step: its matmuls and attention alone, timed against the full step.

`benchmarks/hf_step.py` compares our step with Hugging Face's. Both run the same matmuls (same shapes, same
MKL/oneDNN kernels) and the same SDPA kernel, so no implementation of the same model can be faster
than those kernels alone. This replays exactly the matmuls (forward, input gradient, weight
gradient of every Linear/Conv1D, the LM head included) and the causal SDPA forward+backward of
every layer of the Hugging Face model that `benchmarks/hf_step.py` builds, on random tensors of the same shapes,
alternating with full Hugging Face training steps in one process, and prints

    floor fraction = kernel time / full step time       (median over alternating pairs)
    ceiling        = 1 / floor fraction                  (the best ratio any implementation could reach
                                                         by removing everything but those kernels)

    python benchmarks/kernel_floor.py --layout llama --vocab 65
    python benchmarks/kernel_floor.py --layout gpt2 --vocab 65 --steps 12
    python benchmarks/kernel_floor.py --layout llama --vocab 65 --dim 768 --heads 12   # hf_step.py's shape flags

The AdamW step, norms, activations, RoPE, residual adds, the loss and the embedding are what the
floor leaves out: the part an implementation can make cheaper.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/ is not a package
import hf_step as bench  # noqa: E402


def linear_shapes(model: nn.Module) -> list:
    """(in, out, has_bias, transposed) of every matmul layer; transposed = weight stored (in, out) (HF Conv1D)."""
    shapes = []
    for m in model.modules():
        if isinstance(m, nn.Linear):
            shapes.append((m.in_features, m.out_features, m.bias is not None, False))
        elif type(m).__name__ == "Conv1D":  # transformers.pytorch_utils.Conv1D: y = addmm(b, x, W), W (in, out)
            shapes.append((m.weight.shape[0], m.weight.shape[1], True, True))
    return shapes


def floor_step(shapes: list, n_tokens: int, attn: tuple, n_layers: int):
    """Build a function that runs one step's matmuls and attention kernels on fixed random tensors."""
    mats = []
    for d_in, d_out, has_bias, transposed in shapes:
        x, g = torch.randn(n_tokens, d_in), torch.randn(n_tokens, d_out)
        w = torch.randn(d_in, d_out) if transposed else torch.randn(d_out, d_in)
        mats.append((x, g, w, torch.randn(d_out) if has_bias else None, transposed))
    B, H, T, Dh = attn
    q, k, v = (torch.randn(B, H, T, Dh, requires_grad=True) for _ in range(3))
    g_attn = torch.randn(B, H, T, Dh)

    def run():
        for x, g, w, b, transposed in mats:
            if transposed:  # the kernels autograd runs for addmm(b, x, W)
                torch.addmm(b, x, w), g.mm(w.t()), x.t().mm(g)
            else:  # ... and for F.linear(x, W, b)
                F.linear(x, w, b), g.mm(w), g.t().mm(x)
            if b is not None:
                g.sum(0)
        for _ in range(n_layers):
            F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g_attn)
            q.grad = k.grad = v.grad = None

    return run


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layout", choices=sorted(bench.LAYOUTS), default="llama")
    p.add_argument("--vocab", type=int, default=65)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    args, shape = p.parse_known_args(argv)  # the rest are benchmarks/hf_step.py's shape flags (--layers, --dim, ...)
    bargs = bench.parse(
        [
            "--layout",
            args.layout,
            "--vocab",
            str(args.vocab),
            "--threads",
            str(args.threads),
            "--steps",
            str(args.steps),
        ]
        + shape
    )
    torch.set_num_threads(args.threads)
    hf = bench.build(bargs)["hf"]
    data = bench.batches(bargs)["hf"]
    opt = torch.optim.AdamW(hf.parameters(), lr=1e-4, weight_decay=0.1)
    kernels = floor_step(
        linear_shapes(hf),
        bargs.batch * bargs.seq,
        (bargs.batch, bargs.heads, bargs.seq, bargs.dim // bargs.heads),
        bargs.layers,
    )
    for i in range(bargs.warmup):
        bench.train_step(hf, opt, *data[i])
        kernels()
    step_s, floor_s = [], []
    for i in range(bargs.warmup, bargs.warmup + bargs.steps):
        pair = [("step", lambda i=i: bench.train_step(hf, opt, *data[i])), ("floor", kernels)]
        for side, run in pair if (i - bargs.warmup) % 2 == 0 else pair[::-1]:  # neither side always runs first
            t0 = time.perf_counter()
            run()
            (step_s if side == "step" else floor_s).append(time.perf_counter() - t0)
    fraction = statistics.median(f / s for f, s in zip(floor_s, step_s))
    print(
        f"{args.layout} layout, vocab {args.vocab}, {args.threads} thread(s), {args.steps} pairs: Hugging Face step "
        f"{statistics.median(step_s) * 1e3:.0f} ms, "
        f"its matmuls + attention alone {statistics.median(floor_s) * 1e3:.0f} ms; "
        f"floor fraction {fraction:.3f}, ceiling on any ratio against it {1 / fraction:.2f}x"
    )


if __name__ == "__main__":
    main()
