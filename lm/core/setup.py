"""What every app does before its loop: pick and build the engine, seed, quiet the other ranks, log to a file.

Shared by lm train and lm finetune, so neither imports the other.
"""

import logging
import sys
from pathlib import Path

from lm.config_base import ConfigError
from lm.core.config import Precision, TrainConfig

log = logging.getLogger("lm")


def engine_class(cfg, get_class):
    """The class an engine node names; `cfg` is the typed run config or finetuning job."""
    target = getattr(cfg.engine, "_target_", None) if cfg.engine else None
    if not target:
        raise ConfigError(
            "engine has no _target_; pick one with engine=single|ddp|zero1|zero2|zero3|zero3_offload|fsdp2"
        )
    return get_class(target)


def make_engine(cfg, instantiate, train_cfg: TrainConfig, dist):
    """The engine `cfg.engine` names (`cfg`: the typed run or finetuning job), for the run's train config;
    what it cannot do with that config is refused here, before anything is built."""
    if train_cfg.precision in (Precision.auto, Precision.bf16):  # the device decides (or is warned about)
        train_cfg = resolve_precision(train_cfg, dist.device, dist.is_main)
    factory = instantiate(cfg.engine)
    try:
        engine = factory(train=train_cfg, dist=dist)
    except TypeError as e:  # an option the engine class does not take
        raise ConfigError(f"engine ({cfg.engine._target_}): {e}; see conf/engine/ for its options") from None
    if train_cfg.on_nonfinite == "skip" and engine.format == "deepspeed":
        raise ConfigError("train.on_nonfinite=skip does not work with DeepSpeed engines; use train.on_nonfinite=stop")
    if getattr(train_cfg, "async_checkpoint", None) is True and not engine.writes_async:
        raise ConfigError(
            "train.async_checkpoint=true does not work with DeepSpeed engines (their checkpoints are "
            "written synchronously); use train.async_checkpoint=false"
        )
    return engine


def resolve_precision(train_cfg, device, say: bool):
    """train.precision=auto as bf16 where the device computes bf16 natively, else fp32 (a copy; the composed config
    keeps `auto`, so a run resumed on other hardware is the same run). An explicit bf16 on a CPU without bf16
    units is kept, with a warning: it trains, several times slower than fp32."""
    from dataclasses import replace

    from lm.engine.dist import computes_bf16

    native = computes_bf16(device)
    if train_cfg.precision == Precision.auto:
        chosen = Precision.bf16 if native else Precision.fp32
        if say:
            log.info("train.precision=auto: %s (%s %s bf16 units)", chosen, device.type, "has" if native else "lacks")
        return replace(train_cfg, precision=chosen)
    if train_cfg.precision == Precision.bf16 and device.type == "cpu" and not native and say:
        log.warning(
            "train.precision=bf16 on a CPU without bf16 units (no AVX512-BF16 or AMX) runs several times slower "
            "than fp32; train.precision=auto picks fp32 here"
        )
    return train_cfg


_process_threads: int | None = None  # what train.threads=null runs on: the count before any run set its own


def use_threads(threads: int | None) -> None:
    """torch's intra-op CPU threads for a run: `threads`, or with None the process's own count. torch keeps a
    count for the whole process, so without this a sweep cell or lm transfer's finetuning (train.threads=null)
    ran on the count an earlier run of the process had set, and its numbers were that count's, not its own
    command's (the thread count decides a matmul's summation order)."""
    import torch

    global _process_threads
    if _process_threads is None:
        _process_threads = torch.get_num_threads()
    torch.set_num_threads(threads or _process_threads)


def share_threads(threads: int) -> None:
    """The process's own count from now on (lm transfer --parallel: its share of the cores beside a lane)."""
    import torch

    global _process_threads
    _process_threads = threads
    torch.set_num_threads(threads)


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global generators. `seed` is the run's seed + the rank (Session.build), which
    passes torch.manual_seed's largest (2**64-1, lm.config_base.MAX_SEED) on rank 1 of seed=2**64-1: it wraps."""
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed % 2**64)


def quiet_other_ranks(rank: int) -> None:
    """INFO lines from rank 0 alone: every other rank's would repeat them."""
    if rank != 0:
        logging.getLogger().setLevel(logging.WARNING)
        log.setLevel(logging.WARNING)


# Lines for <run_dir>/train.log alone: the step lines a terminal's progress bar shows instead of printing them.
FILE_ONLY = logging.getLogger("lm.file_only")
FILE_ONLY.propagate = False


class RunLog(logging.FileHandler):
    """train.log. A write it cannot make (a full disk) is said once, in one line naming the file, and the file is
    left from there on: logging's default prints a traceback for every line after it, and the run goes on (its
    records are metrics.jsonl, whose own failure ends the run naming it)."""

    failed = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.failed:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        if not isinstance(error, OSError) or self.failed:
            return super().handleError(record)
        self.failed = True  # first: the warning below passes through this handler too
        log.warning(
            "%s cannot be written (%s); it ends here, the terminal and metrics.jsonl go on: free space on that disk",
            self.baseFilename,
            error.strerror or error,
        )

    def close(self) -> None:
        try:
            super().close()  # flushes again what the disk refused
        except OSError:
            if not self.failed:
                raise


def log_to_file(path: Path) -> logging.Handler:
    handler = RunLog(path)
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(levelname)s] %(message)s"))
    log.addHandler(handler)
    FILE_ONLY.addHandler(handler)
    return handler


def stop_logging_to_file(handler: logging.Handler) -> None:
    log.removeHandler(handler)
    FILE_ONLY.removeHandler(handler)
    handler.close()
