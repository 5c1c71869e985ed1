"""State-dict adapters to and from Hugging Face layouts: GPT-2, Llama, BERT and T5.

`from_hf(hf_model)` returns (our model, its ModelConfig) with the same weights; `to_hf(model)`
returns the matching `transformers` model. Each family is a config mapping plus a table of
rules `(our key, their keys, how)`: "copy", "t" (transpose, for GPT-2's Conv1D), or "cat"
(our fused q|k|v, k|v or gate|up rows are their separate projections stacked). transformers is imported
lazily: it is a test reference and an export target, not a dependency of the model.
"""

from typing import Callable, Dict, List, Tuple

import torch

from lm.config import ModelConfig, component
from lm.extras import require

Rule = Tuple[str, List[str], str]


def _norm(kind: str, **kw) -> dict:
    return component({"layernorm": "lm.model.norms.LayerNorm", "rmsnorm": "lm.model.norms.RMSNorm"}[kind], **kw)


def _ffn(glu: bool, activation: str, hidden_dim: int) -> dict:
    return component("lm.model.ffn.GLU" if glu else "lm.model.ffn.MLP", activation=activation, hidden_dim=hidden_dim)


def _pos(kind: str, **kw) -> dict:
    targets = {"learned": "Learned", "rope": "RoPE", "t5_bias": "T5Bias"}
    return component(f"lm.model.position.{targets[kind]}", **kw)


# ---------------------------------------------------------------- GPT-2

def _gpt2_config(hf) -> ModelConfig:
    act = {"gelu_new": "gelu_tanh", "gelu": "gelu", "relu": "relu"}[hf.activation_function]
    return ModelConfig(
        arch="decoder", vocab_size=hf.vocab_size, dim=hf.n_embd, n_layers=hf.n_layer, n_heads=hf.n_head,
        max_seq_len=hf.n_positions, norm_eps=hf.layer_norm_epsilon, bias=True, tie_embeddings=True,
        norm=_norm("layernorm"), ffn=_ffn(False, act, hf.n_inner or 4 * hf.n_embd), pos=_pos("learned"),
    )


def _gpt2_to_hf_config(cfg: ModelConfig):
    from transformers import GPT2Config

    act = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}[cfg.ffn["activation"]]
    return GPT2Config(vocab_size=cfg.vocab_size, n_embd=cfg.dim, n_layer=cfg.n_layers, n_head=cfg.n_heads,
                      n_positions=cfg.max_seq_len, layer_norm_epsilon=cfg.norm_eps, activation_function=act,
                      n_inner=_hidden(cfg), resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                      bos_token_id=None, eos_token_id=None)  # set from the tokenizer by lm-export


def _gpt2_rules(cfg: ModelConfig) -> List[Rule]:
    rules = [("embed.tok.weight", ["transformer.wte.weight"], "copy"),
             ("decoder.pos.table.weight", ["transformer.wpe.weight"], "copy"),
             ("decoder.final_norm.weight", ["transformer.ln_f.weight"], "copy"),
             ("decoder.final_norm.bias", ["transformer.ln_f.bias"], "copy")]
    for i in range(cfg.n_layers):
        o, t = f"decoder.blocks.{i}.", f"transformer.h.{i}."
        pairs = [("self_attn.qkv", "attn.c_attn"), ("self_attn.out", "attn.c_proj"),
                 ("ffn.up", "mlp.c_fc"), ("ffn.down", "mlp.c_proj")]
        for ours, theirs in pairs:
            rules += [(o + ours + ".weight", [t + theirs + ".weight"], "t"), (o + ours + ".bias", [t + theirs + ".bias"], "copy")]
        for ours, theirs in [("norm_self", "ln_1"), ("norm_ffn", "ln_2")]:
            rules += [(o + ours + p, [t + theirs + p], "copy") for p in (".weight", ".bias")]
    return rules


# ---------------------------------------------------------------- Llama

def _rope_theta(hf) -> float:
    params = getattr(hf, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(hf, "rope_theta", 10000.0)))


def _llama_config(hf) -> ModelConfig:
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    return ModelConfig(
        arch="decoder", vocab_size=hf.vocab_size, dim=hf.hidden_size, n_layers=hf.num_hidden_layers,
        n_heads=hf.num_attention_heads, n_kv_heads=hf.num_key_value_heads, head_dim=head_dim,
        max_seq_len=hf.max_position_embeddings, norm_eps=hf.rms_norm_eps, bias=bool(hf.attention_bias),
        tie_embeddings=bool(hf.tie_word_embeddings), init="normal",
        norm=_norm("rmsnorm"), ffn=_ffn(True, "silu", hf.intermediate_size), pos=_pos("rope", theta=_rope_theta(hf)),
    )


def _llama_to_hf_config(cfg: ModelConfig):
    from transformers import LlamaConfig

    hf = LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.dim, intermediate_size=_hidden(cfg),
                     num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.kv_heads,
                     head_dim=cfg.d_head, max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm_eps,
                     attention_bias=cfg.bias, tie_word_embeddings=cfg.tie_embeddings)
    theta = cfg.pos.get("theta", 10000.0)
    if getattr(hf, "rope_parameters", None) is not None:
        hf.rope_parameters["rope_theta"] = theta
    else:
        hf.rope_theta = theta
    return hf


def _llama_rules(cfg: ModelConfig) -> List[Rule]:
    rules = [("embed.tok.weight", ["model.embed_tokens.weight"], "copy"),
             ("decoder.final_norm.weight", ["model.norm.weight"], "copy")]
    if not cfg.tie_embeddings:
        rules.append(("head.proj.weight", ["lm_head.weight"], "copy"))
    for i in range(cfg.n_layers):
        o, t = f"decoder.blocks.{i}.", f"model.layers.{i}."
        attn = t + "self_attn."
        rules += [(o + "self_attn.qkv.weight", [attn + p + "_proj.weight" for p in "qkv"], "cat"),
                  (o + "self_attn.out.weight", [attn + "o_proj.weight"], "copy"),
                  (o + "norm_self.weight", [t + "input_layernorm.weight"], "copy"),
                  (o + "norm_ffn.weight", [t + "post_attention_layernorm.weight"], "copy")]
        if cfg.bias:
            rules.append((o + "self_attn.qkv.bias", [attn + p + "_proj.bias" for p in "qkv"], "cat"))
        rules += [(o + "ffn.gate_up.weight", [t + "mlp.gate_proj.weight", t + "mlp.up_proj.weight"], "cat"),
                  (o + "ffn.down.weight", [t + "mlp.down_proj.weight"], "copy")]
    return rules


# ---------------------------------------------------------------- BERT

def _bert_config(hf) -> ModelConfig:
    return ModelConfig(
        arch="encoder", vocab_size=hf.vocab_size, dim=hf.hidden_size, n_layers=hf.num_hidden_layers,
        n_heads=hf.num_attention_heads, max_seq_len=hf.max_position_embeddings, norm_position="post",
        norm_eps=hf.layer_norm_eps, bias=True, embed_norm=True, final_norm=False, n_segments=hf.type_vocab_size,
        mlm_transform=True, tie_embeddings=True, init="normal", pad_token_id=hf.pad_token_id or 0,
        norm=_norm("layernorm"), ffn=_ffn(False, hf.hidden_act, hf.intermediate_size), pos=_pos("learned"),
    )


def _bert_to_hf_config(cfg: ModelConfig):
    from transformers import BertConfig

    return BertConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.dim, num_hidden_layers=cfg.n_layers,
                      num_attention_heads=cfg.n_heads, intermediate_size=_hidden(cfg),
                      max_position_embeddings=cfg.max_seq_len, type_vocab_size=cfg.n_segments,
                      layer_norm_eps=cfg.norm_eps, hidden_act=cfg.ffn["activation"], pad_token_id=cfg.pad_token_id,
                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _bert_rules(cfg: ModelConfig) -> List[Rule]:
    e = "bert.embeddings."
    rules = [("embed.tok.weight", [e + "word_embeddings.weight"], "copy"),
             ("embed.seg.weight", [e + "token_type_embeddings.weight"], "copy"),
             ("encoder.pos.table.weight", [e + "position_embeddings.weight"], "copy"),
             ("encoder.embed_norm.weight", [e + "LayerNorm.weight"], "copy"),
             ("encoder.embed_norm.bias", [e + "LayerNorm.bias"], "copy"),
             ("head.transform.0.weight", ["cls.predictions.transform.dense.weight"], "copy"),
             ("head.transform.0.bias", ["cls.predictions.transform.dense.bias"], "copy"),
             ("head.transform.2.weight", ["cls.predictions.transform.LayerNorm.weight"], "copy"),
             ("head.transform.2.bias", ["cls.predictions.transform.LayerNorm.bias"], "copy"),
             ("head.proj.bias", ["cls.predictions.bias"], "copy")]
    for i in range(cfg.n_layers):
        o, t = f"encoder.blocks.{i}.", f"bert.encoder.layer.{i}."
        s = t + "attention.self."
        for p in (".weight", ".bias"):
            rules += [(o + "self_attn.qkv" + p, [s + n + p for n in ("query", "key", "value")], "cat"),
                      (o + "self_attn.out" + p, [t + "attention.output.dense" + p], "copy"),
                      (o + "norm_self" + p, [t + "attention.output.LayerNorm" + p], "copy"),
                      (o + "ffn.up" + p, [t + "intermediate.dense" + p], "copy"),
                      (o + "ffn.down" + p, [t + "output.dense" + p], "copy"),
                      (o + "norm_ffn" + p, [t + "output.LayerNorm" + p], "copy")]
    return rules


# ---------------------------------------------------------------- T5

def _t5_config(hf) -> ModelConfig:
    gated = hf.feed_forward_proj.startswith("gated-")
    act = {"relu": "relu", "gelu": "gelu_tanh"}[hf.feed_forward_proj.replace("gated-", "")]
    tied = bool(hf.tie_word_embeddings)
    # transformers < 5 scaled decoder outputs by d_model^-1/2 exactly when tied; 5 has a flag for it.
    scaled = bool(getattr(hf, "scale_decoder_outputs", tied))
    return ModelConfig(
        arch="encoder_decoder", vocab_size=hf.vocab_size, dim=hf.d_model, n_layers=hf.num_layers,
        n_decoder_layers=hf.num_decoder_layers, n_heads=hf.num_heads, head_dim=hf.d_kv, max_seq_len=512,
        norm_eps=hf.layer_norm_epsilon, bias=False, attn_scale=1.0, tie_embeddings=tied,
        logit_scale=hf.d_model ** -0.5 if scaled else 1.0, pad_token_id=hf.pad_token_id,
        decoder_start_token_id=hf.decoder_start_token_id, init="t5",
        norm=_norm("rmsnorm"), ffn=_ffn(gated, act, hf.d_ff),
        pos=_pos("t5_bias", num_buckets=hf.relative_attention_num_buckets, max_distance=hf.relative_attention_max_distance),
    )


def _t5_to_hf_config(cfg: ModelConfig):
    from transformers import T5Config

    act = {"relu": "relu", "gelu_tanh": "gelu"}[cfg.ffn["activation"]]
    glu = cfg.ffn["_target_"].endswith("GLU")
    scaled = abs(cfg.logit_scale - cfg.dim ** -0.5) < 1e-9
    if not scaled and cfg.logit_scale != 1.0:
        raise ValueError(f"T5 export supports logit_scale 1.0 or dim^-1/2, not {cfg.logit_scale}")
    extra = {"scale_decoder_outputs": scaled} if "scale_decoder_outputs" in T5Config().to_dict() else {}
    if not extra and scaled != cfg.tie_embeddings:
        raise ValueError("this transformers version scales T5 outputs exactly when embeddings are tied")
    return T5Config(**extra, vocab_size=cfg.vocab_size, d_model=cfg.dim, d_kv=cfg.d_head, d_ff=_hidden(cfg),
                    num_layers=cfg.n_layers, num_decoder_layers=cfg.decoder_layers, num_heads=cfg.n_heads,
                    relative_attention_num_buckets=cfg.pos.get("num_buckets", 32),
                    relative_attention_max_distance=cfg.pos.get("max_distance", 128),
                    layer_norm_epsilon=cfg.norm_eps, feed_forward_proj=("gated-" if glu else "") + act,
                    tie_word_embeddings=cfg.tie_embeddings, dropout_rate=0.0, pad_token_id=cfg.pad_token_id,
                    decoder_start_token_id=cfg.decoder_start_token_id)


def _t5_ffn_rules(cfg: ModelConfig, o: str, t: str) -> List[Rule]:
    d = t + "DenseReluDense."
    if cfg.ffn["_target_"].endswith("GLU"):
        up = (o + "ffn.gate_up.weight", [d + "wi_0.weight", d + "wi_1.weight"], "cat")
    else:
        up = (o + "ffn.up.weight", [d + "wi.weight"], "copy")
    return [up, (o + "ffn.down.weight", [d + "wo.weight"], "copy")]


def _t5_rules(cfg: ModelConfig) -> List[Rule]:
    rules = [("embed.tok.weight", ["shared.weight"], "copy"),
             ("encoder.pos.table.weight", ["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"], "copy"),
             ("decoder.pos.table.weight", ["decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"], "copy"),
             ("encoder.final_norm.weight", ["encoder.final_layer_norm.weight"], "copy"),
             ("decoder.final_norm.weight", ["decoder.final_layer_norm.weight"], "copy")]
    if not cfg.tie_embeddings:
        rules.append(("head.proj.weight", ["lm_head.weight"], "copy"))
    for stack, n in (("encoder", cfg.n_layers), ("decoder", cfg.decoder_layers)):
        for i in range(n):
            o, t = f"{stack}.blocks.{i}.", f"{stack}.block.{i}.layer."
            a = t + "0.SelfAttention."
            rules += [(o + "self_attn.qkv.weight", [a + p + ".weight" for p in "qkv"], "cat"),
                      (o + "self_attn.out.weight", [a + "o.weight"], "copy"),
                      (o + "norm_self.weight", [t + "0.layer_norm.weight"], "copy")]
            ff = t + ("2." if stack == "decoder" else "1.")
            rules += _t5_ffn_rules(cfg, o, ff) + [(o + "norm_ffn.weight", [ff + "layer_norm.weight"], "copy")]
            if stack == "decoder":
                c = t + "1.EncDecAttention."
                rules += [(o + "cross_attn.q.weight", [c + "q.weight"], "copy"),
                          (o + "cross_attn.kv.weight", [c + "k.weight", c + "v.weight"], "cat"),
                          (o + "cross_attn.out.weight", [c + "o.weight"], "copy"),
                          (o + "norm_cross.weight", [t + "1.layer_norm.weight"], "copy")]
    return rules


# ---------------------------------------------------------------- shared machinery

def _hidden(cfg: ModelConfig) -> int:
    from lm.model.ffn import hidden_size

    f = cfg.ffn
    return hidden_size(cfg.dim, f.get("hidden_mult", 4.0), f.get("multiple_of", 1), f.get("hidden_dim"))


FAMILIES: Dict[str, Tuple[Callable, Callable, Callable, str]] = {
    # model_type: (their config -> ours, ours -> their config, rules, their model class)
    "gpt2": (_gpt2_config, _gpt2_to_hf_config, _gpt2_rules, "GPT2LMHeadModel"),
    "llama": (_llama_config, _llama_to_hf_config, _llama_rules, "LlamaForCausalLM"),
    "bert": (_bert_config, _bert_to_hf_config, _bert_rules, "BertForMaskedLM"),
    "t5": (_t5_config, _t5_to_hf_config, _t5_rules, "T5ForConditionalGeneration"),
}


def _family_of(cfg: ModelConfig) -> str:
    """Which Hugging Face family a config's architecture matches, or a clear error."""
    norm, pos = cfg.norm["_target_"].rsplit(".", 1)[1], cfg.pos["_target_"].rsplit(".", 1)[1]
    glu = cfg.ffn["_target_"].endswith("GLU")
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


def from_hf(hf_model):
    """(our model, ModelConfig) with the weights of a Hugging Face GPT-2, Llama, BERT or T5 model."""
    from lm.model import build_model

    family = hf_model.config.model_type
    if family not in FAMILIES:
        raise ValueError(f"unsupported Hugging Face model_type {family!r}; supported: {sorted(FAMILIES)}")
    to_ours, _, rules, _ = FAMILIES[family]
    cfg = to_ours(hf_model.config)
    model = build_model(cfg)
    theirs = hf_model.state_dict()
    ours = {key: _gather(theirs, names, how) for key, names, how in rules(cfg)}
    _load_strict(model, ours)
    return model, cfg


def to_hf(model):
    """The `transformers` model of the same family with our weights (tied where ours are tied)."""
    transformers = require("hf", "converting to a Hugging Face model (lm-export's hf/ directory)")

    family = _family_of(model.cfg)
    _, to_theirs, rules, cls_name = FAMILIES[family]
    hf_model = getattr(transformers, cls_name)(to_theirs(model.cfg))
    ours = model.state_dict()
    theirs = {}
    for key, names, how in rules(model.cfg):
        theirs.update(_scatter(ours[key], names, how, hf_model.state_dict()))
    missing, unexpected = hf_model.load_state_dict(theirs, strict=False)
    tied = {"lm_head.weight", "cls.predictions.decoder.weight", "cls.predictions.decoder.bias",
            "encoder.embed_tokens.weight", "decoder.embed_tokens.weight"}
    if unexpected or set(missing) - tied:
        raise RuntimeError(f"export to {cls_name} left keys unmatched: missing={sorted(set(missing) - tied)}, unexpected={unexpected}")
    hf_model.tie_weights()
    return hf_model


def _gather(theirs: dict, names: List[str], how: str) -> torch.Tensor:
    tensors = [theirs[n] for n in names]
    if how == "t":
        return tensors[0].t().contiguous()
    return torch.cat(tensors, dim=0) if how == "cat" else tensors[0].clone()


def _scatter(tensor: torch.Tensor, names: List[str], how: str, their_state: dict) -> dict:
    if how == "t":
        return {names[0]: tensor.t().contiguous()}
    if how == "cat":
        sizes = [their_state[n].shape[0] for n in names]
        return dict(zip(names, (t.clone() for t in tensor.split(sizes, dim=0))))
    return {names[0]: tensor.clone()}


def _load_strict(model, ours: dict) -> None:
    own = model.state_dict()
    tied_head = "head.proj.weight" if model.cfg.tie_embeddings else None
    missing = sorted(k for k in own if k not in ours and k != tied_head)
    if missing:
        raise RuntimeError(f"conversion left our keys unfilled: {missing}")
    model.load_state_dict(ours, strict=False)
