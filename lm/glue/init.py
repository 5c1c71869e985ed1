"""Where a finetuned model starts: an lm train checkpoint (any engine), an lm export directory, or nothing.

    init=<run_dir>                 the run's checkpoints/latest (single, ddp, zero1-3, fsdp2: all read by
    init=<run_dir>/checkpoints/step_00000500     lm.core.checkpoint.consolidated_state_dict)
    init=<dir with model.safetensors + config.json>   what lm export writes
    init=none                      random weights, the model of `model=` (baselines)

The tokenizer is the pretraining run's, `<data.dir>/tokenizer.json` of the checkpoint's config.yaml,
unless `tokenizer=` names one. A tokenizer whose ids do not index the checkpoint's embedding rows
(more tokens than rows, or a file other than the one the run was pretrained with) is refused: the
finetune would train on scrambled embeddings and nothing would say so. "The one the run was
pretrained with" is the sha256 its data loader recorded in the checkpoint (rank00000.pt), so a data
directory re-prepared with another vocabulary since is caught too; checkpoints without that record
(runs on injected loaders) are compared with the data directory's file.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from lm.config import ConfigError
from lm.core.files import file_sha256

if TYPE_CHECKING:
    from lm.core.saved_model import SavedModel

log = logging.getLogger("lm")


PRETRAINING_ONLY = ("head.", "generator.")  # state-dict prefixes a classifier does not load


class InitError(ConfigError):
    """The init checkpoint, its tokenizer or the model config cannot be used; the message says why and the fix."""


@dataclass
class Backbone:
    """Everything needed to build the same starting classifier once per seed."""

    model_cfg: Any  # lm.config.ModelConfig
    state_dict: dict[str, torch.Tensor] | None  # None = random init (init=none)
    tokenizer: Any  # lm.data.tokenizer.Tokenizer
    source: str  # what it was loaded from, for results.json
    pretrain: dict | None = None  # the pretraining run's resolved config (wandb group), if known
    # which weights init= held when loaded (a checkpoint's manifest sha256, an export's model.safetensors sha256):
    # a finished task/seed pair is not reused once its run has pretrained further under the same init= path
    weights: str | None = None


def load_backbone(init: str, tokenizer: str | None = None, model_node=None) -> Backbone:
    """`model_node` (init=none only): the typed ModelConfig to build, or a saved model node."""
    from lm.core.checkpoint import CheckpointError
    from lm.core.saved_model import find_saved_model
    from lm.model.config import ModelConfig, model_from_saved

    if init is None or str(init).lower() in ("none", "scratch", ""):
        if model_node is None:
            raise InitError("init=none needs a model config (model=<preset>)")
        tok = _load_tokenizer(tokenizer, what="init=none")
        cfg = model_node if isinstance(model_node, ModelConfig) else model_from_saved(model_node)
        _check_vocab(
            tok,
            cfg.vocab_size,
            f"model.vocab_size={cfg.vocab_size}",
            f"set model.vocab_size={-(-tok.vocab_size // 64) * 64} (or larger)",
        )
        return Backbone(cfg, None, tok, "none (random init)")
    path = Path(init).expanduser()
    try:
        saved = find_saved_model(path)
    except FileNotFoundError:
        raise InitError(
            f"init={path}: no such directory; pass an lm train run directory, one of its "
            f"checkpoints/step_* directories, an lm export directory, or init=none"
        ) from None
    except CheckpointError as e:
        raise InitError(f"init={path}: {e}; or an lm export directory (model.safetensors + config.json)") from None
    return _from_export(saved, tokenizer) if saved.export else _from_checkpoint(saved, tokenizer)


def _from_checkpoint(saved: SavedModel, tokenizer: str | None) -> Backbone:
    from lm.model.config import model_from_saved

    ckpt, pretrain = saved.path, saved.run_config()
    cfg = model_from_saved(pretrain["model"])
    weights = saved.state_dict()  # verifies the checkpoint's files first
    tok = _pretraining_tokenizer(pretrain, tokenizer, ckpt, _recorded_tokenizer_sha256(ckpt))
    return Backbone(cfg, weights, tok, str(ckpt), pretrain, _checkpoint_weights(ckpt))


def _from_export(saved: SavedModel, tokenizer: str | None) -> Backbone:
    from lm.model.config import model_from_saved

    path, cfg, pretrain = saved.path, model_from_saved(saved.model_node()), saved.run_config()
    if pretrain is not None:  # lm export's default output is <checkpoint>/export
        tok = _pretraining_tokenizer(pretrain, tokenizer, path, _recorded_tokenizer_sha256(path.parent))
    else:  # an export moved or shared: its hf/ holds the pretraining tokenizer (lm export checked it), read the same
        hf_tok = path / "hf" / "tokenizer.json"
        if tokenizer is None and hf_tok.is_file():
            log.info("init=%s: the tokenizer of its hf/ (%s)", path, hf_tok)
        tokenizer = tokenizer or (str(hf_tok) if hf_tok.is_file() else None)
        tok = _load_tokenizer(tokenizer, what=f"init={path} (an export without hf/tokenizer.json or a config.yaml)")
        _check_vocab(
            tok,
            cfg.vocab_size,
            f"the embedding of {path} ({cfg.vocab_size} rows)",
            "pass the tokenizer the model was pretrained with",
        )
    weights = f"model.safetensors sha256 {file_sha256(path / 'model.safetensors')}"
    return Backbone(cfg, saved.state_dict(), tok, str(path), pretrain, weights)


def _checkpoint_weights(ckpt: Path) -> str:
    """A checkpoint's identity: its step directory's name and manifest sha256 (verified with its files when the
    weights were read; a checkpoint older than manifests: its name alone)."""
    from lm.core.checkpoint import read_trainer

    digest = read_trainer(ckpt).get("manifest_sha256")
    return f"{ckpt.name}, manifest sha256 {digest}" if digest else ckpt.name


def _recorded_tokenizer_sha256(ckpt: Path) -> str | None:
    from lm.core.checkpoint import CheckpointError
    from lm.core.saved_model import recorded_tokenizer_sha256

    try:
        return recorded_tokenizer_sha256(ckpt)
    except CheckpointError as e:
        raise InitError(f"init={ckpt}: {e}") from None


def _pretraining_tokenizer(pretrain: dict, tokenizer: str | None, where: Path, recorded: str | None = None):
    """The run's own tokenizer; one whose file differs from the one it was pretrained with (`recorded`,
    else the data directory's file) is refused."""
    data_dir = _data_dir(pretrain)
    own = data_dir / "tokenizer.json" if data_dir else None
    vocab = pretrain["model"]["vocab_size"]
    if tokenizer is None:
        if own is None or not own.is_file():
            raise InitError(
                f"{where} was pretrained with the tokenizer {own or '(unknown: no data.dir in its config)'}, "
                f"which is not there any more; pass tokenizer=<that tokenizer.json> (the same file, or "
                f"finetuning reads the wrong embedding rows)"
            )
        tok = _load_tokenizer(str(own), what=str(where))
        if recorded and tok.sha256 != recorded:
            raise InitError(
                f"{own} (sha256 {tok.sha256[:12]}, {tok.vocab_size} tokens) is not the tokenizer {where} was "
                f"pretrained with (sha256 {recorded[:12]}, recorded in its checkpoint's rank00000.pt): {data_dir} was "
                f"re-prepared since, and its ids would index the wrong embedding rows. Pass tokenizer=<the original "
                f"tokenizer.json> (a copy of the file with sha256 {recorded}), or re-prepare {data_dir} with the "
                f"run's original data settings (its config.yaml)"
            )
    else:
        tok = _load_tokenizer(tokenizer, what=str(where))
        if recorded:
            if tok.sha256 != recorded:
                raise InitError(
                    f"tokenizer={tokenizer} is not the tokenizer {where} was pretrained with (sha256 {tok.sha256[:12]} "
                    f"vs {recorded[:12]} recorded in its checkpoint's rank00000.pt): its ids would index the wrong "
                    f"embedding rows. Pass the original tokenizer.json (sha256 {recorded}), or finetune from "
                    f"scratch with init=none"
                )
        elif own is not None and own.is_file():
            from lm.data.tokenizer import Tokenizer

            expected = Tokenizer.load(own)
            if expected.sha256 != tok.sha256:
                raise InitError(
                    f"tokenizer={tokenizer} is not the tokenizer {where} was pretrained with ({own}; sha256 "
                    f"{tok.sha256[:12]} vs {expected.sha256[:12]}, {tok.vocab_size} vs {expected.vocab_size} tokens): "
                    f"its ids would index the wrong embedding rows. Drop tokenizer= to use the run's own, or "
                    f"finetune from scratch with init=none"
                )
    _check_vocab(tok, vocab, f"the checkpoint's embedding ({vocab} rows)", "use the run's own tokenizer")
    return tok


def _data_dir(pretrain: dict) -> Path | None:
    from omegaconf import OmegaConf

    from lm.config import register_train_configs

    data = pretrain.get("data") or {}
    if not data.get("dir"):
        return None
    register_train_configs()  # the ${oc.env:...} / ${lm.*} resolvers of lm train's config
    node = OmegaConf.create({"data": data})
    try:
        return Path(os.path.expanduser(str(node.data.dir)))
    except Exception:  # noqa: BLE001 - an unresolvable interpolation: treat as unknown
        return None


def _load_tokenizer(path: str | None, what: str):
    from lm.data.tokenizer import Tokenizer, TokenizerError

    if not path:
        raise InitError(
            f"{what} needs tokenizer=<path to tokenizer.json, or a prepared data directory that "
            f"holds one> (lm prepare writes it)"
        )
    try:
        return Tokenizer.load(path)
    except TokenizerError as e:
        raise InitError(f"tokenizer: {e}") from None


def _check_vocab(tok, rows: int, what: str, fix: str) -> None:
    if tok.vocab_size > rows:
        raise InitError(
            f"the tokenizer {tok.source} has {tok.vocab_size} tokens but {what} has only {rows}: "
            f"ids >= {rows} have no embedding. {fix}"
        )


def _mismatch(source: str, e: RuntimeError) -> str:
    """One line for torch's multi-line "size mismatch" error: the first differing tensor, the count, the fix."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip().startswith("size mismatch")]
    first = lines[0].rstrip(".") if lines else str(e).strip().splitlines()[0]
    config = "config.json" if (Path(source) / "model.safetensors").is_file() else "config.yaml"
    return (
        f"{source}: the weights do not fit its {config} ({first}; {len(lines) or 1} tensor(s) differ): the "
        f"file was edited or belongs to another model; restore it (an lm export directory: export the "
        f"checkpoint again)"
    )


def build_classifier(
    backbone: Backbone,
    n_labels: int,
    dropout: float,
    pooling: str | None = None,
    bidirectional: bool = False,
    pair_input: str = "joint",
    score_range: tuple[float, float] | None = None,
    whiten: bool = False,
):
    """A fresh SequenceClassifier: the backbone's weights (or a random init) plus a new head that reads a
    pair as pair_input says (GlueTaskConfig.pair_input); score_range is a regression task's label range;
    whiten adds the siamese head's whitening (identity until fit_siamese_head).

    `bidirectional` (RNN backbones, lm finetune bidirectional=true) widens a unidirectional recurrent
    backbone: its forward direction is the checkpoint's, the backward direction starts from scratch and
    enters through zero weights, so the classifier starts out computing what the LM computed
    (lm.zoo.rnn.load_unidirectional).
    """
    from dataclasses import replace

    from lm.model import build_model
    from lm.model.lm import SequenceClassifier
    from lm.zoo.rnn import RNNConfig, load_unidirectional

    cfg = backbone.model_cfg
    if cfg.family is not None:  # what finetuning builds of a zoo family (ELECTRA: the plain encoder it holds)
        cfg = cfg.family.finetuned(cfg)
    recurrent = cfg.family if isinstance(cfg.family, RNNConfig) else None
    if recurrent is not None and pooling not in (None, "last", "mean"):
        raise InitError(
            f"pooling={pooling} is for Transformer backbones; for an RNN backbone use pooling=last "
            "(final states) or pooling=mean (mean over real tokens)"
        )
    if pooling == "first" and recurrent is None and cfg.arch.value == "decoder":
        # a causal decoder's first position is [BOS], computed before any input token: the same vector for every
        # example, so the head could only learn the majority class, and the run would report that as its score
        raise InitError(
            f"pooling=first reads position 0 ([BOS]), which the causal decoder {backbone.source} computes before "
            "seeing any input token (the same vector for every example); use pooling=last (the default), "
            "pooling=mean or pooling=weighted_mean"
        )
    if bidirectional and recurrent is None:
        raise InitError(
            f"bidirectional=true widens a recurrent backbone (model=lstm|gru|rnn), but {backbone.source} "
            f"is a Transformer ({cfg.arch.value}); drop bidirectional=true"
        )
    widen = recurrent is not None and bidirectional and not recurrent.bidirectional
    if recurrent is not None and widen:
        cfg = replace(cfg, family=replace(recurrent, bidirectional=True))
    model = SequenceClassifier(
        build_model(cfg), n_labels, pooling, dropout, pair_input, score_range or (0.0, 1.0), whiten
    )
    if backbone.state_dict is not None:
        # the pretraining-only parts are dropped: the LM head (ELECTRA: the discriminator's head) and
        # ELECTRA's generator
        weights = {k: v for k, v in backbone.state_dict.items() if not k.startswith(PRETRAINING_ONLY)}
        if widen:
            try:
                load_unidirectional(model.backbone, weights)
            except (KeyError, RuntimeError) as e:
                raise InitError(
                    f"{backbone.source}: cannot widen to a bidirectional {recurrent.cell.value}: {e}"
                ) from None
            return model
        try:
            missing, unexpected = model.backbone.load_state_dict(weights, strict=False)
        except RuntimeError as e:  # a shape differs: the weights are not those of the saved model config
            raise InitError(_mismatch(backbone.source, e)) from None
        if missing or unexpected:
            raise InitError(
                f"{backbone.source} does not match its model config: missing={sorted(missing)}, "
                f"unexpected={sorted(unexpected)}"
            )
    return model


def fit_siamese_head(
    model, features, pad_id: int, whiten: bool, fit_head: bool, batch_size: int = 64, device=None
) -> None:
    """Fits a siamese classifier's head on the pooled sentences of `features` (encoded pairs with their second
    reading) before any step: whiten, the whitening (SequenceClassifier.fit_whitening); fit_head, the score
    head's scale and shift on the pairs' labels, after that whitening (SequenceClassifier.fit_cosine_head).
    The pairs are read once, in eval mode (no dropout) and without gradients, on `device` when given (the
    engine's: a GPU reads the pairs in moments), leaving the model where it was."""
    import torch

    from lm.glue.encode import collate

    keep = ("input_ids", "attention_mask", "token_type_ids")
    was_training, home, pooled = model.training, next(model.parameters()).device, []
    device = torch.device(device or home)
    model.eval().to(device)
    with torch.no_grad():
        for i in range(0, len(features), batch_size):
            batch = collate(features[i : i + batch_size], pad_id)
            pooled.append(model.pooled_pairs(**{k: batch[k].to(device) for k in keep}).cpu())  # (2, B, D)
    pairs = torch.cat(pooled, dim=1)  # (2, N, D)
    model.to(home)
    if whiten:
        model.fit_whitening(pairs.flatten(0, 1))  # (2N, D)
    if fit_head:
        model.fit_cosine_head(pairs[0], pairs[1], torch.tensor([float(f["labels"]) for f in features]))
    model.train(was_training)
