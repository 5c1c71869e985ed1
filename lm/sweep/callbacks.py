"""Hydra callbacks for sweeps (listed under `hydra.callbacks`: RecordFailure by conf/experiment/ablate_base.yaml,
OwnSweepDir by conf/train.yaml and conf/finetune.yaml).

OwnSweepDir: a sweep's directory is named by its start time to the second (runs/<stamp>, runs/ablate_<stamp>), so
two sweeps started in the same second named one directory and shared its cells' run directories. Before any cell,
the sweep creates its directory, and one that exists already gets a new name (lm.config.own_stamped_dir).

RecordFailure: Hydra keeps a failed job's exception in memory and raises it only at the end of
the sweep, so nothing in the cell's directory would say why it failed. This writes the traceback
to <run_dir>/error.txt, which lm report shows in its table. lm train reports a ConfigError as a
log line and exits (lm.sweep.launchers turns that exit into a CellExited failure), so the
error lines logged during the cell are appended: the reason is the last of them.

error.txt says why the cell's run is not a result, so it is kept only while that is true: a cell that
completes (a rerun of the sweep trained it to the end, or found it finished) drops an earlier attempt's
error.txt, and a failure never writes one beside a run that lm report reads as finished (a rerun with a
changed grid, refused for the cell's other overrides, or a rerun whose data could not be prepared): that
run is still a result, and the error is the new job's, printed by the sweep.
"""

from __future__ import annotations

import logging
import os
import traceback
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

from lm.report.runs import ERROR_FILE


def _finished(run_dir: Path) -> bool:
    """Whether run_dir holds a run lm report reads as finished (its metrics reach its train.max_steps)."""
    from lm.report.runs import ReportError, load_run

    if not (run_dir / "metrics.jsonl").is_file():
        return False
    try:
        return load_run(run_dir).ok
    except (ReportError, OSError):
        return False


def cell_dir(config: Any) -> Path:
    return Path(str(config.get("run_dir") or config.hydra.runtime.output_dir))


class _ErrorLines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.lines: list = []

    def emit(self, record: logging.LogRecord) -> None:
        # one line per error: lm report shows error.txt's last error line, which cut a resume refusal (its fields
        # listed below "old -> new:") at its first line
        self.lines.append(" ".join(record.getMessage().split()))


class RecordFailure(Callback):
    def __init__(self) -> None:
        self._errors = None

    def on_job_start(self, config: Any, **kwargs: Any) -> None:
        self._errors = _ErrorLines()
        logging.getLogger("lm").addHandler(self._errors)

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        from hydra.core.utils import JobStatus

        logged = self._stop_listening()
        run_dir = cell_dir(config)
        if job_return.status == JobStatus.COMPLETED:
            (run_dir / ERROR_FILE).unlink(missing_ok=True)  # an earlier attempt's: this one trained or skipped it
        if job_return.status != JobStatus.FAILED or _finished(run_dir):
            return
        error = job_return._return_value  # the exception; .return_value would re-raise it
        run_dir.mkdir(parents=True, exist_ok=True)
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        if logged:
            text += "logged errors:\n" + "".join(f"{line}\n" for line in logged)
        tmp = run_dir / ".error.txt.tmp"
        tmp.write_text(f"overrides: {' '.join(config.hydra.overrides.task)}\n{text}")
        os.replace(tmp, run_dir / ERROR_FILE)

    def _stop_listening(self) -> list:
        if self._errors is None:
            return []
        logging.getLogger("lm").removeHandler(self._errors)
        lines, self._errors = self._errors.lines, None
        return lines


class OwnSweepDir(Callback):
    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        from lm.config import STAMP_ENV, own_stamped_dir

        if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 names the directory and the others follow
            own_stamped_dir(lambda: Path(str(config.hydra.sweep.dir)))
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            from lm.engine import dist as dist_utils

            os.environ[STAMP_ENV] = dist_utils.broadcast_object(os.environ.get(STAMP_ENV))
