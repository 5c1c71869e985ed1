"""The root of the typed config tree: ConfigError, the conf/ directory, resolvers, the RunSchema of
conf/train.yaml and its registration in Hydra's ConfigStore.

Every section's schema lives with its owner: lm/model/config.py (model) and lm/model/options.py
(model/norm|ffn|pos|attn), lm/data/config.py (data), lm/core/config.py (train, optim, sched, logger),
lm/engine/config.py (engine). Hydra composes the YAML files on these schemas, so a wrong key, type or choice fails at
composition naming the field; `OmegaConf.to_object` then turns the composed tree into dataclasses,
once, at the entry point (lm.cli.train.train).
"""

from dataclasses import dataclass, field

from lm.config_base import (  # noqa: F401 - the root re-exports the leaf
    Choice,
    ConfigError,
    check_seeds,
    composition_error,
    conf_dir,
    explain,
    not_a_key,
    null_node_error,
    override_parse_error,
    to_typed,
)
from lm.config_base import compose_group as _compose_group


def check_known_keys(cfg, prefix: str = "") -> None:
    """Refuse a key that the dataclass typing its node does not have. Hydra appends `+key=value` even under
    a typed node (its own advice for a mistyped key), and OmegaConf.to_object keeps it as an attribute that
    nothing reads: `+train.max_step=20` would train the default number of steps without a word."""
    from dataclasses import fields as dataclass_fields
    from dataclasses import is_dataclass

    from omegaconf import DictConfig, OmegaConf

    kind = OmegaConf.get_type(cfg)
    known = [f.name for f in dataclass_fields(kind)] if is_dataclass(kind) else None
    for key in cfg:
        if known is not None and key not in known:
            raise ConfigError(not_a_key(prefix, str(key), kind, plus=True))
        child = cfg._get_node(key)  # the node itself: values are not resolved here
        if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
            check_known_keys(child, f"{prefix}{key}.")


def compose_group(group: str, option: str, overrides: list[str] | None = None):
    """lm.config_base.compose_group with every section's schemas registered (any group of conf/train.yaml)."""
    return _compose_group(group, option, overrides, register_train_configs)


@dataclass
class RunFields:
    """The run-level keys at the top of conf/train.yaml (the sections are added by run_schema())."""

    run_dir: str = (
        "runs/${lm.run_name:}${lm.cell:}"  # named by the overrides (a sweep: its stamp + cell): rerun = resume
    )
    seed: int = 1337
    resume: bool = True  # continue from <run_dir>/checkpoints/latest when it exists


_RUN_SCHEMA = None


def run_schema():
    """RunSchema, the top of conf/train.yaml: every section typed by its owner's schema. Built on first
    use so that importing lm.config stays light (the owners' modules import torch)."""
    global _RUN_SCHEMA
    if _RUN_SCHEMA is None:
        from lm.core.config import LoggerConfig, OptimConfig, SchedConfig, TrainConfig
        from lm.data.config import DataConfig
        from lm.engine.config import EngineConfig
        from lm.model.config import ModelSchema

        @dataclass
        class RunSchema(RunFields):
            model: ModelSchema = field(default_factory=ModelSchema)
            data: DataConfig = field(default_factory=DataConfig)  # an option of conf/data/
            engine: EngineConfig = field(default_factory=EngineConfig)  # an option of conf/engine/
            train: TrainConfig = field(default_factory=TrainConfig)
            optim: OptimConfig = field(default_factory=OptimConfig)
            sched: SchedConfig = field(default_factory=SchedConfig)
            logger: LoggerConfig = field(default_factory=LoggerConfig)

        RunSchema.__qualname__ = "RunSchema"  # pickled as lm.config.RunSchema (submitit cells): see __getattr__
        _RUN_SCHEMA = RunSchema
    return _RUN_SCHEMA


def __getattr__(name: str):
    """`lm.config.RunSchema`, built on first access (pickle looks the class up by this name)."""
    if name == "RunSchema":
        return run_schema()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register_train_configs() -> None:
    """Schemas and resolvers of the training app (conf/train.yaml lists `run_schema` first)."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    import lm.zoo  # noqa: F401 (the paper variants register their options before Hydra composes: lm/model/registry.py)
    from lm.data.config import register_data_configs
    from lm.engine.config import register_engine_configs
    from lm.model.config import register_model_configs

    register_model_configs()
    register_data_configs()
    register_engine_configs()
    from lm.sweep.narang_rows import register_narang_rows

    register_narang_rows()  # experiment/narang_row=<row>: Narang et al. 2021's Table 1 rows as data
    ConfigStore.instance().store(name="run_schema", node=run_schema())
    if not OmegaConf.has_resolver("lm.stamp"):
        OmegaConf.register_new_resolver("lm.stamp", run_stamp)
        OmegaConf.register_new_resolver("lm.cell", sweep_cell)
        OmegaConf.register_new_resolver("lm.run_name", run_name)


def sweep_cell() -> str:
    """ "/<job number>" inside a Hydra multirun, "" otherwise: every cell of `lm train -m ...` gets its own
    run directory under runs/<stamp>/ instead of resuming the previous cell's checkpoints."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return ""
    return f"/{HydraConfig.get().job.num}"


# Keys that say how long, how often or how a run is watched, not what it computes: left out of the default
# run directory's name, so `train.max_steps=2000` continues the run that `train.max_steps=1000` started.
NOT_IN_RUN_NAME = (
    "run_dir",
    "resume",
    "logger",
    "hydra",
    "train.max_steps",
    "train.log_interval",
    "train.eval_interval",
    "train.eval_batches",
    "train.ckpt_interval",
    "train.keep_last",
    "train.async_checkpoint",
    "train.progress",
    "train.threads",
    "skip_missing",
)
RUN_NAME_MAX = 96


def run_name() -> str:
    """The default run directory's name: the command line's overrides (`model-tiny+train.seq_len-32`; "default"
    without any), so running the same command again resumes the same run. Inside a multirun it is the sweep's
    stamp (each cell adds its job number, lm.cell); outside Hydra, a stamp."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode == RunMode.MULTIRUN:
        return run_stamp()
    return run_name_of(HydraConfig.get().overrides.task)


def run_name_of(overrides) -> str:
    """run_name() of these command-line overrides (Hydra's overrides.task: the command line's, hydra.* left out);
    lm/cli/app.py also reads it before Hydra runs, to know the directory Hydra will create."""
    import hashlib
    import re

    keep = []
    for override in overrides:
        key = override.lstrip("+~").split("=", 1)[0].replace("/", ".")
        if not any(key == k or key.startswith(k + ".") for k in NOT_IN_RUN_NAME):
            keep.append(override.lstrip("+~").replace("=", "-", 1))
    # no `=` or `,` in the name: it must work unquoted as a value on a command line (init=runs/<name>)
    name = re.sub(r"[^A-Za-z0-9._+-]+", "_", "+".join(sorted(keep))) or "default"
    if len(name) > RUN_NAME_MAX:  # file names have limits; the digest keeps long ones apart
        name = f"{name[: RUN_NAME_MAX - 9]}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"
    return name


STAMP_ENV = "LM_RUN_STAMP"
_made_here: set[str] = set()  # stamps this process made, not one handed to it (a rank, a sweep's cell, the user)


def run_stamp() -> str:
    """A timestamp that every rank agrees on: rank 0's, passed through LM_RUN_STAMP (lm/cli/app.py sets it)."""
    import os
    import time

    if STAMP_ENV not in os.environ:
        os.environ[STAMP_ENV] = time.strftime("%Y-%m-%d_%H-%M-%S")
        _made_here.add(os.environ[STAMP_ENV])
    return os.environ[STAMP_ENV]


def own_stamped_dir(stamped_dir) -> None:
    """Make the directory a fresh stamp names (a sweep's runs/<stamp>, runs/ablate_<stamp>) this process's alone.
    Two sweeps started in the same second (a script's `lm train -m ... &` lines, array jobs) made the same stamp,
    so their cells shared run directories: each refused the cells the other held, and the directory mixed both
    sweeps. The directory is created here, and when it exists already the stamp gets a suffix (-2, -3, ...) until
    it names a new one. `stamped_dir()` resolves the directory with the current stamp. A stamp handed down
    (LM_RUN_STAMP set by the user to resume a sweep, or by the launcher of a cell) and a directory that does not
    contain the stamp are left as they are."""
    import os

    stamp = os.environ.get(STAMP_ENV)
    if stamp not in _made_here:
        return
    base, n = stamp, 1
    while stamp in str(path := stamped_dir()):
        try:
            path.mkdir(parents=True)
            return
        except FileExistsError:
            n += 1
            stamp = f"{base}-{n}"
            os.environ[STAMP_ENV] = stamp
            _made_here.add(stamp)
