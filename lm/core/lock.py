"""One writer per run directory: `<run_dir>/.lock`, held by rank 0 while its job runs.

    with held_run_dir(run_dir, dist):   # lm train, lm finetune: before anything in run_dir is read or written
        ...                              # released on return, so one process can run many jobs in turn

Two runs writing one run_dir delete each other's half-written checkpoints and lose metrics, so the
second one refuses at once, naming the holder. The lock is `fcntl.flock` on the open file: the kernel
drops it when the holding process dies (however it dies), so a lock file left by a killed run never
blocks the next resume. The file's text (pid, host, start time, command) only names the holder. It is
opened with O_NOFOLLOW and must be a regular file: a `.lock` planted as a symlink would otherwise have
its target truncated and overwritten.

lm/core/files.py `exclusive` is the other flock, kept apart on purpose: it serialises short writes (lm prepare,
lm eval's record merge) by waiting, and removes its file after, whereas this lock refuses at once, naming the
holder, stays for the whole job and leaves `.lock` in the run directory, where lm report's `in_use` reads it.
(lm/cli/export.py flocks the output's parent directory itself and lm/sweep/launchers.py a pool of GPU slots:
the same kernel lock on other objects, no third mechanism.)
"""

import datetime
import errno
import fcntl
import json
import os
import socket
import stat
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from lm.core.checkpoint import CheckpointError
from lm.core.files import same_file
from lm.engine import dist as dist_utils

LOCK_NAME = ".lock"

_held: dict[Path, TextIO] = {}  # run_dir -> open lock file: the lock lives as long as the file stays open


class RunDirLocked(CheckpointError):
    """Another live process holds the run directory; the message names it. `run_dir` and `holder` (pid, host,
    start, command) let a command that chose the directory itself word the fix in its own flags (lm transfer)."""

    def __init__(self, message: str, run_dir: Path | None = None, holder: str = ""):
        super().__init__(message)
        self.run_dir, self.holder = run_dir, holder


class RunDirUnwritable(CheckpointError):
    """The run directory cannot be created or written (permissions, a read-only or full disk, a file in the way)."""


def unwritable_message(run_dir, e: OSError) -> str:
    """The one line the apps print (lm/cli/app.py checks run_dir= before Hydra creates it, too)."""
    reason = e.strerror or str(e)
    if e.filename and str(e.filename) != str(run_dir):
        reason += f" ({e.filename})"
    return f"run_dir {run_dir} is not writable: {reason}; pick another run_dir"


def lock_run_dir(run_dir, dist=None) -> None:
    """Create `run_dir` and lock it on rank 0 (all ranks raise RunDirLocked if rank 0 could not).
    `dist`: the lm.engine.dist.Dist of the run, or None for a single process."""
    error = None
    if dist is None or dist.is_main:
        try:
            Path(run_dir).mkdir(parents=True, exist_ok=True)
            acquire(run_dir)
            if not os.access(run_dir, os.W_OK | os.X_OK):  # the lock file may be writable in a read-only dir
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(run_dir))
        except (RunDirLocked, RunDirUnwritable) as e:  # held, or a .lock lm will not write through
            error = e
        except OSError as e:  # PermissionError, EROFS, ENOSPC, NotADirectoryError: the user picks another
            release(run_dir)
            error = RunDirUnwritable(unwritable_message(run_dir, e))
    if dist_utils.any_rank(error is not None):
        raise error or CheckpointError(f"rank 0 could not create or lock run_dir {run_dir} (see its error)")


@contextmanager
def held_run_dir(run_dir, dist=None):
    """lock_run_dir for the duration of a job. The lock is released when the job returns or raises: a
    process that runs several jobs over one directory in turn (lm transfer's finetuning arms, a curve of
    them sharing one scratch arm) must not keep the first job's lock and refuse a second process. A job refused
    before it wrote anything into a run_dir it made leaves no directory holding only the lock file."""
    made = (dist is None or dist.is_main) and not Path(run_dir).exists()
    lock_run_dir(run_dir, dist)
    try:
        yield
    except BaseException:
        if made:  # before the unlock: a job that opened the lock file meanwhile then finds it gone (acquire)
            _remove_if_only_lock(Path(run_dir))
        release(run_dir)
        raise
    finally:
        release(run_dir)


def _remove_if_only_lock(run_dir: Path) -> None:
    try:
        if [p.name for p in run_dir.iterdir()] == [LOCK_NAME]:
            (run_dir / LOCK_NAME).unlink()
            run_dir.rmdir()
    except OSError:  # another process wrote there meanwhile, or it went: the directory is not ours to clear
        pass


def acquire(run_dir) -> Path:
    """Lock `run_dir` for this process (again: no-op); raise RunDirLocked naming a live holder."""
    run_dir = Path(run_dir).resolve()
    path = run_dir / LOCK_NAME
    if run_dir in _held:
        return path
    while True:
        f = _open_lock_file(path)
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            text = f.read()
            f.close()
            who = _holder_words(path, text)
            raise RunDirLocked(_held_message(run_dir, path, who), run_dir, who) from None
        if same_file(f.fileno(), path):
            break
        # its holder, refused in the run_dir it made, removed the file (and the directory) before letting go:
        # the lock of an unlinked file guards nothing, so lock the one at the path now
        f.close()
        run_dir.mkdir(parents=True, exist_ok=True)
    f.seek(0)
    f.truncate()
    f.write(
        json.dumps(
            {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "start": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                "command": " ".join(sys.argv),
            }
        )
        + "\n"
    )
    f.flush()
    _held[run_dir] = f
    return path


def _open_lock_file(path: Path) -> TextIO:
    """`path` opened for reading and writing, created if missing, never truncated here (the holder's text must
    survive until we hold the lock); RunDirUnwritable if it is a symlink or not a regular file."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a FIFO never hangs
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        raise RunDirUnwritable(_not_a_lock_file(path, "a symbolic link")) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RunDirUnwritable(_not_a_lock_file(path, "not a regular file"))
    return os.fdopen(fd, "r+")


def _not_a_lock_file(path: Path, what: str) -> str:
    return (
        f"the lock file {path} is {what}; lm never writes through it. Remove it (rm {path}; its target is "
        f"left alone) and run again"
    )


def release(run_dir) -> None:
    """Give the lock up before the process ends (tests; a long-lived process done with the run)."""
    f = _held.pop(Path(run_dir).resolve(), None)
    if f is not None:
        fcntl.flock(f, fcntl.LOCK_UN)
        f.close()


def holder(run_dir) -> dict | None:
    """What the lock file of `run_dir` says about its last holder (None if there is none)."""
    try:
        return json.loads((Path(run_dir) / LOCK_NAME).read_text())
    except (OSError, ValueError):
        return None


def in_use(run_dir) -> bool:
    """Whether a live process holds `run_dir`'s lock (a run still training), read without taking it: lm report's
    look, taken for an instant, would make a run starting at that instant refuse. Linux lists every flock in
    /proc/locks by device and inode; elsewhere, the holder the lock file names, if it is this host's and alive
    (a run on another node of a shared file system cannot be seen from here)."""
    path = Path(run_dir) / LOCK_NAME
    try:
        st = path.stat()
    except OSError:
        return False
    try:
        table = Path("/proc/locks").read_text()
    except OSError:
        who = holder(run_dir) or {}
        pid = who.get("pid")
        return who.get("host") == socket.gethostname() and isinstance(pid, int) and _alive(pid)
    # a line: "1: FLOCK  ADVISORY  WRITE 12786 fe:00:2188846 0 EOF" (major:minor in hex); "->" marks a waiter
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    return any(f[1] == "FLOCK" and f[5] == want for f in (line.split() for line in table.splitlines()) if len(f) > 5)


def _holder_words(path: Path, text: str) -> str:
    """The holder as the lock file's text names it: pid, host, start time and command."""
    try:
        who = json.loads(text)
    except ValueError:
        who = {}
    pid, host = who.get("pid", "?"), who.get("host", "?")
    what = f"pid {pid} on {host}, started {who.get('start', '?')}: {who.get('command', '?')}"
    if host == socket.gethostname() and isinstance(pid, int) and not _alive(pid):
        # flock is inherited across fork: children of a dead holder (data-loader workers, a launcher's
        # ranks) still hold it, and may still be writing.
        what += f" (pid {pid} has exited; processes it forked still hold the lock: `fuser -v {path}` lists them)"
    return what


def _held_message(run_dir: Path, path: Path, what: str) -> str:
    return (
        f"run_dir {run_dir} is in use by another run ({what}). Two runs in one run_dir overwrite each "
        f"other's checkpoints and metrics: wait for it to finish, stop it, or pick another run_dir. The lock "
        f"({path}) is released when that process exits."
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
