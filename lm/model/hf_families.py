"""The Hugging Face families lm/model/convert.py converts: GPT-2, Llama, BERT, ESM and T5, each a config mapping
(theirs -> ours, ours -> theirs) and a table of rules `(our key, their keys, how)` ("copy", "t": transpose, for
GPT-2's Conv1D, "cat": our fused q|k|v, k|v or gate|up rows are their separate projections stacked).

The encoder families (BERT, ESM) are in lm/model/hf_encoders.py, what all share in hf_common.py.
FAMILIES is the one table convert.py reads; the refusals of what no family has and the weight copying stay there.
transformers is imported inside the functions that build their configs: it is an export target, not a dependency.
"""

from collections.abc import Callable

from lm.model.config import GLUConfig, ModelConfig
from lm.model.hf_common import (
    Rule,
    ffn_bias,
    ffn_config,
    hf_activation,
    hidden_dim,
    needs,
    norm_config,
    our_activation,
    pos_config,
)
from lm.model.hf_encoders import bert_config, bert_rules, bert_to_hf_config, esm_config, esm_rules, esm_to_hf_config

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
        norm=norm_config("layernorm"),
        ffn=ffn_config(
            False, our_activation(hf.activation_function, "activation_function"), hf.n_inner or 4 * hf.n_embd
        ),
        pos=pos_config("learned"),
    )


def _gpt2_to_hf_config(cfg: ModelConfig):
    from transformers import GPT2Config

    needs(cfg.bias and ffn_bias(cfg), "GPT-2", "projections without biases (model.bias / model.ffn_bias false)")
    needs(cfg.attn_scale in (None, 1.0), "GPT-2", f"model.attn_scale={cfg.attn_scale} (only null or 1.0)")
    return GPT2Config(
        vocab_size=cfg.vocab_size,
        n_embd=cfg.dim,
        n_layer=cfg.n_layers,
        n_head=cfg.n_heads,
        n_positions=cfg.max_seq_len,
        layer_norm_epsilon=cfg.norm_eps,
        activation_function=hf_activation(cfg),
        n_inner=hidden_dim(cfg),
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
        return pos_config("rope", theta=theta)
    if kind == "llama3":
        return pos_config(
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
    return pos_config("rope", theta=theta, scaling=kind, factor=float(p["factor"]), original_max_seq_len=orig)


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
        norm=norm_config("rmsnorm"),
        ffn=ffn_config(True, our_activation(hf.hidden_act, "hidden_act"), hf.intermediate_size),
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
        needs(
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
        intermediate_size=hidden_dim(cfg),
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.d_head,
        max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=cfg.norm_eps,
        hidden_act=hf_activation(cfg),
        attention_bias=cfg.bias,
        mlp_bias=ffn_bias(cfg),
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
        for p in (".weight", ".bias") if ffn_bias(cfg) else (".weight",):
            rules += [
                (o + "ffn.gate_up" + p, [t + "mlp.gate_proj" + p, t + "mlp.up_proj" + p], "cat"),
                (o + "ffn.down" + p, [t + "mlp.down_proj" + p], "copy"),
            ]
    return rules


# ---------------------------------------------------------------- T5


def _t5_config(hf, tied: bool) -> ModelConfig:
    act = our_activation(hf.dense_act_fn, "feed_forward_proj")  # "gated-gelu" is gelu_new (tanh), plain "gelu" is exact
    # transformers < 5 scaled decoder outputs by d_model^-1/2 exactly when tied; 5 has a flag for it.
    scaled = bool(getattr(hf, "scale_decoder_outputs", hf.tie_word_embeddings))
    if getattr(hf, "decoder_start_token_id", None) is None:  # transformers 5's T5Config() leaves it unset
        raise ValueError(
            "T5 config has no decoder_start_token_id, which the decoder's first input is; set it (T5's checkpoints "
            f"use the pad id, {hf.pad_token_id}: config.decoder_start_token_id = config.pad_token_id)"
        )
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
        norm=norm_config("rmsnorm"),
        ffn=ffn_config(bool(hf.is_gated_act), act, hf.d_ff),
        pos=pos_config(
            "t5_bias", num_buckets=hf.relative_attention_num_buckets, max_distance=hf.relative_attention_max_distance
        ),
    )


def _t5_feed_forward_proj(cfg: ModelConfig) -> str:
    act = hf_activation(cfg)
    if not isinstance(cfg.ffn, GLUConfig):
        return act
    # T5Config rewrites "gated-gelu" to the tanh GELU; exact GELU gated needs another name for it
    return {"gelu_new": "gated-gelu", "gelu": "gated-gelu_python"}.get(act, "gated-" + act)


def _t5_to_hf_config(cfg: ModelConfig):
    from transformers import T5Config

    scaled = abs(cfg.logit_scale - cfg.dim**-0.5) < 1e-9
    needs(scaled or cfg.logit_scale == 1.0, "T5", f"model.logit_scale={cfg.logit_scale} (only 1.0 or dim^-1/2)")
    needs(
        cfg.attn_scale == 1.0 and not cfg.bias and not ffn_bias(cfg),
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
        d_ff=hidden_dim(cfg),
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


FAMILIES: dict[str, tuple[Callable, Callable, Callable, str]] = {
    # model_type: (their config, tied -> ours; ours -> their config; rules; their model class)
    "gpt2": (_gpt2_config, _gpt2_to_hf_config, _gpt2_rules, "GPT2LMHeadModel"),
    "llama": (_llama_config, _llama_to_hf_config, _llama_rules, "LlamaForCausalLM"),
    "bert": (bert_config, bert_to_hf_config, bert_rules, "BertForMaskedLM"),
    "esm": (esm_config, esm_to_hf_config, esm_rules, "EsmForMaskedLM"),
    "t5": (_t5_config, _t5_to_hf_config, _t5_rules, "T5ForConditionalGeneration"),
}
