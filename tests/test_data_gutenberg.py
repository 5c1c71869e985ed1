"""The gutenberg corpus: zstd JSONL shards with their own train/validation split, read streaming by
lm prepare; bad shards (truncated, not zstd, a line that is not JSON or has no text) are reported with
file and line (or byte) and the fix, and never half-written; the mixed corpus and its `glue:` source."""

import json
from itertools import islice
from pathlib import Path

import numpy as np
import pytest
import zstandard

from lm.data.corpora import CORPORA
from lm.data.errors import DataError
from lm.data.manifest import open_prepared
from lm.data.prepare import prepare
from lm.data.sources import resolve

BOOK = "It was a bright cold day in April, and the clocks were striking thirteen. " * 8
BOOKS = [
    {"text": f"Book {i}. {BOOK}Chapter {i} ends here.", "title": f"Title {i}", "author": "A. Writer"} for i in range(40)
]


def shard(path, records, frames=1):
    """A .jsonl.zst shard as the mirror's are made (one JSON object per line, zstd frames)."""
    lines = [(json.dumps(r) if isinstance(r, dict) else r) + "\n" for r in records]
    step = -(-len(lines) // frames)
    path.write_bytes(
        b"".join(
            zstandard.ZstdCompressor(level=3).compress("".join(lines[i : i + step]).encode())
            for i in range(0, len(lines), step)
        )
    )
    return path


def run(tmp_path, name="out", **cfg):
    cfg = {"tokenizer": "bpe", "vocab_size": 300, "n_sentinels": 0, "workers": 1, "val_fraction": 0.25, **cfg}
    return prepare(cfg, tmp_path / name, progress=False)


def mirror_like(root, books=BOOKS, n_train=10):
    """A mirror with text/gutenberg/ laid out as the real one: 10 train shards and one validation shard."""
    d = root / "text" / "gutenberg"
    d.mkdir(parents=True)
    for i in range(n_train):
        shard(d / f"train-{i:05d}-of-00010.jsonl.zst", books[i * 3 : (i + 1) * 3])
    shard(d / "validation-00000-of-00001.jsonl.zst", books[30:34])
    return root


# -- the registry entry ----------------------------------------------------------------------------


def test_registry_reads_the_mirror_shards_with_their_own_splits(tmp_path):
    mirror = mirror_like(tmp_path / "mirror")
    files, corpus = resolve("gutenberg", mirror=str(mirror))
    assert corpus is CORPORA["gutenberg"]
    assert [(f.path.rsplit("/", 1)[1], f.format, f.split) for f in files] == [
        (f"train-{i:05d}-of-00010.jsonl.zst", "jsonl", "train") for i in range(10)
    ] + [("validation-00000-of-00001.jsonl.zst", "jsonl", "val")]
    out = run(tmp_path, source="gutenberg", mirror=str(mirror), workers=2)  # spawned tokenizer processes
    meta = open_prepared(out)
    assert meta["splits"]["train"]["documents"] == 30 and meta["splits"]["val"]["documents"] == 4  # books, not lines
    assert len(meta["sources"]) == 11 and all(s["sha256"] for s in meta["sources"])
    one = open_prepared(run(tmp_path, "one", source="gutenberg", mirror=str(mirror), workers=1))
    assert one["splits"] == meta["splits"]  # the same shards (checksums) whatever the number of workers


def test_without_a_mirror_copy_the_download_source_is_pg19_on_the_hub(tmp_path, monkeypatch):
    monkeypatch.setenv("LM_CACHE", str(tmp_path / "cache"))
    files, _ = resolve("gutenberg", mirror=str(tmp_path / "empty"))
    assert [(f.path, f.format, f.split, f.hf_split) for f in files] == [
        ("hf:emozilla/pg19", "hf", "train", "train"),
        ("hf:emozilla/pg19", "hf", "val", "validation"),
    ]


def test_a_partial_mirror_copy_is_refused_naming_the_missing_shards(tmp_path, monkeypatch):
    monkeypatch.setenv("LM_CACHE", str(tmp_path / "cache"))
    mirror = mirror_like(tmp_path / "mirror")
    (mirror / "text" / "gutenberg" / "train-00007-of-00010.jsonl.zst").unlink()
    with pytest.raises(
        DataError,
        match=r"gutenberg: the mirror .* holds only part of this corpus; missing: "
        r"\['text/gutenberg/train-00007-of-00010.jsonl.zst'\]. Copy the missing",
    ):
        resolve("gutenberg", mirror=str(mirror))


def test_the_real_mirror_validation_shard_head(data_mirror):
    """The first book of the real validation shard, streamed: only its head is decompressed."""
    from lm.data.documents import read_task
    from lm.data.sources import SourceFile
    from lm.data.tasks import Planner, ReadOptions

    path = data_mirror / "text" / "gutenberg" / "validation-00000-of-00001.jsonl.zst"
    if not path.is_file():
        pytest.skip(f"{path} is not in the mirror")
    opts = ReadOptions(task_bytes=1 << 16)
    planner = Planner([SourceFile(str(path), "jsonl", "val")], opts)
    first = next(iter(planner))
    assert first.first_line == 1 and first.split == "val" and first.payload.endswith(b"\n")
    assert len(first.payload) < 8 << 20  # a whole book (one line), not the whole 7.5 MB shard
    record = json.loads(first.payload.split(b"\n", 1)[0])
    assert set(record) == {"text", "title", "author"} and len(record["text"]) > 20_000  # books under 20 kB were dropped
    assert "*** START OF" not in record["text"][:2000]  # the Project Gutenberg header was removed
    docs = read_task(first, opts)
    assert docs.texts[0] == record["text"] and docs.splits == ["val"] * len(docs.texts)


def test_every_shard_of_the_real_mirror_is_listed(data_mirror):
    d = data_mirror / "text" / "gutenberg"
    if not d.is_dir():
        pytest.skip(f"{d} is not in the mirror")
    files, _ = resolve("gutenberg", mirror=str(data_mirror))
    assert len(files) == 11 and all(f.path.startswith(str(d)) for f in files)


# -- bad shards ------------------------------------------------------------------------------------


@pytest.fixture
def finished(tmp_path):
    """A finished prepared directory that a failing --force rebuild must leave as it was."""
    good = shard(tmp_path / "good.jsonl.zst", BOOKS)
    out = run(tmp_path, "data", source=str(good))
    return out, (out / "meta.json").read_bytes()


def _fails_cleanly(tmp_path, finished, bad, match):
    out, meta = finished
    with pytest.raises(DataError, match=match):
        run(tmp_path, "fresh", source=str(bad))
    assert not (tmp_path / "fresh").exists()  # nothing that looks finished
    with pytest.raises(DataError, match=match):
        prepare(
            {"source": str(bad), "tokenizer": "bpe", "vocab_size": 300, "n_sentinels": 0, "workers": 1},
            out,
            force=True,
            progress=False,
        )
    assert (out / "meta.json").read_bytes() == meta and open_prepared(out)  # the old data is intact


def test_truncated_shard_names_file_and_byte(tmp_path, finished):
    whole = shard(tmp_path / "whole.jsonl.zst", BOOKS * 20).read_bytes()
    bad = tmp_path / "cut.jsonl.zst"
    bad.write_bytes(whole[: len(whole) * 2 // 3])  # a copy that stopped two thirds of the way
    _fails_cleanly(
        tmp_path,
        finished,
        bad,
        rf"cut.jsonl.zst: is not a complete, valid zstd file .*ends inside a zstd "
        rf"frame, at compressed byte {len(whole) * 2 // 3}.*download or compress it again",
    )


def test_a_file_that_is_not_zstd_says_so(tmp_path, finished):
    bad = tmp_path / "plain.jsonl.zst"
    bad.write_text("".join(json.dumps(b) + "\n" for b in BOOKS))
    _fails_cleanly(
        tmp_path,
        finished,
        bad,
        r"plain.jsonl.zst: not a zstd file \(its first bytes 7b 22 74 65 are not "
        r"the zstd magic number 28 b5 2f fd\); .*rename it without the .zst suffix",
    )


def test_a_line_that_is_not_json_names_file_and_line(tmp_path, finished):
    records = [*BOOKS[:25], '{"text": "a book cut off', *BOOKS[25:]]
    bad = shard(tmp_path / "broken.jsonl.zst", records, frames=3)  # the line sits in the second frame
    _fails_cleanly(
        tmp_path,
        finished,
        bad,
        r"broken.jsonl.zst:26: not valid JSON .*Fix or remove the line.*"
        r"--bad-records skip",
    )


def test_a_line_without_the_text_field_names_file_line_and_keys(tmp_path, finished):
    records = [*BOOKS[:7], {"body": BOOK, "title": "Untitled"}, *BOOKS[7:]]
    bad = shard(tmp_path / "nofield.jsonl.zst", records)
    _fails_cleanly(
        tmp_path,
        finished,
        bad,
        r"nofield.jsonl.zst:8: no string field 'text' \(has: \['body', 'title'\]\)"
        r".*--text-field KEY",
    )
    out = run(tmp_path, "skipped", source=str(bad), bad_records="skip")  # the documented way past it: counted
    assert open_prepared(out)["skipped"]["bad_records"] == 1


def test_the_reader_streams_a_long_shard_in_bounded_pieces(tmp_path):
    """Tasks of ~task_bytes cut at line ends: no task holds more than one book beyond its budget."""
    from lm.data.sources import SourceFile
    from lm.data.tasks import Planner, ReadOptions

    big = shard(tmp_path / "big.jsonl.zst", BOOKS * 50, frames=4)
    tasks = list(Planner([SourceFile(str(big), "jsonl", "train")], ReadOptions(task_bytes=4096)))
    longest = max(len(json.dumps(b)) + 1 for b in BOOKS)
    assert len(tasks) > 100 and max(len(t.payload) for t in tasks) <= 4096 + longest
    assert sum(t.payload.count(b"\n") for t in tasks) == len(BOOKS) * 50
    assert [t.first_line for t in islice(tasks, 3)] == [
        1,
        1 + tasks[0].payload.count(b"\n"),
        1 + tasks[0].payload.count(b"\n") + tasks[1].payload.count(b"\n"),
    ]


# -- the mixed corpus -------------------------------------------------------------------------------


def test_glue_source_is_the_train_sentences_and_mixes_with_books(tmp_path, monkeypatch, data_mirror):
    from lm.glue.readers import load_split

    monkeypatch.setenv("LM_CACHE", str(tmp_path / "cache"))
    root = data_mirror / "glue_data"
    if not (root / "RTE" / "train.tsv").is_file():
        pytest.skip("no RTE in the mirror")
    mirror = mirror_like(tmp_path / "mirror")
    (mirror / "glue_data").symlink_to(root)
    files, _ = resolve(["glue:rte", "gutenberg"], mirror=str(mirror))
    glue = files[0]
    assert glue.format == "text" and glue.split is None and len(files) == 12
    lines = Path(glue.path).read_text(encoding="utf-8").splitlines()
    train = load_split("rte", "train", root, hf=False)
    assert len(lines) == 2 * len(train) and lines[:2] == [train[0].text_a, train[0].text_b]
    mtime = (tmp_path / "cache" / "derived" / "glue_train_sentences_rte.txt").stat().st_mtime_ns
    resolve("glue:rte", mirror=str(mirror))  # unchanged text: the file is not rewritten (prepare's record holds)
    assert (tmp_path / "cache" / "derived" / "glue_train_sentences_rte.txt").stat().st_mtime_ns == mtime
    out = run(tmp_path, source=["glue:rte", "gutenberg"], mirror=str(mirror), doc_split="line", val_fraction=0.05)
    meta = open_prepared(out)
    docs = meta["splits"]["train"]["documents"] + meta["splits"]["val"]["documents"]
    assert docs == 2 * len(train) + 34  # every sentence and every book, once
    out = run(
        tmp_path,
        name="twice",
        source=["glue:rte", "gutenberg", "glue:rte"],
        mirror=str(mirror),
        doc_split="line",
        val_fraction=0.05,
    )
    meta = open_prepared(out)
    docs = meta["splits"]["train"]["documents"] + meta["splits"]["val"]["documents"]
    assert docs == 2 * 2 * len(train) + 34  # a source listed twice counts twice (the tapt mix's weighting)
    with pytest.raises(DataError, match=r"glue:rte,nope.*unknown GLUE task\(s\) \['nope'\]"):
        resolve("glue:rte,nope", mirror=str(mirror))


def test_the_data_presets(tmp_path):
    from lm.data.config import data_preset

    books = data_preset("gutenberg_bpe")
    assert books.source == "gutenberg" and books.tokenizer == "bpe" and books.vocab_size == 8192
    mix = data_preset("gutenberg_mix_bpe")
    assert mix.source == ["wikitext2_heldout", "tinystories_sample", "glue:sst2,cola,mrpc,stsb,rte", "gutenberg"]
    assert mix.vocab_size == books.vocab_size and mix.doc_split == "line"
    tapt = data_preset("gutenberg_mix_tapt_bpe")
    # the same first four sources (so the same tokenizer: it trains on the stream's first characters),
    # then the GLUE sentences nine more times: 10x in all
    assert tapt.source[:4] == mix.source and tapt.source[4:] == [mix.source[2]] * 9
    assert tapt.name != mix.name and tapt.tokenizer_train_chars == mix.tokenizer_train_chars
    assert np.all([s in CORPORA for s in ("gutenberg", "wikitext2_heldout", "tinystories_sample")])


def test_the_glue_source_is_train_text_only(tmp_path, data_mirror):
    from lm.data.glue_text import write_sentences
    from lm.glue.readers import load_split

    root = data_mirror / "glue_data"
    path = write_sentences(tmp_path / "s.txt", ["rte", "cola"], root)
    lines = path.read_text().splitlines()
    train_rte = load_split("rte", "train", root, hf=False)
    train_cola = load_split("cola", "train", root, hf=False)
    assert len(lines) == 2 * len(train_rte) + len(train_cola)  # RTE: both sentences of each pair
    assert lines[0] == train_rte[0].text_a and lines[1] == train_rte[0].text_b
    assert lines[-1] == train_cola[-1].text_a
    text = set(lines)
    dev_only = [
        e.text_a for e in load_split("cola", "dev", root, hf=False) if e.text_a not in {t.text_a for t in train_cola}
    ]
    assert dev_only and not any(s in text for s in dev_only)  # no dev sentence leaks into pretraining
    assert not any("\t" in line for line in lines)  # text only: no label or source columns (CoLA has both)
