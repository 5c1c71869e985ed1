"""Validation of a typed ModelConfig: refuse, before anything is built, the values that cannot make a
model and the option combinations the papers do not define, naming the fields and the fix.

Types and choices are checked by the schemas at composition; an attention option's own limits by its
`check` (lm/model/options.py); everything that spans several fields or options is here.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import TYPE_CHECKING, List

from lm.config_base import Choice, ConfigError
from lm.model.choices import Arch, BlockKind, EmbeddingKind, NormPosition, OutputKind, TieEmbeddings
from lm.model.options import (SLOTS, Cell, Component, FFNConfig, MoEConfig, Nonlinearity, ReZeroNorm, RNNConfig,
                              SwitchConfig, positive)

if TYPE_CHECKING:  # lm/model/config.py imports this module; validate_rnn imports ModelConfig when it runs
    from lm.model.config import ModelConfig


# The ModelConfig fields a recurrent model reads (lm/model/rnn.py); every other field configures a
# Transformer, and setting one on an arch=rnn model is refused (validate_rnn).
RNN_FIELDS = ("arch", "vocab_size", "dim", "n_layers", "max_seq_len", "dropout", "tie_embeddings", "n_segments",
              "pad_token_id", "init", "init_std", "loss_chunk_size", "linear", "rnn")


def validate_model(cfg: ModelConfig) -> None:
    """Fail before building when the values cannot make a model (types and choices are checked by the
    schema already); the message names the field."""
    if cfg.electra is not None and cfg.arch != Arch.encoder:
        raise ConfigError(f"model.electra is set but model.arch={cfg.arch.value}: ELECTRA's replaced-token detection "
                          f"pretrains a bidirectional encoder (its discriminator); set model.arch=encoder (as "
                          f"experiment=glue_transfer_electra does) or remove model.electra")
    if cfg.arch == Arch.rnn:
        return validate_rnn(cfg)
    if cfg.rnn is not None:
        raise ConfigError(f"model.rnn is set but model.arch={cfg.arch.value}: the rnn node configures a recurrent "
                          f"model (model=lstm|gru|rnn, model.arch=rnn); remove it or set model.arch=rnn")
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
    for slot, base in SLOTS.items():
        if not isinstance(getattr(cfg, slot), base) or not getattr(cfg, slot)._target_:
            raise ConfigError(f"model.{slot} is not set; pick an option with model/{slot}=<option> "
                              f"(see conf/model/{slot}/)")
    cfg.attn.check(cfg)
    validate_sparse(cfg)
    validate_sharing_and_tying(cfg)  # first: it checks model.tie_embeddings' value, which the next one reads
    validate_narang_options(cfg)
    validate_electra(cfg)


# -- validation of the issue #20 options: refuse undefined combinations before anything is built -------

def validate_sparse(cfg: ModelConfig) -> None:
    if isinstance(cfg.ffn, MoEConfig):
        _validate_moe(cfg.ffn)
    _validate_pkm(cfg)
    _validate_funnel(cfg)
    _validate_block(cfg)


def _validate_moe(moe: MoEConfig) -> None:
    kind = "switch" if isinstance(moe, SwitchConfig) else "moe"
    dense = FFNConfig()
    for name in ("activation", "hidden_mult", "multiple_of", "hidden_dim"):
        if getattr(moe, name) != getattr(dense, name):
            raise ConfigError(f"model.ffn.{name}={getattr(moe, name)!r} does nothing for model/ffn={kind}: "
                              f"the experts' FFN has it, set model.ffn.expert.{name}")
    if not isinstance(moe.expert, FFNConfig) or not moe.expert._target_:
        raise ConfigError(f"model.ffn.expert is not set for model/ffn={kind}; pick the experts' FFN with "
                          f"model/ffn@model.ffn.expert=<option> (see conf/model/ffn/)")
    if isinstance(moe.expert, MoEConfig):
        raise ConfigError(f"model.ffn.expert is an MoE ({moe.expert._target_}); experts must be dense FFNs "
                          f"(relu, gelu, swiglu, ...)")
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


def _stack_depths(cfg: ModelConfig) -> List[int]:
    return [cfg.n_layers] + ([cfg.decoder_layers] if cfg.arch == Arch.encoder_decoder else [])


def _validate_pkm(cfg: ModelConfig) -> None:
    pkm = cfg.pkm
    if not pkm.layers:
        return
    depth = max(_stack_depths(cfg) + [sum(cfg.funnel.blocks) + cfg.funnel.decoder_layers if cfg.funnel.blocks else 0])
    bad = [i for i in pkm.layers if not 0 <= i < depth]
    if bad or len(set(pkm.layers)) != len(pkm.layers):
        raise ConfigError(f"model.pkm.layers={list(pkm.layers)} must be distinct block indices in [0, {depth})")
    for name in ("n_keys", "heads", "k_dim", "top_k"):
        positive(f"pkm.{name}", getattr(pkm, name))
    if pkm.k_dim % 2:
        raise ConfigError(f"model.pkm.k_dim={pkm.k_dim} must be even: the query is split into two halves")
    if pkm.top_k > pkm.n_keys:
        raise ConfigError(f"model.pkm.top_k={pkm.top_k} must be <= model.pkm.n_keys={pkm.n_keys}")


def _validate_block(cfg: ModelConfig) -> None:
    if cfg.block == BlockKind.vanilla:
        return
    name = f"model.block={cfg.block.value}"
    if cfg.funnel.blocks:
        raise ConfigError(f"{name} with model.funnel.blocks: Funnel pools the queries inside the vanilla block's "
                          f"self-attention, which neither paper defines for these cells; use one or the other")
    if cfg.block == BlockKind.weighted:
        if isinstance(cfg.ffn, MoEConfig) or cfg.pkm.layers:
            raise ConfigError(f"{name} gives every attention head its own dense FFN (1/n_heads of model/ffn's hidden "
                              f"size) in place of the block's FFN, so model/ffn=moe|switch and model.pkm.layers have "
                              f"no FFN to replace; use a dense model/ffn and model.pkm.layers=[]")
        return
    if cfg.arch != Arch.encoder and (isinstance(cfg.ffn, MoEConfig) or cfg.pkm.layers):
        raise ConfigError(f"{name}: the decoder cell's FFN is the paper's Swish FFN, so model/ffn=moe|switch and "
                          f"model.pkm.layers would not be used in it; use them with model.arch=encoder or drop them")
    if cfg.dim % 2 or cfg.d_head % 2:
        raise ConfigError(f"{name} needs an even model.dim (its d/2-wide convolution branches) and an even head "
                          f"size (its decoder cell's first attention has 2 x n_heads heads of head_dim / 2): "
                          f"got dim={cfg.dim}, head_dim={cfg.d_head}")


def _validate_funnel(cfg: ModelConfig) -> None:
    funnel = cfg.funnel
    if not funnel.blocks:
        return
    if cfg.arch == Arch.decoder:
        raise ConfigError("model.funnel.blocks is set on a decoder (model.arch=decoder): pooling would let "
                          "a token see its pooled future; use model.arch=encoder or encoder_decoder, or "
                          "model.funnel.blocks=[]")
    if any(not isinstance(b, int) or b < 1 for b in funnel.blocks) or sum(funnel.blocks) != cfg.n_layers:
        raise ConfigError(f"model.funnel.blocks={list(funnel.blocks)} must be positive and sum to "
                          f"model.n_layers={cfg.n_layers}")
    if not isinstance(funnel.decoder_layers, int) or funnel.decoder_layers < 0:
        raise ConfigError(f"model.funnel.decoder_layers={funnel.decoder_layers!r} must be >= 0")


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
        raise ConfigError(f"model.electra.generator_dim={e.generator_dim} is not divisible by "
                          f"model.electra.generator_heads={e.generator_heads}; ELECTRA's generators use heads of 64 "
                          f"(generator_heads={max(1, e.generator_dim // 64)})")
    if not e.disc_weight > 0:
        raise ConfigError(f"model.electra.disc_weight={e.disc_weight} must be > 0 (the paper's lambda is 50); "
                          f"without it the discriminator, the model that is finetuned, learns nothing")
    if not e.temperature > 0:
        raise ConfigError(f"model.electra.temperature={e.temperature} must be > 0 (1.0 samples the generator's "
                          f"softmax as it is)")
    if cfg.embedding != EmbeddingKind.standard or cfg.output != OutputKind.softmax or cfg.loss_chunk_size:
        raise ConfigError(f"model.electra with model.embedding={cfg.embedding}, model.output={cfg.output}, "
                          f"model.loss_chunk_size={cfg.loss_chunk_size}: the generator samples its replacements from "
                          f"a plain softmax over the token table, so it needs model.embedding=standard, "
                          f"model.output=softmax and model.loss_chunk_size=0")
    try:
        validate_model(e.generator_config(cfg))
    except ConfigError as err:
        raise ConfigError(f"model.electra's generator (model.electra.generator_dim={e.generator_dim}, generator_heads="
                          f"{e.generator_heads}, the model's other options) cannot be built: {err}") from None


# -- validation of recurrent models ---------------------------------------------------------------

def validate_rnn(cfg: ModelConfig) -> None:
    """An arch=rnn model: the rnn node is set, its numbers make a model, and no Transformer-only field
    differs from its default (a position scheme, heads, norms, ... would be silently unused)."""
    if cfg.rnn is None:
        raise ConfigError("model.arch=rnn needs the model.rnn node (cell, hidden, bidirectional); "
                          "start from model=lstm, model=gru or model=rnn")
    for name in ("vocab_size", "dim", "n_layers", "max_seq_len"):
        positive(name, getattr(cfg, name))
    if cfg.rnn.hidden is not None:
        positive("rnn.hidden", cfg.rnn.hidden)
    if not 0.0 <= cfg.dropout < 1.0:
        raise ConfigError(f"model.dropout={cfg.dropout} must be in [0, 1)")
    if cfg.rnn.cell != Cell.rnn and cfg.rnn.nonlinearity != Nonlinearity.tanh:
        raise ConfigError(f"model.rnn.nonlinearity={cfg.rnn.nonlinearity.value} applies to model.rnn.cell=rnn only "
                          f"(an {cfg.rnn.cell.value.upper()} has fixed gate nonlinearities); remove it")
    from lm.model.config import ModelConfig  # at call time: lm/model/config.py imports this module

    defaults = ModelConfig()
    for f in fields(ModelConfig):
        value = getattr(cfg, f.name)
        if f.name in RNN_FIELDS or value is None or value == getattr(defaults, f.name):
            continue
        raise ConfigError(f"{_transformer_option(f.name, value, getattr(defaults, f.name))} is a Transformer option; an RNN model "
                          f"(model.arch=rnn, model.rnn.cell={cfg.rnn.cell.value}) has no such part: remove it. "
                          f"An RNN model reads model.{{{', '.join(n for n in RNN_FIELDS if n != 'rnn')}}} and "
                          f"model.rnn.{{{', '.join(f.name for f in fields(RNNConfig))}}}")


def _transformer_option(name: str, value, default) -> str:
    """How the user set it: model/pos=rope for a component slot, model.pkm.layers=[0] inside a node,
    model.n_heads=8 for a value."""
    if isinstance(value, Component):
        return f"model/{name}={_option_name(value)}"
    if is_dataclass(value) and type(value) is type(default):
        return ", ".join(f"model.{name}.{f.name}={getattr(value, f.name)!r}" for f in fields(value)
                         if getattr(value, f.name) != getattr(default, f.name))
    return f"model.{name}={value.value if isinstance(value, Choice) else value!r}"


def _option_name(node: Component) -> str:
    return node._target_.rsplit(".", 1)[-1].lower() if node._target_ else type(node).__name__


def check_objective(cfg: ModelConfig, objective: str) -> None:
    """Refuse a model that cannot learn `objective` honestly: an RNN learns next-token prediction
    (clm) left to right only; a bidirectional one would read the very token it predicts."""
    if cfg.arch != Arch.rnn:
        return
    if objective != "clm":
        raise ConfigError(f"objective {objective} with model.arch=rnn: a recurrent model is trained on clm "
                          f"(next-token prediction) only")
    if cfg.rnn.bidirectional:
        raise ConfigError("model.rnn.bidirectional=true reads the tokens it would predict, so it cannot be "
                          "pretrained on clm; pretrain with model.rnn.bidirectional=false and finetune a "
                          "bidirectional classifier with lm finetune bidirectional=true (docs/architecture.md)")

def validate_narang_options(cfg: ModelConfig) -> None:
    """Embedding/output/transparent-attention combinations that the papers do not define, refused
    naming both fields (Narang et al. 2021, Table 1 options; issue #19)."""
    adaptive_in, out = cfg.embedding == EmbeddingKind.adaptive, cfg.output
    if adaptive_in or out == OutputKind.adaptive_softmax:
        c = cfg.cutoffs
        if any(not isinstance(x, int) for x in c) or c != sorted(set(c)) or c[0] < 1 or c[-1] >= cfg.vocab_size:
            raise ConfigError(f"model.adaptive_cutoffs={c} must be increasing integers in [1, "
                              f"model.vocab_size={cfg.vocab_size}); e.g. [{cfg.vocab_size // 4}, {cfg.vocab_size // 2}]")
        if cfg.adaptive_div_value < 1:
            raise ConfigError(f"model.adaptive_div_value={cfg.adaptive_div_value} must be >= 1 (1 = every band full width)")
    if cfg.output_tied and adaptive_in and out != OutputKind.adaptive_softmax:
        raise ConfigError(f"model.embedding=adaptive with model.tie_embeddings=true and model.output={out}: "
                          "a banded input table cannot be a (vocab_size, dim) output matrix; set model.tie_embeddings=false")
    if cfg.output_tied and out == OutputKind.adaptive_softmax:
        raise ConfigError(f"model.output=adaptive_softmax with model.tie_embeddings=true: torch's adaptive softmax "
                          f"owns its cluster weights, so tying is not supported here; set model.tie_embeddings=false")
    if out != OutputKind.softmax and cfg.loss_chunk_size:
        raise ConfigError(f"model.output={out} with model.loss_chunk_size={cfg.loss_chunk_size}: the chunked loss "
                          f"is for a plain softmax only; set model.loss_chunk_size=0")
    if out == OutputKind.mixture_of_softmaxes and cfg.mos_components < 1:
        raise ConfigError(f"model.mos_components={cfg.mos_components} must be a positive integer")
    if cfg.transparent_attention and cfg.arch != Arch.encoder_decoder:
        raise ConfigError(f"model.transparent_attention=true with model.arch={cfg.arch}: transparent attention "
                          f"mixes encoder layers into cross-attention, which only encoder_decoder has")
    if cfg.transparent_attention and cfg.funnel.blocks:
        raise ConfigError(f"model.transparent_attention=true with model.funnel.blocks={list(cfg.funnel.blocks)}: a "
                          f"Funnel encoder's layers have different lengths, so they cannot be mixed; drop one of them")


# -- Narang et al. 2021 options: combinations the papers do not define are refused, naming both fields --

def _norm_option(cfg: ModelConfig) -> str:
    return f"model/norm={type(cfg.norm).__name__.removesuffix('Config').lower()}"


def _validate_residual(cfg: ModelConfig) -> None:
    residual = type(cfg.norm).residual
    if residual is None:
        return
    if cfg.norm_position != NormPosition.pre:
        raise ConfigError(f"{_norm_option(cfg)} defines its own residual (x + scalar * f(x)); "
                          f"model.norm_position={cfg.norm_position} does not apply: leave it at pre")
    no_norm = residual == "fixup" or cfg.norm.with_norm == ReZeroNorm.none
    for name in ("qk_norm", "embed_norm", "mlm_transform"):
        if no_norm and getattr(cfg, name):
            raise ConfigError(f"{_norm_option(cfg)} has no norm, but model.{name}=true needs one; set model.{name}=false"
                              f" or pick model/norm=rezero_layernorm or rezero_rmsnorm")


def _validate_sharing(cfg: ModelConfig) -> None:
    stacks = {Arch.decoder: {"decoder"}, Arch.encoder: {"encoder"}, Arch.encoder_decoder: {"encoder", "decoder"}}
    if cfg.share_blocks in ("encoder", "decoder") and cfg.share_blocks not in stacks[cfg.arch]:
        raise ConfigError(f"model.share_blocks={cfg.share_blocks}: model.arch={cfg.arch} has no {cfg.share_blocks} "
                          f"stack; use model.share_blocks=all or {' / '.join(sorted(stacks[cfg.arch]))}")
    if not isinstance(cfg.ut_steps, int) or cfg.ut_steps < 0:
        raise ConfigError(f"model.ut_steps={cfg.ut_steps!r} must be 0 (off) or a positive number of steps")
    if cfg.ut_steps and cfg.share_blocks in ("encoder", "decoder"):
        raise ConfigError(f"model.ut_steps={cfg.ut_steps} makes every stack one recurrent block; "
                          f"model.share_blocks={cfg.share_blocks} would leave the other stack unshared: use none or all")
    if (cfg.ut_steps or cfg.share_blocks != "none") and cfg.attn_scale_by_layer:
        raise ConfigError("model.attn_scale_by_layer=true scales each layer differently, so its blocks cannot be "
                          f"shared (model.share_blocks={cfg.share_blocks}, model.ut_steps={cfg.ut_steps})")


def _validate_embeddings(cfg: ModelConfig) -> None:
    if isinstance(cfg.tie_embeddings, str) and cfg.tie_embeddings not in TieEmbeddings.__members__:
        raise ConfigError(f"model.tie_embeddings={cfg.tie_embeddings!r} is not one of true, false, "
                          f"{', '.join(TieEmbeddings.__members__)}")
    if cfg.tying in ("encoder_decoder_inputs", "decoder_input_output") and cfg.arch != Arch.encoder_decoder:
        raise ConfigError(f"model.tie_embeddings={cfg.tie_embeddings} ties tables of two stacks, but model.arch="
                          f"{cfg.arch} has one input table; use true (tied to the output) or false")
    rank = cfg.factorized_embedding
    if not isinstance(rank, int) or rank < 0 or (rank and rank >= cfg.dim):
        raise ConfigError(f"model.factorized_embedding={rank!r} must be 0 (off) or a rank below model.dim={cfg.dim}")


def validate_sharing_and_tying(cfg: ModelConfig) -> None:
    """ReZero/Fixup, shared blocks and the Universal Transformer, factorized and tied embeddings (issue #19's
    part-1 rows and #20's Universal Transformer), alone and with the other helpers' options."""
    _validate_residual(cfg)
    _validate_sharing(cfg)
    _validate_embeddings(cfg)
    _validate_with_other_options(cfg)


def _validate_with_other_options(cfg: ModelConfig) -> None:
    sharing = f"model.share_blocks={cfg.share_blocks}" if cfg.share_blocks != "none" else (
        f"model.ut_steps={cfg.ut_steps}" if cfg.ut_steps else None)
    if sharing and cfg.funnel.blocks and cfg.share_blocks != "decoder":
        raise ConfigError(f"{sharing} with model.funnel.blocks={list(cfg.funnel.blocks)}: a Funnel encoder's groups "
                          f"are distinct blocks; share the decoder only (model.share_blocks=decoder) or drop one")
    if sharing and cfg.pkm.layers:
        raise ConfigError(f"{sharing} with model.pkm.layers={list(cfg.pkm.layers)}: the memory replaces the FFN of "
                          f"chosen blocks, which a shared block cannot single out; drop one of them")
    if cfg.ut_steps and cfg.transparent_attention:
        raise ConfigError(f"model.ut_steps={cfg.ut_steps} with model.transparent_attention=true: transparent "
                          f"attention mixes model.n_layers encoder layers, the Universal Transformer applies "
                          f"ut_steps; use model.share_blocks=all with it instead")
    if cfg.factorized_embedding and cfg.embedding != EmbeddingKind.standard:
        raise ConfigError(f"model.factorized_embedding={cfg.factorized_embedding} with model.embedding={cfg.embedding}:"
                          f" both replace the token table; drop one of them")
    if cfg.factorized_embedding and cfg.output_tied and cfg.output != OutputKind.softmax:
        raise ConfigError(f"model.factorized_embedding={cfg.factorized_embedding} tied (model.tie_embeddings="
                          f"{cfg.tie_embeddings}) with model.output={cfg.output}: only a plain softmax runs the "
                          f"factorization backwards; set model.tie_embeddings=false")
