"""lm transfer's arms from separate calls: a one-arm call (--arm scratch|pretrained) writes its arm's record,
<out>/transfer_<arm>.json (the recipe, what both arms depend on, the arm's results.json, the call's run record);
`lm transfer --join A B --out DIR` writes the table from two records, one per arm, e.g. from two machines or two
device calls (benchmarks/gpu_transfer.sh ARMS=pretrained|scratch).
"""

from __future__ import annotations

import json
import logging
import shlex
import sys
import time
from pathlib import Path

from lm.cli.transfer_arms import same_value
from lm.cli.transfer_point import arm_record_name, check_own_files, check_point, point_of
from lm.cli.transfer_recipe import (
    Plan,
    Recipe,
    TransferError,
    recipe_record,
    run_record,
    scratch_record,
    spent,
    write_table,
)

log = logging.getLogger("lm")


def write_arm_record(r: Recipe, p: Plan, arm_dir: Path, t0: float) -> Path | None:
    """<out>/transfer_<arm>.json: the recipe, what both arms depend on, this arm's results.json and the call's run
    record; lm transfer --join reads two of them (one per arm), so the arms may finish on different machines."""
    from lm.core.files import atomic_write_text

    if not (arm_dir / "results.json").is_file():  # --tokens 0 --arm pretrained: no arm of its own
        return None
    record = {
        "arm": r.arm,
        "recipe": recipe_record(r, p),
        "shared": scratch_record(r, p),
        "dir": str(arm_dir),
        "results": json.loads((arm_dir / "results.json").read_text()),
        "run": run_record(r.command, spent(r.out, time.time() - t0)),
    }
    path = r.out / arm_record_name(r.arm)
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")
    return path


def set_aside_stale_records(r: Recipe) -> list[Path]:
    """Before an --arm all call writes the table: a one-arm record in <out> whose results are no longer its arm's
    (an --arm pretrained --seeds 0 call, then --arm all --seeds 0,1; or the arms finetuned again, resume=false) is
    moved to <out>/previous/<UTC time>/, and where is logged: left beside the table, a --join of it made a table of
    the old results. A record that still holds its arm's results stays (a --join of it gives this table)."""
    stale = []
    for arm in ("scratch", "pretrained"):
        path, results = r.out / arm_record_name(arm), r.arm_dir(arm) / "results.json"
        try:
            current = json.loads(path.read_text())["results"] == json.loads(results.read_text())
        except (OSError, ValueError, KeyError, TypeError):  # none, or damaged: a damaged one is stale too
            current = not path.is_file()
        if not current:
            stale.append(path)
    if not stale:
        return []
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside, n = r.out / "previous" / stamp, 1
    while aside.exists():  # two calls in one second
        aside, n = r.out / "previous" / f"{stamp}-{n}", n + 1
    aside.mkdir(parents=True)
    for path in stale:
        path.rename(aside / path.name)
        log.info("lm transfer: %s no longer holds its arm's results; moved to %s", path, aside / path.name)
    return [aside / path.name for path in stale]


def join_arms(paths: list[Path], out: Path, command: str) -> dict:
    """The table from two arm records (write_arm_record), one per arm: <out>/transfer.{json,md}. The arms must
    agree on what both depend on (scratch_record: model, tokenizer, pooling, tasks, seeds, budget, finetuning): one
    table compares the same tasks and seeds in both arms; the pretraining's settings are the pretrained arm's alone."""
    from lm.report.transfer import compare, scores_of, transfer_table

    records, scores, where = {}, {}, {}
    for path in paths:
        try:
            record = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise TransferError(f"{path}: cannot be read as JSON ({type(e).__name__}: {e})") from e
        missing = [
            k
            for k in ("arm", "recipe", "shared", "dir", "results", "run")
            if not isinstance(record, dict) or k not in record
        ]
        if missing or record["arm"] not in ("scratch", "pretrained"):
            raise TransferError(
                f"{path}: not an lm transfer arm record (no {', '.join(missing) or 'known arm'}); a "
                f"call with --arm scratch or --arm pretrained writes one as <out>/transfer_<arm>.json"
            )
        arm = record["arm"]
        try:  # an edited or damaged record: one line naming it, not a KeyError deep in the table
            if not isinstance(record["shared"], dict) or not isinstance(record["recipe"], dict):
                raise TypeError("its recipe or shared settings are not a JSON object")
            run = record["run"]
            if not isinstance(run, dict) or not isinstance(run.get("seconds"), (int, float)) or "machine" not in run:
                raise TypeError("its run has no seconds or machine")
            scores[arm] = scores_of(record["results"])
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise TransferError(
                f"{path}: a damaged lm transfer arm record ({type(e).__name__}: {e}); the same --arm {arm} call "
                f"writes it again (its finished work is read back)"
            ) from None
        if arm in records:
            raise TransferError(
                f"{paths[0]} and {paths[1]} are both the {arm} arm; --join takes one scratch and "
                f"one pretrained arm record"
            )
        records[arm], where[arm] = record, path
    scratch, pretrained = records["scratch"], records["pretrained"]
    old, new = scratch["shared"], pretrained["shared"]
    diff = sorted(k for k in set(old) | set(new) if not same_value(k, old.get(k), new.get(k)))
    if diff:
        detail = "; ".join(f"{k}: {old.get(k)!r} vs {new.get(k)!r}" for k in diff if k != "model")
        raise TransferError(
            f"the two arms are of different recipes (they differ in {diff}"
            f"{': ' + detail if detail else ''}); rerun one arm with the other's settings"
        )
    summary = {
        "recipe": pretrained["recipe"],
        "arms": {a: f"{records[a]['dir']} ({records[a]['run']['machine']})" for a in ("scratch", "pretrained")},
        "comparison": compare(scores["scratch"], scores["pretrained"]),
        "run": {
            **run_record(command, scratch["run"]["seconds"] + pretrained["run"]["seconds"]),
            "arms": {a: records[a]["run"] for a in ("scratch", "pretrained")},
        },
    }
    try:  # the table's recipe line and the point it is of, before anything is written
        transfer_table(summary)
        point = point_of(pretrained["recipe"])
    except (KeyError, TypeError, ValueError) as e:
        raise TransferError(
            f"{where['pretrained']}: a damaged lm transfer arm record (its recipe: "
            f"{type(e).__name__}: {e}); the same --arm pretrained call writes it again (its finished work is read back)"
        ) from None
    check_point(out, point)  # an --out of another point: its table is not replaced
    check_own_files(out)
    out.mkdir(parents=True, exist_ok=True)
    return write_table(out, summary)


def join_main(paths: list[Path], out: Path | None, argv: list[str]) -> None:
    from lm.report.transfer import TransferError as TableError
    from lm.report.transfer import transfer_table

    if out is None:
        sys.exit("lm transfer: --join writes its table in --out DIR; name the directory")
    try:
        summary = join_arms(paths, out, "lm transfer " + " ".join(map(shlex.quote, argv)))
    except (TransferError, TableError) as e:
        sys.exit(f"lm transfer: {type(e).__name__}: {e}")
    print(transfer_table(summary))
    print(f"results: {out / 'transfer.json'}, {out / 'transfer.md'}")
