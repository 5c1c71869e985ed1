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

Under torchrun every rank hits the same user error, so only rank 0 prints the line; each rank also writes it as
its elastic error file (`quiet`), which torchrun's summary of failed ranks shows as the first failure's cause.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import pickle
import sys
import time
from collections.abc import Callable

# The project's exceptions a user can fix, by module: only modules already imported are looked up (an
# exception of a module never imported cannot have been raised), so this costs no import on any path.
PROJECT_ERRORS = {
    "lm.config": ("ConfigError",),  # and its subclasses: InitError, lm transfer's TransferError
    "lm.core.checkpoint": ("CheckpointError",),  # and lm/core/lock.py's RunDirLocked, RunDirUnwritable
    "lm.core.loop": ("LossDiverged", "Preempted"),
    "lm.core.task": ("EvalFailed",),  # on the ranks other than 0, which raises the evaluation's own error
    "lm.eval.harness": ("HarnessError",),
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
                _say(f"{prog}: interrupted" + (f"; {e}" if str(e) else ""))
                raise SystemExit(130) from None
            except SystemExit as e:  # sys.exit("lm-x: <what>") below: Python prints it, and does so on every rank
                if isinstance(e.code, str) and quiet(e.code):
                    raise SystemExit(1) from None
                raise
            except Exception as e:  # noqa: BLE001 - a bug (describe is None) is re-raised unchanged
                line = describe(e)
                if line is None:
                    raise
                if isinstance(e, usage):  # worded as argparse words its own
                    _say(f"{prog}: error: {line}")
                    raise SystemExit(2) from None
                message = f"{prog}: {line}"
                raise SystemExit(1 if quiet(message) else message) from None  # a message: printed on stderr, status 1

        return run

    return wrap


def quiet(line: str) -> bool:
    """Whether this process leaves its user error's `line` unprinted: a rank other than 0 under torchrun (or
    `accelerate launch`, which runs it). Every rank there first writes the line as its elastic error file, in the
    format of torch's own `@record`, so a rank that failed alone is still heard once: torchrun's summary shows the
    first failed rank's line where it would say 'To enable traceback see: ...'. Elsewhere every rank prints."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return False
    data = {"message": {"message": line, "extraInfo": {"py_callstack": line, "timestamp": str(int(time.time()))}}}
    try:
        with open(path, "w") as f:
            json.dump(data, f)
    except OSError:  # not recorded: this rank says it itself
        return False
    return os.environ.get("RANK", "0") != "0"


def _say(line: str) -> None:
    if not quiet(line):
        print(line, file=sys.stderr)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that Python's flush at exit does not raise the same error again."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # no file descriptor behind sys.stdout (a test's capture): nothing to flush
        pass
