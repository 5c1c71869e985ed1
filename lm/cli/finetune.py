"""`lm-finetune`: finetune a pretrained (or a fresh) model on GLUE tasks; the loop and engines are lm-train's.

    lm-finetune task=glue/sst2 init=runs/pretrain                  # checkpoints/latest of an lm-train run
    lm-finetune task=glue/all init=runs/pretrain skip_missing=true  # every task whose data is local
    lm-finetune task=glue/rte init=runs/pretrain/checkpoints/step_00000500/export   # an lm-export directory
    lm-finetune task=glue/mrpc init=none model=tiny model.vocab_size=4096 tokenizer=<data dir>  # baseline
    lm-finetune task=glue/cola init=runs/pretrain task.seeds=[0,1,2,3,4] task.lr=3e-4 logger=wandb

Writes <run_dir>/results.json, results.md (printed at the end) and submission/*.tsv; see lm/glue/run.py.
Data: the official GLUE TSVs under task.data_root, else $LM_DATA_MIRROR/glue_data, else ./glue_data,
else the Hugging Face `nyu-mll/glue` copy (hf=true, needs network).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional

from omegaconf import MISSING, DictConfig, OmegaConf

from lm.config import ConfigError, register_glue_configs, register_train_configs, to_typed
from lm.core.config import LoggerConfig, TrainConfig
from lm.core.files import atomic_write_text

log = logging.getLogger("lm")


@dataclass
class FinetuneTrain(TrainConfig):
    """lm-train's TrainConfig (engines read it); here micro_batch_size splits each task's batch."""

    micro_batch_size: int = 32
    log_interval: int = 50


@dataclass
class FinetuneSchema:
    """The top of conf/finetune.yaml: unknown keys fail at composition."""

    task: Any = None  # conf/task/glue/<name>.yaml (GlueTaskConfig)
    model: Any = None  # init=none only: the model to build (conf/model/)
    engine: Any = None
    logger: LoggerConfig = field(default_factory=lambda: LoggerConfig(job_type="finetune"))
    train: FinetuneTrain = field(default_factory=FinetuneTrain)
    init: str = MISSING  # lm-train run dir | checkpoint dir | lm-export dir | none
    tokenizer: Optional[str] = None  # tokenizer.json or a prepared data dir; default: the checkpoint's own
    run_dir: str = "runs/finetune/${lm.stamp:}"
    seed: int = 0  # unused by the tasks (task.seeds are the seeds); kept for sweeps that tag runs
    predict_test: bool = True  # write the leaderboard's submission files
    save_best: bool = False  # also save the best-dev weights under <run_dir>/<task>/seed<k>/best
    hf: bool = True  # read the Hugging Face copy of a split that is not on disk
    skip_missing: bool = False  # run only tasks whose data is local (the GLUE score is then partial)
    pooling: Optional[str] = None  # first | last | mean; None = first for encoders, last otherwise
    eval_batch_size: int = 128
    # {task or "all": {field: value}} on top of each task's preset, e.g. per_task.all.lr=3e-4 or
    # per_task.sst2.epochs=1: with task=glue/all every task runs its own preset, so task.<field> does not reach it.
    per_task: Dict[str, Dict[str, Any]] = field(default_factory=dict)


def register() -> None:
    from hydra.core.config_store import ConfigStore

    register_train_configs()
    register_glue_configs()
    ConfigStore.instance().store(name="finetune_schema", node=FinetuneSchema)


def finetune(cfg: DictConfig):
    """One lm-finetune job (also the Python API: compose conf/finetune.yaml, then call this)."""
    from hydra.utils import get_class, instantiate

    from lm.engine import dist as D
    from lm.glue.init import load_backbone
    from lm.glue.run import RunOptions, finetune_glue
    from lm.core.setup import engine_class, make_engine, quiet_other_ranks

    if OmegaConf.is_missing(cfg, "init"):
        raise ConfigError("say where the model starts: init=<lm-train run dir or checkpoint dir or lm-export dir>, "
                          "or init=none (random weights; then also model=<preset> and tokenizer=<path>)")
    tcfg = to_typed(FinetuneTrain, cfg.train, "train")
    engine_cls = engine_class(cfg, get_class)
    dist = D.init(D.pick_device(tcfg.device), need_group=engine_cls.needs_process_group, expected=tcfg.world_size)
    quiet_other_ranks(dist)
    backbone = _load_in_turn(lambda: load_backbone(cfg.init, cfg.tokenizer, cfg.model), dist)
    run_dir = Path(cfg.run_dir)
    config = OmegaConf.to_container(cfg, resolve=True)
    if dist.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    logger = to_typed(LoggerConfig, cfg.logger, "logger")
    logger.group = logger.group or _pretraining_group(backbone.pretrain)
    opts = RunOptions(run_dir=run_dir, make_engine=lambda: make_engine(cfg, instantiate, tcfg, dist),
                      micro_batch_size=tcfg.micro_batch_size, eval_batch_size=cfg.eval_batch_size,
                      log_interval=tcfg.log_interval, logger=logger, predict_test=cfg.predict_test,
                      save_best=cfg.save_best, hf=cfg.hf, skip_missing=cfg.skip_missing, pooling=cfg.pooling,
                      config=config, is_main=dist.is_main, per_task=OmegaConf.to_container(cfg.per_task, resolve=True))
    return finetune_glue(cfg.task, backbone, opts)


def _load_in_turn(load, dist):
    """Every rank loads the backbone, one rank at a time: consolidating a sharded (FSDP2/DCP) checkpoint
    writes a scratch file next to it, which concurrent readers would delete under each other. A failure
    on any rank stops every rank (no rank is left waiting at a barrier)."""
    from lm.engine import dist as D

    backbone, error = None, None
    for r in range(dist.world_size):
        if dist.rank == r:
            try:
                backbone = load()
            except Exception as e:  # noqa: BLE001 - re-raised below on this rank; the others stop too
                error = e
        if D.any_rank(error is not None):
            raise error if error else ConfigError(f"rank {r} could not load the init checkpoint (see its error)")
    return backbone


def _pretraining_group(pretrain: Optional[dict]) -> Optional[str]:
    """Finetunes join their pretraining run's wandb group (its logger.group, else its run directory name)."""
    if not pretrain:
        return None
    return (pretrain.get("logger") or {}).get("group") or Path(str(pretrain.get("run_dir", ""))).name or None



def main() -> None:
    from lm.cli.app import run_app
    from lm.core.checkpoint import CheckpointError
    from lm.data.tokenizer import TokenizerError
    from lm.engine import dist as D
    from lm.glue.readers import GlueDataError
    from lm.glue.run import print_table
    from lm.core.loop import LossDiverged

    def job(cfg: DictConfig) -> None:
        finetune(cfg)
        if D.launched_world_size() == 1 or int(os.environ.get("RANK", 0)) == 0:
            print(print_table(cfg.run_dir))
            print(f"results: {Path(cfg.run_dir) / 'results.json'}; submission files: {Path(cfg.run_dir) / 'submission'}")

    register()
    run_app("lm-finetune", "finetune", job, (ConfigError, CheckpointError, LossDiverged, GlueDataError, TokenizerError))


if __name__ == "__main__":
    main()
