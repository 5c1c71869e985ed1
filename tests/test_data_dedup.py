"""lm prepare's corpus filters: exact deduplication (data.dedup) and the length filter (data.min_doc_chars)."""

import json

import numpy as np
import pytest

import lm.data.prepare as prep
from lm.data.dedup import Deduper, KeySet
from lm.data.documents import doc_key
from lm.data.manifest import open_prepared
from lm.data.prepare import prepare
from lm.data.tokenizer import Tokenizer
from lm.data.workers import Result

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


def test_the_key_set_agrees_with_a_python_set_through_collisions_and_growth():
    rng = np.random.default_rng(0)
    pool = rng.integers(1, 2**64, 3000, dtype=np.uint64, endpoint=False) | np.uint64(1)  # doc_key's are odd
    keys, reference = KeySet(bits=4), set()  # 16 slots: it grows, and keys collide, many times
    for _ in range(40):
        batch = np.unique(rng.choice(pool, 150))
        rng.shuffle(batch)
        assert keys.add(batch).tolist() == [k not in reference for k in batch.tolist()]
        reference.update(batch.tolist())
    assert keys.n == len(reference) and set(keys.table[keys.table != 0].tolist()) == reference


def test_the_keys_seen_cost_under_40_bytes_each(tmp_path):
    """The keys seen grow with the corpus (one per distinct document): a Python set of ints held ~75 bytes a key,
    37 GB for a corpus of 500M distinct lines."""
    import tracemalloc

    n = 200_000
    keys = np.random.default_rng(1).integers(1, 2**63, n, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    result = Result({"train": np.zeros(n, np.uint16)}, {"train": n}, 0, units={"train": (np.ones(n, np.int64), keys)})
    dedup = Deduper(tmp_path)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    dedup.filter(result)
    del result
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert dedup.n_keys == n
    assert held / n < 40, f"{held / n:.1f} bytes a key"
