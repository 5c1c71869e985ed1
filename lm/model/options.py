"""The component option schemas: one dataclass per option file of conf/model/<slot>/ (model/norm,
model/ffn, model/pos, model/attn), and the typed nodes model.pkm, model.funnel, model.rnn and
model.electra.

Each option holds its `_target_` and its own hyperparameters; the model (lm/model/config.py's
ModelConfig) supplies the shapes. A new option is one subclass of its slot's base here and one YAML
file listing `<name>_schema` first in its defaults: `options(slot)` finds it by its class.
An attention option's `check` refuses the model settings it cannot honour; the checks that span
several options live in lm/model/validate.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, ClassVar, Dict, List, Optional, Type

from lm.config_base import Choice, ConfigError
from lm.model.choices import Activation, Arch, BlockKind

if TYPE_CHECKING:  # type hints only: lm/model/config.py imports this module for its field defaults
    from lm.model.config import ModelConfig


def positive(name: str, value: int) -> None:
    if not isinstance(value, int) or value < 1:
        raise ConfigError(f"model.{name}={value!r} must be a positive integer")


# -- model/norm ------------------------------------------------------------------------------------

@dataclass
class Component:
    """A `_partial_` node: Hydra instantiates it into a factory; the model supplies the shapes."""

    _target_: str = ""
    _partial_: bool = True


@dataclass
class NormConfig(Component):
    """model/norm: built as norm(dim, eps=model.norm_eps)."""

    # The residual function (lm/model/block.py RESIDUALS) an option needs; None = model.norm_position's.
    residual: ClassVar[Optional[str]] = None


@dataclass
class LayerNormConfig(NormConfig):
    _target_: str = "lm.model.norms.LayerNorm"
    bias: bool = True


@dataclass
class RMSNormConfig(NormConfig):
    _target_: str = "lm.model.norms.RMSNorm"


class ReZeroNorm(Choice):
    none = "none"  # ReZero proper: no norm anywhere
    layernorm = "layernorm"  # Narang et al.'s "ReZero + LayerNorm"
    rmsnorm = "rmsnorm"  # Narang et al.'s "ReZero + RMS Norm"


@dataclass
class ReZeroConfig(NormConfig):
    """model/norm=rezero, rezero_layernorm, rezero_rmsnorm: each residual branch is scaled by a learned
    scalar initialised to 0 (Bachlechner et al. 2020), with no norm or a norm inside the branch."""

    _target_: str = "lm.model.norms.rezero_norm"
    with_norm: ReZeroNorm = ReZeroNorm.none
    residual: ClassVar[Optional[str]] = "rezero"


@dataclass
class FixupConfig(NormConfig):
    """model/norm=fixup: no norm; scalar bias and multiplier per branch and Fixup's rescaled init (Zhang et al. 2019)."""

    _target_: str = "lm.model.norms.fixup_norm"
    residual: ClassVar[Optional[str]] = "fixup"


# -- model/ffn -------------------------------------------------------------------------------------

@dataclass
class FFNConfig(Component):
    """model/ffn: built as ffn(dim, bias, dropout); hidden = hidden_mult*dim rounded up to multiple_of,
    or hidden_dim when set."""

    activation: Activation = Activation.gelu
    hidden_mult: float = 4.0
    multiple_of: int = 1
    hidden_dim: Optional[int] = None


@dataclass
class MLPConfig(FFNConfig):
    _target_: str = "lm.model.ffn.MLP"


@dataclass
class GLUConfig(FFNConfig):
    _target_: str = "lm.model.ffn.GLU"
    activation: Activation = Activation.silu
    hidden_mult: float = 8 / 3  # parameter-matched to an MLP of 4*dim (Shazeer 2020)


# -- model/ffn=moe|switch (issue #20): lm/model/moe.py ---------------------------------------------

@dataclass
class MoEConfig(FFNConfig):
    """model/ffn=moe: a router sends each token to its top_k of n_experts expert FFNs (Shazeer et al.
    2017; GShard, Lepikhin et al. 2021); lm/model/moe.py. Each expert is itself a model/ffn option node
    (`expert`, chosen with model/ffn@model.ffn.expert=<option>), so the dense-FFN fields inherited from
    FFNConfig belong there: here they must keep FFNConfig's defaults (validate_model refuses others)."""

    _target_: str = "lm.model.moe.MoE"
    expert: Optional[FFNConfig] = None  # filled by the option file's defaults (gelu)
    n_experts: int = 8
    top_k: int = 2
    # training: each expert takes ceil(capacity_factor * top_k * n / n_experts) of a sequence's n real tokens;
    # evaluation drops nothing (lm/model/moe.py)
    capacity_factor: float = 1.25
    aux_loss_weight: float = 0.01  # load-balancing loss weight (Fedus et al. 2021 use 0.01)
    z_loss_weight: float = 0.0  # router z-loss weight (Zoph et al. 2022 use 0.001); 0 = off
    router_jitter: float = 0.0  # multiplicative input noise U(1-eps, 1+eps) while training (Switch); 0 = off


@dataclass
class SwitchConfig(MoEConfig):
    """model/ffn=switch: top-1 routing (Switch Transformer, Fedus et al. 2021)."""

    _target_: str = "lm.model.moe.Switch"
    top_k: int = 1
    capacity_factor: float = 1.0


# -- model/pos -------------------------------------------------------------------------------------

@dataclass
class PosConfig(Component):
    """model/pos: built as pos(dim, n_heads, head_dim, max_seq_len, causal)."""


@dataclass
class LearnedConfig(PosConfig):
    _target_: str = "lm.model.position.Learned"


@dataclass
class NoPositionConfig(PosConfig):
    _target_: str = "lm.model.position.NoPosition"


@dataclass
class SinusoidalConfig(PosConfig):
    _target_: str = "lm.model.position.Sinusoidal"
    base: float = 10000.0


class RopeScaling(Choice):
    """RoPE frequency scaling for contexts past the trained length (docs/convert.md; Hugging Face rope_type)."""

    linear = "linear"  # position interpolation (Chen et al. 2023)
    dynamic = "dynamic"  # NTK-aware theta growth past original_max_seq_len
    llama3 = "llama3"  # Llama 3.1's band-wise scaling


@dataclass
class RoPEConfig(PosConfig):
    _target_: str = "lm.model.position.RoPE"
    theta: float = 10000.0
    scaling: Optional[RopeScaling] = None  # None = plain RoPE
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3 only
    high_freq_factor: float = 4.0  # llama3 only
    original_max_seq_len: Optional[int] = None  # the trained context; None = model.max_seq_len


@dataclass
class ALiBiConfig(PosConfig):
    _target_: str = "lm.model.position.ALiBi"


@dataclass
class T5BiasConfig(PosConfig):
    _target_: str = "lm.model.position.T5Bias"
    num_buckets: int = 32
    max_distance: int = 128


# -- model/attn: lm/model/scores.py ----------------------------------------------------------------

@dataclass
class AttnConfig(Component):
    """model/attn: the attention scoring function (lm/model/scores.py), built as
    attn(n_heads, n_kv_heads, head_dim, max_seq_len, scale, dropout, causal).

    `check` refuses, before anything is built, the model settings the option cannot honour.
    """

    uses_scale = True  # a class attribute, not a config field: whether model.attn_scale applies

    def check(self, model: "ModelConfig") -> None:
        if not self.uses_scale and (model.attn_scale not in (None, 1.0) or model.attn_scale_by_layer):
            name = type(self).__name__.removesuffix("Config").lower()
            raise ConfigError(
                f"model.attn_scale={model.attn_scale} / model.attn_scale_by_layer={model.attn_scale_by_layer} have no "
                f"effect with model/attn={name} (it does not scale its scores); unset them or use model/attn=scaled_dot")


@dataclass
class ScaledDotConfig(AttnConfig):
    """softmax(q k^T / sqrt(d)) (Vaswani et al. 2017) on SDPA's fused kernels: the default."""

    _target_: str = "lm.model.scores.ScaledDot"


@dataclass
class DotConfig(AttnConfig):
    """softmax(q k^T): no 1/sqrt(d) scaling (Luong et al. 2015, "dot")."""

    _target_: str = "lm.model.scores.Dot"
    uses_scale = False


@dataclass
class MultiplicativeConfig(AttnConfig):
    """softmax(q^T W k) with a learned W per head (Luong et al. 2015, "general")."""

    _target_: str = "lm.model.scores.Multiplicative"
    uses_scale = False


@dataclass
class AdditiveConfig(AttnConfig):
    """softmax(v^T tanh(W1 q + W2 k)) per head (Bahdanau et al. 2014). Memory: (B, H, Tq, Tk, d_attn)."""

    _target_: str = "lm.model.scores.Additive"
    d_attn: Optional[int] = None  # width of the tanh layer; None = head_dim
    query_chunk: int = 0  # >0: score this many queries at a time, recomputed in backward (bounds memory)
    uses_scale = False

    def check(self, model: "ModelConfig") -> None:
        super().check(model)
        if self.d_attn is not None:
            positive("attn.d_attn", self.d_attn)
        if not isinstance(self.query_chunk, int) or self.query_chunk < 0:
            raise ConfigError(f"model.attn.query_chunk={self.query_chunk!r} must be 0 (all queries at once) or positive")


@dataclass
class LinformerConfig(AttnConfig):
    """Keys and values projected along the sequence to k rows (Wang et al. 2020); not causal."""

    _target_: str = "lm.model.scores.Linformer"
    k: Optional[int] = None  # projected length; None = max_seq_len // 4 (the paper's n=1024, k=256)
    shared_kv: bool = False  # one projection for keys and values (the paper's key-value sharing)

    def check(self, model: "ModelConfig") -> None:
        super().check(model)
        if model.arch == Arch.decoder:
            raise ConfigError(
                "model/attn=linformer cannot be used with model.arch=decoder: Linformer projects the keys and values "
                "of all positions into k rows, so every row mixes in future tokens and no causal mask can be applied. "
                "Use it with model.arch=encoder or encoder_decoder (its decoder's causal self-attention keeps "
                "scaled_dot), or pick a causal option: scaled_dot, dot, multiplicative, additive")
        k = linformer_k(self, model.max_seq_len)
        if not isinstance(k, int) or not 1 <= k <= model.max_seq_len:
            raise ConfigError(f"model.attn.k={k!r} must be in [1, model.max_seq_len={model.max_seq_len}] "
                              f"(the projection maps at most max_seq_len positions to k rows)")
        if isinstance(model.pos, (ALiBiConfig, T5BiasConfig)):
            raise ConfigError(
                f"model.pos._target_={model.pos._target_} (alibi, t5_bias) adds a bias per key position, which "
                f"Linformer projects away into k rows; use model/pos=learned, sinusoidal, rope or none with "
                f"model/attn=linformer")


def linformer_k(cfg: LinformerConfig, max_seq_len: int) -> int:
    """The projected length: model.attn.k, or max_seq_len // 4 when unset (derived, never written back)."""
    return cfg.k if cfg.k is not None else max(1, max_seq_len // 4)


# -- Synthesizer and convolutions (issue #20): lm/model/synthesizer.py, lm/model/conv_attn.py ------

class SynthMix(Choice):
    none = "none"  # the synthesized logits alone
    plus = "plus"  # + scaled q k^T
    plus_alpha = "plus_alpha"  # (1 - a) scaled q k^T + a synthesized, a = sigmoid(learned), 0.5 at init


def _check_self_attention_only(cfg: AttnConfig, model: "ModelConfig", needs_qk: bool) -> None:
    """Options that replace what attention computes from positions: refuse settings they cannot honour."""
    name = type(cfg).__name__.removesuffix("Config").lower()
    if model.funnel.blocks:
        raise ConfigError(f"model/attn={name} with model.funnel.blocks: Funnel pools the queries, which moves "
                          f"them off the positions this option's pattern/window is laid out on; use scaled_dot")
    if not needs_qk and (model.qk_norm or isinstance(model.pos, RoPEConfig)):
        raise ConfigError(f"model/attn={name} has no query-key product, so model.qk_norm / model/pos=rope (which act "
                          f"on it) would do nothing: use model.qk_norm=false and model/pos=learned, sinusoidal, "
                          f"alibi, t5_bias or none")


def _check_synthesizer(self: AttnConfig, model: "ModelConfig") -> None:
    """`check` of the three synthesizer options."""
    if self.mix == SynthMix.none and (model.attn_scale is not None or model.attn_scale_by_layer):
        raise ConfigError("model.attn_scale / model.attn_scale_by_layer scale q k^T, which model.attn.mix=none "
                          "does not compute; unset them or use model.attn.mix=plus|plus_alpha")
    if getattr(self, "factorized_k", 1) < 1:
        raise ConfigError(f"model.attn.factorized_k={self.factorized_k!r} must be a positive integer")
    _check_self_attention_only(self, model, needs_qk=self.mix != SynthMix.none)


@dataclass
class SynthesizerDenseConfig(AttnConfig):
    """Dense Synthesizer (Tay et al. 2020): logits relu(q) W, W: (head_dim, max_seq_len)."""

    _target_: str = "lm.model.synthesizer.SynthesizerDense"
    mix: SynthMix = SynthMix.none
    check = _check_synthesizer


@dataclass
class SynthesizerRandomConfig(AttnConfig):
    """Random Synthesizer: a learned (max_seq_len, max_seq_len) logit pattern per head."""

    _target_: str = "lm.model.synthesizer.SynthesizerRandom"
    mix: SynthMix = SynthMix.none
    check = _check_synthesizer


@dataclass
class SynthesizerFactorizedConfig(AttnConfig):
    """Factorized random Synthesizer: the pattern is R1 R2^T of rank factorized_k."""

    _target_: str = "lm.model.synthesizer.SynthesizerFactorized"
    mix: SynthMix = SynthMix.none
    factorized_k: int = 16
    check = _check_synthesizer


def _check_conv(self: AttnConfig, model: "ModelConfig") -> None:
    """`check` of the two convolution options."""
    AttnConfig.check(self, model)  # uses_scale = False: model.attn_scale is refused
    positive("attn.kernel_size", self.kernel_size)
    if not 0.0 <= self.weight_dropout < 1.0:
        raise ConfigError(f"model.attn.weight_dropout={self.weight_dropout!r} must be in [0, 1)")
    name = type(self).__name__.removesuffix("Config").lower()
    if model.n_kv_heads not in (None, model.n_heads):
        raise ConfigError(f"model.n_kv_heads={model.n_kv_heads}: model/attn={name} has no keys or values to share; "
                          f"unset it")
    if isinstance(model.pos, (ALiBiConfig, T5BiasConfig)):
        raise ConfigError(f"model.pos._target_={model.pos._target_} biases attention scores, which model/attn={name} "
                          f"does not compute; use model/pos=learned, sinusoidal or none")
    if model.block == BlockKind.weighted:
        raise ConfigError(f"model.block=weighted branches the heads of dot-product attention; it is not defined "
                          f"for model/attn={name}")
    _check_self_attention_only(self, model, needs_qk=False)


@dataclass
class LightweightConvConfig(AttnConfig):
    """Lightweight convolution (Wu et al. 2019): one softmax-normalised kernel per head in place of
    self-attention; causal in decoders."""

    _target_: str = "lm.model.conv_attn.LightweightConv"
    kernel_size: int = 7  # taps per head (Wu et al. grow it with depth: 3, 7, 15, 31, ...)
    weight_dropout: float = 0.0  # DropConnect on the normalised kernel (the paper uses 0.1)
    glu: bool = True  # the GLU input projection d -> 2d -> d; false: a plain d -> d projection
    uses_scale = False
    check = _check_conv


@dataclass
class DynamicConvConfig(AttnConfig):
    """Dynamic convolution (Wu et al. 2019): each position's kernel is predicted from its input."""

    _target_: str = "lm.model.conv_attn.DynamicConv"
    kernel_size: int = 7
    weight_dropout: float = 0.0
    glu: bool = True
    uses_scale = False
    check = _check_conv


# -- typed nodes of ModelConfig (issue #20): product-key memory, Funnel ----------------------------

@dataclass
class PKMConfig:
    """model.pkm: product-key memory (Lample et al. 2019) in place of the FFN of the blocks in `layers`
    (lm/model/pkm.py). The memory has n_keys**2 values; each head scores two sets of n_keys sub-keys
    with the two halves of its query and reads the top_k best of their products."""

    layers: List[int] = field(default_factory=list)  # 0-based block indices (in each stack); [] = no memory
    n_keys: int = 64  # sub-keys per half
    heads: int = 4
    k_dim: int = 64  # query size per head (each half is k_dim / 2)
    top_k: int = 8
    query_batchnorm: bool = False  # BatchNorm on the queries (the paper's choice for better key usage)


@dataclass
class FunnelConfig:
    """model.funnel: Funnel Transformer encoder (Dai et al. 2020; lm/model/funnel.py). Blocks are grouped
    by `blocks`; between groups the sequence is mean-pooled by 2 with query pooling. Token-level outputs
    (MLM, an encoder-decoder's memory) are up-sampled to full length and refined by decoder_layers blocks;
    classification reads only the pooled path."""

    blocks: List[int] = field(default_factory=list)  # encoder blocks per group, summing to model.n_layers; [] = off
    decoder_layers: int = 2  # full-length blocks after up-sampling


# -- recurrent baselines (model=lstm|gru|rnn): lm/model/rnn.py -------------------------------------

class Cell(Choice):
    """The recurrent layer: torch.nn.LSTM, torch.nn.GRU or torch.nn.RNN."""

    lstm = "lstm"  # Hochreiter & Schmidhuber 1997
    gru = "gru"  # Cho et al. 2014
    rnn = "rnn"  # Elman 1990: h_t = act(W x_t + U h_{t-1} + b)


class Nonlinearity(Choice):
    tanh = "tanh"
    relu = "relu"


@dataclass
class RNNConfig:
    """model.rnn: the recurrent stack of an arch=rnn model (model.n_layers layers of this cell).

    Embeddings are model.dim wide; the recurrent state is `hidden` wide, projected back to model.dim
    before the (tied) output layer when the two differ.
    """

    cell: Cell = Cell.lstm
    hidden: Optional[int] = None  # None = model.dim
    bidirectional: bool = False  # reads the future: for classification (lm finetune) only, never for clm
    nonlinearity: Nonlinearity = Nonlinearity.tanh  # cell=rnn only (torch.nn.RNN's nonlinearity)

    def width(self, dim: int) -> int:
        return self.hidden or dim


# -- ELECTRA pretraining (model.electra, arch=encoder only): lm/model/electra.py --------------------

@dataclass
class ElectraConfig:
    """model.electra: pretrain the encoder as ELECTRA's discriminator (Clark et al. 2020): a small masked-LM
    generator, reading the same token embeddings, fills the masked positions with samples; the encoder
    learns to tell replaced tokens from original ones. Finetuning keeps the discriminator only.

    The defaults are ELECTRA-Small's generator (a quarter of the discriminator's 256 width, one head of 64,
    as deep as the discriminator) and its loss weight lambda = 50.
    """

    generator_dim: int = 64
    generator_heads: int = 1
    generator_ffn_dim: Optional[int] = None  # None = model/ffn's hidden_mult x generator_dim (4x for an MLP)
    generator_layers: Optional[int] = None  # None = model.n_layers
    disc_weight: float = 50.0  # lambda: loss = generator MLM loss + lambda * discriminator BCE
    temperature: float = 1.0  # replacements are sampled from softmax(generator logits / temperature)

    def generator_config(self, model: "ModelConfig") -> "ModelConfig":
        """The generator's stack: the model's options at the generator's width, heads and depth. No Funnel
        pooling, product-key memory or factorized table: ELECTRA's generator is a small BERT, and it reads
        the discriminator's embeddings through its own projection (lm/model/electra.py)."""
        hidden = self.generator_ffn_dim  # None: derived from the generator's width by the FFN option
        ffn = model.ffn
        ffn = (replace(ffn, expert=replace(ffn.expert, hidden_dim=hidden)) if isinstance(ffn, MoEConfig)
               else replace(ffn, hidden_dim=hidden))
        return replace(model, dim=self.generator_dim, n_heads=self.generator_heads, n_kv_heads=None, head_dim=None,
                       n_layers=self.generator_layers or model.n_layers, ffn=ffn, pkm=PKMConfig(),
                       funnel=FunnelConfig(), factorized_embedding=0, electra=None)


# -- the slots -------------------------------------------------------------------------------------

SLOTS: Dict[str, Type[Component]] = {"norm": NormConfig, "ffn": FFNConfig, "pos": PosConfig, "attn": AttnConfig}


def options(slot: str) -> List[Type[Component]]:
    """Every option schema of a slot: the subclasses of its base, so a new option is just a new class."""
    found, todo = [], list(SLOTS[slot].__subclasses__())
    while todo:
        cls = todo.pop(0)
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found
