"""Typed config schemas, registered in Hydra's ConfigStore, and their validation.

A choice that changes which class is built is a config group whose options carry `_target_`
(model/norm, model/ffn, model/pos, engine, ...). A choice inside one class is a typed field
here. Validation runs before anything is built and names the field, the value and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

ARCHS = ("decoder", "encoder", "encoder_decoder")
NORM_POSITIONS = ("pre", "post")
INITS = ("gpt2", "normal", "t5", "torch")


class ConfigError(ValueError):
    """A config asks for something impossible; the message names the field and the fix."""


def component(target: str, **hparams: Any) -> dict:
    """A `_partial_` component node, the same shape as the option files in conf/model/*/."""
    return {"_target_": target, "_partial_": True, **hparams}


@dataclass
class ModelConfig:
    """Hyperparameters of one model. The parent (this config) supplies shapes to components.

    `norm`, `ffn` and `pos` are component nodes (`_target_` + own hyperparameters), chosen by the
    config groups model/norm, model/ffn and model/pos.
    """

    arch: str = "decoder"  # decoder | encoder | encoder_decoder
    vocab_size: int = 256
    dim: int = 64
    n_layers: int = 2
    n_decoder_layers: Optional[int] = None  # encoder_decoder only; defaults to n_layers
    n_heads: int = 4
    n_kv_heads: Optional[int] = None  # None = n_heads (MHA); 1 = MQA; in between = GQA
    head_dim: Optional[int] = None  # None = dim // n_heads
    max_seq_len: int = 128
    norm_position: str = "pre"  # pre | post
    norm_eps: float = 1e-5
    bias: bool = True  # biases in attention and feed-forward projections
    qk_norm: bool = False  # normalise q and k per head before the dot product (Dehghani et al. 2023)
    attn_scale: Optional[float] = None  # None = 1/sqrt(head_dim); T5 uses 1.0
    dropout: float = 0.0
    attn_dropout: float = 0.0
    tie_embeddings: bool = True
    scale_embeddings: bool = False  # multiply token embeddings by sqrt(dim) (Vaswani et al. 2017)
    embed_norm: bool = False  # norm after the embeddings (BERT)
    final_norm: bool = True  # norm after the last block (pre-norm stacks need it)
    n_segments: int = 0  # segment (token type) embeddings, BERT uses 2
    mlm_transform: bool = False  # BERT's dense+act+norm before the MLM output layer
    logit_scale: float = 1.0  # T5 scales tied outputs by dim**-0.5
    pad_token_id: int = 0
    decoder_start_token_id: int = 0  # encoder_decoder: first decoder input (T5 uses pad)
    init: str = "gpt2"  # gpt2 | normal | t5 | torch
    init_std: float = 0.02
    loss_chunk_size: int = 0  # >0: chunked output projection + cross-entropy (tokens per chunk)
    activation_checkpointing: bool = False
    norm: Any = field(default_factory=lambda: component("lm.model.norms.LayerNorm"))
    ffn: Any = field(default_factory=lambda: component("lm.model.ffn.MLP", activation="gelu"))
    pos: Any = field(default_factory=lambda: component("lm.model.position.Learned"))

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def d_head(self) -> int:
        return self.head_dim or self.dim // self.n_heads

    @property
    def decoder_layers(self) -> int:
        return self.n_decoder_layers or self.n_layers


def conf_dir():
    """The Hydra config directory (top-level conf/ of the repository)."""
    from pathlib import Path

    return Path(__file__).resolve().parents[1] / "conf"


def compose_model(preset: str = "tiny", overrides: Optional[list] = None):
    """The model node of a preset plus overrides, composed by Hydra as `lm-train model=<preset>` would.

    Overrides use the user grammar relative to the model: ["ffn=swiglu", "dim=128"].
    """
    from hydra import compose, initialize_config_dir

    model_overrides = [f"model/{o}" if "=" in o and "/" not in o.split("=")[0] and o.split("=")[0] in ("norm", "ffn", "pos")
                       else f"model.{o}" for o in (overrides or [])]
    register_configs()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        return compose(config_name=None, overrides=[f"+model={preset}", *model_overrides]).model


@dataclass
class ModelSchema(ModelConfig):
    """The Hydra schema of model presets: component slots start empty and are filled by groups."""

    norm: Any = None
    ffn: Any = None
    pos: Any = None


def register_configs() -> None:
    """Put the schemas in Hydra's ConfigStore (presets list `schema` first in their defaults)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(group="model", name="schema", node=ModelSchema)


def _choice(name: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ConfigError(f"model.{name}={value!r} is not one of {list(allowed)}; set model.{name}=<one of those>")


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or value < 1:
        raise ConfigError(f"model.{name}={value!r} must be a positive integer")


def validate_model(cfg: ModelConfig) -> None:
    """Fail before building when the config cannot make a model; the message names the field."""
    _choice("arch", cfg.arch, ARCHS)
    _choice("norm_position", cfg.norm_position, NORM_POSITIONS)
    _choice("init", cfg.init, INITS)
    for name in ("vocab_size", "dim", "n_layers", "n_heads", "max_seq_len"):
        _positive(name, getattr(cfg, name))
    if cfg.head_dim is None and cfg.dim % cfg.n_heads:
        raise ConfigError(
            f"model.dim={cfg.dim} is not divisible by model.n_heads={cfg.n_heads}; "
            f"choose n_heads among {[h for h in range(1, cfg.dim + 1) if cfg.dim % h == 0]} or set model.head_dim"
        )
    if cfg.n_kv_heads is not None:
        _positive("n_kv_heads", cfg.n_kv_heads)
        if cfg.n_heads % cfg.n_kv_heads:
            raise ConfigError(
                f"model.n_kv_heads={cfg.n_kv_heads} does not divide model.n_heads={cfg.n_heads}; "
                f"allowed: {[k for k in range(1, cfg.n_heads + 1) if cfg.n_heads % k == 0]}"
            )
    if not 0.0 <= cfg.dropout < 1.0 or not 0.0 <= cfg.attn_dropout < 1.0:
        raise ConfigError("model.dropout and model.attn_dropout must be in [0, 1)")
    for slot in ("norm", "ffn", "pos"):
        node = getattr(cfg, slot)
        if not hasattr(node, "get") or not node.get("_target_"):
            raise ConfigError(
                f"model.{slot} has no _target_; pick an option with model/{slot}=<option> "
                f"(see conf/model/{slot}/)"
            )
