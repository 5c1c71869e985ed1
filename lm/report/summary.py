"""One row of numbers per run: size, cost, speed and loss, read from its config and metrics.

Loss "early" and "final" follow Narang et al. (2021), who report the loss at 65k of 524k steps
(1/8 of training) and at the end. Validation loss is used when the run evaluated (it is the
same held-out data for every cell); otherwise the train loss, averaged over a window so one
noisy batch does not decide a comparison. Speeds are medians over logged steps after the first
(the first includes start-up and compilation), which also shrugs off other jobs briefly stealing
the shared CPU.
"""

from __future__ import annotations

import functools
import json
import statistics
from typing import Any

from lm.report.runs import Run, _number, max_steps

EARLY_FRACTION = 1 / 8
WINDOW_FRACTION = 0.05  # train-loss smoothing window, as a fraction of the run's steps


def seq_len(run: Run) -> int | None:
    for key in ("train.seq_len", "model.max_seq_len"):
        v = run.get(key)
        if _number(v):
            return int(v)
    return None


# A model field added since whose default is not how a config saved before it ran: model.sparse_prediction (on since
# e7ce54d, 2026-11-28: the same loss, the MLM head at the masked positions only). An older encoder ran its head on
# every position and logged its MFU with that count; read with today's default its FLOPs were 16% short (BERT-like,
# dim 32, vocabulary 256). Only the cost reads this: a resume or a comparison treats the field as today's. Only an
# encoder's MLM head reads the field; set on another model it is refused (an RNN's check: a Transformer field off its
# default), and an older LSTM run lost its cost.
SAVED_BEFORE = {"sparse_prediction": False}


def model_cost(run: Run) -> tuple:
    """(parameters, training FLOPs per token) of the run's model config (config.yaml's `model`): the count its
    MFU was logged with (an encoder-decoder's span-corruption lengths from its `data` section)."""
    if not isinstance(run.get("model"), dict):
        return None, None
    span = tuple(run.get(f"data.{k}") for k in ("noise_density", "mean_span_length"))
    model = run.get("model")
    if model.get("arch") == "encoder":
        model = {**SAVED_BEFORE, **model}
    return _cost_from_config(json.dumps(model, sort_keys=True), seq_len(run), span)


@functools.lru_cache(maxsize=256)
def _cost_from_config(model_json: str, T: int | None, span: tuple) -> tuple:
    """Cached: every seed of a variant has the same model, and each count builds it on meta."""
    try:
        from lm.model.config import model_from_saved
        from lm.model.flops import num_params

        cfg = model_from_saved(json.loads(model_json))
        return num_params(cfg), _flops_per_token(cfg, T or cfg.max_seq_len, span)
    except Exception:  # an old or foreign config: the table shows a blank, not a crash
        return None, None


def _flops_per_token(cfg, T: int, span: tuple) -> float:
    """As lm train counts them; a config without the data fields has their defaults."""
    from lm.core.objectives import training_flops_per_token
    from lm.data.config import DataConfig

    defaults = (DataConfig.noise_density, DataConfig.mean_span_length)
    return training_flops_per_token(cfg, T, *(v if _number(v) else d for v, d in zip(span, defaults)))


def loss_series(run: Run) -> tuple:
    """(name, [(step, loss)]) of the series that early/final loss are read from."""
    if run.val:
        return "val_loss", [(e.get("step", 0), e["val_loss"]) for e in run.val]
    pts = [(e.get("step", i), e["loss"]) for i, e in enumerate(run.train) if _number(e.get("loss"))]
    return "loss", pts


def value_at(points: list, step: float, window: float) -> float | None:
    """Mean of the points in (step - window, step]; else the first point after step."""
    if not points:
        return None
    # window 0 (validation): the evaluation at `step` itself, else the next one
    inside = [v for s, v in points if (step - window < s <= step if window else s == step)]
    if inside:
        return sum(inside) / len(inside)
    after = [v for s, v in points if s > step]
    return after[0] if after else points[-1][1]


def early_final_loss(run: Run, early_fraction: float = EARLY_FRACTION) -> tuple:
    name, pts = loss_series(run)
    if not pts:
        return name, None, None
    last = max(s for s, _ in pts)
    total = max_steps(run) or last
    window = 0 if name == "val_loss" else max(1.0, WINDOW_FRACTION * total)
    early = value_at(pts, early_fraction * total, window)
    final = value_at(pts, last, window)
    return name, early, final


def _median(values: list) -> float | None:
    values = [v for v in values if _number(v)]
    return statistics.median(values) if values else None


def speeds(run: Run) -> tuple:
    """(steps/s, tokens/s) as medians over logged steps after the first."""
    steady = run.train[1:] if len(run.train) > 1 else run.train
    return _median([e.get("steps_per_s") for e in steady]), _median([e.get("tokens_per_s") for e in steady])


def peak_memory(run: Run) -> float | None:
    """Largest memory value logged (GiB, lm/core/loop.py's "memory")."""
    values = [e.get("memory") for e in run.train if _number(e.get("memory"))]
    return max(values) if values else None


def glue_score(run: Run) -> float | None:
    """The GLUE score of lm finetune's results.json (lm/glue/results.py): the score of the per-task medians."""
    glue = run.results.get("glue") if isinstance(run.results, dict) else None
    v = glue.get("median") if isinstance(glue, dict) else None
    return float(v) if _number(v) else None


PROBE_AVG = "probe/avg"  # lm/eval/probe.py's record (train.probe_interval): the mean of the probed tasks' scores


def probe_score(run: Run) -> float | None:
    """The last GLUE probe average the run logged (points), or None when it ran no probes."""
    values = [e[PROBE_AVG] for e in sorted(run.other, key=lambda e: e.get("step", 0)) if _number(e.get(PROBE_AVG))]
    return values[-1] if values else None


def summarize(run: Run, early_fraction: float = EARLY_FRACTION) -> dict[str, Any]:
    params, flops = model_cost(run)
    steps_per_s, tokens_per_s = speeds(run)
    series, early, final = early_final_loss(run, early_fraction)
    return {
        "params": params,
        "flops_per_token": flops,
        "steps_per_s": steps_per_s,
        "tokens_per_s": tokens_per_s,
        "early_loss": early,
        "final_loss": final,
        "loss_series": series,
        "mfu": _median([e.get("mfu") for e in run.train[1:]]),
        "peak_memory": peak_memory(run),
        "glue": glue_score(run),
        "probe": probe_score(run),
        "last_step": run.last_step,
        "max_steps": max_steps(run),
    }
