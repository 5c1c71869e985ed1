"""Heatmaps of attention probabilities (lm/report/attention_maps.py) as PNG, and the HTML page around them.

grid_panels(layer_maps)          the (layers x heads) matrices a grid draws, rows sum to 1
draw_grid(layer_maps, path)      one PNG: every layer (rows) x head (columns) of one stack's self- or cross-attention
draw_single(m, head, path)       one PNG: one layer's head, tokens as axis labels (queries down, keys across)
write_page(...)                  attention.md + attention.html (PNGs embedded), tokens listed
The PNGs are lm's (lm/report/outputs.py save_png): a later call may replace them, never a user's file.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import numpy as np  # noqa: E402

from lm.core.files import atomic_write_text  # noqa: E402
from lm.report.attention_maps import AttnMap  # noqa: E402
from lm.report.html import to_html  # noqa: E402
from lm.report.outputs import save_png  # noqa: E402
from lm.report.paths import portable  # noqa: E402

DPI = 90
CMAP = "viridis"


def grid_panels(layer_maps: list[AttnMap]) -> list[list[np.ndarray]]:
    """panels[layer][head] = (Tq, Tk) probabilities: what draw_grid plots, in its order."""
    return [[m.probs[h] for h in range(m.probs.shape[0])] for m in layer_maps]


def grid_name(m: AttnMap) -> str:
    return f"grid_{m.stack}_{m.kind}.png"


def single_name(m: AttnMap, head: int) -> str:
    return f"{m.stack}_{m.kind}_layer{m.layer}_head{head}.png"


def draw_grid(layer_maps: list[AttnMap], path: Path, title: str | None = None) -> Path:
    panels = grid_panels(layer_maps)
    rows, cols = len(panels), len(panels[0])
    size = 1.6 if max(panels[0][0].shape) <= 64 else 2.2
    fig, axes = plt.subplots(rows, cols, figsize=(cols * size + 0.6, rows * size + 0.7), squeeze=False)
    for r, (m, row) in enumerate(zip(layer_maps, panels)):
        for h, probs in enumerate(row):
            ax = axes[r][h]
            ax.imshow(probs, cmap=CMAP, vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(f"head {h}", fontsize=8)
            if h == 0:
                ax.set_ylabel(f"layer {m.layer}", fontsize=8)
    first = layer_maps[0]
    keys = "Linformer's k projected rows" if first.keys and first.keys[0].startswith("E1") else "keys"
    fig.suptitle(title or f"{first.title}: layers x heads (rows: queries, columns: {keys})", fontsize=9)
    fig.tight_layout()
    return save_png(fig, path, dpi=DPI)


def draw_single(m: AttnMap, head: int, path: Path) -> Path:
    probs = m.probs[head]
    tq, tk = probs.shape
    fig, ax = plt.subplots(figsize=(min(18, 1.5 + 0.32 * tk), min(18, 1.2 + 0.32 * tq)))
    # scaled to this head's largest weight (the colour bar says it); grids keep [0, 1] to compare panels
    image = ax.imshow(probs, cmap=CMAP, vmin=0.0, vmax=float(probs.max()), aspect="auto", interpolation="nearest")
    font = 8 if max(tq, tk) <= 48 else 5
    ax.set_xticks(range(tk), m.keys, rotation=90, fontsize=font)
    ax.set_yticks(range(tq), m.queries, fontsize=font)
    ax.set_xlabel("keys (attended to)", fontsize=8)
    ax.set_ylabel("queries", fontsize=8)
    ax.set_title(f"{m.title}, layer {m.layer}, head {head}", fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.04)
    fig.tight_layout()
    return save_png(fig, path, dpi=DPI)


def _tokens_table(labels: list[str], ids: list[int], width: int = 24) -> str:
    """Positions, tokens and ids, `width` positions per table so a long text wraps."""
    cells = [f"`{t}`".replace("|", "\\|") for t in labels]
    tables = []
    for start in range(0, len(ids), width):
        span = range(start, min(start + width, len(ids)))
        tables.append(
            "| position | "
            + " | ".join(str(i) for i in span)
            + " |\n"
            + "|---|"
            + "---|" * len(span)
            + "\n"
            + "| token | "
            + " | ".join(cells[i] for i in span)
            + " |\n"
            + "| id | "
            + " | ".join(str(ids[i]) for i in span)
            + " |\n"
        )
    return "\n".join(tables)


PAGE_FILES = ["attention.md", "attention.html"]  # what write_page writes beside the figures


def write_page(
    out: Path, title: str, lines: list[str], inputs: list[tuple], grids: list[Path], singles: list[Path]
) -> Path:
    """attention.md and a self-contained attention.html: the notes, each input's tokens, then the figures.

    inputs: (heading, labels, ids) per token sequence the model read."""
    parts = [f"# {title}", ""] + lines + [""]
    for heading, labels, ids in inputs:
        parts += [f"## {heading}", "", _tokens_table(labels, ids), ""]
    parts += ["## All layers x heads", ""] + [f"![{p.stem}]({p.name})\n" for p in grids]
    if singles:
        parts += ["## Requested layers / heads", ""] + [f"![{p.stem}]({p.name})\n" for p in singles]
    md = portable("\n".join(parts))
    atomic_write_text(out / PAGE_FILES[0], md)
    atomic_write_text(out / PAGE_FILES[1], to_html(md, title, out))
    return out / "attention.html"
