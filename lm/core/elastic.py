"""The global batch a resumed run keeps when its world size changes (elastic resume of lm train).

A pretraining step consumes samples [s*G, (s+1)*G) of the packed loader's global order, G = micro_batch_size x
grad_accum x world size (lm/data/packed.py), whatever the split of G into those three. So a run resumed on
another world size continues the same token stream, step for step, when it keeps G: the same command on M
ranks instead of N gets grad_accum = G / (micro_batch_size x M). The checkpoint's task state records G
(`samples_per_step`, lm/core/pretrain_task.py), and loading it refuses another G.

Validation keeps its sample the same way: the task state records the number of val windows a pass scores, fixed
when the run starts (train.eval_batches x micro_batch_size x world size), and a resume on M ranks scores the same
first windows of the val order (lm/data/packed.py), split evenly over the M ranks (kept_val_windows).
"""

import logging
from dataclasses import replace
from pathlib import Path

from lm.config_base import ConfigError

log = logging.getLogger("lm")

SAMPLES_PER_STEP = "samples_per_step"  # the task state's record of G


def kept_grad_accum(
    samples_per_step: int, micro_batch_size: int, world_size: int, where: str = "the checkpoint"
) -> int:
    """grad_accum that keeps `samples_per_step` sequences per step on `world_size` ranks of `micro_batch_size`,
    or a ConfigError naming the world sizes that can."""
    per_micro_step = micro_batch_size * world_size
    if samples_per_step % per_micro_step == 0:
        return samples_per_step // per_micro_step
    micro_steps = samples_per_step // micro_batch_size if samples_per_step % micro_batch_size == 0 else 0
    worlds = [w for w in range(1, micro_steps + 1) if micro_steps % w == 0][:8]
    fix = (
        f"resume on a world size that divides {micro_steps} ({', '.join(map(str, worlds))})"
        if worlds
        else "resume with the micro-batch size it was trained with"
    )
    raise ConfigError(
        f"{where} trained on {samples_per_step} sequences per step, which {world_size} rank(s) of "
        f"train.micro_batch_size={micro_batch_size} cannot split evenly: {fix}, or start a new run_dir "
        f"from the weights (lm export)"
    )


def keep_global_batch(train, run_dir: Path, world_size: int, is_main: bool):
    """`train` (a resolved TrainConfig) with grad_accum set to keep the global batch of the checkpoint this
    run_dir resumes from, when that differs from micro_batch_size x grad_accum x world_size. A peek on rank 0
    (the loaded checkpoint's own state refuses a mismatch later anyway), the same answer on every rank."""
    from lm.engine import dist as dist_utils

    saved = saved_samples_per_step(Path(run_dir) / "checkpoints") if is_main else None
    saved = dist_utils.broadcast_object(saved)
    asked = train.micro_batch_size * train.grad_accum * world_size
    if saved is None or saved == asked:
        return train
    grad_accum = kept_grad_accum(saved, train.micro_batch_size, world_size, f"{run_dir}'s last checkpoint")
    if is_main:
        log.warning(
            "resuming on %d rank(s): train.grad_accum %d -> %d keeps the run's %d sequences per step",
            world_size,
            train.grad_accum,
            grad_accum,
            saved,
        )
    return replace(train, grad_accum=grad_accum)


def saved_samples_per_step(root: Path) -> int | None:
    """G as the newest readable checkpoint under `root` records it (every checkpoint of a run has the same);
    None for a new run or checkpoints written before G was recorded."""
    from lm.core.checkpoint import load_rank_state, step_dirs

    for ckpt in step_dirs(root):
        try:
            loader = load_rank_state(ckpt / "rank00000.pt")["loader"]
        except Exception:  # noqa: BLE001 - damaged or partial: the resume itself names it or falls back
            continue
        return loader.get(SAMPLES_PER_STEP) if isinstance(loader, dict) else None
    return None


def kept_val_windows(saved: int, world_size: int, most: int) -> int:
    """The val windows a pass scores on `world_size` ranks for a run that recorded `saved`: `saved` itself when the
    ranks can split it evenly (each must run the same forwards: FSDP2 and ZeRO-3 gather parameters in every one),
    else the nearest multiple of world_size (the smaller on a tie: the cheaper pass), within [world_size, most]."""
    lower = saved // world_size * world_size
    nearest = lower if saved - lower <= lower + world_size - saved else lower + world_size
    return min(max(nearest, world_size), most // world_size * world_size)
