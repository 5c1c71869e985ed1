"""One GLUE task, one seed: the finetuning epoch loop, on the shared `lm.core.loop.train_step` and any engine.

    for each optimizer step (epochs x ceil(N / batch_size) steps, AdamW, linear warmup + linear decay):
        a shuffled batch of `batch_size` examples, this rank's share cut into micro-batches
        loop.train_step: forward + backward through the engine, each micro-batch weighted by its
            share of the global batch (so the step's gradient is the example mean over all ranks)
        engine.step(): clip, update, zero gradients
    at the end of every epoch: predict dev, score with the leaderboard's metrics; when the task's
    main metric improves, keep those dev metrics and predict the test set(s) with the same weights
    (the predictions of the best epoch are the submission; optionally the weights are saved too).

Every rank predicts the whole dev/test set: sharded engines (ZeRO-3, FSDP2) must run the same
forwards on every rank, and GLUE dev sets are small.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from lm.config import GlueTaskConfig
from lm.core.config import SchedConfig
from lm.glue.encode import collate, encode_examples
from lm.glue.metrics import Metrics, compute_metrics, main_metric
from lm.glue.readers import GlueDataMissing, load_split
from lm.glue.tasks import EVALS, Task, get_task

log = logging.getLogger("lm")

Features = Dict[str, list]


@dataclass
class Split:
    """Encoded examples of one split; `labels` for dev (scoring), `indices` for test (submission ids)."""

    features: List[Features]
    labels: Optional[np.ndarray] = None
    indices: Optional[List[int]] = None


@dataclass
class TaskData:
    task: Task
    train: Split
    dev: Dict[str, Split]  # leaderboard column -> dev split (MNLI: mnli_m, mnli_mm)
    test: Dict[str, Split]  # leaderboard column -> test split (MNLI: mnli_m, mnli_mm, ax)
    missing_test: List[str] = field(default_factory=list)  # "column: why" for test files not found


def load_task_data(cfg: GlueTaskConfig, tokenizer, arch: str, max_len: int, hf: bool = True,
                   with_test: bool = True) -> TaskData:
    """Read and encode train, every dev column and (when there) every test column of one task.

    Missing train/dev files are errors (GlueDataMissing names the path and how to get the data);
    a missing test file only means no submission file for that column (listed in missing_test).
    """
    task = get_task(cfg.name)
    train = load_split(task.name, "train", cfg.data_root, hf)
    if cfg.max_train_examples:
        train = train[: cfg.max_train_examples]
    dev, test, missing = {}, {}, []
    for col in task.evals:
        e = EVALS[col]
        if e.dev is not None:
            rows = load_split(e.task, e.dev, cfg.data_root, hf)
            dev[col] = Split(encode(tokenizer, rows, max_len, arch), labels=np.array([r.label for r in rows]))
        if with_test:
            try:
                rows = load_split(e.task, e.test, cfg.data_root, hf)
            except GlueDataMissing as err:
                missing.append(f"{e.submission}: {err}")
                continue
            test[col] = Split(encode(tokenizer, rows, max_len, arch, labels=False), indices=[r.index for r in rows])
    if not train:
        raise ValueError(f"GLUE {task.dir}: the train split is empty")
    return TaskData(task, Split(encode(tokenizer, train, max_len, arch)), dev, test, missing)


def encode(tokenizer, rows, max_len: int, arch: str, labels: bool = True) -> List[Features]:
    feats = encode_examples(tokenizer, rows, max_len, arch)
    if not labels:
        for f in feats:
            f.pop("labels", None)
    return feats


# -- batches -----------------------------------------------------------------------------------------

def micro_batches(indices: np.ndarray, rank: int, world_size: int, micro_batch_size: int) -> List[np.ndarray]:
    """This rank's share of one batch, cut into micro-batches; every rank gets the same number of them
    (engines count accumulation boundaries), so the batch is cut into ceil(B / (world x micro)) parts."""
    n_micro = max(1, math.ceil(len(indices) / (world_size * micro_batch_size)))
    mine = indices[rank::world_size]
    return [chunk for chunk in np.array_split(mine, n_micro) if len(chunk)]


def schedule(cfg: GlueTaskConfig, n_train: int, world_size: int = 1) -> Tuple[int, int, SchedConfig]:
    """(steps per epoch, total steps, linear warmup + linear decay to 0) from epochs and batch size."""
    # A tail batch smaller than the number of ranks would leave a rank without data: dropped.
    per_epoch = max(1, n_train // cfg.batch_size + (1 if n_train % cfg.batch_size >= world_size else 0))
    total = max(1, math.ceil(cfg.epochs * per_epoch))
    return per_epoch, total, SchedConfig(kind="linear", warmup_steps=round(cfg.warmup_ratio * total), min_lr_ratio=0.0)


def epoch_order(n: int, batch_size: int, per_epoch: int, rng: np.random.Generator) -> List[np.ndarray]:
    perm = rng.permutation(n)
    return [perm[i * batch_size:(i + 1) * batch_size] for i in range(per_epoch)]


# -- prediction --------------------------------------------------------------------------------------

@torch.no_grad()
def predict(engine, features: Sequence[Features], pad_id: int, batch_size: int = 128) -> np.ndarray:
    """(N, n_labels) logits (STS-B: (N, 1) scores) in the order of `features`.

    Batches are sorted by length so padding costs little; the output is put back in input order.
    """
    order = np.argsort([len(f["input_ids"]) for f in features], kind="stable")
    out = [None] * len(features)
    engine.model.eval()
    try:
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            batch = collate([{k: v for k, v in features[i].items() if k != "labels"} for i in idx], pad_id)
            batch = {k: v.to(engine.device) for k, v in batch.items()}
            with engine.autocast():
                logits = engine.model(**batch).logits.float().cpu().numpy()  # (b, n_labels)
            for j, i in enumerate(idx):
                out[i] = logits[j]
    finally:
        engine.model.train()
    return np.stack(out)


def score_dev(engine, data: TaskData, pad_id: int, batch_size: int) -> Dict[str, Metrics]:
    return {col: compute_metrics(col, predict(engine, s.features, pad_id, batch_size), s.labels)
            for col, s in data.dev.items()}


# -- one seed ------------------------------------------------------------------------------------------

@dataclass
class SeedResult:
    seed: int
    dev: Dict[str, Metrics]  # leaderboard column -> metrics of the best epoch
    main: float  # the task's main metric at the best epoch
    best_epoch: int
    test: Dict[str, np.ndarray]  # leaderboard column -> test logits/scores of the best epoch
    history: List[Dict] = field(default_factory=list)  # per epoch: {"epoch", "step", "main", "dev"}
    seconds: float = 0.0


def run_seed(cfg: GlueTaskConfig, data: TaskData, seed: int, engine, tracker, pad_id: int,
             micro_batch_size: int, eval_batch_size: int = 128, log_interval: int = 50,
             on_best: Optional[Callable[[int, Dict], None]] = None) -> SeedResult:
    """Train one wrapped engine (model + AdamW already built) on `data`; returns the best epoch's results."""
    from lm.core.loop import LossDiverged, train_step
    from lm.core.optim import lr_multiplier

    per_epoch, total, sched = schedule(cfg, len(data.train.features), engine.world_size)
    rng = np.random.default_rng(seed)  # the same batch order on every rank
    best: Optional[SeedResult] = None
    history, t0, order = [], time.perf_counter(), []
    for step in range(total):
        if step % per_epoch == 0:
            order = epoch_order(len(data.train.features), cfg.batch_size, per_epoch, rng)
        lr = cfg.lr * lr_multiplier(step, sched, total)
        engine.set_lr(lr)
        micro = [collate([data.train.features[i] for i in chunk], pad_id)
                 for chunk in micro_batches(order[step % per_epoch], engine.rank, engine.world_size, micro_batch_size)]
        loss, _ = train_step(engine, micro)
        if not math.isfinite(loss):
            raise LossDiverged(f"GLUE {data.task.dir} seed {seed}: loss is {loss} at step {step + 1}; lower task.lr "
                               f"(now {cfg.lr}) or raise task.warmup_ratio")
        grad_norm = engine.step()
        if (step + 1) % log_interval == 0:
            tracker.log({"step": step + 1, "loss": loss, "lr": lr, "grad_norm": grad_norm})
        if (step + 1) % per_epoch == 0 or step + 1 == total:
            epoch = math.ceil((step + 1) / per_epoch)
            dev = score_dev(engine, data, pad_id, eval_batch_size)
            main = main_metric(data.task.name, dev, cfg.main_metric)
            history.append({"epoch": epoch, "step": step + 1, "main": main, "dev": dev})
            tracker.log({"step": step + 1, "epoch": epoch, "dev/main": main,
                         **{f"dev/{c}/{k}": v for c, m in dev.items() for k, v in m.items()}})
            if engine.is_main:
                log.info("%s seed %d epoch %d (step %d/%d): loss %.4f, dev %s = %.2f", data.task.dir, seed, epoch,
                         step + 1, total, loss, cfg.main_metric, main)
            if best is None or main > best.main:
                test = {c: predict(engine, s.features, pad_id, eval_batch_size) for c, s in data.test.items()}
                best = SeedResult(seed, dev, main, epoch, test)
                if on_best:
                    on_best(step + 1, {"epoch": epoch, "main": main, "dev": dev})
    best.history, best.seconds = history, time.perf_counter() - t0
    return best
