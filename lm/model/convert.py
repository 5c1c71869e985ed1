"""State-dict adapters to and from Hugging Face layouts: GPT-2, Llama, BERT and T5.

`from_hf(hf_model)` returns (our model, its ModelConfig) with the same weights; `to_hf(model)`
returns the matching `transformers` model. Each family is a config mapping plus a table of
rules `(our key, their keys, how)`: "copy", "t" (transpose, for GPT-2's Conv1D), or "cat"
(our fused q|k|v, k|v or gate|up rows are their separate projections stacked). transformers is imported
lazily: it is a test reference and an export target, not a dependency of the model.

Exact or refused: every config field that can change the forward pass is either mapped here or
refused by name (lm/model/hf_fields.py lists them per family), every tensor of theirs must be used,
and tying of the output layer is read from the tensors (same storage), not from a config flag
(transformers 5's T5Config always says tied).
"""

from collections.abc import Callable

import torch

from lm.extras import require
from lm.model.config import (
    GLUConfig,
    LayerNormConfig,
    LearnedConfig,
    MLPConfig,
    ModelConfig,
    RMSNormConfig,
    RoPEConfig,
    ScaledDotConfig,
    T5BiasConfig,
)
from lm.model.hf_fields import check_fields
from lm.model.options import option_name

Rule = tuple[str, list[str], str]


def _norm(kind: str, **kw):
    return {"layernorm": LayerNormConfig, "rmsnorm": RMSNormConfig}[kind](**kw)


def _ffn(glu: bool, activation: str, hidden_dim: int):
    return (GLUConfig if glu else MLPConfig)(activation=activation, hidden_dim=hidden_dim)


def _pos(kind: str, **kw):
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


def _act(name: str, field: str) -> str:
    if name not in HF_ACTIVATIONS:
        raise ValueError(
            f"Hugging Face {field}={name!r} has no exact equivalent here; supported: {sorted(HF_ACTIVATIONS)}"
        )
    return HF_ACTIVATIONS[name]


def _hf_act(cfg: ModelConfig) -> str:
    name = str(cfg.ffn.activation)
    if name not in TO_HF_ACTIVATIONS:
        raise ValueError(f"activation {name!r} has no Hugging Face name; exportable: {sorted(TO_HF_ACTIVATIONS)}")
    return TO_HF_ACTIVATIONS[name]


def _ffn_bias(cfg: ModelConfig) -> bool:
    return cfg.bias if cfg.ffn_bias is None else cfg.ffn_bias


def _require(ok: bool, family: str, what: str) -> None:
    if not ok:
        raise ValueError(f"{family} export cannot represent {what}; export safetensors instead (lm export --no-hf)")


# ---------------------------------------------------------------- GPT-2


def _gpt2_config(hf, tied: bool) -> ModelConfig:
    return ModelConfig(
        arch="decoder",
        vocab_size=hf.vocab_size,
        dim=hf.n_embd,
        n_layers=hf.n_layer,
        n_heads=hf.n_head,
        max_seq_len=hf.n_positions,
        norm_eps=hf.layer_norm_epsilon,
        bias=True,
        tie_embeddings=tied,
        attn_scale=None if hf.scale_attn_weights else 1.0,
        attn_scale_by_layer=bool(hf.scale_attn_by_inverse_layer_idx),
        norm=_norm("layernorm"),
        ffn=_ffn(False, _act(hf.activation_function, "activation_function"), hf.n_inner or 4 * hf.n_embd),
        pos=_pos("learned"),
    )


def _gpt2_to_hf_config(cfg: ModelConfig):
    from transformers import GPT2Config

    _require(cfg.bias and _ffn_bias(cfg), "GPT-2", "projections without biases (model.bias / model.ffn_bias false)")
    _require(cfg.attn_scale in (None, 1.0), "GPT-2", f"model.attn_scale={cfg.attn_scale} (only null or 1.0)")
    return GPT2Config(
        vocab_size=cfg.vocab_size,
        n_embd=cfg.dim,
        n_layer=cfg.n_layers,
        n_head=cfg.n_heads,
        n_positions=cfg.max_seq_len,
        layer_norm_epsilon=cfg.norm_eps,
        activation_function=_hf_act(cfg),
        n_inner=_hidden(cfg),
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        scale_attn_weights=cfg.attn_scale is None,
        scale_attn_by_inverse_layer_idx=cfg.attn_scale_by_layer,
        tie_word_embeddings=cfg.output_tied,
        bos_token_id=None,
        eos_token_id=None,
    )  # set from the tokenizer by lm export (hf_export.py)


def _gpt2_rules(cfg: ModelConfig) -> list[Rule]:
    rules = [
        ("embed.tok.weight", ["transformer.wte.weight"], "copy"),
        ("decoder.pos.table.weight", ["transformer.wpe.weight"], "copy"),
        ("decoder.final_norm.weight", ["transformer.ln_f.weight"], "copy"),
        ("decoder.final_norm.bias", ["transformer.ln_f.bias"], "copy"),
    ]
    if not cfg.output_tied:
        rules.append(("head.proj.weight", ["lm_head.weight"], "copy"))
    for i in range(cfg.n_layers):
        o, t = f"decoder.blocks.{i}.", f"transformer.h.{i}."
        pairs = [
            ("self_attn.qkv", "attn.c_attn"),
            ("self_attn.out", "attn.c_proj"),
            ("ffn.up", "mlp.c_fc"),
            ("ffn.down", "mlp.c_proj"),
        ]
        for ours, theirs in pairs:
            rules += [
                (o + ours + ".weight", [t + theirs + ".weight"], "t"),
                (o + ours + ".bias", [t + theirs + ".bias"], "copy"),
            ]
        for ours, theirs in [("norm_self", "ln_1"), ("norm_ffn", "ln_2")]:
            rules += [(o + ours + p, [t + theirs + p], "copy") for p in (".weight", ".bias")]
    return rules


# ---------------------------------------------------------------- Llama


def _rope_parameters(hf) -> dict:
    params = dict(getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {})
    params.setdefault("rope_theta", getattr(hf, "rope_theta", 10000.0))
    params.setdefault("rope_type", params.pop("type", "default"))  # transformers < 4.45 spelled it "type"
    return params


def _rope_pos(hf) -> dict:
    """Our RoPE node for their rope_parameters; rope types we do not compute exactly are refused."""
    p = _rope_parameters(hf)
    kind, theta = p["rope_type"], float(p["rope_theta"])
    extra = {k: v for k, v in p.items() if k in ("partial_rotary_factor", "attention_factor") and v not in (None, 1.0)}
    if kind not in ("default", "linear", "dynamic", "llama3") or extra:
        raise ValueError(
            f"Hugging Face rope_parameters={p} is not converted (supported rope_type: default, linear, "
            f"dynamic, llama3, without partial_rotary_factor / attention_factor)"
        )
    if kind == "default":
        return _pos("rope", theta=theta)
    if kind == "llama3":
        return _pos(
            "rope",
            theta=theta,
            scaling="llama3",
            factor=float(p["factor"]),
            low_freq_factor=float(p["low_freq_factor"]),
            high_freq_factor=float(p["high_freq_factor"]),
            original_max_seq_len=int(p["original_max_position_embeddings"]),
        )
    # dynamic NTK counts from max_position_embeddings in transformers, whatever the dict says
    orig = hf.max_position_embeddings if kind == "dynamic" else None
    return _pos("rope", theta=theta, scaling=kind, factor=float(p["factor"]), original_max_seq_len=orig)


def _llama_config(hf, tied: bool) -> ModelConfig:
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    return ModelConfig(
        arch="decoder",
        vocab_size=hf.vocab_size,
        dim=hf.hidden_size,
        n_layers=hf.num_hidden_layers,
        n_heads=hf.num_attention_heads,
        n_kv_heads=hf.num_key_value_heads,
        head_dim=head_dim,
        max_seq_len=hf.max_position_embeddings,
        norm_eps=hf.rms_norm_eps,
        bias=bool(hf.attention_bias),
        ffn_bias=bool(getattr(hf, "mlp_bias", False)),
        tie_embeddings=tied,
        init="normal",
        norm=_norm("rmsnorm"),
        ffn=_ffn(True, _act(hf.hidden_act, "hidden_act"), hf.intermediate_size),
        pos=_rope_pos(hf),
    )


def _llama_rope_parameters(cfg: ModelConfig) -> dict:
    p = cfg.pos  # a RoPEConfig (lm/model/options.py)
    scaling = str(p.scaling) if p.scaling else None
    params = {"rope_type": scaling or "default", "rope_theta": float(p.theta)}
    if scaling:
        params["factor"] = float(p.factor)
    if scaling == "llama3":
        params.update(
            low_freq_factor=float(p.low_freq_factor),
            high_freq_factor=float(p.high_freq_factor),
            original_max_position_embeddings=int(p.original_max_seq_len or cfg.max_seq_len),
        )
    if scaling == "dynamic":
        _require(
            p.original_max_seq_len in (None, cfg.max_seq_len),
            "Llama",
            "dynamic RoPE with original_max_seq_len != max_seq_len (transformers counts from max_position_embeddings)",
        )
    return params


def _llama_to_hf_config(cfg: ModelConfig):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.dim,
        intermediate_size=_hidden(cfg),
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.d_head,
        max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=cfg.norm_eps,
        hidden_act=_hf_act(cfg),
        attention_bias=cfg.bias,
        mlp_bias=_ffn_bias(cfg),
        tie_word_embeddings=cfg.output_tied,
        rope_parameters=_llama_rope_parameters(cfg),
    )


def _llama_rules(cfg: ModelConfig) -> list[Rule]:
    rules = [
        ("embed.tok.weight", ["model.embed_tokens.weight"], "copy"),
        ("decoder.final_norm.weight", ["model.norm.weight"], "copy"),
    ]
    if not cfg.output_tied:
        rules.append(("head.proj.weight", ["lm_head.weight"], "copy"))
    for i in range(cfg.n_layers):
        o, t = f"decoder.blocks.{i}.", f"model.layers.{i}."
        attn = t + "self_attn."
        rules += [
            (o + "norm_self.weight", [t + "input_layernorm.weight"], "copy"),
            (o + "norm_ffn.weight", [t + "post_attention_layernorm.weight"], "copy"),
        ]
        params = (".weight", ".bias") if cfg.bias else (".weight",)
        rules += [(o + "self_attn.qkv" + p, [attn + n + "_proj" + p for n in "qkv"], "cat") for p in params]
        rules += [(o + "self_attn.out" + p, [attn + "o_proj" + p], "copy") for p in params]
        for p in (".weight", ".bias") if _ffn_bias(cfg) else (".weight",):
            rules += [
                (o + "ffn.gate_up" + p, [t + "mlp.gate_proj" + p, t + "mlp.up_proj" + p], "cat"),
                (o + "ffn.down" + p, [t + "mlp.down_proj" + p], "copy"),
            ]
    return rules


# ---------------------------------------------------------------- BERT


def _bert_config(hf, tied: bool) -> ModelConfig:
    kind = getattr(hf, "position_embedding_type", "absolute")
    if kind != "absolute":
        raise ValueError(f"Hugging Face BERT position_embedding_type={kind!r} is not converted (only 'absolute')")
    if not tied:
        raise ValueError("a BERT whose MLM decoder is not tied to the word embeddings is not converted")
    act = _act(hf.hidden_act, "hidden_act")
    return ModelConfig(
        arch="encoder",
        vocab_size=hf.vocab_size,
        dim=hf.hidden_size,
        n_layers=hf.num_hidden_layers,
        n_heads=hf.num_attention_heads,
        max_seq_len=hf.max_position_embeddings,
        norm_position="post",
        norm_eps=hf.layer_norm_eps,
        bias=True,
        embed_norm=True,
        final_norm=False,
        n_segments=hf.type_vocab_size,
        mlm_transform=True,
        mlm_activation=act,
        tie_embeddings=True,
        init="normal",
        pad_token_id=hf.pad_token_id or 0,
        norm=_norm("layernorm"),
        ffn=_ffn(False, act, hf.intermediate_size),
        pos=_pos("learned"),
    )


def _bert_to_hf_config(cfg: ModelConfig):
    from transformers import BertConfig

    # One hidden_act drives both the FFN and the MLM-head transform in transformers.
    _require(
        cfg.mlm_activation == cfg.ffn.activation,
        "BERT",
        f"model.mlm_activation={str(cfg.mlm_activation)!r} != model.ffn.activation={str(cfg.ffn.activation)!r}",
    )
    _require(
        cfg.bias and _ffn_bias(cfg) and cfg.mlm_transform and cfg.output_tied and cfg.embed_norm,
        "BERT",
        "this layout (needs bias, mlm_transform, tie_embeddings and embed_norm true)",
    )
    return BertConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.dim,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        intermediate_size=_hidden(cfg),
        max_position_embeddings=cfg.max_seq_len,
        type_vocab_size=cfg.n_segments,
        layer_norm_eps=cfg.norm_eps,
        hidden_act=_hf_act(cfg),
        pad_token_id=cfg.pad_token_id,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )


def _bert_rules(cfg: ModelConfig) -> list[Rule]:
    e = "bert.embeddings."
    rules = [
        ("embed.tok.weight", [e + "word_embeddings.weight"], "copy"),
        ("embed.seg.weight", [e + "token_type_embeddings.weight"], "copy"),
        ("encoder.pos.table.weight", [e + "position_embeddings.weight"], "copy"),
        ("encoder.embed_norm.weight", [e + "LayerNorm.weight"], "copy"),
        ("encoder.embed_norm.bias", [e + "LayerNorm.bias"], "copy"),
        ("head.transform.0.weight", ["cls.predictions.transform.dense.weight"], "copy"),
        ("head.transform.0.bias", ["cls.predictions.transform.dense.bias"], "copy"),
        ("head.transform.2.weight", ["cls.predictions.transform.LayerNorm.weight"], "copy"),
        ("head.transform.2.bias", ["cls.predictions.transform.LayerNorm.bias"], "copy"),
        ("head.proj.bias", ["cls.predictions.bias"], "copy"),
    ]
    for i in range(cfg.n_layers):
        o, t = f"encoder.blocks.{i}.", f"bert.encoder.layer.{i}."
        s = t + "attention.self."
        for p in (".weight", ".bias"):
            rules += [
                (o + "self_attn.qkv" + p, [s + n + p for n in ("query", "key", "value")], "cat"),
                (o + "self_attn.out" + p, [t + "attention.output.dense" + p], "copy"),
                (o + "norm_self" + p, [t + "attention.output.LayerNorm" + p], "copy"),
                (o + "ffn.up" + p, [t + "intermediate.dense" + p], "copy"),
                (o + "ffn.down" + p, [t + "output.dense" + p], "copy"),
                (o + "norm_ffn" + p, [t + "output.LayerNorm" + p], "copy"),
            ]
    return rules


# ---------------------------------------------------------------- T5


def _t5_config(hf, tied: bool) -> ModelConfig:
    act = _act(hf.dense_act_fn, "feed_forward_proj")  # "gated-gelu" is gelu_new (tanh), plain "gelu" is exact
    # transformers < 5 scaled decoder outputs by d_model^-1/2 exactly when tied; 5 has a flag for it.
    scaled = bool(getattr(hf, "scale_decoder_outputs", hf.tie_word_embeddings))
    return ModelConfig(
        arch="encoder_decoder",
        vocab_size=hf.vocab_size,
        dim=hf.d_model,
        n_layers=hf.num_layers,
        n_decoder_layers=hf.num_decoder_layers,
        n_heads=hf.num_heads,
        head_dim=hf.d_kv,
        max_seq_len=512,
        norm_eps=hf.layer_norm_epsilon,
        bias=False,
        attn_scale=1.0,
        tie_embeddings=tied,
        logit_scale=hf.d_model**-0.5 if scaled else 1.0,
        pad_token_id=hf.pad_token_id,
        decoder_start_token_id=hf.decoder_start_token_id,
        init="t5",
        norm=_norm("rmsnorm"),
        ffn=_ffn(bool(hf.is_gated_act), act, hf.d_ff),
        pos=_pos(
            "t5_bias", num_buckets=hf.relative_attention_num_buckets, max_distance=hf.relative_attention_max_distance
        ),
    )


def _t5_feed_forward_proj(cfg: ModelConfig) -> str:
    act = _hf_act(cfg)
    if not isinstance(cfg.ffn, GLUConfig):
        return act
    # T5Config rewrites "gated-gelu" to the tanh GELU; exact GELU gated needs another name for it
    return {"gelu_new": "gated-gelu", "gelu": "gated-gelu_python"}.get(act, "gated-" + act)


def _t5_to_hf_config(cfg: ModelConfig):
    from transformers import T5Config

    scaled = abs(cfg.logit_scale - cfg.dim**-0.5) < 1e-9
    _require(scaled or cfg.logit_scale == 1.0, "T5", f"model.logit_scale={cfg.logit_scale} (only 1.0 or dim^-1/2)")
    _require(
        cfg.attn_scale == 1.0 and not cfg.bias and not _ffn_bias(cfg),
        "T5",
        "attention scaling or biases (T5 needs attn_scale 1.0, bias and ffn_bias false)",
    )
    extra = {"scale_decoder_outputs": scaled} if "scale_decoder_outputs" in T5Config().to_dict() else {}
    if not extra and scaled != cfg.output_tied:
        raise ValueError("this transformers version scales T5 outputs exactly when embeddings are tied")
    hf = T5Config(
        **extra,
        vocab_size=cfg.vocab_size,
        d_model=cfg.dim,
        d_kv=cfg.d_head,
        d_ff=_hidden(cfg),
        num_layers=cfg.n_layers,
        num_decoder_layers=cfg.decoder_layers,
        num_heads=cfg.n_heads,
        relative_attention_num_buckets=cfg.pos.num_buckets,
        relative_attention_max_distance=cfg.pos.max_distance,
        layer_norm_epsilon=cfg.norm_eps,
        feed_forward_proj=_t5_feed_forward_proj(cfg),
        tie_word_embeddings=cfg.output_tied,
        dropout_rate=0.0,
        pad_token_id=cfg.pad_token_id,
        decoder_start_token_id=cfg.decoder_start_token_id,
    )
    if extra and hf.scale_decoder_outputs != scaled:
        raise RuntimeError(
            f"T5Config did not keep scale_decoder_outputs={scaled}; this transformers version is not supported"
        )
    return hf


def _t5_ffn_rules(cfg: ModelConfig, o: str, t: str) -> list[Rule]:
    d = t + "DenseReluDense."
    if isinstance(cfg.ffn, GLUConfig):
        up = (o + "ffn.gate_up.weight", [d + "wi_0.weight", d + "wi_1.weight"], "cat")
    else:
        up = (o + "ffn.up.weight", [d + "wi.weight"], "copy")
    return [up, (o + "ffn.down.weight", [d + "wo.weight"], "copy")]


def _t5_rules(cfg: ModelConfig) -> list[Rule]:
    rules = [
        ("embed.tok.weight", ["shared.weight"], "copy"),
        ("encoder.pos.table.weight", ["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"], "copy"),
        ("decoder.pos.table.weight", ["decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"], "copy"),
        ("encoder.final_norm.weight", ["encoder.final_layer_norm.weight"], "copy"),
        ("decoder.final_norm.weight", ["decoder.final_layer_norm.weight"], "copy"),
    ]
    if not cfg.output_tied:
        rules.append(("head.proj.weight", ["lm_head.weight"], "copy"))
    for stack, n in (("encoder", cfg.n_layers), ("decoder", cfg.decoder_layers)):
        for i in range(n):
            o, t = f"{stack}.blocks.{i}.", f"{stack}.block.{i}.layer."
            a = t + "0.SelfAttention."
            rules += [
                (o + "self_attn.qkv.weight", [a + p + ".weight" for p in "qkv"], "cat"),
                (o + "self_attn.out.weight", [a + "o.weight"], "copy"),
                (o + "norm_self.weight", [t + "0.layer_norm.weight"], "copy"),
            ]
            ff = t + ("2." if stack == "decoder" else "1.")
            rules += _t5_ffn_rules(cfg, o, ff) + [(o + "norm_ffn.weight", [ff + "layer_norm.weight"], "copy")]
            if stack == "decoder":
                c = t + "1.EncDecAttention."
                rules += [
                    (o + "cross_attn.q.weight", [c + "q.weight"], "copy"),
                    (o + "cross_attn.kv.weight", [c + "k.weight", c + "v.weight"], "cat"),
                    (o + "cross_attn.out.weight", [c + "o.weight"], "copy"),
                    (o + "norm_cross.weight", [t + "1.layer_norm.weight"], "copy"),
                ]
    return rules


# ---------------------------------------------------------------- shared machinery


def _hidden(cfg: ModelConfig) -> int:
    from lm.model.ffn import hidden_size

    f = cfg.ffn
    return hidden_size(cfg.dim, f.hidden_mult, f.multiple_of, f.hidden_dim)


FAMILIES: dict[str, tuple[Callable, Callable, Callable, str]] = {
    # model_type: (their config, tied -> ours; ours -> their config; rules; their model class)
    "gpt2": (_gpt2_config, _gpt2_to_hf_config, _gpt2_rules, "GPT2LMHeadModel"),
    "llama": (_llama_config, _llama_to_hf_config, _llama_rules, "LlamaForCausalLM"),
    "bert": (_bert_config, _bert_to_hf_config, _bert_rules, "BertForMaskedLM"),
    "t5": (_t5_config, _t5_to_hf_config, _t5_rules, "T5ForConditionalGeneration"),
}


def _family_of(cfg: ModelConfig) -> str:
    """Which Hugging Face family a config's architecture matches, or a clear error."""
    if cfg.electra is not None:
        raise ValueError(
            "no Hugging Face family matches an ELECTRA pretraining model (model.electra: generator + "
            "discriminator); finetune its discriminator with lm finetune init=<run> (it loads as a plain "
            "encoder), and use model.safetensors of this export for the pretraining model itself"
        )
    if cfg.arch == "rnn":
        raise ValueError(
            f"no Hugging Face family matches a recurrent model (model.arch=rnn, model.rnn.cell="
            f"{cfg.rnn.cell.value}); exportable: gpt2, llama, bert, t5 layouts (export safetensors instead)"
        )
    norm, pos = cfg.norm._target_.rsplit(".", 1)[1], cfg.pos._target_.rsplit(".", 1)[1]
    glu = isinstance(cfg.ffn, GLUConfig)
    if cfg.arch == "decoder" and norm == "LayerNorm" and pos == "Learned" and not glu and cfg.norm_position == "pre":
        return "gpt2"
    if cfg.arch == "decoder" and norm == "RMSNorm" and pos == "RoPE" and glu and cfg.norm_position == "pre":
        return "llama"
    if cfg.arch == "encoder" and norm == "LayerNorm" and pos == "Learned" and cfg.norm_position == "post":
        return "bert"
    if cfg.arch == "encoder_decoder" and norm == "RMSNorm" and pos == "T5Bias" and cfg.norm_position == "pre":
        return "t5"
    raise ValueError(
        f"no Hugging Face family matches arch={cfg.arch}, norm={norm}, pos={pos}, glu={glu}, "
        f"norm_position={cfg.norm_position}; exportable: gpt2, llama, bert, t5 layouts (export safetensors instead)"
    )


def _check_common(cfg: ModelConfig, family: str) -> None:
    """Options of ours that no target family has (or only one has): refused rather than dropped."""
    bert = family == "bert"
    checks = [
        (not cfg.qk_norm, "model.qk_norm=true"),
        (not cfg.scale_embeddings, "model.scale_embeddings=true"),
        (not cfg.attn_scale_by_layer or family == "gpt2", "model.attn_scale_by_layer=true"),
        (cfg.attn_scale is None or family in ("gpt2", "t5"), f"model.attn_scale={cfg.attn_scale}"),
        (cfg.ffn_bias in (None, cfg.bias) or family == "llama", f"model.ffn_bias={cfg.ffn_bias} != model.bias"),
        (cfg.logit_scale == 1.0 or family == "t5", f"model.logit_scale={cfg.logit_scale}"),
        (
            cfg.embed_norm == bert
            and cfg.final_norm != bert
            and (cfg.n_segments > 0) == bert
            and cfg.mlm_transform == bert,
            "embed_norm/final_norm/n_segments/mlm_transform of another family",
        ),
        (
            not getattr(cfg.pos, "scaling", None) or family == "llama",
            f"model.pos.scaling={getattr(cfg.pos, 'scaling', None)}",
        ),
        (cfg.kv_heads == cfg.n_heads or family == "llama", f"model.n_kv_heads={cfg.n_kv_heads} (grouped-query)"),
        (cfg.d_head * cfg.n_heads == cfg.dim or family in ("llama", "t5"), f"model.head_dim={cfg.head_dim}"),
        (getattr(cfg.norm, "bias", True), "model.norm.bias=false"),
        (
            type(cfg.attn) is ScaledDotConfig,
            f"the attention scores of model.attn._target_={cfg.attn._target_} (every family has scaled_dot only)",
        ),
        (not hasattr(cfg.ffn, "expert"), f"model/ffn={cfg.ffn._target_.rsplit('.', 1)[1].lower()} (experts)"),
        (cfg.block is None, f"model/block={cfg.block and option_name(cfg.block)} (a zoo block)"),
        (cfg.stack is None, f"model/stack={cfg.stack and option_name(cfg.stack)} (a zoo stack)"),
        (cfg.embedding is None, f"model/embedding={cfg.embedding and option_name(cfg.embedding)} (a zoo table)"),
        (cfg.output is None, f"model/output={cfg.output and option_name(cfg.output)} (a zoo output layer)"),
        (cfg.memory is None, f"model/memory={cfg.memory and option_name(cfg.memory)} (a zoo memory)"),
        # Narang et al. 2021's options: no Hugging Face family of these has them.
        (not cfg.factorized_embedding, f"model.factorized_embedding={cfg.factorized_embedding}"),
        (
            cfg.arch != "encoder_decoder" or cfg.shared_inputs,
            f"model.tie_embeddings={cfg.tie_embeddings} (own encoder input table)",
        ),
    ]
    for ok, what in checks:
        _require(ok, family, what)


def _output_tied(hf_model) -> bool:
    """Whether their output layer is the input embedding: the same storage, whatever the config says."""
    out, inp = hf_model.get_output_embeddings(), hf_model.get_input_embeddings()
    return out.weight.data_ptr() == inp.weight.data_ptr()


def from_hf(hf_model):
    """(our model, ModelConfig) with the weights of a Hugging Face GPT-2, Llama, BERT or T5 model.

    Raises ValueError naming the field when their config asks for maths this converter does not do.
    """
    from lm.model import build_model

    family = hf_model.config.model_type
    if family not in FAMILIES:
        raise ValueError(f"unsupported Hugging Face model_type {family!r}; supported: {sorted(FAMILIES)}")
    check_fields(family, hf_model.config)
    to_ours, _, rules, _ = FAMILIES[family]
    cfg = to_ours(hf_model.config, _output_tied(hf_model))
    model = build_model(cfg)
    theirs = hf_model.state_dict()
    table = rules(cfg)
    _check_all_used(theirs, [n for _, names, _ in table for n in names], family)
    ours = {key: _gather(theirs, names, how) for key, names, how in table}
    _load_strict(model, ours)
    return model, cfg


def _check_all_used(theirs: dict, used: list[str], family: str) -> None:
    """Every tensor of theirs is converted (or is the same storage as one that is): no weight is dropped."""
    ptrs = {theirs[n].data_ptr() for n in used}
    unused = sorted(k for k, t in theirs.items() if k not in used and t.data_ptr() not in ptrs)
    if unused:
        raise ValueError(
            f"Hugging Face {family} tensors {unused[:6]}{'...' if len(unused) > 6 else ''} have no place "
            f"in our model (a config option this converter does not know?); not converting"
        )


def to_hf(model):
    """The `transformers` model of the same family with our weights (tied where ours are tied)."""
    transformers = require("hf", "converting to a Hugging Face model (lm export's hf/ directory)")

    family = _family_of(model.cfg)
    _check_common(model.cfg, family)
    _, to_theirs, rules, cls_name = FAMILIES[family]
    hf_model = getattr(transformers, cls_name)(to_theirs(model.cfg))
    ours = model.state_dict()
    theirs = {}
    for key, names, how in rules(model.cfg):
        theirs.update(_scatter(ours[key], names, how, hf_model.state_dict()))
    if not model.cfg.output_tied:
        # Their class may tie regardless of the config (T5 in transformers 5): give the head its own tensor.
        head = hf_model.get_output_embeddings()
        head.weight = torch.nn.Parameter(theirs.pop("lm_head.weight"))
    missing, unexpected = hf_model.load_state_dict(theirs, strict=False)
    tied = {
        "lm_head.weight",
        "cls.predictions.decoder.weight",
        "cls.predictions.decoder.bias",
        "encoder.embed_tokens.weight",
        "decoder.embed_tokens.weight",
    }
    if unexpected or set(missing) - tied:
        raise RuntimeError(
            f"export to {cls_name} left keys unmatched: missing={sorted(set(missing) - tied)}, unexpected={unexpected}"
        )
    if model.cfg.output_tied:
        hf_model.tie_weights()
    if _output_tied(hf_model) != model.cfg.output_tied:
        raise RuntimeError(
            f"export to {cls_name}: output layer tied={_output_tied(hf_model)}, ours {model.cfg.output_tied}"
        )
    return hf_model


def _gather(theirs: dict, names: list[str], how: str) -> torch.Tensor:
    tensors = [theirs[n] for n in names]
    if how == "t":
        return tensors[0].t().contiguous()
    return torch.cat(tensors, dim=0) if how == "cat" else tensors[0].clone()


def _scatter(tensor: torch.Tensor, names: list[str], how: str, their_state: dict) -> dict:
    if how == "t":
        return {names[0]: tensor.t().contiguous()}
    if how == "cat":
        sizes = [their_state[n].shape[0] for n in names]
        return dict(zip(names, (t.clone() for t in tensor.split(sizes, dim=0))))
    return {names[0]: tensor.clone()}


def _load_strict(model, ours: dict) -> None:
    own = model.state_dict()
    tied_head = "head.proj.weight" if model.cfg.output_tied else None
    missing = sorted(k for k in own if k not in ours and k != tied_head)
    if missing:
        raise RuntimeError(f"conversion left our keys unfilled: {missing}")
    model.load_state_dict(ours, strict=False)
