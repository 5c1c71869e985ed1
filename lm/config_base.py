"""The leaf of the config tree: what every section's schema module needs from the root, without importing it.

ConfigError, Choice, to_typed, explain, conf_dir and compose_group live here so that lm/config.py (the root,
which assembles RunSchema from the sections) is the only module that imports the sections' config modules:
the sections import this leaf, never the root (no import cycle). lm/config.py re-exports every name.
"""

import re
import shlex
from collections.abc import Callable, Sequence
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


# torch.manual_seed's largest seed; numpy's generators (the data order: lm/data/collate.py, lm/glue/trainer.py)
# take no negative one, so seed=-1 trained until the first batch and ended in numpy's traceback
MAX_SEED = 2**64 - 1


def check_seeds(key: str, seeds, example: str) -> None:
    """Refuse a seed the generators cannot take, naming the key (`seed`, `tasks.rte.seeds`) and `example`."""
    bad = [s for s in seeds if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= MAX_SEED]
    if bad:
        raise ConfigError(f"{key}: {bad[0]!r} is not a seed (an integer from 0 to 2**64-1); e.g. {example}")


def conf_dir():
    """The Hydra config directory: lm/conf, a link to the repository's top-level conf/ (a wheel carries
    a copy), so installed and editable packages find the same configs."""
    from pathlib import Path

    return Path(__file__).resolve().parent / "conf"


def to_typed(schema, data, prefix: str):
    """A dataclass of `schema` from a plain dict or DictConfig (a saved config, a command-line tool's
    flags): unknown keys, wrong types and choices fail with a ConfigError naming `prefix.<field>`."""
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), data))
    except OmegaConfBaseException as e:
        # the fields for an unknown key; a bad value's line names what it takes (a choice's values) instead
        known = f". Allowed fields: {sorted(f.name for f in fields(schema))}"
        unknown = isinstance(e, (ConfigAttributeError, ConfigKeyError))
        raise ConfigError(f"bad {prefix} config: {explain(e, prefix)}" + (known if unknown else "")) from None


def explain(e: Exception, prefix: str = "") -> str:
    """OmegaConf's or Hydra's message on one line, with the full key it names (under `prefix`)."""
    lines = [line.strip() for line in str(getattr(e, "msg", e)).splitlines()]
    # OmegaConf's detail lines (`full_key: split`, `object_type=DataConfig`) repeat the key named in front
    msg = "; ".join(line for line in lines if line and not line.startswith(("full_key:", "object_type=")))
    key = getattr(e, "full_key", None)
    if key and prefix:
        key = f"{prefix}.{key}"
    return f"{key}: {msg}" if key else msg


def not_a_key(prefix: str, key: str, kind, plus: bool = False) -> str:
    """The line for `<prefix><key>`, which the dataclass `kind` typing that node does not have: the closest field,
    else the fields there. plus: the key was given as `+key=` (which Hydra accepts and nothing would read)."""
    import difflib

    known = [f.name for f in fields(kind)]
    close = difflib.get_close_matches(str(key), known, n=1)
    where = prefix.rstrip(".") or "the top level"
    line = f"{prefix}{key} is not a key of {where} ({kind.__name__})" + (", so nothing would read it" if plus else "")
    if close:
        return line + f"; did you mean {prefix}{close[0]}?" + (" Set it without the +" if plus else "")
    return line + (
        f"; drop it (the keys there: {', '.join(known)})" if plus else f"; the keys there: {', '.join(known)}"
    )


# Hydra's report of `+key=value` on a key the config has (no exception of OmegaConf's behind it): its second line
# holds the override without its +, the third advises `++key=value`, which on a typed key is only the plain override
APPEND_EXISTING = re.compile(
    r"^Could not append to config\. An item is already at '(.+)'\.\nEither remove \+ prefix: '(.*)'$", re.M
)
# ...and of `+group=option` on a group the defaults list already chooses (`+model=gpt2`): its advice is YAML's
CHOSEN_GROUP = re.compile(r"^Multiple values for (\S+)\. To override a value use 'override ")


def composition_error(e: Exception, overrides: Sequence[str] = ()) -> str | None:
    """One line for an override Hydra could not apply to the composed config (a mistyped key, a value of the wrong
    type, a `+` on a key or group already there), or None when OmegaConf did not refuse it (a missing config file:
    Hydra's report lists the options). Hydra's own report takes 5-7 lines, and for a mistyped key it advises
    `+key=value`, which appends a key nothing reads (lm refuses it: lm.config.check_known_keys); this line names the
    closest key instead. `overrides`: the command line, to name the `+group=option` that chose a group twice."""
    from dataclasses import is_dataclass

    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

    cause = e.__cause__
    if not isinstance(cause, OmegaConfBaseException):
        return _plus_on_existing(str(e), overrides)
    kind, full_key, key = getattr(cause, "object_type", None), getattr(cause, "full_key", None), cause.key
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and is_dataclass(kind) and full_key and key:
        return not_a_key(full_key[: len(full_key) - len(str(key))], str(key), kind)
    what = str(getattr(cause, "msg", cause)).strip().splitlines()[0]  # OmegaConf's next lines repeat the key
    return f"{full_key}: {what}" if full_key else f"{str(e).strip().splitlines()[0].rstrip('.')}: {what}"


def _plus_on_existing(message: str, overrides: Sequence[str]) -> str | None:
    """The line for a `+` on what the config already has (Hydra's APPEND_EXISTING or CHOSEN_GROUP), else None."""
    if found := APPEND_EXISTING.search(message):
        key, plain = found.groups()
        return f"+{plain}: {key} exists already (a + adds a key the config lacks); drop the +: {plain}"
    group = found.group(1) if (found := CHOSEN_GROUP.search(message)) else None
    arg = next((a for a in overrides if group and a.startswith("+") and a.lstrip("+").partition("=")[0] == group), None)
    if arg is None:  # a config file's defaults list chose the group twice: Hydra's report names it
        return None
    plain = arg.lstrip("+")
    return f"{arg}: {group} has an option already (the defaults list chooses one); drop the +: {plain}"


# OmegaConf's assertion when an override sets a field inside a node that is null (model.family.hidden=512 on a
# Transformer, whose model.family is null): a traceback that names neither the override nor the node.
NULL_NODE = "Unexpected type for root: NoneType"


def null_node_error(e: Exception, overrides: list[str]) -> str | None:
    """One line for `e` when it is that assertion, naming the override, its null node and the config group to choose
    an option from; else None. The key comes from the frame of OmegaConf.update(cfg, key, ...), which raised it: the
    overrides of fields inside option nodes that are set look the same."""
    if not isinstance(e, AssertionError) or str(e) != NULL_NODE:
        return None
    key = _updated_key(e)
    arg = next((a for a in overrides if a.lstrip("+~").partition("=")[0] == key), None)
    if key is None or arg is None or "." not in key:
        return None
    where, name = key.rsplit(".", 1)
    group = where.replace(".", "/")
    fix = f"choose one ({group}=<option>, see conf/{group}/)" if conf_dir().joinpath(group).is_dir() else "set it"
    return f"{arg}: {where} is null here (no {group} option is chosen), so it has no field {name}; {fix} or drop {arg}"


def _updated_key(e: Exception) -> str | None:
    tb, key = e.__traceback__, None
    while tb is not None:
        local = tb.tb_frame.f_locals
        if tb.tb_frame.f_code.co_name == "update" and isinstance(local.get("key"), str):
            key = local["key"]
        tb = tb.tb_next
    return key


def override_parse_error(override: str, message: str) -> str:
    """One line for a command-line override Hydra's grammar cannot read (`run_dir=runs/lr=3e-4`, `it's`), naming
    it and the quoted form that reads as typed. Hydra's report is its parser's message, which names neither."""
    first = message.strip().splitlines()[0] if message.strip() else "a parse error"
    what = "a character its grammar does not allow there" if first.startswith("LexerNoViableAlt") else first
    key, sep, value = override.partition("=")
    if not sep or not value or value[0] in "'\"[({":  # a list, sweep or quoted value: its own grammar to fix
        return (
            f"cannot read the override {override}: {what}; see https://hydra.cc/docs/advanced/override_grammar/basic/"
        )
    if "'" not in value:
        quoted = f"{key}='{value}'"
    else:
        quoted = key + '="' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    shell = f'"{quoted}"' if not any(c in quoted for c in '"$`\\!') else shlex.quote(quoted)
    return (
        f"cannot read the override {override}: {what}; Hydra's grammar gives characters such as , = ( ) [ ] ' # "
        f"a meaning: quote the value, inside the shell's quotes: {shell}"
    )


def compose_group(
    group: str, option: str, overrides: list[str] | None = None, register: Callable[[], None] = lambda: None
):
    """One config group option plus overrides in lm train's own grammar (`model/ffn=swiglu`,
    `model.dim=128`), composed by Hydra exactly as `lm train <group>=<option> ...` would compose that
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
        except AssertionError as e:
            line = null_node_error(e, list(overrides or []))
            if line is None:
                raise
            raise ConfigError(line) from None
    return OmegaConf.to_object(OmegaConf.select(cfg, group.replace("/", ".")))
