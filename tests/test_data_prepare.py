"""lm prepare: nanoGPT's Shakespeare split, formats, determinism across workers, resume, atomic output."""

import gzip
import hashlib
import json
import sys

import numpy as np
import pytest

import lm.data.prepare as prep
from lm.cli.prepare import main
from lm.config_base import ConfigError
from lm.data.config import data_preset
from lm.data.errors import DataError
from lm.data.manifest import open_prepared
from lm.data.prepare import ensure_prepared, prepare
from lm.data.tokenizer import Tokenizer, TokenizerError

STORIES = [
    f"Story {i}: " + " ".join(["Once upon a time a little fox found a shiny stone."] * (1 + i % 4)) for i in range(200)
]


def tokens(out, split):
    meta = json.loads((out / "meta.json").read_text())
    return np.concatenate([np.fromfile(out / s["file"], dtype=meta["dtype"]) for s in meta["splits"][split]["shards"]])


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


@pytest.fixture
def stories(tmp_path):
    path = tmp_path / "stories.txt"
    path.write_text("\n".join(STORIES) + "\n")
    return path


def test_shakespeare_char_preset_reproduces_nanogpt_split(tmp_path, monkeypatch, data_mirror):
    monkeypatch.setenv("LM_CACHE", str(tmp_path))
    out = ensure_prepared(data_preset("shakespeare_char"))
    assert out == tmp_path / "data" / "shakespeare_char"
    text = (data_mirror / "text/tinyshakespeare/input.txt").read_text()
    stoi = {c: 7 + 16 + i for i, c in enumerate(sorted(set(text)))}  # specials and sentinels come first
    n = len(text)
    train = np.array([stoi[c] for c in text[: int(n * 0.9)]])  # nanoGPT's data/shakespeare_char/prepare.py
    val = np.array([stoi[c] for c in text[int(n * 0.9) :]])
    assert np.array_equal(tokens(out, "train"), train) and np.array_equal(tokens(out, "val"), val)
    meta = open_prepared(out, checksums=True)
    assert meta["tokenizer"]["vocab_size"] == 88 and meta["dtype"] == "uint16"
    src = meta["sources"][0]
    assert src["bytes"] == 1115394
    assert src["sha256"] == "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
    assert ensure_prepared(data_preset("shakespeare_char")) == out  # second call: nothing to do


def test_documents_end_with_eos_and_split_by_document(tmp_path, stories):
    out = run(tmp_path, source=str(stories), doc_split="line")
    tok = Tokenizer.load(out)
    meta = open_prepared(out)
    train, val = tokens(out, "train"), tokens(out, "val")
    docs = meta["splits"]["train"]["documents"] + meta["splits"]["val"]["documents"]
    assert docs == 200 and (train == tok.eos_id).sum() + (val == tok.eos_id).sum() == 200
    assert 20 <= meta["splits"]["val"]["documents"] <= 60  # ~20% by a hash of each document
    decoded = [tok.decode(d.tolist()) for d in np.split(train, np.flatnonzero(train == tok.eos_id) + 1)[:-1]]
    assert all(d.endswith("<eos>") for d in decoded)
    assert {d[: -len("<eos>")] for d in decoded} <= set(STORIES)
    assert meta["sources"][0]["sha256"] == hashlib.sha256(stories.read_bytes()).hexdigest()
    assert sum(meta["splits"][s]["tokens"] for s in meta["splits"]) == train.size + val.size


def test_output_does_not_depend_on_worker_count_and_progress_is_shown(tmp_path, stories, capsys):
    one = run(tmp_path, "one", source=str(stories), doc_split="line", workers=1)
    capsys.readouterr()
    two = prepare(
        {
            "tokenizer": "bpe",
            "vocab_size": 320,
            "n_sentinels": 4,
            "val_fraction": 0.2,
            "workers": 2,
            "task_bytes": 2048,
            "source": str(stories),
            "doc_split": "line",
        },
        tmp_path / "two",
        progress=True,
    )
    bar = capsys.readouterr().err
    assert (
        "tokenize: 100%" in bar and f"{stories.stat().st_size / 1000:.1f}k/{stories.stat().st_size / 1000:.1f}k" in bar
    )  # the bar counts source bytes and ends at the file size
    for split in ("train", "val"):
        assert np.array_equal(tokens(one, split), tokens(two, split))
    assert (one / "tokenizer.json").read_bytes() == (two / "tokenizer.json").read_bytes()


def test_shards_roll_at_shard_tokens(tmp_path, stories):
    out = run(tmp_path, source=str(stories), doc_split="line", shard_tokens=500)
    meta = open_prepared(out, checksums=True)
    shards = meta["splits"]["train"]["shards"]
    assert len(shards) > 3 and all(s["tokens"] == 500 for s in shards[:-1]) and 0 < shards[-1]["tokens"] <= 500
    whole = run(tmp_path, "whole", source=str(stories), doc_split="line")
    assert np.array_equal(tokens(out, "train"), tokens(whole, "train"))


def test_jsonl_gz_zst_and_parquet_give_the_same_tokens(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    lines = "".join(json.dumps({"id": i, "body": s}) + "\n" for i, s in enumerate(STORIES)).encode()
    (tmp_path / "a.jsonl").write_bytes(lines)
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(lines))
    (tmp_path / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines))
    pq.write_table(pa.table({"body": STORIES}), tmp_path / "a.parquet", row_group_size=64)
    outs = [
        run(tmp_path, f"o{i}", source=str(tmp_path / name), text_field="body")
        for i, name in enumerate(["a.jsonl", "a.jsonl.gz", "a.jsonl.zst", "a.parquet"])
    ]
    for out in outs[1:]:
        assert np.array_equal(tokens(out, "train"), tokens(outs[0], "train"))
        assert np.array_equal(tokens(out, "val"), tokens(outs[0], "val"))
    assert (
        open_prepared(outs[0])["splits"]["train"]["documents"] + open_prepared(outs[0])["splits"]["val"]["documents"]
        == 200
    )


def test_directory_glob_and_val_source(tmp_path, stories):
    d = tmp_path / "corpus"
    d.mkdir()
    for i in range(3):
        (d / f"part{i}.txt").write_text("\n".join(STORIES[i::3]))
    (d / ".hidden.txt").write_text("never read")
    out = run(tmp_path, source=str(d), doc_split="line", val_source=str(stories), val_fraction=0.0)
    meta = open_prepared(out)
    assert [s["path"] for s in meta["sources"]] == [str(d / f"part{i}.txt") for i in range(3)] + [str(stories)]
    assert meta["splits"]["train"]["documents"] == 200 and meta["splits"]["val"]["documents"] == 200
    globbed = run(tmp_path, "g", source=str(d / "part*.txt"), doc_split="line", val_fraction=0.0)
    assert np.array_equal(tokens(globbed, "train"), tokens(out, "train"))


def test_crlf_lines_are_the_documents_of_lf_lines(tmp_path):
    """A Windows (CRLF) file split by line kept each document's trailing \\r: a token before every EOS."""
    (tmp_path / "lf.txt").write_bytes("\n".join(STORIES).encode() + b"\n")
    (tmp_path / "crlf.txt").write_bytes("\r\n".join(STORIES).encode() + b"\r\n")
    lf = run(tmp_path, "lf", source=str(tmp_path / "lf.txt"), doc_split="line")
    for workers in (1, 2):
        crlf = run(tmp_path, f"crlf{workers}", source=str(tmp_path / "crlf.txt"), doc_split="line", workers=workers)
        assert (crlf / "tokenizer.json").read_bytes() == (lf / "tokenizer.json").read_bytes()
        for split in ("train", "val"):
            assert np.array_equal(tokens(crlf, split), tokens(lf, split))


def test_lone_cr_line_ends_are_refused_not_read_as_one_document(tmp_path):
    """Classic Mac OS line ends (CR alone) are no line end to doc_split=line: 2,000 lines were one document, which
    split=contiguous trained on without a word (the document split refused an empty val split, not saying why)."""
    (tmp_path / "cr.txt").write_bytes("\r".join(STORIES * 20).encode() + b"\r")
    with pytest.raises(DataError, match=r"cr.txt: its lines end in a lone CR .*tr '\\r' '\\n' < .*cr.txt > COPY"):
        run(tmp_path, "cr", source=str(tmp_path / "cr.txt"), split="contiguous")
    out = run(tmp_path, "file", source=str(tmp_path / "cr.txt"), split="contiguous", doc_split="file")
    assert json.loads((out / "meta.json").read_text())["splits"]["val"]["documents"] == 1  # as asked: one document


def test_symlinked_directories_are_read_and_each_file_once(tmp_path):
    """A directory source skipped the files of its symlinked subdirectories (rglob does not follow them), while
    a ** glob over the same tree read them; a glob through a symlink loop listed each file thousands of times."""
    from lm.data.sources import resolve

    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "s.txt").write_text("shared text\n")
    d = tmp_path / "corpus"
    d.mkdir()
    (d / "own.txt").write_text("own text\n")
    (d / "linked").symlink_to(shared)  # read
    (d / "up").symlink_to(tmp_path)  # a loop: its files are reached through corpus/ and linked/ already
    (d / "again.txt").symlink_to(d / "own.txt")  # the same file under a second name: once
    expected = [str(d / "linked" / "s.txt"), str(d / "own.txt")]
    assert [f.path for f in resolve(str(d))[0]] == expected
    assert [f.path for f in resolve(str(d / "**" / "*.txt"))[0]] == expected


def test_interrupted_run_resumes_to_identical_output(tmp_path, stories, monkeypatch, capsys):
    full = run(tmp_path, "full", source=str(stories), doc_split="line", shard_tokens=700)
    real = prep.write_json
    written = []  # tokens of the interrupted run's last progress record

    def crash_after_five_tasks(path, obj):
        real(path, obj)
        if path.name == "progress.json" and obj["tasks_done"] == 5:
            written.append(sum(sum(s["tokens"] for s in w["shards"]) + w["current"] for w in obj["writers"].values()))
            # also leave tokens written after the last progress record, as a kill would
            for p in path.parent.glob("*.tmp"):
                with p.open("ab") as f:
                    f.write(b"\x07\x00" * 13)
            raise KeyboardInterrupt

    monkeypatch.setattr(prep, "write_json", crash_after_five_tasks)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, "cut", source=str(stories), doc_split="line", shard_tokens=700)
    assert not (tmp_path / "cut").exists() and (tmp_path / ".cut.partial" / "progress.json").exists()
    monkeypatch.setattr(prep, "write_json", real)
    with pytest.raises(DataError, match="no readable meta.json.*resume"):
        open_prepared(tmp_path / "cut")
    capsys.readouterr()
    out = run(tmp_path, "cut", source=str(stories), doc_split="line", shard_tokens=700)
    err = capsys.readouterr().err
    assert "resuming the interrupted run" in err
    meta = json.loads((out / "meta.json").read_text())
    total = sum(v["tokens"] for v in meta["splits"].values())
    assert 0 < written[0] < total
    # the rate of this run's tokens alone: all of them over its seconds overstated a resumed run's speed
    rate = (total - written[0]) / max(meta["seconds"], 1e-9)
    assert f"({rate:,.0f} tokens/s after {written[0]:,} resumed)" in err
    for split in ("train", "val"):
        assert np.array_equal(tokens(out, split), tokens(full, split))
    assert open_prepared(out, checksums=True)["splits"] == open_prepared(full)["splits"]
    assert not (tmp_path / ".cut.partial").exists()


def test_changed_settings_restart_and_say_so(tmp_path, stories, monkeypatch, capsys):
    def crash(path, obj):
        raise KeyboardInterrupt

    monkeypatch.setattr(prep, "write_json", crash)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, source=str(stories), doc_split="line")
    monkeypatch.undo()
    capsys.readouterr()
    run(tmp_path, source=str(stories), doc_split="line", vocab_size=300)
    assert "restarting: discarding the interrupted run" in capsys.readouterr().err


def test_a_run_interrupted_under_another_plan_restarts(tmp_path, stories, monkeypatch, capsys):
    """A preparation interrupted before an upgrade that plans the same settings differently (PLAN_VERSION) resumed
    into a mix of both plans' splits."""
    import lm.data.manifest as manifest

    def crash(path, obj):
        raise KeyboardInterrupt

    monkeypatch.setattr(prep, "write_json", crash)
    monkeypatch.setattr(manifest, "PLAN_VERSION", manifest.PLAN_VERSION - 1)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, source=str(stories), doc_split="line")
    monkeypatch.undo()
    capsys.readouterr()
    run(tmp_path, source=str(stories), doc_split="line")
    assert "restarting: discarding the interrupted run" in capsys.readouterr().err


def test_a_fresh_preparation_says_first_what_it_prepares_where(tmp_path, stories, capsys):
    """lm quickstart's first minutes (or lm train data.source=... logged to a file, where no bar shows) were silent
    until 'trained a bpe tokenizer': the first line now names the directory, the sources and that it happens once."""
    out = run(tmp_path, source=str(stories), doc_split="line")
    first = capsys.readouterr().err.splitlines()[0]
    size = stories.stat().st_size / 1e6
    assert first == (
        f"lm prepare: preparing {out} from 1 file(s), {size:,.1f} MB: a tokenizer, then the token shards; once, "
        f"later runs reuse it"
    )
    run(tmp_path, source=str(stories), doc_split="line")
    assert "preparing" not in capsys.readouterr().err  # found prepared: only 'already prepared'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "stories.txt"]  # no .out.lock left beside it


def test_finished_output_is_kept_unless_forced_and_survives_a_failed_rebuild(tmp_path, stories, monkeypatch, capsys):
    out = run(tmp_path, source=str(stories), doc_split="line")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    run(tmp_path, source=str(stories), doc_split="line")
    assert "already prepared" in capsys.readouterr().err
    with pytest.raises(DataError, match=r"other settings \(differs in: \['vocab_size'\]\).*--force"):
        run(tmp_path, source=str(stories), doc_split="line", vocab_size=300)

    def crash(path, obj):
        raise RuntimeError("disk full")

    monkeypatch.setattr(prep, "write_json", crash)
    with pytest.raises(RuntimeError):
        prepare(
            {"source": str(stories), "doc_split": "line", "vocab_size": 300, "n_sentinels": 4, "workers": 1},
            out,
            force=True,
            progress=False,
        )
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the failed rebuild touched nothing
    monkeypatch.undo()
    prepare(
        {
            "source": str(stories),
            "doc_split": "line",
            "vocab_size": 300,
            "n_sentinels": 4,
            "val_fraction": 0.2,
            "workers": 1,
        },
        out,
        force=True,
        progress=False,
    )
    assert open_prepared(out)["config"]["vocab_size"] == 300


def test_a_source_edited_after_preparing_is_refused_not_silently_reused(tmp_path, stories):
    out = run(tmp_path, source=str(stories), doc_split="line")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    stories.write_text(stories.read_text() + "A new story about a fox.\n")
    with pytest.raises(DataError) as e:
        run(tmp_path, source=str(stories), doc_split="line")
    assert str(e.value).startswith(f"{out} was prepared from sources that changed since ({stories}: ")
    assert "bytes). Pass --force to rebuild it" in str(e.value) and "\n" not in str(e.value)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing was touched
    rebuilt = prepare(
        {
            "source": str(stories),
            "doc_split": "line",
            "vocab_size": 320,
            "n_sentinels": 4,
            "val_fraction": 0.2,
            "workers": 1,
        },
        out,
        force=True,
        progress=False,
    )
    assert json.loads((rebuilt / "meta.json").read_text())["sources"][0]["bytes"] == stories.stat().st_size


def test_a_file_added_to_a_source_directory_is_refused_by_lm_train(tmp_path):
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "a.txt").write_text("".join(f"story {i} about a cat\n" for i in range(40)))
    cfg = {"source": str(texts), "dir": str(tmp_path / "data"), "doc_split": "line", "tokenizer": "char"}
    cfg |= {"val_fraction": 0.2}
    ensure_prepared(cfg)
    (texts / "b.txt").write_text("another story\n")
    with pytest.raises(DataError, match=r"changed since \(.*b\.txt added\)\. Give these settings a directory"):
        ensure_prepared(cfg)


def test_an_output_inside_its_source_directory_is_not_read_as_a_source(tmp_path):
    """lm prepare DIR --out DIR/prepared: a rerun saw the shards as source files added since (refused), and --force
    would have read them as text."""
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "a.txt").write_text("".join(f"story {i} about a cat\n" for i in range(40)))
    cfg = {"source": str(texts), "doc_split": "line", "tokenizer": "char", "val_fraction": 0.2}
    first = prepare(cfg, texts / "prepared", progress=False)
    meta = json.loads((first / "meta.json").read_text())
    assert [s["path"] for s in meta["sources"]] == [str(texts / "a.txt")]
    assert prepare(cfg, texts / "prepared", progress=False) == first  # already prepared, not "changed since"
    forced = prepare(cfg, texts / "prepared", force=True, progress=False)
    assert json.loads((forced / "meta.json").read_text())["sources"] == meta["sources"]
    with pytest.raises(DataError, match="every source file is inside --out"):
        prepare({**cfg, "source": str(first)}, first, force=True, progress=False)


def _cli_error(argv) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert isinstance(e.value.code, str) and "\n" not in e.value.code, e.value.code  # one line, status 1
    return e.value.code


def test_a_mistyped_tokenizer_kind_names_the_kinds_before_anything_is_made(tmp_path, stories):
    """--tokenizer chr was read as a path: refused after .out.partial was made, with 'run lm prepare to train one'."""
    line = _cli_error([str(stories), "--out", str(tmp_path / "out"), "--tokenizer", "chr", "--no-progress"])
    assert line == (
        "lm prepare: data.tokenizer=chr (lm prepare --tokenizer) is neither a tokenizer to train (bpe, unigram, char) "
        "nor an existing tokenizer.json (or a directory holding one); did you mean char?"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stories.txt"]


def test_a_damaged_tokenizer_file_of_the_users_is_not_sent_to_lm_prepare_force(tmp_path, stories):
    """'re-run lm prepare --force to rebuild it' is the fix for a prepared directory's own file only; a file given by
    path (--tokenizer mine.json) is no output lm prepare could rebuild."""
    (tmp_path / "mine.json").write_text("{not json")
    line = _cli_error([str(stories), "--out", str(tmp_path / "out"), "--tokenizer", str(tmp_path / "mine.json")])
    assert line.endswith("; pass a tokenizer.json that lm prepare or the Hugging Face tokenizers library wrote")
    (tmp_path / "prepared").mkdir()
    (tmp_path / "prepared" / "meta.json").write_text("{}")
    (tmp_path / "prepared" / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError) as e:
        Tokenizer.load(tmp_path / "prepared")
    assert str(e.value).endswith(f"; re-run lm prepare --force --out {tmp_path / 'prepared'} to rebuild it")


def test_force_replaces_only_a_directory_lm_prepare_wrote(tmp_path, stories):
    """issue 49 item 5: a user's directory that merely holds a meta.json was deleted by --force."""
    out = run(tmp_path, source=str(stories), doc_split="line")
    argv = [
        str(stories),
        "--out",
        None,
        "--doc-split",
        "line",
        "--vocab-size",
        "300",
        "--n-sentinels",
        "4",
        "--val-fraction",
        "0.2",
        "--workers",
        "1",
        "--no-progress",
        "--force",
    ]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "meta.json").write_text((out / "meta.json").read_text())  # lm prepare's manifest, copied
    (mine / "precious.txt").write_text("thesis")
    (out / "precious.txt").write_text("notes")  # a user's file put into a prepared directory
    for target in (mine, out):
        argv[2] = str(target)
        msg = _cli_error(argv)
        assert msg.startswith(f"lm prepare: {target} holds files lm prepare did not write (it holds ")
        assert "precious.txt" in msg and "--force will not replace it" in msg
    assert (mine / "precious.txt").read_text() == "thesis" and (out / "precious.txt").read_text() == "notes"
    (out / "precious.txt").unlink()
    main(argv[:2] + [str(out)] + argv[3:])  # only lm prepare's files: replaced
    assert open_prepared(out)["config"]["vocab_size"] == 300


def test_a_meta_json_that_is_not_an_object_is_one_line(tmp_path, stories):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "meta.json").write_text("[1, 2]")
    msg = _cli_error([str(stories), "--out", str(tmp_path / "out"), "--workers", "1", "--no-progress", "--force"])
    assert msg.startswith(
        f"lm prepare: {tmp_path / 'out'} exists, is not empty and is not a finished lm prepare "
        f"directory (no readable meta.json object)"
    )
    assert (tmp_path / "out" / "meta.json").read_text() == "[1, 2]"
    assert "no readable meta.json" in _cli_error(["--verify", str(tmp_path / "out")])


def test_a_full_disk_is_one_line_and_loses_nothing(tmp_path, stories, monkeypatch):
    import errno

    from lm.data.shards import ShardWriter

    out = run(tmp_path, source=str(stories), doc_split="line")
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def full(self, tokens):
        raise OSError(errno.ENOSPC, "No space left on device", str(self._tmp))

    monkeypatch.setattr(ShardWriter, "write", full)
    msg = _cli_error(
        [
            str(stories),
            "--out",
            str(out),
            "--doc-split",
            "file",
            "--split",
            "contiguous",
            "--vocab-size",
            "300",
            "--n-sentinels",
            "4",
            "--workers",
            "1",
            "--no-progress",
            "--force",
        ]
    )
    assert msg.startswith(f"lm prepare: No space left on device ({tmp_path / '.out.partial'}")
    assert msg.endswith("— free space on that disk, or write somewhere else")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_cli_help_list_and_run(tmp_path, stories, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    help_text = capsys.readouterr().out
    for word in ("--tokenizer", "--vocab-size", "--workers", "--split", "--force", "--verify", "tiny_shakespeare"):
        assert word in help_text
    main(["--list"])
    assert "fineweb_edu_sample" in capsys.readouterr().out
    main(
        [
            str(stories),
            "--out",
            str(tmp_path / "cli"),
            "--doc-split",
            "file",
            "--split",
            "contiguous",
            "--vocab-size",
            "300",
            "--n-sentinels",
            "4",
            "--val-fraction",
            "0.2",
            "--workers",
            "1",
            "--no-progress",
            "--no-append-eos",
        ]
    )
    meta = open_prepared(tmp_path / "cli")
    assert meta["config"]["append_eos"] is False and meta["tokenizer"]["vocab_size"] == 300
    main(["--verify", str(tmp_path / "cli")])
    assert "OK" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="^lm prepare: .*nope.txt: no such file"):
        main([str(tmp_path / "nope.txt"), "--out", str(tmp_path / "x")])


@pytest.mark.parametrize("kind", ["line", "jsonl"])
def test_no_eos_between_lines_or_records_is_refused_not_run_together(tmp_path, stories, kind):
    """append_eos=false on lines glued them, their newlines gone: 'hear me speak.All:Speak, speak.First Citizen:'."""
    jsonl = tmp_path / "s.jsonl"
    jsonl.write_text("".join(json.dumps({"text": s}) + "\n" for s in STORIES))
    source, what = (str(stories), "doc_split=line splits") if kind == "line" else (str(jsonl), "each jsonl record is")
    with pytest.raises(
        ConfigError, match=f"append_eos=false .*puts nothing between documents, and {what}.*--doc-split file"
    ):
        run(tmp_path, source=source, doc_split="line", append_eos=False)
    assert not (tmp_path / "out").exists()
    out = run(tmp_path, source=str(stories), doc_split="file", split="contiguous", append_eos=False)  # newlines kept
    tok = Tokenizer.load(out)
    assert tok.decode(np.concatenate([tokens(out, "train"), tokens(out, "val")]).tolist()).count("\n") == 200


def test_every_data_preset_composes_with_hydra(monkeypatch, tmp_path):
    from lm.config import ConfigError, conf_dir
    from lm.data.config import DataConfig, data_preset
    from lm.data.corpora import CORPORA

    names = sorted(p.stem for p in (conf_dir() / "data").glob("*.yaml"))
    assert {"shakespeare_char", "tinystories_bpe", "wikitext2_bpe"} <= set(names)
    monkeypatch.setenv("LM_DATA_MIRROR", str(tmp_path))  # presets may glob the mirror (gutenberg_shards_bpe)
    templates = {"text", "prepared"}  # filled by `lm train data.source=<file>` / `data=<dir>` (lm/cli/own_data.py)
    assert templates <= set(names)
    for name in sorted(set(names) - templates):
        cfg = data_preset(name)
        assert isinstance(cfg, DataConfig)
        sources = [cfg.source] if isinstance(cfg.source, str) else cfg.source  # a list: a mixed corpus
        assert cfg.name == name and cfg.dir.endswith(f"/data/{name}")
        # registry corpora, GLUE sentences, or files under the mirror: never a path of one machine
        assert sources and all(s in CORPORA or s.startswith(("glue:", f"{tmp_path}/")) for s in sources), sources
    text = tmp_path / "mine.txt"
    assert data_preset("text", [f"data.source={text}"]).source == str(text)
    assert data_preset("prepared", [f"data.dir={tmp_path}"]).dir == str(tmp_path)
    # The schema types every preset: a wrong choice fails at composition, naming the field and the choices.
    with pytest.raises(
        ConfigError, match=r"data.doc_split: Invalid value 'para', expected one of \[file, line, blank_line, regex\]"
    ):
        data_preset("shakespeare_char", ["data.doc_split=para"])
    with pytest.raises(ConfigError, match="known presets"):
        data_preset("no_such_corpus")


def test_vocab_size_with_the_char_tokenizer_is_refused_not_ignored(tmp_path, stories):
    """The char vocabulary is the text's characters: --vocab-size 500 built the same tokenizer without a word."""
    msg = _cli_error([str(stories), "--out", str(tmp_path / "c"), "--tokenizer", "char", "--vocab-size", "500"])
    assert msg == (
        "lm prepare: --vocab-size 500 does nothing with --tokenizer char, whose vocabulary is every character of the "
        "text; drop it, or pick --tokenizer bpe or unigram"
    )
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize(
    "flag,value,line",
    [
        ("--split", "foo", "--split foo: no such choice; pick one of document, contiguous"),
        (
            "--split",
            "contigous",
            "--split contigous: no such choice; pick one of document, contiguous; did you mean contiguous?",
        ),
        ("--doc-split", "para", "--doc-split para: no such choice; pick one of file, line, blank_line, regex"),
        ("--bad-records", "skipp", "--bad-records skipp: no such choice; pick one of error, skip; did you mean skip?"),
    ],
)
def test_a_flag_given_no_choice_names_its_choices_not_every_data_field(tmp_path, stories, flag, value, line):
    """--split foo was 'bad data config: data.split: Invalid value ...; full_key: split; object_type=DataConfig.
    Allowed fields: [<all 31 data fields>]'."""
    assert _cli_error([str(stories), "--out", str(tmp_path / "out"), flag, value]) == f"lm prepare: {line}"
    assert not (tmp_path / "out").exists()


def test_a_bad_value_in_the_python_api_names_the_choices_and_no_field_list():
    from lm.config import ConfigError
    from lm.data.prepare import data_config

    with pytest.raises(ConfigError) as e:
        data_config({"split": "foo"})
    assert str(e.value) == "bad data config: data.split: Invalid value 'foo', expected one of [document, contiguous]"
    with pytest.raises(ConfigError, match=r"data.vocab: Key 'vocab' not in 'DataConfig'. Allowed fields: \['append_"):
        data_config({"vocab": 3})  # an unknown key still lists the keys there are


def test_lm_prepare_writes_no_progress_frames_into_a_redirected_log(tmp_path, stories, capsys, monkeypatch):
    """Under Slurm or nohup stderr is a file: tqdm's carriage-return frames there are one ever-growing line (about
    110 bytes a frame, up to 10 a second: a 10 GB corpus' 10,000 tasks left ~5,000 frames), so the bar is shown on a
    terminal only, as lm train's own preparation does (lm/data/prepare.py ensure_prepared)."""
    args = [str(stories), "--tokenizer", "char", "--val-fraction", "0.2", "--workers", "1", "--task-bytes", "2048"]
    main([*args, "--out", str(tmp_path / "file")])
    err = capsys.readouterr().err
    assert err.count("\r") == 0 and "tokenize:" not in err  # were 2 frames for this 34 kB file
    assert (tmp_path / "file" / "meta.json").exists()
    # instead, a line every PROGRESS_LINE_S (here at every news: the source is read 1 MB at a time)
    monkeypatch.setattr("lm.data.prepare.PROGRESS_LINE_S", 0.0)
    big = tmp_path / "big.txt"
    big.write_text(stories.read_text() * 100)  # 2.76 MB: three reads
    main([str(big), *args[1:-2], "--out", str(tmp_path / "lines")])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("lm prepare: tokenized")]
    assert [ln.split(" in ")[0] for ln in lines] == [
        "lm prepare: tokenized 2.10MB of 2.76MB (76%)",  # the first tasks' reads: 2 MB
        "lm prepare: tokenized 2.76MB of 2.76MB (100%)",
    ]
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # a terminal: the bar, as before
    main([*args, "--out", str(tmp_path / "tty")])
    assert "tokenize: 100%" in capsys.readouterr().err
