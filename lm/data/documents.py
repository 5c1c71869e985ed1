"""SourcePiece -> documents (runs in the worker processes): decode UTF-8, split documents, extract JSON
fields, assign each document to train or val, count or reject bad records.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from lm.data.errors import DataError
from lm.data.tables import TABLES
from lm.data.tasks import ReadOptions, SourcePiece, doc_hash

MAX_EXAMPLES = 5  # bad records quoted in the error summary and meta.json


@dataclass
class Docs:
    """The documents of one task: texts, whether each one ends (gets EOS), and its split."""

    texts: list[str] = field(default_factory=list)
    ends: list[bool] = field(default_factory=list)
    splits: list[str] = field(default_factory=list)
    bad_records: int = 0
    examples: list[str] = field(default_factory=list)
    invalid_utf8: int = 0
    bytes: int = 0
    split_docs: int = 0  # documents longer than max_doc_chars, tokenized in pieces
    keys: list[int] = field(default_factory=list)  # per piece: its document's doc_key, 0 = not deduplicated
    short_docs: int = 0  # dropped: shorter than min_doc_chars


_INVALID = [0]
_SURROGATE = re.compile("[\ud800-\udfff]")


def _count_invalid(e: UnicodeDecodeError):
    _INVALID[0] += 1
    return "\ufffd", e.end


codecs.register_error("lm.count", _count_invalid)


class _Reader:
    """Per-task state for read_task: error messages with file and line, bad-record counting."""

    def __init__(self, task: SourcePiece, opts: ReadOptions):
        self.task, self.opts, self.out = task, opts, Docs(bytes=task.raw_bytes)

    def where(self, byte: int = 0, line: int | None = None) -> str:
        if line is None:
            line = self.task.first_line + self.task.payload[:byte].count(b"\n")
        unit = "record" if self.task.format in ("parquet", "hf", *TABLES) else "line"
        return f"{self.task.path}:{line}" if unit == "line" else f"{self.task.path}: {unit} {line}"

    def decode(self, data: bytes, line: int | None = None) -> str:
        """UTF-8 text; bad bytes are an error naming file, line and byte, or (replace) counted U+FFFD."""
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            if self.opts.encoding_errors != "replace":
                unit = "record" if self.task.format in TABLES else "line"
                at = f"byte {e.start} of the {unit}" if line else f"byte {self.task.start_byte + e.start} of the file"
                raise DataError(
                    f"{self.where(e.start, line)}: invalid UTF-8 at {at} ({e.reason}). {self._fix(data)}"
                ) from None
            before = _INVALID[0]
            text = data.decode("utf-8", errors="lm.count")
            self.out.invalid_utf8 += _INVALID[0] - before
            return text

    def _fix(self, data: bytes) -> str:
        """What to do about bytes that are not UTF-8, by what they look like: iconv from latin1 was the one fix
        named, also for a UTF-16 file or an image in a source directory, whose U+FFFD "replace" is no text."""
        if self.task.start_byte == 0 and data[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE):
            path = self.task.path
            return f"The file is UTF-16 text (its byte-order mark): convert it, iconv -f utf-16 -t utf-8 {path} > COPY"
        if b"\x00" in data:
            return (
                "The file holds NUL bytes: it is binary (an image, an archive, token shards), not text; leave it out "
                "of the sources (a glob such as 'DIR/*.txt' picks the text files of a directory)"
            )
        return (
            "Convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8), or set encoding_errors=replace (lm prepare "
            "--encoding-errors replace) to decode bad bytes as U+FFFD and count them"
        )

    def surrogates(self, text: str, line: int) -> str:
        """A JSON string with a lone surrogate escape ("\\ud800", half of a pair) is not text UTF-8 can hold
        (the tokenizer cannot encode it): an error naming file and line, or (replace) counted U+FFFD."""
        if not _SURROGATE.search(text):
            return text
        if self.opts.encoding_errors != "replace":
            raise DataError(
                f"{self.where(line=line)}: the text holds a lone UTF-16 surrogate escape "
                f"({_SURROGATE.search(text).group().encode('unicode_escape').decode()}, half of a pair), which is "
                f"not Unicode text. Fix the record upstream, or set encoding_errors=replace (lm prepare "
                f"--encoding-errors replace) to read such escapes as U+FFFD and count them"
            )
        text, n = _SURROGATE.subn("\ufffd", text)
        self.out.invalid_utf8 += n
        return text

    def bad(self, where: str, problem: str, fix: str) -> None:
        if self.opts.bad_records != "skip":
            raise DataError(
                f"{where}: {problem}. {fix}, or set bad_records=skip (lm prepare --bad-records skip) to "
                f"skip and count such records"
            )
        self.out.bad_records += 1
        if len(self.out.examples) < MAX_EXAMPLES:
            self.out.examples.append(f"{where}: {problem}")

    def add(self, text: str, ends: bool = True) -> None:
        self.add_all([text], ends)

    def add_all(self, texts: list[str], last_ends: bool = True) -> None:
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
        ends = [True] * (len(texts) - 1) + [last_ends]
        limit, dedup, shortest = self.opts.max_doc_chars, self.opts.dedup, self.opts.min_doc_chars
        for i, (text, end, split) in enumerate(zip(texts, ends, splits)):  # the whole document decided the split
            whole = end and (i > 0 or self.task.starts_doc)  # not a piece cut by a forced split or a task
            if shortest and whole and len(text.strip()) < shortest:
                self.out.short_docs += 1
                continue
            pieces = split_long(text, limit) if len(text) > limit else [text]
            self.out.split_docs += len(pieces) > 1
            self.out.texts += pieces
            self.out.ends += [False] * (len(pieces) - 1) + [end]  # EOS only after the document's last piece
            self.out.splits += [split] * len(pieces)
            self.out.keys += [doc_key(text) if dedup and whole else 0] * len(pieces)


def doc_key(text: str) -> int:
    """A document's identity for deduplication: a 64-bit BLAKE2b of its text with runs of whitespace made
    one space (so re-wrapped or re-indented copies count as the same), never 0 (0 = no key)."""
    digest = hashlib.blake2b(" ".join(text.split()).encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little") | 1


# Where to cut, best first: before a space in front of a word (byte-level BPE and Metaspace both start
# a pre-token there, so the tokens are those of the whole text), else before any whitespace in front of one.
_CUTS = (re.compile(r" (?=\S)"), re.compile(r"\s(?=\S)"))


def split_long(text: str, limit: int) -> list[str]:
    """`text` in pieces of at most `limit` characters, each cut before the last space (else whitespace)
    in front of a word in the piece's last quarter; exactly at `limit` when there is none (a giant word).

    Tokenizing one string costs ~200-300 bytes of memory per character (the tokenizers library's
    per-token bookkeeping), so a 50 MB line needed 15 GB; pieces bound that by `limit`.
    """
    pieces, start = [], 0
    while len(text) - start > limit:
        end = start + limit
        cut = end
        for pattern in _CUTS:
            found = [m.start() for m in pattern.finditer(text, end - limit // 4, end)]
            if found and found[-1] > start:
                cut = found[-1]
                break
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces


def read_task(task: SourcePiece, opts: ReadOptions) -> Docs:
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
            fix = _NOT_JSONL if raw.strip() in (b"[", b"{") else "Fix or remove the line"
            r.bad(r.where(line=here), f"not valid JSON ({e})", fix)
            continue
        if record is None:
            r.bad(r.where(line=here), "not valid JSON", "Fix or remove the line")
            continue
        if not isinstance(record, dict):
            r.bad(r.where(line=here), f"a JSON {_json_kind(record)}, not an object", _NOT_JSONL)
            continue
        value = record.get(field_name)
        if field_name in record and not isinstance(value, str):
            r.bad(
                r.where(line=here),
                f"field {field_name!r} is a JSON {_json_kind(value)}, not a string",
                "Make it a string upstream (join a list of strings), or set data.text_field to the field that "
                "holds the text (lm prepare --text-field KEY)",
            )
            continue
        if value is None:
            problem = f"no string field {field_name!r} (has: {list(record)[:10]})"
            r.bad(r.where(line=here), problem, _field_fix(record, field_name))
            continue
        if value:
            r.add(r.surrogates(value, here))


# A .json file that holds one JSON array (or one pretty-printed object) is not JSON Lines.
_NOT_JSONL = (
    "JSON Lines needs one JSON object per line, each with the text field; a file holding one JSON array "
    "converts with jq -c '.[]' FILE > FILE.jsonl"
)


def _field_fix(record: dict, field_name: str) -> str:
    """text_field names a top-level key; text nested in an object ({"doc": {"text": ...}}) is not looked into,
    and `--text-field doc.text` is read as a key of that name: say how to lift it, with jq."""
    fix = "Set text_field to the field that holds the text (lm prepare --text-field KEY)"
    nested = [k for k, v in record.items() if isinstance(v, dict) and any(isinstance(x, str) for x in v.values())]
    if nested:
        k = nested[0]
        strings = [n for n, x in record[k].items() if isinstance(x, str)]
        wanted = [n for n in (field_name.rsplit(".", 1)[-1], "text") if n in strings]
        inner = (wanted or strings)[0]  # the key the user named, else "text", else the first string
        fix += (
            f"; a field nested in an object ({k!r} holds {inner!r}) is not read: lift it to the top, "
            f"jq -c '{{text: .{k}.{inner}}}' FILE > FLAT.jsonl"
        )
    return fix


def _json_kind(value) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null", dict: "object"}.get(
        type(value), "number"
    )


def _loads_or_none(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def _value_docs(r: _Reader) -> None:
    table = r.task.format in TABLES
    for i, value in enumerate(r.task.payload):
        if value is None and table:
            r.bad(r.where(line=r.task.first_line + i), f"the row has no {r.opts.text_field!r} column", "Fix the row")
        elif not isinstance(value, str):
            r.bad(
                r.where(line=r.task.first_line + i),
                f"field {r.opts.text_field!r} is {type(value).__name__}, not text",
                "Drop such records upstream",
            )
        elif value and table and _SURROGATE.search(value):  # bytes that were not UTF-8 (tables.py's _lines)
            r.add(r.decode(value.encode("utf-8", "surrogateescape"), r.task.first_line + i))
        elif value:
            r.add(r.surrogates(value, r.task.first_line + i))


def iter_texts(tasks: Iterable[SourcePiece], opts: ReadOptions, split: str | None = "train") -> Iterator[str]:
    """Documents of `split` (None = all), read in this process: the stream a tokenizer trains on, without
    the duplicates that lm prepare drops (opts.dedup)."""
    seen: set[int] = set()
    for task in tasks:
        docs = read_task(task, opts)
        drop = False
        for i, (text, s, key) in enumerate(zip(docs.texts, docs.splits, docs.keys)):
            if key and (i == 0 or docs.ends[i - 1]):  # a document's first piece decides for all of its pieces
                drop = key in seen
                seen.add(key)
            if not (drop and key) and (split is None or s == split):
                yield text
