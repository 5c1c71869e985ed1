"""GLUE without a neural network: what word identity alone scores on each task's dev set.

The floor a pretrained Transformer should clear, and the part of a published small model's score that
needs no more than word identity:

- a single-sentence task (CoLA, SST-2): logistic regression on TF-IDF word unigrams and bigrams;
- a sentence pair (MRPC, STS-B, RTE): logistic regression (ridge for STS-B's scores) on five lexical-overlap
  features of the two sentences' word sets A and B: |A&B|/|B|, |A&B|/|A|, Jaccard |A&B|/|A|B|, the
  length difference |A|-|B| over |A|+|B|, and |B-A|/|B|;
- STS-B without any training: the word Jaccard of a pair against its dev score (compare the untrained
  cosine of pooled features, `benchmarks/glue_probe.py --task stsb`).

Words are lower-cased runs of letters and digits; scikit-learn's defaults (C=1, alpha=1), nothing tuned on
dev; deterministic. A task's score is the mean of its metrics, as in lm finetune's tables.

    python benchmarks/glue_baselines.py                                  # every task with local train and dev
    python benchmarks/glue_baselines.py --max-train sst2=5000,stsb=2000  # the transfer recipe's row budgets

Data: $LM_DATA_MIRROR/glue_data (or --data-root), as lm finetune reads it.
"""

import argparse
import re

import numpy as np

TASKS = ("cola", "sst2", "mrpc", "stsb", "rte")
WORD = re.compile(r"\w+")


def words(text: str) -> set[str]:
    return set(WORD.findall(text.lower()))


def overlap(a: str, b: str) -> list[float]:
    """The five lexical-overlap features of one pair (module docstring)."""
    A, B = words(a), words(b)
    both = len(A & B)
    return [
        both / max(len(B), 1),
        both / max(len(A), 1),
        both / max(len(A | B), 1),
        (len(A) - len(B)) / max(len(A) + len(B), 1),
        len(B - A) / max(len(B), 1),
    ]


def majority(task: str, train, dev) -> np.ndarray:
    """Every dev row predicted as the commonest training label (STS-B: the mean score, correlation 0)."""
    y = [e.label for e in train]
    guess = float(np.mean(y)) if task == "stsb" else max(set(y), key=y.count)
    return np.full(len(dev), guess)


def lexical(task: str, train, dev) -> np.ndarray:
    """Dev predictions of the task's word-identity model (module docstring)."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression, Ridge

    y = np.array([e.label for e in train])
    if train[0].text_b is None:
        vec = TfidfVectorizer(token_pattern=WORD.pattern, ngram_range=(1, 2), sublinear_tf=True)
        x = vec.fit_transform([e.text_a for e in train])
        return LogisticRegression(max_iter=3000).fit(x, y).predict(vec.transform([e.text_a for e in dev]))
    x = np.array([overlap(e.text_a, e.text_b) for e in train])
    x_dev = np.array([overlap(e.text_a, e.text_b) for e in dev])
    model = Ridge() if task == "stsb" else LogisticRegression(max_iter=3000)
    return model.fit(x, y).predict(x_dev)


def jaccard(dev) -> np.ndarray:
    """Each pair's word Jaccard, as a 0-5 score: no training."""
    return np.array([5.0 * overlap(e.text_a, e.text_b)[2] for e in dev])


def baselines(task: str, root=None, max_train: int | None = None) -> dict:
    """{name: lm's metrics dict} of each baseline of `task`, with "train_rows"."""
    from lm.glue.metrics import compute_metrics
    from lm.glue.readers import load_split

    train = load_split(task, "train", root, hf=False, limit=max_train)
    dev = load_split(task, "dev", root, hf=False)
    y = [e.label for e in dev]
    out = {"train_rows": len(train), "majority": compute_metrics(task, majority(task, train, dev), y)}
    out["lexical"] = compute_metrics(task, lexical(task, train, dev), y)
    if task == "stsb":
        out["jaccard"] = compute_metrics(task, jaccard(dev), y)
    return out


def parse_budgets(spec: str) -> dict[str, int]:
    """'sst2=5000,stsb=2000' -> {"sst2": 5000, "stsb": 2000}."""
    budgets = {}
    for item in filter(None, spec.split(",")):
        task, _, n = item.partition("=")
        if task not in TASKS or not n.isdigit():
            raise SystemExit(f"glue_baselines: --max-train {item!r}: want <task>=<rows> with a task of {TASKS}")
        budgets[task] = int(n)
    return budgets


def table(results: dict[str, dict]) -> str:
    lines = [
        "| task | train rows | majority class | word identity | metrics (word identity) |",
        "|---|---:|---:|---:|---|",
    ]
    for task, r in results.items():
        metrics = ", ".join(f"{k} {v:.1f}" for k, v in r["lexical"].items() if k != "score")
        lines.append(
            f"| {task} | {r['train_rows']:,} | {r['majority']['score']:.1f} | {r['lexical']['score']:.1f} | {metrics} |"
        )
    if "stsb" in results:
        j = results["stsb"]["jaccard"]
        lines.append(f"\nSTS-B's word Jaccard, no training: Pearson {j['pearson']:.1f}, Spearman {j['spearman']:.1f}")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", default=",".join(TASKS), help="comma-separated (default %(default)s)")
    p.add_argument("--max-train", default="", help="first N training rows per task, e.g. sst2=5000,stsb=2000")
    p.add_argument("--data-root", default=None, help="GLUE root (default: $LM_DATA_MIRROR/glue_data)")
    args = p.parse_args(argv)
    budgets = parse_budgets(args.max_train)
    tasks = [t for t in args.tasks.split(",") if t]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise SystemExit(f"glue_baselines: unknown task(s) {unknown}; choose from {TASKS}")
    print(table({t: baselines(t, args.data_root, budgets.get(t)) for t in tasks}))


if __name__ == "__main__":
    main()
