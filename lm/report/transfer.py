"""The GLUE transfer table: finetuned from pretraining vs from scratch, per task and seed, and the curve
of the gain over pretraining tokens (reading and rendering only; lm/cli/transfer.py runs the recipe).

A transfer run directory (what `lm transfer` writes) holds
    transfer.json    the recipe (preset, arch, pretraining tokens, pooling, commands) and the comparison
    transfer.md      the table below
    pretrain/        the lm train run (absent at 0 tokens)
    finetune/pretrained/results.json, and the scratch arm's results.json (finetune/scratch/, or a
                     directory shared by every run of a curve: the scratch arm does not depend on tokens)
    transfer_<arm>.json  written by a one-arm call (--arm scratch|pretrained): the recipe and that arm's
                     results; `lm transfer --join` makes the table from two of them, e.g. from two machines
    transfer_point.json  the point it holds (preset, steps, tokens per step, --pretrain overrides), recorded by
                     its first call: a call of another point there is refused (lm/cli/transfer_recipe.py)

Scores are lm finetune's task scores in points (a task's score is the mean of its metrics, e.g. MRPC
F1/acc). Per task: each seed, the median over seeds (of the per-metric medians, as results.json
holds it), the seed range (max - min), and the gain = pretrained median - scratch median. The
average row is GLUE-style: the mean of the task scores, per seed and of the medians.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from statistics import fmean

from lm.glue.tasks import EVALS
from lm.report.outputs import CURVE_NOTE, save_png

TRANSFER = "transfer.json"
ARMS = ("scratch", "pretrained")


CURVE_FILES = ["transfer.md", "transfer_curve.png"]  # what write_curve_report writes


class TransferError(ValueError):
    """A transfer directory or results file that cannot be compared; the message names the file."""


def _score(metrics: Mapping, keys: list[str]) -> float:
    return float(metrics["score"]) if "score" in metrics else fmean(float(metrics[k]) for k in keys)


def arm_scores(results_json: Path) -> dict[str, dict]:
    """{column: {"metrics", "seeds": {seed: score}, "median": score}} from an lm finetune results.json."""
    if not Path(results_json).is_file():
        raise TransferError(
            f"{results_json}: no such file; the finetuning of this arm has not finished "
            f"(run the same lm transfer command again to resume it)"
        )
    return scores_of(json.loads(Path(results_json).read_text()))


def scores_of(results: Mapping) -> dict[str, dict]:
    """arm_scores of an lm finetune results.json already read (an arm record carries one: lm transfer --join)."""
    return {
        c: {
            "metrics": r["metrics"],
            "seeds": {str(s): _score(m, r["metrics"]) for s, m in r["seeds"].items()},
            "median": _score(r["median"], r["metrics"]),
        }
        for c, r in results["columns"].items()
    }


def compare(scratch: Mapping[str, dict], pretrained: Mapping[str, dict]) -> dict:
    """The comparison of two arms' arm_scores: per task and the GLUE-style average."""
    cols = [c for c in EVALS if c in scratch and c in pretrained]
    if not cols:
        raise TransferError(
            f"the two arms share no GLUE task (scratch: {sorted(scratch)}, pretrained: {sorted(pretrained)})"
        )
    tasks = {}
    for c in cols:
        arms = {"scratch": scratch[c], "pretrained": pretrained[c]}
        tasks[c] = {
            "metrics": scratch[c]["metrics"],
            "gain": arms["pretrained"]["median"] - arms["scratch"]["median"],
            **{a: {"seeds": r["seeds"], "median": r["median"], "range": _range(r["seeds"])} for a, r in arms.items()},
        }
    average = {"tasks": cols, "gain": fmean(tasks[c]["gain"] for c in cols)}
    for a in ARMS:
        seeds = set.intersection(*(set(tasks[c][a]["seeds"]) for c in cols))
        per_seed = {s: fmean(tasks[c][a]["seeds"][s] for c in cols) for s in sorted(seeds, key=_seed_key)}
        average[a] = {
            "seeds": per_seed,
            "median": fmean(tasks[c][a]["median"] for c in cols),
            "range": _range(per_seed),
        }
    return {"tasks": tasks, "average": average}


def _range(seeds: Mapping[str, float]) -> float:
    return max(seeds.values()) - min(seeds.values()) if seeds else 0.0


def _seed_key(s: str):
    return (0, int(s)) if str(s).lstrip("-").isdigit() else (1, str(s))


def transfer_table(summary: Mapping) -> str:
    """Markdown: the recipe in one line, then one row per task and the average row."""
    cmp, r = summary["comparison"], summary["recipe"]
    zero = r["tokens"] == 0
    lines = [
        f"# GLUE transfer: {r['preset']} ({r['arch']}, {r['objective']}), {r['tokens']:,} pretraining tokens",
        "",
        f"Dev scores in points (a task's score is the mean of its metrics); median over seeds; range = max - min "
        f"over seeds; gain = pretrained median - scratch median. Finetuning: {r['finetune_note']}."
        + (" At 0 tokens the pretrained arm IS the scratch arm (gain 0 by definition)." if zero else ""),
        "",
        "| task | metric | scratch: seeds | median | range | pretrained: seeds | median | range | gain |",
        "|---|---|---|---:|---:|---|---:|---:|---:|",
    ]

    def seeds(x):
        return " / ".join(f"{v:.1f}" for _, v in sorted(x["seeds"].items(), key=lambda kv: _seed_key(kv[0])))

    for c, t in cmp["tasks"].items():
        s, p = t["scratch"], t["pretrained"]
        lines.append(
            f"| {EVALS[c].submission} | {'/'.join(t['metrics'])} | {seeds(s)} | {s['median']:.1f} | "
            f"{s['range']:.1f} | {seeds(p)} | {p['median']:.1f} | {p['range']:.1f} | {t['gain']:+.1f} |"
        )
    a = cmp["average"]
    n = len(a["tasks"])
    lines.append(
        f"| **average ({n} task{'s' * (n != 1)})** | score | {seeds(a['scratch'])} | {a['scratch']['median']:.1f} | "
        f"{a['scratch']['range']:.1f} | {seeds(a['pretrained'])} | {a['pretrained']['median']:.1f} | "
        f"{a['pretrained']['range']:.1f} | **{a['gain']:+.1f}** |"
    )
    val = f"; pretraining validation loss {r['val_loss']:.3f}" if r.get("val_loss") is not None else ""
    val += f"; GLUE probe average {r['probe']:.1f}" if r.get("probe") is not None else ""
    lines += [
        "",
        f"Pretraining: {r['steps']:,} steps x {r['tokens_per_step']:,} tokens{val}. "
        f"Runs: scratch `{summary['arms']['scratch']}`, pretrained `{summary['arms']['pretrained']}`.",
    ]
    return "\n".join(lines) + "\n"


# -- the curve over pretraining tokens ----------------------------------------------------------------


def is_transfer_dir(path) -> bool:
    return (Path(path) / TRANSFER).is_file()


def load_transfer(path) -> dict:
    try:
        return json.loads((Path(path) / TRANSFER).read_text())
    except (OSError, ValueError) as e:
        raise TransferError(f"{Path(path) / TRANSFER}: cannot be read ({e}); run lm transfer there again") from None


def find_transfers(paths) -> list[dict]:
    """Every transfer.json under `paths` (the directories themselves or below them), sorted by arch, tokens."""
    found = []
    for p in map(Path, paths):
        dirs = [p] if is_transfer_dir(p) else sorted(q.parent for q in p.rglob(TRANSFER))
        found += [{**load_transfer(d), "dir": str(d)} for d in dirs]
    return sorted(found, key=lambda s: (series(s), overrides(s), s["recipe"]["tokens"]))


def series(summary: Mapping) -> str:
    """One curve's label: the arch, its finetuning pooling and (recorded since 2026-11-25) position scheme."""
    r = summary["recipe"]
    return f"{r['arch']} ({r['pooling']}{', ' + r['pos'] if r.get('pos') else ''})"


def overrides(summary: Mapping) -> tuple[str, ...]:
    """What a run set beyond its preset that changes its results: its --pretrain overrides (marked `pretrain`) and
    --finetune overrides, pooling aside (series() shows it). Two runs of one series with other such overrides are
    two curves. (The curve archive's folder names digest this tuple as it is: keep its form.)"""
    return tuple(o if side == "finetune" else f"pretrain {o}" for side, o in sided_overrides(summary))


SIDES = ("pretrain", "finetune")
# lm train lets these change on resume, but only to recover from a NaN/inf loss (lm/core/resume.py): they change the
# weights a pretraining ends with, so they are a recipe's (lm/cli/transfer_point.py compares a point's by them too)
SCHEDULE = ("optim.lr", "sched.warmup_steps")


def computes(side: str, override: str) -> bool:
    """Whether a --pretrain or --finetune override changes what a transfer run computes. The ones a resume may
    change (lm/core/resume.py: train.threads, train.progress, logger, resume, where the data is read from...)
    change nothing computed but its rounding (train.threads: the order of a matmul's sums, as far apart as two seeds
    by a run's end): transfer.json records the last call's, and grouping by them split two runs of one experiment
    into two curves (train.progress=false on one of them)."""
    from lm.core.resume import FINETUNE_RESUMABLE, RESUMABLE, resumable

    key = str(override).lstrip("+~").split("=", 1)[0]
    if side == "finetune":
        return not resumable(key, FINETUNE_RESUMABLE)
    return not resumable(key, RESUMABLE) or resumable(key, SCHEDULE)


def sided_overrides(summary: Mapping) -> tuple[tuple[str, str], ...]:
    """overrides() as (side, override) pairs, side `pretrain` or `finetune`."""
    r = summary["recipe"]
    return tuple(
        (side, o)
        for side in SIDES
        for o in r.get(f"{side}_overrides") or []
        if computes(side, o) and not (side == "finetune" and o.startswith("pooling="))
    )


def _by_side(extra: list[tuple[str, str]]) -> str:
    """(side, override) pairs as `pretrain a b; finetune c`: each side named once, so neither reads as the other."""
    return "; ".join(
        f"{side} " + " ".join(o for sd, o in extra if sd == side)
        for side in SIDES
        if any(sd == side for sd, _ in extra)
    )


def series_labels(summaries: list[Mapping]) -> list[str]:
    """Each summary's curve label: series(), plus, where runs of that series differ in their overrides, the
    overrides that not all of them share (so the curves stay apart and the labels stay short)."""
    groups: dict[str, list[tuple[tuple[str, str], ...]]] = {}
    for s in summaries:
        groups.setdefault(series(s), []).append(sided_overrides(s))
    labels = []
    for s in summaries:
        variants = groups[series(s)]
        if len(set(variants)) == 1:
            labels.append(series(s))
            continue
        common = set.intersection(*map(set, variants))
        extra = _by_side([o for o in sided_overrides(s) if o not in common])
        labels.append(series(s)[:-1] + (f"; {extra})" if extra else ")"))
    return labels


def curve_table(summaries: list[Mapping]) -> str:
    """Markdown: one row per (series, tokens): the pretraining's last val loss and GLUE probe average ("–" without
    probes: train.probe_interval), each task's gain, the average gain, both arms' averages."""
    cols = [c for c in EVALS if all(c in s["comparison"]["tasks"] for s in summaries)]
    head = " | ".join(EVALS[c].submission for c in cols)
    lines = [
        f"| model | pretraining tokens | val loss | probe | {head} | average gain | average: scratch / pretrained |",
        "|---|---:|---:|---:|" + "---:|" * len(cols) + "---:|---|",
    ]
    for s, label in zip(summaries, series_labels(summaries)):
        r, t, a = s["recipe"], s["comparison"]["tasks"], s["comparison"]["average"]
        val = "–" if r.get("val_loss") is None else f"{r['val_loss']:.3f}"
        probe = "–" if r.get("probe") is None else f"{r['probe']:.1f}"
        gains = " | ".join(f"{t[c]['gain']:+.1f}" for c in cols)
        avg = fmean(t[c]["gain"] for c in cols)  # over the columns every row has (equals a['gain'] when all do)
        lines.append(
            f"| {label} | {r['tokens']:,} | {val} | {probe} | {gains} | **{avg:+.1f}** | "
            f"{a['scratch']['median']:.1f} / {a['pretrained']['median']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def plot_curve(summaries: list[Mapping], path: Path) -> Path:
    """PNG: the gain against pretraining tokens, one panel per task plus the average, one line per series
    (arch, pooling, positions)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = [c for c in EVALS if all(c in s["comparison"]["tasks"] for s in summaries)]
    panels = ["average", *cols]
    fig, axes = plt.subplots(1, len(panels), figsize=(2.6 * len(panels), 2.8), sharex=True, squeeze=False)
    labels = series_labels(summaries)
    for ax, col in zip(axes[0], panels):
        for i, label in enumerate(sorted(set(labels))):
            rows = [s for s, arm in zip(summaries, labels) if arm == label]
            x = [s["recipe"]["tokens"] / 1e6 for s in rows]
            if col == "average":
                y = [s["comparison"]["average"]["gain"] for s in rows]
            else:
                y = [s["comparison"]["tasks"][col]["gain"] for s in rows]
            # tab20: the archive holds more than the default cycle's 10 curves, and two must not share a colour
            ax.plot(x, y, "o-", color=plt.get_cmap("tab20")(i % 20), label=label, lw=1.4, ms=4)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_title("GLUE average" if col == "average" else EVALS[col].submission, fontsize=10)
        ax.set_xlabel("pretraining tokens (M)", fontsize=8)
        ax.tick_params(labelsize=8)
    axes[0][0].set_ylabel("gain over scratch (points)", fontsize=8)
    fig.tight_layout()
    # below the panels, not inside one: a series' label can name its overrides and be wider than a panel
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2, fontsize=7, frameon=False)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_png(fig, path, dpi=90, bbox_inches="tight")


def write_curve_report(paths, out: Path, title: str | None = None) -> Path:
    """lm report on transfer directories: <out>/transfer.md (each run's table and the curve) + transfer_curve.png."""
    from lm.core.files import atomic_write_text

    summaries = find_transfers(paths)
    if not summaries:
        raise TransferError(f"no {TRANSFER} under {[str(p) for p in paths]}")
    out = Path(out)
    (out / "transfer.md").unlink(missing_ok=True)  # written last: a report stopped halfway has none, not an old one
    plot = plot_curve(summaries, out / "transfer_curve.png")
    parts = [
        f"# {title or 'GLUE transfer'}",
        "",
        CURVE_NOTE,
        "",
        curve_table(summaries),
        f"![gain over pretraining tokens]({plot.name})",
        "",
    ]
    parts += [transfer_table(s).replace("# GLUE transfer", "## GLUE transfer", 1) for s in summaries]
    return atomic_write_text(out / "transfer.md", "\n".join(parts))
