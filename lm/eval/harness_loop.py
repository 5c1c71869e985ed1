"""The LM Evaluation Harness in the training loop (train.eval_tasks): its tasks on the current model every
train.eval_tasks_interval steps and at the end, paced by train.downstream_budget (lm/eval/pacing.py), logged
as `harness/<task>/<metric>` beside the loss. Rank 0 evaluates the whole model (engine.module) through
lm/eval/harness.py's LMAdapter, as `lm eval` does a checkpoint; the model's mode and every RNG the harness
seeds (torch, numpy, python) are restored, so a run with it trains and resumes exactly as one without.
"""

from __future__ import annotations

import logging
import random
import time

import numpy as np
import torch

from lm.config import ConfigError
from lm.eval.pacing import PacedEval, pacing_of

log = logging.getLogger("lm")


class HarnessEval(PacedEval):
    """lm.core.task.EvalCallback for train.eval_tasks; its first pass runs at its first due step (its cost is
    not known before)."""

    what = "harness evaluation"

    def __init__(self, tasks, tokenizer, limit: int | None, interval: int, **pacing):
        self.tasks, self.tokenizer, self.limit = list(tasks), tokenizer, limit
        super().__init__(interval, **pacing)

    def evaluate(self, engine, step: int) -> dict:
        from lm.eval.harness import LMAdapter, evaluate, harness_metrics

        t0 = time.perf_counter()
        model = engine.module
        training = model.training
        devices = [engine.device] if engine.device.type == "cuda" else []
        seeded = random.getstate(), np.random.get_state()  # simple_evaluate seeds python's and numpy's RNGs
        try:
            with torch.random.fork_rng(devices=devices), torch.no_grad():
                adapter = LMAdapter(model, self.tokenizer, device=str(engine.device))
                out = evaluate(adapter, self.tasks, limit=self.limit)
        finally:
            model.train(training)
            random.setstate(seeded[0])
            np.random.set_state(seeded[1])
        record = {f"harness/{t}/{m}": v for t, metrics in harness_metrics(out).items() for m, v in metrics.items()}
        record["harness/seconds"] = round(time.perf_counter() - t0, 3)
        log.info("step %d: %s", step, ", ".join(f"{k[8:]} {v:.4g}" for k, v in record.items()))
        return record


def check_tasks(train_cfg, model_cfg) -> float:
    """Refuse what train.eval_tasks cannot evaluate, before lm train touches the data, the model or the run_dir (it
    was refused after them, a resume=false run's earlier job already set aside): a missing extra, an encoder, a task
    nobody registered (named with the closest, as lm eval does: refuse_unknown), a perplexity task for an
    encoder-decoder. Rank 0's (indexing the harness's tasks takes seconds); returns its seconds, which
    harness_callbacks charges to the budget."""
    if not train_cfg.eval_tasks:
        return 0.0
    from lm.extras import require

    t0 = time.perf_counter()
    require("eval", "train.eval_tasks", "lm_eval")
    if model_cfg.arch == "encoder":
        raise ConfigError(
            "train.eval_tasks scores left-to-right likelihoods, which an encoder (masked LM) has none of; "
            "use the GLUE probes (train.probe_interval) or set train.eval_tasks=[]"
        )
    from lm.eval.harness import HarnessError, refuse_unknown, refuse_unscorable, task_manager

    try:
        refuse_unknown(train_cfg.eval_tasks, "train.eval_tasks")  # a local_ typo: before the harness's index
        index = task_manager(train_cfg.eval_tasks)  # lm's offline tasks alone when only they are named (fast)
        refuse_unknown(train_cfg.eval_tasks, "train.eval_tasks", index)
        # an encoder-decoder's perplexity task would fail at the first pass, after the training it ran
        refuse_unscorable(index, train_cfg.eval_tasks, model_cfg.arch, "train.eval_tasks")
    except HarnessError as e:
        raise ConfigError(str(e)) from None
    return time.perf_counter() - t0


def harness_callbacks(train_cfg, tokenizer_of, engine, checked: float = 0.0) -> list[HarnessEval]:
    """[HarnessEval] when train.eval_tasks is set (else []), its tasks checked already (check_tasks, `checked` its
    seconds); `tokenizer_of()` reads the run's tokenizer (rank 0). Raises ConfigError naming the fix for an engine
    that shards the weights."""
    if not train_cfg.eval_tasks:
        return []
    t0 = time.perf_counter()
    if engine.format == "dcp" or getattr(engine, "stage", 0) == 3:
        raise ConfigError(
            f"train.eval_tasks evaluates the whole model on rank 0, and {engine.name} shards it; "
            f"set train.eval_tasks=[] and evaluate a checkpoint (lm eval <run> --tasks ...)"
        )
    tokenizer = tokenizer_of() if engine.is_main else None
    interval, pacing = train_cfg.eval_tasks_interval, pacing_of(train_cfg, engine)
    setup = checked + time.perf_counter() - t0  # importing the harness, indexing its tasks: charged to the budget
    return [HarnessEval(train_cfg.eval_tasks, tokenizer, train_cfg.eval_tasks_limit, interval, setup=setup, **pacing)]
