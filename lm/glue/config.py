"""The typed config of `lm finetune` (conf/finetune.yaml, conf/task/glue/*.yaml) and its validation.

A task preset composes under `tasks.<name>` (conf/task/glue/<name>.yaml is `@package _global_`):

    lm finetune task=glue/sst2 ...                   tasks: {sst2: ...}
    lm finetune task=glue/all ...                    tasks: {cola: ..., sst2: ..., ..., wnli: ...}
    lm finetune 'task=[glue/rte,glue/qqp]' ...       tasks: {rte: ..., qqp: ...}
    lm finetune task=own tasks.own.train_file=...    tasks: {own: ...}   your own files (conf/task/own.yaml, own.py)
    lm finetune task=glue/all tasks.sst2.epochs=1    one task's setting
    lm finetune task=glue/all optim.lr=3e-4 glue.data_root=/data/glue_data   every task's (shared nodes)

Settings shared by every task live in shared nodes that the presets leave unset or interpolate:
`optim` and `sched` (the groups of conf/optim and conf/sched, as in lm train; a task's `lr`,
`weight_decay` replace theirs when set), and `glue` (data_root, max_train_examples).
The whole config becomes typed objects once, at entry (`finetune_job`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from lm.config import Choice, ConfigError, check_known_keys, check_seeds
from lm.core.config import (
    CompileMode,
    Device,
    LoggerConfig,
    OnNonfinite,
    OptimConfig,
    Precision,
    SchedConfig,
    TrainConfig,
    validate_train,
)


class Pooling(Choice):
    """How a sequence becomes one vector for the classification layer (lm/glue/init.py)."""

    first = "first"  # the [CLS] token (encoders)
    last = "last"  # the last real token (decoders, encoder-decoders)
    mean = "mean"  # the mean over real tokens
    weighted_mean = "weighted_mean"  # real token i weighted by i (SGPT, Muennighoff 2022): for causal decoders


class PairInput(Choice):
    """How a pair task's two sentences reach the classifier (lm/glue/encode.py, lm.model.SequenceClassifier)."""

    joint = "joint"  # one sequence, a [SEP] b (BERT, GPT)
    # (a, b) and (b, a), pooled and added (Radford et al. 2018, GPT-1's similarity tasks): a causal
    # decoder's tokens of the first sentence never see the second
    both_orders = "both_orders"
    # a and b read apart by the same backbone (Sentence-BERT, Reimers & Gurevych 2019): classes from
    # [u; v; |u - v|], a score from cos(u, v); a similarity the small pretrained model already encodes
    siamese = "siamese"


@dataclass
class GlueTaskConfig:
    """One GLUE task's finetuning hyperparameters (conf/task/glue/<name>.yaml, under tasks.<name>).

    Metrics are in points (x100); `main_metric` picks the number model selection maximises: "score"
    (the task's leaderboard score), a metric of the task (e.g. "f1"), or "<column>/<metric>" (e.g. "mnli_m/acc").
    """

    name: str = MISSING  # a task of lm.glue.tasks.GLUE_TASKS; equals its key under tasks
    n_labels: int = 2  # head width: classes, or 1 for regression (STS-B)
    main_metric: str = "score"
    epochs: float = 3.0  # the schedule's length: epochs x steps per epoch
    lr: float | None = None  # peak learning rate; None = optim.lr
    weight_decay: float | None = None  # None = optim.weight_decay
    warmup_ratio: float | None = (
        0.1  # warmup steps = this x the task's steps (Devlin et al. 2019); None = sched.warmup_steps
    )
    batch_size: int = 32  # examples per optimizer step
    max_len: int = 128  # tokens per example after truncation, special tokens included
    dropout: float = 0.1  # before the classification layer
    pair_input: PairInput = PairInput.joint  # a pair task's input: joint | both_orders | siamese
    whiten: bool = False  # siamese: whiten the pooled vectors, fit once on the training pairs (Su et al. 2021)
    fit_head: bool = False  # siamese STS-B: the score's scale and shift start from the training pairs' least squares
    seeds: list[int] = field(default_factory=lambda: [0])  # one run per seed; results report the median
    max_train_examples: int | None = None  # first N training examples only (smoke runs on CPU)
    data_root: str | None = None  # the glue_data directory; None = $LM_DATA_MIRROR/glue_data
    # task=own only (lm/glue/own.py): the user's files and columns; null elsewhere
    train_file: str | None = None  # .csv | .tsv | .jsonl
    dev_file: str | None = None  # model selection and the reported metrics
    text_a: str | None = None  # None = "sentence", or "sentence1" when text_b is set
    text_b: str | None = None  # the pair's second text; None = one text per example
    label: str | None = None  # None = "label"
    labels: list[str] | None = None  # class names in class-id order; None = the train file's, sorted
    regression: bool = False  # a numeric label: one output, MSE, Pearson/Spearman

    def optim(self, shared: OptimConfig) -> OptimConfig:
        return replace(
            shared,
            lr=shared.lr if self.lr is None else self.lr,
            weight_decay=shared.weight_decay if self.weight_decay is None else self.weight_decay,
        )

    def sched(self, shared: SchedConfig, total_steps: int) -> SchedConfig:
        if self.warmup_ratio is None:
            return shared
        return replace(shared, warmup_steps=round(self.warmup_ratio * total_steps))


# GlueTaskConfig's fields that only task=own reads, and the file extensions it reads (lm/glue/own.py)
OWN_FIELDS = ("train_file", "dev_file", "text_a", "text_b", "label", "labels", "regression")
OWN_FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl"}


@dataclass
class GlueShared:
    """Settings of every task: the presets interpolate these (`data_root: ${glue.data_root}`)."""

    data_root: str | None = None
    max_train_examples: int | None = None
    # a batch's length rounded up to a multiple of this (at most the task's max_len): few distinct shapes, so
    # torch.compile and its CUDA graphs (train.compile_mode=reduce_overhead) record few; 1 = the longest example
    pad_to_multiple_of: int = 1


@dataclass
class FinetuneTrain:
    """The train.* fields lm finetune accepts; each has an effect. Batch size, steps, warmup and
    evaluation follow each task (tasks.<name>.batch_size, epochs, warmup_ratio; dev at every epoch end)."""

    # a task's batch is cut into micro-batches of at most this size per rank (2 where it is 1 and the ranks' shares
    # differ: every rank runs the same number of micro-batches, lm.glue.trainer.micro_batches)
    micro_batch_size: int = 32
    grad_clip: float = 1.0
    precision: Precision = Precision.fp32
    compile: bool = False
    compile_mode: CompileMode = CompileMode.default  # torch.compile's mode (reduce_overhead: CUDA graphs)
    device: Device = Device.auto
    log_interval: int = 50  # steps between metrics.jsonl lines
    ckpt_interval: int = 0  # steps between checkpoints of a task/seed; 0 = at the end of every epoch
    keep_last: int = 1  # checkpoints kept per task/seed
    on_nonfinite: OnNonfinite = OnNonfinite.stop  # what a NaN/inf loss does
    max_nonfinite: int = 10
    world_size: int | None = None  # expected number of processes (asserted)
    progress: bool = True  # tqdm bar on rank 0 (only on a terminal)
    threads: int | None = None  # torch intra-op CPU threads per process

    def for_task(self, total_steps: int, per_epoch: int) -> TrainConfig:
        """The loop's and engine's TrainConfig of one task: its steps, dev at every epoch end."""
        return TrainConfig(
            micro_batch_size=self.micro_batch_size,
            grad_accum=1,
            max_steps=total_steps,
            grad_clip=self.grad_clip,
            precision=self.precision,
            compile=self.compile,
            compile_mode=self.compile_mode,
            device=self.device,
            log_interval=self.log_interval,
            eval_interval=per_epoch,
            ckpt_interval=self.ckpt_interval or per_epoch,
            keep_last=self.keep_last,
            # a task's checkpoints are small and its runs short: the host copy would cost more than it saves
            async_checkpoint=False,
            on_nonfinite=self.on_nonfinite,
            max_nonfinite=self.max_nonfinite,
            world_size=self.world_size,
            progress=self.progress,
            threads=self.threads,
        )


@dataclass
class GridProtocol:
    """`protocol=<preset>` (conf/protocol/): the published small models' finetuning protocol, per task: every
    (lr, batch size) cell with seeds[0], the cell with the best dev main metric chosen, then that cell's median
    over `seeds` (lm/glue/grid.py). The defaults are Turc et al. (2019)'s grid for the BERT miniatures."""

    name: str = "turc"  # the preset's name, for the report
    lrs: list[float] = field(default_factory=lambda: [3e-4, 1e-4, 5e-5, 3e-5])
    batch_sizes: list[int] = field(default_factory=lambda: [8, 16, 32, 64, 128])
    epochs: float | None = 4.0  # every cell's epochs; None = each task's own (tasks.<name>.epochs)
    task_epochs: dict[str, float] = field(default_factory=dict)  # per task, before `epochs` (ELECTRA: rte, stsb 10)
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])  # seeds[0] selects the cell; the median is over all

    def epochs_of(self, task: GlueTaskConfig) -> float:
        return self.task_epochs.get(task.name, task.epochs if self.epochs is None else self.epochs)


@dataclass
class FinetuneSchema:
    """The top of conf/finetune.yaml: unknown keys fail at composition."""

    tasks: dict[str, GlueTaskConfig] = field(default_factory=dict)  # composed by task=glue/<name> | glue/all | own
    glue: GlueShared = field(default_factory=GlueShared)
    model: Any = None  # init=none only: the model to build (conf/model/)
    engine: Any = None
    optim: OptimConfig = field(default_factory=OptimConfig)
    sched: SchedConfig = field(default_factory=SchedConfig)
    logger: LoggerConfig = field(default_factory=lambda: LoggerConfig(job_type="finetune"))
    train: FinetuneTrain = field(default_factory=FinetuneTrain)
    init: str = MISSING  # lm train run dir | checkpoint dir | lm export dir | none
    tokenizer: str | None = None  # tokenizer.json or a prepared data dir; default: the checkpoint's own
    run_dir: str = "runs/finetune/${lm.run_name:}"  # named by the overrides: rerun = resume
    seed: int = 0  # refused unless 0: the seeds are tasks.<name>.seeds (protocol.seeds)
    resume: bool = True  # continue each unfinished task/seed from its checkpoint; skip the finished ones
    predict_test: bool = True  # write the leaderboard's submission files
    save_best: bool = False  # also save the best-dev weights under <run_dir>/<task>/seed<k>/best
    hf: bool = True  # read the Hugging Face copy of a split that is not on disk
    skip_missing: bool = False  # run only tasks whose data is local (the GLUE score is then partial)
    pooling: Pooling | None = None  # None = first for encoders, last otherwise (RNNs: last or mean only)
    bidirectional: bool = (
        False  # RNN backbones: a bidirectional classifier, forward direction from init (lm/glue/init.py)
    )
    eval_batch_size: int = 128
    # protocol=turc|electra|small: per task an lr x batch grid, the best cell on dev, its median over seeds
    # (lm/glue/grid.py); None: each task once per tasks.<name>.seeds with its own lr and batch size
    protocol: GridProtocol | None = None


def finetune_job(cfg) -> FinetuneSchema:
    """The composed DictConfig as typed objects (the one conversion), validated."""
    from omegaconf import OmegaConf

    if OmegaConf.is_missing(cfg, "init"):
        raise ConfigError(
            "say where the model starts: init=<lm train run dir or checkpoint dir or lm export dir>, "
            "or init=none (random weights; then also model=<preset> and tokenizer=<path>)"
        )
    check_known_keys(cfg)  # a `+key=` that no schema field reads
    job = OmegaConf.to_object(cfg)
    validate_finetune(job)
    return job


def validate_finetune(job: FinetuneSchema) -> None:
    if not job.tasks:
        raise ConfigError("no task selected; pick task=glue/<name>, task=glue/all or task=[glue/a,glue/b]")
    for key, t in job.tasks.items():
        if t.name != key:
            raise ConfigError(f"tasks.{key}.name={t.name!r} must be {key!r} (the key a preset composes under)")
        validate_glue_task(t)
    if job.protocol is not None:
        validate_protocol(job.protocol)
    if job.seed != 0:  # a sweep seed=0,1,2 ran three identical jobs: the tasks' seeds are their own
        raise ConfigError(
            f"seed={job.seed} does not seed lm finetune: each task runs its tasks.<name>.seeds (e.g. "
            f"tasks.{next(iter(job.tasks))}.seeds=[{job.seed}]; with protocol=..., protocol.seeds); drop seed="
        )
    if not isinstance(job.glue.pad_to_multiple_of, int) or job.glue.pad_to_multiple_of < 1:
        raise ConfigError(
            f"glue.pad_to_multiple_of={job.glue.pad_to_multiple_of!r} must be a positive integer (1 = no rounding)"
        )
    if job.train.ckpt_interval < 0:
        raise ConfigError(f"train.ckpt_interval={job.train.ckpt_interval} must be >= 0 (0 = at the end of every epoch)")
    validate_train(job.train.for_task(1, 1), job.optim, job.sched)
    _validate_scratch_model(job)


# init= values that build model= with random weights (as lm/glue/init.py load_backbone reads them)
_SCRATCH = ("none", "scratch", "")


def _validate_scratch_model(job: FinetuneSchema) -> None:
    """init=none builds model=<preset> as composed, the user's config: refused as lm train refuses it (a value the
    model would not read included). A plain model node (not composed on the model schema) is a saved one, which
    lm/glue/init.py loads as it was saved."""
    from lm.model.config import ModelConfig
    from lm.model.validate import refuse_unread, validate_model

    if isinstance(job.model, ModelConfig) and str(job.init).lower() in _SCRATCH:
        validate_model(job.model)
        refuse_unread(job.model)


def validate_glue_task(cfg: GlueTaskConfig) -> None:
    """Fail before any data is read; the message names the field and the allowed values."""
    from lm.glue.tasks import GLUE_TASKS, OWN

    where = f"tasks.{cfg.name}"
    if cfg.name == OWN:
        _validate_own(cfg)
    elif cfg.name not in GLUE_TASKS:
        raise ConfigError(
            f"{where}: task name {cfg.name!r} is not one of {list(GLUE_TASKS)}; pick task=glue/<name>, or task=own "
            f"for files of your own"
        )
    else:
        _validate_glue_only(cfg, where)
    _validate_task_common(cfg, where)


def _validate_own(cfg: GlueTaskConfig) -> None:
    """task=own's settings alone (its files are read by lm/glue/own.py's resolve): both files named, with an
    extension that says how to read them."""
    for key in ("train_file", "dev_file"):
        path = getattr(cfg, key)
        if not path:
            raise ConfigError(
                "task=own reads your files: set tasks.own.train_file=<file> and tasks.own.dev_file=<file> "
                "(.csv, .tsv or .jsonl)"
            )
        if Path(path).suffix.lower() not in OWN_FORMATS:
            raise ConfigError(
                f"tasks.own.{key}={path}: the extension {Path(path).suffix or '(none)'} is not .csv, .tsv or .jsonl, "
                f"which say how the file is read; rename or convert it"
            )
    if cfg.regression and cfg.labels is not None:
        raise ConfigError("tasks.own.labels names classes, but tasks.own.regression=true reads a number: drop one")
    names = [str(n).strip() for n in cfg.labels or ()]
    if cfg.labels is not None and (len(set(names)) < 2 or len(set(names)) < len(names)):
        raise ConfigError(
            f"tasks.own.labels={list(cfg.labels)} must name 2 or more distinct classes, in class-id order"
        )
    if cfg.pair_input != PairInput.joint and not cfg.text_b:
        raise ConfigError(
            f"tasks.own.pair_input={PairInput(cfg.pair_input).value} reads a pair: set tasks.own.text_b=<its second "
            f"text's column>, or drop it"
        )


def _validate_glue_only(cfg: GlueTaskConfig, where: str) -> None:
    """A GLUE task's head width, metric and input are the task's; task=own's file fields are not read."""
    from lm.glue.metrics import metric_keys
    from lm.glue.tasks import TASKS

    own = [f for f in OWN_FIELDS if getattr(cfg, f) not in (None, False)]
    if own:
        raise ConfigError(f"{where}.{own[0]} is read by task=own only (your own files); drop it for GLUE {cfg.name}")
    want = TASKS[cfg.name].n_labels
    if cfg.n_labels != want:
        raise ConfigError(
            f"{where}.n_labels={cfg.n_labels} but {cfg.name} has {want} "
            f"({'regression' if want == 1 else 'classes'}); set {where}.n_labels={want}"
        )
    if cfg.main_metric not in metric_keys(cfg.name):
        raise ConfigError(f"{where}.main_metric={cfg.main_metric!r} is not one of {metric_keys(cfg.name)}")
    if cfg.pair_input != PairInput.joint and TASKS[cfg.name].text_b is None:
        pair_tasks = ", ".join(n for n, t in TASKS.items() if t.text_b)
        raise ConfigError(
            f"{where}.pair_input={PairInput(cfg.pair_input).value} reads a sentence pair, but {cfg.name} has one "
            f"sentence per example; drop it (it is for pair tasks: {pair_tasks}, and task=own with tasks.own.text_b)"
        )


def _validate_task_common(cfg: GlueTaskConfig, where: str) -> None:
    """What every task's settings must satisfy, GLUE's and task=own's."""
    for name in ("batch_size", "max_len"):
        if not isinstance(getattr(cfg, name), int) or getattr(cfg, name) < 1:
            raise ConfigError(f"{where}.{name}={getattr(cfg, name)!r} must be a positive integer")
    if cfg.max_len < 4:
        raise ConfigError(f"{where}.max_len={cfg.max_len} leaves no room for text after 3 special tokens; use >= 4")
    if cfg.whiten and cfg.pair_input != PairInput.siamese:
        raise ConfigError(
            f"{where}.whiten=true whitens the two pooled sentences of a siamese pair; add "
            f"{where}.pair_input=siamese or drop it"
        )
    if cfg.fit_head and (cfg.pair_input != PairInput.siamese or (cfg.n_labels != 1 and not cfg.regression)):
        raise ConfigError(
            f"{where}.fit_head=true fits the cosine score of a siamese regression task (STS-B: "
            f"tasks.stsb.pair_input=siamese); {cfg.name} with pair_input={PairInput(cfg.pair_input).value} has no "
            f"such head: drop it"
        )
    _validate_task_numbers(cfg, where)
    if not cfg.seeds:
        raise ConfigError(f"{where}.seeds is empty; give at least one seed, e.g. {where}.seeds=[0]")
    check_seeds(f"{where}.seeds", cfg.seeds, f"{where}.seeds=[0,1,2]")
    if len(set(cfg.seeds)) < len(cfg.seeds):  # [0,0] ran seed 0 once under one directory: protocol.seeds' rule
        raise ConfigError(
            f"{where}.seeds={list(cfg.seeds)} repeats a seed; give distinct seeds, e.g. {where}.seeds=[0,1,2]"
        )
    if cfg.max_train_examples is not None and cfg.max_train_examples < 1:
        raise ConfigError(f"{where}.max_train_examples={cfg.max_train_examples} must be >= 1 or null")


def _validate_task_numbers(cfg: GlueTaskConfig, where: str) -> None:
    """The float hyperparameters; NaN compares False with every bound, so finiteness is checked first."""

    def bad(name, why):
        raise ConfigError(f"{where}.{name}={getattr(cfg, name)!r} {why}")

    if not _finite(cfg.epochs) or cfg.epochs <= 0:
        bad("epochs", "must be a finite number > 0 (fractions of an epoch are allowed, e.g. 0.5)")
    if cfg.lr is not None and (not _finite(cfg.lr) or cfg.lr <= 0):
        bad("lr", "must be a finite number > 0, or null for optim.lr")
    if cfg.weight_decay is not None and (not _finite(cfg.weight_decay) or cfg.weight_decay < 0):
        bad("weight_decay", "must be a finite number >= 0, or null for optim.weight_decay")
    if cfg.warmup_ratio is not None and (not _finite(cfg.warmup_ratio) or not 0.0 <= cfg.warmup_ratio < 1.0):
        bad("warmup_ratio", "must be a number in [0, 1), or null for sched.warmup_steps")
    if not _finite(cfg.dropout) or not 0.0 <= cfg.dropout < 1.0:
        bad("dropout", "must be a number in [0, 1)")


def validate_protocol(p: GridProtocol) -> None:
    """The grid's axes, epochs and seeds; a duplicate would run one cell twice under one directory name."""
    from lm.glue.tasks import GLUE_TASKS

    def bad(name, why):
        raise ConfigError(f"protocol.{name}={getattr(p, name)!r} {why}")

    if not p.lrs or any(not _finite(lr) or lr <= 0 for lr in p.lrs) or len({f"{lr:g}" for lr in p.lrs}) < len(p.lrs):
        bad("lrs", "must be distinct finite numbers > 0, e.g. protocol.lrs=[3e-4,1e-4]")
    if not p.batch_sizes or any(b < 1 for b in p.batch_sizes) or len(set(p.batch_sizes)) < len(p.batch_sizes):
        bad("batch_sizes", "must be distinct positive integers, e.g. protocol.batch_sizes=[16,32]")
    if p.epochs is not None and (not _finite(p.epochs) or p.epochs <= 0):
        bad("epochs", "must be a finite number > 0, or null for each task's tasks.<name>.epochs")
    unknown = sorted(set(p.task_epochs) - set(GLUE_TASKS))
    if unknown:
        bad("task_epochs", f"names {unknown}, not GLUE tasks; keys are among {list(GLUE_TASKS)}")
    if any(not _finite(e) or e <= 0 for e in p.task_epochs.values()):
        bad("task_epochs", "must map tasks to finite numbers > 0")
    if not p.seeds or len(set(p.seeds)) < len(p.seeds):
        bad("seeds", "must be distinct seeds, the first one selecting the cell, e.g. protocol.seeds=[0,1,2]")
    check_seeds("protocol.seeds", p.seeds, "protocol.seeds=[0,1,2]")


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def check_task_args(args: list[str]) -> None:
    """Refuse before Hydra composes an unknown `task=` option (Hydra only says it "could not find" the file; a
    user's own conf/task/<group>/<name>.yaml is still accepted), and a `tasks.<name>.*` override of a task the run
    does not finetune (Hydra says "Key '<name>' is not in struct"): each message lists what to pick."""
    from lm.config import conf_dir
    from lm.glue.tasks import GLUE_TASKS

    known = [f"glue/{n}" for n in (*GLUE_TASKS, "all")]
    for arg in args:
        key, _, value = arg.lstrip("+~").partition("=")
        if key != "task" or not value or "(" in value or "$" in value:  # sweep functions, interpolations
            continue
        for name in _names(value):
            if name not in known and not (conf_dir() / "task" / f"{name}.yaml").is_file():
                raise ConfigError(
                    f"task={name} is not a task; pick task=glue/<name> with <name> one of "
                    f"{', '.join((*GLUE_TASKS, 'all'))} (several: 'task=[glue/rte,glue/mrpc]'), or task=own for your "
                    f"own files"
                )
    _check_selected(args, GLUE_TASKS)
    _check_model_args(args)


def _check_model_args(args: list[str]) -> None:
    """model= and model.* choose the model init=none builds; with init=<run or export> the model is the one saved
    there, so such an override would change nothing (a sweep or interpolation of init= is left to the job)."""
    inits = [a.partition("=")[2] for a in args if a.lstrip("+").startswith("init=")][-1:]
    if not inits or any(c in inits[0] for c in ",($") or inits[0].strip("'\"").lower() in _SCRATCH:
        return
    for arg in args:
        key = arg.lstrip("+~").partition("=")[0]
        if key == "model" or key.startswith(("model.", "model/")):
            raise ConfigError(
                f"{arg} has no effect with init={inits[0]}: lm finetune builds the model saved there (model= and "
                f"model.* choose the init=none baseline's); drop the override, or pretrain the model you want"
            )


def _names(value: str) -> list[str]:
    return [n for n in (v.strip().strip("'\"") for v in value.strip("[]").split(",")) if n]


def _check_selected(args: list[str], glue_tasks) -> None:
    """A `tasks.<name>.<field>=` override (or +) needs <name> among the tasks task= selects (the last task=, else
    conf/finetune.yaml's default). Left to Hydra: a sweep of task=, glue/all, a task file of the user's (which may
    select several tasks)."""
    selected = [v for a in args if a.startswith("task=") for v in [a.partition("=")[2]]][-1:] or [_default_task()]
    names = _names(selected[0])
    chosen = [n.removeprefix("glue/") for n in names]
    if ("," in selected[0] and not selected[0].startswith("[")) or any(c not in glue_tasks for c in chosen):
        return  # a sweep over tasks, glue/all, or a task file of the user's: the tasks are not known here
    found = unselected_task_override(args, chosen)
    if found is None:
        return
    arg, t = found
    if t not in glue_tasks and t != "own":
        raise ConfigError(f"{arg}: {t} is not a GLUE task; the task names are {', '.join(glue_tasks)}")
    raise ConfigError(
        f"{arg}: {t} is not among the tasks this run finetunes ({', '.join(chosen)}); add it "
        f"('task=[{','.join(f'glue/{c}' for c in chosen)},{t if t == 'own' else f'glue/{t}'}]') or leave the "
        f"override out"
    )


def unselected_task_override(overrides: list[str], tasks: list[str]) -> tuple[str, str] | None:
    """The first `tasks.<name>.<field>=` override (or +) whose <name> is not among `tasks`, with that name; Hydra
    would say only "Key '<name>' is not in struct". lm finetune (task=) and lm transfer (--tasks) word the fix."""
    for o in overrides:
        parts = o.lstrip("+").partition("=")[0].split(".")
        if not o.startswith("~") and len(parts) > 2 and parts[0] == "tasks" and parts[1] not in tasks:
            return o, parts[1]
    return None


def _default_task() -> str:
    """conf/finetune.yaml's `task:` default (glue/sst2)."""
    import yaml

    from lm.config import conf_dir

    defaults = yaml.safe_load((conf_dir() / "finetune.yaml").read_text()).get("defaults", [])
    return next(str(d["task"]) for d in defaults if isinstance(d, dict) and "task" in d)


def register_glue_configs() -> None:
    """The finetune schema (conf/finetune.yaml lists `finetune_schema` first)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="finetune_schema", node=FinetuneSchema)
