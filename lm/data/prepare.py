"""`lm prepare`: raw text -> tokenizer.json + token shards + meta.json, in parallel and resumable.

    lm prepare tiny_shakespeare --tokenizer char --split contiguous --val-fraction 0.1 --out data/shakespeare
    lm prepare --data tinystories_sample_bpe          # a conf/data preset
    lm prepare 'corpus/*.jsonl.zst' --text-field content --vocab-size 32000 --workers 16 --out data/web
    lm prepare --verify data/web                      # re-check shard sizes and checksums
    lm prepare --list                                 # the registry of well-known corpora

The output directory holds
    tokenizer.json               specials first: pad=0 bos=1 eos=2 mask=3 sep=4 cls=5 unk=6, sentinels
    <split>_00000.bin ...        flat token ids (meta.json "dtype": uint16 when the vocabulary fits),
                                 documents separated by EOS; memory-mapped by lm.data.packed
    meta.json                    written LAST, so its presence means "complete": tokenizer hash,
                                 sources with sizes and sha256, token and document counts, dtype,
                                 shard checksums, skipped inputs, format version

Python API:
    prepare(cfg, out=None, force=False, restart=False) -> Path
        Build the directory of a DataConfig (or a dict of its fields).
    ensure_prepared(data_cfg) -> Path
        What `lm train` calls on rank 0 before training: returns data_cfg.dir when it is complete
        and was made from the same data settings, prepares it on first use, and raises when it
        was made from different settings (it never silently mixes two datasets).
    open_prepared(dir) -> dict                        (lm/data/manifest.py)
        meta.json of a complete directory after checking tokenizer hash and shard sizes.

Atomicity and resume: everything is written in a sibling `.<name>.partial/` directory. A
progress.json there records, after every task, how many tasks are done and how long each open
shard is. Re-running the same command resumes (open shards are truncated back to the last
record, finished tasks are skipped) and says so; a run with other inputs or settings restarts
and says so. The finished directory is renamed into place at the end, replacing an old one
only with --force, so a failed run never loses or overwrites finished data.

Tokenization runs in `workers` spawned processes (one thread each); the main process reads the
sources once, in order, cuts them into tasks of ~task_bytes at document boundaries, keeps at
most 2*workers tasks in flight and writes results in task order, so memory does not grow with
the corpus and the output does not depend on the number of workers.

The pieces: lm/data/sources.py (what to read), tasks.py and documents.py (reading), workers.py
(tokenizing), shards.py (writing), manifest.py (meta.json, progress, opening); the command line is
lm/cli/prepare.py.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from lm.config_base import ConfigError, to_typed
from lm.core.files import exclusive
from lm.data.config import DataConfig, validate_data
from lm.data.dedup import KEYS_FILE, Deduper
from lm.data.documents import iter_texts
from lm.data.errors import DataError
from lm.data.manifest import (
    FORMAT_VERSION,
    META,
    PROGRESS,
    TOKENIZER,
    fingerprint,
    open_prepared,
    read_json,
    write_json,
    written_by_prepare,
)
from lm.data.shards import CannotResume, ShardWriter
from lm.data.sources import SourceFile, resolve
from lm.data.tasks import Planner, ReadOptions, contiguous_cut
from lm.data.tokenizer import KINDS, Tokenizer, iter_limited, train
from lm.data.workers import Result, token_dtype, tokenize_tasks

# Settings that change the prepared tokens; the others (workers, dir, loader options) do not.
CONTENT_FIELDS = (
    "source",
    "val_source",
    "format",
    "text_field",
    "hf_split",
    "doc_split",
    "doc_separator",
    "tokenizer",
    "vocab_size",
    "n_sentinels",
    "tokenizer_train_chars",
    "split",
    "val_fraction",
    "split_seed",
    "append_eos",
    "task_bytes",
    "encoding_errors",
    "bad_records",
    "max_doc_chars",
    "dedup",
    "min_doc_chars",
)
# Settings added after directories were prepared without them, with the value those directories were made with.
LATER_FIELDS = {"dedup": False, "min_doc_chars": 0}
# Off a terminal (Slurm, nohup) there is no bar: one line this often says how far tokenizing has come instead.
PROGRESS_LINE_S = 60.0
log = logging.getLogger("lm.data")


def say(msg: str) -> None:
    """Tell the user what happens (resume, restart, skip...) on stderr. The logger gets it at debug
    level only: under lm train, Hydra's console handler would otherwise print every line twice."""
    print(f"lm prepare: {msg}", file=sys.stderr, flush=True)
    log.debug(msg)


# -- config ---------------------------------------------------------------------------------------


def data_config(cfg) -> DataConfig:
    """A validated DataConfig from a DataConfig (what lm train passes, typed once at its entry) or a plain
    dict (the Python API and lm prepare's flags, which do not go through Hydra)."""
    if not isinstance(cfg, DataConfig):
        if not isinstance(cfg, dict):
            raise TypeError(f"a data config is a DataConfig (lm.data.config) or a dict, not {type(cfg).__name__}")
        cfg = to_typed(DataConfig, cfg, "data")
    validate_data(cfg)
    return cfg


def with_corpus_defaults(cfg: DataConfig, corpus) -> DataConfig:
    """Fill the settings left None with the registry corpus' own choices, else the general defaults."""
    from dataclasses import replace

    return replace(
        cfg,
        doc_split=cfg.doc_split or (corpus.doc_split if corpus else "line"),
        doc_separator=cfg.doc_separator or (corpus.doc_separator if corpus else None),
        split=cfg.split or (corpus.split if corpus else "document"),
    )


def _check_used(cfg: DataConfig, files: list[SourceFile], corpus) -> None:
    """A setting these sources would never read is refused, naming it (it was silently ignored)."""
    doc_split = cfg.doc_split or (corpus.doc_split if corpus else "line")
    if cfg.doc_separator and doc_split != "regex":
        raise ConfigError(
            f"data.doc_separator='{cfg.doc_separator}' is read only with doc_split=regex, and this run splits "
            f"documents by {doc_split!r}: add --doc-split regex (data.doc_split=regex), or drop the separator"
        )
    _check_doc_split_used(cfg, files)
    if cfg.text_field != "text" and files and all(f.format == "text" for f in files):
        raise ConfigError(
            f"data.text_field={cfg.text_field!r} names a JSONL field or a Parquet, CSV, TSV or dataset column, but "
            f"every source is read as plain text ({files[0].path}{' ...' if len(files) > 1 else ''}): drop "
            f"--text-field, or pass --format jsonl (data.format=jsonl) if the files hold JSON lines, --format csv or "
            f"tsv if they are tables with a header row"
        )


def _check_doc_split_used(cfg: DataConfig, files: list[SourceFile]) -> None:
    """--doc-split says what a document is in plain text; a JSONL record or a table's row is a document already, so a
    --doc-split file (or blank_line, regex) on record sources alone changed nothing (line is the default, never
    refused). With plain-text sources among them, it applies to those (a list mixes both: gutenberg_mix_bpe)."""
    if cfg.doc_split in (None, "line") or not files or any(f.format == "text" for f in files):
        return
    formats = ", ".join(sorted({f.format for f in files}))
    raise ConfigError(
        f"data.doc_split={cfg.doc_split} says what a document is in plain-text files, and every source is read as "
        f"records ({formats}: {files[0].path}{' ...' if len(files) > 1 else ''}), each JSONL record or Parquet, CSV, "
        f"TSV or dataset row a document already: drop --doc-split (data.doc_split=line), or pass --format text "
        f"(data.format=text) if the files are plain text"
    )


def read_options(cfg: DataConfig) -> ReadOptions:
    return ReadOptions(
        doc_split=cfg.doc_split,
        doc_separator=cfg.doc_separator,
        text_field=cfg.text_field,
        split=cfg.split,
        val_fraction=cfg.val_fraction,
        split_seed=cfg.split_seed,
        encoding_errors=cfg.encoding_errors,
        bad_records=cfg.bad_records,
        task_bytes=cfg.task_bytes,
        max_doc_chars=cfg.max_doc_chars,
        hf_streaming=cfg.hf_streaming,
        dedup=cfg.dedup,
        min_doc_chars=cfg.min_doc_chars,
    )


def content_config(cfg: DataConfig) -> dict:
    d = asdict(cfg)
    return {k: d[k] for k in CONTENT_FIELDS}


def _workers(cfg: DataConfig) -> int:
    if cfg.workers:
        return cfg.workers
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# -- the run --------------------------------------------------------------------------------------


@dataclass
class Stats:
    docs: dict[str, int] = field(default_factory=dict)
    bad_records: int = 0
    examples: list[str] = field(default_factory=list)
    invalid_utf8: int = 0
    split_docs: int = 0
    short_docs: int = 0  # dropped: shorter than min_doc_chars
    duplicate_docs: int = 0  # dropped by dedup
    duplicate_tokens: int = 0
    unknown_tokens: int = 0  # the tokenizer's unk id written: characters its vocabulary lacks

    def add(self, r: Result) -> None:
        for split, n in r.docs.items():
            self.docs[split] = self.docs.get(split, 0) + n
        self.bad_records += r.bad_records
        self.examples = (self.examples + r.examples)[:5]
        self.invalid_utf8 += r.invalid_utf8
        self.split_docs += r.split_docs
        self.short_docs += r.short_docs
        self.duplicate_docs += r.duplicate_docs
        self.duplicate_tokens += r.duplicate_tokens


def _sources(cfg: DataConfig):
    files, corpus = resolve(cfg.source, cfg.format, mirror=cfg.mirror, hf_split=cfg.hf_split)
    if cfg.val_source is not None:
        files = [SourceFile(f.path, f.format, f.split or "train", f.hf_split) for f in files]
        files += resolve(cfg.val_source, cfg.format, split="val", mirror=cfg.mirror, hf_split=cfg.hf_split)[0]
    return files, corpus


# How to resolve prepared data that differs from the settings asked for: lm prepare can rebuild (--force);
# lm train must not touch the directory, and gives the new settings a directory of their own instead.
REBUILD_HINT = "Pass --force to rebuild it (the old data stays until the new data is complete), or choose another --out"
TRAIN_HINT = (
    "Give these settings a directory of their own (data.name=<new name> or data.dir=<new dir>), or train on "
    "that directory as it is: data=<dir>"
)


def _check_out(out: Path, content: dict, force: bool, hint: str = REBUILD_HINT, files=()) -> bool:
    """True when `out` is already complete for these settings and sources; raise when it must not be touched."""
    if not out.exists():
        return False
    meta = read_json(out / META)
    if meta is None:
        if any(out.iterdir()):
            raise DataError(
                f"{out} exists, is not empty and is not a finished lm prepare directory (no readable "
                f"{META} object); refusing to overwrite it: choose another --out, or remove it"
            )
        return False
    # Directories prepared before max_doc_chars existed are kept: their long documents were tokenized whole,
    # which cost memory then, not correctness now.
    stored = {"max_doc_chars": content["max_doc_chars"], **LATER_FIELDS, **meta.get("config", {})}
    if stored == content and not force:
        changed = _changed_sources(meta.get("sources"), files)
        if changed:
            raise DataError(f"{out} was prepared from sources that changed since ({changed}). {hint}")
        return True
    if not force:
        diff = sorted(k for k in content if stored.get(k) != content[k])
        raise DataError(f"{out} holds data prepared with other settings (differs in: {diff}). {hint}")
    if not written_by_prepare(out, meta):  # --force replaces the whole directory
        theirs = sorted(p.name for p in out.iterdir())[:5]
        raise DataError(
            f"{out} holds files lm prepare did not write (it holds {', '.join(theirs)}; its {META} does "
            f"not list them all), so --force will not replace it: choose another --out, or move the "
            f"directory away"
        )
    return False


def _changed_sources(recorded, files) -> str:
    """What differs between the local files a directory was prepared from (meta.json "sources": path and size)
    and `files` now: a file edited (another size), added or removed. Sizes only, so nothing is read; a
    directory whose recorded paths are all elsewhere now (moved, prepared on another machine) is not judged."""
    if not isinstance(recorded, list):
        return ""
    was = {r["path"]: r.get("bytes") for r in recorded if isinstance(r, dict) and r.get("format") != "hf"}
    now = {f.path: f.stat()[0] for f in files if f.format != "hf"}
    if not was.keys() & now.keys():
        return ""
    edited = [f"{p}: {was[p]:,} -> {now[p]:,} bytes" for p in now if p in was and was[p] not in (None, now[p])]
    added = [f"{p} added" for p in now if p not in was]
    removed = [f"{p} gone" for p in was if p not in now]
    changes = edited + added + removed
    return "; ".join(changes[:3]) + (f"; and {len(changes) - 3} more" if len(changes) > 3 else "")


def _start(partial: Path, fp: str, restart: bool) -> dict | None:
    """The progress record to resume from, or None (fresh start); says which."""
    progress = read_json(partial / PROGRESS) if partial.exists() else None
    if progress and progress.get("fingerprint") == fp and not restart:
        say(f"resuming the interrupted run in {partial} ({progress['tasks_done']} tasks already done)")
        return progress
    if partial.exists():
        why = (
            "--restart was given"
            if restart
            else "its sources or settings differ"
            if progress
            else "it has no progress record"
        )
        say(f"restarting: discarding the interrupted run in {partial} ({why})")
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    return None


def _tokenizer(cfg: DataConfig, files, opts, cut, partial: Path, progress: dict | None, show: bool) -> Tokenizer:
    path = partial / TOKENIZER
    if progress and path.is_file():
        return Tokenizer.load(path)
    if cfg.tokenizer in KINDS:
        t0 = time.time()
        if cfg.tokenizer == "char":  # every symbol of the corpus, val included (as nanoGPT does)
            texts = iter_texts(Planner(files, opts, cut), opts, split=None)
        else:
            texts = iter_limited(iter_texts(Planner(files, opts, cut), opts, "train"), cfg.tokenizer_train_chars)
        tok = train(cfg.tokenizer, texts, cfg.vocab_size, cfg.n_sentinels, progress=show)
        say(f"trained a {cfg.tokenizer} tokenizer with {tok.vocab_size} tokens in {time.time() - t0:.1f}s")
    else:
        tok = Tokenizer.load(cfg.tokenizer)
    tok.save(path)
    return tok


def _outside(files: list, out: Path) -> list:
    """The sources without the files of `out` itself (lm prepare DIR --out DIR/prepared): they are this command's
    output, not text; a rerun counted them as sources added since, and --force would have read the shards."""
    kept = [f for f in files if not Path(f.path).absolute().is_relative_to(out)]
    if files and not kept:
        raise DataError(f"every source file is inside --out {out}: point the source at the text, not at its output")
    return kept


def _check_tokenizer_source(tokenizer: str) -> None:
    """data.tokenizer is a kind to train or an existing tokenizer.json. A typo (`--tokenizer chr`) was read as a path
    and refused only after the output's partial directory was made, in a line naming neither the kinds nor the typo."""
    import difflib

    path = Path(tokenizer).expanduser()
    if tokenizer in KINDS or path.is_file() or (path / TOKENIZER).is_file():
        return
    close = difflib.get_close_matches(tokenizer, KINDS, n=1)
    raise DataError(
        f"data.tokenizer={tokenizer} (lm prepare --tokenizer) is neither a tokenizer to train ({', '.join(KINDS)}) "
        f"nor an existing tokenizer.json (or a directory holding one)"
        + (f"; did you mean {close[0]}?" if close else "")
    )


def _check_boundaries(cfg: DataConfig, files: list[SourceFile]) -> None:
    """append_eos=false leaves nothing between documents: it is for whole files of plain text, which keep their own
    line ends (nanoGPT's shakespeare_char). Lines, paragraphs or records ran together, their separators gone
    (tiny Shakespeare by line: 'hear me speak.All:Speak, speak.First Citizen:You are all resolved')."""
    if cfg.append_eos:
        return
    records = sorted({f.format for f in files if f.format != "text"})
    if cfg.doc_split == "file" and not records:
        return
    what = f"each {'/'.join(records)} record is a document" if records else f"doc_split={cfg.doc_split} splits the text"
    raise ConfigError(
        f"data.append_eos=false (--no-append-eos) puts nothing between documents, and {what}: they would run "
        f"together, the line ends or separators between them lost. It is for whole plain-text files "
        f"(--doc-split file, data.doc_split=file), which keep their own; else drop it"
    )


def _starting(out: Path, files) -> str:
    """The first line of a fresh preparation: what is prepared where, from how much."""
    size = sum(f.stat()[0] for f in files if f.format != "hf")
    hub = sum(f.format == "hf" for f in files)
    what = f"{len(files)} file(s), {size / 1e6:,.1f} MB" if not hub else f"{len(files)} source(s)"
    return f"preparing {out} from {what}: a tokenizer, then the token shards; once, later runs reuse it"


def prepare(
    cfg, out=None, *, force: bool = False, restart: bool = False, progress: bool = True, hint: str = REBUILD_HINT
) -> Path:
    """Build (or resume, or find complete) the prepared directory of a data config. See the module doc."""
    cfg = data_config(cfg)
    out = Path(out or cfg.dir).expanduser().absolute()
    files, corpus = _sources(cfg)
    files = _outside(files, out)
    _check_used(cfg, files, corpus)
    cfg = with_corpus_defaults(cfg, corpus)
    validate_data(cfg)
    content = content_config(cfg)
    # one lm prepare per output directory at a time (e.g. two ranks calling ensure_prepared)
    with exclusive(out.with_name(f".{out.name}.lock"), lambda: say(f"waiting for another lm prepare writing {out}")):
        if _check_out(out, content, force, hint, files):
            say(f"{out} is already prepared with these settings; nothing to do")
            return out
        _check_tokenizer_source(cfg.tokenizer)  # after the check above: data prepared from a file since moved is kept
        _check_boundaries(cfg, files)  # likewise: a directory prepared so before is kept
        partial = out.with_name(f".{out.name}.partial")
        fp = fingerprint(content, files)
        state = _start(partial, fp, restart)
        if state is None:  # a long silence otherwise on a first use (minutes for a large corpus, no bar off a terminal)
            say(_starting(out, files))
        try:
            _run(cfg, files, partial, fp, state, progress)
        except CannotResume as e:
            say(f"restarting: cannot resume ({e})")
            shutil.rmtree(partial)
            partial.mkdir()
            _run(cfg, files, partial, fp, None, progress)
        _publish(partial, out)
    return out


class _ProgressLine:
    """The bar's news as a line every PROGRESS_LINE_S seconds, for a log that is a file."""

    def __init__(self, total: int | None, done: int, t0: float):
        self.total, self.done, self.t0, self.said = total, done, t0, time.time()

    def update(self, n: int) -> None:
        self.done += n
        now = time.time()
        if not n or now - self.said < PROGRESS_LINE_S:  # n = 0: a task inside the last 1 MB read, no news
            return
        from tqdm import tqdm

        self.said, size = now, lambda n: tqdm.format_sizeof(n, "B", 1000)  # tqdm's units: 1.2MB
        of = f" of {size(self.total)} ({100 * self.done / self.total:.0f}%)" if self.total else ""
        say(f"tokenized {size(self.done)}{of} in {(now - self.t0) / 60:.1f} min")


def _run(cfg: DataConfig, files, partial: Path, fp: str, state: dict | None, show: bool) -> None:
    from tqdm import tqdm

    t0 = time.time()
    opts = read_options(cfg)
    cut = contiguous_cut(files, opts) if cfg.split == "contiguous" else None
    tok = _tokenizer(cfg, files, opts, cut, partial, state, show)
    dtype = token_dtype(tok.vocab_size)
    state = state or {"tasks_done": 0, "writers": {}, "stats": {}}
    resumed = sum(sum(s["tokens"] for s in w["shards"]) + w["current"] for w in state["writers"].values())
    writers = {s: ShardWriter(partial, s, dtype, cfg.shard_tokens, w) for s, w in state["writers"].items()}
    stats = Stats(**state["stats"])
    dedup = Deduper(partial, state.get("dedup_keys", 0)) if cfg.dedup else None
    planner = Planner(files, opts, cut)
    tasks, done = iter(planner), state["tasks_done"]
    skipped_bytes = sum(t.raw_bytes for t in itertools.islice(tasks, done))
    total = sum(os.path.getsize(f.path) for f in files if f.format != "hf") or None
    init = (str(partial / TOKENIZER), opts, cfg.append_eos)
    line = _ProgressLine(total, skipped_bytes, t0) if not show else None
    with (
        tqdm(
            total=total,
            initial=skipped_bytes,
            unit="B",
            unit_scale=True,
            desc="tokenize",
            disable=not show,
            file=sys.stderr,
        ) as bar,
        contextlib.ExitStack() as files_open,
    ):
        for w in writers.values():
            files_open.callback(w.release)
        for result in tokenize_tasks(tasks, _workers(cfg), init):
            if dedup is not None:
                result = dedup.filter(result)
            for split, tokens in result.tokens.items():
                stats.unknown_tokens += int(np.count_nonzero(tokens == tok.unk_id))
                if split not in writers:
                    writers[split] = ShardWriter(partial, split, dtype, cfg.shard_tokens)
                    files_open.callback(writers[split].release)
                writers[split].write(tokens)
            stats.add(result)
            done += 1
            write_json(
                partial / PROGRESS,
                {
                    "fingerprint": fp,
                    "tasks_done": done,
                    "stats": asdict(stats),
                    "writers": {s: w.state() for s, w in writers.items()},
                    **({"dedup_keys": dedup.n_keys} if dedup is not None else {}),
                },
            )
            bar.update(result.bytes)
            if line is not None:
                line.update(result.bytes)
    splits = {s: {**w.close(), "documents": stats.docs.get(s, 0)} for s, w in sorted(writers.items())}
    _check_splits(cfg, splits, planner)
    meta = {
        "format_version": FORMAT_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "tokenizer": {
            "file": TOKENIZER,
            "kind": tok.kind,
            "vocab_size": tok.vocab_size,
            "sha256": tok.sha256,
            "specials": tok.specials,
        },
        "dtype": np.dtype(dtype).name,
        "config": content_config(cfg),
        "fingerprint": fp,
        "sources": planner.sources,
        "splits": splits,
        "skipped": {
            "empty_files": planner.empty_files,
            "bad_records": stats.bad_records,
            "bad_record_examples": stats.examples,
            "invalid_utf8_sequences": stats.invalid_utf8,
        },
        "split_documents": stats.split_docs,  # longer than max_doc_chars: tokenized in pieces
        "unknown_tokens": stats.unknown_tokens,  # characters the vocabulary lacks, written as its unk id
        "dropped": {
            "short_documents": stats.short_docs,
            "duplicate_documents": stats.duplicate_docs,
            "duplicate_tokens": stats.duplicate_tokens,
        },
        "seconds": round(time.time() - t0, 2),
    }
    write_json(partial / META, meta)  # last: from here on the directory is complete
    (partial / PROGRESS).unlink()
    (partial / KEYS_FILE).unlink(missing_ok=True)
    _summary(meta, resumed)


def _check_splits(cfg: DataConfig, splits: dict, planner: Planner) -> None:
    if not any(s["tokens"] for s in splits.values()):
        empty = f" (empty files skipped: {planner.empty_files})" if planner.empty_files else ""
        raise DataError(
            f"no text found in the sources {[s['path'] for s in planner.sources]}{empty}; check the "
            f"paths, the format and text_field"
        )
    needed = ["train"] + (["val"] if cfg.val_fraction > 0 else [])
    for split in needed:
        if not splits.get(split, {}).get("tokens"):
            docs = {s: v["documents"] for s, v in splits.items()}
            raise DataError(
                f"the {split} split is empty: documents per split {docs} (split={cfg.split}, "
                f"val_fraction={cfg.val_fraction}). With few, large documents use split=contiguous "
                f"(--split contiguous); else change val_fraction or split_seed, or give val_source"
            )


def _summary(meta: dict, resumed: int = 0) -> None:
    """What was made; the rate counts the tokens of this run only (`resumed`: those an interrupted run had written,
    which counted over this run's seconds made a resumed run look several times faster)."""
    parts = [
        f"{s}: {v['tokens']:,} tokens, {v['documents']:,} documents, {len(v['shards'])} shards"
        for s, v in meta["splits"].items()
    ]
    tokens = sum(v["tokens"] for v in meta["splits"].values()) - resumed
    rate = f"{tokens / max(meta['seconds'], 1e-9):,.0f} tokens/s" + (f" after {resumed:,} resumed" if resumed else "")
    say(f"done in {meta['seconds']}s ({rate}); " + "; ".join(parts))
    sk = meta["skipped"]
    if sk["empty_files"]:
        say(f"skipped {len(sk['empty_files'])} empty files: {sk['empty_files'][:5]}")
    if sk["bad_records"]:
        say(f"skipped {sk['bad_records']} bad records, e.g. {sk['bad_record_examples']}")
    if meta["split_documents"]:
        say(
            f"tokenized {meta['split_documents']} documents longer than max_doc_chars="
            f"{meta['config']['max_doc_chars']:,} characters in pieces cut before whitespace"
        )
    if meta["unknown_tokens"]:
        unk = meta["tokenizer"]["specials"]["unk"]
        say(
            f"wrote {meta['unknown_tokens']:,} unknown tokens (id {unk}): characters the tokenizer's vocabulary lacks "
            f"(a unigram's holds those of the text it was trained on, tokenizer_train_chars of the train split); "
            f"byte-level BPE (tokenizer=bpe) has none"
        )
    dropped = meta.get("dropped", {})
    if dropped.get("short_documents"):
        say(
            f"dropped {dropped['short_documents']:,} documents shorter than min_doc_chars="
            f"{meta['config']['min_doc_chars']} characters"
        )
    if meta["config"].get("dedup"):
        say(
            f"dropped {dropped['duplicate_documents']:,} exact duplicate documents "
            f"({dropped['duplicate_tokens']:,} tokens)"
        )
    if sk["invalid_utf8_sequences"]:
        say(f"replaced {sk['invalid_utf8_sequences']} invalid UTF-8 sequences with U+FFFD")


def _publish(partial: Path, out: Path) -> None:
    """Rename the complete directory into place; an old complete one is removed only after that."""
    if out.exists() and any(out.iterdir()):
        old = out.with_name(f".{out.name}.old{os.getpid()}")
        os.replace(out, old)
        os.replace(partial, out)
        shutil.rmtree(old)
    else:
        if out.exists():
            out.rmdir()
        os.replace(partial, out)


def ensure_prepared(data_cfg) -> Path:
    """The prepared directory of `data_cfg` (lm train calls this on rank 0): prepare it on first use.

    Raises DataError when the directory was prepared from different data settings, naming them. With no
    data.source (data=<dir>, conf/data/prepared.yaml) the directory is lm prepare's output, read as it is.
    """
    cfg = data_config(data_cfg)
    out = Path(cfg.dir).expanduser()
    if cfg.source is None:
        open_prepared(out)
        return out
    return prepare(cfg, out, progress=sys.stderr.isatty(), hint=TRAIN_HINT)
