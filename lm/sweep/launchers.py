"""Hydra launchers for sweeps: Hydra's own (basic, submitit local, submitit SLURM) with three
changes that a sweep of lm train cells needs. Selected by conf/hydra/launcher/{sequential,
local_gpus,slurm}.yaml, e.g. `lm train -m experiment=ablate_ffn_norm hydra/launcher=local_gpus`.
The submitit ones live in submitit_launchers.py (the `slurm` extra installs the plugin); Hydra
only instantiates launchers from its plugin namespace, so hydra_plugins/lm_launchers/ registers
thin subclasses of these.

1. A cell that ends with sys.exit fails alone. lm train exits with status 1 on a ConfigError
   (a clear message, no traceback), and Hydra's launchers only catch Exception: under the basic
   launcher the SystemExit ends the whole sweep at the first bad cell, under submitit it makes
   the job's result raise in the middle of collecting them. Here it becomes CellExited, which
   Hydra records as that cell's failure and goes on; lm.sweep.callbacks.RecordFailure then
   writes the reason to the cell's error.txt.
2. Cells started as separate processes (submitit) resolve `${lm.stamp:}` (the sweep's wandb
   group and directory) and the lm resolvers like the parent did: the stamp travels with the
   launcher and the resolvers are registered before the cell's config is composed.
3. LocalGPUs runs one cell per GPU at a time: cells start in waves of one process per GPU, and each
   takes a free GPU (an flock in <sweep dir>/.gpu_locks, dropped by the kernel when the process ends,
   crash or not, so two sweeps on one machine share the GPUs) and holds it until it exits. Without a
   GPU, `cpu_slots` cells run at a time.
   (claim_slot and visible_gpus are here so they are tested without the plugin.)
4. A stop signal (preemption) that stops a cell run in the sweep's own process ends the sweep (SweepStopped)
   instead of starting the next cell; the same command resumes it.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import time
from pathlib import Path
from typing import Any

SHARED_ENV = ("LM_RUN_STAMP",)  # what every cell of one sweep must agree on (lm.config.run_stamp)


class CellExited(RuntimeError):
    """The cell's task called sys.exit with a failure status (its reason is in its log)."""


class SweepStopped(SystemExit):
    """Raised by a cell (lm/cli/app.py) that a stop signal stopped (lm.core.loop.Preempted: SIGTERM, SIGUSR1,
    Ctrl-C): it ends a sweep whose cells run in its own process (Hydra's basic launcher lets a SystemExit through),
    where the next cell would start training only to be killed when the sender's grace period ends. The same
    command resumes the sweep (the stopped cell from its checkpoint)."""


class ExitAsError:
    """The task function, with a failing SystemExit turned into CellExited (picklable for submitit); with
    `end_on_stop`, a SweepStopped goes through."""

    def __init__(self, task_function: Any, end_on_stop: bool = False) -> None:
        self.task_function = task_function
        self.end_on_stop = end_on_stop

    def __call__(self, cfg: Any) -> Any:
        try:
            return self.task_function(cfg)
        except SystemExit as e:
            if isinstance(e, SweepStopped) and self.end_on_stop:
                raise
            if e.code in (None, 0):
                return None
            raise CellExited(f"the cell exited with status {e.code!r}") from None


class KeepGoing:
    """Mixed into a Hydra launcher: wrap the task function once, at setup. Cells in this process (not
    InCellProcess's) end the sweep when a stop signal stops one."""

    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        wrapped = ExitAsError(task_function, end_on_stop=not isinstance(self, InCellProcess))
        super().setup(hydra_context=hydra_context, task_function=wrapped, config=config)


class InCellProcess:
    """For launchers whose cells run in other processes: carry what the cells must share."""

    def launch(self, job_overrides: Any, initial_job_idx: int) -> Any:
        self.shared_env = {k: os.environ[k] for k in SHARED_ENV if k in os.environ}
        return super().launch(job_overrides, initial_job_idx)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from lm.config import register_train_configs

        for k, v in getattr(self, "shared_env", {}).items():
            os.environ.setdefault(k, v)
        register_train_configs()  # the ${lm.stamp:} / ${lm.cell:} resolvers of conf/train.yaml
        return super().__call__(*args, **kwargs)


def visible_gpus() -> list:
    """GPU ids this machine offers, without initialising CUDA (which would fix the device set
    before CUDA_VISIBLE_DEVICES can be chosen). CUDA_VISIBLE_DEVICES, when set, is the user's
    choice (empty = no GPU); otherwise what nvidia-smi lists."""
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        return [g.strip() for g in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if g.strip()]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, _ in enumerate(line for line in out.splitlines() if line.startswith("GPU "))]


def claim_slot(slots: list, lock_dir: Path, job_num: int, poll_s: float = 2.0):
    """Block until one of `slots` is free; returns (slot, open lock file). Closing the file, or
    the process ending, frees the slot."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    start = job_num % len(slots)
    order = slots[start:] + slots[:start]  # spread the first claims over all slots
    while True:
        for slot in order:
            f = open(lock_dir / f"{slot}.lock", "w")  # noqa: SIM115 - returned open: it holds the slot's lock
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                continue
            return slot, f
        time.sleep(poll_s)
