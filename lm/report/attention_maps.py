"""Attention probabilities of a trained model on one text: load, check the request, run, collect.

    model = load_model(path)                      # a run dir / checkpoint (any engine) or an lm export dir
    request = check_request(model.cfg, layer, head)   # refused before any work: RNN, out-of-range values
    ids = encode_text(model, text)                 # refused: empty, or longer than model.max_seq_len
    maps = attention_maps(model, ids)              # one AttnMap per attention call, in call order

Loading goes through lm.glue.init.load_backbone, the path lm finetune uses: the engine that wrote the
checkpoint consolidates it, and the tokenizer is the run's own (its checkpoint-recorded sha256 checked)
unless `tokenizer` names one. The probabilities come from lm.model.attention.capture, so every
model/attn option is drawn from the numbers it really computed. Rendering is lm/report/attention_plots.py.

Encoder-decoders: the encoder reads the text; the decoder reads the text shifted right
(decoder_start_token_id, then every text token but the last: teacher forcing on the text itself, as
lm finetune's classifier does) unless `decoder_text` is given. Linformer: a non-causal attention's key
axis is its k projected rows (labelled E1..Ek), not tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lm.report.runs import ReportError

PROJECTED = "E"  # key-axis label prefix of Linformer's projected rows (K' = E K)


class AttentionMapError(ReportError):
    """lm attention cannot draw what was asked; the message names the value and the allowed range."""


@dataclass
class LoadedModel:
    model: object  # lm.model DecoderLM / EncoderLM / EncoderDecoderLM in eval mode
    cfg: object  # lm.model.config.ModelConfig
    tokenizer: object  # lm.data.tokenizer.Tokenizer
    source: str  # the checkpoint or export it was loaded from


@dataclass
class AttnMap:
    stack: str  # "decoder", "encoder"
    layer: int  # block index in its stack
    kind: str  # "self" | "cross"
    probs: np.ndarray  # (H, Tq, Tk) for the single input; rows sum to 1
    queries: list[str]  # Tq labels
    keys: list[str]  # Tk labels

    @property
    def title(self) -> str:
        return f"{self.stack} {self.kind}-attention"


# -- what the saved model is, read before any weight ---------------------------------------------


def saved_model_config(path) -> tuple:
    """(ModelConfig, where) of an lm export directory or a run / checkpoint directory, from its config
    file alone (no weights are read)."""
    from lm.core.checkpoint import CheckpointError
    from lm.core.saved_model import find_saved_model
    from lm.model.config import model_from_saved

    path = Path(path).expanduser()
    try:
        saved = find_saved_model(path)
    except FileNotFoundError:
        raise AttentionMapError(
            f"{path}: no such directory; pass an lm train run directory, one of its "
            f"checkpoints/step_* directories, or an lm export directory"
        ) from None
    except CheckpointError as e:
        raise AttentionMapError(
            f"{path}: {e}; or pass an lm export directory (model.safetensors + config.json)"
        ) from None
    return model_from_saved(saved.model_node()), saved.path


def stack_depths(cfg) -> dict:
    """Blocks per attention stack, by the names capture() reports."""
    if cfg.arch == "decoder":
        return {"decoder": cfg.n_layers}
    if cfg.arch == "encoder":
        return {"encoder": cfg.n_layers}
    return {"encoder": cfg.n_layers, "decoder": cfg.decoder_layers}


def check_request(cfg, layer: int | None, head: int | None, where="the model") -> None:
    """Refuse, before any work, a model without attention and a --layer / --head outside the model."""
    from lm.model.options import option_name

    if cfg.family is not None and not cfg.family.transformer:  # the zoo's recurrent LMs
        raise AttentionMapError(
            f"{where} is a model/family={option_name(cfg.family)} model: it has no attention to draw. lm attention "
            f"reads Transformer runs (model.arch=decoder, encoder or encoder_decoder)"
        )
    depth = max(stack_depths(cfg).values())
    if layer is not None and not 0 <= layer < depth:
        raise AttentionMapError(
            f"--layer {layer} is out of range: {where} has {depth} layers per stack "
            f"({_depth_text(cfg)}); pass --layer in [0, {depth - 1}]"
        )
    if head is not None and not 0 <= head < cfg.n_heads:
        raise AttentionMapError(
            f"--head {head} is out of range: {where} has model.n_heads={cfg.n_heads}; "
            f"pass --head in [0, {cfg.n_heads - 1}]"
        )


def _depth_text(cfg) -> str:
    return ", ".join(f"{name}: {n}" for name, n in stack_depths(cfg).items())


# -- loading, tokenizing, running ------------------------------------------------------------------


def load_model(path, tokenizer: str | None = None) -> LoadedModel:
    from lm.glue.init import InitError, load_backbone
    from lm.model import build_model

    try:
        backbone = load_backbone(str(path), tokenizer=tokenizer)
    except InitError as e:
        raise AttentionMapError(str(e).replace("tokenizer=", "--tokenizer ")) from None
    model = build_model(backbone.model_cfg)
    missing, unexpected = model.load_state_dict(backbone.state_dict, strict=False)
    tied = {"head.proj.weight"} if backbone.model_cfg.tie_embeddings else set()
    if unexpected or set(missing) - tied:
        raise AttentionMapError(
            f"{backbone.source} does not match its model config: missing="
            f"{sorted(set(missing) - tied)}, unexpected={sorted(unexpected)}"
        )
    return LoadedModel(model.eval(), backbone.model_cfg, backbone.tokenizer, backbone.source)


def encode_text(loaded: LoadedModel, text: str, what: str = "--text") -> list[int]:
    """The text's token ids (no special tokens added), refused when empty or longer than the context."""
    ids = loaded.tokenizer.encode(text)
    limit = loaded.cfg.max_seq_len
    if not ids:
        raise AttentionMapError(f"{what} {text!r} has no tokens; pass some text")
    if len(ids) > limit:
        raise AttentionMapError(
            f"{what} is {len(ids)} tokens long ({loaded.tokenizer.kind} tokenizer); the model's "
            f"context is model.max_seq_len={limit}: pass at most {limit} tokens"
        )
    return ids


def token_labels(tokenizer, ids: list[int]) -> list[str]:
    """One readable label per token: its text (a leading space shown as '·'), or its vocabulary entry."""
    labels = []
    for i in ids:
        text = tokenizer.decode([i]) or tokenizer.id_to_token(i) or f"#{i}"
        labels.append(text.replace(" ", "·").replace("\n", "\\n").replace("\t", "\\t"))
    return labels


def decoder_input_ids(loaded: LoadedModel, ids: list[int], decoder_text: str | None = None) -> list[int]:
    """What an encoder-decoder's decoder reads: the text shifted right, or `decoder_text` after the start token."""
    start = loaded.cfg.decoder_start_token_id
    if decoder_text is None:
        return [start] + ids[:-1]
    return [start] + encode_text(loaded, decoder_text, "--decoder-text")[: loaded.cfg.max_seq_len - 1]


def attention_maps(loaded: LoadedModel, ids: list[int], decoder_ids: list[int] | None = None) -> list[AttnMap]:
    """Run the model once on `ids` and return every attention call's probabilities."""
    import torch

    from lm.model.attention import capture
    from lm.zoo.scores import LinformerConfig

    x = torch.tensor([ids])
    labels = token_labels(loaded.tokenizer, ids)
    dec_labels = None
    with torch.no_grad(), capture(loaded.model) as maps:
        if loaded.cfg.arch == "encoder_decoder":
            decoder_ids = decoder_ids or decoder_input_ids(loaded, ids)
            dec_labels = token_labels(loaded.tokenizer, decoder_ids)
            loaded.model(x, decoder_input_ids=torch.tensor([decoder_ids]))
        else:
            loaded.model(x)
    if not maps:
        raise AttentionMapError(
            f"{loaded.source} recorded no attention probabilities (model/attn="
            f"{type(loaded.cfg.attn).__name__}); lm attention draws models whose attention "
            f"modules report them through lm.model.attention.capture"
        )
    linformer = isinstance(loaded.cfg.attn, LinformerConfig)
    out = []
    for m in maps:
        decoder_side = loaded.cfg.arch == "encoder_decoder" and m["stack"] == "decoder"
        queries = dec_labels if decoder_side else labels
        keys = dec_labels if decoder_side and m["kind"] == "self" else labels
        probs = m["probs"][0].float().numpy()  # (H, Tq, Tk)
        # Linformer projects the keys of every attention that is not causal (make_score keeps scaled_dot
        # for causal self-attention), so those maps have k projected rows on the key axis.
        projected = linformer and not (decoder_side and m["kind"] == "self")
        if projected:
            keys = [f"{PROJECTED}{i + 1}" for i in range(probs.shape[2])]
        out.append(
            AttnMap(m["stack"], m["layer"], m["kind"], probs, _fit(queries, probs.shape[1]), _fit(keys, probs.shape[2]))
        )
    return out


def _fit(labels: list[str], n: int) -> list[str]:
    """The labels when they match the axis, else positions (a Funnel's pooled blocks have fewer rows)."""
    return labels if len(labels) == n else [f"#{i}" for i in range(n)]


def groups(maps: list[AttnMap]) -> dict:
    """{(stack, kind): [AttnMap per layer, in layer order]}: one grid each."""
    out: dict = {}
    for m in maps:
        out.setdefault((m.stack, m.kind), []).append(m)
    return {key: sorted(ms, key=lambda m: m.layer) for key, ms in out.items()}
