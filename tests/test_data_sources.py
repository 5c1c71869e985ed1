"""Sources and tokenizers through lm prepare: Hugging Face datasets by name, the registry's local mirror
(config key), an existing tokenizer.json, uint32 shards, truncated or corrupt compressed files."""

import gzip
import json

import numpy as np
import pytest
import torch

from lm.data.errors import DataError
from lm.data.manifest import open_prepared
from lm.data.packed import PackedLoader
from lm.data.prepare import prepare
from lm.data.tokenizer import Tokenizer

STORIES = [
    f"Story {i}: " + " ".join(["A small fox found a shiny stone by the river."] * (1 + i % 3)) for i in range(120)
]


def run(tmp_path, name="out", **cfg):
    cfg = {
        "tokenizer": "bpe",
        "vocab_size": 320,
        "n_sentinels": 4,
        "val_fraction": 0.2,
        "workers": 1,
        "task_bytes": 2048,
        **cfg,
    }
    return prepare(cfg, tmp_path / name, progress=False)


def tokens(out, split):
    meta = json.loads((out / "meta.json").read_text())
    return np.concatenate([np.fromfile(out / s["file"], dtype=meta["dtype"]) for s in meta["splits"][split]["shards"]])


def write_jsonl(path, texts, key="content"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": i, key: t}) + "\n" for i, t in enumerate(texts)))
    return path


@pytest.mark.parametrize("streaming", [True, False])
def test_hf_dataset_by_name_gives_the_tokens_of_the_same_records_as_jsonl(tmp_path, monkeypatch, streaming):
    # A dataset "name" that load_dataset resolves without a network: a local dataset repository.
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    repo = tmp_path / "hub" / "stories"
    write_jsonl(repo / "train.jsonl", STORIES)
    reference = run(tmp_path, "jsonl", source=str(repo / "train.jsonl"), text_field="content")
    out = run(tmp_path, "hf", source=f"hf:{repo}", text_field="content", hf_streaming=streaming)
    for split in ("train", "val"):
        assert np.array_equal(tokens(out, split), tokens(reference, split))
    meta = open_prepared(out)
    assert meta["sources"] == [
        {
            "path": f"hf:{repo}",
            "format": "hf",
            "split": None,
            "bytes": None,
            "sha256": None,
            "records": len(STORIES),
            "hf_split": "train",
        }
    ]
    assert meta["splits"]["train"]["documents"] + meta["splits"]["val"]["documents"] == len(STORIES)


def test_hf_dataset_missing_field_is_counted_or_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    repo = tmp_path / "hub" / "stories"
    write_jsonl(repo / "train.jsonl", STORIES)
    with pytest.raises(DataError, match=r"hf:.*stories: record 1: field 'text' is NoneType, not text"):
        run(tmp_path, source=f"hf:{repo}")


def test_registry_corpora_are_read_from_the_mirror_config_key(tmp_path, monkeypatch):
    monkeypatch.setenv("LM_DATA_MIRROR", str(tmp_path / "empty"))  # the config key wins over the environment
    monkeypatch.setenv("LM_CACHE", str(tmp_path / "cache"))
    mirror = tmp_path / "mirror"
    (mirror / "text/tinyshakespeare").mkdir(parents=True)
    (mirror / "text/tinyshakespeare/input.txt").write_text("First Citizen:\nBefore we proceed any further.\n" * 40)
    out = run(tmp_path, "shakespeare", source="tiny_shakespeare", mirror=str(mirror), tokenizer="char")
    meta = open_prepared(out)
    assert [s["path"] for s in meta["sources"]] == [str(mirror / "text/tinyshakespeare/input.txt")]
    assert meta["config"]["split"] == "contiguous"  # the corpus' own choice: nanoGPT's 90/10 by characters
    # a Hugging Face corpus with a local copy under the mirror never touches the network
    write_jsonl(mirror / "openwebtext/part0.jsonl", STORIES[:60], key="text")
    write_jsonl(mirror / "openwebtext/part1.jsonl", STORIES[60:], key="text")
    out = run(tmp_path, "owt", source="openwebtext", mirror=str(mirror))
    meta = open_prepared(out)
    assert [s["path"] for s in meta["sources"]] == [str(mirror / f"openwebtext/part{i}.jsonl") for i in range(2)]
    assert meta["splits"]["train"]["documents"] + meta["splits"]["val"]["documents"] == len(STORIES)
    assert not (tmp_path / "cache").exists()  # nothing was downloaded


def big_vocab_tokenizer(path, n_words=70_000):
    """A foreign word-level tokenizer.json whose vocabulary does not fit uint16."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers

    vocab = {"[UNK]": 0, "</s>": 1, **{f"w{i}": i + 2 for i in range(n_words)}}
    hf = HFTokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.add_special_tokens(["</s>"])
    hf.save(str(path))
    return path


def test_existing_tokenizer_json_and_uint32_shards(tmp_path):
    tok_path = big_vocab_tokenizer(tmp_path / "words.json")
    rng = np.random.default_rng(0)
    docs = [" ".join(f"w{i}" for i in rng.integers(0, 70_000, size=12)) for _ in range(100)]
    (tmp_path / "docs.txt").write_text("\n".join(docs) + "\n")
    out = run(tmp_path, source=str(tmp_path / "docs.txt"), doc_split="line", tokenizer=str(tok_path))
    meta = open_prepared(out, checksums=True)
    tok = Tokenizer.load(out)
    assert meta["dtype"] == "uint32" and meta["tokenizer"]["vocab_size"] == tok.vocab_size == 70_002 + 5
    assert tok.eos_id == 1 and tok.unk_id == 0  # the foreign file's own </s> and [UNK]
    stream = np.concatenate([tokens(out, "train"), tokens(out, "val")])
    assert stream.max() > 65_535 and (stream == tok.eos_id).sum() == 100
    want = sorted(int(w[1:]) + 2 for d in docs for w in d.split())
    assert sorted(stream[stream != tok.eos_id].tolist()) == want  # every word id, none wrapped around
    batch = next(iter(PackedLoader(out, "train", 12, 4)))
    assert batch["input_ids"].dtype == torch.long and batch["input_ids"].max() > 65_535


def test_truncated_or_corrupt_compressed_files_name_the_file(tmp_path):
    import zstandard

    lines = "".join(json.dumps({"text": s}) + "\n" for s in STORIES * 20).encode()
    zst = zstandard.ZstdCompressor().compress(lines)
    gz = gzip.compress(lines)
    (tmp_path / "cut.jsonl.zst").write_bytes(zst[: len(zst) // 2])  # a download that stopped half way
    (tmp_path / "cut.jsonl.gz").write_bytes(gz[: len(gz) // 2])
    (tmp_path / "junk.jsonl.gz").write_bytes(b"this is not gzip at all")
    for name, reason in [
        ("cut.jsonl.zst", "ends inside a zstd frame"),
        ("cut.jsonl.gz", "EOFError"),
        ("junk.jsonl.gz", "Not a gzipped file"),
    ]:
        with pytest.raises(
            DataError,
            match=rf"{name}: is not a complete, valid (zstd|gzip) file .*{reason}.*"
            rf"truncated or corrupt",
        ):
            run(tmp_path, source=str(tmp_path / name))
        assert not (tmp_path / "out").exists()
    (tmp_path / "whole.jsonl.zst").write_bytes(zst + zstandard.ZstdCompressor().compress(lines))  # two frames
    out = run(tmp_path, "two_frames", source=str(tmp_path / "whole.jsonl.zst"))
    meta = open_prepared(out)
    assert meta["splits"]["train"]["documents"] + meta["splits"]["val"]["documents"] == 2 * 20 * len(STORIES)


def test_non_utf8_jsonl_record_names_the_line(tmp_path):
    lines = [json.dumps({"text": s}).encode() for s in STORIES]
    lines[6] = b'{"text": "caf\xe9"}'
    (tmp_path / "latin.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(DataError, match=r"latin.jsonl:7: invalid UTF-8 at byte 13 of the line"):
        run(tmp_path, source=str(tmp_path / "latin.jsonl"))
    out = run(tmp_path, source=str(tmp_path / "latin.jsonl"), encoding_errors="replace")
    assert open_prepared(out)["skipped"]["invalid_utf8_sequences"] == 1


def test_parquet_is_read_in_bounded_tasks_even_from_one_row_group(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lm.data.sources import SourceFile
    from lm.data.tasks import Planner, ReadOptions

    texts = STORIES * 10
    path = tmp_path / "one_group.parquet"
    pq.write_table(pa.table({"text": texts}), path, row_group_size=10**6)
    assert pq.ParquetFile(path).num_row_groups == 1
    planner = Planner([SourceFile(str(path), "parquet")], ReadOptions(task_bytes=2048))
    tasks = list(planner)
    assert len(tasks) >= sum(map(len, texts)) // (2048 + max(map(len, STORIES)))
    assert all(sum(map(len, t.payload)) < 2048 + max(map(len, STORIES)) for t in tasks)
    assert [v for t in tasks for v in t.payload] == texts
    assert [t.first_line for t in tasks] == list(np.cumsum([1] + [len(t.payload) for t in tasks[:-1]]))
    assert sum(t.raw_bytes for t in tasks) == path.stat().st_size  # the progress bar ends at the file size
    assert planner.sources[0]["records"] == len(texts)
