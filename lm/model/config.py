"""The model's config schema: ModelConfig, its Hydra registration, presets and saved configs.

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

from dataclasses import dataclass, field

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
class ModelConfig:
    """Hyperparameters of one model. The parent (this config) supplies shapes to components.

    `norm`, `ffn`, `pos` and `attn` are typed component nodes (`_target_` + own hyperparameters), chosen
    by the config groups model/norm, model/ffn, model/pos and model/attn.
    """

    arch: Arch = Arch.decoder
    vocab_size: int = 256
    dim: int = 64
    n_layers: int = 2
    n_decoder_layers: int | None = None  # encoder_decoder only; defaults to n_layers
    n_heads: int = 4
    n_kv_heads: int | None = None  # None = n_heads (MHA); 1 = MQA; in between = GQA
    head_dim: int | None = None  # None = dim // n_heads
    max_seq_len: int = 128
    norm_position: NormPosition = NormPosition.pre
    norm_eps: float = 1e-5
    bias: bool = True  # biases in attention and feed-forward projections
    ffn_bias: bool | None = None  # biases in the feed-forward projections; None = same as bias (HF Llama mlp_bias)
    qk_norm: bool = False  # normalise q and k per head before the dot product (Dehghani et al. 2023)
    attn_scale: float | None = None  # None = 1/sqrt(head_dim); T5 uses 1.0
    attn_scale_by_layer: bool = False  # also divide layer i's scores by i+1 (HF GPT-2 scale_attn_by_inverse_layer_idx)
    dropout: float = 0.0
    attn_dropout: float = 0.0
    # true/false or one of TieEmbeddings (Narang et al. 2021's rows); see ModelConfig.tying for what bools mean
    tie_embeddings: bool | str = True
    scale_embeddings: bool = False  # multiply token embeddings by sqrt(dim) (Vaswani et al. 2017)
    embed_norm: bool = False  # norm after the embeddings (BERT)
    final_norm: bool = True  # norm after the last block (pre-norm stacks need it)
    n_segments: int = 0  # segment (token type) embeddings, BERT uses 2
    mlm_transform: bool = False  # BERT's dense+act+norm before the MLM output layer
    mlm_activation: Activation = Activation.gelu  # the activation of that transform (HF BERT uses hidden_act for it)
    # Masked LM: the head (transform + vocabulary projection) runs on the masked positions only, ~15% of them (sparse
    # prediction, Geiping & Goldstein 2022): the same loss, a fraction of the head's cost. Not under torch.compile.
    sparse_prediction: bool = True
    logit_scale: float = 1.0  # T5 scales tied outputs by dim**-0.5
    pad_token_id: int = 0
    decoder_start_token_id: int = 0  # encoder_decoder: first decoder input (T5 uses pad)
    init: Init = Init.gpt2
    init_std: float = 0.02
    loss_chunk_size: int = 0  # >0: chunked output projection + cross-entropy (tokens per chunk)
    activation_checkpointing: bool = False
    linear: LinearKind = LinearKind.auto  # fp32 CPU eager matmuls on oneDNN where it is there (lm/model/linear.py)
    # Fused CUDA kernels per op (lm/model/kernels.py): torch (off) by default, each one switch
    kernels: KernelsConfig = field(default_factory=KernelsConfig)
    norm: NormConfig = field(default_factory=LayerNormConfig)
    ffn: FFNConfig = field(default_factory=MLPConfig)
    pos: PosConfig = field(default_factory=LearnedConfig)
    attn: AttnConfig = field(default_factory=ScaledDotConfig)
    # The slots the core leaves empty: zoo options (lm/zoo), chosen by model/block and model/stack.
    block: BlockConfig | None = None  # None: the vanilla self-attention, [cross-attention,] FFN block
    stack: StackConfig | None = None  # None: lm/model/stack.py's Stack of n_layers distinct blocks
    memory: MemoryConfig | None = None  # None: an encoder-decoder's decoder reads the encoder's last state
    embedding: EmbeddingConfig | None = None  # model/embedding (lm/zoo); None: one (V, D) table
    output: OutputConfig | None = None  # model/output (the zoo's adaptive softmax, MoS); None: the softmax LM head
    # model/family (lm/zoo): the model built in place of model.arch's; None: the arch's class
    family: FamilyConfig | None = None

    @property
    def tying(self) -> TieEmbeddings:
        """tie_embeddings resolved: true = all (every table there is shares one matrix); false = the output has
        its own matrix, and an encoder-decoder's two stacks still share their input table (so that saved
        configs of tie_embeddings=false keep the weights' layout they trained with)."""
        if self.tie_embeddings is True:
            return TieEmbeddings.all
        if self.tie_embeddings is False:
            two_stacks = self.arch == Arch.encoder_decoder
            return TieEmbeddings.encoder_decoder_inputs if two_stacks else TieEmbeddings.none
        return TieEmbeddings(self.tie_embeddings)

    @property
    def output_tied(self) -> bool:
        """The output projection is the (decoder's) input embedding matrix."""
        return self.tying in (TieEmbeddings.all, TieEmbeddings.decoder_input_output)

    @property
    def shared_inputs(self) -> bool:
        """An encoder-decoder's encoder reads the decoder's input embedding table."""
        return self.tying in (TieEmbeddings.all, TieEmbeddings.encoder_decoder_inputs)

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def d_head(self) -> int:
        return self.head_dim or self.dim // self.n_heads

    @property
    def decoder_layers(self) -> int:
        return self.n_decoder_layers or self.n_layers

    @property
    def mlm_corruption(self) -> tuple[float, float]:
        """Of an mlm batch's predicted positions, the fractions given [MASK] and a random token: the family's
        (ELECTRA's 85/0), else BERT's 80/10 (FamilyConfig.mlm_corruption)."""
        return (self.family or FamilyConfig()).mlm_corruption


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
