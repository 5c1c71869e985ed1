"""Hydra callbacks for sweeps (listed under `hydra.callbacks` by conf/experiment/ablate_base.yaml
and conf/hydra/launcher/local_gpus.yaml).

RecordFailure: Hydra keeps a failed job's exception in memory and raises it only at the end of
the sweep, so nothing in the cell's directory would say why it failed. This writes the traceback
to <run_dir>/error.txt, which lm-report shows in its table.

OneJobPerGPU: with a launcher that starts every cell as its own process at once (submitit_local),
each cell takes a free GPU and holds it until it exits, so N GPUs run N cells at a time. The
claim is an flock on a file in the sweep directory: the kernel drops it when the process ends,
crash or not, so a dead cell never blocks a GPU.
"""

from __future__ import annotations

import fcntl
import logging
import os
import subprocess
import time
import traceback
from pathlib import Path
from typing import Any, Optional

from hydra.experimental.callback import Callback

log = logging.getLogger("lm")


class RecordFailure(Callback):
    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        from hydra.core.utils import JobStatus

        if job_return.status != JobStatus.FAILED:
            return
        error = job_return._return_value  # the exception; .return_value would re-raise it
        run_dir = Path(str(config.get("run_dir") or config.hydra.runtime.output_dir))
        run_dir.mkdir(parents=True, exist_ok=True)
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        tmp = run_dir / ".error.txt.tmp"
        tmp.write_text(f"overrides: {' '.join(config.hydra.overrides.task)}\n{text}")
        os.replace(tmp, run_dir / "error.txt")


def visible_gpus() -> list:
    """GPU ids this machine offers, without initialising CUDA (which would fix the device set
    before CUDA_VISIBLE_DEVICES can be chosen)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES"):
        return [g for g in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if g]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(l for l in out.splitlines() if l.startswith("GPU "))]


class OneJobPerGPU(Callback):
    def __init__(self, lock_dir: Optional[str] = None, poll_s: float = 5.0) -> None:
        self.lock_dir = lock_dir
        self.poll_s = poll_s
        self._held = None  # the open lock file: closing it (or exiting) frees the GPU

    def on_job_start(self, config: Any, **kwargs: Any) -> None:
        gpus = visible_gpus()
        if not gpus:
            log.warning("OneJobPerGPU: no GPU found; the cell runs on what the engine picks")
            return
        lock_dir = Path(self.lock_dir or config.hydra.sweep.dir) / ".gpu_locks"
        lock_dir.mkdir(parents=True, exist_ok=True)
        gpu = self._claim(gpus, lock_dir, int(config.hydra.job.num))
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
        log.info("cell %s runs on GPU %s", config.hydra.job.num, gpu)

    def _claim(self, gpus: list, lock_dir: Path, job_num: int) -> str:
        order = gpus[job_num % len(gpus):] + gpus[: job_num % len(gpus)]  # spread first claims
        while True:
            for gpu in order:
                f = open(lock_dir / f"gpu{gpu}.lock", "w")
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    f.close()
                    continue
                self._held = f
                return gpu
            time.sleep(self.poll_s)

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        if self._held is not None:
            self._held.close()
            self._held = None
