"""GLUE readers: the real files in $LM_DATA_MIRROR/glue_data, official-format fixtures for the rest,
and the errors for missing and malformed data."""

import os
import random
import sys
import types
from collections import Counter
from pathlib import Path

import pytest

from lm.glue import (
    EVALS,
    GLUE_TASKS,
    TASKS,
    GlueDataError,
    GlueDataMissing,
    data_root,
    load_eval,
    load_split,
    split_path,
)

FIXTURES = Path(__file__).parent / "fixtures" / "glue"
BAD = FIXTURES / "malformed"


@pytest.fixture
def real_root(data_mirror):
    return data_mirror / "glue_data"


# Official sizes ($LM_DATA_MIRROR/MANIFEST.md; GLUE paper Table 1) and label counts by class id.
REAL = [
    ("cola", "train", 8551, {1: 6023, 0: 2528}),
    ("cola", "dev", 1043, {1: 721, 0: 322}),
    ("cola", "test", 1063, {None: 1063}),
    ("sst2", "train", 67349, {1: 37569, 0: 29780}),
    ("sst2", "dev", 872, {1: 444, 0: 428}),
    ("sst2", "test", 1821, {None: 1821}),
    ("mrpc", "train", 3668, {1: 2474, 0: 1194}),
    ("mrpc", "dev", 408, {1: 279, 0: 129}),
    ("mrpc", "test", 1725, {None: 1725}),
    ("qnli", "dev", 5463, {1: 2761, 0: 2702}),
    ("qnli", "test", 5463, {None: 5463}),
    ("rte", "train", 2490, {0: 1249, 1: 1241}),
    ("rte", "dev", 277, {0: 146, 1: 131}),  # 146/277 = 52.7%, the majority baseline
    ("rte", "test", 3000, {None: 3000}),
    ("wnli", "dev", 71, {0: 40, 1: 31}),
    ("wnli", "test", 146, {None: 146}),
]


@pytest.mark.parametrize("task,split,n,labels", REAL, ids=[f"{t}-{s}" for t, s, _, _ in REAL])
def test_real_files_have_official_sizes_and_label_counts(real_root, task, split, n, labels):
    examples = load_split(task, split, root=real_root, hf=False)
    assert len(examples) == n
    assert dict(Counter(e.label for e in examples)) == labels
    pair = TASKS[task].text_b is not None
    assert all((e.text_b is not None) == pair and e.text_a for e in examples)
    if split == "test":  # submissions are keyed by the test file's own index column: 0..N-1 in GLUE
        assert [e.index for e in examples] == list(range(n))


def test_stsb_scores_are_floats_in_range(real_root):
    train, dev = (load_split("stsb", s, root=real_root, hf=False) for s in ("train", "dev"))
    assert (len(train), len(dev), len(load_split("stsb", "test", root=real_root, hf=False))) == (5749, 1500, 1379)
    assert dev[0] == (0, "A man with a hard hat is dancing.", "A man wearing a hard hat is dancing.", 5.0)
    assert dev[1].label == 4.75 and isinstance(dev[1].label, float)
    assert min(e.label for e in train) == 0.0 and max(e.label for e in train) == 5.0


def test_mrpc_bom_header_and_unbalanced_quotes(real_root):
    # The BOM sits before "Quality", the label column: a reader that kept it would not find the label.
    raw = (real_root / "MRPC" / "dev.tsv").read_bytes()
    assert raw.startswith(b"\xef\xbb\xbfQuality")
    first = load_split("mrpc", "dev", root=real_root, hf=False)[0]
    # The second sentence opens a quote it never closes; QUOTE_NONE keeps it as text on one line.
    assert first.text_b == '"The foodservice pie business does not fit our long-term growth strategy.'
    assert first.label == 1


def test_cola_headerless_train_and_headed_test(real_root):
    train = load_split("cola", "train", root=real_root, hf=False)
    assert train[0] == (0, "Our friends won't buy this analysis, let alone the next one we propose.", None, 1)
    test = load_split("cola", "test", root=real_root, hf=False)
    assert test[0] == (0, "Bill whistled past the house.", None, None)


def test_default_root_is_the_mirror(real_root, monkeypatch):
    monkeypatch.setenv("LM_DATA_MIRROR", str(real_root.parent))
    assert data_root() == real_root
    assert len(load_split("wnli", "dev", hf=False)) == 71
    monkeypatch.delenv("LM_DATA_MIRROR")
    assert data_root() == Path("glue_data")


def test_qqp_fixture():
    train = load_split("qqp", "train", root=FIXTURES, hf=False)
    assert [e.label for e in train] == [1, 0, 1, 0, 1, 0]
    assert train[2].text_a == 'What does "carpe diem" mean?'
    assert train[5].text_a == 'Who wrote "War and Peace?'  # unbalanced quote: still one row
    dev = load_split("qqp", "dev", root=FIXTURES, hf=False)
    assert [e.index for e in dev] == [10, 11, 12, 13, 14]  # QQP's id column is "id"
    test = load_split("qqp", "test", root=FIXTURES, hf=False)
    assert test[3] == (3, "How do plants make food?", "What is photosynthesis?", None)


def test_mnli_fixture_all_splits_and_columns():
    n = {s: len(load_split("mnli", s, root=FIXTURES, hf=False)) for s in TASKS["mnli"].splits}
    assert n == {"train": 5, "dev_matched": 4, "dev_mismatched": 3, "test_matched": 3, "test_mismatched": 2}
    train = load_split("mnli", "train", root=FIXTURES, hf=False)  # 12 columns
    assert [e.label for e in train] == [1, 0, 0, 0, 2]  # neutral entailment entailment entailment contradiction
    dev_m = load_eval("mnli_m", "dev", root=FIXTURES, hf=False)  # 16 columns: gold_label is the last
    assert [TASKS["mnli"].labels[e.label] for e in dev_m] == ["neutral", "contradiction", "entailment", "entailment"]
    assert dev_m[0].text_a == "The new rights are nice enough."
    assert dev_m[0].text_b == "Everyone really likes the newest benefits."
    mm = load_eval("mnli_mm", "dev", root=FIXTURES, hf=False)
    assert [e.label for e in mm] == [2, 2, 1]
    test_mm = load_eval("mnli_mm", "test", root=FIXTURES, hf=False)
    assert test_mm[1] == (1, "The word has two meanings.", "The word means only one thing.", None)


def test_ax_fixture_is_test_only():
    ax = load_eval("ax", "test", root=FIXTURES, hf=False)
    assert len(ax) == 4 and ax[0] == (0, "The cat sat on the mat.", "The cat did not sit on the mat.", None)
    assert split_path("ax", "test", FIXTURES) == FIXTURES / "diagnostic" / "diagnostic.tsv"
    with pytest.raises(GlueDataMissing, match="no public labelled split"):
        load_eval("ax", "dev", root=FIXTURES)


def test_qnli_and_wnli_train_fixtures():
    qnli = load_split("qnli", "train", root=FIXTURES, hf=False)
    assert [TASKS["qnli"].labels[e.label] for e in qnli] == [
        "not_entailment",
        "entailment",
        "not_entailment",
        "entailment",
    ]
    assert [e.label for e in load_split("wnli", "train", root=FIXTURES, hf=False)] == [1, 1, 0]


def test_registry_covers_the_leaderboard():
    assert GLUE_TASKS == ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")
    assert [e.submission for e in EVALS.values()] == [
        "CoLA",
        "SST-2",
        "MRPC",
        "STS-B",
        "QQP",
        "MNLI-m",
        "MNLI-mm",
        "QNLI",
        "RTE",
        "WNLI",
        "AX",
    ]
    assert TASKS["mnli"].labels == TASKS["ax"].labels == ("entailment", "neutral", "contradiction")
    assert TASKS["qnli"].labels == TASKS["rte"].labels == ("entailment", "not_entailment")
    assert all(TASKS[t].labels == ("0", "1") for t in ("cola", "sst2", "mrpc", "qqp", "wnli"))
    assert TASKS["stsb"].labels is None and TASKS["stsb"].n_labels == 1 and TASKS["mnli"].n_labels == 3


# -- errors ----------------------------------------------------------------------------------------


def test_missing_file_names_path_and_how_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        load_split("qqp", "dev", root=tmp_path, hf=False)
    msg = str(e.value)
    assert str(tmp_path / "QQP" / "dev.tsv") in msg
    assert "download_glue_data.py" in msg and "LM_DATA_MIRROR" in msg and "nyu-mll/glue" in msg


def test_unknown_task_and_split():
    with pytest.raises(KeyError, match="known"):
        load_split("squad", "dev")
    with pytest.raises(KeyError, match="dev_matched"):
        load_split("mnli", "dev")


@pytest.fixture
def hub_up(monkeypatch):
    """The hub counts as reachable (the probe is not run): the tests' fake `datasets` answers instead."""
    import lm.glue.readers as R

    monkeypatch.setattr(R, "hub_unreachable", lambda: None)


def test_hf_fallback_only_when_no_local_copy(tmp_path, monkeypatch, hub_up):
    calls = []

    def load_dataset(path, name, split):
        calls.append((path, name, split))
        if split.startswith("test"):
            return [{"premise": "P.", "hypothesis": "H.", "label": -1, "idx": 0}]
        return [
            {"premise": "P.", "hypothesis": "H.", "label": 2, "idx": 0},
            {"premise": "Q.", "hypothesis": "I.", "label": 0, "idx": 1},
        ]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    dev = load_split("mnli", "dev_mismatched", root=tmp_path)
    assert dev == [(0, "P.", "H.", 2), (1, "Q.", "I.", 0)]
    assert load_split("ax", "test", root=tmp_path) == [(0, "P.", "H.", None)]
    assert calls == [("nyu-mll/glue", "mnli", "validation_mismatched"), ("nyu-mll/glue", "ax", "test")]
    assert len(load_split("mnli", "train", root=FIXTURES)) == 5 and len(calls) == 2  # local copy wins


def test_hf_failure_names_the_local_path_too(tmp_path, monkeypatch, hub_up):
    def offline(*a, **k):
        raise ConnectionError("Couldn't reach the Hub (offline)")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    with pytest.raises(GlueDataMissing) as e:
        load_split("rte", "train", root=tmp_path)
    assert str(tmp_path / "RTE" / "train.tsv") in str(e.value) and "offline" in str(e.value)
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    with pytest.raises(GlueDataMissing, match="not installed"):
        load_split("rte", "train", root=tmp_path)


def test_an_unreachable_hub_fails_at_once_naming_glue_data_root(tmp_path, monkeypatch):
    """Offline, the hub client retried for ~30 s before failing; now one TCP probe decides (issue 49)."""
    import socket

    import lm.glue.readers as R

    def never(*a, **k):
        raise AssertionError("the hub was tried although it is unreachable")

    def refused(address, timeout=None):
        raise OSError(101, "Network is unreachable")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=never))
    monkeypatch.setattr(socket, "create_connection", refused)
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    R.hub_unreachable.cache_clear()
    try:
        with pytest.raises(GlueDataMissing) as e:
            load_split("rte", "train", root=tmp_path)
    finally:
        R.hub_unreachable.cache_clear()
    msg = str(e.value)
    assert str(tmp_path / "RTE" / "train.tsv") in msg and "huggingface.co) is not reachable" in msg
    assert "glue.data_root=" in msg and "root=..." not in msg


ENCODINGS = {  # a two-line SST-2 train file, badly encoded: (bytes, line named, what the message says)
    "utf16_with_bom": ("sentence\tlabel\na fine film\t1\n".encode("utf-16"), 1, "UTF-16 or binary, not UTF-8"),
    "utf16_without_bom": ("sentence\tlabel\na fine film\t1\n".encode("utf-16-le"), 1, "UTF-16 or binary"),
    "random_bytes": (random.Random(0).randbytes(4096), 1, "not UTF-8 text"),
    "one_bad_byte": (b"sentence\tlabel\na good film\t1\na fine\xff film\t1\n", 3, "not UTF-8 text (byte b'\\xff'"),
    "long_field": (("sentence\tlabel\n" + "a" * 200_000 + "\t1\n").encode(), 2, "field larger than field limit"),
    "long_line": (b"sentence\tlabel\n" + b"a" * (3 << 20), 2, "longer than 1,048,576 bytes"),
    # lone CR line ends were "new-line character seen in unquoted field ...; no GLUE example is that long", or past
    # 1 MiB "the line is longer than 1,048,576 bytes"
    "lone_cr": (b"sentence\tlabel\ra fine film\t1\r", 1, "lone CR (classic Mac OS)"),
    "lone_cr_long": (b"sentence\tlabel\r" + b"a fine film\t1\r" * 100_000, 1, "tr '\\r' '\\n' <"),
}


@pytest.mark.parametrize("case", list(ENCODINGS))
def test_a_file_that_is_not_utf8_text_names_file_and_line(tmp_path, case):
    data, line, what = ENCODINGS[case]
    path = tmp_path / "SST-2" / "train.tsv"
    path.parent.mkdir()
    path.write_bytes(data)
    with pytest.raises(GlueDataError) as e:
        load_split("sst2", "train", root=tmp_path, hf=False)
    msg = str(e.value)
    assert msg.startswith(f"{path}:{line}: ") and what in msg and "\n" not in msg, msg


def test_a_bom_and_crlf_line_ends_still_read(tmp_path):
    path = tmp_path / "SST-2" / "train.tsv"
    path.parent.mkdir()
    path.write_bytes(b"\xef\xbb\xbfsentence\tlabel\r\na fine film\t1\r\n")
    assert load_split("sst2", "train", root=tmp_path, hf=False) == [(0, "a fine film", None, 1)]


def test_a_header_in_another_case_or_with_spaces_and_a_label_with_spaces_read(tmp_path):
    """A file edited in a spreadsheet: 'Label ' was 'no column 'label'', a label '1 ' 'not one of ['0', '1']'."""
    path = tmp_path / "SST-2" / "train.tsv"
    path.parent.mkdir()
    path.write_text("Sentence\tLabel \na fine film\t1 \na dull one\t 0\n")
    assert load_split("sst2", "train", root=tmp_path, hf=False) == [
        (0, "a fine film", None, 1),
        (1, "a dull one", None, 0),
    ]
    path.write_text("sentence\tLABEL\tlabel \na fine film\t1\t1\n")  # two loose matches: which one is meant?
    with pytest.raises(GlueDataError, match=f"{path}:1: no column 'label' in the header"):
        load_split("sst2", "train", root=tmp_path, hf=False)


def test_blank_lines_at_the_end_are_skipped_and_one_among_the_examples_is_refused(tmp_path):
    """Trailing blank lines (an editor's) were refused as a row of 0 columns; most TSV readers skip them."""
    path = tmp_path / "SST-2" / "train.tsv"
    path.parent.mkdir()
    path.write_text("sentence\tlabel\na fine film\t1\n\n\n")
    assert load_split("sst2", "train", root=tmp_path, hf=False) == [(0, "a fine film", None, 1)]
    path.write_text("sentence\tlabel\na fine film\t1\n\na dull one\t0\n")
    with pytest.raises(GlueDataError, match=f"{path}:3: expected 2 tab-separated columns .*found 0"):
        load_split("sst2", "train", root=tmp_path, hf=False)


@pytest.mark.parametrize(
    "case,task,split,line,what",
    [
        ("columns", "rte", "dev", 3, "expected 4 tab-separated columns"),
        ("label", "sst2", "dev", 4, "label '2' is not one of"),
        ("score", "stsb", "dev", 3, "score 'high' is not a number"),
        ("score_range", "stsb", "dev", 2, "score '5.200' is not a number in \\[0, 5\\]"),
        ("nli_label", "mnli", "dev_matched", 2, "label '-' is not one of"),
        ("header", "qnli", "dev", 1, "no column 'sentence'"),
    ],
)
def test_malformed_rows_name_file_and_line(case, task, split, line, what):
    path = split_path(task, split, BAD / case)
    with pytest.raises(GlueDataError, match=what) as e:
        load_split(task, split, root=BAD / case, hf=False)
    assert f"{path}:{line}:" in str(e.value)


def test_empty_file(tmp_path):
    (tmp_path / "RTE").mkdir()
    (tmp_path / "RTE" / "dev.tsv").write_text("")
    with pytest.raises(GlueDataError, match="empty"):
        load_split("rte", "dev", root=tmp_path, hf=False)


def test_fixture_root_is_not_the_real_data():
    # The fixtures are hand-written; the real data stays outside the repository (in $LM_DATA_MIRROR).
    assert not (FIXTURES / "CoLA").exists() and os.path.getsize(FIXTURES / "QQP" / "train.tsv") < 2000


def test_a_field_over_the_limit_is_refused_after_a_table_was_read_in_the_same_process(tmp_path):
    """lm.data.tables raised csv's process-wide field limit at import, so once lm prepare had read a table, a GLUE
    file with a 200,000-character field was read as an example (it failed only run after such a test)."""
    import csv
    import io

    from lm.data.tables import table_values

    before = csv.field_size_limit()
    src = type("Src", (), {"path": tmp_path / "t.csv", "format": "csv"})()  # the SourceFile fields it reads
    assert list(table_values(src, io.BytesIO(b"text\n" + b"a" * 200_000 + b"\n"), "text")) == ["a" * 200_000]
    assert csv.field_size_limit() == before  # restored once the table is read
    csv.field_size_limit(2**31 - 1)  # as another reader of the process may leave it
    try:
        data, line, what = ENCODINGS["long_field"]
        path = tmp_path / "SST-2" / "train.tsv"
        path.parent.mkdir()
        path.write_bytes(data)
        with pytest.raises(GlueDataError, match=f"{path}:{line}: field larger than field limit"):
            load_split("sst2", "train", root=tmp_path, hf=False)
    finally:
        csv.field_size_limit(before)
