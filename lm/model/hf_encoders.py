"""The encoder families lm/model/hf_families.py lists: BERT (post-norm, learned positions) and ESM (pre-norm,
rotary), each a config mapping both ways and a table of rules, as the decoder families there."""

from lm.model.config import ModelConfig
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

# BERT and ESM name their shapes alike in transformers; these are the fields both families share.


def _encoder_from_hf(hf) -> dict:
    """ModelConfig fields of a BERT-named HF config: the shape, LayerNorm with biases, a tied MLM head."""
    return dict(
        arch="encoder",
        vocab_size=hf.vocab_size,
        dim=hf.hidden_size,
        n_layers=hf.num_hidden_layers,
        n_heads=hf.num_attention_heads,
        max_seq_len=hf.max_position_embeddings,
        norm_eps=hf.layer_norm_eps,
        bias=True,
        mlm_transform=True,
        tie_embeddings=True,
        init="normal",
        pad_token_id=hf.pad_token_id or 0,
        norm=norm_config("layernorm"),
    )


def _encoder_to_hf(cfg: ModelConfig) -> dict:
    """The BERT-named HF config fields of our shape."""
    return dict(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.dim,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        intermediate_size=hidden_dim(cfg),
        max_position_embeddings=cfg.max_seq_len,
        layer_norm_eps=cfg.norm_eps,
        pad_token_id=cfg.pad_token_id,
    )


# ---------------------------------------------------------------- BERT


def bert_config(hf, tied: bool) -> ModelConfig:
    kind = getattr(hf, "position_embedding_type", "absolute")
    if kind != "absolute":
        raise ValueError(f"Hugging Face BERT position_embedding_type={kind!r} is not converted (only 'absolute')")
    if not tied:
        raise ValueError("a BERT whose MLM decoder is not tied to the word embeddings is not converted")
    act = our_activation(hf.hidden_act, "hidden_act")
    return ModelConfig(
        **_encoder_from_hf(hf),
        norm_position="post",
        embed_norm=True,
        final_norm=False,
        n_segments=hf.type_vocab_size,
        mlm_activation=act,
        ffn=ffn_config(False, act, hf.intermediate_size),
        pos=pos_config("learned"),
    )


def bert_to_hf_config(cfg: ModelConfig):
    from transformers import BertConfig

    # One hidden_act drives both the FFN and the MLM-head transform in transformers.
    needs(
        cfg.mlm_activation == cfg.ffn.activation,
        "BERT",
        f"model.mlm_activation={str(cfg.mlm_activation)!r} != model.ffn.activation={str(cfg.ffn.activation)!r}",
    )
    needs(
        cfg.bias and ffn_bias(cfg) and cfg.mlm_transform and cfg.output_tied and cfg.embed_norm,
        "BERT",
        "this layout (needs bias, mlm_transform, tie_embeddings and embed_norm true)",
    )
    return BertConfig(
        **_encoder_to_hf(cfg),
        type_vocab_size=cfg.n_segments,
        hidden_act=hf_activation(cfg),
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )


def bert_rules(cfg: ModelConfig) -> list[Rule]:
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
    for i in range(cfg.n_layers):  # post-norm: each LayerNorm after its sublayer's output projection
        o, t = f"encoder.blocks.{i}.", f"bert.encoder.layer.{i}."
        rules += _bert_layer_rules(o, t, "attention.output.LayerNorm", "output.LayerNorm")
    return rules


def _bert_layer_rules(o: str, t: str, norm_self: str, norm_ffn: str) -> list[Rule]:
    """One encoder layer in BERT's naming (ESM keeps it), from our block `o` to their layer `t`; the two
    LayerNorms are named where each family keeps them."""
    s = t + "attention.self."
    rules = []
    for p in (".weight", ".bias"):
        rules += [
            (o + "self_attn.qkv" + p, [s + n + p for n in ("query", "key", "value")], "cat"),
            (o + "self_attn.out" + p, [t + "attention.output.dense" + p], "copy"),
            (o + "norm_self" + p, [t + norm_self + p], "copy"),
            (o + "ffn.up" + p, [t + "intermediate.dense" + p], "copy"),
            (o + "ffn.down" + p, [t + "output.dense" + p], "copy"),
            (o + "norm_ffn" + p, [t + norm_ffn + p], "copy"),
        ]
    return rules


# ---------------------------------------------------------------- ESM
# ESM-2 (Lin et al. 2023) is transformers' pre-norm encoder with rotary positions: LayerNorm before attention and
# FFN, exact GELU, biases, a final LayerNorm (emb_layer_norm_after), no embedding norm, no segments. It holds the
# GLUE GPU preset's encoder (RoPE, pre-norm). Its MLM head has BERT's dense+GELU+LayerNorm transform: an encoder
# without model.mlm_transform exports its encoder alone (EsmModel, ESM_BACKBONE), which is what a sequence
# classifier (EsmForSequenceClassification) starts from.

ESM_BACKBONE = "EsmModel"


def esm_config(hf, tied: bool) -> ModelConfig:
    refused = [
        (hf.position_embedding_type != "rotary", f"position_embedding_type={hf.position_embedding_type!r}"),
        (bool(hf.emb_layer_norm_before), "emb_layer_norm_before=True (a LayerNorm on the embeddings)"),
        (not tied, "an MLM decoder not tied to the word embeddings"),
    ]
    for bad, what in refused:
        if bad:
            raise ValueError(f"Hugging Face ESM with {what} is not converted (ESM-2's layout only)")
    return ModelConfig(
        **_encoder_from_hf(hf),
        norm_position="pre",
        embed_norm=False,
        final_norm=True,
        mlm_activation="gelu",
        ffn=ffn_config(False, "gelu", hf.intermediate_size),
        pos=pos_config("rope", theta=float(hf.rope_theta)),
    )


def esm_to_hf_config(cfg: ModelConfig):
    from transformers import EsmConfig

    # ESM's FFN and MLM-head activation is exact GELU, written into its code rather than its config.
    needs(
        str(cfg.ffn.activation) == "gelu", "ESM", f"model.ffn.activation={str(cfg.ffn.activation)!r} (exact gelu only)"
    )
    needs(
        not cfg.mlm_transform or str(cfg.mlm_activation) == "gelu",
        "ESM",
        f"model.mlm_activation={str(cfg.mlm_activation)!r} (exact gelu only)",
    )
    needs(cfg.bias and ffn_bias(cfg), "ESM", "this layout without biases")
    needs(cfg.output_tied or not cfg.mlm_transform, "ESM", "model.tie_embeddings=false (ESM's MLM decoder is tied)")
    return EsmConfig(
        **_encoder_to_hf(cfg),
        position_embedding_type="rotary",
        rope_theta=float(cfg.pos.theta),
        emb_layer_norm_before=False,
        token_dropout=False,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )


def esm_rules(cfg: ModelConfig) -> list[Rule]:
    e = "esm." if cfg.mlm_transform else ""  # EsmForMaskedLM holds the encoder as .esm; EsmModel is it
    rules = [
        ("embed.tok.weight", [e + "embeddings.word_embeddings.weight"], "copy"),
        ("encoder.final_norm.weight", [e + "encoder.emb_layer_norm_after.weight"], "copy"),
        ("encoder.final_norm.bias", [e + "encoder.emb_layer_norm_after.bias"], "copy"),
    ]
    if cfg.mlm_transform:
        rules += [
            ("head.transform.0.weight", ["lm_head.dense.weight"], "copy"),
            ("head.transform.0.bias", ["lm_head.dense.bias"], "copy"),
            ("head.transform.2.weight", ["lm_head.layer_norm.weight"], "copy"),
            ("head.transform.2.bias", ["lm_head.layer_norm.bias"], "copy"),
            ("head.proj.bias", ["lm_head.bias"], "copy"),
        ]
    for i in range(cfg.n_layers):  # pre-norm: each LayerNorm before its sublayer
        o, t = f"encoder.blocks.{i}.", f"{e}encoder.layer.{i}."
        rules += _bert_layer_rules(o, t, "attention.LayerNorm", "LayerNorm")
    return rules
