"""The Narang et al. (2021) Table 1 layout of a sweep report (`lm train -m experiment=narang`).

Used when every variant of a sweep is a row of lm/sweep/narang_rows.py (labelled
`experiment/narang_row=<name>`): rows in the paper's order under the paper's labels, the paper's
columns (Params, Ops = training FLOPs per token, Steps/s, Early loss, Final loss, and GLUE where the
runs were finetuned), and the deltas against the vanilla row. The paper reports downstream scores beside
the losses; here the Probe column stands in for them while pretraining: the last GLUE probe average
(train.probe_interval, lm/eval/probe.py; "–" for a row whose runs probed nothing). Early loss is read at 1/4 of the
steps (issue #19; the paper's 65k of 524k steps is 1/8, too early in a run of a few hundred steps).
"""

from __future__ import annotations

from lm.report.stats import fmt_mean_std
from lm.report.table import _delta, _params, _status, human
from lm.sweep.narang_rows import PAPER_ORDER, paper_rank, row_of

EARLY_FRACTION = 1 / 4


def applies(variants: list) -> bool:
    return bool(variants) and all(row_of(v.label) is not None for v in variants)


def order(variants: list) -> list:
    """Variants in the paper's row order (Table 1)."""
    return sorted(variants, key=lambda v: paper_rank(row_of(v.label)))


def vanilla_index(variants: list) -> int | None:
    return next((i for i, v in enumerate(variants) if row_of(v.label).name == "vanilla"), None)


def markdown(rows: list) -> str:
    has_glue = any(r["glue"].n for r in rows)
    head = (
        ["Modification", "Seeds", "Params", "Ops", "Steps/s", "Early loss", "Final loss", "Δ early", "Δ final", "Probe"]
        + (["GLUE", "Δ GLUE"] if has_glue else [])
        + ["Status"]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [
            row_of(r["variant"]).paper,
            f"{r['n_ok']}/{r['n_runs']}",
            _params(r),
            human(r["flops_per_token"]),
            fmt_mean_std(r["steps_per_s"], 2),
            fmt_mean_std(r["early_loss"]),
            fmt_mean_std(r["final_loss"]),
            _delta(r, "early_loss"),
            _delta(r, "final_loss"),
            fmt_mean_std(r["probe"], 1),
        ]
        cells += [fmt_mean_std(r["glue"], 2), _delta(r, "glue")] if has_glue else []
        lines.append("| " + " | ".join(cells + [_status(r)]) + " |")
    missing = [p for p in PAPER_ORDER if p not in {row_of(r["variant"]).paper for r in rows}]
    lines += [
        "",
        f"Rows of Table 1 not in this sweep ({len(missing)} of {len(PAPER_ORDER)}): "
        + ("; ".join(missing) or "none")
        + ".",
    ]
    return "\n".join(lines) + "\n"
