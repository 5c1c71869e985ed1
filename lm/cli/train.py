"""`lm train`: compose the config, build model, data and engine, resume if possible, run the loop.

    lm train model=tiny data=shakespeare_char train.max_steps=200 run_dir=runs/smoke
    torchrun --nproc_per_node 2 -m lm.cli.train engine=zero2 run_dir=runs/z2
    accelerate launch --multi_gpu --num_processes 2 -m lm.cli.train engine=ddp run_dir=runs/ddp
    deepspeed --num_gpus 2 --module lm.cli.train engine=zero3 run_dir=runs/z3

Run the same command again (same run_dir) and it continues from <run_dir>/checkpoints/latest.
"""

import logging
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lm.cli.errors import entry
from lm.config import ConfigError, check_known_keys, check_seeds, explain, register_train_configs, run_schema
from lm.constants import BERT_MLM_CORRUPTION
from lm.core.config import TrainConfig, resolve_batch, short_schedule, validate_train
from lm.core.elastic import keep_global_batch
from lm.core.files import atomic_write_text
from lm.core.objectives import training_flops_per_token
from lm.core.setup import engine_class, make_engine, quiet_other_ranks, use_threads
from lm.data.config import DataConfig

log = logging.getLogger("lm")


@dataclass
class Trained:
    state: Any  # lm.core.loop.State at the end
    engine: Any  # the wrapped engine (its model holds the trained weights)
    run_dir: Path


def typed_run(cfg: DictConfig):
    """The composed config as dataclasses (RunSchema of lm/config.py), converted once: everything below
    receives typed sections. Hydra has checked keys, types and choices while composing."""
    from omegaconf.errors import OmegaConfBaseException

    check_known_keys(cfg)  # a `+key=` that no schema field reads
    try:
        run = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:  # e.g. a ??? value left missing
        raise ConfigError(f"the config cannot be completed: {explain(e)}") from None
    if not isinstance(run, run_schema()):
        raise ConfigError(
            "the config was not composed on the run schema; compose conf/train.yaml "
            "(its defaults list run_schema first)"
        )
    return run


def train(cfg: DictConfig, loaders=None) -> "Trained | None":
    """One run. `loaders` = (train, val) replaces the packed loaders of cfg.data (tests, benchmarks). None: a
    sweep's cell that had finished already (_finished_cell)."""
    from hydra.utils import get_class, instantiate

    from lm.core import loop
    from lm.core.lock import held_run_dir
    from lm.core.objectives import objective_for
    from lm.core.optim import lr_multiplier
    from lm.core.pretrain_task import PretrainTask
    from lm.core.session import Session, set_aside
    from lm.core.tracking import device_peak_flops
    from lm.engine import dist as dist_utils
    from lm.model import build_model

    run = typed_run(cfg)
    # The run's record, made once here: below this line only typed objects, text and plain dicts travel.
    config_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    config = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    train_cfg, optim_cfg, sched_cfg, model_cfg = run.train, run.optim, run.sched, run.model
    _check(run)
    refuse_foreign_config(Path(run.run_dir))
    use_threads(train_cfg.threads)  # small CPU models can run faster on one thread than on two (no fork/join per op)
    engine_cls = engine_class(run, get_class)
    device = dist_utils.pick_device(train_cfg.device)
    dist = dist_utils.init(device, need_group=engine_cls.needs_process_group, expected=train_cfg.world_size)
    quiet_other_ranks(dist.rank)
    checked = _check_eval_tasks(run, dist)  # a mistyped task: before the data, the model or the run_dir
    if dist.is_main and short_schedule(train_cfg, sched_cfg):
        log.warning("%s", short_schedule(train_cfg, sched_cfg))
    train_cfg = resolve_batch(train_cfg, dist.world_size)  # grad_accum derived from global_batch_size (a copy)
    if run.resume:  # on another world size, grad_accum keeps the checkpoint's global batch (lm/core/elastic.py)
        train_cfg = keep_global_batch(train_cfg, Path(run.run_dir), dist.world_size, dist.is_main)
    engine = make_engine(run, instantiate, train_cfg, dist)

    run_dir = Path(run.run_dir)
    with held_run_dir(run_dir, dist):  # rank 0 creates it and holds <run_dir>/.lock; a second run refuses
        if loaders is None:
            train_loader, val_loader, vocab = _packed_loaders(
                run.data,
                train_cfg,
                dist,
                objective_for(model_cfg.arch),
                run.seed,
                model_cfg.decoder_start_token_id,
                model_cfg.mlm_corruption,
            )
            if vocab > model_cfg.vocab_size:  # the record says what was built: export and resume read it
                model_cfg = _vocab_follows_tokenizer(cfg, model_cfg, vocab, dist.is_main)
                config_yaml = OmegaConf.to_yaml(cfg, resolve=True)
                config = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
        else:
            train_loader, val_loader = loaders

        if run.resume and _finished_cell(run_dir, config_yaml, train_cfg.max_steps, dist):
            return None
        if not run.resume:
            if dist.is_main:
                set_aside(run_dir)
            dist_utils.barrier()  # no rank looks at the run_dir before the old run has left it
        task = PretrainTask(
            train_loader,
            val_loader,
            train_cfg.grad_accum,
            train_cfg.eval_batches,
            train_cfg.batch_ramp_steps,
            perplexity=model_cfg.family is None or model_cfg.family.nll_loss,
        )
        with Session(train_cfg, engine, task, run_dir, config_yaml, log_file=run_dir / "train.log") as session:
            session.build(lambda: build_model(model_cfg), run.seed, optim_cfg)
            latest = session.resume_or_start(run.resume, train_cfg.max_steps)  # a changed model, data, ... is refused
            if latest and dist.is_main:
                log.info("resumed from %s (step %d)", latest, session.state.step)
            complete = latest is not None and session.state.step >= train_cfg.max_steps
            if dist.is_main:
                if not complete:  # a complete run's record keeps the settings its weights trained under
                    atomic_write_text(run_dir / "config.yaml", config_yaml)
                    _record_overrides(run_dir)
                _log_start(engine, dist.world_size, device, train_cfg, run_dir)
            session.track(_sweep_logger(run.logger, run_dir), config)
            speed = loop.Speed(
                training_flops_per_token(
                    model_cfg, train_cfg.seq_len, run.data.noise_density, run.data.mean_span_length
                ),
                device_peak_flops(device, train_cfg.peak_flops),
            )
            state = session.train(
                lambda step: optim_cfg.lr * lr_multiplier(step, sched_cfg, train_cfg.max_steps),
                speed,
                _downstream(train_cfg, model_cfg, run.data, engine, checked),
            )  # [] with probe_interval=0 and eval_tasks=[]
            return Trained(state=state, engine=engine, run_dir=run_dir)


def _check(run) -> None:
    """Refuse, before anything is built, a config that composed but cannot train: the train and model sections'
    own checks, a model override the model would not read, an objective the model cannot learn, windows longer
    than the model's positions."""
    from lm.core.objectives import objective_for
    from lm.model import validate_model
    from lm.model.validate import check_objective, refuse_unread

    train_cfg, model_cfg = run.train, run.model
    check_seeds("seed", [run.seed], "seed=1337")
    validate_train(train_cfg, run.optim, run.sched)
    validate_model(model_cfg)
    refuse_unread(model_cfg)  # an override the model would not read: the user's config only, never a saved one
    check_objective(model_cfg, objective_for(model_cfg.arch))  # e.g. a bidirectional RNN cannot learn clm
    if train_cfg.seq_len > model_cfg.max_seq_len:
        raise ConfigError(
            f"train.seq_len={train_cfg.seq_len} exceeds model.max_seq_len={model_cfg.max_seq_len}; "
            f"lower train.seq_len or raise model.max_seq_len"
        )


def refuse_foreign_config(run_dir: Path) -> None:
    """A run_dir whose config.yaml is not an lm train run's (a file of the user's, an lm finetune job's record) is
    refused before anything is written: lm train writes its own config.yaml there, which replaced it without a word
    (resume=false sets aside only a run's files, lm/core/session.py RUN_MARKS)."""
    import yaml

    path = run_dir / "config.yaml"
    if not path.is_file():
        return
    try:
        cfg = yaml.safe_load(path.read_text())
    except (OSError, ValueError, yaml.YAMLError):  # ValueError: not UTF-8
        cfg = None
    keys = set(cfg) if isinstance(cfg, dict) else set()
    if {"model", "train", "optim", "data"} <= keys and "tasks" not in keys:  # lm finetune's has tasks and init
        return
    whose = "an lm finetune job's" if {"tasks", "init"} <= keys else "not an lm train run's"
    raise ConfigError(
        f"run_dir={run_dir} holds a config.yaml that is {whose}; lm train would write its own config.yaml over it: "
        f"pick a new run_dir (e.g. run_dir={run_dir.parent / (run_dir.name + '_pretrain')}), or move the file"
    )


def _log_start(engine, world_size: int, device, train_cfg: TrainConfig, run_dir: Path) -> None:
    """The run's first log line (rank 0): engine, ranks, device, size, the tokens of one step."""
    log.info(
        "%s on %d rank(s), %s, %d params, %d sequences of %d tokens per step, run_dir %s",
        engine.name,
        world_size,
        device,
        engine.numel(),  # ZeRO-3's partitioned parameters are empty tensors here
        train_cfg.micro_batch_size * train_cfg.grad_accum * world_size,
        train_cfg.seq_len,
        run_dir,
    )
    if train_cfg.batch_ramp_steps:
        log.info(
            "batch ramp: 1 to %d micro-batches per step over the first %d steps",
            train_cfg.grad_accum,
            train_cfg.batch_ramp_steps,
        )


def _sweep_logger(logger, run_dir: Path):
    """A sweep cell's tracker run, unless the config says otherwise: in the sweep directory's wandb group, named
    <sweep>/<cell>, tagged with the cell's overrides. Else a plain `lm train -m` gave runs named 0, 1, ... in no
    group, which a dashboard cannot tell apart from another sweep's 0, 1, ...."""
    from hydra.core.hydra_config import HydraConfig

    from lm.cli.app import in_multirun

    if not in_multirun():
        return logger
    sweep = run_dir.resolve().parent.name
    return replace(
        logger,
        group=logger.group or sweep,
        name=logger.name or f"{sweep}/{run_dir.name}",
        tags=logger.tags or list(HydraConfig.get().overrides.task),
    )


def _finished_cell(run_dir: Path, config_yaml: str, max_steps: int, dist) -> bool:
    """Inside a sweep (lm train -m) run again after it stopped: this cell's checkpoint is at train.max_steps, so
    the cell is skipped before it builds anything or writes a file (its config checked like a resume's first:
    a changed one is refused). A single run's rerun goes on to load it (and logs that nothing is left to train)."""
    from lm.cli.app import in_multirun
    from lm.core.checkpoint import CheckpointError, read_trainer, resume_point
    from lm.core.resume import check_resume
    from lm.engine import dist as dist_utils

    if not in_multirun():
        return False
    found = None
    if dist.is_main:
        try:
            latest = resume_point(run_dir / "checkpoints")
            found = (latest, read_trainer(latest)["step"]) if latest else None
        except CheckpointError:
            found = None  # damaged: the resume names it (or falls back to an older checkpoint)
    found = dist_utils.broadcast_object(found)
    if found is None or found[1] < max_steps:
        return False
    check_resume(found[0], config_yaml, max_steps, dist)
    if dist.is_main:
        log.info("run_dir %s finished at step %d (train.max_steps): this cell is skipped", run_dir, found[1])
    return True


def _record_overrides(run_dir: Path) -> None:
    """A sweep cell's overrides beside its config.yaml (overrides.yaml), for lm report to name its variant by.
    Hydra writes <cell>/.hydra/overrides.yaml before every job, also for a rerun with a changed grid that this
    cell then refuses (other overrides than its run's): the copy taken here, when the run writes its record,
    keeps naming what the run trained with."""
    hydra_record = run_dir / ".hydra" / "overrides.yaml"
    if hydra_record.is_file():
        atomic_write_text(run_dir / "overrides.yaml", hydra_record.read_text())


def _vocab_follows_tokenizer(cfg: DictConfig, model_cfg, vocab: int, is_main: bool):
    """A model whose vocabulary is smaller than the data's tokenizer (`vocab`; the caller checks) grows to it
    (rounded up to a multiple of 64), in the typed config and in the composed one that config.yaml records, so
    export, finetuning and resume see the model as built. A larger vocabulary is kept: presets pad theirs for
    speed (GPT-2's 50304)."""
    from lm.model import validate_model

    size = _round_up(vocab, 64)
    if is_main:
        log.info(
            "model.vocab_size=%d: the data's tokenizer has %d tokens (model.vocab_size was %d)",
            size,
            vocab,
            model_cfg.vocab_size,
        )
    cfg.model.vocab_size = size
    model_cfg = replace(model_cfg, vocab_size=size)
    validate_model(model_cfg)
    return model_cfg


def _prepare_on_main(data: DataConfig, dist) -> None:
    """Prepare the data on rank 0 while the other ranks wait, however long it takes (a corpus prepared on first use
    takes as long as its size; a collective of the default group gave up after 30 minutes); an error is raised on
    every rank."""
    from lm.data.prepare import ensure_prepared
    from lm.engine import dist as dist_utils

    with dist_utils.patient_group() as group:
        error = None
        if dist.is_main:
            try:
                ensure_prepared(data)
            except Exception as e:  # noqa: BLE001 - reported on every rank below, then re-raised here
                error = e
        if dist_utils.any_rank(error is not None, group=group):
            raise error if error else ConfigError("rank 0 could not prepare the data (see its error)")


def _packed_loaders(
    data: DataConfig,
    train_cfg: TrainConfig,
    dist,
    objective: str,
    seed: int,
    decoder_start_id: int | None = None,
    mlm_corruption: tuple[float, float] = BERT_MLM_CORRUPTION,
):
    """Prepare the data once (rank 0; the others wait), then one packed loader per split, and the vocabulary
    size of the data's tokenizer. decoder_start_id: span corruption's first decoder input, the model's
    decoder_start_token_id, which generation, the eval harness and hf/ use too (the collator's default, the
    tokenizer's pad, ignored an override of it). mlm_corruption: the model's (BERT's 80/10, ELECTRA's 85/0)."""
    from lm.data.packed import PackedLoader
    from lm.data.tokenizer import Tokenizer

    _prepare_on_main(data, dist)
    data_dir = Path(os.path.expanduser(data.dir))
    vocab = Tokenizer.load(data_dir).vocab_size

    def loader(split):
        return PackedLoader(
            data_dir,
            split,
            train_cfg.seq_len,
            train_cfg.micro_batch_size,
            objective,
            rank=dist.rank,
            world_size=dist.world_size,
            seed=seed,
            mlm_probability=data.mlm_probability,
            noise_density=data.noise_density,
            mean_span_length=data.mean_span_length,
            decoder_start_id=decoder_start_id if objective == "span" else None,
            train_stride=data.train_stride,
            mlm_corruption=mlm_corruption,
        )

    return loader("train"), loader("val"), vocab


def _check_eval_tasks(run, dist) -> float:
    """lm/eval/harness_loop.py's check_tasks of train.eval_tasks on rank 0 (the harness's index takes seconds),
    its refusal raised on every rank; its seconds."""
    from lm.engine import dist as dist_utils
    from lm.eval.harness_loop import check_tasks

    checked, error = 0.0, None
    if dist.is_main:
        try:
            checked = check_tasks(run.train, run.model)
        except Exception as e:  # noqa: BLE001 - reported on every rank below, then re-raised here
            error = e
    if dist_utils.any_rank(error is not None):
        raise error if error else ConfigError("rank 0 refused train.eval_tasks (see its error)")
    return checked


def _downstream(train_cfg: TrainConfig, model_cfg, data: DataConfig, engine, checked: float = 0.0) -> list:
    """The GLUE probes of train.probe_interval (lm/eval/probe.py) and the harness tasks of train.eval_tasks
    (lm/eval/harness_loop.py; `checked`: the seconds of their check), with the run's tokenizer. Every rank gets
    them (their steps are sync points on every rank); rank 0 reads the data and evaluates."""
    if not train_cfg.probe_interval and not train_cfg.eval_tasks:
        return []
    from lm.engine import dist as dist_utils
    from lm.eval.harness_loop import harness_callbacks
    from lm.eval.probe import probe_callbacks, run_tokenizer

    data_dir = os.path.expanduser(data.dir)
    callbacks, error = [], None
    try:
        callbacks = probe_callbacks(train_cfg, model_cfg, data_dir, engine)
        tokenizer_of = lambda: run_tokenizer(data_dir, "train.eval_tasks", "train.eval_tasks=[]")  # noqa: E731
        callbacks += harness_callbacks(train_cfg, tokenizer_of, engine, checked)
    except Exception as e:  # noqa: BLE001 - reported on every rank below, then re-raised here
        error = e
    if dist_utils.any_rank(error is not None):
        raise error if error else ConfigError("rank 0 could not set up its downstream evaluations (see its error)")
    return callbacks


def _round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


@entry("lm train")
def main() -> None:
    from lm.cli.app import run_app
    from lm.cli.own_data import own_data_args

    register_train_configs()
    try:
        sys.argv = [sys.argv[0], *own_data_args(sys.argv[1:])]  # data.source=<file>, data=<prepared dir>
    except ConfigError as e:
        sys.exit(f"lm train: {e}")
    run_app("lm train", "train", train)


if __name__ == "__main__":
    main()
