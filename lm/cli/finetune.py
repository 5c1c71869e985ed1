"""`lm finetune`: finetune a pretrained (or a fresh) model on GLUE tasks; the loop and engines are lm train's.

    lm finetune task=glue/sst2 init=runs/pretrain                  # checkpoints/latest of an lm train run
    lm finetune task=glue/all init=runs/pretrain skip_missing=true  # every task whose data is local
    lm finetune task=glue/rte init=runs/pretrain/checkpoints/step_00000500/export   # an lm export directory
    lm finetune task=glue/mrpc init=none model=tiny model.vocab_size=4096 tokenizer=<data dir>  # baseline
    lm finetune task=glue/cola init=runs/pretrain tasks.cola.seeds=[0,1,2,3,4] tasks.cola.lr=3e-4 logger=wandb
    lm finetune 'task=[glue/rte,glue/mrpc]' init=runs/pretrain optim.lr=3e-4   # two tasks, one lr for both
    lm finetune task=glue/all init=runs/pretrain protocol=turc   # per task: lr x batch grid, best on dev, 3 seeds
    lm finetune task=own init=runs/pretrain tasks.own.train_file=train.csv tasks.own.dev_file=dev.csv  # your files

Writes <run_dir>/results.json, results.md (printed at the end) and submission/*.tsv; see lm/glue/run.py.
The config grammar is in lm/glue/config.py. The same command (same run_dir) resumes an interrupted job.
Data: the official GLUE TSVs under glue.data_root (or tasks.<task>.data_root), else $LM_DATA_MIRROR/glue_data,
else ./glue_data, else the Hugging Face `nyu-mll/glue` copy (hf=true, needs network).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from lm.cli.errors import entry
from lm.config import ConfigError, register_train_configs
from lm.core.files import atomic_write_text
from lm.glue.config import check_task_args, finetune_job, register_glue_configs

log = logging.getLogger("lm")


def register() -> None:
    register_train_configs()
    register_glue_configs()


def finetune(cfg: DictConfig, keep: tuple[str, ...] = ()):
    """One lm finetune job (also the Python API: compose conf/finetune.yaml, then call this). `keep`: files of the
    caller's in run_dir that resume=false leaves in place (lm transfer's scratch arm record and lane log)."""
    from hydra.utils import get_class, instantiate

    from lm.core.config import Precision
    from lm.core.lock import held_run_dir
    from lm.core.setup import engine_class, make_engine, quiet_other_ranks, resolve_precision, use_threads
    from lm.engine import dist as dist_utils
    from lm.glue.init import load_backbone
    from lm.glue.run import check_earlier_pairs, finetune_glue, missing_data

    job = finetune_job(cfg)  # typed and validated, once
    check_run_dir(Path(job.run_dir), job.init)  # before anything is loaded or written
    quiet_other_ranks(int(os.environ.get("RANK", 0)))  # before what missing_data says (task=own's classes)
    skipped = missing_data(job)  # a task without data is refused here, before the run directory is made
    # The job's record, made once here: below this line only typed objects, text and plain dicts travel.
    config_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    config = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    use_threads(job.train.threads)
    engine_cls = engine_class(job, get_class)
    dist = dist_utils.init(
        dist_utils.pick_device(job.train.device),
        need_group=engine_cls.needs_process_group,
        expected=job.train.world_size,
    )
    if job.train.precision == Precision.auto:  # chosen (and said) once for every task and seed of the job
        job.train = resolve_precision(job.train, dist.device, dist.is_main)
    backbone = _load_in_turn(lambda: load_backbone(job.init, job.tokenizer, job.model), dist)
    run_dir = Path(job.run_dir)
    with held_run_dir(run_dir, dist):  # rank 0 creates it and holds <run_dir>/.lock; a second job refuses
        if job.resume:  # every pair an earlier job trained, checked before any trains and before a file is written
            check_earlier_pairs(job, backbone, config, skipped, dist)
        if dist.is_main:
            if not job.resume:
                _set_aside(run_dir, keep)
            atomic_write_text(run_dir / "config.yaml", config_yaml)
        dist_utils.barrier()  # no rank looks at the run_dir before an earlier job has left it
        job.logger.group = job.logger.group or _pretraining_group(backbone.pretrain)
        return finetune_glue(
            job, backbone, lambda train_cfg: make_engine(job, instantiate, train_cfg, dist), config, dist
        )


def check_run_dir(run_dir: Path, init: str | None) -> None:
    """A finetune run_dir is new, an earlier lm finetune's (resumed), or holds no other command's run: lm finetune
    writes its config.yaml, results and task directories into it, which would overwrite a pretraining run's
    config.yaml (what its resume compares) or mix with another run's files."""

    def foreign(d: Path) -> str | None:
        if (d / "checkpoints").is_dir():
            return "an lm train run (it holds checkpoints/)"
        config = d / "config.yaml"
        if config.is_file() and not _is_finetune_config(config):
            return "another command's run (its config.yaml is not an lm finetune config)"
        return None

    fix = f"pick a new run_dir, e.g. run_dir={run_dir.parent / (run_dir.name + '_finetune')}"
    if not run_dir.is_dir():
        return
    why = foreign(run_dir)
    if why:
        raise ConfigError(
            f"run_dir={run_dir} is {why}; lm finetune would write its config.yaml and results into it: {fix}"
        )
    for child in sorted(p for p in run_dir.iterdir() if p.is_dir()):
        why = foreign(child)
        if why:
            raise ConfigError(
                f"run_dir={run_dir} holds {child.name}/, {why}; lm finetune would write its "
                f"config.yaml and results beside it: {fix}"
            )
    if init and str(init).lower() not in ("none", "scratch", ""):
        source = Path(init).expanduser().resolve()
        if source.exists() and source.is_relative_to(run_dir.resolve()):
            raise ConfigError(f"run_dir={run_dir} holds init={init}, the model finetuning starts from: {fix}")


def _set_aside(run_dir: Path, keep: tuple[str, ...] = ()) -> None:
    """resume=false: an earlier job's results, submission and task directories moved to run_dir/previous/<UTC time>/
    (lm.core.session.set_aside), so starting over neither writes over them nor resumes a pair from its checkpoints."""
    from lm.core.lock import LOCK_NAME
    from lm.core.session import set_aside

    kept = ("previous", LOCK_NAME, ".hydra", *keep)  # .hydra: a sweep cell's, which Hydra wrote for this job
    records = sorted(p.name for p in run_dir.iterdir() if p.name not in kept)
    set_aside(run_dir, records, marks=[r for r in records if r != "config.yaml"])


def _is_finetune_config(path: Path) -> bool:
    import yaml

    try:
        cfg = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(cfg, dict) and "tasks" in cfg and "init" in cfg


def _load_in_turn(load, dist):
    """Every rank loads the backbone, one rank at a time: consolidating a sharded (FSDP2/DCP) checkpoint
    writes a scratch file next to it, which concurrent readers would delete under each other. A failure
    on any rank stops every rank (no rank is left waiting at a barrier)."""
    from lm.engine import dist as dist_utils

    backbone, error = None, None
    for r in range(dist.world_size):
        if dist.rank == r:
            try:
                backbone = load()
            except Exception as e:  # noqa: BLE001 - re-raised below on this rank; the others stop too
                error = e
        if dist_utils.any_rank(error is not None):
            raise error if error else ConfigError(f"rank {r} could not load the init checkpoint (see its error)")
    return backbone


def _pretraining_group(pretrain: dict | None) -> str | None:
    """Finetunes join their pretraining run's wandb group (its logger.group, else its run directory name)."""
    if not pretrain:
        return None
    return (pretrain.get("logger") or {}).get("group") or Path(str(pretrain.get("run_dir", ""))).name or None


@entry("lm finetune")
def main() -> None:
    from lm.cli.app import run_app
    from lm.engine import dist as dist_utils
    from lm.glue.run import print_table

    def job(cfg: DictConfig) -> None:
        finetune(cfg)
        if dist_utils.launched_world_size() == 1 or int(os.environ.get("RANK", 0)) == 0:
            print(print_table(cfg.run_dir))
            sub = Path(cfg.run_dir) / "submission"  # none for task=own alone (it has no test split)
            print(f"results: {Path(cfg.run_dir) / 'results.json'}" + (f"; submission files: {sub}" * sub.is_dir()))

    register()
    run_app("lm finetune", "finetune", job, check_args=check_task_args)


if __name__ == "__main__":
    main()
