"""A run card for a single run: what was trained (config), how it went (curves), and what it
cost (parameters, FLOPs, throughput, MFU, memory), and what it attends to (the attention grid of the
final checkpoint on a fixed sentence, lm/report/attention_card.py)."""

from __future__ import annotations

import json
from pathlib import Path

from lm.core.files import atomic_write_text
from lm.report import attention_card, plots
from lm.report.attention_card import attention_section
from lm.report.html import to_html
from lm.report.paths import portable
from lm.report.runs import Run
from lm.report.summary import summarize
from lm.report.table import human

FILES = ["card.md", "card.html", "run_curves.png", *attention_card.FILES]  # what write_run_card may write


def _fmt(v, digits: int = 3) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) < 1e3 else human(v)
    return human(v) if isinstance(v, int) and abs(v) >= 1e4 else str(v)


def summary_table(run: Run) -> str:
    s = summarize(run)
    tokens = next((e["tokens"] for e in reversed(run.train) if isinstance(e.get("tokens"), (int, float))), None)
    rows = [
        ("status", run.status + (f": {run.reason}" if run.reason else "")),
        ("steps", f"{_fmt(s['last_step'])} of {_fmt(s['max_steps'])}"),
        ("tokens seen", _fmt(tokens)),
        ("parameters", _fmt(s["params"])),
        ("FLOPs per token (train)", _fmt(s["flops_per_token"])),
        ("steps/s (median)", _fmt(s["steps_per_s"])),
        ("tokens/s (median)", _fmt(s["tokens_per_s"])),
        ("MFU (median)", _fmt(s["mfu"])),
        ("peak memory (GiB)", _fmt(s["peak_memory"])),
        (f"early {s['loss_series']}", _fmt(s["early_loss"], 4)),
        (f"final {s['loss_series']}", _fmt(s["final_loss"], 4)),
        ("GLUE score", _fmt(s["glue"], 4)),
        ("GLUE probe average (last)", _fmt(s["probe"], 4)),
        *_harness_rows(run),
    ]
    return "| | |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows) + "\n"


def _harness_rows(run: Run) -> list[tuple[str, str]]:
    """The last train.eval_tasks pass's scores (metrics.jsonl's harness/<task>/<metric>), one row each."""
    last = next((e for e in reversed(run.other) if any(k.startswith("harness/") for k in e)), None)
    if last is None:
        return []
    return [
        (f"{k.removeprefix('harness/')} (step {_fmt(last.get('step'))})", _fmt(v, 4))
        for k, v in last.items()
        if k.startswith("harness/") and k != "harness/seconds" and isinstance(v, (int, float))
    ]


def markdown_card(run: Run, command: str, attention: list[str] | None = None) -> str:
    from omegaconf import OmegaConf

    parts = [
        f"# Run card: {run.name}",
        "",
        f"`{run.path}`. Made with `{command}`.",
        "",
        "## Summary",
        "",
        summary_table(run),
        "## Curves",
        "",
        "![curves](run_curves.png)",
        "",
    ]
    parts += attention or []  # lm/report/attention_card.py: the final checkpoint's attention grid
    if run.overrides:
        parts += ["## Overrides", "", "`" + " ".join(run.overrides) + "`", ""]
    if run.results is not None:
        parts += ["## Results (results.json)", "", "```json", json.dumps(run.results, indent=1), "```", ""]
    parts += ["## Config", "", "```yaml", OmegaConf.to_yaml(OmegaConf.create(run.config)).rstrip(), "```", ""]
    return "\n".join(parts)


def write_run_card(run: Run, out: Path, command: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "card.html").unlink(missing_ok=True)  # written last: a card stopped halfway has none, not an old one
    plots.run_card(run, out / "run_curves.png")
    md = portable(markdown_card(run, command, attention_section(run, out)))
    atomic_write_text(out / "card.md", md)
    atomic_write_text(out / "card.html", to_html(md, f"Run card: {run.name}", out))
    return out / "card.html"
