"""Both speedrun programs scored on the WHOLE validation split, the same windows for both.

Each program logs a 20-batch estimate (nanoGPT: 20 random batches; lm: the first 20), which moves by
about +-0.02 between draws. This scores the final models of one `benchmarks/speedrun_pair.sh` run on
every non-overlapping 64-character window of the last 10% of tiny Shakespeare (the split both programs
hold out), next-character cross-entropy averaged over all positions:

    python benchmarks/speedrun_full_val.py /tmp/tmp.XXXX          # the "logs:" folder the pair run printed
    python benchmarks/speedrun_full_val.py --runs runs/speedrun_s1 runs/speedrun_s2   # lm train run dirs only

nanoGPT's model is its own code (model.py of the copy the pair run made) loaded from its ckpt.pt, the
checkpoint its train.py keeps of the best evaluation (the last one, as its val loss falls at every
evaluation in this recipe). lm's are the final checkpoints of the lm_<round> run directories.
"""

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

T = 64  # the recipe's context


def windows(tokens: np.ndarray):
    """(N, T) inputs and (N, T) next-token targets: every whole 64-token window from the split's start."""
    n = (len(tokens) - 1) // T
    x = torch.from_numpy(tokens[: n * T].astype(np.int64)).view(n, T)  # (N, T)
    y = torch.from_numpy(tokens[1 : n * T + 1].astype(np.int64)).view(n, T)  # (N, T)
    return x, y


@torch.no_grad()
def mean_ce(logits_of, x, y, batch: int = 256) -> float:
    total = 0.0
    for i in range(0, len(x), batch):
        logits = logits_of(x[i : i + batch])  # (b, T, V)
        total += F.cross_entropy(logits.flatten(0, 1).float(), y[i : i + batch].flatten(), reduction="sum").item()
    return total / y.numel()


def nanogpt_loss(nano_dir: Path):
    """(whole-split loss, the checkpoint's iteration, number of predictions) of nanoGPT's saved model."""
    spec = importlib.util.spec_from_file_location("nanogpt_model", nano_dir / "model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ckpt = torch.load(nano_dir / "out-shakespeare-char" / "ckpt.pt", map_location="cpu", weights_only=True)
    model = mod.GPT(mod.GPTConfig(**ckpt["model_args"]))
    model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()})
    model.eval()
    val = np.fromfile(nano_dir / "data" / "shakespeare_char" / "val.bin", dtype=np.uint16)
    x, y = windows(val)
    # nanoGPT's forward returns logits for the last position only unless targets are given; pass them.
    return mean_ce(lambda xb: model(xb, targets=xb)[0], x, y), int(ckpt["iter_num"]), y.numel()


def lm_loss(run_dir: Path):
    """(whole-split loss, checkpoint name, number of predictions) of an lm train run's final checkpoint."""
    from omegaconf import OmegaConf

    from lm.core.saved_model import find_saved_model
    from lm.data.packed import TokenStream
    from lm.model import build_model
    from lm.model.config import model_from_saved

    saved = find_saved_model(run_dir)
    model = build_model(model_from_saved(saved.model_node()))
    model.load_state_dict(saved.state_dict())
    model.eval()
    root = Path(OmegaConf.load(run_dir / "config.yaml").data.dir).expanduser()
    stream = TokenStream(root, json.loads((root / "meta.json").read_text()), "val")
    val = np.empty(stream.n, dtype=stream.dtype)
    stream.read(0, val)
    x, y = windows(val)
    return mean_ce(lambda xb: model(xb).logits, x, y), saved.path.name, y.numel()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("logs", type=Path, nargs="?", help="the folder benchmarks/speedrun_pair.sh printed after 'logs:'")
    p.add_argument("--runs", type=Path, nargs="*", default=[], help="more lm train run directories to score")
    a = p.parse_args(argv)
    if a.logs is None and not a.runs:
        p.error("give the pair run's logs folder, or --runs with lm train run directories")
    runs = list(a.runs)
    if a.logs is not None:
        loss, it, n = nanogpt_loss(a.logs / "nanogpt")
        print(f"nanoGPT (ckpt.pt of iteration {it}): whole-val loss {loss:.4f} over {n} predictions")
        runs = sorted(r for r in a.logs.glob("lm_*") if r.is_dir()) + runs
    for run in runs:
        if run.is_dir():
            loss, ckpt, n = lm_loss(run)
            print(f"lm {run} ({ckpt}): whole-val loss {loss:.4f} over {n} predictions")


if __name__ == "__main__":
    sys.exit(main())
