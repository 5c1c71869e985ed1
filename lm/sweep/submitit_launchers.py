"""The submitit launchers of lm sweeps (conf/hydra/launcher/local_gpus.yaml and slurm.yaml):
hydra-submitit-launcher's, with the changes that lm/sweep/launchers.py explains. Needs the
`slurm` extra: pip install -e '.[slurm]'."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from hydra_plugins.hydra_submitit_launcher.submitit_launcher import LocalLauncher, SlurmLauncher

from lm.sweep.launchers import InCellProcess, KeepGoing, claim_slot, visible_gpus

log = logging.getLogger("lm")


class LocalGPUs(InCellProcess, KeepGoing, LocalLauncher):
    """Each cell is its own process and runs while it holds a free GPU (or one of `cpu_slots` slots on a
    machine without GPUs). Cells start in waves of one per slot: submitit's local executor starts every
    job it is given at once, and a 100-cell sweep of processes that each import torch took 9 GB and a
    load of 40 on a 2-core machine before any of them could run."""

    def __init__(self, cpu_slots: int = 1, poll_s: float = 2.0, **params: Any) -> None:
        if int(cpu_slots) < 1:
            raise ValueError(f"hydra.launcher.cpu_slots={cpu_slots} must be >= 1")
        self.cpu_slots, self.poll_s = int(cpu_slots), float(poll_s)
        self.slots: list | None = None
        self.lock_dir: str | None = None
        super().__init__(**params)

    def launch(self, job_overrides: Any, initial_job_idx: int) -> Any:
        # In the parent: a cell's own CUDA_VISIBLE_DEVICES is what submitit set (empty), not the user's.
        gpus = visible_gpus()
        self.slots = [f"gpu{g}" for g in gpus] if gpus else [f"cpu{i}" for i in range(self.cpu_slots)]
        self.lock_dir = str(Path(str(self.config.hydra.sweep.dir)) / ".gpu_locks")
        log.info(
            "local_gpus: %s",
            f"one cell per GPU on {','.join(gpus)}"
            if gpus
            else f"no GPU found; {self.cpu_slots} cell(s) at a time on the CPU",
        )
        results: list = []
        for start in range(0, len(job_overrides), len(self.slots)):  # a wave: one process per slot
            wave = job_overrides[start : start + len(self.slots)]
            results.extend(super().launch(wave, initial_job_idx + start))
        return results

    def __call__(self, sweep_overrides: list, job_dir_key: str, job_num: int, job_id: str, singleton_state: Any):
        slot, held = claim_slot(self.slots, Path(self.lock_dir), job_num, self.poll_s)
        try:
            if slot.startswith("gpu"):
                os.environ["CUDA_VISIBLE_DEVICES"] = slot[len("gpu") :]
            log.info("cell %d runs on %s", job_num, slot)
            return super().__call__(sweep_overrides, job_dir_key, job_num, job_id, singleton_state)
        finally:
            held.close()


class Slurm(InCellProcess, KeepGoing, SlurmLauncher):
    """One SLURM array task per cell (submitit's `array_parallelism` caps how many run at once)."""
