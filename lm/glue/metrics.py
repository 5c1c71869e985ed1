"""GLUE metrics, task scores and the GLUE score, as the leaderboard computes them.

Every value is in points (x100), as on the leaderboard: accuracy 0.845 is reported as 84.5.

- CoLA: Matthews correlation. SST-2, MNLI-m, MNLI-mm, QNLI, RTE, WNLI: accuracy. MRPC, QQP: F1 of
  the positive class (1 = paraphrase / duplicate) and accuracy. STS-B: Pearson and Spearman
  correlation. AX: R3, the 3-class Matthews correlation.
- Task score: the unweighted mean of a column's metrics (MRPC (F1+acc)/2, STS-B (P+S)/2, QQP
  (F1+acc)/2); MNLI's task score is the mean of its MNLI-m and MNLI-mm accuracies.
- GLUE score: the unweighted mean of the nine task scores; AX is not in it. (Wang et al. 2019,
  sec. 4: "for tasks with multiple metrics we first average those metrics to get a task score".)
  The test in tests/test_glue_metrics.py checks this against published leaderboard rows: BERT-large
  80.5, BERT-base 78.3, ERNIE 2.0 large 83.6. Counting MNLI-m and MNLI-mm as two of ten tasks
  instead would give 81.1 for BERT-large, which is not what the leaderboard shows.

`compute_metrics` returns the column's metrics plus "score" (its task score). STS-B predictions
are clipped to [0, 5] first, as `write_submission` writes them, so dev numbers match what the
leaderboard would score. A correlation of a constant prediction is undefined; it counts as 0 (as
scikit-learn's MCC does), so that model selection never compares against nan.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from statistics import fmean

import numpy as np

from lm.glue.tasks import EVALS, GLUE_TASKS, get_eval, get_task, scored_evals

Metrics = dict[str, float]


def as_predictions(name: str, preds) -> np.ndarray:
    """Class ids from ids or (N, n_labels) logits; floats for STS-B from (N,) or (N, 1) outputs."""
    task = get_task(get_eval(name).task)
    p = np.asarray(preds.detach().cpu() if hasattr(preds, "detach") else preds)
    if task.is_regression:
        if p.ndim == 2 and p.shape[1] == 1:
            p = p[:, 0]
        if p.ndim != 1:
            raise ValueError(f"{name}: STS-B predictions must be scores (N,) or (N, 1); got shape {p.shape}")
        p = p.astype(np.float64)  # STS-B's clipped to [0, 5]; a task=own score has no known range
        return np.clip(p, *task.score_range) if task.score_range else p
    if p.ndim == 2:
        p = p.argmax(-1)
    if p.ndim != 1 or (p.size and not np.issubdtype(p.dtype, np.integer)):
        raise ValueError(
            f"{name}: predictions must be class ids (N,) or logits (N, {task.n_labels}); got "
            f"shape {p.shape} dtype {p.dtype}"
        )
    if p.size and (p.min() < 0 or p.max() >= task.n_labels):
        raise ValueError(f"{name}: class ids must be in [0, {task.n_labels}); got {p.min()}..{p.max()}")
    return p


def compute_metrics(name: str, preds, labels) -> Metrics:
    """The leaderboard metrics of one column (cola, ..., mnli_m, mnli_mm, ax) in points, plus "score"."""
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    e = get_eval(name)
    p, y = as_predictions(e.name, preds), np.asarray(labels)
    if len(p) != len(y) or len(y) == 0:
        raise ValueError(f"{e.name}: {len(p)} predictions for {len(y)} labels; need the same, non-zero number")
    fns = {
        "acc": lambda: accuracy_score(y, p),
        "f1": lambda: f1_score(y, p, pos_label=1, zero_division=0.0),
        "mcc": lambda: matthews_corrcoef(y, p),
        "pearson": lambda: _correlation(pearsonr, p, y),
        "spearman": lambda: _correlation(spearmanr, p, y),
    }
    out = {m: 100.0 * float(fns[m]()) for m in e.metrics}
    out["score"] = fmean(out[m] for m in e.scored)
    return out


def _correlation(fn, p, y) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns on constant input; the result is nan
        r = float(fn(p, y)[0])
    return 0.0 if np.isnan(r) else r


def task_score(task: str, metrics: Mapping[str, Metrics]) -> float:
    """A task's GLUE score from {column: metrics}: the mean of its scored columns' scores (MNLI: m and mm)."""
    cols = scored_evals(task)
    missing = [c for c in cols if c not in metrics]
    if missing:
        raise KeyError(f"task {task!r} needs metrics for {list(cols)}; missing {missing}")
    return fmean(fmean(metrics[c][m] for m in EVALS[c].scored) for c in cols)


def missing_tasks(metrics: Mapping[str, Metrics]) -> list:
    return [t for t in GLUE_TASKS if any(c not in metrics for c in scored_evals(t))]


def glue_score(metrics: Mapping[str, Metrics], partial: bool = False) -> float:
    """The leaderboard's GLUE score from {column: metrics}; partial=True averages the tasks present."""
    missing = missing_tasks(metrics)
    if missing and not partial:
        raise KeyError(
            f"the GLUE score needs all nine tasks; missing {missing} (pass partial=True for the mean "
            f"over the tasks present, and say so wherever it is reported)"
        )
    present = [t for t in GLUE_TASKS if t not in missing]
    if not present:
        raise KeyError(f"no GLUE task has metrics; got columns {sorted(metrics)}")
    return fmean(task_score(t, metrics) for t in present)


def main_metric(task: str, metrics: Mapping[str, Metrics], key: str = "score") -> float:
    """The number model selection maximises: "score" (the task score), a metric such as "f1" of the
    task's only scored column, or "<column>/<metric>" such as "mnli_m/acc"."""
    if key == "score":
        return task_score(task, metrics)
    cols = scored_evals(task)
    if "/" not in key:
        if len(cols) != 1:
            raise KeyError(
                f"task {task!r} has several columns {list(cols)}; name one as '<column>/{key}' "
                f"(e.g. '{cols[0]}/{key}') or use 'score'"
            )
        key = f"{cols[0]}/{key}"
    col, m = key.split("/", 1)
    return metrics[col][m]


def metric_keys(task: str) -> Sequence[str]:
    """The names main_metric accepts for `task`."""
    cols = scored_evals(task)
    keys = ["score", *(f"{c}/{m}" for c in cols for m in (*EVALS[c].metrics, "score"))]
    return keys + (list(EVALS[cols[0]].metrics) if len(cols) == 1 else [])
