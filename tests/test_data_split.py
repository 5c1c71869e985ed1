"""The train/val split of lm prepare on JSON Lines: every record whole, in one split, counted once."""

import gzip
import json
import zlib
from collections import Counter

import numpy as np
import pytest

from lm.data import readers
from lm.data.prepare import prepare
from lm.data.tokenizer import Tokenizer

RECORDS = [f"Record {i}: " + "a fox found a stone. " * (1 + i % 7) for i in range(120)]


def documents(out, split):
    """The split's documents decoded, each one the tokens before an EOS (a tail without EOS fails)."""
    meta = json.loads((out / "meta.json").read_text())
    ids = np.concatenate([np.fromfile(out / s["file"], dtype=meta["dtype"]) for s in meta["splits"][split]["shards"]])
    tok, eos = Tokenizer.load(out), meta["tokenizer"]["specials"]["eos"]
    cuts = np.flatnonzero(ids == eos)
    assert len(cuts) and cuts[-1] == len(ids) - 1, f"{split} ends inside a document"
    docs = [tok.decode(ids[a + 1 : b].tolist()) for a, b in zip([-1, *cuts[:-1]], cuts)]
    assert meta["splits"][split]["documents"] == len(docs)
    return docs


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_a_contiguous_split_of_jsonl_cuts_between_records(tmp_path, suffix):
    """split=contiguous cut at a character of the file; in JSON Lines that was inside a record, whose two
    halves are not JSON: a valid file was refused ("not valid JSON"), or with bad_records=skip lost a record."""
    lines = "".join(json.dumps({"text": r}) + "\n" for r in RECORDS).encode()
    path = tmp_path / f"recs{suffix}"
    path.write_bytes(gzip.compress(lines) if suffix.endswith(".gz") else lines)
    cfg = {"tokenizer": "char", "n_sentinels": 0, "split": "contiguous", "val_fraction": 0.1, "workers": 1}
    out = prepare({**cfg, "source": str(path), "task_bytes": 1000}, tmp_path / "out", progress=False)
    train, val = documents(out, "train"), documents(out, "val")
    assert train + val == RECORDS  # in order, each record whole and in one split
    assert 8 <= len(val) <= 14  # the last ~10% of the characters, moved to the end of a record
    meta = json.loads((out / "meta.json").read_text())
    assert meta["skipped"]["bad_records"] == 0


def test_the_first_record_after_a_contiguous_cut_is_filtered_like_the_others(tmp_path):
    """The record after the cut was taken for the rest of a cut document, so min_doc_chars and dedup let it
    through; the cut lands among the short records here, and none of them may survive."""
    records = RECORDS[:100] + ["ab"] * 60 + [RECORDS[100]]
    path = tmp_path / "recs.jsonl"
    path.write_text("".join(json.dumps({"text": r}) + "\n" for r in records))
    cfg = {"tokenizer": "char", "n_sentinels": 0, "split": "contiguous", "val_fraction": 0.06, "workers": 1}
    out = prepare({**cfg, "source": str(path), "min_doc_chars": 5}, tmp_path / "out", progress=False)
    assert documents(out, "train") == RECORDS[:100] and documents(out, "val") == [RECORDS[100]]
    assert json.loads((out / "meta.json").read_text())["dropped"]["short_documents"] == 60


def test_copies_of_a_file_are_in_one_split_with_doc_split_file(tmp_path):
    """doc_split=file decided a file's split by its name, so a copy under another name (a corpus' duplicate) went to
    train while the original was scored in val. By content, every pair is in one split; a file longer than a task
    too."""
    corpus = tmp_path / "books"
    corpus.mkdir()
    for i in range(30):
        text = "\n".join(RECORDS[i : i + 3 + (i % 4) * 20]) + "\n"  # i % 4 == 3: ~6 KB, cut across tasks
        (corpus / f"book{i:02d}.txt").write_text(text)
        (corpus / f"copy_of_{i:02d}.txt").write_text(text)
    cfg = {"tokenizer": "char", "n_sentinels": 0, "doc_split": "file", "val_fraction": 0.3, "workers": 1}
    out = prepare({**cfg, "source": str(corpus), "task_bytes": 2048}, tmp_path / "out", progress=False)
    train, val = documents(out, "train"), documents(out, "val")
    assert len(train) + len(val) == 60 and val
    assert not set(train) & set(val)
    assert all(train.count(d) == 2 for d in train) and all(val.count(d) == 2 for d in val)


def test_doc_split_file_reads_a_file_once_per_pass_and_splits_it_by_its_whole_content(tmp_path, monkeypatch):
    """A whole-file document's split is a hash of the file, which the planner read in a pass of its own before the
    file's tasks read it again: every file was read 4 times (twice for the tokenizer, twice to tokenize). A file
    within one task is hashed from that task's bytes now (2 reads); a longer one is still read first (4)."""
    opened = Counter()
    real = readers.HashingReader.__init__

    def counting(self, path):
        opened[path.rsplit("/", 1)[-1]] += 1
        real(self, path)

    monkeypatch.setattr(readers.HashingReader, "__init__", counting)
    corpus, texts = tmp_path / "books", {}
    corpus.mkdir()
    for i in range(24):
        texts[f"b{i:02d}.txt"] = "\n".join(RECORDS[i : i + 3]) + "\n"
    texts["long.txt"] = "\n".join(RECORDS) + "\n"  # ~8 KB: cut across tasks
    for name, text in texts.items():
        bom = b"\xef\xbb\xbf" if name in ("b03.txt", "long.txt") else b""  # not text: hash and document leave it out
        (corpus / name).write_bytes(bom + text.encode())
    cfg = {"tokenizer": "char", "n_sentinels": 0, "doc_split": "file", "val_fraction": 0.3, "workers": 1}
    out = prepare({**cfg, "source": str(corpus), "task_bytes": 2048}, tmp_path / "out", progress=False)
    assert opened == {**dict.fromkeys(texts, 2), "long.txt": 4}
    val = sorted(n for n, t in texts.items() if zlib.crc32(t.encode()) < 0.3 * 2**32)  # ReadOptions.is_val, seed 0
    assert len(val) == 7 and "b03.txt" in val and "long.txt" not in val  # both splits, and the BOM file in val
    assert sorted(documents(out, "val")) == sorted(texts[n] for n in val)
    assert sorted(documents(out, "train")) == sorted(t for n, t in texts.items() if n not in val)
