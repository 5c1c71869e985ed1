"""The leaf of the config tree: what every section's schema module needs from the root, without importing it.

ConfigError, Choice, to_typed, explain, conf_dir and compose_group live here so that lm/config.py (the root,
which assembles RunSchema from the sections) is the only module that imports the sections' config modules:
the sections import this leaf, never the root (no import cycle). lm/config.py re-exports every name.
"""

from collections.abc import Callable
from dataclasses import fields
from enum import Enum


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
        raise ConfigError(
            f"bad {prefix} config: {explain(e, prefix)}. Allowed fields: {sorted(f.name for f in fields(schema))}"
        ) from None


def explain(e: Exception, prefix: str = "") -> str:
    """OmegaConf's or Hydra's message on one line, with the full key it names (under `prefix`)."""
    msg = "; ".join(line.strip() for line in str(getattr(e, "msg", e)).splitlines() if line.strip())
    key = getattr(e, "full_key", None)
    if key and prefix:
        key = f"{prefix}.{key}"
    return f"{key}: {msg}" if key else msg


def compose_group(
    group: str, option: str, overrides: list[str] | None = None, register: Callable[[], None] = lambda: None
):
    """One config group option plus overrides in lm-train's own grammar (`model/ffn=swiglu`,
    `model.dim=128`), composed by Hydra exactly as `lm-train <group>=<option> ...` would compose that
    section, and returned typed (the section's dataclass). `register` stores the schemas the group's
    YAML files name (lm.config.compose_group registers every section's)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf

    register()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        try:
            cfg = compose(config_name=None, overrides=[f"+{group}={option}", *(overrides or [])])
        except HydraException as e:
            raise ConfigError(f"{group}={option} {list(overrides or [])}: {explain(e.__cause__ or e)}") from None
    return OmegaConf.to_object(OmegaConf.select(cfg, group.replace("/", ".")))
