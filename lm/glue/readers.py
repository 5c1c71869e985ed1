"""Read GLUE splits from the official TSV layout, or from the Hugging Face copy when none is local.

Layout (what download_glue_data.py writes): `<root>/<GlueTaskSpec.dir>/<split file>`, e.g.
`glue_data/MNLI/dev_matched.tsv`, `glue_data/diagnostic/diagnostic.tsv`. Files are read with
`csv` (tab, QUOTE_NONE: GLUE text holds unbalanced quotes, so quoting would merge lines) as
UTF-8 with an optional BOM (MRPC's headers start with one). A file that is not UTF-8 (UTF-16, binary,
one bad byte), has lone CR line ends (classic Mac OS) or a line longer than MAX_LINE_BYTES is refused naming the
file and the line; a line is never read into memory beyond that bound. CoLA's train/dev files have no
header; every other file names its columns in the first line, and columns are found by name,
so MNLI's dev files (16 columns) and train file (12) need no special case. A file edited in a spreadsheet is
read as meant: a column named in another case or with spaces around (`Label `, when no other is), a label with
spaces around (`1 `), CRLF line ends.

The root defaults to $LM_DATA_MIRROR/glue_data, else ./glue_data (download_glue_data.py's default).
"""

from __future__ import annotations

import codecs
import csv
import functools
import math
import os
from pathlib import Path
from typing import NamedTuple

from lm.data.columns import find_column
from lm.glue.tasks import DOWNLOAD_HINT, HF_DATASET, GlueTaskSpec, get_eval, get_task

MAX_LINE_BYTES = 1 << 20  # far above any GLUE example (the longest are a few kB); a longer line is not GLUE text


class Example(NamedTuple):
    """One row. `label` is the class id (index into GlueTaskSpec.labels), a float for STS-B, None on test."""

    index: int  # the file's id column (what submissions are keyed by), else the 0-based row number
    text_a: str
    text_b: str | None
    label: int | float | None


class GlueDataError(ValueError):
    """A GLUE file is malformed; the message names the file, the line and the fix."""


class GlueDataMissing(GlueDataError, FileNotFoundError):
    """A GLUE file is not where it was looked for; the message names the path and how to get it."""


def data_root(root: str | os.PathLike | None = None) -> Path:
    if root is not None:
        return Path(root).expanduser()
    mirror = os.environ.get("LM_DATA_MIRROR")
    return Path(mirror).expanduser() / "glue_data" if mirror else Path("glue_data")


def split_path(task: str, split: str, root=None) -> Path:
    t = get_task(task)
    if split not in t.files:
        raise KeyError(f"GLUE {t.dir} has no split {split!r}; its splits are {list(t.files)}")
    return data_root(root) / t.dir / t.files[split]


def load_split(task: str, split: str, root=None, hf: bool = True, limit: int | None = None) -> list[Example]:
    """The examples of one split (its first `limit` only, read no further, when given). The local TSV wins; `hf`
    allows the Hugging Face copy when it is absent."""
    t = get_task(task)
    if t.reader is not None:  # task=own, registered for its job: the user's files (lm/glue/own.py)
        return t.reader(t, split)[:limit]
    path = split_path(t.name, split, root)
    if path.is_file():
        return read_tsv(path, t, split, limit)
    where = f"GLUE {t.dir} {split} split not found: looked for {path}"
    if not hf:
        raise GlueDataMissing(f"{where}; {DOWNLOAD_HINT}")
    return load_hf(t, split, where)[:limit]


def load_eval(name: str, kind: str, root=None, hf: bool = True) -> list[Example]:
    """The dev or test split of one leaderboard column: load_eval("mnli_mm", "dev") is MNLI's dev_mismatched."""
    e = get_eval(name)
    if kind not in ("dev", "test"):
        raise ValueError(f"kind={kind!r} must be 'dev' or 'test'")
    split = e.dev if kind == "dev" else e.test
    if split is None:
        raise GlueDataMissing(
            f"GLUE {e.submission} has no public labelled split; only its test split can be "
            f"predicted (and scored by the leaderboard)"
        )
    return load_split(e.task, split, root, hf)


# -- TSV -------------------------------------------------------------------------------------------


def read_tsv(path: str | os.PathLike, task: str | GlueTaskSpec, split: str, limit: int | None = None) -> list[Example]:
    t = get_task(task) if isinstance(task, str) else task
    labelled = not split.startswith("test")
    with open(path, "rb") as f:
        rows = csv.reader(_text_lines(path, f), delimiter="\t", quoting=csv.QUOTE_NONE)
        header = list(t.headerless) if (t.headerless and labelled) else _next_row(path, rows)
        if header is None:
            raise GlueDataError(f"{path}: the file is empty; expected a header line, then one example per line")
        col = _columns(path, t, header, labelled)
        out, blank = [], None  # blank: the first blank line, refused only if an example follows it
        while (limit is None or len(out) < limit) and (row := _next_row(path, rows)) is not None:
            if not row:  # blank lines at the end (an editor's, a concatenation's) are no rows: skipped
                blank = blank or (rows.line_num, row)
                continue
            for line, bad in ([blank] if blank else []) + [(rows.line_num, row)]:
                if len(bad) != len(header):
                    raise GlueDataError(
                        f"{path}:{line}: expected {len(header)} tab-separated columns ({', '.join(header)}), "
                        f"found {len(bad)}; a stray tab or newline inside the text splits it"
                        + ("; QQP's original release has such rows: use QQP-clean.zip" if t.name == "qqp" else "")
                    )
            out.append(_example(path, rows.line_num, t, row, col, len(out)))
    if not out:  # caught here, not after an epoch (an empty dev split) or without the path (an empty train split)
        raise GlueDataError(
            f"{path}: the file has no examples"
            + ("" if t.headerless and labelled else " after its header line")
            + f"; restore the {t.dir} {split} file of the official "
            f"GLUE layout (download_glue_data.py)"
        )
    return out


def _text_lines(path, f, restore: str = ", or restore the official GLUE file"):
    """The lines of binary file `f` as str, each checked: UTF-8 (a leading BOM dropped), no NUL byte, at most
    MAX_LINE_BYTES long (read no further than that). Errors name the file and the line; `restore` ends a fix
    (task=own's files are the user's: "")."""
    n = 0
    while raw := f.readline(MAX_LINE_BYTES + 1):
        n += 1
        if b"\r" in raw.rstrip(b"\r\n"):  # before the length: a file of CR line ends is one long line
            raise GlueDataError(
                f"{path}:{n}: a carriage return (CR) inside the line: the file's lines end in a lone CR (classic "
                f"Mac OS), which csv reads as no line end; convert them: tr '\\r' '\\n' < {path} > COPY"
            )
        if len(raw) > MAX_LINE_BYTES:
            raise GlueDataError(
                f"{path}:{n}: the line is longer than {MAX_LINE_BYTES:,} bytes, which no GLUE example "
                f"is" + (f"; {restore.removeprefix(', or ')} (download_glue_data.py)" if restore else "")
            )
        if n == 1 and raw.startswith(codecs.BOM_UTF8):
            raw = raw[len(codecs.BOM_UTF8) :]
        if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) or b"\x00" in raw:
            raise GlueDataError(
                f"{path}:{n}: the file is UTF-16 or binary, not UTF-8 text; save it as UTF-8 "
                f"(e.g. iconv -f UTF-16 -t UTF-8){restore}"
            )
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise GlueDataError(
                f"{path}:{n}: not UTF-8 text (byte {raw[e.start : e.start + 1]!r} at byte {e.start + 1} "
                f"of the line); save the file as UTF-8{restore}"
            ) from None


GLUE_FIELD_LIMIT = 131_072  # csv's default field limit: no GLUE sentence comes near it


def _next_row(path, rows) -> list[str] | None:
    try:
        row = next(rows, None)
    except csv.Error as e:  # a field over csv.field_size_limit() (the only csv.Error QUOTE_NONE leaves to a line
        row, error = None, str(e)  # _text_lines passed)
    else:  # checked here too: the limit is process-wide, and another reader may have raised it (lm.data.tables)
        long = row is not None and any(len(cell) > GLUE_FIELD_LIMIT for cell in row)
        error = f"field larger than field limit ({GLUE_FIELD_LIMIT})" if long else None
    if error:
        raise GlueDataError(
            f"{path}:{rows.line_num}: {error}; no GLUE example is that long: restore the official GLUE file"
        )
    return row


def _columns(path, t: GlueTaskSpec, header: list[str], labelled: bool) -> dict:
    """Column positions by name; a missing one is reported with the header that was found."""
    wanted = {"text_a": t.text_a, "text_b": t.text_b, "label": t.label if labelled else None, "index": t.index}
    col = {}
    for role, name in wanted.items():
        if name is None:
            continue
        at = find_column(header, name)  # "Label", "label " (a file edited in a spreadsheet): unambiguously that column
        if at is not None:
            col[role] = at
        elif role != "index":
            raise GlueDataError(
                f"{path}:1: no column {name!r} in the header {header}; is this the {t.dir} file "
                f"of the official GLUE layout?"
            )
    return col


def _example(path, line: int, t: GlueTaskSpec, row: list[str], col: dict, row_number: int) -> Example:
    index = row_number
    if "index" in col:
        try:
            index = int(row[col["index"]])
        except ValueError:
            raise GlueDataError(
                f"{path}:{line}: id column {t.index!r} holds {row[col['index']]!r}, not an integer"
            ) from None
    text_b = row[col["text_b"]] if "text_b" in col else None
    label = parse_label(t, row[col["label"]], f"{path}:{line}") if "label" in col else None
    return Example(index, row[col["text_a"]], text_b, label)


def parse_label(t: GlueTaskSpec, value: str, where: str) -> int | float:
    if t.is_regression:
        try:
            score = float(value)
        except ValueError:
            score = math.nan
        if not 0.0 <= score <= 5.0:  # also rejects nan
            raise GlueDataError(f"{where}: {t.dir} score {value!r} is not a number in [0, 5]")
        return score
    if value.strip() not in t.labels:  # "1 " is 1: a spreadsheet's trailing space is no other class
        raise GlueDataError(f"{where}: {t.dir} label {value!r} is not one of {list(t.labels)}")
    return t.labels.index(value.strip())


# -- Hugging Face ------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def hub_unreachable() -> str | None:
    """Why the Hugging Face hub cannot be reached (one quick TCP connect), or None: reachable, behind a
    proxy (not probed), or offline mode set (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE: `datasets` then reads
    its cache without trying the network)."""
    import socket
    from urllib.parse import urlparse

    env = {k: os.environ.get(k, "").lower() for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    if any(v in ("1", "true", "yes", "on") for v in env.values()):
        return None
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=3).close()
    except OSError as e:
        return f"the Hugging Face hub ({host}) is not reachable ({e.strerror or e})"
    return None


def load_hf(t: GlueTaskSpec, split: str, where: str) -> list[Example]:
    """The split from the Hugging Face hub (or its local cache); used only when no local file exists."""
    unreachable = hub_unreachable()
    if unreachable:  # fail now: the hub client would retry for half a minute before failing the same way
        raise GlueDataMissing(f"{where}, and {unreachable}; {DOWNLOAD_HINT}")
    try:
        import datasets
    except ImportError:
        raise GlueDataMissing(f"{where}; {DOWNLOAD_HINT} (the `datasets` package is not installed)") from None
    hf_split = split.replace("dev", "validation")
    try:
        rows = datasets.load_dataset(HF_DATASET, t.name, split=hf_split)
    except Exception as e:  # offline, hub down, cache miss: all end the same way for the user
        raise GlueDataMissing(
            f"{where}, and the Hugging Face copy {HF_DATASET}/{t.name}:{hf_split} failed "
            f"({type(e).__name__}: {e}); {DOWNLOAD_HINT}"
        ) from e
    a, b = t.hf_text
    out = []
    for n, r in enumerate(rows):
        label = None if split.startswith("test") else r["label"]
        if label is not None and not t.is_regression and not 0 <= label < t.n_labels:
            raise GlueDataError(
                f"{HF_DATASET}/{t.name}:{hf_split} row {n}: label {label} is not a class id in [0, {t.n_labels})"
            )
        out.append(
            Example(
                int(r.get("idx", n)),
                r[a],
                r[b] if b else None,
                float(label) if (label is not None and t.is_regression) else label,
            )
        )
    return out
