"""What may change when a run resumes (one list per app), and the check that refuses everything else.

Resuming continues the checkpoint's weights, and config.yaml, the report and lm export then describe
those weights by the new command's config. So every field that changes what is computed (the model,
the data and objective, the optimizer, precision, seed, ...) must equal the checkpoint's
config.yaml; only the fields of RESUMABLE (lm train) or FINETUNE_RESUMABLE (each task/seed pair of
lm finetune) may differ, and each difference is logged.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path

from lm.config_base import ConfigError

log = logging.getLogger("lm")

# Fields (or whole sections: a prefix matches every key below it) that may change on resume.
RESUMABLE = (
    # how long and how often: the run continues to the new max_steps (the LR schedule is a function of
    # the step and max_steps, so a longer run also stretches the rest of the schedule)
    "train.max_steps",
    "train.log_interval",
    "train.eval_interval",
    "train.eval_batches",
    "train.ckpt_interval",
    "train.keep_last",
    "train.async_checkpoint",
    # where and how fast it runs, not what it computes: the same sums, though threads, device, world size and kernel
    # add them in another order, so a run resumed with other ones continues up to rounding, not bit for bit
    "train.progress",
    "train.threads",
    "train.device",
    "train.compile",
    "train.compile_mode",
    "train.peak_flops",
    "train.world_size",
    "model.linear",  # which kernel runs fp32 CPU matmuls: the same products (runs from before auto record torch)
    "train.stop_check_interval",
    "train.prefetch",
    # the GLUE probes and harness tasks read the model and change nothing it computes (lm/eval/)
    "train.probe_interval",
    "train.probe_tasks",
    "train.probe_train_examples",
    "train.probe_dev_examples",
    "train.probe_max_len",
    "train.eval_tasks",
    "train.eval_tasks_interval",
    "train.eval_tasks_limit",
    "train.downstream_budget",
    # recovering from a NaN/inf loss: what lm/core/loop.py's LossDiverged message advises changing
    "train.on_nonfinite",
    "train.max_nonfinite",
    "optim.lr",
    "sched.warmup_steps",
    # bookkeeping
    "run_dir",
    "resume",
    "logger",
    # where the prepared data is found or made; the loader's own state (lm/data/packed.py
    # load_state_dict) refuses data that would give another sample order
    "data.dir",
    "data.mirror",
    "data.workers",
    # the engine class and world size may change too (elastic resume: Checkpointer.load in
    # lm/core/checkpoint.py reshards, or refuses what it cannot in one line); these options change speed and
    # memory, not the maths (engine.config, DeepSpeed's JSON, and engine.cpu_adam must match, but for the
    # ZeRO stage: zero1 -> zero3 is resharded as zero1 -> fsdp2 -> zero3 would be)
    "engine._target_",
    "engine.config.zero_optimization.stage",
    "engine._partial_",
    "engine.bucket_cap_mb",
    "engine.find_unused_parameters",
    "engine.reshard_after_forward",
    "engine.shm_comm",
)

# lm finetune resumes each unfinished task/seed pair from its own checkpoint, whose config.yaml is the job's
# config with the pair's own settings under `task` (tasks.<name>), its `seed`, and under `model` the
# backbone's model as built (lm/glue/run.py pair_config). The pair's result must equal an uninterrupted
# run's, so unlike lm train nothing that shapes its schedule may change (optim.lr, tasks.<name>.lr and
# .epochs, sched.*, weight decay, init, tokenizer, max_len, ...); a pair that should train with other values
# starts over once its directory is deleted.
FINETUNE_RESUMABLE = (
    "train.log_interval",
    "train.ckpt_interval",
    "train.keep_last",
    "train.progress",
    "train.threads",
    "train.device",
    "train.compile",
    "train.compile_mode",
    "train.world_size",
    "model.linear",
    "train.on_nonfinite",
    "train.max_nonfinite",
    "run_dir",
    "resume",
    "logger",
    "skip_missing",
    "task.seeds",  # which other seeds run; this pair's seed is `seed`
    "glue.data_root",
    "glue.pad_to_multiple_of",  # the batches' padding: the same results (tests/test_glue_padding.py)
    "task.data_root",  # where the same TSVs are found
    "engine._target_",
    "engine.config.zero_optimization.stage",
    "engine._partial_",
    "engine.bucket_cap_mb",
    "engine.find_unused_parameters",
    "engine.reshard_after_forward",
    "engine.shm_comm",
)


def resumable(key: str, may_change: Sequence[str] = RESUMABLE) -> bool:
    return any(key == f or key.startswith(f + ".") for f in may_change)


def config_changes(
    saved: dict, requested: dict, may_change: Sequence[str] = RESUMABLE, defaults: dict | None = None
) -> tuple[list[str], list[str]]:
    """(refused, allowed) differences between two plain config dicts, as 'key: old -> new' lines.
    A key on one side only is skipped: a field added to a schema after the run started (its default
    keeps the old behaviour), or one of another component class, whose `_target_` differs anyway;
    unless `defaults` (flat 'a.b' keys) holds its default: then the run had that value, and a requested
    key set to anything else is a change."""
    old, new = _flatten(saved), _flatten(requested)
    old |= {k: v for k, v in (defaults or {}).items() if k in new and k not in old}
    changed = {key: (old[key], new[key]) for key in old.keys() & new.keys() if old[key] != new[key]}
    changed |= _filled_nodes(old, new)
    refused, allowed = [], []
    for key in sorted(changed):
        before, after = changed[key]
        (allowed if resumable(key, may_change) else refused).append(f"{key}: {before!r} -> {after!r}")
    return refused, allowed


def _filled_nodes(old: dict, new: dict) -> dict:
    """{key: (old, new)} for a node null on one side and set on the other (flat keys): an empty slot given an
    option (model/block=pkm on a run without one) or an option set back to null. Such a node is a key on one
    side and a prefix of keys on the other, so the key-by-key comparison never sees it; named by the option's
    _target_, which is what changed."""

    def filled(flat: dict, key: str):
        below = {k[len(key) + 1 :]: v for k, v in flat.items() if k.startswith(key + ".")}
        return below.get("_target_", below) if below else None

    out = {}
    for key in old.keys() - new.keys():
        if old[key] is None and (after := filled(new, key)) is not None:
            out[key] = (None, after)
    for key in new.keys() - old.keys():
        if new[key] is None and (before := filled(old, key)) is not None:
            out[key] = (before, None)
    return out


def _flatten(node, prefix: str = "") -> dict:
    if not isinstance(node, dict):
        return {prefix: node}
    out = {}
    for k, v in node.items():
        out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def check_resume(
    ckpt: Path,
    config_yaml: str,
    max_steps: int | None,
    dist,
    may_change: Sequence[str] = RESUMABLE,
    start_over: str = "start a new run (run_dir=<a new directory>)",
) -> None:
    """Before `ckpt` is loaded: refuse a config that differs from the checkpoint's in a field outside
    `may_change` (RESUMABLE: lm train; FINETUNE_RESUMABLE: an lm finetune task/seed pair), or a
    train.max_steps below the checkpoint's step; say when there is nothing left to train. `start_over`
    is the advice for training with the new values instead. Rank 0 reads the files, every rank raises
    the same ConfigError."""
    from lm.engine import dist as dist_utils

    error = None
    if dist.is_main:
        try:
            check_checkpoint_config(Path(ckpt), config_yaml, max_steps, may_change, start_over)
        except ConfigError as e:
            error = str(e)
    error = dist_utils.broadcast_object(error)
    if error:
        raise ConfigError(error)


def check_checkpoint_config(
    ckpt: Path, config_yaml: str, max_steps: int | None, may_change: Sequence[str], start_over: str
) -> None:
    """check_resume's check, in this process alone (lm finetune's up-front check of its pairs, on rank 0)."""
    saved_yaml = _trusted_file(ckpt, "config.yaml")
    if saved_yaml is not None:  # None: a damaged checkpoint, which Checkpointer.load names or falls back from
        refuse_changes(saved_yaml, config_yaml, may_change, f"resume {ckpt}", ckpt / "config.yaml", start_over)
    step = _step(ckpt)
    if step is None or max_steps is None:  # None: lm finetune, whose steps follow from the (compared) task
        return
    if max_steps < step:
        raise ConfigError(
            f"train.max_steps={max_steps} is below the step of {ckpt} ({step}): nothing can be "
            f"trained. To continue this run set train.max_steps above {step}; to train a shorter "
            f"run start a new one (run_dir=<a new directory>)"
        )
    if max_steps == step:
        log.warning(
            "%s is at step %d = train.max_steps: the run is complete, nothing to train. To continue it, "
            "raise train.max_steps",
            ckpt,
            step,
        )


def refuse_changes(
    saved_yaml: str,
    config_yaml: str,
    may_change: Sequence[str],
    what: str,
    where,
    start_over: str,
    defaults: dict | None = None,
) -> None:
    """Raise a ConfigError listing the fields outside `may_change` where config_yaml differs from saved_yaml
    (the config of `where`; a field it predates counts as its value in `defaults`); log the allowed differences."""
    from omegaconf import OmegaConf

    from lm.model.upgrade import upgrade_for_comparison

    saved = OmegaConf.to_container(OmegaConf.create(saved_yaml))
    requested = OmegaConf.to_container(OmegaConf.create(config_yaml))
    assert isinstance(saved, dict) and isinstance(requested, dict)  # run configs are mappings
    if isinstance(saved.get("model"), dict):  # saved before a model field moved to the zoo: as it is spelled now
        saved["model"] = upgrade_for_comparison(saved["model"])
    refused, allowed = config_changes(saved, requested, may_change, defaults)
    if refused:
        lines = "\n  ".join(refused)
        names = "RESUMABLE" if tuple(may_change) == RESUMABLE else "FINETUNE_RESUMABLE"
        raise ConfigError(
            f"cannot {what} with a different config: these fields differ from the run's ({where}), "
            f"old -> new:\n  {lines}\nIt was trained with the old values: restore them to continue, "
            f"or {start_over}. Only the fields of {names} in lm/core/resume.py may change on resume"
        )
    for line in allowed:
        log.warning("resuming with a changed setting: %s", line)


def _trusted_file(ckpt: Path, name: str) -> str | None:
    """The text of ckpt/name when it matches the checkpoint's manifest (or the checkpoint predates
    manifests); None when it is missing or damaged."""
    try:
        trainer = json.loads((ckpt / "trainer.json").read_text())
        text = (ckpt / name).read_bytes()
        if "manifest_sha256" in trainer:
            manifest = (ckpt / "manifest.json").read_bytes()
            want = json.loads(manifest)["files"][name]["sha256"]
            if (
                hashlib.sha256(manifest).hexdigest() != trainer["manifest_sha256"]
                or hashlib.sha256(text).hexdigest() != want
            ):
                return None
        return text.decode()
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _step(ckpt: Path) -> int | None:
    try:
        return int(json.loads((ckpt / "trainer.json").read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
