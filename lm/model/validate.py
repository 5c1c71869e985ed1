"""Validation of a typed ModelConfig: refuse, before anything is built, the values that cannot make a
model and the option combinations the papers do not define, naming the fields and the fix.

Types and choices are checked by the schemas at composition; an attention option's own limits by its
`check` (lm/model/options.py); everything that spans several fields or options is here.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass

from lm.config_base import Choice, ConfigError
from lm.model.choices import Arch, TieEmbeddings
from lm.model.config import ModelConfig
from lm.model.options import (
    SLOTS,
    Cell,
    Component,
    FFNConfig,
    MoEConfig,
    Nonlinearity,
    RNNConfig,
    SwitchConfig,
    option_name,
    positive,
)
from lm.model.registry import slots

# The ModelConfig fields a recurrent model reads (lm/model/rnn.py); every other field configures a
# Transformer, and setting one on an arch=rnn model is refused (validate_rnn).
RNN_FIELDS = (
    "arch",
    "vocab_size",
    "dim",
    "n_layers",
    "max_seq_len",
    "dropout",
    "tie_embeddings",
    "n_segments",
    "pad_token_id",
    "init",
    "init_std",
    "loss_chunk_size",
    "linear",
    "rnn",
)


def validate_model(cfg: ModelConfig) -> None:
    """Fail before building when the values cannot make a model (types and choices are checked by the
    schema already); the message names the field."""
    if cfg.electra is not None and cfg.arch != Arch.encoder:
        raise ConfigError(
            f"model.electra is set but model.arch={cfg.arch.value}: ELECTRA's replaced-token detection "
            f"pretrains a bidirectional encoder (its discriminator); set model.arch=encoder (as "
            f"experiment=glue_transfer_electra does) or remove model.electra"
        )
    if cfg.arch == Arch.rnn:
        return validate_rnn(cfg)
    if cfg.rnn is not None:
        raise ConfigError(
            f"model.rnn is set but model.arch={cfg.arch.value}: the rnn node configures a recurrent "
            f"model (model=lstm|gru|rnn, model.arch=rnn); remove it or set model.arch=rnn"
        )
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
    for slot in slots():  # each option refuses the settings it cannot honour (a zoo option: its own rules)
        if getattr(cfg, slot) is not None:
            getattr(cfg, slot).check(cfg)
    if isinstance(cfg.ffn, MoEConfig):
        _validate_moe(cfg.ffn)
    validate_sharing_and_tying(cfg)  # first: it checks model.tie_embeddings' value, which the next one reads
    validate_electra(cfg)
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


# -- ELECTRA (model.electra, lm/model/electra.py) ----------------------------------------------------


def validate_electra(cfg: ModelConfig) -> None:
    """The generator's numbers make a model, and the model's output layer is one the generator can sample."""
    e = cfg.electra
    if e is None:
        return
    for name in ("generator_dim", "generator_heads"):
        positive(f"electra.{name}", getattr(e, name))
    for name in ("generator_ffn_dim", "generator_layers"):
        if getattr(e, name) is not None:
            positive(f"electra.{name}", getattr(e, name))
    if e.generator_dim % e.generator_heads:
        raise ConfigError(
            f"model.electra.generator_dim={e.generator_dim} is not divisible by "
            f"model.electra.generator_heads={e.generator_heads}; ELECTRA's generators use heads of 64 "
            f"(generator_heads={max(1, e.generator_dim // 64)})"
        )
    if not e.disc_weight > 0:
        raise ConfigError(
            f"model.electra.disc_weight={e.disc_weight} must be > 0 (the paper's lambda is 50); "
            f"without it the discriminator, the model that is finetuned, learns nothing"
        )
    if not e.temperature > 0:
        raise ConfigError(
            f"model.electra.temperature={e.temperature} must be > 0 (1.0 samples the generator's softmax as it is)"
        )
    if cfg.embedding is not None or cfg.output is not None or cfg.loss_chunk_size:
        raise ConfigError(
            f"model.electra with model/embedding={_named(cfg.embedding)}, model/output="
            f"{_named(cfg.output)}, model.loss_chunk_size={cfg.loss_chunk_size}: the generator samples its "
            f"replacements from a plain softmax over the token table, so it needs model.embedding=null, "
            f"model.output=null and model.loss_chunk_size=0"
        )
    try:
        validate_model(e.generator_config(cfg))
    except ConfigError as err:
        raise ConfigError(
            f"model.electra's generator (model.electra.generator_dim={e.generator_dim}, generator_heads="
            f"{e.generator_heads}, the model's other options) cannot be built: {err}"
        ) from None


# -- validation of recurrent models ---------------------------------------------------------------


def validate_rnn(cfg: ModelConfig) -> None:
    """An arch=rnn model: the rnn node is set, its numbers make a model, and no Transformer-only field
    differs from its default (a position scheme, heads, norms, ... would be silently unused)."""
    if cfg.rnn is None:
        raise ConfigError(
            "model.arch=rnn needs the model.rnn node (cell, hidden, bidirectional); "
            "start from model=lstm, model=gru or model=rnn"
        )
    for name in ("vocab_size", "dim", "n_layers", "max_seq_len"):
        positive(name, getattr(cfg, name))
    if cfg.rnn.hidden is not None:
        positive("rnn.hidden", cfg.rnn.hidden)
    if not 0.0 <= cfg.dropout < 1.0:
        raise ConfigError(f"model.dropout={cfg.dropout} must be in [0, 1)")
    if cfg.rnn.cell != Cell.rnn and cfg.rnn.nonlinearity != Nonlinearity.tanh:
        raise ConfigError(
            f"model.rnn.nonlinearity={cfg.rnn.nonlinearity.value} applies to model.rnn.cell=rnn only "
            f"(an {cfg.rnn.cell.value.upper()} has fixed gate nonlinearities); remove it"
        )
    defaults = ModelConfig()
    for f in fields(ModelConfig):
        value = getattr(cfg, f.name)
        if f.name in RNN_FIELDS or value is None or value == getattr(defaults, f.name):
            continue
        raise ConfigError(
            f"{_transformer_option(f.name, value, getattr(defaults, f.name))} is a Transformer option; an RNN model "
            f"(model.arch=rnn, model.rnn.cell={cfg.rnn.cell.value}) has no such part: remove it. "
            f"An RNN model reads model.{{{', '.join(n for n in RNN_FIELDS if n != 'rnn')}}} and "
            f"model.rnn.{{{', '.join(f.name for f in fields(RNNConfig))}}}"
        )


def _transformer_option(name: str, value, default) -> str:
    """How the user set it: model/pos=rope for a component slot, model.electra.disc_weight=1.0 inside a node,
    model.n_heads=8 for a value."""
    if isinstance(value, Component):
        return f"model/{name}={_option_name(value)}"
    if is_dataclass(value) and type(value) is type(default):
        return ", ".join(
            f"model.{name}.{f.name}={getattr(value, f.name)!r}"
            for f in fields(value)
            if getattr(value, f.name) != getattr(default, f.name)
        )
    return f"model.{name}={value.value if isinstance(value, Choice) else value!r}"


def _option_name(node: Component) -> str:
    return option_name(node)


def _named(node) -> str:
    """An optional slot's option name for messages: null when unset."""
    return "null" if node is None else option_name(node)


def check_objective(cfg: ModelConfig, objective: str) -> None:
    """Refuse a model that cannot learn `objective` honestly: an RNN learns next-token prediction
    (clm) left to right only; a bidirectional one would read the very token it predicts."""
    if cfg.arch != Arch.rnn:
        return
    if objective != "clm":
        raise ConfigError(
            f"objective {objective} with model.arch=rnn: a recurrent model is trained on clm "
            f"(next-token prediction) only"
        )
    if cfg.rnn.bidirectional:
        raise ConfigError(
            "model.rnn.bidirectional=true reads the tokens it would predict, so it cannot be "
            "pretrained on clm; pretrain with model.rnn.bidirectional=false and finetune a "
            "bidirectional classifier with lm finetune bidirectional=true (docs/architecture.md)"
        )


# -- Narang et al. 2021 options: combinations the papers do not define are refused, naming both fields --


def _validate_embeddings(cfg: ModelConfig) -> None:
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
    rank = cfg.factorized_embedding
    if not isinstance(rank, int) or rank < 0 or (rank and rank >= cfg.dim):
        raise ConfigError(f"model.factorized_embedding={rank!r} must be 0 (off) or a rank below model.dim={cfg.dim}")


def validate_sharing_and_tying(cfg: ModelConfig) -> None:
    """ReZero/Fixup, shared blocks and the Universal Transformer, factorized and tied embeddings (issue #19's
    part-1 rows and #20's Universal Transformer), alone and with the other helpers' options."""
    _validate_embeddings(cfg)
    _validate_with_other_options(cfg)


def _validate_with_other_options(cfg: ModelConfig) -> None:
    if cfg.factorized_embedding and cfg.embedding is not None:
        raise ConfigError(
            f"model.factorized_embedding={cfg.factorized_embedding} with model/embedding="
            f"{_named(cfg.embedding)}: both replace the token table; drop one of them"
        )
    if cfg.factorized_embedding and cfg.output_tied and cfg.output is not None:
        raise ConfigError(
            f"model.factorized_embedding={cfg.factorized_embedding} tied (model.tie_embeddings="
            f"{cfg.tie_embeddings}) with model/output={_named(cfg.output)}: only a plain softmax runs the "
            f"factorization backwards; set model.tie_embeddings=false"
        )
