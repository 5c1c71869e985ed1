"""Evaluate a run, checkpoint or lm export directory: the LM Evaluation Harness and the GLUE probes.

    lm eval runs/pretrain                                                # local GLUE zero-shot + WikiText-2
    lm eval runs/pretrain --tasks local_sst2,local_wikitext2 --limit 200
    lm eval runs/pretrain/checkpoints/step_00001000/export --tasks probe
    lm eval runs/pretrain --tasks hellaswag                              # any harness task that can download

--tasks names harness tasks (lm's offline ones: local_sst2, local_rte, local_mrpc, local_cola (the tag
local_glue: all four) and local_wikitext2, read from $LM_DATA_MIRROR) and `probe`, the GLUE probes of
lm/eval/probe.py. Writes <out>/eval_results.json (default out: the checkpoint or export directory) and prints
one table row per task and metric. A missing extra, an unknown path or a model that cannot be scored is one
line on stderr, exit status 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

DEFAULT_TASKS = "local_glue,local_wikitext2"
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
    p.add_argument("--limit", type=float, help="at most this many documents per task (a fraction if < 1)")
    p.add_argument("--batch-size", type=int, default=16, help="sequences per forward (default 16)")
    p.add_argument("--num-fewshot", type=int, help="examples in each prompt (default: the task's, zero here)")
    p.add_argument(
        "--tokenizer",
        help="tokenizer.json (or a prepared data directory) when the run's own is not "
        "where its config says, or for an export without its checkpoint",
    )
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--out", type=Path, help="directory for eval_results.json (default: the checkpoint or export)")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> dict:
    """{"path", "tasks": {task: {metric: value}}}, written to <out>/eval_results.json."""
    from lm.core.files import atomic_write_text
    from lm.eval.saved import load_model

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    model, tokenizer = load_model(args.path, args.tokenizer)
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
    harness_tasks = [t for t in tasks if t != "probe"]
    if harness_tasks:
        from lm.eval.harness import LMAdapter, evaluate, harness_metrics

        adapter = LMAdapter(model, tokenizer, batch_size=args.batch_size, device=args.device)
        out = evaluate(adapter, harness_tasks, limit=args.limit, num_fewshot=args.num_fewshot)
        results.update(harness_metrics(out))
    record = {"path": str(args.path), "limit": args.limit, "tasks": results}
    out_dir = args.out or _saved_dir(args.path)
    atomic_write_text(Path(out_dir) / "eval_results.json", json.dumps(record, indent=1) + "\n")
    record["written"] = str(Path(out_dir) / "eval_results.json")
    return record


def format_table(results: dict[str, dict[str, float]]) -> str:
    rows = ["| task | metric | value |", "|---|---|---:|"]
    for task, metrics in results.items():
        rows += [f"| {task} | {m} | {v:.4f} |" for m, v in metrics.items()]
    return "\n".join(rows)


def _saved_dir(path) -> Path:
    from lm.core.saved_model import find_saved_model

    return find_saved_model(path).path


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
