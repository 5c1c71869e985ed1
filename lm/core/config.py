"""Schemas of the training run: train.*, optim.*, sched.*, logger.* (conf/train.yaml, conf/optim/,
conf/sched/, conf/logger/), their validation, and the one derived value, grad_accum."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from lm.config_base import Choice, ConfigError


class Precision(Choice):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"  # dynamic loss scaling
    auto = "auto"  # bf16 where the device computes bf16 natively, else fp32 (lm/core/setup.py resolve_precision)


class OnNonfinite(Choice):
    stop = "stop"
    skip = "skip"


class Device(Choice):
    auto = "auto"  # cuda when available
    cpu = "cpu"
    cuda = "cuda"


class CompileMode(Choice):
    """torch.compile's mode (train.compile=true), its hyphens written as underscores."""

    default = "default"
    reduce_overhead = "reduce-overhead"  # CUDA graphs: a step's kernels replayed from one launch (GPU)
    max_autotune = "max-autotune"  # Triton's kernel choices benchmarked while compiling, and CUDA graphs
    max_autotune_no_cudagraphs = "max-autotune-no-cudagraphs"


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
    global_batch_size: int | None = None  # sequences per optimizer step = micro_batch_size * grad_accum * world
    # Batch-size ramp (Cramming, Geiping & Goldstein 2022; GPT-3): pretraining's micro-batches per step grow
    # linearly to grad_accum over the first batch_ramp_steps steps (from 1 when batch_ramp_steps >= grad_accum;
    # lm/core/pretrain_task.py ramp_accum); 0 = off.
    # The ramp's steps see fewer tokens: match a token budget with max_steps.
    batch_ramp_steps: int = 0
    seq_len: int = 128
    max_steps: int = 100
    grad_clip: float = 1.0  # max global gradient norm; 0 disables clipping
    precision: Precision = Precision.fp32
    compile: bool = False  # torch.compile the model
    compile_mode: CompileMode = CompileMode.default  # with compile: its mode (reduce_overhead: CUDA graphs)
    # float8 training (lm/engine/float8.py): false, or torchao (its convert_to_float8_training swaps the model's
    # Linears before the engine wraps it; CUDA with compute capability >= 8.9, the `kernels` extra)
    float8: bool | str = False
    device: Device = Device.auto
    log_interval: int = 10  # steps between metrics.jsonl lines
    eval_interval: int = 100  # steps between validation passes; 0 = only at the end
    eval_batches: int = 20  # micro-batches per validation pass (per rank; on a resume on another world size the
    # pass keeps the run's count of val windows: lm/core/pretrain_task.py ValSample)
    ckpt_interval: int = 100  # steps between checkpoints; 0 = only at the end
    keep_last: int = 3  # checkpoints kept (older ones are deleted once a newer one is complete)
    # Checkpoints written by a background thread from a CPU copy (DCP's async_save for FSDP2) while training goes
    # on; one write in flight, a checkpoint visible only once complete (docs/training.md). None: where the engine
    # can (single, DDP, FSDP2), synchronous on DeepSpeed; true on DeepSpeed is refused.
    async_checkpoint: bool | None = None
    # What a NaN/inf loss or gradient norm does (its update is skipped either way): stop, or skip (each logged).
    # Under fp16's loss scaler an inf gradient norm with a finite loss is an overflow the scaler handles instead.
    on_nonfinite: OnNonfinite = OnNonfinite.stop
    max_nonfinite: int = 10  # consecutive skipped steps before `skip` stops anyway
    peak_flops: float | None = None  # per-device peak FLOP/s for MFU; None = look the GPU up
    world_size: int | None = None  # expected number of processes (asserted); None = what the launcher says
    progress: bool = True  # tqdm bar on rank 0 (only on a terminal)
    # torch intra-op CPU threads per process; None = the process's own count (torch's default: all cores), also
    # after an earlier run in the process (a sweep cell, lm transfer's pretraining) set another
    threads: int | None = None
    # Steps between checks of the preemption flag (SIGTERM/SIGUSR1; a collective over ranks). Log steps check
    # it for free (it rides on their all-reduce); a signal is acted on within this many steps, so keep their
    # time below the scheduler's grace period (SLURM's KillWait: 30 s by default) plus a checkpoint's.
    stop_check_interval: int = 10
    # Steps whose batches a background thread prepares ahead (pinned memory on CUDA); 0 = fetch in the loop.
    prefetch: int = 1
    # GLUE probes in the loop (lm/eval/probe.py): every probe_interval steps and at the end, a linear probe on
    # the frozen model's pooled features of the first probe_train_examples train rows of each task, scored
    # on its first probe_dev_examples dev rows (0 = all) with the task's official metric. 0 = off.
    probe_interval: int = 0
    probe_tasks: list[str] = field(default_factory=lambda: ["sst2", "mrpc", "stsb", "cola"])
    probe_train_examples: int = 1000
    probe_dev_examples: int = 500
    probe_max_len: int = 128  # tokens per example (longest-first truncation, as lm finetune)
    # The LM Evaluation Harness in the loop (lm/eval/harness_loop.py): these tasks (e.g. [local_sst2,
    # local_wikitext2]; any lm eval task) every eval_tasks_interval steps (0 = at the last step only) and at the
    # end, eval_tasks_limit examples each (null = all); decoders and encoder-decoders. [] = off.
    eval_tasks: list[str] = field(default_factory=list)
    eval_tasks_interval: int = 0
    eval_tasks_limit: int | None = 100
    # The share of training time each of those two may take: a pass due at an interval step is postponed while it
    # would exceed it (lm/eval/pacing.py); the last step's pass always runs. 0 = at every interval.
    downstream_budget: float = 0.05


@dataclass
class OptimConfig:
    """AdamW (Loshchilov & Hutter 2019); weight decay on matrices, none on vectors (norms, biases) nor on embedding
    tables unless decay_embeddings (lm/core/optim.py)."""

    lr: float = 6e-4  # peak learning rate; the schedule multiplies it
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    weight_decay: float = 0.1
    decay_embeddings: bool = False  # True: embedding tables are decayed too (nanoGPT's rule for Linear models)
    fused: bool | None = None  # None = fused where torch has the kernel (CPU, CUDA): skips NaN steps on the device


@dataclass
class SchedConfig:
    """Learning-rate multiplier as a pure function of the step (lm.core.optim.lr_multiplier)."""

    kind: Schedule = Schedule.cosine
    warmup_steps: int = 100  # linear warmup: step s (0-based) at (s + 1) / (warmup_steps + 1) of optim.lr
    min_lr_ratio: float = 0.1  # floor of the decay (x optim.lr), reached at step max_steps: one past the last
    decay_fraction: float = 0.2  # wsd: last fraction of the steps that decays (Hägele et al. 2024)


@dataclass
class LoggerConfig:
    """Dashboards; metrics.jsonl in the run directory is always written and is the source of truth."""

    wandb: bool = False
    tensorboard: bool = False
    project: str = "lm"
    entity: str | None = None
    group: str | None = None
    job_type: str = "pretrain"
    tags: list[str] = field(default_factory=list)
    name: str | None = None  # None = the run directory's name
    mode: str | None = (
        None  # online | offline | disabled (wandb's own check); None = online with an API key, else offline
    )


def validate_train(cfg: TrainConfig, optim: OptimConfig, sched: SchedConfig) -> None:
    """Fail before anything is built (types and choices are checked by the schema already); every
    message names the field, the value and the fix."""

    def bad(field_name, why):
        raise ConfigError(f"train.{field_name}={getattr(cfg, field_name)!r} {why}")

    for name in (
        "micro_batch_size",
        "grad_accum",
        "seq_len",
        "max_steps",
        "log_interval",
        "eval_batches",
        "keep_last",
        "stop_check_interval",
    ):
        if not isinstance(getattr(cfg, name), int) or getattr(cfg, name) < 1:
            bad(name, "must be a positive integer")
    if not isinstance(cfg.batch_ramp_steps, int) or cfg.batch_ramp_steps < 0:
        bad("batch_ramp_steps", "must be an integer >= 0 (0 = no ramp)")
    for name in ("eval_interval", "ckpt_interval"):
        if getattr(cfg, name) < 0:
            bad(name, "must be >= 0 (0 = only at the end of the run)")
    if not _finite(cfg.grad_clip) or cfg.grad_clip < 0:
        bad("grad_clip", "must be a finite number >= 0 (0 disables clipping)")
    if cfg.peak_flops is not None and (not _finite(cfg.peak_flops) or cfg.peak_flops <= 0):
        bad("peak_flops", "must be a finite number > 0 (FLOP/s per device), or null to look the GPU up")
    if cfg.float8 not in (False, "torchao"):
        bad("float8", "is not one of false, torchao (float8 matmuls from torchao: train.float8=torchao)")
    if cfg.compile_mode != CompileMode.default and not cfg.compile:
        mode = getattr(cfg.compile_mode, "name", cfg.compile_mode)  # the name an override writes
        raise ConfigError(f"train.compile_mode={mode} is torch.compile's mode: add train.compile=true, or drop it")
    if cfg.prefetch < 0:
        bad("prefetch", "must be >= 0 (steps prepared ahead; 0 = none)")
    if cfg.probe_interval < 0:
        bad("probe_interval", "must be >= 0 (0 = no GLUE probes)")
    if cfg.probe_interval:
        _validate_probe(cfg)
    if cfg.eval_tasks_interval < 0:
        bad("eval_tasks_interval", "must be >= 0 (0 = the harness tasks at the last step only)")
    if cfg.eval_tasks_limit is not None and cfg.eval_tasks_limit < 1:
        bad("eval_tasks_limit", "must be a positive number of examples per task, or null for all")
    if not (_finite(cfg.downstream_budget) and 0 <= cfg.downstream_budget < 1):
        bad(
            "downstream_budget",
            "must be in [0, 1): the share of training time the probes / harness tasks may take each "
            "(0.05 = 5%; 0 = at every interval)",
        )
    if cfg.threads is not None and cfg.threads < 1:
        bad("threads", "must be a positive integer, or null for torch's default")
    _validate_sched(sched)
    _validate_optim(optim)


def _validate_probe(cfg: TrainConfig) -> None:
    """The numbers; lm/eval/probe.py checks the task names (lm.core knows no GLUE)."""
    if cfg.probe_train_examples < 2:
        raise ConfigError(
            f"train.probe_train_examples={cfg.probe_train_examples} must be >= 2 (train rows per probed task)"
        )
    if cfg.probe_dev_examples < 0:
        raise ConfigError(
            f"train.probe_dev_examples={cfg.probe_dev_examples} must be >= 0 (dev rows per probed task; 0 = all)"
        )
    if cfg.probe_max_len < 4:
        raise ConfigError(f"train.probe_max_len={cfg.probe_max_len} must be >= 4 (tokens per probed example)")


def short_schedule(cfg: TrainConfig, sched: SchedConfig) -> str | None:
    """A warning when the run ends inside its warmup: it never reaches optim.lr nor decays, so variants of a
    shrunk sweep train alike (the lr, not the variant, decides). None when the schedule fits."""
    if sched.warmup_steps and cfg.max_steps <= sched.warmup_steps:
        return (
            f"train.max_steps={cfg.max_steps} <= sched.warmup_steps={sched.warmup_steps}: the run ends inside "
            f"its warmup and never reaches optim.lr; lower sched.warmup_steps (e.g. "
            f"sched.warmup_steps={cfg.max_steps // 10}) or raise train.max_steps"
        )
    return None


def _finite(x) -> bool:
    # NaN compares False with everything, so `x <= 0` alone lets nan (and inf) through to torch
    return isinstance(x, (int, float)) and math.isfinite(x)


def _validate_sched(sched: SchedConfig) -> None:
    if sched.warmup_steps < 0:
        raise ConfigError(f"sched.warmup_steps={sched.warmup_steps} must be >= 0 (0 = no warmup)")
    if not _finite(sched.min_lr_ratio) or not 0.0 <= sched.min_lr_ratio <= 1.0:
        raise ConfigError(
            f"sched.min_lr_ratio={sched.min_lr_ratio} must be a number in [0, 1] "
            f"(the floor of the decay as a fraction of optim.lr)"
        )
    if not _finite(sched.decay_fraction) or not 0.0 < sched.decay_fraction <= 1.0:
        raise ConfigError(
            f"sched.decay_fraction={sched.decay_fraction} must be a number in (0, 1] "
            f"(wsd: the last fraction of the steps that decays)"
        )


def _validate_optim(optim: OptimConfig) -> None:
    if not _finite(optim.lr) or optim.lr <= 0:
        raise ConfigError(f"optim.lr={optim.lr} must be a finite number > 0, e.g. optim.lr=6e-4")
    betas = list(optim.betas)
    if len(betas) != 2 or not all(_finite(b) and 0.0 <= b < 1.0 for b in betas):
        raise ConfigError(
            f"optim.betas={betas} must be two numbers, each in [0, 1) (Adam's moment decay "
            f"rates), e.g. optim.betas=[0.9,0.95]"
        )
    if not _finite(optim.eps) or optim.eps <= 0:
        raise ConfigError(f"optim.eps={optim.eps} must be a finite number > 0, e.g. optim.eps=1e-8")
    if not _finite(optim.weight_decay) or optim.weight_decay < 0:
        raise ConfigError(
            f"optim.weight_decay={optim.weight_decay} must be a finite number >= 0 (0 disables weight decay)"
        )


def resolve_batch(cfg: TrainConfig, world_size: int) -> TrainConfig:
    """The TrainConfig with grad_accum derived from global_batch_size when that is set (a copy; the
    composed config is never written back); the message says which sizes divide."""
    from dataclasses import replace

    if cfg.global_batch_size is not None:
        cfg = replace(cfg, grad_accum=_global_grad_accum(cfg, world_size))
    if cfg.batch_ramp_steps and cfg.grad_accum < 2:
        raise ConfigError(
            f"train.batch_ramp_steps={cfg.batch_ramp_steps} ramps micro-batches per step from 1 to "
            f"train.grad_accum, which is {cfg.grad_accum}: set train.grad_accum (or train.global_batch_size) to "
            f"the final batch, e.g. train.grad_accum=8, or train.batch_ramp_steps=0"
        )
    return cfg


def _global_grad_accum(cfg: TrainConfig, world_size: int) -> int:
    per_step = cfg.micro_batch_size * world_size
    assert cfg.global_batch_size is not None
    if cfg.global_batch_size % per_step:
        ok = [per_step * k for k in range(1, 5)]
        raise ConfigError(
            f"train.global_batch_size={cfg.global_batch_size} is not divisible by train.micro_batch_size "
            f"({cfg.micro_batch_size}) x world size ({world_size}) = {per_step}; use a multiple such as {ok}, "
            f"or change train.micro_batch_size"
        )
    grad_accum = cfg.global_batch_size // per_step
    if cfg.grad_accum not in (1, grad_accum):
        raise ConfigError(
            f"train.grad_accum={cfg.grad_accum} contradicts train.global_batch_size={cfg.global_batch_size} "
            f"(which gives {grad_accum} at world size {world_size}); set only one of them"
        )
    return grad_accum
