"""Atomic text writes: a reader never sees half a file (config.yaml, results, submissions, sweep tables); and one
writer at a time where writers read what they replace (`exclusive`)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path


def atomic_write_text(path, text: str) -> Path:
    """Write to a temporary file in the same directory, fsync, then os.replace onto `path`. The file gets the mode
    open() would give it (0666 less the umask: others may read results, as with any file the user writes), or the
    mode of the file it replaces."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = new_temporary(path)
    try:
        if path.exists():
            os.chmod(fd, stat.S_IMODE(os.stat(path).st_mode))
        with naming(path), os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


@contextlib.contextmanager
def naming(path):
    """An OSError without a file name raised again naming `path`. A write, flush or close of an open file (a full
    disk: ENOSPC, EDQUOT; EIO) reports no file, and lm/cli/errors.py's one line then cannot say which file, so which
    disk, to free: 'No space left on device — free space on that disk' with no disk named."""
    try:
        yield
    except OSError as e:
        if e.filename is not None or e.errno is None:
            raise
        raise OSError(e.errno, e.strerror, str(path)) from e


def new_temporary(path: Path) -> tuple[int, str]:
    """A new file beside `path`, opened for writing with the umask applied (tempfile.mkstemp makes 0600 files): (its
    descriptor, its name). The name is drawn at random, never made of the pid alone: two hosts sharing a directory
    (a cache on a network file system) may run writers of the same pid."""
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


@contextlib.contextmanager
def exclusive(path, waiting: Callable[[], None] | None = None):
    """An flock on the file `path` while the block runs, and the file removed after: one writer at a time (two lm
    prepare of one directory, two lm eval merging into one record), no lock file left beside the user's. The kernel
    drops the lock however its holder ends. `waiting()` is called once if another holds it. (A run directory's lock,
    which refuses instead of waiting and stays for the job: lm/core/lock.py.) A waiter can get the lock
    of a file its holder has just removed; it then locks the file now at `path`, so two never hold it at once."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting is not None:
                waiting()
                waiting = None
            fcntl.flock(fd, fcntl.LOCK_EX)
        if same_file(fd, path):
            break
        os.close(fd)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)  # before the unlock: a waiter on this file then finds it gone and tries again
        os.close(fd)


def same_file(fd: int, path: Path) -> bool:
    """Whether the open file `fd` is the one now at `path` (not one removed, or replaced, since it was opened)."""
    try:
        here, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)
