"""A config-group override that names no option (`model=gpt3`, `model/ffn=swigluu`) is refused before Hydra
composes, in one line that lists the group's options. Hydra's own report is a dozen lines (the search path, the
schema nodes among the options) ending in advice about HYDRA_FULL_ERROR.

An option is a yaml file under conf/<group>/ or a node registered in Hydra's ConfigStore under the group
(experiment/narang_row/*); `*_schema` nodes type the others and are not offered. A command line that adds its own
search path (hydra.searchpath=..., --config-dir) is left to Hydra, since its options may live anywhere, and so are
Hydra's own groups (hydra/launcher=basic is Hydra's, not a file here).
"""

from __future__ import annotations

from lm.config import ConfigError, conf_dir

OTHER_CONFIG_DIRS = ("--config-dir", "-cd", "--config-path", "-cp")  # Hydra's flags for another config directory


def check_group_options(args: list[str]) -> None:
    if any(a.lstrip("+").startswith("hydra.searchpath") or a.split("=")[0] in OTHER_CONFIG_DIRS for a in args):
        return
    for arg in args:
        key, sep, value = arg.lstrip("+").partition("=")
        if not sep or key.startswith(("~", "hydra")) or "." in key or any(c in value for c in "()$"):
            continue  # not a group choice, a deletion, Hydra's own groups, a sweep function or interpolation
        known = options(key)
        if not known and "/" in key and (close := closest_group(key)):  # model/fnn: Hydra's line says "model"
            raise ConfigError(f"{key} is not a config group; did you mean {close}? (options: {_shown(options(close))})")
        if not known:
            continue  # no group of this project's (model@pkg=..., a typo in a key): Hydra's to report
        if not value:  # `model/ffn=` (a sweep list left empty): Hydra's report lists the schema nodes too
            raise ConfigError(f"{key}= names no option; pick one of {_shown(known)}")
        for name in (v.strip().strip("'\"") for v in value.strip("[]").split(",")):
            if name and name != "null" and name not in known:
                raise ConfigError(f"{key}={name}: no such option in conf/{key}/; pick one of {_shown(known)}")


def _shown(known: set[str]) -> str:
    return ", ".join(sorted(n for n in known if "/" not in n) or sorted(known))  # not model's subgroups


def closest_group(key: str) -> str | None:
    """The config group under conf/ closest to a mistyped one (model/fnn -> model/ffn), if any is close."""
    import difflib

    groups = [str(p.relative_to(conf_dir())) for p in conf_dir().rglob("*") if p.is_dir() and p.name != "hydra"]
    close = difflib.get_close_matches(key, groups, n=1)
    return close[0] if close else None


def offered_only(help_text: str) -> str:
    """Hydra's --help lists each group's options as its search finds them, the `*_schema` nodes among them
    (`model/ffn: ..., mlp_schema, ...`); they type the options and cannot be chosen, so each `group: a, b` line
    keeps the options `options(group)` offers."""
    lines = []
    for line in help_text.splitlines(keepends=True):
        group, sep, items = line.partition(": ")
        known = options(group) if sep and group and " " not in group else set()
        if known:
            line = f"{group}: {', '.join(i for i in items.strip().split(', ') if i in known)}\n"
        lines.append(line)
    return "".join(lines)


def options(group: str) -> set[str]:
    """The option names of config group `group` ("model", "model/ffn"; nested: "glue/sst2" under "task")."""
    from hydra.core.config_store import ConfigStore

    root = conf_dir() / group
    names = {str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml")} if root.is_dir() else set()
    node = ConfigStore.instance().repo
    for part in group.split("/"):
        node = node.get(part) if isinstance(node, dict) else None
    names |= set(_stored(node)) if isinstance(node, dict) else set()
    return {n for n in names if not n.endswith("schema")}


def _stored(node: dict, prefix: str = ""):
    for name, child in node.items():
        if isinstance(child, dict):
            yield from _stored(child, f"{prefix}{name}/")
        else:
            yield prefix + name.removesuffix(".yaml")
