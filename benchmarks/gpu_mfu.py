"""MFU of a training step on one GPU: bf16 autocast, flash SDPA, torch.compile, fused AdamW.

MFU = tokens/s x training FLOPs per token (lm.model.flops: 6N + 12*L*H*Dh*T, PaLM appendix) /
the device's dense bf16 peak (H100 SXM 989 TFLOP/s, H200 989, A100 312; no sparsity).
The largest micro-batch that fits is found by doubling until out of memory.

    python benchmarks/gpu_mfu.py --preset gpt2 --seq 1024            # GPT-2 124M
    python benchmarks/gpu_mfu.py --preset llama --seq 2048           # TinyLlama-shape 1.1B
    python benchmarks/gpu_mfu.py --attention-sweep                   # flash vs math SDPA, T = 512 ... 16384
    python benchmarks/gpu_mfu.py --all                               # all three, one JSON line each
"""

import argparse
import json
import time

import torch
import torch.nn.functional as F

from lm.model import build_model
from lm.model.config import model_preset
from lm.model.flops import flops_per_token

PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12}


def device_peak() -> float:
    name = torch.cuda.get_device_name()
    for key, peak in PEAK_BF16.items():
        if key in name:
            return peak
    raise SystemExit(f"unknown peak for {name}; add it to PEAK_BF16")


def train_step_fn(model, opt):
    def step(x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=y).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def measure(preset: str, seq: int, batch: int, steps: int, compile_model: bool, overrides) -> dict:
    cfg = model_preset(preset, [f"model.max_seq_len={max(seq, 1)}", "model.dropout=0.0", *overrides])
    model = build_model(cfg).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    step = train_step_fn(torch.compile(model) if compile_model else model, opt)
    x = torch.randint(0, cfg.vocab_size, (batch, seq + 1), device="cuda")
    for _ in range(3):  # compile and warm up
        step(x[:, :-1], x[:, 1:])
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step(x[:, :-1], x[:, 1:])
    torch.cuda.synchronize()
    tokens_per_s = steps * batch * seq / (time.perf_counter() - start)
    fpt = flops_per_token(cfg, seq)
    return {"preset": preset, "seq": seq, "batch": batch, "tokens_per_s": round(tokens_per_s),
            "flops_per_token": fpt, "mfu": round(tokens_per_s * fpt / device_peak(), 4),
            "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2), "device": torch.cuda.get_device_name()}


def largest_batch(preset, seq, compile_model, overrides, start=4) -> int:
    batch, best = start, None
    while batch <= 512:
        try:
            measure(preset, seq, batch, 1, False, overrides)
            best = batch
            batch *= 2
        except torch.OutOfMemoryError:
            break
        finally:
            torch.cuda.empty_cache()
    if best is None:
        raise SystemExit(f"even micro-batch {start} does not fit")
    return best


def attention_sweep(heads=12, head_dim=64, batch=1) -> list:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    for T in (512, 1024, 2048, 4096, 8192, 16384):
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("math", SDPBackend.MATH)):
            q, k, v = (torch.randn(batch, heads, T, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
            torch.cuda.reset_peak_memory_stats()
            try:
                with sdpa_kernel(backend):
                    for i in range(4):
                        if i == 1:
                            torch.cuda.synchronize()
                            start = time.perf_counter()
                        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
                    torch.cuda.synchronize()
                ms = (time.perf_counter() - start) / 3 * 1e3
                rows.append({"T": T, "backend": name, "ms_fwd_bwd": round(ms, 2),
                             "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)})
            except torch.OutOfMemoryError:
                rows.append({"T": T, "backend": name, "ms_fwd_bwd": None, "peak_mem_gib": "OOM"})
            del q, k, v
            torch.cuda.empty_cache()
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="gpt2")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=0, help="0 = the largest power of two that fits")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--attention-sweep", action="store_true")
    p.add_argument("--all", action="store_true", help="GPT-2 124M at T=1024, the 1.1B Llama at T=2048, then the sweep")
    p.add_argument("overrides", nargs="*", help="model overrides, e.g. model.loss_chunk_size=4096 model/ffn=swiglu")
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    if args.all:
        for preset, seq in (("gpt2", 1024), ("llama", 2048)):
            batch = largest_batch(preset, seq, not args.no_compile, args.overrides)
            print(json.dumps(measure(preset, seq, batch, args.steps, not args.no_compile, args.overrides)), flush=True)
        args.attention_sweep = True
    if args.attention_sweep:
        for row in attention_sweep():
            print(json.dumps(row))
        return
    batch = args.batch or largest_batch(args.preset, args.seq, not args.no_compile, args.overrides)
    print(json.dumps(measure(args.preset, args.seq, batch, args.steps, not args.no_compile, args.overrides)))


if __name__ == "__main__":
    main()
