"""Schemas of the training run: train.*, optim.*, sched.*, logger.* (conf/train.yaml, conf/optim/,
conf/sched/, conf/logger/), their validation, and the one derived value, grad_accum."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from lm.config import Choice, ConfigError


class Precision(Choice):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"  # dynamic loss scaling


class OnNonfinite(Choice):
    stop = "stop"
    skip = "skip"


class Device(Choice):
    auto = "auto"  # cuda when available
    cpu = "cpu"
    cuda = "cuda"


class Schedule(Choice):
    cosine = "cosine"
    linear = "linear"
    constant = "constant"
    wsd = "wsd"  # warmup-stable-decay (Hägele et al. 2024)


@dataclass
class TrainConfig:
    """The training run's single source of truth for batch size, accumulation, clipping and precision.

    Engines read these from the typed config (DeepSpeed's JSON is built from them in lm/engine/ds.py).
    """

    micro_batch_size: int = 8  # sequences per rank per forward/backward
    grad_accum: int = 1  # micro-steps per optimizer step; with global_batch_size, use resolve_batch()
    global_batch_size: Optional[int] = None  # sequences per optimizer step = micro_batch_size * grad_accum * world
    seq_len: int = 128
    max_steps: int = 100
    grad_clip: float = 1.0  # max global gradient norm; 0 disables clipping
    precision: Precision = Precision.fp32
    compile: bool = False  # torch.compile the model
    device: Device = Device.auto
    log_interval: int = 10  # steps between metrics.jsonl lines
    eval_interval: int = 100  # steps between validation passes; 0 = only at the end
    eval_batches: int = 20  # micro-batches per validation pass (per rank)
    ckpt_interval: int = 100  # steps between checkpoints; 0 = only at the end
    keep_last: int = 3  # checkpoints kept (older ones are deleted once a newer one is complete)
    on_nonfinite: OnNonfinite = OnNonfinite.stop  # what a NaN/inf loss does
    max_nonfinite: int = 10  # consecutive skipped steps before `skip` stops anyway
    peak_flops: Optional[float] = None  # per-device peak FLOP/s for MFU; None = look the GPU up
    world_size: Optional[int] = None  # expected number of processes (asserted); None = what the launcher says
    progress: bool = True  # tqdm bar on rank 0 (only on a terminal)
    threads: Optional[int] = None  # torch intra-op CPU threads per process; None = torch's default (all cores)


@dataclass
class OptimConfig:
    """AdamW (Loshchilov & Hutter 2019); no weight decay on norms, biases, and embeddings unless decay_embeddings."""

    lr: float = 6e-4  # peak learning rate; the schedule multiplies it
    betas: List[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    weight_decay: float = 0.1
    decay_embeddings: bool = False  # True: embedding tables are decayed too (nanoGPT: every matrix)
    fused: Optional[bool] = None  # None = torch's default for the device


@dataclass
class SchedConfig:
    """Learning-rate multiplier as a pure function of the step (lm.core.optim.lr_multiplier)."""

    kind: Schedule = Schedule.cosine
    warmup_steps: int = 100  # linear warmup from 0
    min_lr_ratio: float = 0.1  # floor of the decay, as a fraction of optim.lr
    decay_fraction: float = 0.2  # wsd: last fraction of the steps that decays (Hägele et al. 2024)


@dataclass
class LoggerConfig:
    """Dashboards; metrics.jsonl in the run directory is always written and is the source of truth."""

    wandb: bool = False
    tensorboard: bool = False
    project: str = "lm"
    entity: Optional[str] = None
    group: Optional[str] = None
    job_type: str = "pretrain"
    tags: List[str] = field(default_factory=list)
    name: Optional[str] = None  # None = the run directory's name
    mode: Optional[str] = None  # online | offline | disabled (wandb's own check); None = online with an API key, else offline


def validate_train(cfg: TrainConfig, optim: OptimConfig, sched: SchedConfig) -> None:
    """Fail before anything is built (types and choices are checked by the schema already); every
    message names the field and the fix."""
    def bad(field_name, why):
        raise ConfigError(f"train.{field_name}={getattr(cfg, field_name)!r} {why}")

    for name in ("micro_batch_size", "grad_accum", "seq_len", "max_steps", "log_interval", "eval_batches", "keep_last"):
        if not isinstance(getattr(cfg, name), int) or getattr(cfg, name) < 1:
            bad(name, "must be a positive integer")
    if cfg.grad_clip < 0:
        bad("grad_clip", "must be >= 0 (0 disables clipping)")
    if cfg.threads is not None and cfg.threads < 1:
        bad("threads", "must be a positive integer, or null for torch's default")
    if sched.warmup_steps < 0 or not 0.0 <= sched.min_lr_ratio <= 1.0 or not 0.0 < sched.decay_fraction <= 1.0:
        raise ConfigError("sched.warmup_steps must be >= 0, sched.min_lr_ratio in [0, 1], sched.decay_fraction in (0, 1]")
    if optim.lr <= 0 or len(optim.betas) != 2 or optim.weight_decay < 0:
        raise ConfigError(f"optim: lr={optim.lr} must be > 0, betas={list(optim.betas)} two numbers, "
                          f"weight_decay={optim.weight_decay} >= 0")


def resolve_batch(cfg: TrainConfig, world_size: int) -> TrainConfig:
    """The TrainConfig with grad_accum derived from global_batch_size when that is set (a copy; the
    composed config is never written back); the message says which sizes divide."""
    from dataclasses import replace

    if cfg.global_batch_size is None:
        return cfg
    per_step = cfg.micro_batch_size * world_size
    if cfg.global_batch_size % per_step:
        ok = [per_step * k for k in range(1, 5)]
        raise ConfigError(
            f"train.global_batch_size={cfg.global_batch_size} is not divisible by train.micro_batch_size "
            f"({cfg.micro_batch_size}) x world size ({world_size}) = {per_step}; use a multiple such as {ok}, "
            f"or change train.micro_batch_size")
    grad_accum = cfg.global_batch_size // per_step
    if cfg.grad_accum not in (1, grad_accum):
        raise ConfigError(
            f"train.grad_accum={cfg.grad_accum} contradicts train.global_batch_size={cfg.global_batch_size} "
            f"(which gives {grad_accum} at world size {world_size}); set only one of them")
    return replace(cfg, grad_accum=grad_accum)
