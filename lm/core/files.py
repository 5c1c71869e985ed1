"""Atomic text writes: a reader never sees half a file (config.yaml, results, submissions, sweep tables)."""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
from pathlib import Path


def atomic_write_text(path, text: str) -> Path:
    """Write to a temporary file in the same directory, fsync, then os.replace onto `path`. The file gets the mode
    open() would give it (0666 less the umask: others may read results, as with any file the user writes), or the
    mode of the file it replaces."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _new_temporary(path)
    try:
        if path.exists():
            os.chmod(fd, stat.S_IMODE(os.stat(path).st_mode))
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _new_temporary(path: Path) -> tuple[int, str]:
    """A new file beside `path`, opened for writing with the umask applied (tempfile.mkstemp makes 0600 files)."""
    while True:
        tmp = str(path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp"))
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), tmp
        except FileExistsError:  # a name another writer drew: draw again
            continue


def nearest_existing(path) -> Path:
    """`path` (made absolute) or its nearest ancestor that exists: what an output path would be created under, checked
    before any work (a file there instead of a directory, no write permission)."""
    above = Path(path).absolute()
    while not above.exists() and above != above.parent:
        above = above.parent
    return above


def file_sha256(path: Path) -> str:
    """The sha256 of a file, read in blocks (a checkpoint's shards, an export's weights: gigabytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):  # hashlib.file_digest needs Python 3.11
            digest.update(block)
    return digest.hexdigest()
