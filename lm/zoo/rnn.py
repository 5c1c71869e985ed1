"""Recurrent language models (model=lstm|gru|rnn: model/family=lstm|gru|rnn): the baselines self-attention replaced.

    tokens -> Embedding (dim) -> dropout -> torch.nn.LSTM | GRU | RNN (n_layers, hidden, dropout between
    layers) -> dropout -> projection hidden(*2) -> dim (identity when equal) -> tied LM head

Dropout on the non-recurrent connections only, as Zaremba et al. (2014) regularise LSTM LMs; the output
layer shares the embedding matrix (Press & Wolf 2017, Inan et al. 2017), which is why the recurrent
state is projected back to model.dim when model.family.hidden differs. The recurrent weights keep
PyTorch's own init (uniform in +-1/sqrt(hidden)); embeddings and linears follow model.init.

Padding: inputs are right-padded (lm/glue/encode.py). A left-to-right pass never reads a later pad, but
the backward direction of a bidirectional model would start from the pads, so padded batches are packed
(pack_padded_sequence) and every direction sees the real tokens only.
"""

from dataclasses import dataclass, fields
from typing import ClassVar

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from lm.config_base import Choice, ConfigError
from lm.model.choices import Arch
from lm.model.config import ModelConfig
from lm.model.heads import Embedding, LMHead, LMOutput, pool
from lm.model.linear import Linear, MatmulCount
from lm.model.options import FamilyConfig, positive
from lm.model.registry import register
from lm.model.validate import unused_fields

# -- the option schema (conf/model/family/lstm.yaml, gru.yaml, rnn.yaml; the presets model=lstm|gru|rnn) ---------


class Cell(Choice):
    """The recurrent layer: torch.nn.LSTM, torch.nn.GRU or torch.nn.RNN."""

    lstm = "lstm"  # Hochreiter & Schmidhuber 1997
    gru = "gru"  # Cho et al. 2014
    rnn = "rnn"  # Elman 1990: h_t = act(W x_t + U h_{t-1} + b)


class Nonlinearity(Choice):
    tanh = "tanh"
    relu = "relu"


# The ModelConfig fields a recurrent model reads; every other field configures a Transformer, and setting one is
# refused (RNNConfig.check), fields added later included.
RNN_FIELDS = (
    "vocab_size",
    "dim",
    "n_layers",
    "max_seq_len",
    "dropout",
    "tie_embeddings",
    "n_segments",
    "pad_token_id",
    "init",
    "init_std",
    "loss_chunk_size",
    "linear",
    "family",
)


@register("family")
@dataclass
class RNNConfig(FamilyConfig):
    """model/family=lstm|gru|rnn: a recurrent LM (model.n_layers layers of this cell) in place of the Transformer.

    Embeddings are model.dim wide; the recurrent state is `hidden` wide, projected back to model.dim
    before the (tied) output layer when the two differ. A left-to-right LM: model.arch stays decoder (clm, last
    pooling, generation); the Transformer slots stay null.
    """

    _target_: str = "lm.zoo.rnn.RNNLM"
    cell: Cell = Cell.lstm
    hidden: int | None = None  # None = model.dim
    bidirectional: bool = False  # reads the future: for classification (lm finetune) only, never for clm
    nonlinearity: Nonlinearity = Nonlinearity.tanh  # cell=rnn only (torch.nn.RNN's nonlinearity)
    transformer: ClassVar[bool] = False

    @property
    def option_file(self) -> str:
        """conf/model/family/<cell>.yaml: one schema, a file per cell (option_name names it in messages)."""
        return self.cell.value

    def width(self, dim: int) -> int:
        return self.hidden or dim

    def build(self, model: ModelConfig, components) -> "RNNLM":
        return RNNLM(model)

    def check(self, model: ModelConfig) -> None:
        """The numbers make a model, and no Transformer-only field differs from its default (a position scheme,
        heads, norms, ... would be silently unused)."""
        name = f"model/family={self.option_file}"
        if model.arch != Arch.decoder:
            raise ConfigError(
                f"model.arch={model.arch.value} with {name}: a recurrent LM reads left to right (model.arch=decoder, "
                f"the default: drop the override); a bidirectional classifier is lm finetune bidirectional=true"
            )
        for field in ("vocab_size", "dim", "n_layers", "max_seq_len"):
            positive(field, getattr(model, field))
        if self.hidden is not None:
            positive("family.hidden", self.hidden)
        if not 0.0 <= model.dropout < 1.0:
            raise ConfigError(f"model.dropout={model.dropout} must be in [0, 1)")
        if self.cell != Cell.rnn and self.nonlinearity != Nonlinearity.tanh:
            raise ConfigError(
                f"model.family.nonlinearity={self.nonlinearity.value} applies to model.family.cell=rnn only "
                f"(an {self.cell.value.upper()} has fixed gate nonlinearities); remove it"
            )
        unused = unused_fields(model, RNN_FIELDS)
        if unused is not None:
            raise ConfigError(
                f"{unused} is a Transformer option; an RNN model ({name}) has no such part: remove it. "
                f"An RNN model reads model.{{{', '.join(n for n in RNN_FIELDS if n != 'family')}}} and "
                f"model.family.{{{', '.join(f.name for f in fields(RNNConfig) if not f.name.startswith('_'))}}}"
            )

    def check_objective(self, model: ModelConfig, objective: str) -> None:
        """An RNN learns next-token prediction (clm) left to right only; a bidirectional one would read the very
        token it predicts."""
        if objective != "clm":
            raise ConfigError(
                f"objective {objective} with model/family={self.option_file}: a recurrent model is trained on clm "
                f"(next-token prediction) only"
            )
        if self.bidirectional:
            raise ConfigError(
                "model.family.bidirectional=true reads the tokens it would predict, so it cannot be "
                "pretrained on clm; pretrain with model.family.bidirectional=false and finetune a "
                "bidirectional classifier with lm finetune bidirectional=true (docs/architecture.md)"
            )


# -- the model ---------------------------------------------------------------------------------------------------

CELLS = {Cell.lstm: nn.LSTM, Cell.gru: nn.GRU, Cell.rnn: nn.RNN}


def recurrent_layers(cfg: ModelConfig) -> nn.RNNBase:
    r = cfg.family
    assert isinstance(r, RNNConfig)
    extra = {"nonlinearity": r.nonlinearity.value} if r.cell == Cell.rnn else {}
    # torch applies `dropout` after every layer but the last, and warns when there is only one.
    return CELLS[r.cell](
        cfg.dim,
        r.width(cfg.dim),
        num_layers=cfg.n_layers,
        batch_first=True,
        dropout=cfg.dropout if cfg.n_layers > 1 else 0.0,
        bidirectional=r.bidirectional,
        **extra,
    )


class RNNLM(MatmulCount, nn.Module):
    """A recurrent LM with the interface of DecoderLM: forward (clm loss), features, pooled, generation."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        assert isinstance(cfg.family, RNNConfig)
        self.cfg, self.family = cfg, cfg.family  # the family: RNNConfig
        self.embed = Embedding(cfg)
        self.drop = nn.Dropout(cfg.dropout)
        self.rnn = recurrent_layers(cfg)
        self.directions = 2 if self.family.bidirectional else 1
        width = self.family.width(cfg.dim) * self.directions
        self.proj = Linear(width, cfg.dim) if width != cfg.dim else nn.Identity()
        self.head = LMHead(cfg, self.embed.tok if cfg.output_tied else None, bias=False, transform=nn.Identity())

    def active_matmul_params(self, count) -> float:
        """lm.model.flops: every input and recurrent weight of the LSTM/GRU/RNN layers is one matmul per token and
        direction (the gates' elementwise work is not counted, as norms and activations are not)."""
        recurrent = sum(p.numel() for name, p in self.rnn.named_parameters() if name.startswith("weight_"))
        return recurrent + sum(count(m) for m in self.children() if m is not self.rnn)

    def num_params(self, exclude_embeddings: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n - self.embed.tok.weight.numel() if exclude_embeddings else n

    def recurrent(self, input_ids, attention_mask=None, token_type_ids=None, state=None):
        """(B, T) ids -> (B, T, directions*hidden) outputs of the last layer and the final state.
        Pad positions (attention_mask 0, right padding) give zeros and never reach a real position."""
        x = self.drop(self.embed(input_ids, token_type_ids))  # (B, T, D)
        lengths = None if attention_mask is None else attention_mask.long().sum(1)
        if lengths is None or bool((lengths == input_ids.shape[1]).all()):
            return self.rnn(x, state)
        packed = pack_padded_sequence(x, lengths.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False)
        out, state = self.rnn(packed, state)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=input_ids.shape[1])
        return out, state

    def features(self, input_ids, attention_mask=None, token_type_ids=None) -> torch.Tensor:
        out, _ = self.recurrent(input_ids, attention_mask, token_type_ids)
        return self.proj(self.drop(out))  # (B, T, D)

    def forward(self, input_ids, labels=None, attention_mask=None, token_type_ids=None) -> LMOutput:
        return self.head.output(self.features(input_ids, attention_mask, token_type_ids), labels)

    def pooled(self, input_ids, attention_mask=None, token_type_ids=None, how: str = "last") -> torch.Tensor:
        """(B, D): `last` = the final state of each direction (forward at the last real token, backward at
        the first: the two positions that have read the whole input); `mean` = mean over real tokens."""
        if how not in ("last", "mean"):
            raise ValueError(
                f"pooling={how!r} does not suit an RNN (the first position has read one token); allowed: last, mean"
            )
        out, _ = self.recurrent(input_ids, attention_mask, token_type_ids)  # (B, T, dirs*H)
        if how == "mean" or self.directions == 1:
            return self.proj(self.drop(pool(out, attention_mask, how)))
        fwd, bwd = out.chunk(2, dim=-1)  # (B, T, H) each; torch concatenates forward then backward
        return self.proj(self.drop(torch.cat([pool(fwd, attention_mask, "last"), bwd[:, 0]], dim=-1)))

    # -- generation (lm.model.generate): the "cache" is the recurrent state --------------------------

    def new_cache(self) -> list[torch.Tensor | None]:
        if self.directions == 2:
            raise ValueError("a bidirectional RNN (model.family.bidirectional=true) cannot generate left to right")
        return [None]

    def next_logits(self, tokens: torch.Tensor, cache: list, state=None) -> torch.Tensor:
        """Logits for the position after `tokens`, carrying the recurrent state in cache[0]."""
        out, cache[0] = self.recurrent(tokens, state=cache[0])
        return self.head(self.proj(out[:, -1]))


def load_unidirectional(model: RNNLM, state_dict) -> None:
    """Fill a bidirectional model from a unidirectional one's weights so that, at the start, it computes
    exactly what the unidirectional model computed: the forward direction is copied, the backward one
    keeps its fresh init and enters through zero weights (the next layer's input weights and the output
    projection), which gradient descent then grows. Embeddings (and everything else) are copied."""
    if model.directions != 2:
        raise ValueError("load_unidirectional fills a bidirectional model (model.family.bidirectional=true)")
    H, D = model.family.width(model.cfg.dim), model.cfg.dim
    own = model.state_dict()
    new = {}
    for key, value in state_dict.items():
        if key.startswith("proj.") or key.startswith("head."):
            continue
        if key not in own:
            raise KeyError(
                f"{key} is not a weight of a bidirectional {model.family.cell.value} "
                f"(the checkpoint is not an RNN of the same shape)"
            )
        if key.startswith("rnn.weight_ih_l") and key != "rnn.weight_ih_l0":
            value = torch.cat([value, torch.zeros_like(value)], dim=1)  # (G*H, 2H): reads [forward, backward]
        new[key] = value
    w, b = state_dict.get("proj.weight"), state_dict.get("proj.bias")
    if w is None:  # the unidirectional model had no projection (hidden == dim): the identity
        w, b = torch.eye(D, H), torch.zeros(D)
    new["proj.weight"] = torch.cat([w, torch.zeros(D, H, dtype=w.dtype)], dim=1)  # (D, 2H)
    new["proj.bias"] = b
    missing = [k for k in own if k not in new and "_reverse" not in k and not k.startswith("head.")]
    if missing:
        raise KeyError(f"the checkpoint lacks {missing} of a {model.family.cell.value} model")
    model.load_state_dict(new, strict=False)
