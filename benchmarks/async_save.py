"""How long a checkpoint stops the training loop: synchronous vs train.async_checkpoint, same model, same run.

    python benchmarks/async_save.py                       # GPT-2 124M, engine=single, CPU, 3 saves of each
    python benchmarks/async_save.py --model tiny --saves 2 --out /tmp/async_save

One process builds the model, trains 2 steps (AdamW's moments exist, as in a real checkpoint) and saves through
lm's Checkpointer, alternating a synchronous save and an asynchronous one (so both see the same page cache and
disk), which of the two goes first alternating too, after one untimed save of each. For each it times what the
loop waits for: the whole save (synchronous), or save()'s return, i.e. the previous write's wait (none here) plus
the CPU copy (asynchronous); and for the asynchronous one also the background write (wait()). Prints the medians,
the ratio blocked/synchronous, and one JSON line.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def build(model: str, seq_len: int, batch: int):
    """A SingleEngine (CPU) around `model` with AdamW, after 2 training steps."""
    import torch

    from lm.core.config import OptimConfig, TrainConfig
    from lm.core.optim import adamw
    from lm.engine import Dist, SingleEngine
    from lm.model import build_model
    from lm.model.config import model_preset

    torch.manual_seed(0)
    cfg = model_preset(model)
    train = TrainConfig(micro_batch_size=batch, seq_len=seq_len)
    engine = SingleEngine(train, Dist(rank=0, world_size=1, local_rank=0, device=torch.device("cpu")))
    engine.wrap(build_model(cfg), lambda m: adamw(m, OptimConfig()))
    for _ in range(2):
        ids = torch.randint(0, cfg.vocab_size, (batch, seq_len + 1))
        engine.backward(engine.model(input_ids=ids[:, :-1], labels=ids[:, 1:]).loss)
        engine.step()
    return engine, sum(p.numel() for p in engine.module.parameters())


def measure(engine, out: Path, saves: int):
    from lm.core.checkpoint import Checkpointer

    sync = Checkpointer(out / "sync", engine, keep_last=1)
    background = Checkpointer(out / "async", engine, keep_last=1, asynchronous=True)
    times = {"sync_s": [], "async_blocked_s": [], "async_write_s": []}

    def synchronous(step: int) -> dict:
        t0 = time.perf_counter()
        sync.save({"step": step, "tokens": 0}, {})
        return {"sync_s": time.perf_counter() - t0}

    def asynchronous(step: int) -> dict:
        t0 = time.perf_counter()
        background.save({"step": step, "tokens": 0}, {})
        t1 = time.perf_counter()
        background.wait()
        return {"async_blocked_s": t1 - t0, "async_write_s": time.perf_counter() - t1}

    synchronous(1), asynchronous(1)  # untimed: each kind's first save makes its directories and host buffers
    for i in range(saves):
        pair = (synchronous, asynchronous) if i % 2 == 0 else (asynchronous, synchronous)  # neither always first
        for save in pair:
            for k, v in save(i + 2).items():
                times[k].append(v)
    return {k: statistics.median(v) for k, v in times.items()}, times


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt2", help="a conf/model preset (default: gpt2, 124M)")
    p.add_argument("--saves", type=int, default=3, help="saves of each kind (medians reported)")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--out", type=Path, default=None, help="where the checkpoints go (default: a temporary dir)")
    args = p.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="lm-async-save-"))
    try:
        engine, params = build(args.model, args.seq_len, args.batch)
        medians, times = measure(engine, out, args.saves)
        size = sum(f.stat().st_size for f in (out / "sync").rglob("*") if f.is_file())
    finally:
        if args.out is None:
            shutil.rmtree(out, ignore_errors=True)
    ratio = medians["async_blocked_s"] / medians["sync_s"]
    print(
        f"model={args.model} ({params / 1e6:.1f}M parameters), checkpoint {size / 2**20:.0f} MiB, "
        f"{args.saves} saves each, load average {os.getloadavg()[0]:.2f}"
    )
    print(f"synchronous save:             {medians['sync_s']:.3f} s (median)")
    print(f"asynchronous, loop blocked:   {medians['async_blocked_s']:.3f} s (median) = {ratio:.1%} of synchronous")
    print(f"asynchronous, background:     {medians['async_write_s']:.3f} s (median)")
    print(
        json.dumps(
            {
                "model": args.model,
                "params": params,
                "bytes": size,
                **medians,
                "blocked_ratio": ratio,
                "all": times,
                "load_average": os.getloadavg()[0],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
