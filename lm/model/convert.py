"""State-dict adapters to and from Hugging Face layouts: GPT-2, Llama, BERT, ESM and T5.

`from_hf(hf_model)` returns (our model, its ModelConfig) with the same weights; `to_hf(model)` returns the
matching `transformers` model. Each family is a config mapping plus a table of rules `(our key, their keys,
how)` (lm/model/hf_families.py; BERT and ESM in hf_encoders.py); here: which family a model is, what none of
them has, and the copying of tensors by those rules. transformers is imported lazily: it is a test reference and
an export target, not a dependency of the model.

Exact or refused: every config field that can change the forward pass is either mapped here or
refused by name (lm/model/hf_fields.py lists them per family), every tensor of theirs must be used,
and tying of the output layer is read from the tensors (same storage), not from a config flag
(transformers 5's T5Config always says tied).
"""

import torch

from lm.extras import require
from lm.model.config import GLUConfig, ModelConfig, ScaledDotConfig
from lm.model.hf_common import needs
from lm.model.hf_encoders import ESM_BACKBONE
from lm.model.hf_families import FAMILIES
from lm.model.hf_fields import check_fields
from lm.model.options import option_name


def _family_of(cfg: ModelConfig) -> str:
    """Which Hugging Face family a config's architecture matches, or a clear error."""
    if cfg.family is not None:  # a model/family option's model (lm/zoo): no Hugging Face class holds it
        plain = cfg.family.finetuned(cfg).family is None  # finetuning builds the arch's plain model
        hint = f"; lm finetune init=<run> finetunes it as the plain {cfg.arch.value} it holds" if plain else ""
        raise ValueError(
            f"no Hugging Face family matches model/family={option_name(cfg.family)}; exportable: gpt2, llama, bert, "
            f"esm, t5 layouts (use this export's model.safetensors){hint}"
        )
    norm, pos = cfg.norm._target_.rsplit(".", 1)[1], cfg.pos._target_.rsplit(".", 1)[1]
    glu = isinstance(cfg.ffn, GLUConfig)
    if cfg.arch == "decoder" and norm == "LayerNorm" and pos == "Learned" and not glu and cfg.norm_position == "pre":
        return "gpt2"
    if cfg.arch == "decoder" and norm == "RMSNorm" and pos == "RoPE" and glu and cfg.norm_position == "pre":
        return "llama"
    if cfg.arch == "encoder" and norm == "LayerNorm" and pos == "Learned" and not glu and cfg.norm_position == "post":
        return "bert"  # BertLayer's FFN is one up and one down projection: no gate
    if cfg.arch == "encoder" and norm == "LayerNorm" and pos == "RoPE" and not glu and cfg.norm_position == "pre":
        return "esm"
    if cfg.arch == "encoder_decoder" and norm == "RMSNorm" and pos == "T5Bias" and cfg.norm_position == "pre":
        return "t5"
    raise ValueError(
        f"no Hugging Face family matches arch={cfg.arch}, norm={norm}, pos={pos}, glu={glu}, "
        f"norm_position={cfg.norm_position}; exportable: gpt2, llama, bert, esm, t5 layouts "
        f"(export safetensors instead)"
    )


def _check_common(cfg: ModelConfig, family: str) -> None:
    """Options of ours that no target family has (or only one has): refused rather than dropped."""
    bert, esm = family == "bert", family == "esm"
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
            and (cfg.mlm_transform == bert or esm),  # ESM without it: the encoder alone (ESM_BACKBONE)
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
        (
            cfg.arch != "encoder_decoder" or cfg.shared_inputs,
            f"model.tie_embeddings={cfg.tie_embeddings} (own encoder input table)",
        ),
    ]
    for ok, what in checks:
        needs(ok, family, what)


def _output_tied(hf_model) -> bool:
    """Whether their output layer is the input embedding: the same storage, whatever the config says."""
    out, inp = hf_model.get_output_embeddings(), hf_model.get_input_embeddings()
    return out.weight.data_ptr() == inp.weight.data_ptr()


# The transformers Auto class that loads each family's converted class (FAMILIES' last field) from a directory.
AUTO_CLASS = {
    "gpt2": "AutoModelForCausalLM",
    "llama": "AutoModelForCausalLM",
    "bert": "AutoModelForMaskedLM",
    "esm": "AutoModelForMaskedLM",
    "t5": "AutoModelForSeq2SeqLM",
}


def from_hf(hf_model):
    """(our model, ModelConfig) with the weights of a Hugging Face GPT-2, Llama, BERT, ESM or T5 model.

    Raises ValueError naming the field when their config asks for maths this converter does not do.
    """
    from lm.model import build_model

    family = hf_model.config.model_type
    if family not in FAMILIES:
        raise ValueError(f"unsupported Hugging Face model_type {family!r}; supported: {sorted(FAMILIES)}")
    check_fields(family, hf_model.config)
    to_ours, _, rules, cls_name = FAMILIES[family]
    if hf_model.get_output_embeddings() is None:  # AutoModel's backbone, or a classifier: no LM head to convert
        raise ValueError(
            f"from_hf converts {cls_name}, the model with its language-modelling head; got "
            f"{type(hf_model).__name__}: load the directory with transformers.{AUTO_CLASS[family]}.from_pretrained"
        )
    cfg = to_ours(hf_model.config, _output_tied(hf_model))
    model = build_model(cfg)
    theirs = _without_derived(hf_model.state_dict(), cfg)
    table = rules(cfg)
    _check_all_used(theirs, [n for _, names, _ in table for n in names], family)
    ours = {key: _gather(theirs, names, how) for key, names, how in table}
    _load_strict(model, ours)
    return model, cfg


# ESM keeps its RoPE inverse frequencies in its state dict; ours computes them from model.pos.theta.
ROTARY_BUFFER = "rotary_embeddings.inv_freq"
# ESM's protein contact predictor reads attention maps (EsmModel.predict_contacts): no part of the MLM or
# classification forward, no part of ours; left out of a conversion and left at their init in an export.
CONTACT_HEAD = "contact_head."


def _without_derived(theirs: dict, cfg: ModelConfig) -> dict:
    """Their state dict less ESM's contact head and its stored RoPE frequencies, the latter checked equal to
    those cfg's theta gives (frequencies changed in place are refused rather than converted wrong)."""
    from lm.model.position import rope_inv_freq

    out = {}
    for key, t in theirs.items():
        if CONTACT_HEAD in key:
            continue
        if not key.endswith(ROTARY_BUFFER):
            out[key] = t
        elif not torch.allclose(t.float(), rope_inv_freq(cfg.pos.theta, cfg.d_head), rtol=1e-6, atol=0):
            raise ValueError(f"Hugging Face {key} is not the RoPE of rope_theta={cfg.pos.theta}; not converting")
    return out


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
    backbone = family == "esm" and not model.cfg.mlm_transform  # ESM's MLM head needs the transform
    if backbone:
        cls_name = ESM_BACKBONE
        hf_model = transformers.EsmModel(to_theirs(model.cfg), add_pooling_layer=False)
    else:
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
        "lm_head.decoder.weight",
    }
    derived = {k for k in missing if k.endswith(ROTARY_BUFFER) or CONTACT_HEAD in k}  # (see above)
    if unexpected or set(missing) - tied - derived:
        raise RuntimeError(
            f"export to {cls_name} left keys unmatched: missing={sorted(set(missing) - tied - derived)}, "
            f"unexpected={unexpected}"
        )
    if backbone:
        return hf_model  # the encoder alone: no output layer to tie
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
