"""Metrics sinks (JSONL always; wandb and TensorBoard when configured), throughput, MFU and memory.

Only rank 0 makes a Tracker that writes; other ranks get one whose methods do nothing. The JSONL
file is the source of truth for lm report: one object per logged step ({"step", "tokens", "loss",
"lr", "grad_norm", "tokens_per_s", "steps_per_s", "mfu", "memory"}, plus the model's own metrics when
it has any, e.g. "moe/load_e0": ModelMetrics below), validation passes as {"step", "tokens", "val_loss",
"val_ppl"}.
"""

import json
import logging
import math
import netrc
import os
import resource
import secrets
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch

from lm.core.config import LoggerConfig
from lm.core.files import naming
from lm.extras import require

log = logging.getLogger("lm")

# Dense bf16 peak FLOP/s per device, from the vendors' data sheets (no sparsity).
PEAK_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "A10G": 125e12,
    "L40S": 362e12,
    "L4": 121e12,
    "V100": 125e12,
    "RTX 4090": 165e12,
    "RTX 3090": 71e12,
}


def device_peak_flops(device: torch.device, configured: float | None) -> float | None:
    """Configured peak, else the GPU's from the table (H100 PCIe is lower than SXM: set it), else None."""
    if configured:
        return float(configured)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    if "H100" in name and "PCIe" in name:
        return 756e12
    return next((peak for key, peak in PEAK_FLOPS.items() if key in name), None)


def mfu(flops_per_token: float, tokens_per_s: float, peak: float | None, world_size: int) -> float | None:
    """Model FLOPs utilisation (Chowdhery et al. 2022): achieved model FLOP/s over the devices' peak."""
    if not peak:
        return None
    return flops_per_token * tokens_per_s / (peak * world_size)


def memory_gib(device: torch.device) -> float:
    """Peak memory of this process: CUDA max allocated on GPU, peak resident set size on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return peak_rss_bytes() / 2**30


def peak_rss_bytes() -> int:
    """This program's peak resident set size. Linux's VmHWM belongs to the program now running, while
    ru_maxrss also counts the parent's pages a fork copied before exec (a 1 GB parent gives a 1 GB floor)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        scale = 1 if sys.platform == "darwin" else 1024  # macOS reports bytes, Linux KiB
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def wandb_key_configured() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or ""
    try:
        return netrc.netrc().authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_mode(cfg: LoggerConfig) -> str:
    """online only when asked or when a key is configured; never a prompt or a hang without network."""
    if cfg.mode:
        return cfg.mode
    return "online" if wandb_key_configured() else "offline"


class ModelMetrics:
    """Means of the model's own training metrics (LMOutput.metrics: MoE expert load, dropped tokens) over
    the forwards since the last pop (the loop holds one per run and hands it to the task's loss). Sums stay
    on the device as tensors: no host sync until the loop logs."""

    def __init__(self):
        self.sums: dict[str, torch.Tensor] = {}
        self.count = 0

    def add(self, metrics: dict[str, torch.Tensor]) -> None:
        for name, value in metrics.items():
            value = value.detach().float()
            self.sums[name] = self.sums[name] + value if name in self.sums else value
        self.count += 1

    def clear(self) -> None:
        self.sums, self.count = {}, 0

    def pop(self, all_reduce_sum=lambda t: t) -> dict[str, float]:
        """Means over the forwards of every rank (all_reduce_sum sums a tensor over ranks); {} when none.
        Every rank runs the same model, so every rank has the same names or none."""
        if not self.sums:
            return {}
        names = sorted(self.sums)
        totals = all_reduce_sum(
            torch.stack(
                [self.sums[n] for n in names] + [torch.tensor(float(self.count), device=self.sums[names[0]].device)]
            )
        )
        values = (totals[:-1] / totals[-1]).tolist()
        self.clear()
        return {name: round(v, 6) for name, v in zip(names, values)}


class Tracker:
    """Rank 0's metrics sinks. `resume_step` drops JSONL lines (and hides TensorBoard events) that a killed run
    wrote after its checkpoint."""

    def __init__(self, run_dir: Path, cfg: LoggerConfig, config: dict, resume_step: int = 0):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "metrics.jsonl"
        _truncate_after(self.path, resume_step)
        self.file = open(self.path, "a")  # noqa: SIM115 - kept open for the run; close() closes it
        self.wandb = self._start_wandb(cfg, config) if cfg.wandb else None
        self.tb = self._start_tensorboard(resume_step) if cfg.tensorboard else None

    def log(self, record: dict) -> None:
        with naming(self.path):  # a full disk ends the run naming metrics.jsonl, so the disk to free
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()  # a killed run keeps everything up to its last step
        numbers = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
        if self.wandb:
            self.wandb.log(numbers, step=record["step"])
        if self.tb:
            for k, v in numbers.items():
                self.tb.add_scalar(k, v, record["step"])

    def close(self, failed: bool = False) -> None:
        """failed: the run ended with an error; wandb's run then shows it (finish() alone marks it finished).
        metrics.jsonl last: its close flushes again what a full disk refused, and that error must neither skip the
        dashboards' close nor hide the run's own error (the same full disk, named by log())."""
        if self.wandb:
            self.wandb.finish(exit_code=1 if failed else 0)
        if self.tb:
            self.tb.close()
        try:
            with naming(self.path):
                self.file.close()
        except OSError:
            if not failed:
                raise

    def _start_wandb(self, cfg: LoggerConfig, config: dict):
        import wandb

        mode = wandb_mode(cfg)
        id_file = self.run_dir / "wandb_id"  # one wandb run per job, continued on resume
        run_id = id_file.read_text().strip() if id_file.exists() else secrets.token_hex(4)
        id_file.write_text(run_id)
        # config values passed through as given: wandb.init checks them (mode: online|offline|disabled)
        kwargs: dict[str, Any] = dict(
            mode=mode,
            project=cfg.project,
            entity=cfg.entity,
            group=cfg.group,
            job_type=cfg.job_type,
            tags=[t[:64] for t in cfg.tags],  # wandb refuses longer tags (a sweep cell's long override)
            name=cfg.name or self.run_dir.name,
            config=config,
            id=run_id,
            resume="allow",
            dir=str(self.run_dir),
        )
        settings = wandb.Settings(init_timeout=60, silent=True)
        try:
            run = wandb.init(settings=settings, **kwargs)
        except Exception as e:  # network down or key rejected: keep the metrics, say so once
            if mode != "online":
                raise
            log.warning(
                "wandb online init failed (%s); logging offline to %s/wandb (upload later with `wandb sync`)",
                e,
                self.run_dir,
            )
            run = wandb.init(settings=settings, **{**kwargs, "mode": "offline"})
        log.info("wandb: %s run %s (%s)", mode, run.id, run.dir)
        return run

    def _start_tensorboard(self, resume_step: int):
        require("tensorboard", "logger.tensorboard=true")
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: TensorBoard hides the earlier events from there on, as metrics.jsonl drops its rows (a killed
        # run's steps past its checkpoint would otherwise be drawn twice, the curve going back)
        return SummaryWriter(
            log_dir=str(self.run_dir / "tensorboard"), purge_step=resume_step + 1 if resume_step else None
        )


class NullTracker:
    """What ranks other than 0 get."""

    def log(self, record: dict) -> None:
        pass

    def close(self, failed: bool = False) -> None:
        pass


def _truncate_after(path: Path, step: int) -> None:
    """Keep only records up to `step` (and no torn last line), rewritten atomically."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("step", 0) <= step:
            kept.append(line)
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(k + "\n" for k in kept))
    os.replace(tmp, path)


def perplexity(loss: float) -> float:
    return math.exp(loss) if loss < 50 else math.inf
