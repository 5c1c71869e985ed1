"""Parameter groups, AdamW, and learning-rate schedules as pure functions of the step.

Weight decay applies to every matrix (a parameter of 2 or more dimensions: Linear weights, and the zoo's own, such
as an RNN's recurrent weights, a score's W, a synthesizer's R, a convolution's kernel, PKM's keys) except the
embedding tables (nn.Embedding, nn.EmbeddingBag: token and position tables, PKM's values, and a head tied to a
table); vectors and scalars (norm gains and biases, biases, ReZero's alpha, per-head mixing logits) are never
decayed. That is GPT-3's rule (Brown et al. 2020), nanoGPT's `dim >= 2` rule but for the tables (nanoGPT decays
them too: optim.decay_embeddings=true), and Hugging Face Trainer's (all but biases and norm weights) but for the
tables: decaying a gain or a bias towards zero has no regularising meaning, and an embedding table is a lookup
whose rows see few updates (each decays at every step, its gradient only when its token occurs). Deciding by shape
rather than by module type means a new module's matrix is decayed without being listed here.
"""

import math

import torch
from torch import nn

from lm.core.config import OptimConfig, SchedConfig


def param_groups(model: nn.Module, weight_decay: float, decay_embeddings: bool = False) -> list[dict]:
    """Two AdamW groups: decayed matrices, and everything else (tied weights counted once).

    decay_embeddings=True also decays the embedding tables (and so a head tied to one): nanoGPT's
    rule, every matrix decayed.
    """
    tables = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding | nn.EmbeddingBag)}
    decay, no_decay = [], []
    for p in model.parameters():  # .parameters() yields a tied tensor once
        if p.requires_grad:
            # A Linear weight tied to a table (the LM head) counts as the table.
            matrix = p.dim() >= 2 and (decay_embeddings or id(p) not in tables)
            (decay if matrix else no_decay).append(p)
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
