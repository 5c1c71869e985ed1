"""The output layer + loss alone: logits and F.cross_entropy against our chunked version (lm/model/loss.py).

Forward and backward of softmax(h W^T) cross-entropy for N tokens of width D over vocabulary V, in
process CPU seconds (one thread by default, so CPU time is the work done even on a busy machine),
alternating the variants round by round; the three matmuls alone (logits, dh, dW) are the floor.

    python benchmarks/output_layer.py                      # N=2048 (8 x 256), D=384, V=50304
    python benchmarks/output_layer.py --chunks 128 256 1024 --threads 2
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from lm.model.loss import chunked_cross_entropy


def variants(h, w, y, chunks):
    def plain():
        F.cross_entropy(F.linear(h, w), y).backward()

    def matmuls_only():
        logits = h.detach() @ w.detach().t()  # (N, V)
        logits @ w.detach(), logits.t() @ h.detach()

    out = {"logits + F.cross_entropy": plain, "3 matmuls only": matmuls_only}
    for c in chunks:
        out[f"chunked, {c} tokens"] = lambda c=c: chunked_cross_entropy(h, w, None, y, c).backward()
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--chunks", type=int, nargs="+", default=[256, 512])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    h = torch.randn(args.tokens, args.dim, requires_grad=True)
    w = (torch.randn(args.vocab, args.dim) * 0.02).requires_grad_()
    y = torch.randint(0, args.vocab, (args.tokens,))
    fns = variants(h, w, y, args.chunks)
    for f in fns.values():  # warm-up
        f()
    cpu = {k: [] for k in fns}
    for r in range(args.rounds):
        for k, f in fns.items() if r % 2 == 0 else reversed(fns.items()):  # neither end always runs first
            h.grad = w.grad = None
            t = time.process_time()
            f()
            cpu[k].append(time.process_time() - t)
    print(f"N={args.tokens} D={args.dim} V={args.vocab}, {args.threads} thread(s), median of {args.rounds} rounds:")
    for k, v in cpu.items():
        print(f"  {k:28s} {statistics.median(v) * 1e3:8.0f} ms CPU")


if __name__ == "__main__":
    main()
