"""The model's config schema: ModelConfig (defined beside the slot schemas its fields hold, lm/model/options.py,
whose checks read it: one module, no import cycle), ModelSchema and their Hydra registration, presets and saved
configs.

A choice that changes which class is built is a config group (model/norm, model/ffn, model/pos, model/attn):
each option is a dataclass in lm/model/options.py (its `_target_` and its own hyperparameters) and one YAML
file in conf/model/<slot>/ that lists the dataclass as its schema, so a wrong key or value fails when Hydra
composes the config. A choice inside one class is an Enum field of ModelConfig (lm/model/choices.py).
Validation: lm/model/validate.py.

`from lm.model.config import X` stays the one import path for the public names of the two modules it
re-exports below (callers, tests and pickled configs name them here); validation is lm/model/validate.py's,
which imports this module (never the reverse).
"""

from __future__ import annotations

from dataclasses import dataclass

from lm.config_base import ConfigError
from lm.model.choices import Activation, Arch, Init, LinearKind, NormPosition, TieEmbeddings  # noqa: F401
from lm.model.options import (  # noqa: F401
    SLOTS,
    ALiBiConfig,
    AttnConfig,
    BlockConfig,
    Component,
    CrossEntropyKernel,
    EmbeddingConfig,
    FamilyConfig,
    FFNConfig,
    GLUConfig,
    GLUKernel,
    KernelsConfig,
    LayerNormConfig,
    LearnedConfig,
    MemoryConfig,
    MLPConfig,
    ModelConfig,
    MoEConfig,
    NoPositionConfig,
    NormConfig,
    NormKernel,
    OutputConfig,
    PosConfig,
    RMSNormConfig,
    RoPEConfig,
    RopeScaling,
    ScaledDotConfig,
    SinusoidalConfig,
    StackConfig,
    SwitchConfig,
    T5BiasConfig,
    option_name,
    options,
    positive,
)
from lm.model.registry import schema_name, slots  # noqa: F401
from lm.model.upgrade import MOVED_TARGETS, moved_override, upgrade_saved


@dataclass
class ModelSchema(ModelConfig):
    """The Hydra schema of model presets: component slots start empty and are filled by groups."""

    norm: NormConfig | None = None
    ffn: FFNConfig | None = None
    pos: PosConfig | None = None
    attn: AttnConfig | None = None


def register_model_configs() -> None:
    """model/schema (presets list it first) and model/<slot>/<option>_schema (option files list theirs), for
    every option registered so far (lm/model/registry.py): the config root imports lm.zoo first; the resolvers presets
    derive values with: ${lm.inv_sqrt:${.dim}} (T5's logit_scale, dim^-1/2), ${lm.div:${model.vocab_size},8}."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("lm.inv_sqrt"):
        OmegaConf.register_new_resolver("lm.inv_sqrt", lambda x: float(x) ** -0.5)
    if not OmegaConf.has_resolver("lm.div"):  # ${lm.div:${model.vocab_size},8}: a share of the vocabulary
        OmegaConf.register_new_resolver("lm.div", lambda x, n: int(x) // int(n))
    cs = ConfigStore.instance()
    cs.store(group="model", name="schema", node=ModelSchema)
    for slot in slots():
        for cls in options(slot):
            cs.store(group=f"model/{slot}", name=schema_name(cls), node=cls)


def model_preset(name: str = "tiny", overrides: list[str] | None = None) -> ModelConfig:
    """conf/model/<name>.yaml plus overrides in lm train's grammar (`model/ffn=swiglu`, `model.dim=128`),
    composed by Hydra as `lm train model=<name> ...` would: a typed ModelConfig."""
    from lm.config_base import compose_group

    for arg in overrides or []:
        line = moved_override(arg)
        if line is not None:
            raise ConfigError(line)
    try:
        return compose_group("model", name, overrides, register_model_configs)
    except ConfigError as e:
        raise ConfigError(_unregistered_zoo_option(str(e)) or str(e)) from None


def _unregistered_zoo_option(message: str) -> str | None:
    """The fix, in one line, when composition failed on an option schema that nothing registered: a zoo option
    (model=lstm, model/attn=linformer) composed without `import lm.zoo`, which the core may not import itself
    (the wall in docs/architecture.md); the entry points import it, a library caller must. Hydra's own words
    ("Could not load 'model/family/rnn_schema'") name neither the cause nor the fix."""
    import re

    found = re.search(r"In '(model/\w+/\w+)': Could not load 'model/\w+/\w+_schema'", message)
    if found is None:
        return None
    option = "=".join(found[1].rsplit("/", 1))  # model/family/lstm -> model/family=lstm
    return (
        f"{option} is a paper variant of lm/zoo, whose options register when it is imported: "
        f"run `import lm.zoo` before model_preset (lm's commands do)"
    )


def model_from_saved(node) -> ModelConfig:
    """A ModelConfig from a saved model node (a run's config.yaml, a checkpoint's JSON): a dict whose
    component slots name their class by `_target_`. Composition through Hydra does not need this."""
    from omegaconf import OmegaConf

    from lm.config_base import to_typed

    data = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)
    # Kernels say how the saving run computed, not what (the same weights): a saved model loads with the eager ops,
    # so it can be read back where those kernels cannot run (a CPU); a run that wants them sets them again.
    data.pop("kernels", None)
    data = upgrade_saved(data)  # fields that became zoo options since (lm/model/upgrade.py)
    if "attn" not in data:  # saved before model/attn existed: those models all used scaled_dot
        data["attn"] = {"_target_": ScaledDotConfig._target_}
    for slot in slots():
        if isinstance(data.get(slot), dict):
            data[slot] = _typed_option(slot, data[slot], f"model.{slot}")
    return to_typed(ModelSchema, data, "model")


def _typed_option(slot: str, node: dict, name: str):
    """A saved option node merged onto the schema its `_target_` names (an MoE's expert node too)."""
    from omegaconf import OmegaConf

    target = MOVED_TARGETS.get(node.get("_target_"), node.get("_target_"))  # a zoo option saved at its old home
    node = {**node, "_target_": target}
    by_target = {cls._target_: cls for cls in options(slot)}
    if target not in by_target and isinstance(target, str):
        _import_module_of(target)  # a zoo option registers its schema when its module is imported
        by_target = {cls._target_: cls for cls in options(slot)}
    if target not in by_target:
        raise ConfigError(f"{name}._target_={target!r} is not one of {sorted(by_target)}")
    if isinstance(node.get("expert"), dict):  # model/ffn=moe|switch: the expert is an FFN option node
        node = {**node, "expert": _typed_option(slot, node["expert"], f"{name}.expert")}
    return OmegaConf.merge(OmegaConf.structured(by_target[target]), node)


def _import_module_of(target: str) -> None:
    """Import the module a saved `_target_` names (lm.zoo.<variant>.<Class> -> lm.zoo.<variant>),
    if it is one of lm's: a config saved with a zoo option loads without importing the zoo first."""
    import importlib

    module = target.rsplit(".", 1)[0]
    if module.startswith("lm."):
        try:
            importlib.import_module(module)
        except ImportError:
            pass  # the caller names the target and the options there are
