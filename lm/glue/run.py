"""A whole finetuning job: tasks x seeds from one backbone, then results.json, results.md and submission files.

    <run_dir>/
        results.json, results.md     dev metrics per column and seed, medians, GLUE score (lm.glue.results)
        submission/<CoLA|...|AX>.tsv test predictions of each task's best-dev seed; submission.zip when all
                                     eleven files are there (what the leaderboard takes)
        <task>/seed<k>/              metrics.jsonl (+ wandb/tensorboard), best/ checkpoint when save_best,
                                     checkpoints/ while it trains (resume), result.pt (+ result.sha256) when done
        <task>/<cell>/seed<k>/       the same, per grid cell, under protocol= (lm/glue/grid.py)

Each task/seed is one `lm.core.loop.run` of a `lm.glue.trainer.GlueTask`. Rerunning the same command
(same run_dir) skips the task/seed pairs that wrote result.pt and continues the interrupted one from
its last checkpoint (every epoch end by default), so the results equal an uninterrupted run's.

The seed whose dev main metric is highest writes the submission (the usual practice of reporting the
median over seeds on dev and submitting the best dev run, e.g. RoBERTa, Liu et al. 2019).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import time
import zipfile
from collections.abc import Callable
from dataclasses import MISSING, asdict, replace
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any

from lm.core.config import LoggerConfig
from lm.core.files import atomic_write_text, file_sha256
from lm.glue.config import FinetuneSchema, GlueTaskConfig
from lm.glue.grid import GridOutcome, cell_task, cells, run_grid
from lm.glue.grid_report import protocol_record
from lm.glue.init import Backbone, build_classifier, fit_siamese_head
from lm.glue.readers import GlueDataMissing, split_path
from lm.glue.results import results_table, write_results
from lm.glue.submission import check_submission, write_submission
from lm.glue.tasks import EVALS, LEADERBOARD, OWN, get_eval, get_task
from lm.glue.trainer import GlueTask, SeedResult, load_task_data

log = logging.getLogger("lm")

RESULT = "result.pt"  # <run_dir>/<task>/seed<k>/result.pt: that pair is done (what resume skips)
RESULT_SHA256 = "result.sha256"  # its checksum, written before result.pt is renamed into place


def check_data(tasks: list[GlueTaskConfig]) -> dict[str, str]:
    """{task: why} for tasks whose train or dev split is not on disk (looked up before any training)."""
    missing = {}
    for t in tasks:
        task = get_task(t.name)
        splits = ["train", *(EVALS[c].dev for c in task.evals if EVALS[c].dev)]
        absent = [
            str(split_path(task.name, s, t.data_root))
            for s in splits
            if not split_path(task.name, s, t.data_root).is_file()
        ]
        if absent:
            missing[t.name] = "not found: " + ", ".join(absent)
    return missing


def finetune_glue(
    job: FinetuneSchema, backbone: Backbone, make_engine: Callable[[Any], Any], config: dict, dist
) -> dict[str, Any]:
    """Run every task of job.tasks for each of its seeds; returns the summary.

    make_engine(train_config) gives a fresh, unwrapped engine (lm.engine); `config` is the job's resolved
    config for the trackers; `dist` (lm.engine.dist.Dist): rank 0 writes the files, every rank trains and predicts.
    """
    missing = missing_data(job)  # task=own: read and its classes fixed in job.tasks
    from lm.glue.own import registered_for

    with registered_for(job.tasks.values()):  # task=own is in the registry for this job only
        return _finetune_tasks(job, missing, backbone, make_engine, config, dist)


def _finetune_tasks(job: FinetuneSchema, missing: dict, backbone: Backbone, make_engine, config: dict, dist) -> dict:
    tasks = list(job.tasks.values())
    run_dir = Path(job.run_dir)
    for t in missing:
        log.warning("skipping GLUE %s (skip_missing=true): %s", t, missing[t])
    tasks = [t for t in tasks if t.name not in missing]
    dev: dict[str, dict[int, dict]] = {}
    info: dict[str, Any] = {"tasks": {}, "submission": {}}
    sub_dir = run_dir / "submission"
    grids: dict[str, GridOutcome] = {}
    for t in tasks:
        results, data, grid = _run_task(t, job, backbone, make_engine, config, dist)
        if grid is not None:
            grids[t.name], t = grid, grid.task  # the task's results are its chosen cell's
        for col in data.dev:
            dev[col] = {r.seed: r.dev[col] for r in results}
        best = max(results, key=lambda r: r.main)
        info["tasks"][t.name] = {
            "config": asdict(t),
            "best_seed": best.seed,
            "runs": {
                str(r.seed): {
                    "best_epoch": r.best_epoch,
                    "main": r.main,
                    "seconds": round(r.seconds, 1),
                    "history": r.history,
                }
                for r in results
            },
        }
        for col, preds in best.test.items():
            if dist.is_main:
                write_submission(col, preds, sub_dir, data.test[col].indices)
            info["submission"][EVALS[col].submission] = {"seed": best.seed, "rows": len(preds)}
        for why in data.missing_test:
            log.warning("no submission file for %s", why)
            info["submission"][why.split(":")[0]] = {"missing": why}
    if not dev:
        raise GlueDataMissing("no GLUE task could run: " + "; ".join(f"{t}: {w}" for t, w in missing.items()))
    info["skipped_tasks"] = missing
    if job.protocol is not None:
        info["protocol"] = protocol_record(job.protocol, grids)
    if dist.is_main:
        _zip_if_complete(sub_dir, info)
        write_results(dev, run_dir, extra={**info, "init": backbone.source})
    return {"dev": dev, **info}


def missing_data(job: FinetuneSchema) -> dict[str, str]:
    """{task: why} for the job's tasks that cannot run: neither on disk nor (job.hf) readable from the Hugging Face
    hub. Unless job.skip_missing, any is refused here, before anything is trained or written (lm finetune asks
    before it makes its run directory): a job must not die at its seventh task. task=own's files are read here
    through every refusal (lm/glue/own.py), and its classes fixed in job.tasks.own."""
    from lm.glue.tasks import DOWNLOAD_HINT

    if OWN in job.tasks:  # missing or not, the user's own files are refused here (skip_missing is GLUE's)
        from lm.glue.own import resolve

        job.tasks[OWN] = resolve(job.tasks[OWN])
    tasks = [t for t in job.tasks.values() if t.name != OWN]
    missing = check_data(tasks)
    if job.skip_missing:
        return missing
    if job.hf:
        missing = {t: why + hub for t, why in missing.items() if (hub := _hub_problem(t, tasks)) is not None}
    if missing:
        lines = "\n  ".join(f"{t}: {why}" for t, why in missing.items())
        raise GlueDataMissing(
            f"GLUE data missing for {len(missing)} task(s):\n  {lines}\n{DOWNLOAD_HINT}; or set "
            f"skip_missing=true to run the tasks that are there (the GLUE score is then partial)"
        )
    return missing


def _hub_problem(name: str, tasks: list[GlueTaskConfig]) -> str | None:
    """None when the Hugging Face copy of a task that is not on disk can be read (network or HF cache), else why
    not (", and the hub is not reachable (...)"), to follow the local paths in the job's one error."""
    from lm.glue.readers import load_split
    from lm.glue.tasks import DOWNLOAD_HINT

    t = next(t for t in tasks if t.name == name)
    try:
        load_split(name, "train", t.data_root, hf=True)
        return None
    except GlueDataMissing as e:
        path = split_path(name, "train", t.data_root)
        where = f"GLUE {get_task(name).dir} train split not found: looked for {path}"  # load_split's words
        return str(e).removeprefix(where).replace(f"; {DOWNLOAD_HINT}", "")


def _run_task(t: GlueTaskConfig, job: FinetuneSchema, backbone: Backbone, make_engine, config: dict, dist):
    """(results, data, grid): the task's seeds under <run_dir>/<task>/, or under protocol= its grid's cells
    (lm/glue/grid.py: the results are the chosen cell's), all from one read of the data."""
    data = _task_data(t, job, backbone)
    task_dir = Path(job.run_dir) / t.name

    def run_seeds(cfg: GlueTaskConfig, out: Path) -> list[SeedResult]:
        return _run_seeds(cfg, data, out, job, backbone, make_engine, config, dist)

    if job.protocol is None:
        return run_seeds(t, task_dir), data, None
    grid = run_grid(t, job.protocol, task_dir, run_seeds)
    return grid.results, data, grid


def _task_data(t: GlueTaskConfig, job: FinetuneSchema, backbone: Backbone):
    max_len = t.max_len
    if max_len > backbone.model_cfg.max_seq_len:
        log.warning(
            "GLUE %s: tasks.%s.max_len=%d exceeds model.max_seq_len=%d; truncating inputs to %d tokens",
            t.name,
            t.name,
            max_len,
            backbone.model_cfg.max_seq_len,
            backbone.model_cfg.max_seq_len,
        )
        max_len = backbone.model_cfg.max_seq_len
    t0 = time.perf_counter()
    data = load_task_data(t, backbone.tokenizer, backbone.model_cfg.arch, max_len, job.hf, job.predict_test)
    log.info(
        "%s: %d train examples, dev %s, test %s (read and encoded in %.1f s)",
        f"GLUE {data.task.dir}" if data.task.name != OWN else "task=own",
        len(data.train.features),
        {c: len(s.features) for c, s in data.dev.items()},
        {c: len(s.features) for c, s in data.test.items()} if t.name != OWN else "none, so no submission file",
        time.perf_counter() - t0,
    )
    return data


def check_earlier_pairs(job: FinetuneSchema, backbone: Backbone, config: dict, skipped, dist) -> None:
    """Every task/seed pair of the job that an earlier job in run_dir finished (result.pt) or left partway
    (checkpoints/), compared with the settings this job would train it with, all before any pair trains and
    before anything is written: lm finetune calls it once it holds the run_dir. The same checks run again as
    each pair's turn comes (where they say the harmless differences); alone, they would refuse a job at its
    second task after its first had trained and config.yaml was rewritten beside results of other settings.
    `skipped`: the tasks skip_missing leaves out. Rank 0 reads the files; every rank raises its refusal."""
    from lm.config_base import ConfigError
    from lm.core.checkpoint import CheckpointError
    from lm.engine import dist as dist_utils

    error = None
    if dist.is_main:
        try:
            with _silenced(log):  # the checks' notes (a changed log interval, a moved init) come with each pair
                for t, seed, out in _pairs(job, skipped):
                    _check_pair(t, seed, out, _pair_yaml(config, backbone, t, seed))
        except (ConfigError, CheckpointError) as e:
            error = e
    error = dist_utils.broadcast_object(error)
    if error is not None:
        raise error


def _pairs(job: FinetuneSchema, skipped):
    """(task config, seed, directory) of every pair the job may run; under protocol= every cell's every seed (the
    chosen cell's other seeds run with its config)."""
    for t in job.tasks.values():
        if t.name in skipped:
            continue
        task_dir = Path(job.run_dir) / t.name
        if job.protocol is None:
            yield from ((t, seed, task_dir / f"seed{seed}") for seed in t.seeds)
            continue
        for cell in cells(job.protocol, t):
            for seed in job.protocol.seeds:
                yield cell_task(t, cell, [seed]), seed, task_dir / cell.name / f"seed{seed}"


def _check_pair(t: GlueTaskConfig, seed: int, out: Path, config_yaml: str) -> None:
    """What _run_seeds and _run_one refuse for this pair, read only: a finished result's settings (a damaged one
    trains again from scratch, nothing to compare), else those of the checkpoint it would resume from."""
    from lm.core.checkpoint import resume_point
    from lm.core.resume import FINETUNE_RESUMABLE, check_checkpoint_config

    result = out / RESULT
    if result.is_file():
        if _sealed(result):
            _load_result(result, config_yaml)
        return
    ckpt = resume_point(out / "checkpoints")
    if ckpt is not None:
        check_checkpoint_config(ckpt, config_yaml, None, FINETUNE_RESUMABLE, _start_over(t, seed, out))


def _start_over(t: GlueTaskConfig, seed: int, out: Path) -> str:
    return f"delete {out} to train {t.name} seed {seed} again with the new values"


@contextlib.contextmanager
def _silenced(logger: logging.Logger):
    def drop(_record) -> bool:
        return False

    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


def _run_seeds(
    t: GlueTaskConfig, data, task_dir: Path, job: FinetuneSchema, backbone: Backbone, make_engine, config: dict, dist
) -> list[SeedResult]:
    from lm.engine import dist as dist_utils

    results = []
    for seed in t.seeds:
        out = task_dir / f"seed{seed}"
        if job.resume and (out / RESULT).is_file() and _intact_result(out / RESULT):
            results.append(_load_result(out / RESULT, _pair_yaml(config, backbone, t, seed)))
            log.info("GLUE %s seed %d: done in an earlier run (%s), skipped", t.name, seed, out / RESULT)
        else:
            results.append(_run_one(t, data, seed, out, job, backbone, make_engine, config, dist))
        dist_utils.barrier()
    return results


def _run_one(
    t: GlueTaskConfig,
    data,
    seed: int,
    out: Path,
    job: FinetuneSchema,
    backbone: Backbone,
    make_engine,
    config: dict,
    dist,
) -> SeedResult:
    import yaml

    from lm.core.optim import lr_multiplier
    from lm.core.resume import FINETUNE_RESUMABLE
    from lm.core.session import Session

    is_main, pad_id = dist.is_main, backbone.tokenizer.pad_id
    task = GlueTask(
        t,
        data,
        seed,
        dist.rank,
        dist.world_size,
        job.train.micro_batch_size,
        pad_id,
        job.eval_batch_size,
        pad_to_multiple_of=job.glue.pad_to_multiple_of,
    )
    train_cfg = job.train.for_task(task.total, task.per_epoch)
    optim, sched = t.optim(job.optim), t.sched(job.sched, task.total)
    engine = make_engine(train_cfg)
    config_yaml = _pair_yaml(config, backbone, t, seed)
    with Session(train_cfg, engine, task, out, config_yaml) as session:
        # the head's init (and a scratch backbone's) from the seed on every rank; dropout then differs per rank
        model = session.build(lambda: _classifier(t, data, job, backbone, engine.device), seed, optim)
        if job.save_best:
            best = session.checkpointer_at(
                out / "best",
                keep_last=1,
                config_yaml=yaml.safe_dump({"model": _plain(model.cfg), "task": _plain(t), "seed": seed}),
            )
            task.save_best = lambda step, record: best.save({"step": step, "tokens": 0, **record}, {})
        # a changed setting that matters is refused before anything is loaded
        latest = session.resume_or_start(
            job.resume,
            None,
            FINETUNE_RESUMABLE,
            start_over=_start_over(t, seed, out),
        )
        if latest:
            log.info(
                "GLUE %s seed %d: resumed from %s (step %d/%d)", t.name, seed, latest, session.state.step, task.total
            )
        session.track(_logger_for(job, out, seed), {**config, "task": asdict(t), "seed": seed})
        session.train(lambda step: optim.lr * lr_multiplier(step, sched, task.total))
        result = task.result()
        if is_main:
            _save_result(out / RESULT, result, config_yaml)
            shutil.rmtree(out / "checkpoints", ignore_errors=True)  # done: result.pt is what resume reads
        return result


def _classifier(t: GlueTaskConfig, data, job: FinetuneSchema, backbone: Backbone, device):
    """The task's fresh classifier; a siamese head's whitening and score line (tasks.<task>.whiten, fit_head) are
    fit on the training pairs (on `device`) before any step."""
    spec = get_task(t.name)
    pooling = job.pooling and job.pooling.value
    model = build_classifier(
        backbone, spec.n_labels, t.dropout, pooling, job.bidirectional, str(t.pair_input), spec.score_range, t.whiten
    )
    if t.whiten or t.fit_head:
        fit_siamese_head(model, data.train.features, backbone.tokenizer.pad_id, t.whiten, t.fit_head, device=device)
    return model


def _save_result(path: Path, result: SeedResult, config_yaml: str) -> None:
    import torch

    from lm.core.rng import plain_state

    tmp = path.with_name(path.name + ".tmp")
    # numbers, strings and tensors only: it loads with weights_only; the pair's config is what a rerun compares
    torch.save({**plain_state(asdict(result)), "config_yaml": config_yaml}, tmp)
    atomic_write_text(path.with_name(RESULT_SHA256), file_sha256(tmp))  # before the rename: result.pt is never unsealed
    os.replace(tmp, path)


def _sealed(path: Path) -> bool:
    """Whether result.pt matches the sha256 written with it (one written before checksums: assumed intact)."""
    sealed = path.with_name(RESULT_SHA256)
    return not sealed.is_file() or sealed.read_text().strip() == file_sha256(path)


def _intact_result(path: Path) -> bool:
    """_sealed; a damaged one is named, and the pair trains again from scratch (the same seed gives the same
    result)."""
    if _sealed(path):
        return True
    sealed = path.with_name(RESULT_SHA256)
    log.warning("%s is damaged (it does not match the sha256 in %s); training this task/seed again", path, sealed)
    shutil.rmtree(path.parent / "checkpoints", ignore_errors=True)
    return False


def _load_result(path: Path, config_yaml: str) -> SeedResult:
    """The finished pair's result; refused when the job's settings for the pair changed since (a job's
    results.json must not mix results of different settings)."""
    from lm.core.resume import FINETUNE_RESUMABLE, refuse_changes

    fields = _read_result(path)
    saved_yaml = fields.pop("config_yaml", None)  # None: written before result.pt recorded it
    if saved_yaml is not None:
        config_yaml = _with_moved_paths(saved_yaml, config_yaml, path)
        refuse_changes(
            saved_yaml,
            config_yaml,
            FINETUNE_RESUMABLE,
            f"reuse the finished {path}",
            path,
            f"delete {path.parent} to train this task/seed again with the new values",
            TASK_DEFAULTS,
        )
    fields["test"] = {col: preds.numpy() for col, preds in fields["test"].items()}
    return SeedResult(**fields)


# a GlueTaskConfig field added since a pair finished had its default there (tasks.stsb.whiten: false)
TASK_DEFAULTS = {
    f"task.{f.name}": getattr(f.default, "value", f.default)  # an Enum as config.yaml writes it
    for f in dataclass_fields(GlueTaskConfig)
    if f.default is not MISSING and f.name != "name"
}


def _read_result(path: Path) -> dict:
    """result.pt's fields; weights_only, so a result.pt from elsewhere cannot run code. One that does not
    load (crafted, or damaged without a result.sha256 to say so) is refused in one line, kept for inspection."""
    import pickle

    import torch

    from lm.core.checkpoint import CheckpointError

    try:
        fields = torch.load(path, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as e:
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CheckpointError(
            f"{path} is not a result lm finetune wrote, or is damaged ({why}); delete "
            f"{path.parent} to train this task/seed again"
        ) from None
    if not isinstance(fields, dict) or "test" not in fields:
        raise CheckpointError(
            f"{path} is not a result lm finetune wrote (no test predictions in it); delete "
            f"{path.parent} to train this task/seed again"
        )
    return fields


def _with_moved_paths(saved_yaml: str, config_yaml: str, path: Path) -> str:
    """config_yaml with the pair's recorded init and tokenizer paths where the new path holds the same thing:
    init the same checkpoint (a pretraining run copied or moved: the same manifest digest, both verified),
    tokenizer one with the same sha256 (a corpus prepared again, or another corpus config that shares its
    tokenizer). So a finished pair is not trained again for a new path to the same weights or vocabulary;
    config_yaml is unchanged otherwise, and the resume check refuses the paths' difference."""
    import yaml

    saved, new = yaml.safe_load(saved_yaml), yaml.safe_load(config_yaml)
    moved = {}
    for key, digest in (("init", _checkpoint_digest), ("tokenizer", _tokenizer_digest)):
        old, cur = saved.get(key), new.get(key)
        recorded = old != cur and digest(old)  # the recorded path's digest, when the paths differ
        if recorded and recorded == digest(cur):
            log.info(
                "GLUE %s: %s %s holds the same %s as the recorded %s (sha256 %s)",
                path.parent,
                key,
                cur,
                "checkpoint" if key == "init" else "tokenizer",
                old,
                recorded[:12],
            )
            moved[key] = old
    return yaml.safe_dump({**new, **moved}) if moved else config_yaml


def _tokenizer_digest(tokenizer) -> str | None:
    """The sha256 of the tokenizer a tokenizer= path (a tokenizer.json or a prepared data dir) loads; None for
    null or a path without a loadable tokenizer."""
    from lm.data.tokenizer import Tokenizer, TokenizerError

    try:
        return Tokenizer.load(tokenizer).sha256 if tokenizer else None
    except (TokenizerError, OSError):
        return None


@functools.lru_cache(maxsize=8)
def _checkpoint_digest(init) -> str | None:
    """The manifest sha256 of the verified checkpoint an init= path resolves to; None for init=none, an
    export, a missing path or a damaged or manifest-less checkpoint."""
    from lm.core.checkpoint import CheckpointError, read_trainer, resolve, verified

    if init is None or str(init).lower() in ("none", "scratch", ""):
        return None
    try:
        return read_trainer(verified(resolve(Path(init).expanduser()))).get("manifest_sha256")
    except (CheckpointError, OSError):
        return None


def _pair_yaml(config: dict, backbone: Backbone, t: GlueTaskConfig, seed: int) -> str:
    import yaml

    return yaml.safe_dump(pair_config(config, backbone, t, seed))


def pair_config(config: dict, backbone: Backbone, t: GlueTaskConfig, seed: int) -> dict:
    """The config a task/seed pair's checkpoints record and resume compares (FINETUNE_RESUMABLE in
    lm/core/resume.py): the job's, with the pair's own settings under `task` instead of every task's
    `tasks`, the model as built (with init=<run> that is the checkpoint's model, not `model=`) and which
    weights init= held (`init_weights`). A grid cell's lr, batch size and epochs are in its `task`; the
    `protocol` node, which only says which cells run, is left out, so a grid extended later reuses the cells
    it finished."""
    rest = {k: v for k, v in config.items() if k not in ("tasks", "model", "protocol")}  # `task` holds a cell's own
    pair = {**rest, "model": _plain(backbone.model_cfg), "task": _plain(t), "seed": seed}
    # the weights init= held (None: init=none): a run pretrained further since is another start, though its path
    # is the same; a pair finished before this was recorded lacks the key, and is compared without it
    return {**pair, "init_weights": backbone.weights}


def _plain(dataclass_obj) -> dict:
    """A config dataclass as plain types (Enums as their values), for yaml.safe_dump."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.structured(dataclass_obj), enum_to_str=True)


def _logger_for(job: FinetuneSchema, out: Path, seed: int) -> LoggerConfig:
    """The pair's tracker run, named by its directory: <run_dir name>-<task>[-<grid cell>]-seed<k>."""
    base = job.logger
    task, *cell = out.relative_to(job.run_dir).parts[:-1]
    name = "-".join([Path(job.run_dir).name, task, *cell, f"seed{seed}"])
    return replace(base, job_type="finetune", name=name, tags=[*base.tags, "glue", task])


def _zip_if_complete(sub_dir: Path, info: dict) -> None:
    """submission.zip of the eleven files when all are there and pass the leaderboard's format checks."""
    if not sub_dir.is_dir():
        return
    problems = check_submission(sub_dir)
    info["submission_problems"] = problems
    if problems:
        log.info("%s", incomplete_submission(sub_dir, problems))
        return
    tmp = sub_dir.with_name(".submission.zip.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for e in map(get_eval, LEADERBOARD):
            z.write(sub_dir / f"{e.submission}.tsv", f"{e.submission}.tsv")
    shutil.move(str(tmp), str(sub_dir.with_name("submission.zip")))


def incomplete_submission(sub_dir: Path, problems: list[str]) -> str:
    """Why no submission.zip: a run of some tasks lacks the other tasks' files (expected, said as a count and how
    to get them all); a file the leaderboard would reject is named with its first problem."""
    bad = [p for p in problems if not p.endswith(": missing")]
    if bad:
        return f"submission/ is not complete ({len(problems)} problem(s), e.g. {bad[0]}); no submission.zip"
    return (
        f"{sub_dir}: {len(LEADERBOARD) - len(problems)} of the {len(LEADERBOARD)} leaderboard files; submission.zip is "
        f"written when a run has them all (task=glue/all: the nine tasks, AX from MNLI's model)"
    )


def print_table(run_dir: Path) -> str:
    import json

    return results_table(json.loads((Path(run_dir) / "results.json").read_text()))
