"""Sources -> tasks: each source read once, in order, and cut at document boundaries into pieces of
about `task_bytes` for the workers (lm/data/documents.py), so memory is bounded by the task size,
never by the corpus; and the contiguous split point (nanoGPT's split by characters).
"""

from __future__ import annotations

import codecs
import os
import re
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from lm.core.files import file_sha256
from lm.data.errors import DataError
from lm.data.readers import HashingReader, iter_hf, open_stream, parquet_values, reading
from lm.data.sources import SourceFile
from lm.data.tables import TABLES, table_values

DOC_SEPARATORS = {"line": r"\r?\n", "blank_line": r"\r?\n[ \t\r]*\n"}  # a CRLF ends a line as LF does
FILE_BOUNDARY = rb"\n(?=\S)"  # cut a whole-file document after a newline that starts a non-blank line


# -- options shared by planner and workers -----------------------------------------------------


@dataclass(frozen=True)
class ReadOptions:
    """How to read documents; the same for every task of a run (sent once to each worker)."""

    doc_split: str = "line"
    doc_separator: str | None = None
    text_field: str = "text"
    split: str = "document"  # document | contiguous (how to split sources without a split of their own)
    val_fraction: float = 0.01
    split_seed: int = 0
    encoding_errors: str = "strict"  # strict | replace
    bad_records: str = "error"  # error | skip
    task_bytes: int = 1 << 20
    max_doc_chars: int = 1 << 20  # longer documents are tokenized in pieces (lm/data/documents.py split_long)
    hf_streaming: bool = True
    dedup: bool = False  # drop exact duplicate documents (lm/data/dedup.py)
    min_doc_chars: int = 0  # drop documents shorter than this (characters, without surrounding whitespace)

    @property
    def separator(self) -> str | None:
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
class SourcePiece:
    """A piece of one source for one worker: raw bytes (text/jsonl) or a list of record values."""

    path: str
    format: str
    payload: object  # bytes, or a list of values (parquet column / hf field)
    first_line: int  # 1-based line (or record) number of the payload's first line
    start_byte: int = 0  # offset of the payload in the (decompressed) file
    split: str | None = None  # fixed split, or None: each document's hash decides
    ends_doc: bool = True  # the payload's last document ends here (false before a forced cut)
    starts_doc: bool = True  # the payload's first document starts here (false after a forced cut)
    raw_bytes: int = 0  # bytes of the source file this task accounts for (progress)


# -- cutting a byte stream at document boundaries ------------------------------------------------


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


def _find_cut(buf: bytearray, pattern: re.Pattern, size: int, eof: bool, file_mode: bool) -> int | None:
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


def cut_blocks(
    stream, pattern: re.Pattern, size: int, file_mode: bool, forced_cut: int | None = None
) -> Iterator[tuple[int, bytes, bool, bool]]:
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


def _refuse_lone_cr(src: SourceFile, head: bytes) -> None:
    """A file whose lines end in a lone CR (classic Mac OS) has no line end doc_split splits at: the whole file was
    one document, silently (or 'the val split is empty: documents per split {'train': 1}')."""
    head = head[: 1 << 16]
    if b"\n" not in head and head.count(b"\r") >= 2:
        raise DataError(
            f"{src.path}: its lines end in a lone CR (classic Mac OS), not LF or CRLF, so it would be one document; "
            f"convert them: tr '\\r' '\\n' < {src.path} > COPY (or doc_split=file, --doc-split file: one document)"
        )


class Planner:
    """Reads sources in order and yields tasks; records sizes, checksums and empty files."""

    def __init__(self, files: list[SourceFile], opts: ReadOptions, forced_cut: tuple[int, int] | None = None):
        self.files, self.opts = files, opts
        self.forced_cut = forced_cut  # (file index, byte offset) of the contiguous split point
        self.sources: list[dict] = []
        self.empty_files: list[str] = []
        self._file_hashes: dict[str, int] = {}

    def _split_of(self, src: SourceFile, after_cut: bool) -> str | None:
        if src.split:
            return src.split
        if self.opts.split == "contiguous":
            return "val" if after_cut else "train"
        if self.opts.doc_split == "file" and src.format == "text":  # one document per file: its content decides
            return "val" if self.opts.is_val(self._file_hash(src)) else "train"
        return None  # each document's content hash decides (in the worker)

    def _file_hash(self, src: SourceFile) -> int:
        """doc_hash of a whole file, streamed (its pieces are read by separate tasks): by content, not by name, so
        that copies of a file under other names (a corpus' duplicates) never land in train and val both."""
        if src.path not in self._file_hashes:  # a file longer than one task: read once more, before its first task
            key = _content_hash(_blocks_of(src, keep_bom=True), self.opts.split_seed)
            self._file_hashes = {src.path: key}  # one file at a time: its tasks are consecutive
        return self._file_hashes[src.path]

    def __iter__(self) -> Iterator[SourcePiece]:
        for index, src in enumerate(self.files):
            record = {"path": src.path, "format": src.format, "split": src.split}
            self.sources.append(record)
            if src.format == "hf":
                yield from self._hf_tasks(src, record)
            elif src.format == "parquet":
                yield from self._parquet_tasks(src, record)
            elif src.format in TABLES:
                yield from self._table_tasks(src, record)
            else:
                yield from self._byte_tasks(index, src, record)

    def _byte_tasks(self, index: int, src: SourceFile, record: dict) -> Iterator[SourcePiece]:
        raw = HashingReader(src.path)
        cut = self.forced_cut[1] if self.forced_cut and self.forced_cut[0] == index else None
        after = self.forced_cut is not None and index > self.forced_cut[0]
        file_mode = self.opts.doc_split == "file" and src.format == "text"
        line, seen, n, starts = 1, 0, 0, True
        with reading(src), open_stream(src, raw) as stream:
            for offset, block, forced, last in cut_blocks(
                stream, _boundary(self.opts, src.format), self.opts.task_bytes, file_mode, cut
            ):
                n += len(block)
                if offset == 0 and src.format == "text" and self.opts.doc_split in DOC_SEPARATORS:
                    _refuse_lone_cr(src, block)
                if file_mode and offset == 0 and last:  # the whole file in one task: hashed here, not read twice
                    self._file_hashes = {src.path: _content_hash([block], self.opts.split_seed)}
                # a JSONL cut is at a record's end (_record_end), so every record is whole on both sides
                ends = last if file_mode else (last or not forced or src.format == "jsonl")
                split = self._split_of(src, after)
                yield SourcePiece(src.path, src.format, block, line, offset, split, ends, starts, raw.count - seen)
                seen, line, after, starts = raw.count, line + block.count(b"\n"), after or forced, ends
        record.update(bytes=os.path.getsize(src.path), sha256=raw.sha256.hexdigest())
        if n == 0:
            self.empty_files.append(src.path)

    def _parquet_tasks(self, src: SourceFile, record: dict) -> Iterator[SourcePiece]:
        values, rows = parquet_values(src.path, self.opts.text_field)
        size = os.path.getsize(src.path)
        n = yield from self._record_tasks(src, values, lambda n: round(n * size / max(rows, 1)))
        record.update(bytes=size, sha256=file_sha256(src.path), records=n)
        if n == 0:
            self.empty_files.append(src.path)

    def _table_tasks(self, src: SourceFile, record: dict) -> Iterator[SourcePiece]:
        raw = HashingReader(src.path)
        with reading(src), open_stream(src, raw) as stream:
            values = table_values(src, stream, self.opts.text_field)
            n = yield from self._record_tasks(src, values, lambda _: raw.count)  # read once: hashed as read
        record.update(bytes=os.path.getsize(src.path), sha256=raw.sha256.hexdigest(), records=n)
        if n == 0:
            self.empty_files.append(src.path)

    def _hf_tasks(self, src: SourceFile, record: dict) -> Iterator[SourcePiece]:
        n = yield from self._record_tasks(src, iter_hf(src, self.opts.text_field, self.opts.hf_streaming))
        record.update(bytes=None, sha256=None, records=n, hf_split=src.hf_split)

    def _record_tasks(self, src: SourceFile, values: Iterable[object], read: Callable[[int], int] = lambda _: 0):
        """Records grouped into tasks of about task_bytes characters; returns how many records there were.
        `read(n)`: the bytes of the file that n records account for (the progress bar's)."""
        batch, chars, first, n, before = [], 0, 1, 0, 0
        for n, value in enumerate(values, 1):
            batch.append(value)
            chars += len(value) if isinstance(value, str) else 0
            if chars >= self.opts.task_bytes:
                yield self._record_task(src, batch, first, read(n) - before)
                batch, chars, first, before = [], 0, n + 1, read(n)
        if batch:
            yield self._record_task(src, batch, first, read(n) - before)
        return n

    def _record_task(self, src: SourceFile, batch: list, first: int, raw_bytes: int) -> SourcePiece:
        return SourcePiece(src.path, src.format, batch, first, split=self._split_of(src, False), raw_bytes=raw_bytes)


# -- contiguous split point ---------------------------------------------------------------------


def contiguous_cut(files: list[SourceFile], opts: ReadOptions) -> tuple[int, int] | None:
    """(file index, byte offset) where the first (1 - val_fraction) of the characters end.

    nanoGPT's split: `data[:int(n * 0.9)]` for train, the rest for val, n counted in characters.
    """
    pool = [(i, f) for i, f in enumerate(files) if f.split is None]
    if not pool:
        return None
    if any(f.format not in ("text", "jsonl") for _, f in pool):
        raise DataError(
            "split=contiguous needs text or jsonl sources; use split=document for parquet, csv, tsv and hf sources"
        )
    counts = [(i, f, _count_chars(f)) for i, f in pool]
    target = int(sum(c for _, _, c in counts) * (1.0 - opts.val_fraction))
    for i, f, c in counts:
        if target < c:
            at = _byte_of_char(f, target)
            return i, _record_end(f, at) if f.format == "jsonl" else at
        target -= c
    return pool[-1][0], os.path.getsize(pool[-1][1].path)


def _record_end(src: SourceFile, byte: int) -> int:
    """The first line start at or after `byte`: a JSON Lines record is one document whatever its length, and a
    cut inside it left two halves that are not JSON (a valid file refused, or a record dropped as bad)."""
    if byte <= 0:
        return 0
    offset = 0
    for block in _blocks_of(src, keep_bom=True):
        if offset + len(block) >= byte:
            newline = block.find(b"\n", max(byte - 1 - offset, 0))
            if newline >= 0:
                return offset + newline + 1
        offset += len(block)
    return offset


def _content_hash(blocks: Iterable[bytes], seed: int) -> int:
    """doc_hash of a whole file given as its bytes (decompressed) in consecutive blocks, one or many: crc32 carries
    on across blocks, so a file read in one task and one read in several hash alike. A leading BOM is not text
    (read_task drops it)."""
    key = seed & 0xFFFFFFFF
    for i, block in enumerate(blocks):
        key = zlib.crc32(block[3:] if i == 0 and block.startswith(codecs.BOM_UTF8) else block, key)
    return key


def _char_starts(block: bytes) -> np.ndarray:
    a = np.frombuffer(block, dtype=np.uint8)
    return (a & 0xC0) != 0x80  # a UTF-8 character starts at every byte that is not a continuation byte


def _blocks_of(src: SourceFile, keep_bom: bool = False) -> Iterator[bytes]:
    raw = HashingReader(src.path)
    with reading(src), open_stream(src, raw) as s:
        first = True
        while chunk := s.read(1 << 22):
            if first and not keep_bom and chunk.startswith(codecs.BOM_UTF8):
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
