"""The one registry through which options plug into the model: the core's own (lm/model/options.py) and
the paper variants of the zoo (lm/zoo), which the core never imports.

A *slot* is an extension point of the model: a config group conf/model/<slot>/ and a base schema class
that declares the hooks the core calls (`@slot("attn")` on the base, in lm/model/options.py). An
*option* is a subclass of a slot's base registered with `@register("attn")`, plus one YAML file
conf/model/<slot>/<option>.yaml that lists its schema (`<class name without Config, lowercased>_schema`)
first in its defaults. lm/model/config.py stores every registered schema in Hydra's ConfigStore, so
whatever registered before composition (lm/config.py imports lm.zoo) composes and validates as typed
config.
"""

import sys
from dataclasses import field, make_dataclass
from typing import TypeVar

T = TypeVar("T", bound=type)

_SLOTS: dict[str, type] = {}
_OPTIONS: dict[str, list[type]] = {}


def slot(name: str):
    """Class decorator: `name` is a slot of the model whose options subclass the decorated base."""

    def add(base: T) -> T:
        _SLOTS[name] = base
        _OPTIONS.setdefault(name, [])
        return base

    return add


def register(slot_name: str):
    """Class decorator: the decorated schema is an option of slot `slot_name` (a subclass of its base)."""

    def add(cls: T) -> T:
        base = _SLOTS[slot_name]
        if not issubclass(cls, base):
            raise TypeError(f"{cls.__name__} is registered for model/{slot_name} but is not a {base.__name__}")
        if cls not in _OPTIONS[slot_name]:
            _OPTIONS[slot_name].append(cls)
        return cls

    return add


def target_option(
    slot_name: str, name: str, target: str, doc: str = "", base: type | None = None, option_file=None
) -> type:
    """An option that is nothing but what it builds: the dataclass `name`, a subclass of `base` (default: the
    slot's base) whose `_target_` is `target`, registered for the slot and defined in the calling module (pickled
    configs and the option file's schema name find it there). One line instead of the same five-line class.
    `option_file`: its conf/model/<slot>/ file's name when that is not the class name lowered (a string, or a
    property when several files share the schema); lm.model.options.option_name reads it for messages."""
    module = sys._getframe(1).f_globals["__name__"]
    namespace = {"__doc__": doc or f"{name}: builds {target}.", "__module__": module}
    if option_file is not None:
        namespace["option_file"] = option_file
    cls = make_dataclass(
        name,
        [("_target_", str, field(default=target))],
        bases=(base or _SLOTS[slot_name],),
        namespace=namespace,
    )
    return register(slot_name)(cls)


def slots() -> dict[str, type]:
    """Every slot and its base schema, in registration order."""
    return dict(_SLOTS)


def options(slot_name: str) -> list[type]:
    """The option schemas registered for a slot so far."""
    return list(_OPTIONS[slot_name])


def schema_name(cls: type) -> str:
    """LayerNormConfig -> layernorm_schema: the name an option file lists in its defaults."""
    return cls.__name__.removesuffix("Config").lower() + "_schema"
