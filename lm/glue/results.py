"""Dev results over seeds: results.json and a Markdown table (per column, per seed, median, GLUE score).

Input: {column: {seed: metrics}} with metrics as compute_metrics returns them (points, x100).
The median column is the per-metric median over seeds (the mean of the middle two for an even
count), the usual way to report small-data GLUE tasks (RoBERTa, ELECTRA); its "score" is the mean
of those medians. The GLUE row's median is
the GLUE score of the per-column medians; a seed's GLUE score is given only when every column ran that seed (else
it would average other tasks than the median's). When a task is missing (QQP and MNLI, say, on a laptop)
the GLUE score is the mean over the tasks present and is labelled partial in both files.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from statistics import fmean, median
from typing import Any

from lm.core.files import atomic_write_text
from lm.glue.grid_report import grid_table
from lm.glue.metrics import Metrics, glue_score, missing_tasks
from lm.glue.tasks import EVALS, GLUE_TASKS, METRIC_NAMES, TASKS, get_eval

UNITS = "points (x100), as on the GLUE leaderboard"
OWN_SCORE = "accuracy for classes, the mean of Pearson and Spearman for a score"


def _seed_order(seeds) -> list:
    return sorted(seeds, key=lambda s: (0, int(s)) if str(s).lstrip("-").isdigit() else (1, str(s)))


def _median(col: str, runs: Mapping[str, Metrics]) -> Metrics:
    """Per-metric medians; "score" is the mean of those (not the median of per-seed scores), so the
    table's median row and the GLUE score computed from it agree."""
    out = {k: median(r[k] for r in runs.values()) for k in EVALS[col].metrics}
    return {**out, "score": fmean(out[k] for k in EVALS[col].scored)}


def summarize(dev: Mapping[str, Mapping[Any, Metrics]]) -> dict[str, Any]:
    """The content of results.json."""
    cols = {get_eval(c).name: {str(s): dict(m) for s, m in runs.items()} for c, runs in dev.items()}
    cols = {c: cols[c] for c in EVALS if c in cols}  # leaderboard order
    for c, runs in cols.items():
        if not runs:
            raise ValueError(f"results for {c!r} hold no seeds")
    medians = {c: _median(c, runs) for c, runs in cols.items()}
    seeds = _seed_order({s for runs in cols.values() for s in runs})
    missing = missing_tasks(medians)
    # a seed's GLUE score averages the same tasks as the median's, or is None: a seed that only some tasks ran
    # (the single-seed presets: SST-2, QQP, MNLI, QNLI) would otherwise be scored on the small tasks alone
    per_seed = {
        s: glue_score({c: runs[s] for c, runs in cols.items()}, partial=True)
        if all(s in runs for runs in cols.values()) and len(missing) < len(GLUE_TASKS)
        else None
        for s in seeds
    }
    return {
        "units": UNITS,
        "columns": {
            c: {"name": EVALS[c].submission, "metrics": list(EVALS[c].metrics), "seeds": cols[c], "median": medians[c]}
            for c in cols
        },
        "glue": {
            "median": glue_score(medians, partial=True) if len(missing) < len(GLUE_TASKS) else None,
            "per_seed": per_seed,
            "partial": bool(missing),
            "missing_tasks": missing,
            "definition": "mean of the nine task scores (a task score is the mean of its metrics; MNLI's is the "
            "mean of MNLI-m and MNLI-mm accuracy); AX is not included",
        },
    }


def results_table(summary: Mapping[str, Any]) -> str:
    """Markdown: one row per leaderboard column, one column per seed, then the median."""
    cols, glue = summary["columns"], summary["glue"]
    seeds = _seed_order({s for c in cols.values() for s in c["seeds"]})

    def cell(m: Metrics | None, keys) -> str:
        return "/".join(f"{m[k]:.1f}" for k in keys) if m else "–"

    lines = [
        "| task | metric | " + " | ".join(f"seed {s}" for s in seeds) + " | median |",
        "|---|---|" + "---:|" * (len(seeds) + 1),
    ]
    for c, r in cols.items():
        keys = r["metrics"]
        lines.append(
            f"| {r.get('name') or EVALS[c].submission} | {'/'.join(METRIC_NAMES[k] for k in keys)} | "
            + " | ".join(cell(r["seeds"].get(s), keys) for s in seeds)
            + f" | {cell(r['median'], keys)} |"
        )
    if len(glue["missing_tasks"]) == len(GLUE_TASKS):  # task=own alone: no GLUE task, no GLUE row
        notes = [f"Dev-set results in points (x100). Median over seeds per metric (score: {OWN_SCORE})."]
        return "\n".join(["# Dev results", "", *notes, "", *lines]) + "\n" + _grid(summary)
    fmt = lambda v: "–" if v is None else f"{v:.1f}"  # noqa: E731
    label = "GLUE" if not glue["partial"] else f"GLUE (partial, {len(GLUE_TASKS) - len(glue['missing_tasks'])}/9)"
    lines.append(
        f"| {label} | score | "
        + " | ".join(fmt(glue["per_seed"].get(s)) for s in seeds)
        + f" | {fmt(glue['median'])} |"
    )
    notes = [
        f"Dev-set results in {summary['units']}. Median over seeds per metric; the GLUE median is the GLUE "
        f"score of the medians. GLUE score: {glue['definition']}."
    ]
    if glue["partial"]:
        names = ", ".join(TASKS[t].dir for t in glue["missing_tasks"])
        notes.append(
            f"The GLUE score is partial: no results for {names}; it averages the tasks present only "
            f"and is not comparable with leaderboard scores."
        )
    return "\n".join(["# GLUE dev results", "", *notes, "", *lines]) + "\n" + _grid(summary)


def _grid(summary: Mapping[str, Any]) -> str:
    """lm finetune protocol=...: the chosen cells and each task's grid."""
    return "\n" + grid_table(summary["protocol"]) if "protocol" in summary else ""


def write_results(dev: Mapping[str, Mapping[Any, Metrics]], out_dir, extra: dict | None = None) -> tuple[Path, Path]:
    """Write <out_dir>/results.json and <out_dir>/results.md atomically; returns both paths."""
    summary = summarize(dev)
    if extra:
        summary = {**summary, **{k: v for k, v in extra.items() if k not in summary}}
    out = Path(out_dir)
    return (
        atomic_write_text(out / "results.json", json.dumps(summary, indent=2, sort_keys=False) + "\n"),
        atomic_write_text(out / "results.md", results_table(summary)),
    )
