"""The one error path of the console scripts: what a user can fix is one line, a bug keeps its traceback.

    @entry("lm export")
    def main(argv=None): ...

Every `main()` in lm/cli goes through `entry` (the Hydra apps through lm/cli/app.py, which logs the same
`describe` line), so a new command inherits it by using it. A user error ends as one line on stderr,
`lm-<cmd>: <what> (<file>[:line]) — <fix>`, and exit status 1 (usage errors: `lm-<cmd>: error: ...` and
status 2, as argparse's own);
Ctrl-C outside the training loop is one line and status 130. User errors are the project's own (each
already names the file and the fix) and those that bad input, a wrong path or a full disk raise from the
OS, the UTF-8 decoder, csv, pickle and safetensors. Anything else is a bug: its traceback is kept.
"""

from __future__ import annotations

import errno
import functools
import os
import pickle
import sys
from collections.abc import Callable

# The project's exceptions a user can fix, by module: only modules already imported are looked up (an
# exception of a module never imported cannot have been raised), so this costs no import on any path.
PROJECT_ERRORS = {
    "lm.config": ("ConfigError",),  # and its subclasses: InitError, lm transfer's TransferError
    "lm.core.checkpoint": ("CheckpointError",),  # and lm/core/lock.py's RunDirLocked, RunDirUnwritable
    "lm.core.loop": ("LossDiverged", "Preempted"),
    "lm.data.errors": ("DataError",),
    "lm.data.tokenizer": ("TokenizerError",),
    "lm.engine.dist": ("EngineError",),
    "lm.extras": ("MissingExtra",),
    "lm.glue.readers": ("GlueDataError",),
    "lm.report.runs": ("ReportError",),
    "lm.report.transfer": ("TransferError",),
}

FIXES = {  # errno -> what to do about it
    errno.ENOSPC: "free space on that disk, or write somewhere else",
    errno.EDQUOT: "free space (the disk quota is exceeded), or write somewhere else",
    errno.ENOTDIR: "a part of that path is a file, not a directory: pick another path",
    errno.EEXIST: "something is already there: remove it, or pick another path",
    errno.EISDIR: "that is a directory: name a file",
    errno.EACCES: "fix its permissions, or pick another path",
    errno.EPERM: "fix its permissions, or pick another path",
    errno.EROFS: "pick a path on a writable file system",
    errno.ENOENT: "check the path",
    errno.ENAMETOOLONG: "use a shorter path",
    errno.EIO: "the disk reported an I/O error: check it, or use another disk",
}


def project_errors() -> tuple[type[BaseException], ...]:
    return tuple(
        getattr(sys.modules[m], name)
        for m, names in PROJECT_ERRORS.items()
        if m in sys.modules
        for name in names
        if hasattr(sys.modules[m], name)
    )


def describe(e: BaseException) -> str | None:
    """The line (without the program name) for an error a user can fix; None for a bug."""
    if isinstance(e, project_errors()):
        return str(e)
    if isinstance(e, UnicodeDecodeError):
        bad = e.object[e.start : e.start + 1]
        return f"the input is not UTF-8 text ({e.reason}: byte {bad!r} at offset {e.start}) — save it as UTF-8"
    if isinstance(e, OSError):
        return os_line(e)
    if _is(e, "_csv", "Error"):
        return f"malformed CSV/TSV input ({e}) — fix or replace the file"
    if isinstance(e, pickle.UnpicklingError):
        return f"a file is not one lm wrote and cannot be read safely ({e}) — restore or delete it"
    if _is(e, "safetensors", "SafetensorError"):
        text = str(e)
        full = any(m in text for m in ("os error 28", "code: 28", "StorageFull", "No space left"))  # Rust's io::Error
        fix = FIXES[errno.ENOSPC] if full else "restore the file, or write it again"
        return f"a safetensors file cannot be read or written ({text}) — {fix}"
    return None


def os_line(e: OSError) -> str:
    """`<strerror> (<file>[ -> <file2>]) — <fix>`, e.g. `No space left on device (out/model.safetensors) — ...`."""
    if not e.strerror:
        return str(e)
    files = " -> ".join(str(f) for f in (e.filename, e.filename2) if f is not None)
    fix = FIXES.get(e.errno)
    return e.strerror + (f" ({files})" if files else "") + (f" — {fix}" if fix else "")


def _is(e: BaseException, module: str, name: str) -> bool:
    cls = getattr(sys.modules.get(module), name, None)
    return isinstance(cls, type) and isinstance(e, cls)


def entry(prog: str, usage: tuple[type[BaseException], ...] = ()) -> Callable:
    """Decorate a console script's main(): user errors -> one line and status 1 (`usage`: status 2)."""

    def wrap(main: Callable) -> Callable:
        @functools.wraps(main)
        def run(*args, **kwargs):
            try:
                return main(*args, **kwargs)
            except BrokenPipeError:  # the reader left (`lm train --help | head`): stop quietly, as a SIGPIPE would
                _quiet_stdout()
                raise SystemExit(141) from None  # 128 + SIGPIPE: what a shell reports for a process the pipe ended
            except KeyboardInterrupt as e:  # the loop's Aborted says where the same command resumes from
                print(f"{prog}: interrupted" + (f"; {e}" if str(e) else ""), file=sys.stderr)
                raise SystemExit(130) from None
            except Exception as e:  # noqa: BLE001 - a bug (describe is None) is re-raised unchanged
                line = describe(e)
                if line is None:
                    raise
                if isinstance(e, usage):  # worded as argparse words its own
                    print(f"{prog}: error: {line}", file=sys.stderr)
                    raise SystemExit(2) from None
                raise SystemExit(f"{prog}: {line}") from None  # printed on stderr, status 1

        return run

    return wrap


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that Python's flush at exit does not raise the same error again."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # no file descriptor behind sys.stdout (a test's capture): nothing to flush
        pass
