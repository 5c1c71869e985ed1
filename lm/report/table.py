"""The comparison table in the style of Narang et al. (2021, Table 1): one row per variant with
parameters, FLOPs per token, speed, early and final loss and GLUE, mean ± std over seeds, and
each variant's difference from the baseline with its Welch p-value. Written as Markdown and CSV
(per variant, and per run so every number can be traced back to its directory)."""

from __future__ import annotations

import csv
import io
from typing import Any

from lm.report.stats import Stat, describe, fmt_mean_std, significant, welch_p
from lm.report.summary import EARLY_FRACTION, summarize

METRICS = ("steps_per_s", "tokens_per_s", "early_loss", "final_loss", "glue", "probe")
COMPARED = ("early_loss", "final_loss", "glue")  # differences tested against seed noise
PARAM_MISMATCH = 0.02  # flag variants whose size differs from the baseline's by more than this


def seed_of(run) -> Any:
    return run.get("seed")  # lm train's top-level seed (conf/train.yaml)


def build_rows(variants: list, baseline: int = 0, early_fraction: float = EARLY_FRACTION) -> list:
    """One dict per variant: stats per metric, and deltas/p-values against variants[baseline]."""
    rows = []
    for v in variants:
        sums = [summarize(r, early_fraction) for r in v.ok_runs]
        all_sums = [summarize(r, early_fraction) for r in v.runs]  # size and cost do not need a finished run
        row = {
            "variant": v.label,
            "n_ok": len(v.ok_runs),
            "n_runs": len(v.runs),
            "params": _first([s["params"] for s in all_sums]),
            "flops_per_token": _first([s["flops_per_token"] for s in all_sums]),
            "loss_series": _first([s["loss_series"] for s in sums]) or "",
            "failed": [(r.path, r.reason) for r in v.failed_runs],
            "running": [(r.path, r.reason) for r in v.running_runs],
            "repeated": [(r.path, r.reason) for r in v.repeated_runs],
            "per_run": list(zip(v.runs, all_sums)),
        }
        for m in METRICS:
            row[m] = describe([s[m] for s in sums])
        rows.append(row)
    base = rows[baseline] if rows else None
    for row in rows:
        row["is_baseline"] = row is base
        for m in COMPARED:
            a, b = row[m], base[m]
            row[f"{m}_delta"] = (
                a.mean - b.mean if a.mean is not None and b.mean is not None and row is not base else None
            )
            row[f"{m}_p"] = welch_p(a, b) if row is not base else None
        row["param_ratio"] = (row["params"] / base["params"] - 1) if row["params"] and base["params"] else None
    return rows


def _first(values: list) -> Any | None:
    return next((v for v in values if v is not None), None)


def human(n: float | None) -> str:
    if n is None:
        return "–"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def _delta(row: dict, m: str) -> str:
    d, p = row[f"{m}_delta"], row[f"{m}_p"]
    if row["is_baseline"]:
        return "(baseline)"
    if d is None:
        return "–"
    mark = {True: " *", False: "", None: ""}[significant(p)]
    return f"{d:+.3f}{mark} (p={p:.2g})" if p is not None else f"{d:+.3f} (p n/a)"


def _status(row: dict) -> str:
    failed, running = row["failed"], row["running"]
    if not failed and not running:
        return "ok"
    if row["n_ok"] == 0 and not (failed and running):  # no result yet: the first run's reason says why
        return ("FAILED: " if failed else "running: ") + (failed or running)[0][1].replace("|", "/")
    counts = ((len(failed), "failed"), (len(running), "running"))
    return ", ".join(f"{n} of {row['n_runs']} {what}" for n, what in counts if n)


def _params(row: dict) -> str:
    r = row["param_ratio"]
    flag = f" ({r:+.1%} ⚠)" if r is not None and abs(r) > PARAM_MISMATCH else ""
    return human(row["params"]) + flag


def markdown(rows: list) -> str:
    has_glue = any(r["glue"].n for r in rows)
    has_probe = any(r["probe"].n for r in rows)
    series = next((r["loss_series"] for r in rows if r["loss_series"]), "loss")
    head = [
        "variant",
        "seeds",
        "params",
        "FLOPs/token",
        "steps/s",
        "tokens/s",
        f"early {series}",
        f"final {series}",
        "Δ final vs baseline",
    ]
    head += ["GLUE", "Δ GLUE"] if has_glue else []
    head += ["GLUE probe"] if has_probe else []
    head += ["status"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [
            f"`{r['variant']}`",
            f"{r['n_ok']}/{r['n_runs']}",
            _params(r),
            human(r["flops_per_token"]),
            fmt_mean_std(r["steps_per_s"], 2),
            fmt_mean_std(r["tokens_per_s"], 0),
            fmt_mean_std(r["early_loss"]),
            fmt_mean_std(r["final_loss"]),
            _delta(r, "final_loss"),
        ]
        cells += [fmt_mean_std(r["glue"], 2), _delta(r, "glue")] if has_glue else []
        cells += [fmt_mean_std(r["probe"], 1)] if has_probe else []
        cells += [_status(r)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _stat_cols(name: str, s: Stat) -> dict:
    return {f"{name}_mean": s.mean, f"{name}_std": s.std, f"{name}_n": s.n}


def variants_csv(rows: list) -> str:
    out = []
    for r in rows:
        rec = {
            "variant": r["variant"],
            "n_ok": r["n_ok"],
            "n_runs": r["n_runs"],
            "params": r["params"],
            "flops_per_token": r["flops_per_token"],
            "loss_series": r["loss_series"],
        }
        for m in METRICS:
            rec.update(_stat_cols(m, r[m]))
        for m in COMPARED:
            rec[f"{m}_delta"], rec[f"{m}_p"] = r[f"{m}_delta"], r[f"{m}_p"]
        rec["status"] = _status(r)
        out.append(rec)
    return _to_csv(out)


def runs_csv(rows: list) -> str:
    out = []
    for r in rows:
        for run, s in r["per_run"]:
            rec = {
                "variant": r["variant"],
                "run": str(run.path),
                "seed": seed_of(run),
                "status": run.status,
                "reason": run.reason,
            }
            rec.update(s)
            out.append(rec)
    return _to_csv(out)


def _to_csv(records: list) -> str:
    buf = io.StringIO()
    if records:
        w = csv.DictWriter(buf, fieldnames=list(records[0]), lineterminator="\n")
        w.writeheader()
        w.writerows({k: ("" if v is None else v) for k, v in rec.items()} for rec in records)
    return buf.getvalue()
