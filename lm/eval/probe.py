"""GLUE probes: how much of SST-2, MRPC, STS-B and CoLA the frozen model's features already solve.

Each probed task's first N train rows and first M dev rows are encoded once, as lm finetune encodes them
(lm/glue/encode.py). A probe pass runs the model without gradients, mean-pools the last hidden states over
real tokens (every family: a decoder's or RNN's top layer, an encoder's, an encoder-decoder's encoder), and
fits a scikit-learn model on the train features, standardized: logistic regression for the classification
tasks, ridge regression for STS-B. Dev predictions are scored with the task's official metric
(lm/glue/metrics.py: SST-2 accuracy, MRPC (F1 + accuracy) / 2, STS-B (Pearson + Spearman) / 2, CoLA MCC),
in points; `probe/avg` is their mean.

In the loop (`train.probe_interval`, lm/cli/train.py builds it) it is an lm.core.task.EvalCallback: rank 0
probes the whole model (engine.module) while the other ranks wait at their next collective, so engines
that shard the weights (fsdp2, zero3) are refused. It changes no training state: the model's train/eval
mode is restored and the RNGs are forked, so a run with probes trains and resumes exactly as one without.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean

import numpy as np
import torch

from lm.config import ConfigError
from lm.eval.pacing import PacedEval, pacing_of

log = logging.getLogger("lm")

DEFAULT_TASKS = ("sst2", "mrpc", "stsb", "cola")
BATCH = 64  # examples per no-grad forward


@dataclass
class ProbeSet:
    """One task's fixed examples, encoded: (features lists, labels) for train and dev."""

    task: str
    train: list[dict]
    dev: list[dict]

    @property
    def regression(self) -> bool:
        return isinstance(self.train[0]["labels"], float)


def load_probe_sets(
    tokenizer,
    arch: str,
    tasks: Sequence[str] = DEFAULT_TASKS,
    train_examples: int = 1000,
    dev_examples: int = 500,
    max_len: int = 128,
    root=None,
) -> list[ProbeSet]:
    """The first train_examples train rows and dev_examples dev rows (0 = all) of each task, encoded."""
    from lm.glue.encode import encode_examples
    from lm.glue.readers import load_eval, load_split
    from lm.glue.tasks import GLUE_TASKS, get_task, scored_evals

    unknown = [t for t in tasks if t not in GLUE_TASKS or len(scored_evals(t)) != 1]
    if unknown or not tasks:
        raise ConfigError(
            f"train.probe_tasks={list(tasks)}: each must be a GLUE task with one labelled dev split "
            f"(not {unknown}), e.g. train.probe_tasks=[sst2,mrpc,stsb,cola]"
        )
    out = []
    for task in tasks:
        # read no further than the rows probed: SST-2's 67k training rows would cost a second and their memory
        train = load_split(task, "train", root, hf=False, limit=train_examples)
        dev = load_eval(scored_evals(task)[0], "dev", root, hf=False)[: dev_examples or None]
        out.append(
            ProbeSet(
                get_task(task).name,
                encode_examples(tokenizer, train, max_len, arch),
                encode_examples(tokenizer, dev, max_len, arch),
            )
        )
    return out


@torch.no_grad()
def pooled_features(model, encoded: Sequence[dict], pad_id: int, autocast=None) -> np.ndarray:
    """(N, D) float32: each example's last hidden states, mean-pooled over its real tokens. Batches hold
    examples of similar length (sorted), so little of a forward is padding."""
    import contextlib

    from lm.glue.encode import collate
    from lm.model.heads import pool

    device = next(model.parameters()).device
    order = np.argsort([len(e["input_ids"]) for e in encoded], kind="stable")
    out = np.zeros((len(encoded), model.cfg.dim), dtype=np.float32)
    for i in range(0, len(order), BATCH):
        rows = order[i : i + BATCH]
        b = collate([encoded[r] for r in rows], pad_id)
        ids, mask, types = (b[k].to(device) for k in ("input_ids", "attention_mask", "token_type_ids"))
        with autocast() if autocast else contextlib.nullcontext():
            h = hidden_states(model, ids, mask, types)  # (B, T, D)
        out[rows] = pool(h.float(), mask, "mean").cpu().numpy()
    return out


def hidden_states(model, ids, mask, types) -> torch.Tensor:
    """The top layer's states (B, T, D): an encoder-decoder's encoder; every other family's features()."""
    if model.cfg.arch == "encoder_decoder":
        memory = model.encode(ids, mask)
        return memory[-1] if isinstance(memory, list) else memory  # transparent attention: one per layer
    return model.features(ids, mask, types)


def fit_and_score(
    task: str, x_train: np.ndarray, y_train, x_dev: np.ndarray, y_dev, regression: bool, strength: float = 1.0
) -> float:
    """The task's official dev score (points) of a standardized linear probe fit on the train features;
    `strength` scales the regularisation (logistic C = 1 / strength, ridge alpha = strength)."""
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from lm.glue.metrics import compute_metrics
    from lm.glue.tasks import scored_evals

    if not regression and len(set(y_train)) < 2:
        raise ConfigError(
            f"the {task} probe's train rows hold one class only; probe more of them "
            f"(train.probe_train_examples, or --limit)"
        )
    head = Ridge(alpha=strength) if regression else LogisticRegression(max_iter=1000, C=1.0 / strength)
    probe = make_pipeline(StandardScaler(), head).fit(x_train, y_train)
    return compute_metrics(scored_evals(task)[0], probe.predict(x_dev), y_dev)["score"]


def probe_model(model, sets: Sequence[ProbeSet], pad_id: int, autocast=None) -> dict[str, float]:
    """{"probe/<task>": score, "probe/avg": their mean} for `model` (left in eval mode; the caller restores)."""
    model.eval()
    scores = {}
    for s in sets:
        x_tr, x_dev = pooled_features(model, s.train, pad_id, autocast), pooled_features(model, s.dev, pad_id, autocast)
        y_tr, y_dev = [e["labels"] for e in s.train], [e["labels"] for e in s.dev]
        scores[f"probe/{s.task}"] = fit_and_score(s.task, x_tr, y_tr, x_dev, y_dev, s.regression)
    scores["probe/avg"] = fmean(scores.values())
    return scores


class GlueProbe(PacedEval):
    """The loop's evaluation callback (lm.core.task.EvalCallback) for train.probe_interval, paced by
    train.downstream_budget (lm/eval/pacing.py); its first pass's cost is estimated from its forward tokens."""

    what = "GLUE probe"

    def __init__(self, sets: Sequence[ProbeSet], pad_id: int, interval: int, **pacing):
        self.sets, self.pad_id = list(sets), pad_id
        work = sum(len(e["input_ids"]) for s in self.sets for e in s.train + s.dev)
        super().__init__(interval, work_tokens=work, **pacing)

    def evaluate(self, engine, step: int) -> dict:
        t0 = time.perf_counter()
        model = engine.module
        training = model.training
        devices = [engine.device] if engine.device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=devices):  # the training RNG stream stays as it was
                record = probe_model(model, self.sets, self.pad_id, engine.autocast)
        finally:
            model.train(training)
        record["probe/seconds"] = round(time.perf_counter() - t0, 3)
        log.info("step %d: %s", step, ", ".join(f"{k[6:]} {v:.1f}" for k, v in record.items() if k != "probe/seconds"))
        return record


def probe_callbacks(train_cfg, model_cfg, data_dir, engine) -> list[GlueProbe]:
    """[GlueProbe] when train.probe_interval is set (else []), reading the run's tokenizer from data_dir.
    Raises ConfigError naming the fix when the engine shards the weights or the tokenizer is missing."""
    if not train_cfg.probe_interval:
        return []
    from lm.extras import require

    t0 = time.perf_counter()
    require("eval", "train.probe_interval", "sklearn")
    if engine.format == "dcp" or getattr(engine, "stage", 0) == 3:
        raise ConfigError(
            f"train.probe_interval probes the whole model on rank 0, and {engine.name} shards it; "
            f"set train.probe_interval=0 and probe a checkpoint (lm eval <run> --tasks probe)"
        )
    pacing = pacing_of(train_cfg, engine)
    if not engine.is_main:  # the other ranks only keep the same sync points (rank 0's budget decides)
        return [GlueProbe([], 0, train_cfg.probe_interval, **pacing)]
    tokenizer = run_tokenizer(data_dir)
    sets = load_probe_sets(
        tokenizer,
        model_cfg.arch,
        train_cfg.probe_tasks,
        train_cfg.probe_train_examples,
        train_cfg.probe_dev_examples,
        min(train_cfg.probe_max_len, model_cfg.max_seq_len),
    )
    setup = time.perf_counter() - t0  # the import, the reading and encoding: the budget pays for them too
    return [GlueProbe(sets, tokenizer.pad_id, train_cfg.probe_interval, setup=setup, **pacing)]


def run_tokenizer(data_dir, option: str = "train.probe_interval", off: str = "train.probe_interval=0"):
    """The run's tokenizer (data_dir/tokenizer.json), or a ConfigError naming `option` and how to turn it `off`."""
    from pathlib import Path

    from lm.data.tokenizer import Tokenizer

    path = Path(data_dir).expanduser() / "tokenizer.json"
    if not path.is_file():
        raise ConfigError(
            f"{option} needs the run's tokenizer, {path}, which is not there; "
            f"prepare the data first (lm prepare) or set {off}"
        )
    return Tokenizer.load(path.parent)
