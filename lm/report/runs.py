"""Find run directories under the paths given to lm report and read what each run left behind.

A run directory (the lm train contract) holds config.yaml (the resolved config), metrics.jsonl
(one JSON object per logged step; validation entries carry val_loss) and, after finetuning,
results.json. A Hydra job directory also has .hydra/ (config.yaml, overrides.yaml) and the job's
<name>.log; a sweep cell's run keeps its own copy of the overrides as overrides.yaml. Everything here
is tolerant of missing fields: a cell that crashed early is still a Run, with status "failed" and the
reason, so the report can show it instead of dropping it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ERROR_FILE = "error.txt"  # a failed sweep cell's reason (lm/sweep/callbacks.py writes it)
RUN_MARKERS = ("config.yaml", "metrics.jsonl", "results.json", ".hydra/config.yaml")


class ReportError(ValueError):
    """The inputs cannot make a report; the message names the path and the fix."""


@dataclass
class Run:
    path: Path
    config: dict  # resolved config as plain containers ({} if none was written)
    overrides: list | None  # Hydra task overrides (None when the run has no .hydra/)
    train: list = field(default_factory=list)  # metrics entries that carry "loss"
    val: list = field(default_factory=list)  # metrics entries that carry "val_loss"
    other: list = field(default_factory=list)  # any other entries (run summaries, ...)
    results: dict | None = None  # results.json (GLUE finetuning)
    status: str = "ok"  # ok | failed | running (unfinished, its job still holds the run's lock)
    reason: str = ""

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def get(self, dotted: str, default: Any = None) -> Any:
        """A config value by dotted key ('train.max_steps'), or default when absent."""
        node: Any = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    @property
    def last_step(self) -> int | None:
        steps = [e["step"] for e in self.train + self.val if isinstance(e.get("step"), (int, float))]
        return int(max(steps)) if steps else None


def is_run_dir(path: Path) -> bool:
    return any((path / m).is_file() for m in RUN_MARKERS)


def find_run_dirs(paths: list) -> list:
    """Every run directory at or below the given paths, in a stable order.

    We do not descend into a run directory (its checkpoints/ are not runs), and we skip report
    output directories, which hold none of the markers.
    """
    found = []
    for p in map(Path, paths):
        if not p.exists():
            raise ReportError(f"{p}: no such file or directory; pass sweep or run directories")
        if p.is_file():
            raise ReportError(f"{p}: is a file; pass the run directory that contains it ({p.parent})")
        found.extend(_walk(p))
    if not found:
        raise ReportError(
            f"no run directories under {', '.join(map(str, paths))}: a run directory holds one of "
            f"{', '.join(RUN_MARKERS)}"
        )
    return sorted(dict.fromkeys(found), key=_natural_key)


def _walk(p: Path):
    if is_run_dir(p):
        yield p
        return
    for child in sorted(c for c in p.iterdir() if c.is_dir() and not c.name.startswith(".")):
        yield from _walk(child)


def _natural_key(p: Path):
    """Hydra numbers jobs 0, 1, ..., 10: sort 2 before 10."""
    return [int(t) if t.isdigit() else t for t in _split_digits(str(p))]


def _split_digits(s: str) -> list:
    out, cur = [], ""
    for ch in s:
        if cur and ch.isdigit() != cur[-1].isdigit():
            out.append(cur)
            cur = ""
        cur += ch
    return out + ([cur] if cur else [])


def load_yaml(path: Path) -> Any:
    import yaml
    from omegaconf import OmegaConf

    try:  # Interpolations like ${hydra:...} cannot resolve outside Hydra; keep them unresolved.
        return OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        why = " ".join(str(e).split())
        raise ReportError(
            f"{path}: not valid YAML ({why}); the file is damaged: restore it, or move the run away"
        ) from None


def read_text(path: Path) -> str:
    """A file lm wrote as UTF-8 text; another (a damaged or foreign file) is a ReportError naming it."""
    try:
        return path.read_text()
    except UnicodeDecodeError as e:
        raise ReportError(
            f"{path}: not UTF-8 text (byte {e.object[e.start : e.start + 1]!r} at offset {e.start}); "
            f"the file is damaged: restore it, or move the run away"
        ) from None


def read_config(path: Path) -> dict:
    for candidate in (path / "config.yaml", path / ".hydra" / "config.yaml"):
        if candidate.is_file():
            cfg = load_yaml(candidate)
            if not isinstance(cfg, dict):
                raise ReportError(f"{candidate}: expected a mapping at the top level, got {type(cfg).__name__}")
            return cfg
    return {}


def read_overrides(path: Path) -> list | None:
    """The overrides the run trained with: lm train's copy (overrides.yaml, written with config.yaml) before
    Hydra's .hydra/overrides.yaml, which a later job refused in this directory (a rerun of the sweep with
    another grid) has replaced with its own."""
    for candidate in (path / "overrides.yaml", path / ".hydra" / "overrides.yaml"):
        if candidate.is_file():
            return [str(o) for o in (load_yaml(candidate) or [])]
    return None


def read_metrics(path: Path) -> list:
    """Entries of metrics.jsonl. A torn last line (the writer was killed) is dropped; a bad line
    elsewhere means the file is corrupt and raises, naming the line."""
    lines = read_text(path).splitlines()
    entries = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines):
                break
            raise ReportError(
                f"{path}:{i}: not valid JSON ({e.msg}); the file is corrupt, delete that line or rerun"
            ) from None
        if not isinstance(entry, dict):
            raise ReportError(f"{path}:{i}: expected a JSON object per line, got {type(entry).__name__}")
        entries.append(entry)
    return entries


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def split_metrics(entries: list) -> tuple:
    train, val, other = [], [], []
    for e in entries:
        if _number(e.get("val_loss")):
            val.append(e)
        elif "loss" in e:
            train.append(e)  # a NaN loss stays: the last ones logged say the run diverged (failure_reason)
        else:
            other.append(e)
    return train, val, other


def max_steps(run: Run) -> int | None:
    v = run.get("train.max_steps")
    return int(v) if _number(v) else None


def failure_reason(run: Run) -> str:
    """Why the run did not finish, or '' when it did."""
    f = run.path / ERROR_FILE
    if f.is_file():
        return _last_error_line(f.read_text()) or f"{ERROR_FILE} present"
    diverged = _diverged_at(run.train)
    if diverged is not None:
        return f"loss became {diverged['loss']} at step {diverged.get('step', '?')}"
    if not run.train and not run.val and run.results is None:
        log = _hydra_log_error(run.path)
        return f"no metrics written{': ' + log if log else ''}"
    target, last = max_steps(run), run.last_step
    if target is not None and run.train and (last is None or last < target):
        log = _hydra_log_error(run.path)
        return f"stopped at step {last} of {target}{': ' + log if log else ''}"
    return ""


def _diverged_at(train: list) -> dict | None:
    """The first entry of the non-finite losses the run ended on, or None. A non-finite loss the run got past is a
    step train.on_nonfinite=skip dropped (its update was never applied): the run goes on, and is still a result."""
    tail = []
    for e in reversed(train):
        if _number(e.get("loss")):
            break
        tail.append(e)
    return tail[-1] if tail else None


def _last_error_line(text: str) -> str:
    """The exception line of a traceback (its last non-blank line), or an 'Error' line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "Exception" in line or "error" in line]
    return (errors[-1] if errors else lines[-1] if lines else "")[:300]


def _hydra_log_error(path: Path) -> str:
    for log in sorted(path.glob("*.log")):
        line = _last_error_line(
            "\n".join(
                text
                for text in log.read_text(errors="replace").splitlines()
                if "ERROR" in text or "Error" in text or "Traceback" in text
            )
        )
        if line:
            return line
    return ""


def load_run(path: Path) -> Run:
    """Read one run directory. Unreadable metrics make a failed Run rather than an exception, so
    one bad cell cannot stop a sweep's report."""
    path = Path(path)
    run = Run(path=path, config=read_config(path), overrides=read_overrides(path))
    metrics = path / "metrics.jsonl"
    try:
        if metrics.is_file():
            run.train, run.val, run.other = split_metrics(read_metrics(metrics))
        if (path / "results.json").is_file():
            run.results = json.loads(read_text(path / "results.json"))
    except (ReportError, json.JSONDecodeError) as e:
        run.status, run.reason = "failed", str(e)
        return run
    reason = failure_reason(run)
    if reason and _training(path):  # not failed: unfinished because its job is still at it
        run.status, run.reason = "running", f"at step {run.last_step} of {max_steps(run)}"
    elif reason:
        run.status, run.reason = "failed", reason
    return run


def _training(path: Path) -> bool:
    from lm.core.lock import in_use

    return in_use(path)


def load_runs(paths: list) -> list:
    return [load_run(p) for p in find_run_dirs(paths)]
