"""Model code: single-device PyTorch. `build_model(cfg)` is the only place it meets Hydra.

Public API: build_model, model_config, Block, DecoderLM, EncoderLM, EncoderDecoderLM,
SequenceClassifier, generate (lm.model.generate), from_hf / to_hf (lm.model.convert; docs/convert.md),
num_params / flops_per_token (lm.model.flops).
"""

from dataclasses import fields
from typing import Any, Union

from lm.config import ConfigError, ModelConfig, validate_model
from lm.model.block import Block
from lm.model.init import init_weights
from lm.model.linear import use_kind
from lm.model.lm import DecoderLM, EncoderDecoderLM, EncoderLM, SequenceClassifier
from lm.model.stack import Components

ARCH_CLASSES = {"decoder": DecoderLM, "encoder": EncoderLM, "encoder_decoder": EncoderDecoderLM}

__all__ = ["build_model", "model_config", "Block", "DecoderLM", "EncoderLM", "EncoderDecoderLM", "SequenceClassifier"]


def model_config(cfg: Union[ModelConfig, Any]) -> ModelConfig:
    """A typed ModelConfig from a ModelConfig, a dict or an OmegaConf node.

    Fields are type-checked against the schema (unknown keys and wrong types fail here, before
    anything is built); the component nodes norm/ffn/pos stay plain dicts for instantiate.
    """
    if isinstance(cfg, ModelConfig):
        return cfg
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    data = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    slots = {k: data.pop(k) for k in ("norm", "ffn", "pos") if k in data}
    try:
        typed = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), data))
    except OmegaConfBaseException as e:
        allowed = sorted(f.name for f in fields(ModelConfig))
        raise ConfigError(f"bad model config: {e.msg if hasattr(e, 'msg') else e}. Allowed fields: {allowed}") from None
    for k, v in slots.items():
        setattr(typed, k, v)
    return typed


def components(cfg: ModelConfig) -> Components:
    from hydra.utils import instantiate

    def build(slot):
        try:
            return instantiate(getattr(cfg, slot))
        except Exception as e:  # Hydra wraps import and argument errors; say which slot failed
            raise ConfigError(f"model.{slot} could not be built ({e}); see conf/model/{slot}/ for the options") from e

    return Components(norm=build("norm"), ffn=build("ffn"), pos=build("pos"))


def build_model(cfg: Union[ModelConfig, Any]):
    """Validate the config, build the model of its family, and initialise its weights."""
    cfg = model_config(cfg)
    validate_model(cfg)
    model = ARCH_CLASSES[cfg.arch](cfg, components(cfg))
    init_weights(model, cfg)
    try:
        return use_kind(model, cfg.linear)
    except ValueError as e:
        raise ConfigError(str(e)) from None
