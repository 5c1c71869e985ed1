"""Per-task hyperparameter presets (conf/task/glue/<task>.yaml) as typed GlueTaskConfig objects."""

from __future__ import annotations

from typing import List

from lm.config import ConfigError, GlueTaskConfig, conf_dir, validate_glue_task


def load_preset(name: str) -> GlueTaskConfig:
    """conf/task/glue/<name>.yaml on top of the schema defaults, validated."""
    from omegaconf import OmegaConf

    path = conf_dir() / "task" / "glue" / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise ConfigError(f"no GLUE task preset {path}; known presets: {known}")
    node = OmegaConf.load(path)
    node.pop("defaults", None)
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(GlueTaskConfig), node))
    validate_glue_task(cfg)
    return cfg


def expand(cfg) -> List[GlueTaskConfig]:
    """The task configs one finetuning run covers: the presets listed by `all`, else `cfg` itself."""
    from omegaconf import OmegaConf

    if not isinstance(cfg, GlueTaskConfig):
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(GlueTaskConfig), cfg))
    validate_glue_task(cfg)
    if cfg.name != "all":
        return [cfg]
    out = []
    for t in cfg.tasks:
        task_cfg = load_preset(t)
        if cfg.data_root is not None:
            task_cfg.data_root = cfg.data_root
        if cfg.max_train_examples is not None:
            task_cfg.max_train_examples = cfg.max_train_examples
        out.append(task_cfg)
    return out
