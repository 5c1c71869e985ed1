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
import math
import statistics
from typing import Any, Optional

from lm.report.runs import Run, _number, max_steps

EARLY_FRACTION = 1 / 8
WINDOW_FRACTION = 0.05  # train-loss smoothing window, as a fraction of the run's steps


def seq_len(run: Run) -> Optional[int]:
    for key in ("data.seq_len", "train.seq_len", "model.max_seq_len"):
        v = run.get(key)
        if _number(v):
            return int(v)
    return None


def _logged(run: Run, key: str) -> Optional[float]:
    """A value the engine logged once (e.g. n_params) in any metrics entry."""
    for e in run.other + run.train:
        if _number(e.get(key)):
            return e[key]
    return None


def model_cost(run: Run) -> tuple:
    """(parameters, training FLOPs per token) from logged values, else from the model config."""
    params, flops = _logged(run, "n_params"), _logged(run, "flops_per_token")
    if (params is None or flops is None) and isinstance(run.get("model"), dict):
        c_params, c_flops = _cost_from_config(json.dumps(run.get("model"), sort_keys=True), seq_len(run))
        params = params if params is not None else c_params
        flops = flops if flops is not None else c_flops
    return params, flops


@functools.lru_cache(maxsize=256)
def _cost_from_config(model_json: str, T: Optional[int]) -> tuple:
    """Cached: every seed of a variant has the same model, and each count builds it on meta."""
    try:
        from lm.model.config import model_from_saved
        from lm.model.flops import flops_per_token, num_params

        cfg = model_from_saved(json.loads(model_json))
        return num_params(cfg), flops_per_token(cfg, T or cfg.max_seq_len)
    except Exception:  # an old or foreign config: the table shows a blank, not a crash
        return None, None


def loss_series(run: Run) -> tuple:
    """(name, [(step, loss)]) of the series that early/final loss are read from."""
    if run.val:
        return "val_loss", [(e.get("step", 0), e["val_loss"]) for e in run.val]
    pts = [(e.get("step", i), e["loss"]) for i, e in enumerate(run.train) if _number(e.get("loss"))]
    return "loss", pts


def value_at(points: list, step: float, window: float) -> Optional[float]:
    """Mean of the points in (step - window, step]; else the first point after step."""
    if not points:
        return None
    # window 0 (validation): the evaluation at `step` itself, else the next one
    inside = [v for s, v in points if (step - window < s <= step if window else s == step)]
    if inside:
        return sum(inside) / len(inside)
    after = [v for s, v in points if s > step]
    return after[0] if after else points[-1][1]


def early_final_loss(run: Run) -> tuple:
    name, pts = loss_series(run)
    if not pts:
        return name, None, None
    last = max(s for s, _ in pts)
    total = max_steps(run) or last
    window = 0 if name == "val_loss" else max(1.0, WINDOW_FRACTION * total)
    early = value_at(pts, EARLY_FRACTION * total, window)
    final = value_at(pts, last, window)
    return name, early, final


def _median(values: list) -> Optional[float]:
    values = [v for v in values if _number(v)]
    return statistics.median(values) if values else None


def speeds(run: Run) -> tuple:
    """(steps/s, tokens/s) as medians over logged steps after the first."""
    steady = run.train[1:] if len(run.train) > 1 else run.train
    tokens_per_s = _median([e.get("tokens_per_s") for e in steady])
    steps_per_s = _median([e.get("steps_per_s") for e in steady])
    if steps_per_s is None and tokens_per_s is not None:
        per_step = _tokens_per_step(run)
        steps_per_s = tokens_per_s / per_step if per_step else None
    return steps_per_s, tokens_per_s


def _tokens_per_step(run: Run) -> Optional[float]:
    pts = [(e["step"], e["tokens"]) for e in run.train if _number(e.get("step")) and _number(e.get("tokens"))]
    if len(pts) >= 2 and pts[-1][0] > pts[0][0]:
        return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])
    return None


def peak_memory(run: Run) -> Optional[float]:
    """Largest memory value logged (the engine's unit, GiB or a dict of them)."""
    values = []
    for e in run.train:
        m = e.get("memory")
        if isinstance(m, dict):
            m = next((m[k] for k in ("peak", "max_allocated", "peak_gib", "rss") if _number(m.get(k))), None)
        values.append(m)
    values = [v for v in values if _number(v)]
    return max(values) if values else None


def glue_score(run: Run) -> Optional[float]:
    res = run.results
    if not isinstance(res, dict):
        return None
    for key in ("glue_score", "glue", "score", "average"):
        v = res.get(key)
        if isinstance(v, dict):
            v = v.get("score", v.get("mean"))
        if _number(v):
            return float(v)
    return None


def summarize(run: Run) -> dict[str, Any]:
    params, flops = model_cost(run)
    steps_per_s, tokens_per_s = speeds(run)
    series, early, final = early_final_loss(run)
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
        "last_step": run.last_step,
        "max_steps": max_steps(run),
    }


def is_missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))
