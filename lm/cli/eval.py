"""Evaluate a run, checkpoint or lm export directory: the LM Evaluation Harness and the GLUE probes.

    lm eval runs/pretrain                                                # local GLUE zero-shot + WikiText-2
    lm eval runs/pretrain --tasks local_sst2,local_wikitext2 --limit 200
    lm eval runs/pretrain/checkpoints/step_00001000/export --tasks probe
    lm eval runs/pretrain --tasks hellaswag                              # any harness task that can download

--tasks names harness tasks (lm's offline ones: local_sst2, local_rte, local_mrpc, local_cola (the tag
local_glue: all four) and local_wikitext2, read from $LM_DATA_MIRROR) and `probe`, the GLUE probes of
lm/eval/probe.py. Writes <out>/eval_results.json (default out: the checkpoint, or <export>-eval beside an
export, which holds only lm export's files so that lm export --force can replace it) and prints one table row
per task and metric. The tasks of an earlier record there of the same weights and settings are kept beside the
new ones; a record of other weights or settings is moved aside to eval_results.<UTC time>.json; a file of that
name lm eval did not write is refused before anything is evaluated. A missing extra, an unknown path or task
(with the closest name), an --out that cannot be written or a model that cannot be scored is one line on stderr,
exit status 1.
"""

from __future__ import annotations

import argparse
import errno
import itertools
import json
import logging
import os
import sys
import time
from pathlib import Path

from lm.cli.errors import entry
from lm.core.files import atomic_write_text, exclusive, nearest_existing

DEFAULT_TASKS = "local_glue,local_wikitext2"
RESULTS = "eval_results.json"
SAME = ("weights", "limit", "num_fewshot")  # records that agree on these are one evaluation's: their tasks merge
log = logging.getLogger("lm")


def parse_args(argv=None) -> argparse.Namespace:
    doc = __doc__ or ""
    p = argparse.ArgumentParser(
        prog="lm eval",
        description=doc.split("\n\n")[0],
        epilog=doc.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "path", help="an lm train run directory, one of its checkpoints/step_* (any engine), or an lm export directory"
    )
    p.add_argument(
        "--tasks", default=DEFAULT_TASKS, help=f"comma-separated harness tasks and/or `probe` (default {DEFAULT_TASKS})"
    )
    p.add_argument(
        "--limit",
        type=_limit,
        help="at most this many documents per task (a fraction of them if < 1; the probe: rows per split)",
    )
    p.add_argument("--batch-size", type=_at_least(1), default=16, help="sequences per forward (default 16)")
    p.add_argument("--num-fewshot", type=_at_least(0), help="examples in each prompt (default: the task's, zero here)")
    p.add_argument(
        "--tokenizer",
        help="tokenizer.json (or a prepared data directory) when the run's own is not "
        "where its config says, or for an export without its checkpoint",
    )
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument(
        "--out", type=Path, help="directory for eval_results.json (default: the checkpoint, or <export>-eval)"
    )
    args = p.parse_args(argv)
    if "probe" in args.tasks.split(",") and args.limit is not None and args.limit < 1:
        p.error(f"--limit {args.limit}: the probe reads a number of rows, not a fraction (--limit 200, say)")
    device = _device_problem(args.device)
    if device:
        p.error(f"--device {args.device}: {device}")
    return args


def _limit(text: str) -> float:
    """--limit: a count (1, 2, ...) or a fraction in (0, 1); 0, a negative or 1.5 would fail inside the harness (0:
    `did not find any docs`) or be cut to an integer that the record would not name."""
    value = float(text)
    if not (0 < value < 1 or (value >= 1 and value.is_integer())):
        raise argparse.ArgumentTypeError(f"{text!r}: a count of documents (1, 2, ...) or a fraction between 0 and 1")
    return value


_limit.__name__ = "number"  # argparse's "invalid number value" for what is not a number


def _at_least(low: int):
    def check(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"{text!r}: at least {low}")
        return value

    check.__name__ = "int"  # argparse's "invalid int value" for what is not an integer
    return check


def _device_problem(device: str) -> str | None:
    """Why `device` cannot run the evaluation (it failed with a traceback once the model moved), or None."""
    import torch

    try:
        kind = torch.device(device).type
    except (RuntimeError, ValueError):
        return "not a torch device; cpu or cuda (cuda:1 for the second GPU)"
    if kind not in ("cpu", "cuda"):
        return "lm eval runs on cpu or cuda"
    if kind == "cuda" and not torch.cuda.is_available():
        return "this machine has no CUDA device torch can use; leave --device out to evaluate on the CPU"
    index, count = torch.device(device).index, torch.cuda.device_count() if kind == "cuda" else 0
    if kind == "cuda" and index is not None and index >= count:
        return f"this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
    return None


def run(args: argparse.Namespace) -> dict:
    """{"path", "weights", "limit", "num_fewshot", "tasks": {task: {metric: value}}}, written to
    <out>/eval_results.json with the tasks of an earlier record of the same weights and settings."""
    from lm.eval.saved import load_with_weights

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    harness_tasks = [t for t in tasks if t != "probe"]
    if harness_tasks:  # a mistyped local_ task, before the model loads (the harness's own index: after)
        from lm.eval.harness import LOCAL_TASKS, refuse_unknown

        ours = (*LOCAL_TASKS, "probe")
        refuse_unknown(harness_tasks, "--tasks", ours=ours)
    model, tokenizer, weights = load_with_weights(args.path, args.tokenizer)
    file = results_file(args.out or default_out(args.path))  # refused now, not after the evaluation
    if harness_tasks:  # what the model cannot score is refused before the probe or any task runs
        from lm.eval.harness import LMAdapter, refuse_unscorable, task_manager

        index = task_manager(harness_tasks)
        refuse_unknown(harness_tasks, "--tasks", index, ours=ours)  # the harness: after the probe, with no hint
        refuse_unscorable(index, harness_tasks, model.cfg.arch, "--tasks")
        adapter = LMAdapter(model, tokenizer, batch_size=args.batch_size, device=args.device)
    results: dict[str, dict[str, float]] = {}
    if "probe" in tasks:
        from lm.eval.probe import load_probe_sets, probe_model

        limit = int(args.limit) if args.limit and args.limit >= 1 else None
        sets = load_probe_sets(
            tokenizer,
            model.cfg.arch,
            train_examples=limit or 1000,
            dev_examples=limit or 500,
            max_len=min(128, model.cfg.max_seq_len),
        )
        results["probe"] = {
            k[len("probe/") :]: v for k, v in probe_model(model.to(args.device), sets, tokenizer.pad_id).items()
        }
    if harness_tasks:
        from lm.eval.harness import evaluate, harness_metrics

        out = evaluate(adapter, harness_tasks, limit=args.limit, num_fewshot=args.num_fewshot, index=index)
        results.update(harness_metrics(out))
    new = {"path": str(args.path), "weights": weights, "limit": args.limit, "num_fewshot": args.num_fewshot}
    record = write_record(file, {**new, "tasks": results})
    return {**record, "tasks": results, "written": str(file)}


def default_out(path) -> Path:
    """A checkpoint's own directory (its keep-last rotation keeps a checkpoint holding files it did not write);
    <export>-eval beside an export, whose directory holds only lm export's files (lm export --force replaces it)."""
    from lm.core.saved_model import find_saved_model

    saved = find_saved_model(path)
    return saved.path.with_name(f"{saved.path.name}-eval") if saved.export else saved.path


def results_file(out: Path) -> Path:
    """<out>/eval_results.json, once `out` can hold it: a file in the way, a directory that cannot be written or an
    eval_results.json that is not lm eval's would otherwise fail, or be replaced, after the whole evaluation."""
    from lm.config import ConfigError

    above = nearest_existing(out)
    if not above.is_dir():
        raise ConfigError(f"--out {out}: {above} is a file, not a directory; name a directory (--out <dir>)")
    if not os.access(above, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(above))
    file = Path(out) / RESULTS
    if (file.exists() or file.is_symlink()) and earlier_record(file) is None:
        raise ConfigError(
            f"{file} exists and is not a record lm eval wrote; it would be replaced: pass --out <another "
            f"directory>, or move the file"
        )
    return file


def earlier_record(file: Path) -> dict | None:
    """The record at `file` when it is one lm eval wrote (a JSON object with its "path" and "tasks"), else None."""
    try:
        record = json.loads(file.read_text()) if file.is_file() and not file.is_symlink() else None
    except (OSError, ValueError):
        return None
    ours = isinstance(record, dict) and "path" in record and isinstance(record.get("tasks"), dict)
    return record if ours else None


def write_record(file: Path, record: dict) -> dict:
    """Write `record` to `file` merged with the earlier record there (with_earlier); one call at a time, so that two
    evaluations of one checkpoint finishing together both keep their tasks."""
    with exclusive(
        file.with_name(f".{file.name}.lock"), lambda: log.info("waiting for another lm eval writing %s", file)
    ):
        record = with_earlier(file, record)
        atomic_write_text(file, json.dumps(record, indent=1) + "\n")
    return record


def with_earlier(file: Path, record: dict) -> dict:
    """`record` with the other tasks of the earlier record at `file` when both are of the same weights and
    settings (SAME); an earlier record of others is moved aside first (eval_results.<UTC time>.json): one record
    never mixes two models or two settings, and no result is lost."""
    old = earlier_record(file) if file.exists() else None
    if old is None:
        return record
    if all(old.get(k) == record[k] for k in SAME):
        return {**record, "tasks": {**old["tasks"], **record["tasks"]}}
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    names = (file.with_name(f"{file.stem}.{stamp}{f'.{n}' if n else ''}{file.suffix}") for n in itertools.count())
    aside = next(name for name in names if not name.exists())  # two in one second: .1, .2, ...
    os.replace(file, aside)
    log.info("the earlier %s (of other weights or settings) is kept as %s", file.name, aside)
    return record


def format_table(results: dict[str, dict[str, float]]) -> str:
    rows = ["| task | metric | value |", "|---|---|---:|"]
    for task, metrics in results.items():
        rows += [f"| {task} | {m} | {v:.4f} |" for m, v in metrics.items()]
    return "\n".join(rows)


@entry("lm eval")  # what the except below leaves (a disk full or unwritable at the end, Ctrl-C): one line too
def main(argv: list[str] | None = None) -> None:
    """Evaluate a run, checkpoint or export with the LM Evaluation Harness and the GLUE probes."""
    from lm.config import ConfigError
    from lm.core.checkpoint import CheckpointError
    from lm.extras import exit_if_missing

    args = parse_args(argv)
    exit_if_missing("lm eval", "eval")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        record = run(args)
    except (ConfigError, CheckpointError, FileNotFoundError, KeyError, ValueError) as e:
        sys.exit(f"lm eval: error: {_one_line(e)}")
    print(format_table(record["tasks"]))
    print(f"wrote {record['written']}")


def _one_line(e: BaseException) -> str:
    text = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
    return " ".join(text.split())


if __name__ == "__main__":
    main()
