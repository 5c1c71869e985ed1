"""A whole finetuning job: tasks x seeds from one backbone, then results.json, results.md and submission files.

    <run_dir>/
        results.json, results.md     dev metrics per column and seed, medians, GLUE score (lm.glue.results)
        submission/<CoLA|...|AX>.tsv test predictions of each task's best-dev seed; submission.zip when all
                                     eleven files are there (what the leaderboard takes)
        <task>/seed<k>/              metrics.jsonl (+ wandb/tensorboard), best/ checkpoint when save_best

The seed whose dev main metric is highest writes the submission (the usual practice of reporting the
median over seeds on dev and submitting the best dev run, e.g. RoBERTa, Liu et al. 2019).
"""

from __future__ import annotations

import logging
import shutil
import time
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from lm.config import ConfigError, GlueTaskConfig
from lm.core.config import LoggerConfig
from lm.glue.init import Backbone, build_classifier
from lm.glue.presets import expand
from lm.glue.readers import GlueDataMissing, split_path
from lm.glue.results import results_table, write_results
from lm.glue.submission import check_submission, write_submission
from lm.glue.tasks import EVALS, get_task
from lm.glue.trainer import load_task_data, run_seed

log = logging.getLogger("lm")


@dataclass
class RunOptions:
    run_dir: Path
    make_engine: Callable[[], Any]  # a fresh, unwrapped engine (lm.engine)
    micro_batch_size: int = 32
    eval_batch_size: int = 128
    log_interval: int = 50
    logger: Optional[LoggerConfig] = None  # None = metrics.jsonl only
    predict_test: bool = True
    save_best: bool = False
    hf: bool = True  # fall back to the Hugging Face copy when a split is not local
    skip_missing: bool = False  # skip tasks without local train/dev data (the GLUE score is then partial)
    pooling: Optional[str] = None
    config: Optional[Dict] = None  # the job's resolved config, for the trackers
    per_task: Optional[Dict[str, Dict]] = None  # {task or "all": {field: value}} on top of the presets
    is_main: bool = True  # rank 0 writes the files; every rank trains and predicts


def with_overrides(t: GlueTaskConfig, per_task: Dict[str, Dict]) -> GlueTaskConfig:
    """A task preset with per_task["all"] then per_task[<task>] applied, validated again."""
    from lm.config import validate_glue_task

    fields = {**(per_task.get("all") or {}), **(per_task.get(t.name) or {})}
    unknown = sorted(set(fields) - set(vars(t)))
    if unknown:
        raise ConfigError(f"per_task: unknown task field(s) {unknown}; allowed: {sorted(vars(t))}")
    t = replace(t, **fields)
    validate_glue_task(t)
    return t


def check_data(tasks: List[GlueTaskConfig]) -> Dict[str, str]:
    """{task: why} for tasks whose train or dev split is not on disk (looked up before any training)."""
    missing = {}
    for t in tasks:
        task = get_task(t.name)
        splits = ["train", *(EVALS[c].dev for c in task.evals if EVALS[c].dev)]
        absent = [str(split_path(task.name, s, t.data_root)) for s in splits
                  if not split_path(task.name, s, t.data_root).is_file()]
        if absent:
            missing[t.name] = "not found: " + ", ".join(absent)
    return missing


def finetune_glue(task_node, backbone: Backbone, opts: RunOptions) -> Dict[str, Any]:
    """Run every task of `task_node` (one task, or glue/all) for each of its seeds; returns the summary."""
    from lm.glue.tasks import DOWNLOAD_HINT

    tasks = [with_overrides(t, opts.per_task or {}) for t in expand(task_node)]
    missing = check_data(tasks)
    if opts.hf and not opts.skip_missing:
        missing = {t: why for t, why in missing.items() if not _on_hub(t, tasks)}
    if missing and not opts.skip_missing:  # before any training: a job must not die at its seventh task
        lines = "\n  ".join(f"{t}: {why}" for t, why in missing.items())
        raise GlueDataMissing(f"GLUE data missing for {len(missing)} task(s):\n  {lines}\n{DOWNLOAD_HINT}; or set "
                              f"skip_missing=true to run the tasks that are there (the GLUE score is then partial)")
    for t in missing:
        log.warning("skipping GLUE %s (skip_missing=true): %s", t, missing[t])
    tasks = [t for t in tasks if t.name not in missing]
    dev: Dict[str, Dict[int, Dict]] = {}
    info: Dict[str, Any] = {"tasks": {}, "submission": {}}
    sub_dir = opts.run_dir / "submission"
    for t in tasks:
        results, data = _run_task(t, backbone, opts)
        for col in data.dev:
            dev[col] = {r.seed: r.dev[col] for r in results}
        best = max(results, key=lambda r: r.main)
        info["tasks"][t.name] = {
            "config": {k: v for k, v in vars(t).items() if k not in ("tasks",)},
            "best_seed": best.seed,
            "runs": {str(r.seed): {"best_epoch": r.best_epoch, "main": r.main, "seconds": round(r.seconds, 1),
                                   "history": r.history} for r in results}}
        for col, preds in best.test.items():
            if opts.is_main:
                write_submission(col, preds, sub_dir, data.test[col].indices)
            info["submission"][EVALS[col].submission] = {"seed": best.seed, "rows": len(preds)}
        for why in data.missing_test:
            log.warning("no submission file for %s", why)
            info["submission"][why.split(":")[0]] = {"missing": why}
    if not dev:
        raise GlueDataMissing("no GLUE task could run: " + "; ".join(f"{t}: {w}" for t, w in missing.items()))
    info["skipped_tasks"] = missing
    if opts.is_main:
        _zip_if_complete(sub_dir, info)
        write_results(dev, opts.run_dir, extra={**info, "init": backbone.source})
    return {"dev": dev, **info}


def _on_hub(name: str, tasks: List[GlueTaskConfig]) -> bool:
    """Whether the Hugging Face copy of a task that is not on disk can be read (network or HF cache)."""
    from lm.glue.readers import load_split

    t = next(t for t in tasks if t.name == name)
    try:
        load_split(name, "train", t.data_root, hf=True)
        return True
    except GlueDataMissing as e:
        log.warning("%s", e)
        return False


def _run_task(t: GlueTaskConfig, backbone: Backbone, opts: RunOptions):
    from lm.engine import dist as D

    max_len = t.max_len
    if max_len > backbone.model_cfg.max_seq_len:
        log.warning("GLUE %s: task.max_len=%d exceeds model.max_seq_len=%d; truncating inputs to %d tokens", t.name,
                    max_len, backbone.model_cfg.max_seq_len, backbone.model_cfg.max_seq_len)
        max_len = backbone.model_cfg.max_seq_len
    t0 = time.perf_counter()
    data = load_task_data(t, backbone.tokenizer, backbone.model_cfg.arch, max_len, opts.hf, opts.predict_test)
    log.info("GLUE %s: %d train examples, dev %s, test %s (read and encoded in %.1f s)", data.task.dir,
             len(data.train.features), {c: len(s.features) for c, s in data.dev.items()},
             {c: len(s.features) for c, s in data.test.items()}, time.perf_counter() - t0)
    results = []
    for seed in t.seeds:
        results.append(_run_one(t, data, seed, backbone, opts))
        D.barrier()
    return results, data


def _run_one(t: GlueTaskConfig, data, seed: int, backbone: Backbone, opts: RunOptions):
    import torch

    from lm.core.checkpoint import Checkpointer
    from lm.core.config import OptimConfig
    from lm.core.optim import adamw
    from lm.core.tracking import NullTracker, Tracker

    engine = opts.make_engine()
    out = opts.run_dir / t.name / f"seed{seed}"
    torch.manual_seed(seed)  # the head's init (and a scratch backbone's): the same on every rank
    model = build_classifier(backbone, get_task(t.name).n_labels, t.dropout, opts.pooling)
    torch.manual_seed(seed + engine.rank)  # dropout differs per rank
    # BERT's finetuning AdamW (Devlin et al. 2019): betas (0.9, 0.999), decay on matrices only (lm.core.optim).
    ocfg = OptimConfig(lr=t.lr, betas=[0.9, 0.999], eps=1e-8, weight_decay=t.weight_decay)
    engine.wrap(model, lambda m: adamw(m, ocfg))
    tracker = NullTracker()
    if engine.is_main:
        out.mkdir(parents=True, exist_ok=True)
        tracker = Tracker(out, _logger_for(opts, t.name, seed), {**(opts.config or {}), "task": vars(t), "seed": seed})
    on_best = None
    if opts.save_best:
        import yaml

        checkpointer = Checkpointer(out / "best", engine, keep_last=1, config_yaml=yaml.safe_dump(
            {"model": _plain(backbone.model_cfg), "task": vars(t), "seed": seed}))
        on_best = lambda step, record: checkpointer.save({"step": step, "tokens": 0, **record}, {})  # noqa: E731
    try:
        return run_seed(t, data, seed, engine, tracker, backbone.tokenizer.pad_id, opts.micro_batch_size,
                        opts.eval_batch_size, opts.log_interval, on_best)
    finally:
        tracker.close()
        engine.close()


def _plain(model_cfg) -> Dict:
    from dataclasses import asdict

    return asdict(model_cfg)


def _logger_for(opts: RunOptions, task: str, seed: int) -> LoggerConfig:
    base = opts.logger or LoggerConfig()
    name = f"{opts.run_dir.name}-{task}-seed{seed}"
    return replace(base, job_type="finetune", name=name, tags=[*base.tags, "glue", task])


def _zip_if_complete(sub_dir: Path, info: Dict) -> None:
    """submission.zip of the eleven files when all are there and pass the leaderboard's format checks."""
    if not sub_dir.is_dir():
        return
    problems = check_submission(sub_dir)
    info["submission_problems"] = problems
    if problems:
        log.info("submission/ is not complete (%d problem(s), e.g. %s); no submission.zip", len(problems), problems[0])
        return
    tmp = sub_dir.with_name(".submission.zip.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for e in EVALS.values():
            z.write(sub_dir / f"{e.submission}.tsv", f"{e.submission}.tsv")
    shutil.move(str(tmp), str(sub_dir.with_name("submission.zip")))


def print_table(run_dir: Path) -> str:
    import json

    return results_table(json.loads((Path(run_dir) / "results.json").read_text()))


