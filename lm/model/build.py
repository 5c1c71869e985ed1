"""build_model(cfg): the one place model code meets Hydra (instantiate): validate the typed config, build
the factories of its slots (lm/model/registry.py), the model of its family, and initialise its weights."""

from lm.config_base import ConfigError
from lm.model.config import ModelConfig
from lm.model.init import init_weights
from lm.model.linear import use_kind
from lm.model.lm import DecoderLM, EncoderDecoderLM, EncoderLM
from lm.model.options import FamilyConfig
from lm.model.registry import slots
from lm.model.stack import Components
from lm.model.validate import validate_model

ARCH_CLASSES = {"decoder": DecoderLM, "encoder": EncoderLM, "encoder_decoder": EncoderDecoderLM}


def components(cfg: ModelConfig) -> Components:
    """The factories of the model's slots (lm/model/registry.py) that the config fills (model/family builds the
    model itself: it is no factory). A family that reads no Transformer slot (`transformer = False`) has them null."""
    from hydra.utils import instantiate

    def build(slot):
        try:
            return instantiate(kernel_node(cfg, slot))
        except Exception as e:  # Hydra wraps import and argument errors; say which slot failed
            raise ConfigError(f"model.{slot} could not be built ({e}); see conf/model/{slot}/ for the options") from e

    filled = [slot for slot, base in slots().items() if getattr(cfg, slot) is not None and base is not FamilyConfig]
    return Components(**{"norm": None, "ffn": None, "pos": None, **{slot: build(slot) for slot in filled}})


def kernel_node(cfg: ModelConfig, slot: str):
    """The slot's option node, with the fused module's target when model.kernels switches that slot's module
    (lm/model/kernels.py; validate_model has refused a switch that does not apply)."""
    node = getattr(cfg, slot)
    switch = {"norm": "norm", "ffn": "glu"}.get(slot)
    if switch is None or getattr(cfg.kernels, switch) == "torch":
        return node
    from lm.model.kernels import swap

    return swap(switch, node, cfg)


def build_model(cfg: ModelConfig):
    """Validate the typed config, build the model of its family, and initialise its weights."""
    if not isinstance(cfg, ModelConfig):
        raise TypeError(
            f"build_model takes a ModelConfig (lm.model.config), not {type(cfg).__name__}; "
            f"compose one with model_preset(name, overrides) or model_from_saved(node)"
        )
    validate_model(cfg)
    if cfg.family is not None:  # a model/family option builds its model itself (lm/zoo)
        model = cfg.family.build(cfg, components)
    else:
        model = ARCH_CLASSES[cfg.arch](cfg, components(cfg))
    init_weights(model, cfg)
    try:
        return use_kind(model, cfg.linear)
    except ValueError as e:
        raise ConfigError(str(e)) from None
