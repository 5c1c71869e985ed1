"""lm-bench: our training step against the Hugging Face implementation of the same model, side by side.

Both models hold the same weights (ours is exported with lm.model.convert.to_hf), see the same
batches, use the same optimizer settings, dtype and thread count, and are timed in interleaved
rounds in one process, so machine noise hits both alike. Prints tokens/s for each, the ratio
ours/theirs and the parameter counts (equal by construction).

    lm-bench --layout gpt2 --vocab 50304          # GPT-2 layout, 6 layers, width 384, context 256
    lm-bench --layout llama --vocab 65 --rounds 5
"""

import argparse
import json
import statistics
import time

import torch

from lm.config import ModelConfig, component

LAYOUTS = {
    "gpt2": dict(norm=component("lm.model.norms.LayerNorm"), ffn=component("lm.model.ffn.MLP", activation="gelu_tanh"),
                 pos=component("lm.model.position.Learned"), bias=True, tie_embeddings=True),
    "llama": dict(norm=component("lm.model.norms.RMSNorm"), ffn=component("lm.model.ffn.GLU", activation="silu"),
                  pos=component("lm.model.position.RoPE"), bias=False, tie_embeddings=False, init="normal"),
}


def model_config(args) -> ModelConfig:
    return ModelConfig(arch="decoder", vocab_size=args.vocab, dim=args.dim, n_layers=args.layers, n_heads=args.heads,
                       n_kv_heads=args.kv_heads, max_seq_len=args.seq, loss_chunk_size=args.loss_chunk,
                       **LAYOUTS[args.layout])


def _hf_step(model, x, y):
    # HF shifts labels inside; giving it the unshifted window keeps the work the same (T-1 targets).
    return model(input_ids=x, labels=y).loss


def _our_step(model, x, y):
    return model(input_ids=x, labels=y).loss


def time_steps(model, step, batches, optimizer) -> float:
    """Seconds for len(batches) full training steps (forward, backward, AdamW)."""
    start = time.perf_counter()
    for x, y in batches:
        loss = step(model, x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def run(args) -> dict:
    from lm.model import build_model
    from lm.model.convert import to_hf

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    ours = build_model(model_config(args))
    theirs = to_hf(ours)
    theirs.config.use_cache = False
    theirs.config._attn_implementation = "sdpa"
    ours.train(), theirs.train()
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, args.vocab, (args.steps, args.batch, args.seq + 1), generator=g)
    ours_batches = [(w[:, :-1], w[:, 1:]) for w in data]  # our labels are aligned: target t for position t
    hf_batches = [(w[:, :-1], w[:, :-1]) for w in data]  # HF shifts internally
    opts = {name: torch.optim.AdamW(m.parameters(), lr=1e-4) for name, m in (("ours", ours), ("hf", theirs))}
    models = {"ours": (ours, _our_step, ours_batches), "hf": (theirs, _hf_step, hf_batches)}
    for name, (m, step, batches) in models.items():  # warm-up: allocator, optimizer state
        time_steps(m, step, batches[: args.warmup], opts[name])
    times = {"ours": [], "hf": []}
    for r in range(args.rounds):
        order = ("ours", "hf") if r % 2 == 0 else ("hf", "ours")  # alternate who goes first
        for name in order:
            m, step, batches = models[name]
            times[name].append(time_steps(m, step, batches, opts[name]))
    tokens = args.steps * args.batch * args.seq
    result = {name: tokens / statistics.median(t) for name, t in times.items()}
    return {
        "layout": args.layout, "vocab": args.vocab, "layers": args.layers, "dim": args.dim, "heads": args.heads,
        "seq": args.seq, "batch": args.batch, "threads": args.threads, "rounds": args.rounds,
        "params_ours": sum(p.numel() for p in ours.parameters()),
        "params_hf": sum(p.numel() for p in theirs.parameters()),
        "tokens_per_s_ours": round(result["ours"], 1), "tokens_per_s_hf": round(result["hf"], 1),
        "ratio": round(result["ours"] / result["hf"], 3),
    }


def parse(argv=None):
    p = argparse.ArgumentParser(prog="lm-bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layout", choices=sorted(LAYOUTS), default="gpt2")
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--kv-heads", type=int, default=None, help="llama layout: key/value heads (GQA)")
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=3, help="steps per timed round")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median is reported")
    p.add_argument("--loss-chunk", type=int, default=0, help="our chunked output+loss (0 = plain)")
    p.add_argument("--json", action="store_true", help="print one JSON line")
    return p.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    r = run(args)
    if args.json:
        print(json.dumps(r))
        return
    print(f"{r['layout']} layout, vocab {r['vocab']}, {r['layers']}x{r['dim']}, {r['heads']} heads, "
          f"T={r['seq']}, B={r['batch']}, {r['threads']} threads, params ours={r['params_ours']:,} hf={r['params_hf']:,}")
    print(f"  ours {r['tokens_per_s_ours']:.0f} tokens/s | Hugging Face {r['tokens_per_s_hf']:.0f} tokens/s | "
          f"ratio {r['ratio']:.2f}x")


if __name__ == "__main__":
    main()
