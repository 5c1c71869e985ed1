"""Training-step speed of the GLUE-transfer recipe's models (4 layers x 256, vocabulary 8192, batches of 16 x 128:
conf/experiment/glue_transfer_{decoder,encoder}.yaml) under the settings that change their step, timed in
interleaved rounds in one process (as benchmarks/ablation_speed.py: the same batch, optimizer and threads, one
block of steps per variant per round, so load changes hit every variant alike):

- the decoder in fp32 against bf16 autocast: what `train.precision=auto` chooses between (bf16 pays only
  where the CPU computes it natively: AVX512-BF16 or AMX);
- the masked-LM encoder with its head on every position against the masked ones only
  (`model.sparse_prediction`, Geiping & Goldstein 2022), fp32.

Prints the median tokens/s of each variant and its ratio to the first of its pair.

    python benchmarks/recipe_step.py --rounds 5 --steps 3
"""

import argparse
import os
import statistics
import time

import torch

from lm.constants import IGNORE_INDEX
from lm.engine.dist import computes_bf16
from lm.model import build_model
from lm.model.config import model_preset

RECIPE = ["model.vocab_size=8192", "model.dim=256", "model.n_layers=4", "model.n_heads=4", "model.max_seq_len=128"]
ENCODER = RECIPE + ["model.arch=encoder", "model/pos=rope"]  # glue_transfer_encoder: the same model, bidirectional
PAIRS = {  # name: (preset, overrides, bf16 autocast)
    "decoder fp32": ("tiny", RECIPE, False),
    "decoder bf16 autocast": ("tiny", RECIPE, True),
    "encoder dense MLM head": ("tiny", ENCODER + ["model.sparse_prediction=false"], False),
    "encoder sparse prediction": ("tiny", ENCODER, False),
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=3, help="steps per variant per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    return p.parse_args()


def batch(arch: str, args, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and labels: next tokens for the decoder; BERT's 15% masked positions for the encoder."""
    x = torch.randint(5, 8192, (args.batch, args.seq), generator=g)
    if arch == "decoder":
        return x, torch.roll(x, -1, dims=1)
    masked = torch.rand(args.batch, args.seq, generator=g) < 0.15
    return x.masked_fill(masked, 4), torch.where(masked, x, IGNORE_INDEX)


def make(preset: str, overrides: list[str]):
    torch.manual_seed(0)
    model = build_model(model_preset(preset, overrides))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)


def steps(model, opt, x, y, n: int, bf16: bool) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=x, labels=y).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def build_runs(names: list[str], args) -> dict:
    """Each variant's (model, optimizer, ids, labels, bf16). The two sides of a pair see the same batch (and the
    encoders the same masked positions, whose count sets the sparse head's work): one generator seeded per variant."""
    runs = {}
    for name in names:
        preset, overrides, bf16 = PAIRS[name]
        model, opt = make(preset, overrides)
        runs[name] = (model, opt, *batch(model.cfg.arch, args, torch.Generator().manual_seed(0)), bf16)
    return runs


def main():
    args = parse_args()
    names = [n for n in PAIRS if not args.only or n in args.only.split(",")]
    runs = build_runs(names, args)
    for model, opt, x, y, bf16 in runs.values():
        steps(model, opt, x, y, 1, bf16)  # warm-up: allocator, optimizer state
    rates = {n: [] for n in names}
    for r in range(args.rounds):
        for name, (model, opt, x, y, bf16) in runs.items() if r % 2 == 0 else reversed(runs.items()):  # alternates
            rates[name].append(args.steps * args.batch * args.seq / steps(model, opt, x, y, args.steps, bf16))
    units = computes_bf16(torch.device("cpu"))
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, CPU bf16 units: {units}, batch "
        f"{args.batch}x{args.seq}, {args.rounds} rounds x {args.steps} steps, load average {os.getloadavg()[0]:.1f}"
    )
    print("| variant | tokens/s (median) | min–max over rounds | vs the first of its pair |")
    print("|---|---:|---:|---:|")
    for name in names:
        first = list(PAIRS)[list(PAIRS).index(name) // 2 * 2]
        med = statistics.median(rates[name])
        ratio = f"{med / statistics.median(rates[first]):.2f}x" if first in rates else "–"
        print(f"| {name} | {med:.0f} | {min(rates[name]):.0f}–{max(rates[name]):.0f} | {ratio} |")


if __name__ == "__main__":
    main()
