"""The sweep report: table (Markdown + CSV), plots (PNG) and one HTML page, in one directory.

Files are written under temporary names and renamed, and report.html comes last (an earlier report's is removed
first), so a report directory with report.html in it is complete, never a stopped rewrite beside an old page.
"""

from __future__ import annotations

from pathlib import Path

from lm.core.files import atomic_write_text
from lm.report import plots, table
from lm.report.html import to_html
from lm.report.paths import portable
from lm.report.stats import RULE
from lm.report.summary import EARLY_FRACTION, WINDOW_FRACTION
from lm.report.variants import setup_of

FILES = ["report.md", "report.html", "report.csv", "runs.csv", "loss_curves.png", "final_loss.png"]  # what it writes


def _setup_lines(runs: list, forced_differences: bool) -> list:
    setups = [setup_of(r) for r in runs if r.config]
    common = {k: v for k, v in (setups[0] if setups else {}).items() if all(s.get(k) == v for s in setups)}
    seeds = sorted({table.seed_of(r) for r in runs}, key=lambda s: (0, s, "") if isinstance(s, int) else (1, 0, str(s)))
    lines = [
        "- data and budget (identical for every run): "
        + (", ".join(f"`{k}={v}`" for k, v in common.items()) or "not recorded"),
        f"- seeds: {', '.join(map(str, seeds))}",  # 0, 1, 2, 10: in number order
    ]
    if forced_differences:
        lines.append(
            "- **forced**: these runs differ in data or budget (`--force`); their losses are not strictly comparable"
        )
    return lines


def _loss_note(rows: list, early_fraction: float = EARLY_FRACTION) -> str:
    series = next((r["loss_series"] for r in rows if r["loss_series"]), "loss")
    if series == "val_loss":
        return (
            f"- loss: validation loss; *early* = the evaluation at {early_fraction:.3g} of the steps "
            "(Narang et al. 2021 report 65k of 524k), *final* = the last evaluation"
        )
    return (
        f"- loss: training loss (no validation logged), mean over a window of "
        f"{WINDOW_FRACTION:.0%} of the steps; *early* at {early_fraction:.3g} of the steps, *final* at the end"
    )


def markdown_report(
    variants: list, rows: list, runs: list, title: str, notes: str, command: str, forced_differences: bool, layout=None
) -> str:
    """layout: a module with EARLY_FRACTION and markdown(rows) (lm/report/narang.py); None = table.py's."""
    base = next(r["variant"] for r in rows if r["is_baseline"])
    parts = [
        f"# {title}",
        "",
        f"{len(runs)} runs in {len(variants)} variants. Made with `{command}`.",
        "",
        "## Setup",
        "",
        *_setup_lines(runs, forced_differences),
        _loss_note(rows, layout.EARLY_FRACTION if layout else EARLY_FRACTION),
        "- speed: median over logged steps after the first (steps/s, tokens/s per run), then mean ± std over seeds",
        f"- params and FLOPs/token (training, forward + backward) are computed from each run's model config; "
        f"⚠ marks a variant whose size differs from the baseline's by more than {table.PARAM_MISMATCH:.0%}",
        f"- seed noise: {RULE}. `*` marks a difference with p < 0.05; baseline: `{base}`",
        "",
        "## Results",
        "",
        (layout.markdown if layout else table.markdown)(rows),
    ]
    for key, heading in (
        ("failed", "Failed runs"),
        ("running", "Runs still training (not in the numbers yet)"),
        ("repeated", "Runs repeated (the same variant and seed as an earlier run: counted once)"),
    ):
        unfinished = [(p, why) for r in rows for p, why in r[key]]
        if unfinished:
            parts += [f"## {heading}", ""] + [f"- `{p}`: {why}" for p, why in unfinished] + [""]
    if notes:
        parts += [notes.strip(), ""]
    parts += [
        "## Plots",
        "",
        "![loss curves](loss_curves.png)",
        "",
        "![final loss](final_loss.png)",
        "",
        "Per-variant numbers: [report.csv](report.csv); per-run numbers: [runs.csv](runs.csv).",
        "",
    ]
    return "\n".join(parts)


def write_sweep_report(
    variants: list,
    runs: list,
    out: Path,
    title: str,
    command: str,
    notes: str = "",
    baseline: int = 0,
    forced_differences: bool = False,
    layout=None,
) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.html").unlink(missing_ok=True)  # the mark of a complete report: written again last
    rows = table.build_rows(variants, baseline, layout.EARLY_FRACTION if layout else EARLY_FRACTION)
    plots.loss_curves(variants, out / "loss_curves.png")
    plots.final_loss(rows, out / "final_loss.png")
    atomic_write_text(out / "report.csv", table.variants_csv(rows))
    atomic_write_text(out / "runs.csv", table.runs_csv(rows))
    md = portable(markdown_report(variants, rows, runs, title, notes, command, forced_differences, layout))
    atomic_write_text(out / "report.md", md)
    atomic_write_text(out / "report.html", to_html(md, title, out))
    return out / "report.html"
