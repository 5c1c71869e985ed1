"""The slots' base schemas and the core's option schemas: one dataclass per option file of
conf/model/<slot>/ (model/norm, model/ffn, model/pos, model/attn; model/block, model/stack, model/memory,
model/embedding, model/output and model/family have zoo options only: lm/zoo), and the node model.kernels.

Each option holds its `_target_` and its own hyperparameters; the model (lm/model/config.py's
ModelConfig) supplies the shapes. A new option is one subclass of its slot's base, registered with
`@register("<slot>")` (lm/model/registry.py; here for the core, in lm/zoo for a paper variant), and one
YAML file listing `<name>_schema` first in its defaults.
An attention option's `check` refuses the model settings it cannot honour; the checks that span
several options live in lm/model/validate.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from lm.config_base import Choice, ConfigError
from lm.constants import BERT_MLM_CORRUPTION
from lm.model.choices import Activation
from lm.model.registry import options, register, slot, target_option  # noqa: F401 (options: re-exported)

if TYPE_CHECKING:  # type hints only: lm/model/config.py imports this module for its field defaults
    from lm.model.config import ModelConfig


def positive(name: str, value: int) -> None:
    if not isinstance(value, int) or value < 1:
        raise ConfigError(f"model.{name}={value!r} must be a positive integer")


# -- model/norm ------------------------------------------------------------------------------------


@dataclass
class Component:
    """A `_partial_` node: Hydra instantiates it into a factory; the model supplies the shapes.
    `check(model)` refuses, before anything is built, the model settings the option cannot honour."""

    _target_: str = ""
    _partial_: bool = True

    def check(self, model: ModelConfig) -> None:
        pass

    def unread(self, model: ModelConfig) -> str | None:
        """The line refusing a value, of this option's fields or the model's, that the model built with this option
        never reads; None when there is none. Asked at entry only (lm/model/validate.py's refuse_unread), never of
        a saved config."""
        return None

    def after_init(self, model) -> None:
        """Called by lm/model/init.py after the init scheme's pass over the built model: an option whose weights
        start by a rule of its own (Fixup's rescaling) applies it here."""


@slot("norm")
@dataclass
class NormConfig(Component):
    """model/norm: built as norm(dim, eps=model.norm_eps). `residual()`: the residual function the option
    brings (lm/model/block.py's Residual; the zoo's ReZero and Fixup); None = model.norm_position's."""

    def residual(self):
        return None

    def has_norm(self) -> bool:
        """Whether the option builds a norm (model.norm_eps is its epsilon); False: it builds the identity (the
        zoo's ReZero without a norm, Fixup)."""
        return True


@register("norm")
@dataclass
class LayerNormConfig(NormConfig):
    _target_: str = "lm.model.norms.LayerNorm"
    bias: bool = True


RMSNormConfig = target_option("norm", "RMSNormConfig", "lm.model.norms.RMSNorm")


# -- model/ffn -------------------------------------------------------------------------------------


@slot("ffn")
@dataclass
class FFNConfig(Component):
    """model/ffn: built as ffn(dim, bias, dropout); hidden = hidden_mult*dim rounded up to multiple_of,
    or hidden_dim when set."""

    activation: Activation = Activation.gelu
    hidden_mult: float = 4.0
    multiple_of: int = 1
    hidden_dim: int | None = None


# conf/model/ffn/<file>.yaml of an MLP / GLU node, by its activation (several files share each schema), for messages
_MLP_FILES = {Activation.silu: "swish"}  # the others are named after their activation (relu, gelu, elu, ...)
_GLU_FILES = {
    Activation.silu: "swiglu",
    Activation.gelu: "geglu",
    Activation.relu: "reglu",
    Activation.sigmoid: "glu",
    Activation.linear: "liglu",
}

MLPConfig = target_option(
    "ffn",
    "MLPConfig",
    "lm.model.ffn.MLP",
    option_file=property(lambda self: _MLP_FILES.get(Activation(self.activation), Activation(self.activation).value)),
)


@register("ffn")
@dataclass
class GLUConfig(FFNConfig):
    _target_: str = "lm.model.ffn.GLU"
    activation: Activation = Activation.silu
    hidden_mult: float = 8 / 3  # parameter-matched to an MLP of 4*dim (Shazeer 2020)

    @property
    def option_file(self) -> str:
        return _GLU_FILES.get(Activation(self.activation), "glu")


# -- model/ffn=moe|switch (issue #20): lm/model/moe.py ---------------------------------------------


@register("ffn")
@dataclass
class MoEConfig(FFNConfig):
    """model/ffn=moe: a router sends each token to its top_k of n_experts expert FFNs (Shazeer et al.
    2017; GShard, Lepikhin et al. 2021); lm/model/moe.py. Each expert is itself a model/ffn option node
    (`expert`, chosen with model/ffn@model.ffn.expert=<option>), so the dense-FFN fields inherited from
    FFNConfig belong there: here they must keep FFNConfig's defaults (validate_model refuses others)."""

    _target_: str = "lm.model.moe.MoE"
    expert: FFNConfig | None = None  # filled by the option file's defaults (gelu)
    n_experts: int = 8
    top_k: int = 2
    # training: each expert takes ceil(capacity_factor * top_k * n / n_experts) of a sequence's n real tokens;
    # evaluation drops nothing (lm/model/moe.py)
    capacity_factor: float = 1.25
    aux_loss_weight: float = 0.01  # load-balancing loss weight (Fedus et al. 2021 use 0.01)
    z_loss_weight: float = 0.0  # router z-loss weight (Zoph et al. 2022 use 0.001); 0 = off
    router_jitter: float = 0.0  # multiplicative input noise U(1-eps, 1+eps) while training (Switch); 0 = off


@register("ffn")
@dataclass
class SwitchConfig(MoEConfig):
    """model/ffn=switch: top-1 routing (Switch Transformer, Fedus et al. 2021)."""

    _target_: str = "lm.model.moe.Switch"
    top_k: int = 1
    capacity_factor: float = 1.0


# -- model/pos -------------------------------------------------------------------------------------


@slot("pos")
@dataclass
class PosConfig(Component):
    """model/pos: built as pos(dim, n_heads, head_dim, max_seq_len, causal)."""


LearnedConfig = target_option("pos", "LearnedConfig", "lm.model.position.Learned")
NoPositionConfig = target_option("pos", "NoPositionConfig", "lm.model.position.NoPosition", option_file="none")


@register("pos")
@dataclass
class SinusoidalConfig(PosConfig):
    _target_: str = "lm.model.position.Sinusoidal"
    base: float = 10000.0


class RopeScaling(Choice):
    """RoPE frequency scaling for contexts past the trained length (docs/convert.md; Hugging Face rope_type)."""

    linear = "linear"  # position interpolation (Chen et al. 2023)
    dynamic = "dynamic"  # NTK-aware theta growth past original_max_seq_len
    llama3 = "llama3"  # Llama 3.1's band-wise scaling


@register("pos")
@dataclass
class RoPEConfig(PosConfig):
    _target_: str = "lm.model.position.RoPE"
    theta: float = 10000.0
    scaling: RopeScaling | None = None  # None = plain RoPE
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3 only
    high_freq_factor: float = 4.0  # llama3 only
    original_max_seq_len: int | None = None  # the trained context; None = model.max_seq_len

    @property
    def option_file(self) -> str:
        """rope, or rope_<scaling> (conf/model/pos/rope_linear.yaml, ...)."""
        return "rope" if self.scaling is None else f"rope_{RopeScaling(self.scaling).value}"

    def check(self, model: ModelConfig) -> None:
        # RoPE rotates channel pairs: an odd head_dim failed in the first forward with a shape error, and dynamic
        # scaling's theta exponent head_dim / (head_dim - 2) divides by zero at head_dim 2
        d, dynamic = model.d_head, self.scaling == RopeScaling.dynamic
        if d % 2 or (dynamic and d <= 2):
            raise ConfigError(
                f"model/pos={self.option_file} needs an even head dimension{' above 2' if dynamic else ''}, not "
                f"{d} (model.head_dim, else model.dim / model.n_heads)"
            )


ALiBiConfig = target_option("pos", "ALiBiConfig", "lm.model.position.ALiBi")


@register("pos")
@dataclass
class T5BiasConfig(PosConfig):
    _target_: str = "lm.model.position.T5Bias"
    option_file: ClassVar[str] = "t5_bias"
    num_buckets: int = 32
    max_distance: int = 128

    def check(self, model: ModelConfig) -> None:
        # A direction's first e buckets are exact distances 0..e-1, the rest log-spaced from e to max_distance
        # (log(max_distance / e) divides): e <= 0 or max_distance <= e gave negative or non-monotonic buckets.
        # e = num_buckets // 2 in a causal stack, num_buckets // 4 in a bidirectional one (split by direction first).
        causal, bidirectional = model.arch != "encoder", model.arch != "decoder"
        for split in [2] * causal + [4] * bidirectional:
            exact = self.num_buckets // split
            if exact < 1 or self.max_distance <= exact:
                raise ConfigError(
                    f"model.pos.num_buckets={self.num_buckets} with model.pos.max_distance={self.max_distance}: "
                    f"a {'causal' if split == 2 else 'bidirectional'} stack's exact buckets are the distances "
                    f"below num_buckets // {split} = {exact}; num_buckets must be at least {split} and max_distance "
                    f"above {exact}"
                )


# -- model/attn: lm/model/scores.py ----------------------------------------------------------------


@slot("attn")
@dataclass
class AttnConfig(Component):
    """model/attn: the attention scoring function (lm/model/scores.py), built as
    attn(n_heads, n_kv_heads, head_dim, max_seq_len, scale, dropout, causal).

    Its interface (class attributes, not config fields, and one method):
    - `uses_scale`: whether model.attn_scale applies;
    - `uses_dropout`: whether model.attn_dropout applies (it drops attention probabilities, which a convolution
      does not compute);
    - `self_only`: the option is about the positions of one sequence (a synthesized pattern, a convolution
      window): cross-attention keeps scaled_dot, and stacks that move queries off their positions refuse it;
    - `check(model)`: refuses, before anything is built, the model settings the option cannot honour.
    The score it builds (lm/model/scores.py's Score) may bring its own sub-layer (`Score.sublayer`).
    """

    uses_scale: ClassVar[bool] = True
    uses_dropout: ClassVar[bool] = True
    self_only: ClassVar[bool] = False

    def uses_qk(self) -> bool:
        """Whether the scores read q k^T, the product model.qk_norm and model/pos=rope act on."""
        return True

    def check(self, model: ModelConfig) -> None:
        name = option_name(self)
        if not self.uses_scale and (model.attn_scale not in (None, 1.0) or model.attn_scale_by_layer):
            raise ConfigError(
                f"model.attn_scale={model.attn_scale} / model.attn_scale_by_layer={model.attn_scale_by_layer} have no "
                f"effect with model/attn={name} (it does not scale its scores); unset them or use model/attn=scaled_dot"
            )
        if not self.uses_qk() and (model.qk_norm or isinstance(model.pos, RoPEConfig)):
            raise ConfigError(
                f"model/attn={name} has no query-key product, so model.qk_norm / model/pos=rope (which "
                f"act on it) would do nothing: use model.qk_norm=false and model/pos=learned, sinusoidal, "
                f"alibi, t5_bias or none"
            )


ScaledDotConfig = target_option(
    "attn",
    "ScaledDotConfig",
    "lm.model.scores.ScaledDot",
    "softmax(q k^T / sqrt(d)) (Vaswani et al. 2017) on SDPA's fused kernels: the default.",
    option_file="scaled_dot",
)


def option_name(cfg: Component) -> str:
    """How a user picks it: LinformerConfig -> linformer (the option file's name, for messages); a class whose
    file name is not its lowered name says it (`option_file`: AdaptiveSoftmaxConfig -> adaptive_softmax; an
    attribute of the node, so one schema with several option files can say which of them it is)."""
    return getattr(cfg, "option_file", None) or type(cfg).__name__.removesuffix("Config").lower()


# -- the slots the core leaves empty (None): extension points for the zoo (lm/zoo) -----------------


@slot("block")
@dataclass
class BlockConfig(Component):
    """model/block: a block other than the vanilla self-attention, [cross-attention,] FFN sequence, built as
    block(parts) -> Block from lm/model/stack.py's BlockParts (the zoo: evolved, weighted, pkm)."""

    def refuse_query_pooling(self, model) -> None:
        """A block whose own cells replace the vanilla self-attention cannot run under a stack that pools the
        queries inside that self-attention (Funnel)."""
        if model.stack is not None and model.stack.pools_queries:
            raise ConfigError(
                f"model/block={option_name(self)} with model/stack={option_name(model.stack)}: Funnel "
                f"pools the queries inside the vanilla block's self-attention, which the paper does "
                f"not define for these cells; use one or the other"
            )


@slot("stack")
@dataclass
class StackConfig(Component):
    """model/stack: a Stack subclass in place of lm/model/stack.py's Stack, built as
    stack(cfg, c, n_layers, causal, cross) (the zoo: funnel, shared). `depth(n_layers)` is how many layers
    a stack of n_layers applies (lm/model/init.py scales residual projections by it); `layer_indices(n_layers)`
    how many layer indices its blocks take at most (a model/block option's `layers` must lie below it);
    `pools_queries`: its blocks attend from pooled queries (options laid out on positions refuse it)."""

    pools_queries: ClassVar[bool] = False

    def depth(self, n_layers: int) -> int:
        return n_layers

    def layer_indices(self, n_layers: int) -> int:
        """Blocks 0 .. layer_indices - 1 are built (make_block's `layer`) by the largest of its stacks."""
        return n_layers


@slot("memory")
@dataclass
class MemoryConfig(Component):
    """model/memory: what an encoder-decoder's decoder layers read from the encoder in place of its last state,
    built as memory(n_encoder_layers, n_decoder_layers): a module that maps the encoder's states (the
    embeddings and each layer's output) and its final norm to one memory per decoder layer (the zoo:
    transparent)."""


@slot("embedding")
@dataclass
class EmbeddingConfig(Component):
    """model/embedding: the token table in place of nn.Embedding(vocab_size, dim), built as embedding(cfg) -> a
    module mapping ids (B, T) to (B, T, dim) (the zoo: adaptive input). Such a table is no (vocab_size, dim)
    matrix: the output cannot reuse it unless its model/output option says it reads no table (`tieable`)."""


@slot("output")
@dataclass
class OutputConfig(Component):
    """model/output: the output layer in place of the softmax LM head, built as output(cfg, tied, bias, transform)
    -> a module with forward(h) -> (..., V) logits or log-probabilities and output(h, labels) -> LMOutput (the zoo:
    adaptive softmax, mixture of softmaxes). `tieable`: it can reuse the input token table (`tied`); the
    chunked loss (model.loss_chunk_size) is the plain softmax's, never an option's."""

    tieable: ClassVar[bool] = True

    def check(self, model: ModelConfig) -> None:
        if model.loss_chunk_size:
            raise ConfigError(
                f"model/output={option_name(self)} with model.loss_chunk_size={model.loss_chunk_size}: "
                f"the chunked loss is for a plain softmax only; set model.loss_chunk_size=0"
            )
        if model.output_tied and not self.tieable:
            raise ConfigError(
                f"model/output={option_name(self)} with model.tie_embeddings={model.tie_embeddings}: it "
                f"owns its output weights, so tying is not supported here; set model.tie_embeddings=false"
            )


@slot("family")
@dataclass
class FamilyConfig(Component):
    """model/family: a model in place of model.arch's (DecoderLM, EncoderLM, EncoderDecoderLM), built by
    `build(model, components)` (components(cfg): the factories of a config's slots, lm/model/build.py); its
    `_target_` names the model class, whose module a saved config imports (the zoo's options). Its hooks:
    - `transformer`: the model is built from the Transformer slots, which validate_model checks before the
      option's `check`; False: it reads none of them (they stay null) and its `check` validates the whole model.
    - `finetuned(model)`: the config of the backbone a classifier is built from (lm finetune; a model that
      pretrains a plain one returns that one's config); by default the model itself.
    - `check_objective(model, objective)`: refuses a pretraining objective the model cannot learn honestly.
    - `nll_loss`: its loss is a mean negative log-likelihood per token, so exp(loss) is a perplexity; False for a
      loss of another kind (ELECTRA's generator MLM loss + lambda x discriminator BCE).
    - `mlm_corruption`: of the positions an mlm batch predicts, the fractions given [MASK] and a random token (the
      rest keep theirs): BERT's 80/10/10, which lm.data's MaskedLM applies (ModelConfig.mlm_corruption)."""

    transformer: ClassVar[bool] = True
    nll_loss: ClassVar[bool] = True
    mlm_corruption: ClassVar[tuple[float, float]] = BERT_MLM_CORRUPTION

    def build(self, model: ModelConfig, components):
        raise NotImplementedError

    def finetuned(self, model: ModelConfig) -> ModelConfig:
        return model

    def check_objective(self, model: ModelConfig, objective: str) -> None:
        pass


# -- model.kernels: fused kernels from well-kept libraries (lm/model/kernels.py; the `kernels` extra) --------


class CrossEntropyKernel(Choice):
    torch = "torch"  # the output layer's logits, then F.cross_entropy (or model.loss_chunk_size's chunked loss)
    liger = "liger"  # Liger-Kernel's fused linear cross-entropy: the (B*T, V) logits are never materialised
    cce = "cce"  # Cut Cross-Entropy (Wijmans et al. 2024): the same, logits tiled in on-chip memory


class NormKernel(Choice):
    torch = "torch"
    liger = "liger"  # Liger-Kernel's Triton LayerNorm / RMSNorm (model/norm=layernorm|rmsnorm)


class GLUKernel(Choice):
    torch = "torch"
    liger = "liger"  # Liger-Kernel's SwiGLU (silu) / GeGLU (gelu_tanh) elementwise product (model/ffn=swiglu|glu)


@dataclass
class KernelsConfig:
    """model.kernels: one switch per fused op, each `torch` (PyTorch's eager ops) by default. They change how a
    step computes, not what: the weights and their names are the same, so a checkpoint trained with any of them
    loads with all of them off (lm.model.config.model_from_saved drops this node). The kernels run on CUDA only
    and come from the `kernels` extra; lm/model/kernels.py refuses them elsewhere, in one line."""

    cross_entropy: CrossEntropyKernel = CrossEntropyKernel.torch
    norm: NormKernel = NormKernel.torch
    glu: GLUKernel = GLUKernel.torch

    def chosen(self) -> dict:
        """{field: kernel} of the switches that are on."""
        return {
            name: getattr(self, name).value
            for name in ("cross_entropy", "norm", "glu")
            if getattr(self, name) != "torch"
        }


# -- the slots -------------------------------------------------------------------------------------

SLOTS = ("norm", "ffn", "pos", "attn")  # the component slots every Transformer fills (validate_model)
