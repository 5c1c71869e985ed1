"""In-process A/B of the CPU speedrun's training step (experiment=shakespeare_char_cpu), alternated.

On a shared machine, two runs measured one after the other see different loads. This builds each
variant of the speedrun's model + engine + fused AdamW once, then times blocks of full training steps
(lm.core.loop.train_step + engine.step: forward, backward, clip, update) round-robin over the variants,
so load changes hit every variant alike. Reports per variant the median ms/step (wall) and CPU
ms/step over the rounds, and each variant's ratio to the first one.

    python benchmarks/speedrun_ab.py --rounds 9 --steps 20 'fp32=' 'bf16=train.precision=bf16'
    python benchmarks/speedrun_ab.py 'torch=model.linear=torch' 'onednn=model.linear=onednn'
    python benchmarks/speedrun_ab.py --nanogpt ../shared/peers/nanogpt 'lm='   # nanoGPT's step as a variant

A variant is NAME=OVERRIDES (comma-separated lm train overrides on top of the experiment; empty = as is).
Speed only: whether a variant keeps the val loss is the speedrun's to show (`lm train experiment=...`).
"""

import argparse
import statistics
import time

import torch


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("variants", nargs="*", default=["fp32=", "bf16=train.precision=bf16"])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--steps", type=int, default=20, help="training steps per variant per round")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--experiment", default="shakespeare_char_cpu")
    p.add_argument("--nanogpt", default=None, help="nanoGPT checkout: add its model + train step as a variant")
    return p.parse_args()


class NanoGPT:
    """nanoGPT's training step for the same recipe (its model.py, configure_optimizers, train.py's step:
    forward, backward, clip 1.0, AdamW, zero_grad), timed like the variants."""

    def __init__(self, path: str):
        import sys

        sys.path.insert(0, path)
        from model import GPT, GPTConfig  # nanoGPT's model.py (measured, never copied)

        torch.manual_seed(1337)
        self.model = GPT(
            GPTConfig(block_size=64, vocab_size=65, n_layer=4, n_head=4, n_embd=128, dropout=0.0, bias=False)
        )
        self.opt = self.model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
        g = torch.Generator().manual_seed(0)
        self.batches = [torch.randint(0, 65, (12, 65), generator=g) for _ in range(8)]
        self.name, self.wall, self.cpu = "nanoGPT", [], []

    def steps(self, n: int) -> None:
        w0, c0 = time.perf_counter(), time.process_time()
        for i in range(n):
            x = self.batches[i % len(self.batches)]
            _, loss = self.model(x[:, :-1].contiguous(), x[:, 1:].contiguous())  # its get_batch stacks copies
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        self.wall.append((time.perf_counter() - w0) / n * 1e3)
        self.cpu.append((time.process_time() - c0) / n * 1e3)


class Variant:
    def __init__(self, name: str, overrides: list[str], experiment: str):
        from hydra import compose, initialize_config_dir
        from hydra.core.global_hydra import GlobalHydra

        from lm.cli.train import typed_run
        from lm.config import conf_dir, register_train_configs
        from lm.core.optim import adamw
        from lm.engine.base import Engine
        from lm.engine.dist import Dist
        from lm.model import build_model

        register_train_configs()
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
            cfg = compose(config_name="train", overrides=["~data", f"experiment={experiment}", *overrides])
        run = typed_run(cfg)
        self.name, self.train = name, run.train
        torch.manual_seed(run.seed)
        self.engine = Engine(run.train, Dist(0, 1, 0, torch.device("cpu")))
        self.engine.wrap(build_model(run.model), lambda m: adamw(m, run.optim))
        self.engine.set_lr(run.optim.lr)
        g = torch.Generator().manual_seed(0)
        t, b, v = run.train.seq_len, run.train.micro_batch_size, min(run.model.vocab_size, 65)
        self.batches = [
            {"input_ids": x[:, :-1], "labels": x[:, 1:]}
            for x in (torch.randint(0, v, (b, t + 1), generator=g) for _ in range(8))
        ]
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def steps(self, n: int) -> None:
        from lm.core.loop import train_step

        w0, c0 = time.perf_counter(), time.process_time()
        for i in range(n):
            train_step(self.engine, [self.batches[i % len(self.batches)]], dense_labels=True)
            self.engine.step()
        self.wall.append((time.perf_counter() - w0) / n * 1e3)
        self.cpu.append((time.process_time() - c0) / n * 1e3)


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    variants = []
    for spec in args.variants:
        name, _, overrides = spec.partition("=")
        variants.append(Variant(name, [o for o in overrides.split(",") if o], args.experiment))
    if args.nanogpt:
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()):  # its parameter-count prints
            variants.append(NanoGPT(args.nanogpt))
    for v in variants:  # warm-up: first-call allocations and oneDNN primitive creation
        v.steps(3)
        v.wall, v.cpu = [], []
    for r in range(args.rounds):
        for v in variants if r % 2 == 0 else variants[::-1]:  # alternate the order too
            v.steps(args.steps)
    base = statistics.median(variants[0].wall)
    print(f"threads {torch.get_num_threads()}, {args.rounds} rounds x {args.steps} steps, alternated")
    print(f"{'variant':<12} {'ms/step':>9} {'cpu ms/step':>12} {'ratio':>7}  (medians)")
    for v in variants:
        med = statistics.median(v.wall)
        print(f"{v.name:<12} {med:9.2f} {statistics.median(v.cpu):12.2f} {med / base:7.3f}")


if __name__ == "__main__":
    main()
