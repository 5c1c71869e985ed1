"""CSV and TSV sources: the text of one named column (data.text_field, default "text"), each row a document.

A .csv/.tsv was read as plain text, so its header and delimiters were trained on (SST-2's train.tsv became
`sentence\\tlabel<eos>hide new secretions from the parental units \\t0<eos>...`). A table's text is a column, as a
Parquet file's is: text_field names it, and a header without that column is refused, naming the columns found.

The first row is the header. CSV is RFC 4180's (a quoted field may hold commas, quotes and newlines). TSV has no
quoting: the IANA text/tab-separated-values type allows no tab or newline in a field, so a quote is text (GLUE's
.tsv files hold sentences that start with one, which CSV's quoting would join to the following rows).
"""

from __future__ import annotations

import csv
from collections.abc import Iterator

from lm.data.columns import find_column
from lm.data.errors import DataError
from lm.data.sources import SourceFile

TABLES = ("csv", "tsv")
_DIALECTS = {"csv": {}, "tsv": {"delimiter": "\t", "quoting": csv.QUOTE_NONE}}
# csv's default field limit is 131,072 characters: a longer cell (a whole book) raised "field larger than field
# limit"; memory is bounded by the row as it is for a long line of text (max_doc_chars cuts the tokenizing). The limit
# is the csv module's, process-wide: raised while a table is read, restored after (the GLUE reader keeps its own).
FIELD_LIMIT = 2**31 - 1


def _lines(stream) -> Iterator[str]:
    """The stream's lines, each with its newline (csv needs them to see a quoted newline). Bytes that are not
    UTF-8 pass as surrogate escapes: the worker decodes them as it decodes other formats (documents.py), by
    data.encoding_errors, naming the record."""
    buf = bytearray()
    while chunk := stream.read(1 << 20):
        buf += chunk
        end = buf.rfind(b"\n") + 1
        if end:
            for line in bytes(buf[:end]).split(b"\n")[:-1]:
                yield (line + b"\n").decode("utf-8", "surrogateescape")
            del buf[:end]
    if buf:
        yield buf.decode("utf-8", "surrogateescape")


def table_values(src: SourceFile, stream, column: str) -> Iterator[str | None]:
    """The `column` cell of each row after the header; None for a row too short to have it (a bad record)."""
    rows = csv.reader(_lines(stream), **_DIALECTS[src.format])
    limit = csv.field_size_limit(FIELD_LIMIT)
    try:
        header = next(rows, None)
        if header is None:  # an empty file: no records
            return
        if header and header[0].startswith("\ufeff"):
            header[0] = header[0][1:]  # the byte-order mark is not part of the first column's name
        at = column_at(src, header, column)
        for row in rows:
            if row:  # a blank line is no record
                yield row[at] if at < len(row) else None
    except csv.Error as e:
        raise DataError(f"{src.path}:{rows.line_num}: not a readable {src.format.upper()} row ({e})") from None
    finally:
        csv.field_size_limit(limit)


def column_at(src: SourceFile, header: list[str], column: str) -> int:
    """The position of `column` in the header. A spreadsheet's header often says "Text" or "text " (a trailing
    space): when no name is `column` exactly, one and only one that is the same but for case and surrounding
    whitespace is taken, as meaning it unambiguously. Else a refusal naming the columns found (and what a
    UTF-16 file or a semicolon-delimited CSV looks like, whose header is otherwise shown as garbage or as one
    column)."""
    at = find_column(header, column)
    if at is not None:
        return at
    raise DataError(f"{src.path}: {_header_problem(src, header, column)}")


def _header_problem(src: SourceFile, header: list[str], column: str) -> str:
    if header and header[0][:2] in ("\udcff\udcfe", "\udcfe\udcff"):  # a UTF-16 byte-order mark, undecoded
        return f"the file is UTF-16 text (its byte-order mark): convert it, iconv -f utf-16 -t utf-8 {src.path} > COPY"
    found = f"no column {column!r} in its header row (columns: {header[:20]})"
    if src.format == "csv" and len(header) == 1 and ";" in header[0]:
        return (
            f"{found}: it is delimited by semicolons, as a spreadsheet in a comma-decimal locale saves CSV; save it "
            f"with commas (or as .tsv, tab-separated), or set data.format=text (--format text) to read its lines"
        )
    return (
        f"{found}; set data.text_field=<the column that holds the text> (lm prepare --text-field COLUMN), or "
        f"data.format=text (--format text) to read every line as it is"
    )
