"""Opening each input format as a stream: raw bytes hashed as read, gzip, zstd, Parquet columns,
Hugging Face datasets; a truncated or corrupt file becomes a DataError that names it.

zstandard, pyarrow and datasets come with the `data` extra (pip install 'lm[data]').
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import os
import zlib
from collections.abc import Iterator

from lm.data.errors import DataError
from lm.data.sources import SourceFile
from lm.extras import MissingExtra, missing, require


def _require(what: str, module: str):
    """An optional reader's module, or a DataError that says which extra installs it."""
    try:
        return require("data", what, module)
    except MissingExtra as e:
        raise DataError(str(e)) from None


class HashingReader(io.RawIOBase):
    """Reads a file and hashes (and counts) the bytes read, so a source is read exactly once."""

    def __init__(self, path: str):
        self.f = open(path, "rb")  # noqa: SIM115 - the reader owns it; close() closes it
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


ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"  # RFC 8878, 3.1.1: every zstd frame starts with 0xFD2FB528 (little-endian)


class ZstdStream:
    """The decompressed bytes of a .zst file (one or more frames), read in bounded pieces.

    zstandard's own stream_reader returns a clean end of stream for a file cut inside a frame,
    which would silently drop the rest of a truncated download; this reader raises instead.
    """

    def __init__(self, raw: HashingReader):
        zstandard = _require(f"{raw.f.name}: reading .zst files", "zstandard")

        self.raw, self._new = raw, zstandard.ZstdDecompressor().decompressobj
        self.obj, self.pending, self.in_frame = self._new(), bytearray(), False

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self.pending) < size:
            first = self.raw.count == 0
            chunk = self.raw.read(1 << 20)
            if not chunk:
                if self.in_frame:
                    raise EOFError(f"the file ends inside a zstd frame, at compressed byte {self.raw.count}")
                break
            if first:
                self._check_magic(chunk)
            self._feed(chunk)
        size = len(self.pending) if size < 0 else size
        out = bytes(self.pending[:size])
        del self.pending[:size]
        return out

    def _check_magic(self, head: bytes) -> None:
        """A file that does not start with a zstd frame is not zstd at all (a plain file named .zst, say):
        say so, rather than zstandard's 'unknown frame descriptor'."""
        if head[:4] == ZSTD_MAGIC or (len(head) >= 4 and head[1:4] == b"\x2a\x4d\x18" and head[0] & 0xF0 == 0x50):
            return  # a zstd frame, or a skippable frame (magic 0x184D2A5?)
        raise DataError(
            f"{self.raw.f.name}: not a zstd file (its first bytes {head[:4].hex(' ')} are not the zstd "
            f"magic number 28 b5 2f fd); if it holds plain text, rename it without the .zst suffix, else "
            f"compress it with `zstd` or leave it out of the sources"
        )

    def _feed(self, data: bytes) -> None:
        while data:
            self.in_frame = True
            self.pending += self.obj.decompress(data)
            if not self.obj.eof:
                return
            data, self.obj, self.in_frame = self.obj.unused_data, self._new(), False  # the next frame

    def __enter__(self) -> ZstdStream:
        return self

    def __exit__(self, *exc) -> None:
        self.raw.close()


# Binary formats lm prepare does not read, by their leading bytes; each was read as text: an invalid UTF-8 error
# whose fix (iconv) was wrong, or with --encoding-errors replace, compressed bytes trained on.
_FOREIGN = (
    (b"BZh", "a bzip2 file", "decompress it (bunzip2) or recompress it as .gz or .zst"),  # + level, block magic
    (b"\xfd7zXZ\x00", "an xz file", "decompress it (unxz) or recompress it as .gz or .zst"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive", "extract it (7z x) and pass the directory of its files"),
    (b"PK\x03\x04", "a zip archive", "extract it (unzip) and pass the directory of its files"),
    (b"PAR1", "a Parquet file", "name it *.parquet, or pass --format parquet (data.format=parquet)"),
    (b"\x1f\x8b", "gzip-compressed", "name it *.gz so that it is decompressed"),
    (ZSTD_MAGIC, "zstd-compressed", "name it *.zst so that it is decompressed"),
)
TAR_MAGIC = (257, b"ustar")  # POSIX and GNU tar headers hold "ustar" at byte 257 (the first file's name is before)


def check_text_bytes(src: SourceFile) -> None:
    """Refuse an input whose bytes are an archive or a compression this reader would take for text."""
    kind = {"text": "plain text", "jsonl": "JSON Lines"}.get(src.format, src.format.upper())
    with open(src.path, "rb") as f:
        head = f.read(512)
    if src.compression is None:
        for magic, what, fix in _FOREIGN:
            if head.startswith(magic) and _really(magic, head, src.path):
                raise DataError(f"{src.path}: {what}, not {kind}; {fix}")
    else:
        raw = HashingReader(src.path)
        with contextlib.closing(raw), open_stream(src, raw, check=False) as s:
            head = s.read(512)
    at, magic = TAR_MAGIC
    if head[at : at + len(magic)] == magic:
        raise DataError(
            f"{src.path}: a tar archive, not {kind} (its file headers would be read as text); extract "
            f"it (tar xf {src.path}) and pass the directory of its files as the source"
        )


def _really(magic: bytes, head: bytes, path) -> bool:
    """The two magics a text could begin with ("BZh...", "PAR1..."), checked further: bzip2's level digit and block
    magic (0x314159265359, pi), and Parquet's closing "PAR1"."""
    if magic == b"BZh":
        return head[3:4].isdigit() and head[4:10] == bytes.fromhex("314159265359")
    if magic == b"PAR1":
        with open(path, "rb") as f:
            f.seek(max(os.path.getsize(path) - 4, 0))
            return f.read() == b"PAR1"
    return True


def open_stream(src: SourceFile, raw: HashingReader, check: bool = True):
    """The decompressed bytes of a text or JSONL source; `check` first refuses what is not such a file."""
    if check:
        check_text_bytes(src)
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
        errors += (_require(f"{src.path}: reading .zst files", "zstandard").ZstdError,)
    try:
        yield
    except errors as e:
        what = f"is not a complete, valid {src.compression} file" if src.compression else "could not be read"
        raise DataError(
            f"{src.path}: {what} ({type(e).__name__}: {e}); the file is truncated or corrupt: "
            f"download or compress it again, or leave it out of the sources"
        ) from None


def parquet_values(path: str, column: str) -> tuple[Iterator[object], int]:
    """The values of one column of a Parquet file, in order, and the number of rows."""
    pq = _require(f"{path}: reading Parquet", "pyarrow.parquet")
    try:
        pf = pq.ParquetFile(path)
    except Exception as e:
        raise DataError(f"{path}: not a readable Parquet file ({e}); check the file or its extension") from None
    if column not in pf.schema_arrow.names:
        raise DataError(
            f"{path}: no column {column!r} (columns: {pf.schema_arrow.names}); set data.text_field="
            f"<column> (lm prepare --text-field COLUMN)"
        )
    # Record batches, not whole row groups: a writer may put a whole file in one row group.
    values = (v for b in pf.iter_batches(batch_size=1024, columns=[column]) for v in b.column(0).to_pylist())
    return values, pf.metadata.num_rows


def iter_hf(src: SourceFile, text_field: str, streaming: bool) -> Iterator[object]:
    """The text field of each record of a Hugging Face dataset split (streamed or downloaded whole)."""
    spec = src.path[3:]
    name, _, config = spec.partition(":")
    if missing("data", ["datasets"]):
        raise DataError(
            f"{src.path}: reading a Hugging Face dataset needs the `datasets` package: pip install "
            f"'lm[data]'; or put a local copy (jsonl/parquet/text files) under the mirror and pass "
            f"that directory as the source"
        )
    import datasets

    try:
        ds = datasets.load_dataset(name, config or None, split=src.hf_split, streaming=streaming)
    except Exception as e:
        raise DataError(
            f"{src.path}: could not load split {src.hf_split!r} ({type(e).__name__}: {e}). Offline? "
            f"Set HF_DATASETS_OFFLINE=1 to use the local Hugging Face cache, or put a local copy under "
            f"the mirror"
        ) from None
    for row in ds:
        yield row.get(text_field) if isinstance(row, dict) else None
