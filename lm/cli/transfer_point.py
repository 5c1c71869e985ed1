"""Which point of a curve an lm transfer --out holds, and which files there are lm transfer's.

The first call records its point (<out>/transfer_point.json: preset, steps, tokens per step, the --pretrain overrides
that change what is computed) before any work; every later call, one-arm call and --join is compared with it and
refused in one line when it differs, so two points never share a pretraining or a table. A file of a name lm transfer
writes at the top of <out> that it did not write (a directory of the user's given as --out) is refused too.
"""

from __future__ import annotations

import json
from pathlib import Path

from lm.cli.transfer_recipe import ARMS, TransferError


def arm_record_name(arm: str) -> str:
    """A one-arm call's record in <out> (lm/cli/transfer_join.py writes and joins them)."""
    return f"transfer_{arm}.json"


# <out>'s record of the point it holds: written by the first call, before any work, and compared by every later one
POINT = "transfer_point.json"


# lm train lets SCHEDULE's keys change on resume, but only to recover from a NaN/inf loss (lm/core/resume.py): they
# change the weights a point's pretraining ends with, so they are the point's (a second call with another optim.lr read
# the first one's checkpoint back, or went on at the new rate, under a table naming the new rate alone). Their own key:
# a record written before it was one says nothing of them and is not compared on it (check_point).
LATER_KEYS = ("pretrain_schedule",)


def point_of(recipe: dict) -> dict:
    """What a point's pretraining and table are of, from its recipe record (recipe_record): the preset, the steps
    and their size, the --pretrain overrides lm train would refuse to change on resume, and those of its learning
    rate schedule (train.threads, logger=... may change between calls: they change nothing computed)."""
    from lm.core.resume import resumable
    from lm.report.transfer import SCHEDULE

    given = recipe.get("pretrain_overrides") or []
    keys = {o: o.lstrip("+~").split("=", 1)[0] for o in given}
    overrides = [o for o in given if not resumable(keys[o])]
    schedule = [o for o in given if resumable(keys[o], SCHEDULE)]
    return {k: recipe[k] for k in ("preset", "steps", "tokens_per_step")} | {
        "pretrain_overrides": overrides,
        "pretrain_schedule": schedule,
    }


def held_point(out: Path) -> tuple[dict, Path] | None:
    """The point <out> holds and the file that says so: its transfer_point.json, else (a directory from before that
    record) the recipe of its table or of a one-arm call's record; None for a new or unknown directory."""
    path = out / POINT
    if path.is_file():
        return _point_record(path), path
    for path in (out / "transfer.json", *(out / arm_record_name(a) for a in ARMS[1:])):
        try:
            return point_of(json.loads(path.read_text())["recipe"]), path
        except (OSError, ValueError, KeyError, TypeError):  # none, or too old or damaged to say (rewritten later)
            continue
    return None


def _point_record(path: Path) -> dict:
    try:
        record = json.loads(path.read_text())
    except ValueError as e:  # not JSON, or not UTF-8
        record = e
    if not isinstance(record, dict):
        why = record if isinstance(record, ValueError) else "not a JSON object"
        raise TransferError(
            f"{path} is damaged ({why}); it records which point of a curve {path.parent} holds. Delete it and the "
            f"same command records this call's point, or pass another --out"
        )
    return record


def check_point(out: Path, point: dict, pretrain_cfg=None) -> None:
    """Refuse, before any work, a call whose point differs from the one `out` holds: a grown --tokens continued
    that point's pretraining (its checkpoint pruned, its table no longer the directory's) and then had its
    finetuning refused; another model was refused by lm train only after the scratch arm's hours.
    `pretrain_cfg`: this call's lm train config, compared with an unrecorded directory's pretraining
    (check_unrecorded)."""
    held = held_point(out)
    if held is None:
        if pretrain_cfg is not None:
            check_unrecorded(out, pretrain_cfg)
        return
    old, path = held
    diff = [k for k in point if not _same(old.get(k), point[k]) and (k in old or k not in LATER_KEYS)]
    if diff:
        changes = "; ".join(_change(k, old.get(k), point[k]) for k in diff)
        raise TransferError(
            f"--out {out} holds the point of another recipe ({changes}; see {path}): its pretraining and table are "
            f"that point's. Each point needs its own directory: pass another --out (copy {out / 'pretrain'} into it "
            f"to continue that pretraining there), or remove {out}"
        )


def check_unrecorded(out: Path, pretrain_cfg) -> None:
    """An --out from an lm transfer older than transfer_point.json, stopped before its table and arm records (so
    held_point cannot say its point) but with a pretraining: compare that run's config.yaml with this call's, on what
    makes a point (what lm train refuses to change on resume, its steps and its schedule). Unchecked, a grown
    --tokens continued that pretraining (its checkpoint pruned) before lm finetune refused the pairs, and this
    call's point was recorded over it, so the command that made it was refused there from then on."""
    from omegaconf import OmegaConf

    from lm.core.resume import RESUMABLE, config_changes
    from lm.model.upgrade import upgrade_for_comparison
    from lm.report.transfer import SCHEDULE

    path = out / "pretrain" / "config.yaml"
    if not path.is_file():
        return  # no pretraining yet: nothing of another point to continue or prune
    saved = OmegaConf.to_container(OmegaConf.create(path.read_text()))
    requested = OmegaConf.to_container(OmegaConf.create(OmegaConf.to_yaml(pretrain_cfg, resolve=True)))
    assert isinstance(saved, dict) and isinstance(requested, dict)  # run configs are mappings
    if isinstance(saved.get("model"), dict):  # saved before a model field moved to the zoo: as it is spelled now
        saved["model"] = upgrade_for_comparison(saved["model"])
        grown = saved["model"].get("vocab_size")  # lm train grows the vocabulary to the tokenizer's: not a change
        if isinstance(grown, int) and grown > (requested.get("model") or {}).get("vocab_size", grown):
            requested["model"]["vocab_size"] = grown
    point_keys = ("train.max_steps", *SCHEDULE)
    changes = config_changes(saved, requested, [k for k in RESUMABLE if k not in point_keys])[0]
    if changes:
        raise TransferError(
            f"--out {out} holds the pretraining of another recipe ({'; '.join(changes)}; see {path}), made by an "
            f"lm transfer older than {POINT}: pass another --out (copy {out / 'pretrain'} into it to continue that "
            f"pretraining there), or remove {out}"
        )


def _same(old, new) -> bool:
    """Two values of a point agree; override lists whatever order their keys were typed in (a key given twice keeps
    its order: the last one wins)."""
    if isinstance(old, list) and isinstance(new, list):
        return _by_key(old) == _by_key(new)
    return old == new


def _by_key(overrides: list) -> list:
    return sorted(overrides, key=lambda o: str(o).lstrip("+~").split("=", 1)[0])  # stable: a key's order kept


# The files a call writes at the top of <out>, each with the keys (JSON) or the first words (Markdown) that show it
# is lm transfer's: a file of one of these names that lacks them is the user's, never replaced
OWN_FILES = {
    "transfer.json": ("recipe", "comparison"),
    "transfer.md": "# GLUE transfer: ",
    **{arm_record_name(a): ("arm", "recipe") for a in ARMS[1:]},
    # the point's running total of seconds: a user's file of that name was added into the run record, then replaced
    "transfer_seconds.json": ("seconds",),
}  # (transfer_point.json: check_point)


def check_own_files(out: Path) -> None:
    """Refuse, before any work, an --out holding a file of a name lm transfer writes there that it did not write
    (an existing directory of the user's given as --out): it would be replaced at the end."""
    for name, mark in OWN_FILES.items():
        path = out / name
        if (path.exists() or path.is_symlink()) and not _own_file(path, mark):
            raise TransferError(
                f"{path} exists and is not a file lm transfer wrote; it would be replaced: pass another --out, "
                f"or move the file"
            )


def _own_file(path: Path, mark) -> bool:
    try:
        text = path.read_text() if path.is_file() and not path.is_symlink() else None
    except (OSError, ValueError):
        return False
    if text is None or isinstance(mark, str):
        return text is not None and text.startswith(mark)
    try:
        record = json.loads(text)
    except ValueError:
        return False
    return isinstance(record, dict) and all(k in record for k in mark)


def _change(key: str, old, new) -> str:
    """One difference in words; of the override lists, only the overrides one side has."""
    if key.startswith("pretrain_") and isinstance(old, list) and set(old) != set(new):
        return f"--pretrain {' '.join(o for o in old if o not in new) or '(none)'} -> " + (
            " ".join(o for o in new if o not in old) or "(none)"
        )
    return f"{key}: {old!r} -> {new!r}"


def record_point(out: Path, point: dict) -> None:
    """<out>/transfer_point.json, once: later calls are compared with it (check_point)."""
    from lm.core.files import atomic_write_text

    if not (out / POINT).exists():
        atomic_write_text(out / POINT, json.dumps(point, indent=2) + "\n")
