"""The root of the typed config tree: ConfigError, the conf/ directory, resolvers, the RunSchema of
conf/train.yaml and its registration in Hydra's ConfigStore.

Every section's schema lives with its owner: lm/model/config.py (model) and lm/model/options.py
(model/norm|ffn|pos|attn), lm/data/config.py (data), lm/core/config.py (train, optim, sched, logger),
lm/engine/config.py (engine). Hydra composes the YAML files on these schemas, so a wrong key, type or choice fails at
composition naming the field; `OmegaConf.to_object` then turns the composed tree into dataclasses,
once, at the entry point (lm.cli.train.train).
"""


from dataclasses import dataclass, field, fields
from enum import Enum
from typing import List, Optional


class ConfigError(ValueError):
    """A config asks for something impossible; the message names the field and the fix."""


class Choice(str, Enum):
    """A config choice: an Enum (OmegaConf checks values and lists the allowed ones) that is also its
    string value, so `cfg.arch == "decoder"`, dict lookups and f-strings keep working."""

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__


def conf_dir():
    """The Hydra config directory: lm/conf, a link to the repository's top-level conf/ (a wheel carries
    a copy), so installed and editable packages find the same configs."""
    from pathlib import Path

    return Path(__file__).resolve().parent / "conf"


def to_typed(schema, data, prefix: str):
    """A dataclass of `schema` from a plain dict or DictConfig (a saved config, a command-line tool's
    flags): unknown keys, wrong types and choices fail with a ConfigError naming `prefix.<field>`."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), data))
    except OmegaConfBaseException as e:
        raise ConfigError(f"bad {prefix} config: {explain(e, prefix)}. Allowed fields: "
                          f"{sorted(f.name for f in fields(schema))}") from None


def explain(e: Exception, prefix: str = "") -> str:
    """OmegaConf's or Hydra's message on one line, with the full key it names (under `prefix`)."""
    msg = "; ".join(line.strip() for line in str(getattr(e, "msg", e)).splitlines() if line.strip())
    key = getattr(e, "full_key", None)
    if key and prefix:
        key = f"{prefix}.{key}"
    return f"{key}: {msg}" if key else msg


def compose_group(group: str, option: str, overrides: Optional[List[str]] = None):
    """One config group option plus overrides in lm-train's own grammar (`model/ffn=swiglu`,
    `model.dim=128`), composed by Hydra exactly as `lm-train <group>=<option> ...` would compose that
    section, and returned typed (the section's dataclass)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf

    register_train_configs()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        try:
            cfg = compose(config_name=None, overrides=[f"+{group}={option}", *(overrides or [])])
        except HydraException as e:
            raise ConfigError(f"{group}={option} {list(overrides or [])}: {explain(e.__cause__ or e)}") from None
    return OmegaConf.to_object(OmegaConf.select(cfg, group.replace("/", ".")))


@dataclass
class RunFields:
    """The run-level keys at the top of conf/train.yaml (the sections are added by run_schema())."""

    run_dir: str = "runs/${lm.stamp:}${lm.cell:}"  # one per run (per cell of a -m sweep); the same run_dir resumes
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

    from lm.data.config import register_data_configs
    from lm.engine.config import register_engine_configs
    from lm.model.config import register_model_configs

    import lm.zoo  # noqa: F401 (the paper variants register their options before Hydra composes: lm/model/registry.py)

    register_model_configs()
    register_data_configs()
    register_engine_configs()
    from lm.sweep.narang_rows import register_narang_rows

    register_narang_rows()  # experiment/narang_row=<row>: Narang et al. 2021's Table 1 rows as data
    ConfigStore.instance().store(name="run_schema", node=run_schema())
    if not OmegaConf.has_resolver("lm.stamp"):
        OmegaConf.register_new_resolver("lm.stamp", run_stamp)
        OmegaConf.register_new_resolver("lm.cell", sweep_cell)


def sweep_cell() -> str:
    """"/<job number>" inside a Hydra multirun, "" otherwise: every cell of `lm-train -m ...` gets its own
    run directory under runs/<stamp>/ instead of resuming the previous cell's checkpoints."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return ""
    return f"/{HydraConfig.get().job.num}"


def run_stamp() -> str:
    """A timestamp that every rank agrees on: rank 0's, passed through LM_RUN_STAMP (lm.cli.train sets it)."""
    import os
    import time

    return os.environ.setdefault("LM_RUN_STAMP", time.strftime("%Y-%m-%d_%H-%M-%S"))


