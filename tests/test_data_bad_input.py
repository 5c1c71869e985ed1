"""Bad input gets a clear error naming the file (and line) and the fix, or a documented, counted skip."""

import json
import os
import sys

import numpy as np
import pytest

from lm.config import ConfigError
from lm.data.errors import DataError
from lm.data.manifest import open_prepared
from lm.data.packed import PackedLoader
from lm.data.prepare import data_config, prepare

GOOD = [f"Document number {i} tells of a fox, a stone and a river." for i in range(60)]


def run(tmp_path, name="out", **cfg):
    cfg = {"tokenizer": "char", "n_sentinels": 2, "val_fraction": 0.2, "workers": 1, "doc_split": "line", **cfg}
    return prepare(cfg, tmp_path / name, progress=False)


@pytest.fixture
def good(tmp_path):
    path = tmp_path / "good.txt"
    path.write_text("\n".join(GOOD) + "\n")
    return path


def test_empty_file_is_skipped_and_counted(tmp_path, good, capsys):
    (tmp_path / "empty.txt").write_bytes(b"")
    out = run(tmp_path, source=[str(good), str(tmp_path / "empty.txt")])
    assert open_prepared(out)["skipped"]["empty_files"] == [str(tmp_path / "empty.txt")]
    assert "skipped 1 empty files" in capsys.readouterr().err


def test_only_empty_files_is_an_error(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(DataError, match=r"no text found in the sources .*empty.txt.*empty files skipped"):
        run(tmp_path, source=str(tmp_path / "empty.txt"), tokenizer="bpe", vocab_size=300)
    assert not (tmp_path / "out").exists()


def test_non_utf8_names_file_line_and_fix(tmp_path, good):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(("\n".join(GOOD[:7]) + "\nCaf\xe9 au lait\n" + "\n".join(GOOD[7:]) + "\n").encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1.txt:8: invalid UTF-8 at byte \d+ .*iconv.*--encoding-errors replace"):
        run(tmp_path, source=str(bad))
    out = run(tmp_path, source=str(bad), encoding_errors="replace")
    assert open_prepared(out)["skipped"]["invalid_utf8_sequences"] == 1


def test_non_utf8_in_a_later_task_reports_the_right_line(tmp_path):
    bad = tmp_path / "big.txt"
    bad.write_bytes(("\n".join(GOOD * 20) + "\n").encode() + b"bad \xff byte\n")
    with pytest.raises(DataError, match=f"big.txt:{len(GOOD) * 20 + 1}: invalid UTF-8"):
        run(tmp_path, source=str(bad), task_bytes=1000)


def test_jsonl_bad_records_error_with_line_or_counted_skip(tmp_path):
    lines = [json.dumps({"text": t}) for t in GOOD]
    lines[3] = json.dumps({"body": "no text field"})
    lines[9] = "{not json"
    lines[20] = json.dumps({"text": None})
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(
        DataError,
        match=r"docs.jsonl:4: no string field 'text' \(has: \['body'\]\).*--text-field.*"
        r"--bad-records skip",
    ):
        run(tmp_path, source=str(path))
    out = run(tmp_path, source=str(path), bad_records="skip")
    meta = open_prepared(out)
    assert meta["skipped"]["bad_records"] == 3
    assert [e.split(": ")[0].rsplit(":", 1)[1] for e in meta["skipped"]["bad_record_examples"]] == ["4", "10", "21"]
    assert meta["splits"]["train"]["documents"] + meta["splits"]["val"]["documents"] == len(GOOD) - 3


def test_jsonl_records_of_the_wrong_shape_say_what_is_wrong(tmp_path):
    """A field that is there but not a string, a line that is an array, a .json file holding one JSON array:
    each says what it is (not "no string field 'text' (has: ['text'])") and how to fix it."""
    for i, (line, problem) in enumerate(
        [
            (json.dumps({"text": ["a", "b"]}), r"field 'text' is a JSON array, not a string. Make it a string"),
            (json.dumps({"text": 5}), r"field 'text' is a JSON number, not a string"),
            (json.dumps({"text": None}), r"field 'text' is a JSON null, not a string"),
            (json.dumps(["a"]), r"a JSON array, not an object. JSON Lines needs one JSON object per line.*jq -c"),
            ("[", r"not valid JSON .*JSON Lines needs one JSON object per line.*jq -c"),
        ]
    ):
        path = tmp_path / f"docs{i}.jsonl"
        path.write_text("\n".join([json.dumps({"text": t}) for t in GOOD[:5]] + [line]) + "\n")
        with pytest.raises(DataError, match=f"docs{i}.jsonl:6: {problem}.*--bad-records skip"):
            run(tmp_path, source=str(path))


def test_text_nested_in_an_object_names_the_jq_that_lifts_it(tmp_path):
    """{"doc": {"text": ...}} with --text-field doc.text said only "no string field 'doc.text' (has: ['doc'])", as
    if the text were missing; it says that nested fields are not read and how to lift one."""
    path = tmp_path / "nested.jsonl"
    path.write_text("\n".join(json.dumps({"id": i, "doc": {"lang": "en", "text": t}}) for i, t in enumerate(GOOD)))
    jq = r"nested in an object \('doc' holds 'text'\) is not read: lift it to the top, jq -c '\{text: .doc.text\}'"
    with pytest.raises(DataError, match=rf"nested.jsonl:1: no string field 'doc.text' \(has: \['id', 'doc'\]\).*{jq}"):
        run(tmp_path, source=str(path), text_field="doc.text")


def test_jsonl_lone_surrogate_escape_names_the_line_or_is_counted(tmp_path):
    """json.loads turns "\\ud800" (half of a UTF-16 pair, common in scraped JSONL) into a str that UTF-8 cannot
    encode: the tokenizer failed with a UnicodeEncodeError traceback."""
    lines = [json.dumps({"text": t}) for t in GOOD]
    lines[7] = '{"text": "broken \\ud800 pair, and a whole one \\ud83d\\ude00"}'
    path = tmp_path / "web.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"web.jsonl:8: the text holds a lone UTF-16 surrogate .*--encoding-errors"):
        run(tmp_path, source=str(path))
    for workers in (1, 2):
        out = run(tmp_path, f"out{workers}", source=str(path), encoding_errors="replace", workers=workers)
        assert open_prepared(out)["skipped"]["invalid_utf8_sequences"] == 1
    assert (tmp_path / "out1" / "train_00000.bin").read_bytes() == (tmp_path / "out2" / "train_00000.bin").read_bytes()


def test_parquet_without_the_column_names_the_columns(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"content": GOOD}), tmp_path / "a.parquet")
    with pytest.raises(DataError, match=r"a.parquet: no column 'text' \(columns: \['content'\]\); set data.text_field"):
        run(tmp_path, source=str(tmp_path / "a.parquet"))


def test_missing_paths_and_bad_settings(tmp_path):
    with pytest.raises(DataError, match=r"nope.txt: no such file or directory.*tiny_shakespeare"):
        run(tmp_path, source=str(tmp_path / "nope.txt"))
    with pytest.raises(DataError, match="no file matches this glob"):
        run(tmp_path, source=str(tmp_path / "*.jsonl"))
    with pytest.raises(
        ConfigError, match=r"data.split: Invalid value 'random', expected one of \[document, contiguous\]"
    ):
        data_config({"split": "random"})
    with pytest.raises(ConfigError, match="capturing groups"):
        data_config({"doc_split": "regex", "doc_separator": "(a|b)"})
    with pytest.raises(ConfigError, match="Allowed fields"):
        data_config({"vocab": 3})
    with pytest.raises(ConfigError, match=r"data.train_stride=0 must be >= 1, or null"):
        data_config({"train_stride": 0})


def test_settings_these_sources_never_read_are_refused(tmp_path, good):
    """--doc-separator without --doc-split regex, and --text-field on plain text files, were silently ignored."""
    with pytest.raises(ConfigError, match=r"data.doc_separator='\\n\\n' is read only with doc_split=regex.*'line'"):
        run(tmp_path, source=str(good), doc_separator=r"\n\n")
    plain = r"data.text_field='content' .* every source is read as plain text.*--format jsonl.*--format csv or tsv"
    with pytest.raises(ConfigError, match=plain):
        run(tmp_path, source=str(good), text_field="content")
    assert not (tmp_path / "out").exists()
    run(tmp_path, source=str(good), doc_split="regex", doc_separator=r"\n")  # used: fine


def test_a_doc_split_of_text_on_record_sources_alone_is_refused(tmp_path, good):
    """--doc-split file (or blank_line) on JSONL, CSV/TSV, Parquet or hf: sources was silently ignored: a JSONL file
    of 60 records gave the same shards (46 train and 14 val documents) under line, file and blank_line. A record is a
    document already: refused, naming the formats and the fix. Beside a text file it applies to the text file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in GOOD))
    (tmp_path / "a.csv").write_text("text\n" + "".join(f'"{t}"\n' for t in GOOD))
    pq.write_table(pa.table({"text": GOOD}), tmp_path / "a.parquet")
    for name, fmt in (("a.jsonl", "jsonl"), ("a.csv", "csv"), ("a.parquet", "parquet")):
        for doc_split in ("file", "blank_line"):
            with pytest.raises(
                ConfigError,
                match=rf"data.doc_split={doc_split} says what a document is in plain-text files, and every source "
                rf"is read as records \({fmt}: .*{name}\).*drop --doc-split \(data.doc_split=line\), or pass --format "
                rf"text",
            ):
                run(tmp_path, source=str(tmp_path / name), doc_split=doc_split)
    from lm.data.prepare import _check_doc_split_used  # a hub dataset, without the hub
    from lm.data.sources import SourceFile

    with pytest.raises(ConfigError, match=r"every source is read as records \(hf: hf:stories\)"):
        _check_doc_split_used(data_config({"doc_split": "file"}), [SourceFile("hf:stories", "hf")])
    assert not (tmp_path / "out").exists()
    # the text file is one document, each record one: 61 documents (120 with doc_split=line)
    meta = open_prepared(run(tmp_path, source=[str(good), str(tmp_path / "a.jsonl")], doc_split="file"))
    assert meta["splits"]["train"]["documents"] + meta["splits"]["val"]["documents"] == 1 + len(GOOD)


def test_single_document_split_by_document_explains_contiguous(tmp_path, good):
    with pytest.raises(DataError, match=r"the (train|val) split is empty: .*split=contiguous"):
        run(tmp_path, source=str(good), doc_split="file")


def test_out_dir_that_is_not_ours_is_never_overwritten(tmp_path, good):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match="not a finished lm prepare directory.*refusing"):
        run(tmp_path, source=str(good))
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"


def test_registry_download_offline_says_where_to_put_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("LM_DATA_MIRROR", str(tmp_path / "empty_mirror"))
    monkeypatch.setenv("LM_CACHE", str(tmp_path / "cache"))
    import lm.data.corpora as corpora

    def offline(url, timeout=None):
        raise corpora.urllib.error.URLError("[Errno -2] Name or service not known")

    monkeypatch.setattr(corpora.urllib.request, "urlopen", offline)
    with pytest.raises(
        DataError,
        match=r"could not download https://wikitext.smerity.com/wikitext-2-raw-v1.zip .*"
        r"offline.*empty_mirror/text/wikitext-2-raw/wiki.train.raw",
    ):
        run(tmp_path, source="wikitext2")
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]  # no half download left behind


def test_hf_source_without_datasets_or_network_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("LM_DATA_MIRROR", str(tmp_path / "empty_mirror"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(
        DataError,
        match=r"hf:Skylion007/openwebtext: (reading a Hugging Face dataset needs the "
        r"`datasets` package|could not load split)",
    ):
        run(tmp_path, source="openwebtext", tokenizer="bpe", vocab_size=500)


@pytest.fixture
def prepared(tmp_path, good):
    return run(tmp_path, source=str(good))


def test_data_without_a_val_split_says_how_to_get_one(tmp_path, good):
    """A directory prepared with val_fraction=0: lm train's val loader said only "no 'val' split (has ['train'])"."""
    out = run(tmp_path, source=str(good), val_fraction=0.0)
    with pytest.raises(
        DataError, match=r"no 'val' split \(has \['train'\]\); it was prepared without one .*--val-fraction"
    ):
        PackedLoader(out, "val", 8, 2)


def test_truncated_shard_names_the_file(prepared):
    shard = prepared / "train_00000.bin"
    data = shard.read_bytes()
    shard.write_bytes(data[:-10])
    with pytest.raises(DataError, match=r"train_00000.bin: \d+ bytes, expected \d+ .*truncated.*--force"):
        PackedLoader(prepared, "train", 16, 2)


def test_corrupt_shard_is_caught_by_verify_and_by_the_loader(prepared):
    shard = prepared / "train_00000.bin"
    tokens = np.fromfile(shard, dtype=np.uint16)
    tokens[5] = 60000  # not a token of this vocabulary
    tokens.tofile(shard)
    with pytest.raises(DataError, match="train_00000.bin: sha256 differs.*corrupt"):
        open_prepared(prepared, checksums=True)
    loader = PackedLoader(prepared, "val", 16, 64)
    loader.stream = PackedLoader(prepared, "train", 16, 64).stream  # read the damaged split in order
    with pytest.raises(DataError, match=r"train_00000.bin at token 5: token id 60000 >= vocabulary size"):
        next(iter(loader))


def test_tokenizer_shard_mismatch(tmp_path, prepared, good):
    other = run(tmp_path, "other", source=str(good), tokenizer="bpe", vocab_size=300)
    os.replace(other / "tokenizer.json", prepared / "tokenizer.json")
    with pytest.raises(DataError, match="tokenizer.json does not match the tokenizer the shards were made with"):
        PackedLoader(prepared, "train", 16, 2)


def test_unfinished_directory_and_model_vocab_mismatch(tmp_path, prepared):
    with pytest.raises(DataError, match="nothing: no such directory"):
        PackedLoader(tmp_path / "nothing", "train", 16, 2)
    (tmp_path / "nothing").mkdir()
    with pytest.raises(DataError, match="no readable meta.json"):
        PackedLoader(tmp_path / "nothing", "train", 16, 2)
    with pytest.raises(ConfigError, match=r"model.vocab_size=10 is smaller than the tokenizer"):
        PackedLoader(prepared, "train", 16, 2, vocab_size=10)
    with pytest.raises(DataError, match="too few for 1 window"):
        PackedLoader(prepared, "train", 100000, 2)


def test_archives_and_other_compressions_are_refused_with_the_fix(tmp_path, good, monkeypatch):
    """A tar archive was read as text, its headers (file names, NUL padding, octal sizes) trained on without a word;
    bzip2/xz/zip failed as 'invalid UTF-8' with the fix 'iconv', and a .txt holding gzip likewise."""
    import bz2
    import gzip
    import io
    import lzma
    import subprocess
    import zipfile

    monkeypatch.chdir(tmp_path)
    subprocess.run(["tar", "czf", "corpus.tar.gz", "good.txt"], check=True)
    subprocess.run(["tar", "cf", "corpus.tar", "good.txt"], check=True)
    text = good.read_bytes()
    (tmp_path / "a.txt.bz2").write_bytes(bz2.compress(text))
    (tmp_path / "a.txt.xz").write_bytes(lzma.compress(text))
    (tmp_path / "gz.txt").write_bytes(gzip.compress(text))
    with zipfile.ZipFile(buf := io.BytesIO(), "w") as z:
        z.writestr("good.txt", text)
    (tmp_path / "a.zip").write_bytes(buf.getvalue())
    for name, says in [
        ("corpus.tar.gz", r"a tar archive, not plain text .*extract it \(tar xf .*corpus.tar.gz\)"),
        ("corpus.tar", r"a tar archive, not plain text"),
        ("a.txt.bz2", r"a bzip2 file, not plain text; decompress it \(bunzip2\)"),
        ("a.txt.xz", r"an xz file, not plain text; decompress it \(unxz\)"),
        ("a.zip", r"a zip archive, not plain text; extract it \(unzip\)"),
        ("gz.txt", r"gzip-compressed, not plain text; name it \*.gz"),
    ]:
        with pytest.raises(DataError, match=rf"{name}: {says}"):
            run(tmp_path, source=str(tmp_path / name))
        assert not (tmp_path / "out").exists()
    (tmp_path / "words.txt").write_text("BZh is how a bzip2 file begins.\nPAR1 is how a Parquet file begins.\n")
    (tmp_path / "par.txt").write_text("PAR1 opens this text, which is no Parquet file.\n")
    for name in ("words.txt", "par.txt"):  # a text that begins like one: read as the text it is
        assert run(tmp_path, name=f"out_{name}", source=str(tmp_path / name), split="contiguous").is_dir()


def test_a_binary_or_utf16_file_is_told_its_own_fix(tmp_path, good):
    """Both were told to convert from latin1 (iconv -f latin1) or to decode bad bytes as U+FFFD: wrong for an image
    in a directory of text (its bytes are no text in any encoding) and for a UTF-16 file (its text would be mangled)."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "good.txt").write_bytes(good.read_bytes())
    (tmp_path / "d" / "pic.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x01\x00")
    with pytest.raises(DataError, match=r"pic.png:1: invalid UTF-8 .* binary .*not text; leave it out of the sources"):
        run(tmp_path, source=str(tmp_path / "d"))
    (tmp_path / "u16.txt").write_bytes("Caf\xe9 au lait\n".encode("utf-16"))
    with pytest.raises(DataError, match=r"u16.txt:1: invalid UTF-8 .* UTF-16 text .*iconv -f utf-16 -t utf-8"):
        run(tmp_path, source=str(tmp_path / "u16.txt"))


def test_a_download_writes_no_progress_frames_into_a_redirected_log(tmp_path, capsys, monkeypatch):
    """A corpus downloaded under Slurm or nohup: stderr is a file, where tqdm's carriage-return frames (up to 10 a
    second) pile up on one line; the bar is shown on a terminal only."""
    from lm.data.corpora import download

    src = tmp_path / "corpus.txt"
    src.write_bytes(b"x" * (3 << 20))  # 3 MiB: three 1 MiB reads, each a bar update
    download(src.as_uri(), tmp_path / "file.txt")
    err = capsys.readouterr().err
    assert err.count("\r") == 0 and (tmp_path / "file.txt").stat().st_size == 3 << 20  # there were 2 frames
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # a terminal: the bar, as before
    download(src.as_uri(), tmp_path / "tty.txt")
    assert "download tty.txt: 100%" in capsys.readouterr().err


def test_a_download_and_an_extraction_leave_another_hosts_temporary_file_alone(tmp_path):
    """Two hosts sharing a cache directory may run lm prepare under the same pid: a temporary name made of the pid
    alone (file.txt.part<pid>) was the other host's half-written file, truncated, then deleted. Each writer now
    has its own name; its file is removed when it fails."""
    import zipfile

    from lm.data.corpora import _extract, download

    src = tmp_path / "corpus.txt"
    src.write_bytes(b"ours\n")
    theirs = {tmp_path / f"{name}.part{os.getpid()}": f"{name}: the other host's half\n" for name in ("a", "b", "c")}
    for path, text in theirs.items():
        path.write_text(text)
    download(src.as_uri(), tmp_path / "a")
    with zipfile.ZipFile(tmp_path / "x.zip", "w") as z:
        z.writestr("member.txt", "extracted\n")
    _extract(tmp_path / "x.zip", "member.txt", tmp_path / "b")
    with pytest.raises(DataError, match="downloaded file has sha256"):
        download(src.as_uri(), tmp_path / "c", sha256="0" * 64)
    assert (tmp_path / "a").read_text() == "ours\n" and (tmp_path / "b").read_text() == "extracted\n"
    assert not (tmp_path / "c").exists()
    assert {p: p.read_text() for p in theirs} == theirs
    ours = ["a", "b", "corpus.txt", "x.zip"]  # no temporary file of ours left, the failed one's included
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*ours, *(p.name for p in theirs)])


def test_a_tokenizer_save_leaves_another_hosts_temporary_file_alone(tmp_path):
    from lm.data.tokenizer import train

    theirs = tmp_path / f"tokenizer.json.tmp{os.getpid()}"
    theirs.write_text("the other host's\n")
    train("char", ["abc d"], n_sentinels=0).save(tmp_path / "tokenizer.json")
    assert theirs.read_text() == "the other host's\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer.json", theirs.name]


def test_unknown_tokens_are_counted(tmp_path, capsys):
    """A character the vocabulary lacks was written as its unk id without a word (a unigram's vocabulary holds the
    characters of its training sample only: Gutenberg's 12 validation books hold 147 that its first 10 books lack)."""
    from lm.data.tokenizer import train

    train("char", ["abc d"], n_sentinels=0).save(tmp_path / "tokenizer.json")
    (tmp_path / "text.txt").write_text("abc d\nabz zz\nd\n")
    out = run(tmp_path, source=str(tmp_path / "text.txt"), tokenizer=str(tmp_path / "tokenizer.json"), val_fraction=0)
    assert open_prepared(out)["unknown_tokens"] == 3
    assert "wrote 3 unknown tokens (id 6): characters the tokenizer's vocabulary lacks" in capsys.readouterr().err
