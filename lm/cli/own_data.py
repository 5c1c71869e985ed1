"""How `lm train` reads your own text in one step (docs/data.md):

    lm train data.source=notes.txt        # = data=text data.source=notes.txt: prepared on first use
    lm train data=data/mine               # = data=prepared data.dir=data/mine: what lm prepare --out wrote

Both are rewrites of the command line before Hydra composes it, so config.yaml, the run_dir's name and the
resume check see ordinary overrides.
"""

from __future__ import annotations

from pathlib import Path

from lm.config import ConfigError, conf_dir


def own_data_args(args: list[str]) -> list[str]:
    keys = [a.lstrip("+~").split("=", 1)[0] for a in args]
    out = []
    for arg, key in zip(args, keys):
        if key == "data" and "=" in arg:
            out += _data_choice(arg.split("=", 1)[1])
        else:
            out.append(arg)
    # data.source alone: the general text preset, not the default preset's (shakespeare_char's) split,
    # tokenizer and directory; an experiment picks its own data preset
    if "data.source" in keys and not any(k in ("data", "experiment") for k in keys):
        out.insert(0, "data=text")
    return out


def _data_choice(value: str) -> list[str]:
    if (conf_dir() / "data" / f"{value}.yaml").is_file() or "," in value or "${" in value:
        return [f"data={value}"]  # a preset (or a sweep over presets)
    path = Path(value).expanduser()
    if (path / "meta.json").is_file():
        return ["data=prepared", f"data.dir={path.absolute()}"]
    presets = ", ".join(sorted(p.stem for p in (conf_dir() / "data").glob("*.yaml") if p.stem != "schema"))
    if path.is_dir():
        where = f"{path} has no meta.json (run lm prepare <your text> --out {path} first)"
    elif path.is_file():
        where = f"{path} is a file: train on its text with data.source={value}"
    else:
        where = f"there is no directory {path}"
    raise ConfigError(f"data={value} is neither a data preset ({presets}) nor a directory lm prepare finished: {where}")
