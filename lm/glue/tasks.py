"""The GLUE registry: every task's files, columns and label strings, and the leaderboard columns.

Two kinds of entry, because the leaderboard's columns are not the tasks one trains:

- a `GlueTaskSpec` is what one reads and trains on (one directory of the GLUE download). `mnli` has two
  dev and two test files; `ax` (the diagnostic set, Wang et al. 2019 sec. 4) has only a test file
  and is predicted by the MNLI model.
- an `Eval` is one leaderboard column: a dev split scored with the leaderboard's metrics and a
  test split written as the submission file `<submission>.tsv`. MNLI gives two (MNLI-m, MNLI-mm)
  and predicts a third (AX, not part of the GLUE score).

Label strings are exactly what the leaderboard expects in submission files; a label's index in
`GlueTaskSpec.labels` is its class id (the same order as the Hugging Face `glue` dataset's ClassLabel).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

HF_DATASET = "nyu-mll/glue"  # the Hugging Face hub's GLUE (the old `glue` script name points here)
DOWNLOAD_HINT = (
    "download it with the classic script: `python download_glue_data.py --data_dir <root> --tasks all` "
    "(https://gist.github.com/W4ngatang/60c2bdb54d156a41194446737ce03e2e), point LM_DATA_MIRROR at the "
    "directory that holds glue_data/ (or pass lm finetune glue.data_root=<the glue_data directory>), or "
    f"`pip install datasets` with network access to use the Hugging Face copy {HF_DATASET} (HF_HUB_OFFLINE=1 "
    f"reads its local cache without network)"
)
BINARY = ("0", "1")
NLI3 = ("entailment", "neutral", "contradiction")
NLI2 = ("entailment", "not_entailment")


@dataclass(frozen=True)
class GlueTaskSpec:
    """One GLUE directory: where each split lives and which columns hold the texts and the label."""

    name: str  # registry key, as in the Hugging Face `glue` configs
    dir: str  # directory under the data root, as download_glue_data.py names it
    labels: tuple[str, ...] | None  # label strings in class-id order; None = regression (STS-B)
    text_a: str  # column names in the header
    text_b: str | None
    label: str | None
    files: dict[str, str]  # split -> file inside `dir`; splits starting with "test" carry no label
    index: str | None = "index"  # the id column; None or absent = the 0-based data row number
    headerless: tuple[str, ...] | None = None  # column names of labelled files that have no header (CoLA)
    hf_text: tuple[str, str | None] = ("sentence", None)  # field names in the Hugging Face dataset
    evals: tuple[str, ...] = ()  # leaderboard columns this task's model is scored on / predicts
    score_range: tuple[float, float] | None = None  # a regression task's label range (STS-B: 0 to 5)
    # how a split is read when not from GLUE's layout: (spec, split) -> examples (task=own: lm/glue/own.py read_split)
    reader: Callable[[GlueTaskSpec, str], list] | None = None

    @property
    def n_labels(self) -> int:
        """Output width of the head: 1 for regression (MSE), else the number of classes."""
        return len(self.labels) if self.labels else 1

    @property
    def is_regression(self) -> bool:
        return self.labels is None

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(self.files)


@dataclass(frozen=True)
class Eval:
    """One leaderboard column: its dev split, its test split and its metrics in leaderboard order."""

    name: str
    task: str  # the GlueTaskSpec whose files hold it
    dev: str | None  # split scored locally; None = no labelled split is public (AX)
    test: str
    submission: str  # file stem on the leaderboard: CoLA -> CoLA.tsv
    metrics: tuple[str, ...]  # the task score is their unweighted mean (Wang et al. 2019, sec. 4)
    in_glue_score: bool = True
    test_rows: int = 0  # rows of the official test file (the leaderboard rejects other counts)
    score_of: tuple[str, ...] | None = None  # the metrics its score averages; None = all (task=own: acc alone)

    @property
    def scored(self) -> tuple[str, ...]:
        return self.score_of or self.metrics


_SPLITS = {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}

TASKS: dict[str, GlueTaskSpec] = {
    t.name: t
    for t in (
        GlueTaskSpec(
            "cola",
            "CoLA",
            BINARY,
            "sentence",
            None,
            "label",
            dict(_SPLITS),
            headerless=("source", "label", "original_label", "sentence"),
            evals=("cola",),
        ),
        GlueTaskSpec("sst2", "SST-2", BINARY, "sentence", None, "label", dict(_SPLITS), evals=("sst2",)),
        GlueTaskSpec(
            "mrpc",
            "MRPC",
            BINARY,
            "#1 String",
            "#2 String",
            "Quality",
            dict(_SPLITS),
            hf_text=("sentence1", "sentence2"),
            evals=("mrpc",),
        ),
        GlueTaskSpec(
            "stsb",
            "STS-B",
            None,
            "sentence1",
            "sentence2",
            "score",
            dict(_SPLITS),
            hf_text=("sentence1", "sentence2"),
            evals=("stsb",),
            score_range=(0.0, 5.0),
        ),
        GlueTaskSpec(
            "qqp",
            "QQP",
            BINARY,
            "question1",
            "question2",
            "is_duplicate",
            dict(_SPLITS),
            index="id",
            hf_text=("question1", "question2"),
            evals=("qqp",),
        ),
        GlueTaskSpec(
            "mnli",
            "MNLI",
            NLI3,
            "sentence1",
            "sentence2",
            "gold_label",
            {
                "train": "train.tsv",
                "dev_matched": "dev_matched.tsv",
                "dev_mismatched": "dev_mismatched.tsv",
                "test_matched": "test_matched.tsv",
                "test_mismatched": "test_mismatched.tsv",
            },
            hf_text=("premise", "hypothesis"),
            evals=("mnli_m", "mnli_mm", "ax"),
        ),
        GlueTaskSpec(
            "qnli",
            "QNLI",
            NLI2,
            "question",
            "sentence",
            "label",
            dict(_SPLITS),
            hf_text=("question", "sentence"),
            evals=("qnli",),
        ),
        GlueTaskSpec(
            "rte",
            "RTE",
            NLI2,
            "sentence1",
            "sentence2",
            "label",
            dict(_SPLITS),
            hf_text=("sentence1", "sentence2"),
            evals=("rte",),
        ),
        GlueTaskSpec(
            "wnli",
            "WNLI",
            BINARY,
            "sentence1",
            "sentence2",
            "label",
            dict(_SPLITS),
            hf_text=("sentence1", "sentence2"),
            evals=("wnli",),
        ),
        GlueTaskSpec(
            "ax",
            "diagnostic",
            NLI3,
            "sentence1",
            "sentence2",
            None,
            {"test": "diagnostic.tsv"},
            hf_text=("premise", "hypothesis"),
        ),
    )
}

# Leaderboard column order. Test row counts are those of the official test files.
EVALS: dict[str, Eval] = {
    e.name: e
    for e in (
        Eval("cola", "cola", "dev", "test", "CoLA", ("mcc",), test_rows=1063),
        Eval("sst2", "sst2", "dev", "test", "SST-2", ("acc",), test_rows=1821),
        Eval("mrpc", "mrpc", "dev", "test", "MRPC", ("f1", "acc"), test_rows=1725),
        Eval("stsb", "stsb", "dev", "test", "STS-B", ("pearson", "spearman"), test_rows=1379),
        Eval("qqp", "qqp", "dev", "test", "QQP", ("f1", "acc"), test_rows=390965),
        Eval("mnli_m", "mnli", "dev_matched", "test_matched", "MNLI-m", ("acc",), test_rows=9796),
        Eval("mnli_mm", "mnli", "dev_mismatched", "test_mismatched", "MNLI-mm", ("acc",), test_rows=9847),
        Eval("qnli", "qnli", "dev", "test", "QNLI", ("acc",), test_rows=5463),
        Eval("rte", "rte", "dev", "test", "RTE", ("acc",), test_rows=3000),
        Eval("wnli", "wnli", "dev", "test", "WNLI", ("acc",), test_rows=146),
        # AX's score on the leaderboard is R3, the K-class Matthews correlation (Gorodkin 2004).
        Eval("ax", "ax", None, "test", "AX", ("mcc",), in_glue_score=False, test_rows=1104),
    )
}

# The leaderboard's eleven columns: the submission files (EVALS may also hold a task=own column during its job)
LEADERBOARD: tuple[str, ...] = tuple(EVALS)

# The nine tasks the GLUE score averages; MNLI counts once, as the mean of MNLI-m and MNLI-mm.
GLUE_TASKS: tuple[str, ...] = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")

METRIC_NAMES = {"mcc": "MCC", "acc": "acc", "f1": "F1", "pearson": "Pearson", "spearman": "Spearman"}


def get_task(name: str) -> GlueTaskSpec:
    key = name.lower().replace("-", "")
    key = {"sst": "sst2", "sts": "stsb", "diagnostic": "ax"}.get(key, key)
    if key not in TASKS:
        raise KeyError(f"unknown GLUE task {name!r}; known: {sorted(TASKS)}")
    return TASKS[key]


def get_eval(name: str) -> Eval:
    key = name.lower().replace("-", "_")
    key = {"mnli_matched": "mnli_m", "mnli_mismatched": "mnli_mm", "sst_2": "sst2", "sts_b": "stsb"}.get(key, key)
    if key not in EVALS:
        raise KeyError(f"unknown GLUE leaderboard column {name!r}; known: {list(EVALS)}")
    return EVALS[key]


def scored_evals(task: str) -> tuple[str, ...]:
    """The leaderboard columns that make up `task`'s score (MNLI: mnli_m and mnli_mm; never AX)."""
    return tuple(e for e in get_task(task).evals if EVALS[e].in_glue_score)


OWN = "own"  # task=own: a user's train and dev files (lm/glue/own.py)


@contextmanager
def registered(spec: GlueTaskSpec, column: Eval) -> Iterator[None]:
    """`spec` in TASKS and `column` in EVALS while a job runs (task=own). The GLUE path looks tasks and leaderboard
    columns up by name in a dozen places (reading, metrics, model selection, results, grid reports); the entry is
    installed for that one job and removed after it, so the registry is GLUE's again for the next."""
    if spec.name in TASKS or column.name in EVALS:
        raise ValueError(f"task {spec.name!r} is already registered")
    TASKS[spec.name], EVALS[column.name] = spec, column
    try:
        yield
    finally:
        TASKS.pop(spec.name, None)
        EVALS.pop(column.name, None)
