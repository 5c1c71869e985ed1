"""Where text comes from: the corpus registry, the local mirror, downloads, and the readers.

A source is a registry name (`tiny_shakespeare`, see CORPORA or `lm-prepare --list`), a file, a
directory, a glob, or `hf:<dataset>[:<config>]`. Registry files are looked up first in the local
mirror (`LM_DATA_MIRROR` or data.mirror), then in the download cache, then downloaded
atomically. Formats: plain text, JSONL (optionally .gz/.zst) with a text field, Parquet, and
Hugging Face datasets (streamed, or from the local cache).

Reading is split in two so that it streams and parallelises:
- `plan_tasks` (main process) reads each source once, in order, and cuts it into tasks of about
  `task_bytes` at document boundaries; memory is bounded by the task size, never the corpus.
- `read_task` (worker process) turns one task into documents: decodes UTF-8, splits documents,
  extracts JSON fields, assigns each document to train or val, counts or rejects bad records.
"""

from __future__ import annotations

import codecs
import contextlib
import glob
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import urllib.error
import urllib.request
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import numpy as np


class DataError(ValueError):
    """Bad input data: the message names the file (and line) and what to do."""


DOC_SPLITS = ("file", "line", "blank_line", "regex")
DOC_SEPARATORS = {"line": r"\n", "blank_line": r"\n[ \t\r]*\n"}
FILE_BOUNDARY = rb"\n(?=\S)"  # cut a whole-file document after a newline that starts a non-blank line
MAX_EXAMPLES = 5  # bad records quoted in the error summary and meta.json


# -- registry ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Remote:
    """One file of a registry corpus: its path under the mirror (and cache), and where to download it."""

    mirror: str
    url: Optional[str] = None
    sha256: Optional[str] = None
    member: Optional[str] = None  # the file inside the zip archive at `url`


@dataclass(frozen=True)
class Corpus:
    description: str
    files: Dict[str, Tuple[Remote, ...]] = field(default_factory=dict)  # split ("all" = apply the split rule)
    hf: Optional[Tuple[str, Optional[str]]] = None  # (dataset, config) read with `datasets` when no local copy
    mirror_dir: Optional[str] = None  # for hf corpora: a local copy (jsonl/parquet/text files) under the mirror
    doc_split: str = "line"
    doc_separator: Optional[str] = None
    split: str = "document"


_GH = "https://raw.githubusercontent.com"
_HF = "https://huggingface.co/datasets"
_WT = "https://wikitext.smerity.com"


def _wikitext(n: str) -> Dict[str, Tuple[Remote, ...]]:
    zip_url, d = f"{_WT}/wikitext-{n}-raw-v1.zip", f"wikitext-{n}-raw"
    return {split: (Remote(f"text/{d}/wiki.{name}.raw", zip_url, member=f"{d}/wiki.{name}.raw"),)
            for split, name in (("train", "train"), ("val", "valid"), ("test", "test"))}


CORPORA: Dict[str, Corpus] = {
    "tiny_shakespeare": Corpus(
        "Tiny Shakespeare (Karpathy's char-rnn), 1.1 MB, one document split 90/10 by characters",
        {"all": (Remote("text/tinyshakespeare/input.txt",
                        f"{_GH}/karpathy/char-rnn/6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e/data/tinyshakespeare/input.txt",
                        "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"),)},
        doc_split="file", split="contiguous"),
    "wikitext2": Corpus("WikiText-2 raw (Merity et al. 2016), 13 MB, its own train/valid/test files",
                        _wikitext("2"), doc_split="file"),
    "wikitext103": Corpus("WikiText-103 raw (Merity et al. 2016), 540 MB, its own train/valid/test files",
                          _wikitext("103"), doc_split="file"),
    "tinystories": Corpus(
        "TinyStories V2 (Eldan & Li 2023), 2.2 GB, stories separated by <|endoftext|>",
        {"train": (Remote("text/tinystories/TinyStoriesV2-GPT4-train.txt",
                          f"{_HF}/roneneldan/TinyStories/resolve/main/TinyStoriesV2-GPT4-train.txt"),),
         "val": (Remote("text/tinystories/TinyStoriesV2-GPT4-valid.txt",
                        f"{_HF}/roneneldan/TinyStories/resolve/main/TinyStoriesV2-GPT4-valid.txt"),)},
        doc_split="regex", doc_separator=r"<\|endoftext\|>"),
    "tinystories_sample": Corpus(
        "The first ~837 TinyStories train stories, 0.9 MB, one story per line (paragraphs inside a story are "
        "separated by a blank line)",
        {"all": (Remote("text/tinystories/tiny_stories_train_slice.txt",
                        f"{_GH}/s-ajaykumar/smallGPT/21cab642054b64d330a43d79c0c73da301c293ba/data/tiny_stories.txt",
                        "c56cfd24fb1c542b141a396184b822a4db3672abdb4c49c6aa843171c5e822a5"),)},
        doc_split="regex", doc_separator=r"(?<!\n)\n(?!\n)"),
    "openwebtext": Corpus("OpenWebText (Gokaslan & Cohen 2019), ~40 GB of web text, via Hugging Face datasets",
                          hf=("Skylion007/openwebtext", None), mirror_dir="openwebtext"),
    "fineweb_edu_sample": Corpus("FineWeb-Edu sample-10BT (Penedo et al. 2024), ~10B GPT-2 tokens, via Hugging Face "
                                 "datasets", hf=("HuggingFaceFW/fineweb-edu", "sample-10BT"),
                                 mirror_dir="fineweb-edu/sample-10BT"),
}


def mirror_dir(configured: Optional[str] = None) -> Optional[Path]:
    """The local mirror: data.mirror if set, else $LM_DATA_MIRROR, else none."""
    value = configured or os.environ.get("LM_DATA_MIRROR")
    return Path(value).expanduser() if value else None


def cache_dir() -> Path:
    return Path(os.environ.get("LM_CACHE", "~/.cache/lm")).expanduser()


# -- resolving sources to files ----------------------------------------------------------------


@dataclass(frozen=True)
class SourceFile:
    """One input: a local file, or a Hugging Face dataset split (path = "hf:<name>[:<config>]")."""

    path: str
    format: str  # text | jsonl | parquet | hf
    split: Optional[str] = None  # the corpus' own split (train/val/test); None = apply the split rule
    hf_split: str = "train"

    @property
    def compression(self) -> Optional[str]:
        return {".gz": "gzip", ".zst": "zstd"}.get(Path(self.path).suffix)

    def stat(self) -> Tuple[int, int]:
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
    return "text"


def _expand(pattern: str, fmt: str, split: Optional[str]) -> List[SourceFile]:
    """A path, directory or glob -> sorted files (hidden files skipped)."""
    path = Path(pattern).expanduser()
    if any(c in pattern for c in "*?["):
        found = sorted(p for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
        if not found:
            raise DataError(f"{pattern}: no file matches this glob; check the pattern (quote it so the shell does "
                            f"not expand it)")
    elif path.is_dir():
        found = sorted(str(p) for p in path.rglob("*") if p.is_file()
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        if not found:
            raise DataError(f"{path}: directory has no files; point the source at the text files")
    elif path.is_file():
        found = [str(path)]
    else:
        raise DataError(f"{pattern}: no such file or directory, and not a registry corpus "
                        f"({', '.join(CORPORA)}) or hf:<dataset>; check the path or see `lm-prepare --list`")
    return [SourceFile(p, detect_format(p, fmt), split) for p in found]


def resolve(sources, fmt: str = "auto", split: Optional[str] = None, mirror: Optional[str] = None,
            hf_split: str = "train") -> Tuple[List[SourceFile], Optional[Corpus]]:
    """Sources (a string or list of strings) -> input files, plus the registry corpus if one was named."""
    if sources is None:
        raise DataError("no source given: pass a registry corpus, file, directory, glob or hf:<dataset> "
                        "(lm-prepare SOURCE ..., or data.source=...)")
    items = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    files: List[SourceFile] = []
    corpus = None
    for item in map(str, items):
        if item in CORPORA:
            corpus = CORPORA[item]
            files += corpus_files(item, mirror, split)
        elif item.startswith("hf:"):
            files.append(SourceFile(item, "hf", split, hf_split))
        else:
            files += _expand(item, fmt, split)
    return files, corpus


def corpus_files(name: str, mirror: Optional[str] = None, only_split: Optional[str] = None) -> List[SourceFile]:
    """The local files of a registry corpus, downloading what neither the mirror nor the cache has."""
    corpus = CORPORA[name]
    root = mirror_dir(mirror)
    if corpus.hf:
        local = root / corpus.mirror_dir if root and corpus.mirror_dir else None
        if local and local.is_dir():
            return _expand(str(local), "auto", only_split)
        dataset, config = corpus.hf
        return [SourceFile(f"hf:{dataset}" + (f":{config}" if config else ""), "hf", only_split)]
    out = []
    for split, remotes in corpus.files.items():
        split = only_split or (None if split == "all" else split)
        out += [SourceFile(str(fetch(r, root)), "text", split) for r in remotes]
    return out


def fetch(remote: Remote, mirror: Optional[Path]) -> Path:
    """The local copy of a registry file: mirror, then cache, then a fresh (atomic) download."""
    if mirror and (mirror / remote.mirror).is_file():
        return mirror / remote.mirror
    cached = cache_dir() / "downloads" / remote.mirror
    if cached.is_file():
        return cached
    where = f"{mirror / remote.mirror}" if mirror else f"$LM_DATA_MIRROR/{remote.mirror}"
    if not remote.url:
        raise DataError(f"{remote.mirror}: not in the mirror and no download location is known; put a copy at {where}")
    try:
        if remote.member:
            archive = cache_dir() / "downloads" / Path(remote.url).name
            if not archive.is_file():
                download(remote.url, archive)
            _extract(archive, remote.member, cached)
        else:
            download(remote.url, cached, remote.sha256)
    except (urllib.error.URLError, OSError, zipfile.BadZipFile) as e:
        reason = getattr(e, "reason", e)
        raise DataError(f"could not download {remote.url} ({reason}). If you are offline, put a copy of the file at "
                        f"{where} (set LM_DATA_MIRROR or data.mirror to the mirror directory), or pass a local file "
                        f"as the source") from None
    return cached


def download(url: str, dest: Path, sha256: Optional[str] = None, timeout: float = 60.0) -> Path:
    """Stream `url` to `dest` under a temporary name; rename only when complete (and checksum-verified)."""
    from tqdm import tqdm

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + f".part{os.getpid()}")
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r, open(tmp, "wb") as f:
            total = int(r.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=f"download {dest.name}") as bar:
                while chunk := r.read(1 << 20):
                    f.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
        if sha256 and digest.hexdigest() != sha256:
            raise DataError(f"{url}: downloaded file has sha256 {digest.hexdigest()}, expected {sha256}; the upstream "
                            f"file changed or the download is corrupt; retry, or put a verified copy in the mirror")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def _extract(archive: Path, member: str, dest: Path) -> None:
    tmp = dest.with_name(dest.name + f".part{os.getpid()}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        with zipfile.ZipFile(archive) as z, z.open(member) as src, open(tmp, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


# -- options shared by planner and workers -----------------------------------------------------


@dataclass(frozen=True)
class ReadOptions:
    """How to read documents; the same for every task of a run (sent once to each worker)."""

    doc_split: str = "line"
    doc_separator: Optional[str] = None
    text_field: str = "text"
    split: str = "document"  # document | contiguous (how to split sources without a split of their own)
    val_fraction: float = 0.01
    split_seed: int = 0
    encoding_errors: str = "strict"  # strict | replace
    bad_records: str = "error"  # error | skip
    task_bytes: int = 1 << 20
    hf_streaming: bool = True

    @property
    def separator(self) -> Optional[str]:
        if self.doc_split == "file":
            return None
        return self.doc_separator if self.doc_split == "regex" else DOC_SEPARATORS[self.doc_split]

    def is_val(self, key: int) -> bool:
        """The split by document: a document goes to val when a hash of it falls below val_fraction."""
        return key < self.val_fraction * 2**32


def doc_hash(data: bytes, seed: int) -> int:
    # Content-addressed, so the split does not depend on order or worker count, and exact duplicates
    # cannot straddle train and val.
    return zlib.crc32(data, seed & 0xFFFFFFFF)


# -- tasks --------------------------------------------------------------------------------------


@dataclass
class Task:
    """A piece of one source for one worker: raw bytes (text/jsonl) or a list of record values."""

    path: str
    format: str
    payload: object  # bytes, or a list of values (parquet column / hf field)
    first_line: int  # 1-based line (or record) number of the payload's first line
    start_byte: int = 0  # offset of the payload in the (decompressed) file
    split: Optional[str] = None  # fixed split, or None: each document's hash decides
    ends_doc: bool = True  # the payload's last document ends here (false before a forced cut)
    raw_bytes: int = 0  # bytes of the source file this task accounts for (progress)


class HashingReader(io.RawIOBase):
    """Reads a file and hashes (and counts) the bytes read, so a source is read exactly once."""

    def __init__(self, path: str):
        self.f = open(path, "rb")
        self.sha256 = hashlib.sha256()
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = self.f.readinto(b)
        self.sha256.update(memoryview(b)[:n])
        self.count += n
        return n

    def close(self) -> None:
        self.f.close()
        super().close()


class ZstdStream:
    """The decompressed bytes of a .zst file (one or more frames), read in bounded pieces.

    zstandard's own stream_reader returns a clean end of stream for a file cut inside a frame,
    which would silently drop the rest of a truncated download; this reader raises instead.
    """

    def __init__(self, raw: HashingReader):
        import zstandard

        self.raw, self._new = raw, zstandard.ZstdDecompressor().decompressobj
        self.obj, self.pending, self.in_frame = self._new(), bytearray(), False

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self.pending) < size:
            chunk = self.raw.read(1 << 20)
            if not chunk:
                if self.in_frame:
                    raise EOFError("the file ends inside a zstd frame")
                break
            self._feed(chunk)
        size = len(self.pending) if size < 0 else size
        out = bytes(self.pending[:size])
        del self.pending[:size]
        return out

    def _feed(self, data: bytes) -> None:
        while data:
            self.in_frame = True
            self.pending += self.obj.decompress(data)
            if not self.obj.eof:
                return
            data, self.obj, self.in_frame = self.obj.unused_data, self._new(), False  # the next frame

    def __enter__(self) -> "ZstdStream":
        return self

    def __exit__(self, *exc) -> None:
        self.raw.close()


def open_stream(src: SourceFile, raw: HashingReader):
    if src.compression == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if src.compression == "zstd":
        return ZstdStream(raw)
    return raw


@contextlib.contextmanager
def reading(src: SourceFile):
    """A truncated or corrupt file -> a DataError that names it and says what to do."""
    errors: tuple = (EOFError, OSError, zlib.error)
    if src.compression == "zstd":
        import zstandard

        errors += (zstandard.ZstdError,)
    try:
        yield
    except errors as e:
        what = f"is not a complete, valid {src.compression} file" if src.compression else "could not be read"
        raise DataError(f"{src.path}: {what} ({type(e).__name__}: {e}); the file is truncated or corrupt: "
                        f"download or compress it again, or leave it out of the sources") from None


def _boundary(opts: ReadOptions, fmt: str) -> re.Pattern:
    if fmt == "jsonl":
        return re.compile(rb"\n")
    sep = opts.separator
    return re.compile(sep.encode() if sep is not None else FILE_BOUNDARY)


def _utf8_cut(buf: bytearray, pos: int) -> int:
    """The first UTF-8 character start at or after pos (never cut inside a multibyte character)."""
    while pos < len(buf) and (buf[pos] & 0xC0) == 0x80:
        pos += 1
    return pos


def _find_cut(buf: bytearray, pattern: re.Pattern, size: int, eof: bool, file_mode: bool) -> Optional[int]:
    if len(buf) <= size:
        return len(buf) if eof else None
    m = pattern.search(buf, size)
    if m and (m.end() < len(buf) or eof):  # a match at the buffer's end may grow (or fail a lookahead)
        return m.end()
    if eof:
        return len(buf)
    if file_mode and len(buf) >= 4 * size:
        return _utf8_cut(buf, size)
    return None


def cut_blocks(stream, pattern: re.Pattern, size: int, file_mode: bool,
               forced_cut: Optional[int] = None) -> Iterator[Tuple[int, bytes, bool, bool]]:
    """Cut a binary stream into (offset, block, forced, last) blocks of about `size` bytes.

    Each block ends at a match of `pattern` (a document boundary), or exactly at `forced_cut` (the
    contiguous split point; then forced=True). Only whole-file documents (file_mode) are cut without
    a boundary, after 4*size bytes without one; any other document is never cut, so a block is at
    most as big as its largest document and memory never grows with the corpus.
    """
    buf, offset, eof = bytearray(), 0, False

    def fill(n: int) -> None:
        nonlocal eof
        while len(buf) < n and not eof:
            chunk = stream.read(1 << 20)
            eof = not chunk
            buf.extend(chunk or b"")

    if forced_cut is not None and forced_cut <= 0:
        yield 0, b"", True, False
        forced_cut = None
    while True:
        fill(size + 65536)
        if not buf:
            return
        cut = _find_cut(buf, pattern, size, eof, file_mode)
        while cut is None:  # a document longer than the buffer: read more before cutting
            fill(2 * len(buf))
            cut = _find_cut(buf, pattern, size, eof, file_mode)
        forced = forced_cut is not None and forced_cut - offset <= cut
        if forced:
            cut, forced_cut = forced_cut - offset, None
        block = bytes(buf[:cut])
        del buf[:cut]
        offset += cut
        fill(1)
        yield offset - cut, block, forced, eof and not buf


class Planner:
    """Reads sources in order and yields tasks; records sizes, checksums and empty files."""

    def __init__(self, files: List[SourceFile], opts: ReadOptions, forced_cut: Optional[Tuple[int, int]] = None):
        self.files, self.opts = files, opts
        self.forced_cut = forced_cut  # (file index, byte offset) of the contiguous split point
        self.sources: List[dict] = []
        self.empty_files: List[str] = []

    def _split_of(self, src: SourceFile, after_cut: bool) -> Optional[str]:
        if src.split:
            return src.split
        if self.opts.split == "contiguous":
            return "val" if after_cut else "train"
        if self.opts.doc_split == "file" and src.format == "text":  # one document per file: its name decides
            return "val" if self.opts.is_val(doc_hash(src.path.encode(), self.opts.split_seed)) else "train"
        return None  # each document's content hash decides (in the worker)

    def __iter__(self) -> Iterator[Task]:
        for index, src in enumerate(self.files):
            record = {"path": src.path, "format": src.format, "split": src.split}
            self.sources.append(record)
            if src.format == "hf":
                yield from self._hf_tasks(src, record)
            elif src.format == "parquet":
                yield from self._parquet_tasks(src, record)
            else:
                yield from self._byte_tasks(index, src, record)

    def _byte_tasks(self, index: int, src: SourceFile, record: dict) -> Iterator[Task]:
        raw = HashingReader(src.path)
        cut = self.forced_cut[1] if self.forced_cut and self.forced_cut[0] == index else None
        after = self.forced_cut is not None and index > self.forced_cut[0]
        file_mode = self.opts.doc_split == "file" and src.format == "text"
        line, seen, n = 1, 0, 0
        with reading(src), open_stream(src, raw) as stream:
            for offset, block, forced, last in cut_blocks(stream, _boundary(self.opts, src.format),
                                                          self.opts.task_bytes, file_mode, cut):
                n += len(block)
                ends = last if file_mode else (last or not forced)
                yield Task(src.path, src.format, block, line, offset, self._split_of(src, after), ends,
                           raw.count - seen)
                seen, line, after = raw.count, line + block.count(b"\n"), after or forced
        record.update(bytes=os.path.getsize(src.path), sha256=raw.sha256.hexdigest())
        if n == 0:
            self.empty_files.append(src.path)

    def _parquet_tasks(self, src: SourceFile, record: dict) -> Iterator[Task]:
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(src.path)
        except Exception as e:
            raise DataError(f"{src.path}: not a readable Parquet file ({e}); check the file or its extension") from None
        column = self.opts.text_field
        if column not in pf.schema_arrow.names:
            raise DataError(f"{src.path}: no column {column!r} (columns: {pf.schema_arrow.names}); set text_field="
                            f"<column> (lm-prepare --text-field COLUMN)")
        size = os.path.getsize(src.path)
        # Record batches, not whole row groups: a writer may put a whole file in one row group.
        values = (v for b in pf.iter_batches(batch_size=1024, columns=[column]) for v in b.column(0).to_pylist())
        n = yield from self._record_tasks(src, values, size / max(pf.metadata.num_rows, 1))
        record.update(bytes=size, sha256=file_sha256(src.path), records=n)
        if n == 0:
            self.empty_files.append(src.path)

    def _hf_tasks(self, src: SourceFile, record: dict) -> Iterator[Task]:
        n = yield from self._record_tasks(src, iter_hf(src, self.opts))
        record.update(bytes=None, sha256=None, records=n, hf_split=src.hf_split)

    def _record_tasks(self, src: SourceFile, values: Iterable[object], bytes_per_record: float = 0.0):
        """Records grouped into tasks of about task_bytes characters; returns how many records there were."""
        batch, chars, first, n = [], 0, 1, 0

        def task() -> Task:
            share = round(n * bytes_per_record) - round((first - 1) * bytes_per_record)  # progress, in file bytes
            return Task(src.path, src.format, batch, first, split=self._split_of(src, False), raw_bytes=share)

        for n, value in enumerate(values, 1):
            batch.append(value)
            chars += len(value) if isinstance(value, str) else 0
            if chars >= self.opts.task_bytes:
                yield task()
                batch, chars, first = [], 0, n + 1
        if batch:
            yield task()
        return n


def iter_hf(src: SourceFile, opts: ReadOptions) -> Iterator[object]:
    """The text field of each record of a Hugging Face dataset split (streamed by default)."""
    spec = src.path[3:]
    name, _, config = spec.partition(":")
    try:
        import datasets
    except ImportError:
        raise DataError(f"{src.path}: reading a Hugging Face dataset needs the `datasets` package: pip install "
                        f"datasets; or put a local copy (jsonl/parquet/text files) under the mirror and pass "
                        f"that directory as the source") from None
    try:
        ds = datasets.load_dataset(name, config or None, split=src.hf_split, streaming=opts.hf_streaming)
    except Exception as e:
        raise DataError(f"{src.path}: could not load split {src.hf_split!r} ({type(e).__name__}: {e}). Offline? "
                        f"Set HF_DATASETS_OFFLINE=1 to use the local Hugging Face cache, or put a local copy under "
                        f"the mirror") from None
    for row in ds:
        yield row.get(opts.text_field) if isinstance(row, dict) else None


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


# -- contiguous split point ---------------------------------------------------------------------


def contiguous_cut(files: List[SourceFile], opts: ReadOptions) -> Optional[Tuple[int, int]]:
    """(file index, byte offset) where the first (1 - val_fraction) of the characters end.

    nanoGPT's split: `data[:int(n * 0.9)]` for train, the rest for val, n counted in characters.
    """
    pool = [(i, f) for i, f in enumerate(files) if f.split is None]
    if not pool:
        return None
    if any(f.format not in ("text", "jsonl") for _, f in pool):
        raise DataError("split=contiguous needs text or jsonl sources; use split=document for parquet/hf sources")
    counts = [(i, f, _count_chars(f)) for i, f in pool]
    target = int(sum(c for _, _, c in counts) * (1.0 - opts.val_fraction))
    for i, f, c in counts:
        if target < c:
            return i, _byte_of_char(f, target)
        target -= c
    return pool[-1][0], os.path.getsize(pool[-1][1].path)


def _char_starts(block: bytes) -> np.ndarray:
    a = np.frombuffer(block, dtype=np.uint8)
    return (a & 0xC0) != 0x80  # a UTF-8 character starts at every byte that is not a continuation byte


def _blocks_of(src: SourceFile) -> Iterator[bytes]:
    raw = HashingReader(src.path)
    with reading(src), open_stream(src, raw) as s:
        first = True
        while chunk := s.read(1 << 22):
            if first and chunk.startswith(codecs.BOM_UTF8):
                chunk = chunk[3:]  # the BOM is not text (read_task drops it too)
            first = False
            yield chunk


def _count_chars(src: SourceFile) -> int:
    return sum(int(_char_starts(b).sum()) for b in _blocks_of(src))


def _byte_of_char(src: SourceFile, char: int) -> int:
    """Byte offset (in the decompressed stream, BOM included) of character number `char`."""
    offset = 3 if _has_bom(src) else 0
    for block in _blocks_of(src):
        starts = np.flatnonzero(_char_starts(block))
        if char < len(starts):
            return offset + int(starts[char])
        char -= len(starts)
        offset += len(block)
    return offset


def _has_bom(src: SourceFile) -> bool:
    raw = HashingReader(src.path)
    with reading(src), open_stream(src, raw) as s:
        return s.read(3) == codecs.BOM_UTF8


# -- workers: task -> documents ----------------------------------------------------------------


@dataclass
class Docs:
    """The documents of one task: texts, whether each one ends (gets EOS), and its split."""

    texts: List[str] = field(default_factory=list)
    ends: List[bool] = field(default_factory=list)
    splits: List[str] = field(default_factory=list)
    bad_records: int = 0
    examples: List[str] = field(default_factory=list)
    invalid_utf8: int = 0
    bytes: int = 0


_INVALID = [0]


def _count_invalid(e: UnicodeDecodeError):
    _INVALID[0] += 1
    return "\ufffd", e.end


codecs.register_error("lm.count", _count_invalid)


class _Reader:
    """Per-task state for read_task: error messages with file and line, bad-record counting."""

    def __init__(self, task: Task, opts: ReadOptions):
        self.task, self.opts, self.out = task, opts, Docs(bytes=task.raw_bytes)

    def where(self, byte: int = 0, line: Optional[int] = None) -> str:
        if line is None:
            line = self.task.first_line + self.task.payload[:byte].count(b"\n")
        unit = "record" if self.task.format in ("parquet", "hf") else "line"
        return f"{self.task.path}:{line}" if unit == "line" else f"{self.task.path}: {unit} {line}"

    def decode(self, data: bytes, line: Optional[int] = None) -> str:
        """UTF-8 text; bad bytes are an error naming file, line and byte, or (replace) counted U+FFFD."""
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            if self.opts.encoding_errors != "replace":
                at = f"byte {e.start} of the line" if line else f"byte {self.task.start_byte + e.start} of the file"
                raise DataError(
                    f"{self.where(e.start, line)}: invalid UTF-8 at {at} ({e.reason}). Convert the file to UTF-8 "
                    f"(e.g. iconv -f latin1 -t utf-8), or set encoding_errors=replace (lm-prepare --encoding-errors "
                    f"replace) to decode bad bytes as U+FFFD and count them") from None
            before = _INVALID[0]
            text = data.decode("utf-8", errors="lm.count")
            self.out.invalid_utf8 += _INVALID[0] - before
            return text

    def bad(self, where: str, problem: str, fix: str) -> None:
        if self.opts.bad_records != "skip":
            raise DataError(f"{where}: {problem}. {fix}, or set bad_records=skip (lm-prepare --bad-records skip) to "
                            f"skip and count such records")
        self.out.bad_records += 1
        if len(self.out.examples) < MAX_EXAMPLES:
            self.out.examples.append(f"{where}: {problem}")

    def add(self, text: str, ends: bool = True) -> None:
        self.add_all([text], ends)

    def add_all(self, texts: List[str], last_ends: bool = True) -> None:
        """Documents in order; each ends (gets EOS) except perhaps the last (cut at a forced split point).

        One pass per task rather than per document: a line-split corpus has ~40k documents per MB.
        """
        if not texts:
            return
        if self.task.split is not None:
            splits = [self.task.split] * len(texts)
        else:
            is_val, seed = self.opts.is_val, self.opts.split_seed
            splits = ["val" if is_val(doc_hash(t.encode("utf-8", "surrogatepass"), seed)) else "train" for t in texts]
        self.out.texts += texts
        self.out.ends += [True] * (len(texts) - 1) + [last_ends]
        self.out.splits += splits


def read_task(task: Task, opts: ReadOptions) -> Docs:
    """Turn one task into documents (runs in a worker process)."""
    r = _Reader(task, opts)
    if task.format == "text":
        _text_docs(r)
    elif task.format == "jsonl":
        _jsonl_docs(r)
    else:
        _value_docs(r)
    return r.out


def _text_docs(r: _Reader) -> None:
    text = r.decode(r.task.payload)
    if r.task.start_byte == 0 and text.startswith("\ufeff"):
        text = text[1:]
    if r.opts.separator is None:
        r.add(text, r.task.ends_doc)  # a piece of a whole-file document
        return
    r.add_all([d for d in re.split(r.opts.separator, text) if d.strip()], r.task.ends_doc)


def _jsonl_docs(r: _Reader) -> None:
    field_name, line = r.opts.text_field, r.task.first_line
    for raw in r.task.payload.split(b"\n"):
        here, line = line, line + 1
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except UnicodeDecodeError:
            record = _loads_or_none(r.decode(raw, line=here))
        except ValueError as e:
            r.bad(r.where(line=here), f"not valid JSON ({e})", "Fix or remove the line")
            continue
        if record is None:
            r.bad(r.where(line=here), "not valid JSON", "Fix or remove the line")
            continue
        value = record.get(field_name) if isinstance(record, dict) else None
        if not isinstance(value, str):
            keys = list(record)[:10] if isinstance(record, dict) else type(record).__name__
            r.bad(r.where(line=here), f"no string field {field_name!r} (has: {keys})",
                  "Set text_field to the field that holds the text (lm-prepare --text-field KEY)")
            continue
        if value:
            r.add(value)


def _loads_or_none(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def _value_docs(r: _Reader) -> None:
    for i, value in enumerate(r.task.payload):
        if not isinstance(value, str):
            r.bad(r.where(line=r.task.first_line + i), f"field {r.opts.text_field!r} is {type(value).__name__}, "
                  f"not text", "Drop such records upstream")
        elif value:
            r.add(value)


def iter_texts(tasks: Iterable[Task], opts: ReadOptions, split: Optional[str] = "train") -> Iterator[str]:
    """Documents of `split` (None = all), read in this process: the stream a tokenizer trains on."""
    for task in tasks:
        docs = read_task(task, opts)
        yield from (t for t, s in zip(docs.texts, docs.splits) if split is None or s == split)
