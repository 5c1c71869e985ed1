"""`lm-prepare`: raw text -> tokenizer.json + token shards + meta.json, in parallel and resumable.

    lm-prepare tiny_shakespeare --tokenizer char --split contiguous --val-fraction 0.1 --out data/shakespeare
    lm-prepare --data tinystories_sample_bpe          # a conf/data preset
    lm-prepare 'corpus/*.jsonl.zst' --text-field content --vocab-size 32000 --workers 16 --out data/web
    lm-prepare --verify data/web                      # re-check shard sizes and checksums
    lm-prepare --list                                 # the registry of well-known corpora

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
        What `lm-train` calls on rank 0 before training: returns data_cfg.dir when it is complete
        and was made from the same data settings, prepares it on first use, and raises when it
        was made from different settings (it never silently mixes two datasets).
    open_prepared(dir) -> dict
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
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import itertools
import json
import logging
import multiprocessing as mp
import os
import shutil
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional

import numpy as np

from lm.config import ConfigError, to_typed
from lm.data.config import DataConfig, data_preset, validate_data
from lm.data.sources import (CORPORA, DataError, Planner, ReadOptions, SourceFile, Task, contiguous_cut, iter_texts,
                             read_task, resolve)
from lm.data.tokenizer import KINDS, Tokenizer, TokenizerError, iter_limited, train

FORMAT_VERSION = 1
META, PROGRESS, TOKENIZER = "meta.json", "progress.json", "tokenizer.json"
# Settings that change the prepared tokens; the others (workers, dir, loader options) do not.
CONTENT_FIELDS = ("source", "val_source", "format", "text_field", "hf_split", "doc_split", "doc_separator",
                  "tokenizer", "vocab_size", "n_sentinels", "tokenizer_train_chars", "split", "val_fraction",
                  "split_seed", "append_eos", "task_bytes", "encoding_errors", "bad_records")
log = logging.getLogger("lm.data")


def say(msg: str) -> None:
    """Tell the user what happens (resume, restart, skip...) on stderr. The logger gets it at debug
    level only: under lm-train, Hydra's console handler would otherwise print every line twice."""
    print(f"lm-prepare: {msg}", file=sys.stderr, flush=True)
    log.debug(msg)


# -- config ---------------------------------------------------------------------------------------


def data_config(cfg) -> DataConfig:
    """A validated DataConfig from a DataConfig (what lm-train passes, typed once at its entry) or a plain
    dict (the Python API and lm-prepare's flags, which do not go through Hydra)."""
    if not isinstance(cfg, DataConfig):
        if not isinstance(cfg, dict):
            raise TypeError(f"a data config is a DataConfig (lm.data.config) or a dict, not {type(cfg).__name__}")
        cfg = to_typed(DataConfig, cfg, "data")
    validate_data(cfg)
    return cfg


def with_corpus_defaults(cfg: DataConfig, corpus) -> DataConfig:
    """Fill the settings left None with the registry corpus' own choices, else the general defaults."""
    from dataclasses import replace

    return replace(cfg, doc_split=cfg.doc_split or (corpus.doc_split if corpus else "line"),
                   doc_separator=cfg.doc_separator or (corpus.doc_separator if corpus else None),
                   split=cfg.split or (corpus.split if corpus else "document"))


def read_options(cfg: DataConfig) -> ReadOptions:
    return ReadOptions(doc_split=cfg.doc_split, doc_separator=cfg.doc_separator, text_field=cfg.text_field,
                       split=cfg.split, val_fraction=cfg.val_fraction, split_seed=cfg.split_seed,
                       encoding_errors=cfg.encoding_errors, bad_records=cfg.bad_records, task_bytes=cfg.task_bytes,
                       hf_streaming=cfg.hf_streaming)


def content_config(cfg: DataConfig) -> dict:
    d = asdict(cfg)
    return {k: d[k] for k in CONTENT_FIELDS}


def _workers(cfg: DataConfig) -> int:
    if cfg.workers:
        return cfg.workers
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# -- workers --------------------------------------------------------------------------------------


@dataclass
class Result:
    tokens: Dict[str, np.ndarray]
    docs: Dict[str, int]
    bytes: int
    bad_records: int = 0
    examples: List[str] = field(default_factory=list)
    invalid_utf8: int = 0


_W: dict = {}


def _init_worker(tokenizer_path: str, opts: ReadOptions, append_eos: bool, parallel: bool = False) -> None:
    if not parallel:  # one thread per worker process: the processes are the parallelism
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    tok = Tokenizer.load(tokenizer_path)
    _W.update(tok=tok, opts=opts, eos=(tok.eos_id,) if append_eos else (), dtype=token_dtype(tok.vocab_size))


def _work(task: Task) -> Result:
    docs = read_task(task, _W["opts"])
    ids = _W["tok"].encode_batch(docs.texts) if docs.texts else []
    parts: Dict[str, list] = {}
    counts: Dict[str, int] = {}
    eos = _W["eos"]
    for doc_ids, ends, split in zip(ids, docs.ends, docs.splits):  # one pass, whatever the number of splits
        if split not in parts:
            parts[split], counts[split] = [], 0
        parts[split].append(doc_ids)
        if ends:
            parts[split].append(eos)
            counts[split] += 1
    tokens = {s: np.fromiter(itertools.chain.from_iterable(p), dtype=_W["dtype"]) for s, p in parts.items()}
    return Result(tokens, counts, docs.bytes, docs.bad_records, docs.examples, docs.invalid_utf8)


def tokenize_tasks(tasks: Iterable[Task], workers: int, init_args: tuple) -> Iterator[Result]:
    """Results in task order; at most 2*workers tasks in flight, so memory stays bounded."""
    if workers <= 1:
        _init_worker(*init_args)
        yield from map(_work, tasks)
        return
    # spawn, not fork: the parent may have used the tokenizers thread pool (training), which a fork would break
    with mp.get_context("spawn").Pool(workers, _init_worker, init_args) as pool:
        pending: deque = deque()
        for task in tasks:
            pending.append(pool.apply_async(_work, (task,)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def token_dtype(vocab_size: int):
    return np.uint16 if vocab_size <= 1 << 16 else np.uint32


# -- shards ---------------------------------------------------------------------------------------


class CannotResume(Exception):
    pass


class ShardWriter:
    """Appends one split's tokens to shards of `shard_tokens`; the open shard has a .tmp name."""

    def __init__(self, root: Path, split: str, dtype, shard_tokens: int, state: Optional[dict] = None):
        self.root, self.split, self.dtype, self.limit = root, split, np.dtype(dtype), shard_tokens
        self.shards: List[dict] = list(state["shards"]) if state else []
        for s in self.shards:
            if not (root / s["file"]).is_file() or (root / s["file"]).stat().st_size != s["tokens"] * self.dtype.itemsize:
                raise CannotResume(f"{s['file']} is missing or has the wrong size")
        self._open(state["current"] if state else 0)

    @property
    def _tmp(self) -> Path:
        return self.root / f"{self.split}_{len(self.shards):05d}.bin.tmp"

    def _open(self, keep: int) -> None:
        self.hash, self.tokens = hashlib.sha256(), keep
        if keep:
            size = keep * self.dtype.itemsize
            if not self._tmp.is_file() or self._tmp.stat().st_size < size:
                raise CannotResume(f"{self._tmp.name} is shorter than the progress record")
            with open(self._tmp, "r+b") as f:
                f.truncate(size)  # drop what was written after the last progress record
                while chunk := f.read(1 << 22):
                    self.hash.update(chunk)
        self.f = open(self._tmp, "ab" if keep else "wb")

    def write(self, tokens: np.ndarray) -> None:
        while tokens.size:
            part, tokens = tokens[: self.limit - self.tokens], tokens[self.limit - self.tokens:]
            data = part.tobytes()
            self.f.write(data)
            self.hash.update(data)
            self.tokens += part.size
            if self.tokens >= self.limit:
                self._finish_shard()
                self._open(0)

    def _finish_shard(self) -> None:
        self.f.close()
        final = self._tmp.with_suffix("")
        os.replace(self._tmp, final)
        self.shards.append({"file": final.name, "tokens": self.tokens, "sha256": self.hash.hexdigest()})

    def state(self) -> dict:
        self.f.flush()
        return {"shards": self.shards, "current": self.tokens}

    def release(self) -> None:
        """Close the open shard's file handle, finished or not (the progress record says what is valid)."""
        self.f.close()

    def close(self) -> dict:
        if self.tokens:
            self._finish_shard()
        else:
            self.f.close()
            self._tmp.unlink()
        return {"tokens": sum(s["tokens"] for s in self.shards), "shards": self.shards}


# -- the run --------------------------------------------------------------------------------------


@dataclass
class Stats:
    docs: Dict[str, int] = field(default_factory=dict)
    bad_records: int = 0
    examples: List[str] = field(default_factory=list)
    invalid_utf8: int = 0

    def add(self, r: Result) -> None:
        for split, n in r.docs.items():
            self.docs[split] = self.docs.get(split, 0) + n
        self.bad_records += r.bad_records
        self.examples = (self.examples + r.examples)[:5]
        self.invalid_utf8 += r.invalid_utf8


def fingerprint(content: dict, files: List[SourceFile]) -> str:
    stamp = [(f.path, f.format, f.split, *f.stat()) for f in files]
    blob = json.dumps({"version": FORMAT_VERSION, "config": content, "files": stamp}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _read_json(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


@contextlib.contextmanager
def _lock(out: Path):
    """One lm-prepare per output directory at a time (e.g. two ranks calling ensure_prepared)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for another lm-prepare that is writing {out}")
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _sources(cfg: DataConfig):
    files, corpus = resolve(cfg.source, cfg.format, mirror=cfg.mirror, hf_split=cfg.hf_split)
    if cfg.val_source is not None:
        files = [SourceFile(f.path, f.format, f.split or "train", f.hf_split) for f in files]
        files += resolve(cfg.val_source, cfg.format, split="val", mirror=cfg.mirror, hf_split=cfg.hf_split)[0]
    return files, corpus


def _check_out(out: Path, content: dict, force: bool) -> bool:
    """True when `out` is already complete for these settings; raise when it must not be touched."""
    if not out.exists():
        return False
    meta = _read_json(out / META)
    if meta is None:
        if any(out.iterdir()):
            raise DataError(f"{out} exists, is not empty and is not a finished lm-prepare directory (no {META}); "
                            f"refusing to overwrite it: choose another --out, or remove it")
        return False
    if meta.get("config") == content and not force:
        return True
    if not force:
        diff = sorted(k for k in content if meta.get("config", {}).get(k) != content[k])
        raise DataError(f"{out} holds data prepared with other settings (differs in: {diff}). Pass --force to "
                        f"rebuild it (the old data stays until the new data is complete), or choose another --out")
    return False


def _start(partial: Path, fp: str, restart: bool) -> Optional[dict]:
    """The progress record to resume from, or None (fresh start); says which."""
    progress = _read_json(partial / PROGRESS) if partial.exists() else None
    if progress and progress.get("fingerprint") == fp and not restart:
        say(f"resuming the interrupted run in {partial} ({progress['tasks_done']} tasks already done)")
        return progress
    if partial.exists():
        why = "--restart was given" if restart else "its sources or settings differ" if progress else \
            "it has no progress record"
        say(f"restarting: discarding the interrupted run in {partial} ({why})")
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    return None


def _tokenizer(cfg: DataConfig, files, opts, cut, partial: Path, progress: Optional[dict], show: bool) -> Tokenizer:
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


def prepare(cfg, out=None, *, force: bool = False, restart: bool = False, progress: bool = True) -> Path:
    """Build (or resume, or find complete) the prepared directory of a data config. See the module doc."""
    cfg = data_config(cfg)
    out = Path(out or cfg.dir).expanduser().absolute()
    files, corpus = _sources(cfg)
    cfg = with_corpus_defaults(cfg, corpus)
    validate_data(cfg)
    content = content_config(cfg)
    with _lock(out):
        if _check_out(out, content, force):
            say(f"{out} is already prepared with these settings; nothing to do")
            return out
        partial = out.with_name(f".{out.name}.partial")
        fp = fingerprint(content, files)
        state = _start(partial, fp, restart)
        try:
            _run(cfg, files, partial, fp, state, progress)
        except CannotResume as e:
            say(f"restarting: cannot resume ({e})")
            shutil.rmtree(partial)
            partial.mkdir()
            _run(cfg, files, partial, fp, None, progress)
        _publish(partial, out)
    return out


def _run(cfg: DataConfig, files, partial: Path, fp: str, state: Optional[dict], show: bool) -> None:
    from tqdm import tqdm

    t0 = time.time()
    opts = read_options(cfg)
    cut = contiguous_cut(files, opts) if cfg.split == "contiguous" else None
    tok = _tokenizer(cfg, files, opts, cut, partial, state, show)
    dtype = token_dtype(tok.vocab_size)
    state = state or {"tasks_done": 0, "writers": {}, "stats": {}}
    writers = {s: ShardWriter(partial, s, dtype, cfg.shard_tokens, w) for s, w in state["writers"].items()}
    stats = Stats(**state["stats"])
    planner = Planner(files, opts, cut)
    tasks, done = iter(planner), state["tasks_done"]
    skipped_bytes = sum(t.raw_bytes for t in itertools.islice(tasks, done))
    total = sum(os.path.getsize(f.path) for f in files if f.format != "hf") or None
    init = (str(partial / TOKENIZER), opts, cfg.append_eos)
    with tqdm(total=total, initial=skipped_bytes, unit="B", unit_scale=True, desc="tokenize", disable=not show,
              file=sys.stderr) as bar, contextlib.ExitStack() as files_open:
        for w in writers.values():
            files_open.callback(w.release)
        for result in tokenize_tasks(tasks, _workers(cfg), init):
            for split, tokens in result.tokens.items():
                if split not in writers:
                    writers[split] = ShardWriter(partial, split, dtype, cfg.shard_tokens)
                    files_open.callback(writers[split].release)
                writers[split].write(tokens)
            stats.add(result)
            done += 1
            _write_json(partial / PROGRESS, {"fingerprint": fp, "tasks_done": done, "stats": asdict(stats),
                                             "writers": {s: w.state() for s, w in writers.items()}})
            bar.update(result.bytes)
    splits = {s: {**w.close(), "documents": stats.docs.get(s, 0)} for s, w in sorted(writers.items())}
    _check_splits(cfg, splits, planner)
    meta = {"format_version": FORMAT_VERSION, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "tokenizer": {"file": TOKENIZER, "kind": tok.kind, "vocab_size": tok.vocab_size, "sha256": tok.sha256,
                          "specials": tok.specials},
            "dtype": np.dtype(dtype).name, "config": content_config(cfg), "fingerprint": fp,
            "sources": planner.sources, "splits": splits,
            "skipped": {"empty_files": planner.empty_files, "bad_records": stats.bad_records,
                        "bad_record_examples": stats.examples, "invalid_utf8_sequences": stats.invalid_utf8},
            "seconds": round(time.time() - t0, 2)}
    _write_json(partial / META, meta)  # last: from here on the directory is complete
    (partial / PROGRESS).unlink()
    _summary(meta)


def _check_splits(cfg: DataConfig, splits: dict, planner: Planner) -> None:
    if not any(s["tokens"] for s in splits.values()):
        empty = f" (empty files skipped: {planner.empty_files})" if planner.empty_files else ""
        raise DataError(f"no text found in the sources {[s['path'] for s in planner.sources]}{empty}; check the "
                        f"paths, the format and text_field")
    needed = ["train"] + (["val"] if cfg.val_fraction > 0 else [])
    for split in needed:
        if not splits.get(split, {}).get("tokens"):
            docs = {s: v["documents"] for s, v in splits.items()}
            raise DataError(f"the {split} split is empty: documents per split {docs} (split={cfg.split}, "
                            f"val_fraction={cfg.val_fraction}). With few, large documents use split=contiguous "
                            f"(--split contiguous); else change val_fraction or split_seed, or give val_source")


def _summary(meta: dict) -> None:
    parts = [f"{s}: {v['tokens']:,} tokens, {v['documents']:,} documents, {len(v['shards'])} shards"
             for s, v in meta["splits"].items()]
    tokens = sum(v["tokens"] for v in meta["splits"].values())
    say(f"done in {meta['seconds']}s ({tokens / max(meta['seconds'], 1e-9):,.0f} tokens/s); " + "; ".join(parts))
    sk = meta["skipped"]
    if sk["empty_files"]:
        say(f"skipped {len(sk['empty_files'])} empty files: {sk['empty_files'][:5]}")
    if sk["bad_records"]:
        say(f"skipped {sk['bad_records']} bad records, e.g. {sk['bad_record_examples']}")
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


# -- reading a prepared directory ----------------------------------------------------------------


def open_prepared(data_dir, checksums: bool = False) -> dict:
    """meta.json of a complete prepared directory, after checking what can go wrong cheaply:
    missing manifest, tokenizer/shard mismatch, missing or truncated shards (and, with
    checksums=True, corrupt shards)."""
    root = Path(data_dir).expanduser()
    meta = _read_json(root / META)
    if meta is None:
        partial = root.with_name(f".{root.name}.partial")
        hint = f" (an interrupted run left {partial}; re-run the same lm-prepare command to resume it)" \
            if partial.exists() else ""
        raise DataError(f"{root}: no readable {META}, so this is not a complete lm-prepare directory{hint}; "
                        f"run lm-prepare --out {root} (or let lm-train prepare it)")
    if meta.get("format_version") != FORMAT_VERSION:
        raise DataError(f"{root / META}: format version {meta.get('format_version')}, this code reads "
                        f"{FORMAT_VERSION}; re-run lm-prepare --force --out {root}")
    tok = Tokenizer.load(root / meta["tokenizer"]["file"])
    if tok.sha256 != meta["tokenizer"]["sha256"]:
        raise DataError(f"{root / TOKENIZER} does not match the tokenizer the shards were made with (sha256 "
                        f"{tok.sha256[:12]} vs {meta['tokenizer']['sha256'][:12]} in {META}); the directory mixes two "
                        f"runs: re-run lm-prepare --force --out {root}")
    itemsize = np.dtype(meta["dtype"]).itemsize
    for split in meta["splits"].values():
        for s in split["shards"]:
            path = root / s["file"]
            size = path.stat().st_size if path.is_file() else None
            if size != s["tokens"] * itemsize:
                raise DataError(f"{path}: {'missing' if size is None else f'{size} bytes'}, expected "
                                f"{s['tokens'] * itemsize} ({s['tokens']} tokens of {meta['dtype']}): the shard is "
                                f"truncated or corrupt; re-run lm-prepare --force --out {root}")
            if checksums and _sha256(path) != s["sha256"]:
                raise DataError(f"{path}: sha256 differs from {META}: the shard is corrupt; re-run lm-prepare --force "
                                f"--out {root}")
    return meta


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def ensure_prepared(data_cfg) -> Path:
    """The prepared directory of `data_cfg` (lm-train calls this on rank 0): prepare it on first use.

    Raises DataError when the directory was prepared from different data settings, naming them.
    """
    cfg = data_config(data_cfg)
    out = Path(cfg.dir).expanduser()
    return prepare(cfg, out, progress=sys.stderr.isatty())


# -- CLI ------------------------------------------------------------------------------------------

HELP = {
    "source": "registry corpus, file, directory, glob or hf:<dataset>[:<config>] (several allowed)",
    "val_source": "sources that form the val split (then the split rule is not applied)",
    "mirror": "local copy of registry files (default: $LM_DATA_MIRROR)",
    "format": "auto (by extension) | text | jsonl | parquet | hf",
    "text_field": "JSONL field / Parquet or dataset column that holds the text",
    "hf_split": "split of a Hugging Face dataset to read",
    "doc_split": "what a document is in text files: file | line | blank_line | regex",
    "doc_separator": "the regex between documents when --doc-split regex",
    "tokenizer": "bpe | unigram | char, or the path of an existing tokenizer.json",
    "vocab_size": "vocabulary size to train (bpe, unigram)",
    "n_sentinels": "number of <extra_id_i> sentinel tokens (T5 span corruption)",
    "tokenizer_train_chars": "train the tokenizer on at most this many characters of the train split",
    "split": "document (a hash of each document decides) | contiguous (the last val_fraction of the text, "
             "as nanoGPT)",
    "val_fraction": "fraction of documents (or text) for the val split",
    "split_seed": "seed of the document split",
    "append_eos": "put EOS after every document",
    "workers": "tokenizer processes (0 = one per CPU core)",
    "shard_tokens": "tokens per shard file",
    "task_bytes": "bytes of text per worker task",
    "encoding_errors": "strict (bad UTF-8 is an error) | replace (decode as U+FFFD and count)",
    "bad_records": "error | skip (count and skip JSONL/Parquet records without text)",
    "hf_streaming": "stream a Hugging Face dataset instead of downloading it whole",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lm-prepare", description=__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Registry corpora (lm-prepare --list for details): " + ", ".join(CORPORA))
    p.add_argument("sources", nargs="*", help=HELP["source"])
    p.add_argument("--data", metavar="PRESET", help="start from conf/data/PRESET.yaml (flags override it)")
    p.add_argument("--out", help="output directory (default: the preset's dir)")
    p.add_argument("--force", action="store_true", help="rebuild a complete directory; the old one stays until the "
                   "new one is complete")
    p.add_argument("--restart", action="store_true", help="discard an interrupted run instead of resuming it")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--list", action="store_true", help="list the registry of well-known corpora and exit")
    p.add_argument("--verify", metavar="DIR", help="check a prepared directory's shards (sizes, sha256) and exit")
    defaults = DataConfig()
    for name, help_ in HELP.items():
        if name == "source":
            continue
        flag, default = "--" + name.replace("_", "-"), getattr(defaults, name)
        if isinstance(default, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_)
        else:
            kind = type(default) if isinstance(default, (int, float)) and not isinstance(default, bool) else str
            p.add_argument(flag, type=kind, default=None, nargs="+" if name == "val_source" else None, help=help_)
    return p


def main(argv: Optional[List[str]] = None) -> None:
    args = _parser().parse_args(argv)
    try:
        if args.list:
            for name, c in CORPORA.items():
                print(f"{name:20s} {c.description}")
            return
        if args.verify:
            meta = open_prepared(args.verify, checksums=True)
            n = sum(len(s["shards"]) for s in meta["splits"].values())
            print(f"{args.verify}: OK ({n} shards, sizes and sha256 match {META})")
            return
        base = asdict(data_preset(args.data)) if args.data else {}
        given = {k: v for k, v in vars(args).items() if k in HELP and v is not None}
        if args.sources:
            given["source"] = args.sources if len(args.sources) > 1 else args.sources[0]
        if not args.out and not args.data:
            raise ConfigError("say where to write: --out DIR (or --data PRESET, whose dir is used)")
        cfg = data_config({**base, **given})
        prepare(cfg, args.out, force=args.force, restart=args.restart, progress=not args.no_progress)
    except (DataError, ConfigError, TokenizerError) as e:
        sys.exit(f"lm-prepare: error: {e}")


if __name__ == "__main__":
    main()
