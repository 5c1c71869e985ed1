"""Validation of a typed ModelConfig: refuse, before anything is built, the values that cannot make a
model and the option combinations the papers do not define, naming the fields and the fix.

Types and choices are checked by the schemas at composition; an attention option's own limits by its
`check` (lm/model/options.py); everything that spans several fields or options is here.

validate_model runs on every model built, a saved config's included. refuse_unread runs where a user's config
enters (lm train, lm finetune init=none), after it: a value the chosen model would never read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from lm.config_base import Choice, ConfigError
from lm.model.choices import Arch, Init, TieEmbeddings
from lm.model.config import ModelConfig
from lm.model.options import (
    SLOTS,
    Component,
    FFNConfig,
    MoEConfig,
    RoPEConfig,
    RopeScaling,
    SwitchConfig,
    option_name,
    positive,
)
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


# -- values the chosen model never reads (refused at entry) ----------------------------------------------
#
# An ablation that overrides a field the model does not read trains the baseline and measures nothing. Each row: a
# field (its path under model.), the node type that holds it, when the model reads it, why it does not otherwise
# ({arch}, {init}, {norm}, {attn}: the model's choices) and the fix. Only a value other than the field's default is
# refused, so every preset builds; and only at entry: a saved config loads as it was saved (a value that built
# nothing, or model.n_segments on an encoder-decoder, whose segment table the checkpoint holds).


@dataclass(frozen=True)
class Unread:
    field: str
    on: type
    read: Callable[[ModelConfig, Any], bool]  # (the model, the node holding the field) -> whether it is read
    why: str
    fix: str


_ENC_DEC, _DECODER, _ENCODER = Arch.encoder_decoder, Arch.decoder, Arch.encoder
_BANDS = "it bounds the frequency bands of Llama 3.1's scaling (model.pos.scaling=llama3 only)"

UNREAD = (
    Unread(
        "n_decoder_layers",
        ModelConfig,
        lambda m, _: m.arch == _ENC_DEC,
        "model.arch={arch} has one stack, of model.n_layers layers; only encoder_decoder has a decoder stack",
        "set model.n_layers, or model.arch=encoder_decoder",
    ),
    Unread(
        "decoder_start_token_id",
        ModelConfig,
        lambda m, _: m.arch == _ENC_DEC,
        "model.arch={arch} reads its inputs as given; only an encoder-decoder's decoder starts from this token "
        "(its targets shifted right, as T5)",
        "drop the override, or set model.arch=encoder_decoder",
    ),
    Unread(
        "pad_token_id",
        ModelConfig,
        lambda m, _: m.arch != _DECODER,
        "a decoder reads it nowhere (batches are padded with the tokenizer's pad id); an encoder-decoder's shift "
        "right and an encoder's Hugging Face export read it",
        "drop the override",
    ),
    Unread(
        "n_segments",
        ModelConfig,
        lambda m, _: m.arch != _ENC_DEC,
        "an encoder-decoder is given no token types, so segment 0's vector alone would be added to every token",
        "drop the override (segment embeddings are for model.arch=encoder or decoder)",
    ),
    Unread(
        "mlm_transform",
        ModelConfig,
        lambda m, _: m.arch == _ENCODER,
        "BERT's transform is part of the masked-LM head, which model.arch={arch} does not have",
        "drop the override, or set model.arch=encoder",
    ),
    Unread(
        "mlm_activation",
        ModelConfig,  # a model/family option's heads read it too (ELECTRA's discriminator head)
        lambda m, _: m.arch == _ENCODER and (m.mlm_transform or m.family is not None),
        "it is the activation of the masked-LM head's transform (model.arch=encoder with model.mlm_transform=true), "
        "which this model does not have",
        "set model.mlm_transform=true on an encoder, or drop the override",
    ),
    Unread(
        "sparse_prediction",
        ModelConfig,
        lambda m, _: m.arch == _ENCODER,
        "it confines the masked-LM head to the masked positions, and model.arch={arch} has no masked-LM head",
        "drop the override",
    ),
    Unread(
        "init_std",
        ModelConfig,
        lambda m, _: m.init in (Init.gpt2, Init.normal),
        "model.init={init} draws no weight from N(0, init_std) (t5 scales by fan-in, torch keeps PyTorch's init)",
        "set model.init=gpt2 or normal, or drop the override",
    ),
    Unread(
        "norm_eps",
        ModelConfig,
        lambda m, _: m.norm.has_norm(),
        "model/norm={norm} builds no norm, so there is no epsilon",
        "drop the override, or pick a model/norm that builds one (layernorm, rmsnorm)",
    ),
    Unread(
        "attn_dropout",
        ModelConfig,  # an encoder-decoder's cross-attention keeps scaled_dot beside a self_only option
        lambda m, _: m.attn.uses_dropout or (m.arch == _ENC_DEC and m.attn.self_only),
        "model/attn={attn} computes no attention probabilities to drop, and no cross-attention here does",
        "drop the override (an option's own dropout is under model.attn)",
    ),
    Unread(
        "pos.factor",
        RoPEConfig,
        lambda m, pos: pos.scaling is not None,
        "plain RoPE (model.pos.scaling=null) scales no frequency",
        "pick a scaling (model/pos=rope_linear, rope_dynamic or rope_llama3), or drop the override",
    ),
    Unread(
        "pos.low_freq_factor",
        RoPEConfig,
        lambda m, pos: pos.scaling == RopeScaling.llama3,
        _BANDS,
        "use model/pos=rope_llama3, or drop the override",
    ),
    Unread(
        "pos.high_freq_factor",
        RoPEConfig,
        lambda m, pos: pos.scaling == RopeScaling.llama3,
        _BANDS,
        "use model/pos=rope_llama3, or drop the override",
    ),
    Unread(
        "pos.original_max_seq_len",
        RoPEConfig,
        lambda m, pos: pos.scaling in (RopeScaling.dynamic, RopeScaling.llama3),
        "only dynamic and llama3 scaling read the trained context (linear divides every frequency by "
        "model.pos.factor, plain RoPE scales none)",
        "set model.pos.scaling=dynamic or llama3, or drop the override",
    ),
    *(
        Unread(
            f"{ffn}.hidden_mult",
            FFNConfig,
            lambda m, node: not node.hidden_dim,
            f"model.{ffn}.hidden_dim sets the hidden size itself; hidden_mult derives it only when hidden_dim is null",
            f"drop model.{ffn}.hidden_mult or model.{ffn}.hidden_dim",
        )
        for ffn in ("ffn", "ffn.expert")  # a dense FFN, and an MoE's experts
    ),
    *(
        Unread(
            f"{ffn}.multiple_of",
            FFNConfig,  # a hidden_dim that is a multiple is what rounding would give (Llama's 5632 of 256: kept)
            lambda m, node: not node.hidden_dim or node.multiple_of > 0 and node.hidden_dim % node.multiple_of == 0,
            f"model.{ffn}.hidden_dim sets the hidden size itself, not rounded to a multiple",
            f"set model.{ffn}.hidden_dim to a multiple of it, or model.{ffn}.multiple_of=1",
        )
        for ffn in ("ffn", "ffn.expert")
    ),
)


def refuse_unread(cfg: ModelConfig) -> None:
    """At entry, after validate_model: refuse a value, other than its default, that the chosen model never reads
    (UNREAD, then each set option's `unread`), in one line naming the field, why it does nothing and the fix."""
    line = unread(cfg)
    if line is not None:
        raise ConfigError(line)


def unread(cfg: ModelConfig) -> str | None:
    """refuse_unread's line, or None. A model/family option that reads no Transformer slot refuses the
    Transformer's fields in its own check (unused_fields below)."""
    rows = UNREAD if cfg.family is None or cfg.family.transformer else ()
    for row in rows:
        *path, name = row.field.split(".")
        node = _node(cfg, path)
        if not isinstance(node, row.on):
            continue
        value, default = getattr(node, name), getattr(type(node)(), name)
        if value != default and not row.read(cfg, node):
            return f"model.{row.field}={_spelled(value)} has no effect: {row.why.format(**_choices(cfg))}; {row.fix}"
    for slot in slots():
        option = getattr(cfg, slot)
        line = option.unread(cfg) if option is not None else None
        if line is not None:
            return line
    return None


def _node(cfg: ModelConfig, path: list[str]):
    node = cfg
    for part in path:
        node = getattr(node, part, None)
    return node


def _choices(cfg: ModelConfig) -> dict[str, str]:
    """What an UNREAD row's `why` may name."""
    return {
        "arch": Arch(cfg.arch).value,
        "init": Init(cfg.init).value,
        "norm": option_name(cfg.norm) if cfg.norm is not None else "null",
        "attn": option_name(cfg.attn) if cfg.attn is not None else "null",
    }


def _spelled(value: Any) -> str:
    """A value as an override writes it: true, null, decoder, 2.0."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return value.value if isinstance(value, Choice) else str(value)


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
