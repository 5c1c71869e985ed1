"""How the GLUE probe's settings change its ranking of checkpoints (issue 52, item 2; companion of probe_rank.py).

For each point of a probe_rank.py run, the frozen model's pooled features of each task's first --max-train train
rows and all its dev rows are computed once; every setting (train rows, dev rows, regularisation) is then fit and
scored on slices of them by lm/eval/probe.py's fit_and_score (standardized logistic / ridge regression, the
task's official metric, the regularisation scaled per setting); the settings' averages are ranked (Spearman)
against probe_rank.py's finetune averages of the same points. The default setting recomputed here can differ from
probe_rank.py's own probe by float rounding (its features come out of other batches).

    python benchmarks/probe_settings.py runs/glue_decoder --rank-out runs/probe_rank --out runs/probe_settings
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from statistics import fmean

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/ is not a package
import probe_rank  # noqa: E402

# name: (train rows, dev rows (0 = all), regularisation factor: logistic C / k, ridge alpha * k)
SETTINGS = {
    "1000, 500 (default)": (1000, 500, 1.0),
    "1000, all": (1000, 0, 1.0),
    "2000, all": (2000, 0, 1.0),
    "4000, all": (4000, 0, 1.0),
    "2000, all, reg x10": (2000, 0, 10.0),
    "4000, all, reg x10": (4000, 0, 10.0),
}


def settings_scores(features: dict, settings: dict = SETTINGS) -> dict[str, dict[str, float]]:
    """{setting: {task: score, "avg": mean}} from features {task: (x_train, y_train, x_dev, y_dev, regression)}."""
    from lm.eval.probe import fit_and_score

    out = {}
    for name, (n_train, n_dev, k) in settings.items():
        scores = {}
        for task, (x_tr, y_tr, x_dev, y_dev, regression) in features.items():
            d = n_dev or len(y_dev)
            scores[task] = fit_and_score(task, x_tr[:n_train], y_tr[:n_train], x_dev[:d], y_dev[:d], regression, k)
        scores["avg"] = fmean(scores.values())
        out[name] = scores
    return out


def point_features(run: Path, step: int, max_train: int, tasks=probe_rank.TASKS) -> dict:
    from lm.eval.probe import load_probe_sets, pooled_features
    from lm.eval.saved import load_model

    model, tok = probe_rank.origin_model(run) if step == 0 else load_model(probe_rank.checkpoint(run, step))
    model.eval()
    sets = load_probe_sets(tok, model.cfg.arch, tasks, train_examples=max_train, dev_examples=0, max_len=128)
    return {
        s.task: (
            pooled_features(model, s.train, tok.pad_id),
            [e["labels"] for e in s.train],
            pooled_features(model, s.dev, tok.pad_id),
            [e["labels"] for e in s.dev],
            s.regression,
        )
        for s in sets
    }


def table(points: dict[int, dict], finetune: dict[int, float]) -> str:
    """Each setting's average per point and its Spearman against the finetune averages."""
    steps = sorted(points)
    lines = ["| probe: train rows, dev rows | " + " | ".join(map(str, steps)) + " | Spearman |"]
    lines.append("|---|" + "---:|" * (len(steps) + 1))
    for name in points[steps[0]]:
        avgs = [points[s][name]["avg"] for s in steps]
        rho = probe_rank.spearman(avgs, [finetune[s] for s in steps])
        lines.append(f"| {name} | " + " | ".join(f"{a:.1f}" for a in avgs) + f" | {rho:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("run", type=Path, help="the lm train run whose checkpoints probe_rank.py ranked")
    p.add_argument("--rank-out", type=Path, required=True, help="probe_rank.py's --out (its points' finetunes)")
    p.add_argument(
        "--out", type=Path, required=True, help="one JSON per point goes here (resumable: the same run and --max-train)"
    )
    p.add_argument("--max-train", type=int, default=4000, help="train rows whose features are computed")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    done, finetune = {}, {}
    made = {"run": str(a.run.resolve()), "max_train": a.max_train}  # what a point's scores here depend on
    for path in sorted((a.rank_out / "points").glob("step_*.json")):
        record = json.loads(path.read_text())
        tasks = record.get("tasks", list(probe_rank.TASKS))  # probe_rank.py --tasks: the point's own
        medians = probe_rank.finetune_medians(record, tasks)
        if not medians:
            continue
        if record.get("run", made["run"]) != made["run"]:  # its finetune scores are another run's
            sys.exit(f"probe_settings: {path} is a point of {record['run']}, not of {a.run}; pass its --rank-out")
        finetune[record["step"]] = medians["avg"]
        done[record["step"]] = point_scores(a, a.out / path.name, record["step"], {**made, "tasks": tasks})
    print(table(done, finetune))


def point_scores(a: argparse.Namespace, mine: Path, step: int, made: dict) -> dict:
    """The point's settings scores: read back from `mine` when made of the same run, --max-train and tasks (a file
    written before these were recorded: as it is; before tasks were: of probe_rank.TASKS), else computed and saved;
    another run's, --max-train's or tasks' is refused."""
    from lm.core.files import atomic_write_text

    saved = json.loads(mine.read_text()) if mine.is_file() else None
    if saved is None:
        saved = {**made, "scores": settings_scores(point_features(a.run, step, a.max_train, made["tasks"]))}
        atomic_write_text(mine, json.dumps(saved, indent=1))
    elif "scores" in saved and _made_of(saved, made) != made:
        sys.exit(
            f"probe_settings: {mine} holds scores of another run, --max-train or tasks than {made}; name another --out"
        )
    return saved.get("scores", saved)


def _made_of(saved: dict, made: dict) -> dict:
    """What a saved point says made it; one saved before tasks were recorded is of probe_rank.TASKS."""
    return {k: saved.get(k, list(probe_rank.TASKS) if k == "tasks" else None) for k in made}


if __name__ == "__main__":
    main()
