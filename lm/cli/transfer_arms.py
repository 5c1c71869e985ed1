"""Each finetuning arm's recipe record, <arm dir>/transfer_arm.json (scratch_record: model, tokenizer, pooling, tasks,
seeds, budget, --finetune), compared for both arms before any work and written for the arms a call runs.

Without the pretrained arm's record a call of another finetuning recipe (--arm pretrained --finetune optim.lr=3e-3,
then --arm all --finetune optim.lr=1e-3) finetuned the whole scratch arm first, and only then had lm finetune refuse
the pretrained arm's finished pairs. Both arms' records are compared as lm finetune compares a finished pair: only
on the tasks both name, seeds aside, so more seeds or tasks extend an arm (--seeds 0, then --seeds 0,1: the
README's quickstart flow; the scratch arm's record was compared whole and that call refused, advising to remove the
finished arm). A record names the seeds its arm holds (a curve archives its scratch arm keyed by the record:
benchmarks/glue_transfer_curve.py), so a call with fewer seeds leaves it as it is. --finetune resume=false
finetunes the arms over (lm finetune sets their pairs aside), so it rewrites a record instead of extending it.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

from lm.cli.transfer_recipe import ARM_RECORD, Recipe, TransferError, override_value


def check_arms(r: Recipe, record: dict, running: set[str]) -> None:
    """Refuse, before the pretraining or either arm's finetuning, an arm directory whose record is another recipe's;
    then (nothing written by a refused call) record this call's recipe for the arms it runs. `record`:
    scratch_record(r, plan), both arms' own."""
    pretrained = r.arm_dir("pretrained")
    over = (override_value(r.finetune, "resume") or "").lower() == "false"  # lm finetune sets the arm's pairs aside
    # the scratch arm is checked whether or not this call runs it (--arm pretrained: it is tabled with this one)
    _refuse_other_pairs(r.scratch, "scratch", record, "pass another --scratch, or remove it")
    if pretrained != r.scratch and not over:  # (at --tokens 0 the pretrained arm is the scratch arm)
        _refuse_other_pairs(
            pretrained,
            "pretrained",
            record,
            f"pass another --out, or --finetune resume=false to finetune the arm over (its results are moved to "
            f"{pretrained / 'previous'})",
        )
    if "pretrained" in running and pretrained != r.scratch and not over:
        refuse_orphaned_pairs(r.out / "pretrain", pretrained)
    if "scratch" in running:
        _record(r.scratch, "scratch", record, over)
    if "pretrained" in running and pretrained != r.scratch:
        _record(pretrained, "pretrained", record, over)


def refuse_orphaned_pairs(pretrain_dir: Path, arm_dir: Path) -> None:
    """Refuse, before any work, a pretrained arm holding task/seed pairs (finished or started) while its pretraining
    has no checkpoint (deleted, or an --out of an older layout): lm transfer pretrained again, then lm finetune
    refused the pairs as of other weights only after that pretraining, or, for pairs finished before lm finetune
    recorded their weights (init_weights), tabled them beside this pretraining's as one arm."""
    if any((pretrain_dir / "checkpoints").glob("step_*")):
        return
    pairs = sorted(p for p in arm_dir.glob("*/seed*") if (p / "result.pt").is_file() or (p / "checkpoints").is_dir())
    if pairs:
        raise TransferError(
            f"{arm_dir} holds {len(pairs)} task/seed pair(s) finetuned from a pretraining that is no longer in "
            f"{pretrain_dir} (e.g. {pairs[0]}): this call would pretrain again and then read them beside pairs of "
            f"other weights; pass another --out, or delete {arm_dir} (or --finetune resume=false, which moves its "
            f"results to {arm_dir / 'previous'}) to finetune the arm from the new pretraining"
        )


def _record(arm_dir: Path, arm: str, record: dict, over: bool) -> None:
    """Write `record` as the arm's (its pairs already checked to be this recipe's) where it says more than the old
    one: it names every task the old one did and a task or seed more, so it speaks for them; its seeds are then the
    old ones and this call's added (the arm holds both). Otherwise the old record stays: a call of fewer seeds or
    tasks reads pairs back, and one that only adds a harmless override (train.threads=1) does not change the key a
    curve archives the scratch arm by. After resume=false the arm holds this call's pairs alone: its record is
    this call's unless the old one is the same recipe (same_value: harmless overrides, resume=false itself, aside)."""
    path = arm_dir / ARM_RECORD
    old = _read(path, arm)
    if old is None or over:
        if old is None or any(not same_value(k, old.get(k), record.get(k)) for k in set(old) | set(record)):
            _write(path, record)
        return
    tasks, old_tasks = set(record.get("tasks") or []), set(old.get("tasks") or [])
    old_seeds = list(old.get("seeds") or [])
    seeds = old_seeds + [s for s in record.get("seeds") or [] if s not in old_seeds]
    if tasks >= old_tasks and (tasks > old_tasks or seeds != old_seeds):
        _write(path, {**record, "seeds": seeds})


def _refuse_other_pairs(arm_dir: Path, arm: str, record: dict, fix: str) -> None:
    """Refuse an arm whose finished task/seed pairs lm finetune would refuse to read back under `record`."""
    path = arm_dir / ARM_RECORD
    old = _read(path, arm)
    if old is None:
        return
    a, b = pair_settings(old, record), pair_settings(record, old)
    diff = sorted(k for k in set(a) | set(b) if not same_value(k, a.get(k), b.get(k)))
    if diff:
        raise TransferError(
            f"{arm_dir} holds a {arm} arm of another finetuning recipe (differs in {diff}{_detail(diff, a, b)}; see "
            f"{path}): its finished task/seed pairs are not this recipe's; {fix}"
        )


def pair_settings(record: dict, other: dict) -> dict:
    """What `record` says a finished task/seed pair was computed under, for the tasks it shares with `other`: the
    budget and the --finetune overrides that change what is computed, of those tasks and of every task; its tasks
    and seeds aside (an arm is extended by more of them)."""
    common = set(record.get("tasks") or []) & set(other.get("tasks") or [])
    kept = {k: v for k, v in record.items() if k not in ("tasks", "seeds")}
    if isinstance(record.get("budget"), list):
        kept["budget"] = [o for o in record["budget"] if not o.startswith("task=") and _of(o, common)]
    if isinstance(record.get("finetune"), list):
        kept["finetune"] = _by_key(o for o in record["finetune"] if _of(o, common))
    return kept


def _of(override: str, tasks: set[str]) -> bool:
    """Whether an override applies to a pair of one of `tasks`: it sets every task, or one of them."""
    parts = override.lstrip("+~").split("=", 1)[0].split(".")
    return parts[0] != "tasks" or len(parts) < 2 or parts[1] in tasks


def _by_key(overrides) -> list:
    return sorted(overrides, key=lambda o: str(o).lstrip("+~").split("=", 1)[0])  # stable: a key's order kept


def same_value(key: str, old, new) -> bool:
    """Two records' values agree; model nodes are compared as typed configs, so a node saved before a
    ModelConfig field existed (say model.family) equals one that holds that field's default; --finetune lists
    by the overrides that change what is computed (_computed)."""
    if key == "finetune" and isinstance(old, list) and isinstance(new, list):
        return _computed(old) == _computed(new)
    if key != "model" or old is None or new is None:
        return old == new
    return _computed_model(old) == _computed_model(new)


def _computed_model(node) -> dict:
    """The typed model but RESUMABLE's fields (model.linear: an arm of the default before auto, torch, is the same)."""
    from lm.core.resume import resumable
    from lm.model.config import model_from_saved

    cfg = model_from_saved(node)
    return {f.name: getattr(cfg, f.name) for f in fields(cfg) if not resumable(f"model.{f.name}")}


def _computed(overrides: list[str]) -> list[str]:
    """The --finetune overrides that change what a task/seed pair computes: lm finetune resumes a pair across the
    others (FINETUNE_RESUMABLE: train.threads, train.progress, logger, ...), so a rerun that adds one is the same
    arm (it was refused as another recipe's, whose advice was to remove the finished arm)."""
    from lm.report.transfer import computes

    return [o for o in overrides if computes("finetune", o)]


def _detail(diff: list[str], old: dict, new: dict) -> str:
    """The differences in words; of the --finetune lists, only the overrides that change what is computed and that
    one side has (the rest of a long list hid the one that differs)."""
    out = ""
    for k in (k for k in diff if k != "model"):
        a, b = old.get(k), new.get(k)
        if k == "finetune" and isinstance(a, list) and isinstance(b, list):
            a, b = _computed(a), _computed(b)
            gone, added = [o for o in a if o not in b], [o for o in b if o not in a]
            out += f"; --finetune {' '.join(gone) or '(none)'} -> {' '.join(added) or '(none)'}"
        else:
            out += f"; {k}: {a!r} -> {b!r}"
    return out


def _read(path: Path, arm: str) -> dict | None:
    """An arm's record, or None where there is none; a damaged one is refused in one line naming the fix."""
    if not path.is_file():
        return None
    try:
        old = json.loads(path.read_text())
    except ValueError as e:  # not JSON, or not UTF-8
        old = e
    if not isinstance(old, dict):
        raise TransferError(
            f"{path} is damaged ({old if isinstance(old, ValueError) else 'not a JSON object'}); it records which "
            f"recipe the {arm} arm in {path.parent} belongs to. Delete it and the same command records this "
            f"recipe again (lm finetune still refuses a finished task/seed of other settings), or pass another "
            f"{'--scratch' if arm == 'scratch' else '--out'}"
        )
    return old


def _write(path: Path, record: dict) -> None:
    from lm.core.files import atomic_write_text

    atomic_write_text(path, json.dumps(record, indent=2) + "\n")
