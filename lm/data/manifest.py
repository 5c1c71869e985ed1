"""meta.json, the manifest of a prepared directory (written last, so its presence means complete),
the progress record of an interrupted run, and the checks that open a prepared directory."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np

from lm.core.files import file_sha256, naming
from lm.data.errors import DataError
from lm.data.sources import SourceFile
from lm.data.tokenizer import Tokenizer

FORMAT_VERSION = 1
# How the same settings are planned into tasks and splits; a partial preparation of another plan restarts rather than
# resuming into a mix of both. 2: --doc-split file splits by a file's content (was its name), and a contiguous cut in
# JSON Lines falls at a record's end.
PLAN_VERSION = 2
META, PROGRESS, TOKENIZER = "meta.json", "progress.json", "tokenizer.json"


def fingerprint(content: dict, files: list[SourceFile]) -> str:
    stamp = [(f.path, f.format, f.split, *f.stat()) for f in files]
    blob = json.dumps(
        {"version": FORMAT_VERSION, "plan": PLAN_VERSION, "config": content, "files": stamp},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def read_json(path: Path) -> dict | None:
    """The JSON object in `path`; None when it is missing, unreadable or not an object (a list, a number)."""
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def written_by_prepare(root: Path, meta: dict) -> bool:
    """Whether `root` holds nothing but what lm prepare wrote there, as its meta.json lists it (meta.json,
    the tokenizer, the shards): only such a directory may be replaced, so a user's directory that merely
    holds a meta.json keeps its files."""
    try:
        listed = {META, meta["tokenizer"]["file"]} | {
            s["file"] for split in meta["splits"].values() for s in split["shards"]
        }
    except (KeyError, TypeError, AttributeError):
        return False
    shard = re.compile(r"\w+_\d{5}\.bin")
    ours = all(name in (META, TOKENIZER) or shard.fullmatch(str(name)) for name in listed)
    return ours and "format_version" in meta and {p.name for p in root.iterdir()} <= listed


def write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with naming(path):  # a full disk names the file
        tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


def open_prepared(data_dir, checksums: bool = False) -> dict:
    """meta.json of a complete prepared directory, after checking what can go wrong cheaply:
    missing manifest, tokenizer/shard mismatch, missing or truncated shards (and, with
    checksums=True, corrupt shards)."""
    root = Path(data_dir).expanduser()
    if root.is_file():  # a text file given where its prepared directory belongs
        raise DataError(
            f"{root} is a file, not an lm prepare directory: lm prepare {root} --out <dir> prepares it (or lm train "
            f"data.source={root} prepares and trains)"
        )
    if not root.exists() and not root.with_name(f".{root.name}.partial").exists():
        raise DataError(f"{root}: no such directory; lm prepare <text> --out {root} makes it")
    meta = read_json(root / META)
    if meta is None:
        partial = root.with_name(f".{root.name}.partial")
        hint = (
            f" (an interrupted run left {partial}; re-run the same lm prepare command to resume it)"
            if partial.exists()
            else ""
        )
        raise DataError(
            f"{root}: no readable {META}, so this is not a complete lm prepare directory{hint}; "
            f"run lm prepare --out {root} (or let lm train prepare it)"
        )
    if meta.get("format_version") != FORMAT_VERSION:
        raise DataError(
            f"{root / META}: format version {meta.get('format_version')}, this code reads "
            f"{FORMAT_VERSION}; re-run lm prepare --force --out {root}"
        )
    tok = Tokenizer.load(root / meta["tokenizer"]["file"])
    if tok.sha256 != meta["tokenizer"]["sha256"]:
        raise DataError(
            f"{root / TOKENIZER} does not match the tokenizer the shards were made with (sha256 "
            f"{tok.sha256[:12]} vs {meta['tokenizer']['sha256'][:12]} in {META}); the directory mixes two "
            f"runs: re-run lm prepare --force --out {root}"
        )
    itemsize = np.dtype(meta["dtype"]).itemsize
    for split in meta["splits"].values():
        for s in split["shards"]:
            path = root / s["file"]
            size = path.stat().st_size if path.is_file() else None
            if size != s["tokens"] * itemsize:
                raise DataError(
                    f"{path}: {'missing' if size is None else f'{size} bytes'}, expected "
                    f"{s['tokens'] * itemsize} ({s['tokens']} tokens of {meta['dtype']}): the shard is "
                    f"truncated or corrupt; re-run lm prepare --force --out {root}"
                )
            if checksums and file_sha256(path) != s["sha256"]:
                raise DataError(
                    f"{path}: sha256 differs from {META}: the shard is corrupt; re-run lm prepare --force --out {root}"
                )
    return meta
