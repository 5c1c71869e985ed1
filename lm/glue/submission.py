"""Test-set predictions as the GLUE leaderboard's files, and a check of a finished submission directory.

One file per leaderboard column (CoLA.tsv, SST-2.tsv, MRPC.tsv, STS-B.tsv, QQP.tsv, MNLI-m.tsv,
MNLI-mm.tsv, QNLI.tsv, RTE.tsv, WNLI.tsv, AX.tsv), header `index<TAB>prediction`, one row per test
example keyed by the test file's index column. Predictions are the task's label strings
(entailment / not_entailment / neutral / contradiction, or 0 / 1); STS-B scores are clipped to
[0, 5] and written with 3 decimals. Files are written atomically. The leaderboard takes a zip of
all eleven files and rejects a file whose row count differs from the official test set.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path

from lm.core.files import atomic_write_text
from lm.glue.metrics import as_predictions
from lm.glue.tasks import LEADERBOARD, get_eval, get_task

HEADER = ["index", "prediction"]


def write_submission(name: str, preds, out_dir, indices: Iterable[int] | None = None) -> Path:
    """Write `<out_dir>/<column>.tsv` from class ids / logits (or STS-B scores) in test-file order.

    `indices` are the test examples' ids (readers.Example.index); default 0..N-1, which is what every
    official GLUE test file uses.
    """
    e = get_eval(name)
    task = get_task(e.task)
    p = as_predictions(e.name, preds)
    idx = list(range(len(p)) if indices is None else indices)
    if len(idx) != len(p):
        raise ValueError(f"{e.submission}: {len(p)} predictions for {len(idx)} indices")
    if task.is_regression:
        rows = [f"{i}\t{float(v):.3f}" for i, v in zip(idx, p)]
    else:
        rows = [f"{i}\t{task.labels[int(c)]}" for i, c in zip(idx, p)]
    return atomic_write_text(Path(out_dir) / f"{e.submission}.tsv", "\n".join(["\t".join(HEADER), *rows]) + "\n")


def check_submission(out_dir, names: Iterable[str] | None = None, expected_rows: dict | None = None) -> list[str]:
    """Problems that would make the leaderboard reject `out_dir` (empty list = none found).

    `expected_rows` maps a column to its row count; the default is the official test set size.
    """
    problems = []
    for name in names or LEADERBOARD:
        e = get_eval(name)
        want = (expected_rows or {}).get(e.name, e.test_rows)
        path = Path(out_dir) / f"{e.submission}.tsv"
        if not path.is_file():
            problems.append(f"{path}: missing")
            continue
        problems += _check_file(path, get_task(e.task), want)
    return problems


def _check_file(path: Path, task, want: int) -> list[str]:
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    if not rows or rows[0] != HEADER:
        return [f"{path}:1: header must be {'<TAB>'.join(HEADER)}, found {rows[0] if rows else 'an empty file'}"]
    problems = [] if len(rows) - 1 == want else [f"{path}: {len(rows) - 1} rows, the official test set has {want}"]
    seen = set()
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != 2 or not row[0].isdigit() or row[0] in seen or not _valid(task, row[1]):
            problems.append(
                f"{path}:{line}: bad row {row} (want a new integer index and "
                f"{'a score in [0, 5]' if task.is_regression else 'one of ' + str(list(task.labels))})"
            )
            break
        seen.add(row[0])
    return problems


def _valid(task, value: str) -> bool:
    if not task.is_regression:
        return value in task.labels
    try:
        return 0.0 <= float(value) <= 5.0
    except ValueError:
        return False
