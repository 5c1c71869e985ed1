"""Validation of a typed ModelConfig: refuse, before anything is built, the values that cannot make a
model and the option combinations the papers do not define, naming the fields and the fix.

Types and choices are checked by the schemas at composition; an attention option's own limits by its
`check` (lm/model/options.py); everything that spans several fields or options is here.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any

from lm.config_base import Choice, ConfigError
from lm.model.choices import Arch, TieEmbeddings
from lm.model.config import ModelConfig
from lm.model.options import SLOTS, Component, FFNConfig, MoEConfig, SwitchConfig, option_name, positive
from lm.model.registry import slots


def validate_model(cfg: ModelConfig) -> None:
    """Fail before building when the values cannot make a model (types and choices are checked by the
    schema already); the message names the field. A model/family option that reads no Transformer slot
    validates the whole model itself (its `check`)."""
    if cfg.family is not None and not cfg.family.transformer:
        return cfg.family.check(cfg)
    for name in ("vocab_size", "dim", "n_layers", "n_heads", "max_seq_len"):
        positive(name, getattr(cfg, name))
    if cfg.head_dim is None and cfg.dim % cfg.n_heads:
        raise ConfigError(
            f"model.dim={cfg.dim} is not divisible by model.n_heads={cfg.n_heads}; "
            f"choose n_heads among {[h for h in range(1, cfg.dim + 1) if cfg.dim % h == 0]} or set model.head_dim"
        )
    if cfg.n_kv_heads is not None:
        positive("n_kv_heads", cfg.n_kv_heads)
        if cfg.n_heads % cfg.n_kv_heads:
            raise ConfigError(
                f"model.n_kv_heads={cfg.n_kv_heads} does not divide model.n_heads={cfg.n_heads}; "
                f"allowed: {[k for k in range(1, cfg.n_heads + 1) if cfg.n_heads % k == 0]}"
            )
    if not 0.0 <= cfg.dropout < 1.0 or not 0.0 <= cfg.attn_dropout < 1.0:
        raise ConfigError("model.dropout and model.attn_dropout must be in [0, 1)")
    for slot in SLOTS:
        if not isinstance(getattr(cfg, slot), slots()[slot]) or not getattr(cfg, slot)._target_:
            raise ConfigError(
                f"model.{slot} is not set; pick an option with model/{slot}=<option> (see conf/model/{slot}/)"
            )
    _validate_tying(cfg)  # first: the options' checks read model.tie_embeddings resolved (ModelConfig.tying)
    for slot in slots():  # each option refuses the settings it cannot honour (a zoo option: its own rules)
        if getattr(cfg, slot) is not None:
            getattr(cfg, slot).check(cfg)
    if isinstance(cfg.ffn, MoEConfig):
        _validate_moe(cfg.ffn)
    if cfg.kernels.chosen():  # imported only then: the kernels' module imports torch and the FFN/norm modules
        from lm.model.kernels import check

        check(cfg)


# -- model/ffn=moe|switch ------------------------------------------------------------------------


def _validate_moe(moe: MoEConfig) -> None:
    kind = "switch" if isinstance(moe, SwitchConfig) else "moe"
    dense = FFNConfig()
    for name in ("activation", "hidden_mult", "multiple_of", "hidden_dim"):
        if getattr(moe, name) != getattr(dense, name):
            raise ConfigError(
                f"model.ffn.{name}={getattr(moe, name)!r} does nothing for model/ffn={kind}: "
                f"the experts' FFN has it, set model.ffn.expert.{name}"
            )
    if not isinstance(moe.expert, FFNConfig) or not moe.expert._target_:
        raise ConfigError(
            f"model.ffn.expert is not set for model/ffn={kind}; pick the experts' FFN with "
            f"model/ffn@model.ffn.expert=<option> (see conf/model/ffn/)"
        )
    if isinstance(moe.expert, MoEConfig):
        raise ConfigError(
            f"model.ffn.expert is an MoE ({moe.expert._target_}); experts must be dense FFNs (relu, gelu, swiglu, ...)"
        )
    positive("ffn.n_experts", moe.n_experts)
    if not isinstance(moe.top_k, int) or not 1 <= moe.top_k <= moe.n_experts:
        raise ConfigError(f"model.ffn.top_k={moe.top_k!r} must be in [1, model.ffn.n_experts={moe.n_experts}]")
    if not moe.capacity_factor > 0:
        raise ConfigError(f"model.ffn.capacity_factor={moe.capacity_factor!r} must be > 0 (1.0-1.25 is usual)")
    for name in ("aux_loss_weight", "z_loss_weight"):
        if getattr(moe, name) < 0:
            raise ConfigError(f"model.ffn.{name}={getattr(moe, name)!r} must be >= 0")
    if not 0 <= moe.router_jitter < 1:
        raise ConfigError(f"model.ffn.router_jitter={moe.router_jitter!r} must be in [0, 1)")


def unused_fields(cfg: ModelConfig, read: tuple[str, ...]) -> str | None:
    """The first ModelConfig field outside `read` that differs from its default, as the user set it (a family that
    reads few fields refuses the others rather than ignore them; fields added later included), or None."""
    defaults = ModelConfig()
    for f in fields(ModelConfig):
        value = getattr(cfg, f.name)
        if f.name not in read and value is not None and value != getattr(defaults, f.name):
            return _as_set(f.name, value, getattr(defaults, f.name))
    return None


def _as_set(name: str, value: Any, default: Any) -> str:
    """How the user set it: model/pos=rope for a component slot, model.kernels.norm=liger inside a node,
    model.n_heads=8 for a value."""
    if isinstance(value, Component):
        return f"model/{name}={option_name(value)}"
    if is_dataclass(value) and type(value) is type(default):
        return ", ".join(
            f"model.{name}.{f.name}={getattr(value, f.name)!r}"
            for f in fields(value)
            if getattr(value, f.name) != getattr(default, f.name)
        )
    return f"model.{name}={value.value if isinstance(value, Choice) else value!r}"


def check_objective(cfg: ModelConfig, objective: str) -> None:
    """Refuse a model that cannot learn `objective` honestly (its model/family option says which: a model that
    reads both directions cannot learn clm)."""
    if cfg.family is not None:
        cfg.family.check_objective(cfg, objective)


# -- tied embeddings (Narang et al. 2021's rows) ------------------------------------------------------


def _validate_tying(cfg: ModelConfig) -> None:
    if isinstance(cfg.tie_embeddings, str) and cfg.tie_embeddings not in TieEmbeddings.__members__:
        raise ConfigError(
            f"model.tie_embeddings={cfg.tie_embeddings!r} is not one of true, false, "
            f"{', '.join(TieEmbeddings.__members__)}"
        )
    if cfg.tying in ("encoder_decoder_inputs", "decoder_input_output") and cfg.arch != Arch.encoder_decoder:
        raise ConfigError(
            f"model.tie_embeddings={cfg.tie_embeddings} ties tables of two stacks, but model.arch="
            f"{cfg.arch} has one input table; use true (tied to the output) or false"
        )
