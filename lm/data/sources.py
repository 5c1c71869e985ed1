"""Where text comes from: a source (registry name, file, directory, glob or hf:<dataset>) -> input files.

A source is a registry name (`tiny_shakespeare`, see lm/data/corpora.py or `lm prepare --list`), a
file, a directory, a glob, `hf:<dataset>[:<config>]`, or `glue:<task>,...` (the unlabelled train
sentences of GLUE tasks, lm/data/glue_text.py). A list of sources is read as their concatenation.
Formats: plain text, JSONL (optionally .gz/.zst) with a text field, Parquet and CSV/TSV (a column: lm/data/tables.py),
and Hugging Face datasets (streamed, or from the local cache).

Reading them is split in two so that it streams and parallelises (lm/data/tasks.py: sources ->
tasks at document boundaries, in the main process; lm/data/documents.py: task -> documents, in
the workers); lm/data/readers.py opens each format.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path

from lm.data.corpora import CORPORA, Corpus, fetch, local_copy, mirror_dir
from lm.data.errors import DataError


@dataclass(frozen=True)
class SourceFile:
    """One input: a local file, or a Hugging Face dataset split (path = "hf:<name>[:<config>]")."""

    path: str
    format: str  # text | jsonl | parquet | csv | tsv | hf
    split: str | None = None  # the corpus' own split (train/val/test); None = apply the split rule
    hf_split: str = "train"

    @property
    def compression(self) -> str | None:
        return {".gz": "gzip", ".zst": "zstd"}.get(Path(self.path).suffix)

    def stat(self) -> tuple[int, int]:
        """(size, mtime_ns); (0, 0) for a dataset."""
        if self.format == "hf":
            return 0, 0
        st = os.stat(self.path)
        return st.st_size, st.st_mtime_ns


def detect_format(path: str, fmt: str = "auto") -> str:
    if fmt != "auto":
        return fmt
    name = Path(path).name.lower()
    for suffix in (".gz", ".zst"):
        name = name[: -len(suffix)] if name.endswith(suffix) else name
    if name.endswith((".jsonl", ".ndjson", ".json")):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith((".csv", ".tsv")):  # a table: its text_field column (lm/data/tables.py), not its lines
        return name[-3:]
    return "text"


def _walk(root: Path) -> list[str]:
    """The files under `root`, hidden ones skipped, following symlinked directories (rglob skipped them, and
    their files with them) except those that lead back to a directory already on the way (a loop)."""
    found = []
    for top, dirs, files in os.walk(root, followlinks=True):
        here = os.path.realpath(top)
        dirs[:] = [
            d
            for d in dirs
            if not d.startswith(".")
            and not (
                os.path.islink(os.path.join(top, d))
                and (here + os.sep).startswith(os.path.realpath(os.path.join(top, d)) + os.sep)
            )
        ]
        found += [os.path.join(top, f) for f in files if not f.startswith(".") and os.path.isfile(os.path.join(top, f))]
    return found


def _once(paths: list[str]) -> list[str]:
    """Sorted, each file once: a glob or directory that reaches a file twice (through a symlink loop, or a
    link to a directory it also holds) read it thousands of times."""
    shortest: dict[str, str] = {}
    for p in sorted(paths, key=lambda p: (len(p), p)):  # a file's shortest path names it
        shortest.setdefault(os.path.realpath(p), p)
    return sorted(shortest.values())


def _expand(pattern: str, fmt: str, split: str | None) -> list[SourceFile]:
    """A path, directory or glob -> sorted files (hidden files skipped), each once."""
    path = Path(pattern).expanduser()
    if any(c in pattern for c in "*?["):
        found = _once([p for p in glob.glob(str(path), recursive=True) if Path(p).is_file()])
        if not found:
            raise DataError(
                f"{pattern}: no file matches this glob; check the pattern (quote it so the shell does not expand it)"
            )
    elif path.is_dir():
        found = _once(_walk(path))
        if not found:
            raise DataError(f"{path}: directory has no files; point the source at the text files")
    elif path.is_file():
        found = [str(path)]
    else:
        raise DataError(
            f"{pattern}: no such file or directory, and not a registry corpus "
            f"({', '.join(CORPORA)}) or hf:<dataset>; check the path or see `lm prepare --list`"
        )
    return [SourceFile(p, detect_format(p, fmt), split) for p in found]


def resolve(
    sources, fmt: str = "auto", split: str | None = None, mirror: str | None = None, hf_split: str = "train"
) -> tuple[list[SourceFile], Corpus | None]:
    """Sources (a string or list of strings) -> input files, plus the registry corpus if one was named."""
    if sources is None:
        raise DataError(
            "no source given: pass a registry corpus, file, directory, glob or hf:<dataset> "
            "(lm prepare SOURCE ..., or data.source=...)"
        )
    items = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    files: list[SourceFile] = []
    corpus = None
    for item in map(str, items):
        if item in CORPORA:
            corpus = CORPORA[item]
            files += corpus_files(item, mirror, split)
        elif item.startswith("hf:"):
            files.append(SourceFile(item, "hf", split, hf_split))
        elif item.startswith("glue:"):
            from lm.data.glue_text import glue_source

            files.append(SourceFile(str(glue_source(item, mirror_dir(mirror))), "text", split))
        else:
            files += _expand(item, fmt, split)
    return files, corpus


def corpus_files(name: str, mirror: str | None = None, only_split: str | None = None) -> list[SourceFile]:
    """The local files of a registry corpus, downloading what neither the mirror nor the cache has."""
    corpus = CORPORA[name]
    root = mirror_dir(mirror)
    if corpus.hf and corpus.files:  # a mirror copy of our own, else the dataset on the hub
        if not _local_or_partial(name, corpus, root):
            return _hf_files(corpus, only_split)
    elif corpus.hf:
        local = root / corpus.mirror_dir if root and corpus.mirror_dir else None
        if local and local.is_dir():
            return _expand(str(local), "auto", only_split)
        return _hf_files(corpus, only_split)
    out = []
    for split, remotes in corpus.files.items():
        split = only_split or (None if split == "all" else split)
        for r in remotes:
            path = str(fetch(r, root))
            out.append(SourceFile(path, detect_format(path), split))
    return out


def _hf_files(corpus: Corpus, only_split: str | None) -> list[SourceFile]:
    dataset, config = corpus.hf
    spec = f"hf:{dataset}" + (f":{config}" if config else "")
    if not corpus.files:  # the dataset's train split, cut by the split rule (or the only_split given)
        return [SourceFile(spec, "hf", only_split)]
    return [SourceFile(spec, "hf", only_split or ours, theirs) for ours, theirs in corpus.hf_splits.items()]


def _local_or_partial(name: str, corpus: Corpus, root) -> bool:
    """True when every file of the corpus is local (mirror or cache), False when none is; a partial copy
    is refused, since reading the hub instead would silently change the corpus."""
    remotes = [r for rs in corpus.files.values() for r in rs]
    absent = [r.mirror for r in remotes if local_copy(r, root) is None]
    if absent and len(absent) < len(remotes):
        where = root or "$LM_DATA_MIRROR"
        raise DataError(
            f"{name}: the mirror {where} holds only part of this corpus; missing: {absent}. Copy the "
            f"missing files there, or remove the others to read {corpus.hf[0]} from the Hugging Face hub"
        )
    return not absent
