"""What the Hugging Face family mappings share (lm/model/hf_families.py, lm/model/hf_encoders.py): the rule type,
our config nodes by kind, activation names both ways, and the refusal of what a family cannot represent.
transformers is not imported here."""

from lm.model.config import (
    GLUConfig,
    LayerNormConfig,
    LearnedConfig,
    MLPConfig,
    ModelConfig,
    RMSNormConfig,
    RoPEConfig,
    T5BiasConfig,
)

Rule = tuple[str, list[str], str]


def norm_config(kind: str, **kw):
    return {"layernorm": LayerNormConfig, "rmsnorm": RMSNormConfig}[kind](**kw)


def ffn_config(glu: bool, activation: str, hidden_dim: int):
    return (GLUConfig if glu else MLPConfig)(activation=activation, hidden_dim=hidden_dim)


def pos_config(kind: str, **kw):
    return {"learned": LearnedConfig, "rope": RoPEConfig, "t5_bias": T5BiasConfig}[kind](**kw)


# Their activation names -> ours (ACTIVATIONS in lm/model/ffn.py), and ours -> their canonical name.
HF_ACTIVATIONS = {
    "relu": "relu",
    "gelu": "gelu",
    "gelu_python": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "silu": "silu",
    "swish": "silu",
}
TO_HF_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new", "silu": "silu"}


def our_activation(name: str, field: str) -> str:
    if name not in HF_ACTIVATIONS:
        raise ValueError(
            f"Hugging Face {field}={name!r} has no exact equivalent here; supported: {sorted(HF_ACTIVATIONS)}"
        )
    return HF_ACTIVATIONS[name]


def hf_activation(cfg: ModelConfig) -> str:
    name = str(cfg.ffn.activation)
    if name not in TO_HF_ACTIVATIONS:
        raise ValueError(f"activation {name!r} has no Hugging Face name; exportable: {sorted(TO_HF_ACTIVATIONS)}")
    return TO_HF_ACTIVATIONS[name]


def ffn_bias(cfg: ModelConfig) -> bool:
    return cfg.bias if cfg.ffn_bias is None else cfg.ffn_bias


def needs(ok: bool, family: str, what: str) -> None:
    """Refuse an export the family cannot represent exactly (`what`: the option, named as the user set it)."""
    if not ok:
        raise ValueError(f"{family} export cannot represent {what}; export safetensors instead (lm export --no-hf)")


def hidden_dim(cfg: ModelConfig) -> int:
    from lm.model.ffn import hidden_size

    f = cfg.ffn
    return hidden_size(cfg.dim, f.hidden_mult, f.multiple_of, f.hidden_dim)
