"""task=own: finetune on a classification or regression dataset of your own, the GLUE way (trainer, head, seeds,
results files of lm/glue/run.py).

    lm finetune task=own init=<run> tasks.own.train_file=train.csv tasks.own.dev_file=dev.csv

Files by extension: .csv (RFC 4180, the csv module's default dialect: a quoted field may hold commas, quotes and
newlines), .tsv (tab-delimited, quoted as .csv; GLUE's .tsv files are read with no quoting), .jsonl (one JSON object
per line, fields by name). UTF-8, a byte-order mark allowed. A column or field is found by name as lm prepare finds
one (lm.data.tables.find_column: "Label " is label when no other is).

Columns: tasks.own.text_a (default sentence, or sentence1 when text_b is set), text_b (null: one text per example;
set: a pair, so pair_input applies), label (default label). Classes: tasks.own.labels in class-id order, else the
train file's distinct labels sorted (numerically when all are integers, else as strings: what Hugging Face's run_glue
does), said in one log line; two spellings of one class there ("Pos"/"pos", "1"/"1.0") are refused, not made two.
regression=true: the label is a number, one output, MSE.

Metrics (lm/glue/metrics.py's): accuracy, and for two classes the F1 of the second class (as GLUE's MRPC); the task's
score is accuracy. Regression: Pearson and Spearman, the score their mean (as STS-B, without STS-B's [0, 5] clip).
There is no test split: an own task writes no submission file.

Every refusal comes before anything is trained (lm/glue/run.py missing_data calls `resolve`), one line naming the file
and the row: a missing file or column, a column named twice, an empty text or label, a dev label not among the train
labels, a non-numeric label with regression=true, fewer than 2 classes among the train rows trained on (tasks.own.labels
or not), scores that never vary (train or dev).
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import math
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from lm.config_base import ConfigError
from lm.data.columns import find_column
from lm.glue.config import OWN_FORMATS as FORMATS
from lm.glue.config import GlueTaskConfig
from lm.glue.readers import Example, GlueDataError, GlueDataMissing, _text_lines
from lm.glue.tasks import OWN, Eval, GlueTaskSpec, registered

log = logging.getLogger("lm")

_DIALECTS = {"csv": {}, "tsv": {"delimiter": "\t"}}  # quoting as CSV's in both


class Row(NamedTuple):
    """One example as written: its line (a CSV row's last line), texts and label string."""

    line: int
    text_a: str
    text_b: str | None
    label: str


def columns(cfg: GlueTaskConfig) -> dict[str, str | None]:
    """{config key: column name} of text_a, text_b and label, defaults filled in."""
    return {
        "text_a": cfg.text_a or ("sentence1" if cfg.text_b else "sentence"),
        "text_b": cfg.text_b,
        "label": cfg.label or "label",
    }


def resolve(cfg: GlueTaskConfig) -> GlueTaskConfig:
    """The task with its classes fixed (labels, n_labels), after reading both files through every refusal."""
    _distinct_columns(cfg)
    train, dev = read_rows(cfg, "train_file"), read_rows(cfg, "dev_file")
    labels = cfg.labels
    if not cfg.regression and labels is None:
        labels = infer_labels(cfg.train_file, train)
    out = replace(cfg, labels=None if cfg.regression else [str(n).strip() for n in labels])
    out = replace(out, n_labels=1 if cfg.regression else len(out.labels))
    spec = spec_of(out)
    among = f"tasks.own.labels {spec.labels}" if cfg.labels is not None else None
    trained = to_examples(cfg.train_file, train, spec, among)[: cfg.max_train_examples or None]
    cut = f"the first {len(trained)} train rows (tasks.own.max_train_examples: shuffle the file, or raise it)"
    _varied(cfg.train_file, spec, trained, "train labels" if len(trained) == len(train) else f"labels of {cut}")
    scored = to_examples(cfg.dev_file, dev, spec, among or f"the train labels {list(spec.labels or ())}")
    if spec.is_regression:
        _varied(cfg.dev_file, spec, scored, "dev labels")
    keys = metric_keys(eval_of(out))
    if out.main_metric not in keys:
        raise ConfigError(f"tasks.own.main_metric={out.main_metric!r} is not one of {keys}")
    if cfg.labels is None and not cfg.regression:
        log.info(
            "task=own: classes %s from %s's labels (class ids in this order; tasks.own.labels sets them)",
            out.labels,
            cfg.train_file,
        )
    return out


def _distinct_columns(cfg: GlueTaskConfig) -> None:
    """Two settings naming one column (text_b=sentence1 beside text_a's default) would pair a text with itself."""
    seen = {}
    for key, name in columns(cfg).items():
        if name is not None and (other := seen.setdefault(name.strip().casefold(), key)) != key:
            raise ConfigError(
                f"tasks.own.{key}={name} names the column tasks.own.{other} reads; name each its own column"
            )


def infer_labels(path, rows: list[Row]) -> list[str]:
    """The train file's distinct labels, sorted; two spellings of one class ("Pos"/"pos", "1"/"1.0": a hand-edited
    or spreadsheet-exported file) are refused, not made two classes."""
    first: dict[str, int] = {}  # label -> its first line
    for r in rows:
        first.setdefault(r.label.strip(), r.line)
    spelt: dict[str | float, str] = {}
    for name, line in first.items():
        if (same := spelt.setdefault(_spelling(name), name)) != name:
            raise GlueDataError(
                f"{path}:{line}: label {name!r} is {same!r} (line {first[same]}) spelt another way; write one "
                f"spelling, or list both in tasks.own.labels if they are two classes"
            )
    integers = all(n.lstrip("-").isdigit() for n in first)  # 2 before 10, as run_glue's int column sorts
    return sorted(first, key=int if integers else str)


def _spelling(name: str) -> str | float:
    """What two spellings of one label share: its number, else its letters in one case."""
    try:
        return float(name)
    except ValueError:
        return name.casefold()


def _varied(path, spec: GlueTaskSpec, examples: list[Example], part: str) -> None:
    """One class to train on, or one score to fit or to correlate with (Pearson of a constant is undefined, scored
    0), teaches or measures nothing: refused, whether the classes were inferred or listed."""
    values = sorted({e.label for e in examples})
    if len(values) > 1:
        return
    if spec.labels is not None:
        raise GlueDataError(
            f"{path}: fewer than 2 classes among the {part} ({[spec.labels[int(v)] for v in values]}); a classifier "
            f"needs two or more (a numeric score: tasks.own.regression=true)"
        )
    raise GlueDataError(
        f"{path}: the {part} are all {values[0]}; a regression needs scores that vary (Pearson and Spearman of one "
        f"value are undefined)"
    )


def spec_of(cfg: GlueTaskConfig) -> GlueTaskSpec:
    """The GlueTaskSpec of a resolved own task: its files by absolute path, examples numbered by row."""
    col = columns(cfg)
    files = {s: str(Path(getattr(cfg, f"{s}_file")).expanduser().resolve()) for s in ("train", "dev")}
    labels = None if cfg.regression else tuple(cfg.labels)
    return GlueTaskSpec(
        OWN, OWN, labels, col["text_a"], col["text_b"], col["label"], files, index=None, evals=(OWN,), reader=read_split
    )


def eval_of(cfg: GlueTaskConfig) -> Eval:
    """Its one column, scored on dev: accuracy (+ F1 of the second class for two), or Pearson/Spearman. It makes the
    task's score (scored_evals), not the GLUE score's, which averages GLUE_TASKS alone."""
    if cfg.regression:
        return Eval(OWN, OWN, "dev", "test", OWN, ("pearson", "spearman"))
    metrics = ("acc", "f1") if cfg.n_labels == 2 else ("acc",)
    return Eval(OWN, OWN, "dev", "test", OWN, metrics, score_of=("acc",))


def metric_keys(e: Eval) -> list[str]:
    """What tasks.own.main_metric may name (lm.glue.metrics.metric_keys of a registered task)."""
    return ["score", *(f"{OWN}/{m}" for m in (*e.metrics, "score")), *e.metrics]


def registered_for(tasks) -> contextlib.AbstractContextManager:
    """The job's own task in the GLUE registry while it runs (lm.glue.tasks.registered), else nothing."""
    own = [t for t in tasks if t.name == OWN]
    return registered(spec_of(own[0]), eval_of(own[0])) if own else contextlib.nullcontext()


def read_split(t: GlueTaskSpec, split: str) -> list[Example]:
    """lm.glue.readers.load_split of the registered own task: train or dev as Examples."""
    names = {"text_a": t.text_a, "text_b": t.text_b, "label": t.label}
    path = t.files[split]
    among = f"the labels {list(t.labels)}" if t.labels else None
    return to_examples(path, _rows(path, names), t, among)


# -- reading -----------------------------------------------------------------------------------------


def read_rows(cfg: GlueTaskConfig, key: str) -> list[Row]:
    path = getattr(cfg, key)
    if not Path(path).expanduser().is_file():
        raise GlueDataMissing(f"tasks.own.{key}={path}: no such file")
    return _rows(Path(path).expanduser(), columns(cfg))


def _rows(path, names: dict) -> list[Row]:
    fmt = FORMATS[Path(path).suffix.lower()]
    rows = _jsonl(path, names) if fmt == "jsonl" else _table(path, fmt, names)
    if not rows:
        raise GlueDataError(f"{path}: no examples; expected {'a header line, then ' * (fmt != 'jsonl')}one per line")
    for r in rows:
        for key, value in (("text_a", r.text_a), ("text_b", r.text_b), ("label", r.label)):
            if value is not None and not value.strip():
                what = "label" if key == "label" else "text"
                raise GlueDataError(f"{path}:{r.line}: the {what} {names[key]!r} is empty; fill it or delete the row")
    return rows


def _table(path, fmt: str, names: dict) -> list[Row]:
    with open(path, "rb") as f:
        rows = csv.reader(_text_lines(path, f, restore=""), **_DIALECTS[fmt])
        header = _next_row(path, fmt, rows)
        if header is None:
            raise GlueDataError(f"{path}: the file is empty; expected a header line naming the columns")
        at = {key: _column(path, header, name, key) for key, name in names.items() if name is not None}
        out = []
        while (row := _next_row(path, fmt, rows)) is not None:
            if not row:  # a blank line is no example
                continue
            if len(row) != len(header):
                raise GlueDataError(
                    f"{path}:{rows.line_num}: {len(row)} column(s), the header has {len(header)}; a field holding "
                    f'{"a comma" if fmt == "csv" else "a tab"} or a newline must be quoted ("...")'
                )
            out.append(Row(rows.line_num, *(row[at[k]] if k in at else None for k in ("text_a", "text_b", "label"))))
    return out


def _column(path, header: list[str], name: str, key: str) -> int:
    at = find_column(header, name)
    if at is None:
        raise GlueDataError(f"{path}:1: no column {name!r} in the header {header[:20]}; name it with tasks.own.{key}=")
    if header.count(header[at]) > 1:  # which one the user meant, no reader can tell (pandas reads the first)
        raise GlueDataError(
            f"{path}:1: the header names {header[at]!r} {header.count(header[at])} times; rename all but one"
        )
    return at


def _next_row(path, fmt: str, rows) -> list[str] | None:
    try:
        return next(rows, None)
    except csv.Error as e:
        raise GlueDataError(f"{path}:{rows.line_num}: not a readable {fmt.upper()} row ({e})") from None


def _jsonl(path, names: dict) -> list[Row]:
    out = []
    with open(path, "rb") as f:
        for n, line in enumerate(_text_lines(path, f, restore=""), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise GlueDataError(f"{path}:{n}: not JSON ({e.msg}, column {e.colno}); one object a line") from None
            if not isinstance(obj, dict):
                raise GlueDataError(f"{path}:{n}: a JSON {type(obj).__name__}, not an object; one object a line")
            fields = {k: _field(path, n, obj, name, k) for k, name in names.items() if name is not None}
            out.append(Row(n, fields["text_a"], fields.get("text_b"), fields["label"]))
    return out


def _field(path, n: int, obj: dict, name: str, key: str) -> str:
    at = find_column(list(obj), name)
    if at is None:
        raise GlueDataError(f"{path}:{n}: no field {name!r} (has: {list(obj)[:20]}); name it with tasks.own.{key}=")
    value = obj[list(obj)[at]]
    if isinstance(value, str):
        return value
    if key == "label" and isinstance(value, (int, float)):  # bool too: {"label": true} is a common binary label
        return json.dumps(value)  # 1 -> "1", 0.5 -> "0.5", true -> "true": the label as the file writes it
    if value is None:
        return ""  # refused as empty
    raise GlueDataError(
        f"{path}:{n}: field {name!r} holds a JSON {type(value).__name__}, not "
        f"{'a string' if key != 'label' else 'a string or number'}"
    )


def to_examples(path, rows: list[Row], t: GlueTaskSpec, among: str | None) -> list[Example]:
    """Rows as Examples numbered by row; `among`: how a label's refusal names the classes it is not one of."""
    return [Example(i, r.text_a, r.text_b, _label(path, r, t, among)) for i, r in enumerate(rows)]


def _label(path, r: Row, t: GlueTaskSpec, among: str | None) -> int | float:
    if t.is_regression:
        try:
            score = float(r.label)
        except ValueError:
            score = math.nan
        if not math.isfinite(score):
            raise GlueDataError(
                f"{path}:{r.line}: label {r.label!r} is not a number, which tasks.own.regression=true reads; fix the "
                f"row, or drop regression=true for classes"
            )
        return score
    name = r.label.strip()
    if name not in t.labels:
        raise GlueDataError(
            f"{path}:{r.line}: label {r.label!r} is not among {among}; fix the row, or list every class in "
            f"tasks.own.labels"
        )
    return t.labels.index(name)
