"""benchmarks/hf_step.py: our training step against the Hugging Face implementation of the same model, side by side.

Both models hold the same weights (ours is exported with lm.model.convert.to_hf), see the same
batches with the same targets, use the same AdamW settings, clipping (1.0), dtype and thread count, and
are timed step by step in alternating order in one process, so machine noise hits both alike. Ours is
what lm train runs: lm's loop and single engine through the run harness (lm/core/session.py; each of our
steps is timed from its start to the next one's by the loop's step_begin hook, which also runs Hugging
Face's step of the same index before or after ours); theirs is HF's usual step, written out. Prints tokens/s
for each (median step), the ratio ours/theirs (median of the per-pair ratios), the parameter
counts (equal by construction) and the first-step losses (equal up to float rounding: the same
model and the same targets).

    python benchmarks/hf_step.py --layout gpt2 --vocab 50304          # GPT-2 layout, 6 layers, width 384, context 256
    python benchmarks/hf_step.py --layout llama --vocab 65 --steps 20
    python benchmarks/hf_step.py --layout llama --vocab 65 --compile ours   # lm train.compile=true vs HF eager

`--loss-chunk auto` uses our chunked output projection + cross-entropy (lm/model/loss.py) at large
vocabularies (>= 8192), where the B*T*V logits dominate the step, and the plain one below.
"""

import argparse
import json
import os
import platform
import statistics
import tempfile
import time

import torch

from lm.cli.errors import entry
from lm.constants import IGNORE_INDEX
from lm.core.fixed_task import TimedStepsDone
from lm.extras import exit_if_missing
from lm.model.config import GLUConfig, LayerNormConfig, LearnedConfig, MLPConfig, ModelConfig, RMSNormConfig, RoPEConfig

LAYOUTS = {
    "gpt2": dict(
        norm=LayerNormConfig(),
        ffn=MLPConfig(activation="gelu_tanh"),
        pos=LearnedConfig(),
        bias=True,
        tie_embeddings=True,
    ),
    "llama": dict(
        norm=RMSNormConfig(),
        ffn=GLUConfig(activation="silu", hidden_mult=8 / 3),
        pos=RoPEConfig(),
        bias=False,
        tie_embeddings=False,
        init="normal",
    ),
}
AUTO_CHUNK_VOCAB, AUTO_CHUNK = 8192, 256
LR, WEIGHT_DECAY, GRAD_CLIP = 1e-4, 0.1, 1.0


def loss_chunk(args) -> int:
    if args.loss_chunk == "auto":
        return AUTO_CHUNK if args.vocab >= AUTO_CHUNK_VOCAB else 0
    return int(args.loss_chunk)


def model_config(args) -> ModelConfig:
    return ModelConfig(
        arch="decoder",
        vocab_size=args.vocab,
        dim=args.dim,
        n_layers=args.layers,
        n_heads=args.heads,
        n_kv_heads=args.kv_heads,
        max_seq_len=args.seq,
        loss_chunk_size=loss_chunk(args),
        linear=args.linear,
        **LAYOUTS[args.layout],
    )


def batches(args) -> dict:
    """The same windows for both: HF shifts labels inside, ours takes them aligned (target t at position t).

    The last position of ours gets no target, so both compute the loss over the same T-1 tokens.
    """
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, args.vocab, (args.warmup + args.steps, args.batch, args.seq), generator=g)
    ours = []
    for x in data:
        y = torch.full_like(x, IGNORE_INDEX)
        y[:, :-1] = x[:, 1:]
        ours.append((x, y))
    return {"ours": ours, "hf": [(x, x) for x in data]}


def train_step(model, optimizer, x, y) -> float:
    """One full training step (forward, backward, clipping, AdamW); returns the loss."""
    loss = model(input_ids=x, labels=y).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def build(args):
    from lm.model import build_model
    from lm.model.convert import to_hf

    torch.manual_seed(0)
    ours = build_model(model_config(args))
    theirs = to_hf(ours)
    theirs.config.use_cache = False
    theirs.config._attn_implementation = "sdpa"
    ours.train(), theirs.train()
    return {"ours": ours, "hf": theirs}


def hf_callable(model, args):
    """What Hugging Face's step calls: the model, or torch.compile of it (--compile both)."""
    return torch.compile(model) if args.compile == "both" else model


class Pairs:
    """The loop's step_begin hook: closes the timing of our previous step, runs Hugging Face's step of the same
    index after ours (even steps) or before ours (odd steps), and starts timing our next step. Steps from
    `warmup` on are recorded; the run ends when every step is done (TimedStepsDone)."""

    def __init__(self, hf_step, warmup: int, steps: int):
        self.hf_step, self.warmup, self.total = hf_step, warmup, warmup + steps
        self.wall, self.cpu = {"ours": [], "hf": []}, {"ours": [], "hf": []}
        self.first_loss_hf, self.start = None, None

    def __call__(self, step: int) -> None:
        if self.start is not None:  # our step `step - 1` has just ended
            self._record("ours", step - 1, *self.start)
            if (step - 1) % 2 == 0:
                self._hf(step - 1)
        if step == self.total:
            raise TimedStepsDone
        if step % 2 == 1:
            self._hf(step)
        self.start = (time.perf_counter(), time.process_time())

    def _hf(self, i: int) -> None:
        w0, c0 = time.perf_counter(), time.process_time()
        loss = self.hf_step(i)
        self._record("hf", i, w0, c0)
        if i == 0:
            self.first_loss_hf = loss

    def _record(self, side: str, i: int, w0: float, c0: float) -> None:
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        if self.warmup <= i < self.total:
            self.wall[side].append(wall)
            self.cpu[side].append(cpu)


def train_ours(model, batches, pairs: Pairs, threads: int, compile: bool = False) -> None:
    """lm train's loop and single engine on `batches` (one per step), through the run harness (it writes
    nothing: the run ends before the loop's last step, which would checkpoint)."""
    from lm.core.config import OptimConfig, TrainConfig
    from lm.core.fixed_task import FixedTask
    from lm.core.hooks import Hooks
    from lm.core.session import Session
    from lm.engine import Dist, SingleEngine

    steps = len(batches)
    train = TrainConfig(
        micro_batch_size=batches[0]["input_ids"].shape[0],
        seq_len=batches[0]["input_ids"].shape[1],
        max_steps=steps + 1,
        grad_clip=GRAD_CLIP,
        device="cpu",
        log_interval=steps,
        eval_interval=0,
        ckpt_interval=0,
        progress=False,
        threads=threads,
        compile=compile,
    )
    engine = SingleEngine(train, Dist(rank=0, world_size=1, local_rank=0, device=torch.device("cpu")))
    with (
        tempfile.TemporaryDirectory(prefix="lm-bench-") as run_dir,
        Session(train, engine, FixedTask(batches), run_dir, "", hooks=Hooks(step_begin=[pairs])) as session,
    ):
        session.build(lambda: model, 0, OptimConfig(lr=LR, weight_decay=WEIGHT_DECAY, betas=[0.9, 0.999]))
        try:
            session.train(lambda step: LR)
        except TimedStepsDone:
            pass


def run(args) -> dict:
    from lm.core import objectives

    torch.set_num_threads(args.threads)
    models = build(args)
    data = batches(args)
    hf_opt = torch.optim.AdamW(models["hf"].parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    ours = [{"input_ids": x, "labels": y} for x, y in data["ours"]]
    with torch.no_grad():  # the first step's loss: the same forward, before any update
        first_loss_ours = float(objectives.loss(models["ours"], ours[0]))
    theirs = hf_callable(models["hf"], args)
    pairs = Pairs(lambda i: train_step(theirs, hf_opt, *data["hf"][i]), args.warmup, args.steps)
    load_before = os.getloadavg()[0]
    train_ours(models["ours"], ours, pairs, args.threads, compile=args.compile != "none")
    wall, cpu, first_loss = pairs.wall, pairs.cpu, {"ours": first_loss_ours, "hf": pairs.first_loss_hf}
    tokens = args.batch * args.seq
    return {
        "layout": args.layout,
        "vocab": args.vocab,
        "layers": args.layers,
        "dim": args.dim,
        "heads": args.heads,
        "seq": args.seq,
        "batch": args.batch,
        "threads": args.threads,
        "steps": args.steps,
        "loss_chunk": loss_chunk(args),
        "linear": args.linear,
        "compile": args.compile,
        "params_ours": sum(p.numel() for p in models["ours"].parameters()),
        "params_hf": sum(p.numel() for p in models["hf"].parameters()),
        "first_loss_ours": round(first_loss["ours"], 5),
        "first_loss_hf": round(first_loss["hf"], 5),
        "tokens_per_s_ours": round(tokens / statistics.median(wall["ours"]), 1),
        "tokens_per_s_hf": round(tokens / statistics.median(wall["hf"]), 1),
        # Each pair ran back to back, so their ratio cancels load that drifts over the run.
        "ratio": round(statistics.median(h / o for h, o in zip(wall["hf"], wall["ours"])), 3),
        # Process CPU seconds: with 1 thread, close to what an idle machine's wall clock would show.
        "cpu_ratio": round(statistics.median(h / o for h, o in zip(cpu["hf"], cpu["ours"])), 3),
        "loadavg": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def parse(argv=None):
    p = argparse.ArgumentParser(
        prog="benchmarks/hf_step.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--layout", choices=sorted(LAYOUTS), default="gpt2")
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--kv-heads", type=int, default=None, help="llama layout: key/value heads (GQA)")
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads, the same for both")
    p.add_argument("--steps", type=int, default=8, help="timed steps per model, alternating; medians are reported")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per model first")
    p.add_argument(
        "--loss-chunk",
        default="auto",
        help="our output+loss chunk in tokens: 0 = plain logits + cross-entropy; auto = "
        f"{AUTO_CHUNK} when --vocab >= {AUTO_CHUNK_VOCAB}, else 0",
    )
    p.add_argument(
        "--linear",
        choices=["auto", "torch", "onednn"],
        default="auto",
        help="our Linear layers (model.linear): auto = onednn where the build has it, as lm train by default; "
        "torch = F.linear, as Hugging Face's side; onednn = the oneDNN fp32 CPU path (lm/model/linear.py)",
    )
    p.add_argument(
        "--compile",
        choices=["none", "ours", "both"],
        default="none",
        help="torch.compile: none (eager, as lm train by default), ours (train.compile=true against Hugging "
        "Face eager) or both; compilation happens in the --warmup steps",
    )
    p.add_argument("--json", action="store_true", help="print one JSON line")
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 1:
        p.error("--steps and --warmup must be >= 1")
    if args.loss_chunk != "auto" and not args.loss_chunk.isdigit():
        p.error(f"--loss-chunk must be a number of tokens or 'auto', got {args.loss_chunk!r}")
    return args


@entry("hf_step")
def main(argv=None):
    exit_if_missing("benchmarks/hf_step.py", "hf")  # the reference models are transformers'
    args = parse(argv)
    r = run(args)
    if args.json:
        print(json.dumps(r))
        return
    print(
        f"{r['layout']} layout, vocab {r['vocab']}, {r['layers']}x{r['dim']}, {r['heads']} heads, T={r['seq']}, "
        f"B={r['batch']}, {r['threads']} thread(s), fp32, loss chunk {r['loss_chunk'] or 'off'}, "
        f"linear {r['linear']}, compile {r['compile']}; "
        f"params ours={r['params_ours']:,} hf={r['params_hf']:,}; first-step loss ours={r['first_loss_ours']:.4f} "
        f"hf={r['first_loss_hf']:.4f}"
    )
    print(
        f"  ours {r['tokens_per_s_ours']:.0f} tokens/s | Hugging Face {r['tokens_per_s_hf']:.0f} tokens/s | "
        f"ratio {r['ratio']:.2f}x (CPU-time ratio {r['cpu_ratio']:.2f}x) | {r['steps']} steps each, "
        f"loadavg {r['loadavg'][0]} -> {r['loadavg'][1]}, {r['machine']}, torch {r['torch']}, {r['date']}"
    )


if __name__ == "__main__":
    main()
