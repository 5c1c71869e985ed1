"""lm prepare's corpus filters: exact deduplication (data.dedup) and the length filter (data.min_doc_chars)."""

import json

import numpy as np
import pytest

import lm.data.prepare as prep
from lm.data.documents import doc_key
from lm.data.manifest import open_prepared
from lm.data.prepare import prepare
from lm.data.tokenizer import Tokenizer

UNIQUE = [f"Story {i}: the fox number {i} found {i % 7} shiny stones by the river." for i in range(120)]
# Every fifth story again, once re-wrapped (a copy whose whitespace differs), and short lines.
COPIES = [UNIQUE[i] for i in range(0, 120, 5)] + ["  " + UNIQUE[3].replace(" ", "   ")]
SHORT = ["ok", "no", "a b c", "yes!"]
LINES = UNIQUE[:60] + COPIES + SHORT + UNIQUE[60:] + COPIES


def prepared(tmp_path, name, source, **settings):
    cfg = {"tokenizer": "bpe", "vocab_size": 320, "n_sentinels": 4, "val_fraction": 0.2, "workers": 1}
    cfg |= {"task_bytes": 1024, "source": str(source), "doc_split": "line", **settings}
    return prepare(cfg, tmp_path / name, progress=False)


def documents(out, splits=("train", "val")) -> list[str]:
    """The documents of `splits`, decoded, in order per split."""
    meta = json.loads((out / "meta.json").read_text())
    tok = Tokenizer.load(out)
    docs = []
    for split in splits:
        ids = np.concatenate([np.fromfile(out / s["file"], meta["dtype"]) for s in meta["splits"][split]["shards"]])
        docs += [tok.decode(d[:-1].tolist()) for d in np.split(ids, np.flatnonzero(ids == tok.eos_id) + 1)[:-1]]
    return docs


def is_subsequence(short: list, long: list) -> bool:
    it = iter(long)
    return all(x in it for x in short)


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(LINES) + "\n")
    return path


def test_dedup_keeps_each_text_once_whatever_its_whitespace(tmp_path, corpus):
    plain = prepared(tmp_path, "plain", corpus)
    out = prepared(tmp_path, "dedup", corpus, dedup=True, tokenizer=str(plain / "tokenizer.json"))  # same ids
    assert sorted(documents(plain)) == sorted(LINES)  # off: every line, copies included
    kept = documents(out)
    assert sorted(kept) == sorted(UNIQUE + SHORT)  # each story once; the re-wrapped copy counts as story 3
    meta = open_prepared(out)
    assert meta["dropped"]["duplicate_documents"] == 2 * len(COPIES)
    assert meta["splits"]["train"]["documents"] + meta["splits"]["val"]["documents"] == len(UNIQUE + SHORT)
    tokens = {
        name: sum(s["tokens"] for s in open_prepared(d)["splits"].values())
        for name, d in [("plain", plain), ("dedup", out)]
    }
    assert meta["dropped"]["duplicate_tokens"] == tokens["plain"] - tokens["dedup"] > 0
    for split in ("train", "val"):  # the corpus' order, less the copies
        assert is_subsequence(documents(out, [split]), documents(plain, [split]))
    assert "  " + UNIQUE[3].replace(" ", "   ") not in kept  # the first of the two forms is the one kept


def test_dedup_does_not_depend_on_the_worker_count(tmp_path, corpus):
    one = prepared(tmp_path, "one", corpus, dedup=True, workers=1)
    two = prepared(tmp_path, "two", corpus, dedup=True, workers=2)
    assert documents(one) == documents(two)
    assert open_prepared(one)["dropped"] == open_prepared(two)["dropped"]


def test_min_doc_chars_drops_short_documents_and_counts_them(tmp_path, corpus):
    out = prepared(tmp_path, "short", corpus, min_doc_chars=6)
    kept = documents(out)
    assert not set(SHORT) & set(kept) and sorted(kept) == sorted(UNIQUE[:60] + COPIES + UNIQUE[60:] + COPIES)
    assert open_prepared(out)["dropped"]["short_documents"] == len(SHORT)


def test_an_interrupted_dedup_run_resumes_to_identical_output(tmp_path, corpus, monkeypatch):
    full = prepared(tmp_path, "full", corpus, dedup=True, shard_tokens=700)
    real = prep.write_json

    def crash_after_three_tasks(path, obj):
        real(path, obj)
        if path.name == "progress.json" and obj["tasks_done"] == 3:
            with (path.parent / "dedup_keys.u64").open("ab") as f:  # keys written after the record, as a kill would
                f.write(np.array([doc_key(t) for t in UNIQUE], np.uint64).tobytes())
            raise KeyboardInterrupt

    monkeypatch.setattr(prep, "write_json", crash_after_three_tasks)
    with pytest.raises(KeyboardInterrupt):
        prepared(tmp_path, "cut", corpus, dedup=True, shard_tokens=700)
    monkeypatch.setattr(prep, "write_json", real)
    out = prepared(tmp_path, "cut", corpus, dedup=True, shard_tokens=700)
    assert documents(out) == documents(full)
    assert open_prepared(out)["dropped"] == open_prepared(full)["dropped"]
    assert not (out / "dedup_keys.u64").exists()


def test_a_directory_prepared_before_the_filters_is_still_current(tmp_path, corpus):
    out = prepared(tmp_path, "old", corpus)
    meta = json.loads((out / "meta.json").read_text())
    for key in ("dedup", "min_doc_chars"):  # what a directory written before these settings holds
        del meta["config"][key]
    (out / "meta.json").write_text(json.dumps(meta))
    assert prepared(tmp_path, "old", corpus) == out  # found complete, not refused or rebuilt
    with pytest.raises(Exception, match="differs in: \\['dedup'\\]"):
        prepared(tmp_path, "old", corpus, dedup=True)
