"""PNG plots with matplotlib's Agg backend (no display needed): loss curves per variant, final
loss with error bars, and the curves of a single run's card."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import numpy as np  # noqa: E402

from lm.report.outputs import save_png  # noqa: E402
from lm.report.runs import _number  # noqa: E402

DPI = 90  # small files: the committed example report stays a few hundred KB


def smooth(y: np.ndarray, frac: float = 0.02) -> np.ndarray:
    """Moving average over ~2% of the curve; short curves are left alone."""
    k = max(1, int(len(y) * frac))
    if k == 1:
        return y
    kernel = np.ones(k) / k
    head = np.array([y[: i + 1].mean() for i in range(k - 1)])  # no zero padding at the start
    return np.concatenate([head, np.convolve(y, kernel, mode="valid")])


def _curve(entries: list, key: str) -> tuple:
    pts = [(e["step"], e[key]) for e in entries if _number(e.get("step")) and _number(e.get(key))]
    return (np.array([s for s, _ in pts]), np.array([v for _, v in pts])) if pts else (np.array([]), np.array([]))


def _mean_curve(runs: list, attr: str, key: str) -> tuple:
    """Mean and min/max over seeds at the steps every seed logged."""
    curves = [_curve(getattr(r, attr), key) for r in runs]
    curves = [c for c in curves if len(c[0])]
    if not curves:
        return None
    steps = sorted(set.intersection(*(set(s.tolist()) for s, _ in curves)))
    if not steps:
        return None
    ys = np.stack([np.interp(steps, s, v) for s, v in curves])
    return np.array(steps), ys.mean(0), ys.min(0), ys.max(0)


PROBE_AVG = "probe/avg"  # lm/eval/probe.py's record: the mean of the probed GLUE tasks' dev scores (points)


def _has(runs, attr: str, key: str) -> bool:
    return any(len(_curve(getattr(r, attr), key)[0]) for r in runs)


def sweep_panels(runs: list) -> list:
    """(Run attribute, metrics key, title) of each panel of loss_curves: the train loss, and the validation loss
    and GLUE probe average (train.probe_interval) where a run logged them."""
    panels = [("train", "loss", "train loss (smoothed)")]
    panels += [("val", "val_loss", "validation loss")] if _has(runs, "val", "val_loss") else []
    return panels + ([("other", PROBE_AVG, "GLUE probe average (points)")] if _has(runs, "other", PROBE_AVG) else [])


def loss_curves(variants: list, path: Path) -> None:
    panels = sweep_panels([r for v in variants for r in v.runs])
    fig, axes = plt.subplots(1, len(panels), figsize=(1.5 + 4.75 * len(panels), 4.2), squeeze=False)
    for ax, (attr, key, title) in zip(axes[0], panels):
        for i, v in enumerate(variants):
            color = f"C{i % 10}"
            mc = _mean_curve(v.ok_runs, attr, key)
            if mc is not None:
                s, mean, lo, hi = mc
                f = smooth if attr == "train" else (lambda y: y)
                ax.plot(s, f(mean), color=color, lw=1.4, label=f"{v.label} (n={len(v.ok_runs)})")
                ax.fill_between(s, f(lo), f(hi), color=color, alpha=0.15, lw=0)
            for r in v.failed_runs + v.running_runs:  # partial curves: where a cell failed, or has got to
                s, y = _curve(getattr(r, attr), key)
                if len(s):
                    ax.plot(s, y, color=color, lw=0.8, ls="--", label=f"{v.label} ({r.status})")
        ax.set_xlabel("step")
        ax.set_ylabel(key)
        ax.set_title(title + ": mean over seeds, band = min–max")
        ax.grid(alpha=0.3)
        if attr != "other":  # the probe rises from chance: its whole range is the story
            _zoom_tail(ax)
    if axes[0][-1].get_legend_handles_labels()[0]:
        axes[0][-1].legend(fontsize=7, loc="upper right")
    _save(fig, path)


def _zoom_tail(ax) -> None:
    """The first steps' loss is many times the final one; clip the y-range to the late part so
    the differences between variants are visible."""
    ys = np.concatenate([line.get_ydata() for line in ax.get_lines()] or [np.array([])])
    if len(ys) > 10:
        tail = np.concatenate([line.get_ydata()[len(line.get_ydata()) // 4 :] for line in ax.get_lines()])
        lo, hi = np.nanmin(tail), np.nanmax(tail)
        pad = 0.05 * (hi - lo or 1)
        ax.set_ylim(lo - pad, hi + pad)


def final_loss(rows: list, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6.5, 0.5 * len(rows) + 1.6))
    labels = [r["variant"] for r in rows]
    for i, r in enumerate(rows):
        s = r["final_loss"]
        if s.mean is None:
            what, color = ("failed", "red") if r["failed"] or not r["running"] else ("running", "gray")
            ax.text(0.5, i, what, transform=ax.get_yaxis_transform(), color=color, va="center")
            continue
        ax.errorbar(s.mean, i, xerr=s.std or 0, fmt="o", color=f"C{i % 10}", capsize=4)
        ax.scatter(s.values, [i] * len(s.values), color=f"C{i % 10}", s=12, alpha=0.5, marker="x")
        if r["is_baseline"]:
            ax.axvline(s.mean, color="gray", lw=0.8, ls=":")
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    series = next((r["loss_series"] for r in rows if r["loss_series"]), "loss")
    ax.set_xlabel(f"final {series}: mean ± std over seeds (x = each seed)")
    ax.grid(alpha=0.3, axis="x")
    _save(fig, path)


def run_card(run, path: Path) -> None:
    panels = [("loss", "loss"), ("tokens_per_s", "tokens/s"), ("memory", "memory"), ("lr", "learning rate")]
    panels = [(k, t) for k, t in panels if len(_curve(run.train, k)[0])]
    if len(_curve(run.other, PROBE_AVG)[0]):
        panels.insert(1, (PROBE_AVG, "GLUE probes (points)"))  # beside the loss
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(4 * max(1, len(panels)), 3.4), squeeze=False)
    for ax, (key, title) in zip(axes[0], panels):
        if key == PROBE_AVG:
            _probe_panel(ax, run.other)
            continue
        s, y = _curve(run.train, key)
        ax.plot(s, y, lw=0.8, alpha=0.5 if key == "loss" else 1, label=key)
        if key == "loss":
            ax.plot(s, smooth(y), lw=1.4, label="loss (smoothed)")
            vs, vy = _curve(run.val, "val_loss")
            if len(vs):
                ax.plot(vs, vy, "o-", ms=3, label="val_loss")
            ax.legend(fontsize=7)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    _save(fig, path)


def _probe_panel(ax, entries: list) -> None:
    """Each probed task's dev score and their average against the step."""
    tasks = sorted({k for e in entries for k in e if k.startswith("probe/") and k not in (PROBE_AVG, "probe/seconds")})
    for key in tasks:
        s, y = _curve(entries, key)
        ax.plot(s, y, "o-", lw=0.8, ms=2, alpha=0.6, label=key[len("probe/") :])
    s, y = _curve(entries, PROBE_AVG)
    ax.plot(s, y, "o-", lw=1.6, ms=3, color="black", label="average")
    ax.legend(fontsize=7)
    ax.set_title("GLUE probes (points)")
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    save_png(fig, path, dpi=DPI)
