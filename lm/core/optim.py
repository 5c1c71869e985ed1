"""Parameter groups, AdamW, and learning-rate schedules as pure functions of the step.

Weight decay applies to matrices of Linear layers only: norms, biases and embeddings are left
undecayed (as in GPT-3, Brown et al. 2020; nanoGPT also decays the embeddings: optim.decay_embeddings=true):
decaying a gain or a bias towards zero has no regularising meaning, and embeddings are lookups whose rows
see few updates.
"""

import math

import torch
from torch import nn

from lm.core.config import OptimConfig, SchedConfig


def param_groups(model: nn.Module, weight_decay: float, decay_embeddings: bool = False) -> list[dict]:
    """Two AdamW groups: decayed Linear weights, and everything else (tied weights counted once).

    decay_embeddings=True also decays the embedding tables (and so a head tied to one): nanoGPT's
    rule, every matrix decayed.
    """
    linear_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    embedding_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    # Without decay_embeddings, a Linear weight tied to an embedding (the LM head) counts as an embedding.
    decay_ids = linear_ids | embedding_ids if decay_embeddings else linear_ids - embedding_ids
    decay, no_decay = [], []
    for p in model.parameters():  # .parameters() yields a tied tensor once
        if p.requires_grad:
            (decay if id(p) in decay_ids else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


FUSED_DEVICES = ("cpu", "cuda")  # where torch has a fused AdamW kernel


def adamw(model: nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    """torch AdamW on the model's (possibly sharded) parameters; lr is set every step by the loop.

    Fused by default where torch has the kernel: besides being one kernel per step, it is the AdamW that
    can skip a NaN/inf step on the device (`found_inf`, lm/engine/base.py), so the loop needs no host sync.
    """
    groups = param_groups(model, cfg.weight_decay, cfg.decay_embeddings)
    fused = cfg.fused
    if fused is None:
        fused = all(p.device.type in FUSED_DEVICES and p.is_floating_point() for g in groups for p in g["params"])
    beta1, beta2 = cfg.betas  # two: lm.core.config checks it
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(beta1, beta2), eps=cfg.eps, fused=fused)


def lr_multiplier(step: int, sched: SchedConfig, total_steps: int) -> float:
    """Multiplier of the peak learning rate at `step` (0-based optimizer step).

    Warmup is linear from 1/(warmup+1) so the first step already moves (Hugging Face's warmup starts at 0: a
    step that moves nothing), and reaches 1 at step `warmup`. The decay reaches min_lr_ratio at step total_steps,
    the step after the last, as Hugging Face's get_linear_schedule_with_warmup and its cosine do: the last step
    taken (total_steps - 1) still moves, where a floor of 0 reached at it would be a step that moves nothing.
    """
    if step < sched.warmup_steps:
        return (step + 1) / (sched.warmup_steps + 1)
    floor = sched.min_lr_ratio
    if sched.kind == "constant":
        return 1.0
    if sched.kind == "wsd":
        decay_start = max(sched.warmup_steps, total_steps - math.ceil(sched.decay_fraction * total_steps))
        if step < decay_start:
            return 1.0
        return 1.0 - (1.0 - floor) * _progress(step, decay_start, total_steps)
    progress = _progress(step, sched.warmup_steps, total_steps)
    if sched.kind == "linear":
        return 1.0 - (1.0 - floor) * progress
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))  # cosine


def _progress(step: int, start: int, total_steps: int) -> float:
    """Fraction of the decay phase done, 0 at `start`, 1 at total_steps (one past the last step taken)."""
    span = max(1, total_steps - start)
    return min(1.0, max(0.0, (step - start) / span))
