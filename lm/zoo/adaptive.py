"""Adaptive input embeddings (Baevski & Auli 2019; model/embedding=adaptive) and the adaptive softmax (Grave et
al. 2017; model/output=adaptive_softmax): Narang et al. 2021's rows.

Both split the vocabulary into bands by their `cutoffs` [c_1, ..., c_n] (model.embedding.cutoffs,
model.output.cutoffs; None = [V/4, V/2]): band 0 is ids
[0, c_1), band i is [c_i, c_{i+1}), the last ends at vocab_size. Band i gets width
dim / div_value**i, so rare tokens get fewer parameters and cost fewer FLOPs. (These options were the
ModelConfig fields model.embedding=adaptive, model.output=adaptive_softmax, model.adaptive_*: saved configs
holding them load through lm/model/upgrade.py.)

Both assume token ids are ranked by frequency (id 0 the most frequent). That holds for word-level
vocabularies sorted by count, and only approximately for BPE vocabularies: byte-level BPE ids
follow merge order (the 256 byte symbols first, then merges roughly from frequent to rare), so the
bands are only roughly frequency bands here.
"""

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from lm.config_base import ConfigError
from lm.constants import IGNORE_INDEX
from lm.model.config import ModelConfig
from lm.model.heads import LMOutput
from lm.model.init import OwnInit
from lm.model.linear import MatmulCount
from lm.model.options import EmbeddingConfig, OutputConfig, option_name
from lm.model.registry import register

# -- the option schemas (conf/model/embedding/adaptive.yaml, conf/model/output/adaptive_softmax.yaml) --------


def cutoffs_of(cutoffs: list[int] | None, vocab_size: int) -> list[int]:
    """The band edges [c_1, ..., c_n] with 0 < c_1 < ... < c_n < vocab_size: as given, or [V/4, V/2]."""
    return list(cutoffs) if cutoffs else [vocab_size // 4, vocab_size // 2]


def check_bands(where: str, cutoffs: list[int] | None, div_value: float, vocab_size: int) -> None:
    c = cutoffs_of(cutoffs, vocab_size)
    if any(not isinstance(x, int) for x in c) or c != sorted(set(c)) or c[0] < 1 or c[-1] >= vocab_size:
        raise ConfigError(
            f"model.{where}.cutoffs={c} must be increasing integers in [1, model.vocab_size={vocab_size})"
            f"; e.g. [{vocab_size // 4}, {vocab_size // 2}]"
        )
    if div_value < 1:
        raise ConfigError(f"model.{where}.div_value={div_value} must be >= 1 (1 = every band full width)")


@register("embedding")
@dataclass
class AdaptiveConfig(EmbeddingConfig):
    """model/embedding=adaptive: adaptive input embeddings (Baevski & Auli 2019)."""

    _target_: str = "lm.zoo.adaptive.AdaptiveInput"
    cutoffs: list[int] | None = None  # band edges; None = [V/4, V/2]
    div_value: float = 4.0  # band i has width dim / div_value**i

    def check(self, model: ModelConfig) -> None:
        check_bands("embedding", self.cutoffs, self.div_value, model.vocab_size)
        if model.output_tied and (model.output is None or model.output.tieable):
            out = "null (the softmax)" if model.output is None else option_name(model.output)
            raise ConfigError(
                f"model/embedding=adaptive with model.tie_embeddings=true and model/output={out}: a "
                f"banded input table cannot be a (vocab_size, dim) output matrix; set "
                f"model.tie_embeddings=false"
            )


@register("output")
@dataclass
class AdaptiveSoftmaxConfig(OutputConfig):
    """model/output=adaptive_softmax: the adaptive softmax (Grave et al. 2017) on torch's module."""

    _target_: str = "lm.zoo.adaptive.adaptive_softmax"
    cutoffs: list[int] | None = None  # band edges; None = [V/4, V/2]
    div_value: float = 4.0  # band i has width dim / div_value**i
    tail_projection: bool = True  # tail clusters project dim down first (false: none, Narang et al.'s row)
    head_bias: bool = False  # a bias on the head cluster's logits
    tieable: ClassVar[bool] = False  # torch's adaptive softmax owns its cluster weights
    option_file: ClassVar[str] = "adaptive_softmax"

    def check(self, model: ModelConfig) -> None:
        check_bands("output", self.cutoffs, self.div_value, model.vocab_size)
        super().check(model)


def band_edges(cutoffs: list[int], vocab_size: int) -> list[int]:
    """[0, c_1, ..., c_n, vocab_size]."""
    return [0, *cutoffs, vocab_size]


def band_dims(dim: int, n_cutoffs: int, div_value: float) -> list[int]:
    """Width of each band: dim / div_value**i, at least 1."""
    return [max(1, int(dim // (div_value**i))) for i in range(n_cutoffs + 1)]


class AdaptiveInput(MatmulCount, OwnInit, nn.Module):
    """Token ids -> (B, T, dim): band i looks its ids up in a (|band|, d_i) table, then projects d_i -> dim.

    Every band has a projection, the first too (as fairseq's AdaptiveInput), so each band's scale is
    learned the same way. A token goes through exactly one band's projection.
    """

    def __init__(self, cfg: ModelConfig, cutoffs: list[int] | None = None, div_value: float = 4.0):
        super().__init__()
        self.dim = cfg.dim
        cutoffs = cutoffs_of(cutoffs, cfg.vocab_size)
        self.edges = band_edges(cutoffs, cfg.vocab_size)
        dims = band_dims(cfg.dim, len(cutoffs), div_value)
        self.bands = nn.ModuleList(nn.Embedding(hi - lo, d) for lo, hi, d in zip(self.edges, self.edges[1:], dims))
        self.projs = nn.ModuleList(nn.Linear(d, cfg.dim, bias=False) for d in dims)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(*ids.shape, self.dim, dtype=self.projs[0].weight.dtype, device=ids.device)  # (B, T, D)
        for lo, hi, band, proj in zip(self.edges, self.edges[1:], self.bands, self.projs):
            in_band = (ids >= lo) & (ids < hi)
            if in_band.any():
                out[in_band] = proj(band(ids[in_band] - lo)).to(out.dtype)  # (n, d_i) -> (n, D)
        return out

    def init_weights(self, cfg: ModelConfig) -> None:
        """Band i's projection (std init_std, fan-in d_i) multiplies the scale by init_std * sqrt(d_i): start the
        projected embedding at init_std instead, with bands of std 1 / sqrt(d_i) (t5 and torch: as they are)."""
        if cfg.init in ("t5", "torch"):
            return
        with torch.no_grad():
            for band in self.bands:
                nn.init.normal_(band.weight, 0.0, 1.0 / math.sqrt(band.embedding_dim))

    def active_matmul_params(self, count) -> float:
        """For lm.model.flops: a token meets one band's projection; count the widest (band 0, the most frequent)."""
        return max(count(p) for p in self.projs)


class AdaptiveSoftmax(nn.Module):
    """torch.nn.AdaptiveLogSoftmaxWithLoss behind the LM head's interface: forward(h) gives
    log-probabilities over the whole vocabulary (they sum to 1, so evaluation and sampling work on
    them as on logits); output(h, labels) the mean negative log-likelihood over labels != -100.

    With `model.output.tail_projection=false` ("adaptive softmax without projection", Narang et
    al. 2021) the tail clusters read the hidden state directly: width dim, no down-projection.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        transform: nn.Module,
        cutoffs: list[int] | None = None,
        div_value: float = 4.0,
        tail_projection: bool = True,
        head_bias: bool = False,
    ):
        super().__init__()
        self.transform = transform
        self.logit_scale = cfg.logit_scale
        project = tail_projection
        self.asm = nn.AdaptiveLogSoftmaxWithLoss(
            cfg.dim,
            cfg.vocab_size,
            cutoffs_of(cutoffs, cfg.vocab_size),
            div_value=div_value if project else 1.0,
            head_bias=head_bias,
        )
        if not project:
            for cluster in self.asm.tail:
                cluster[0] = nn.Identity()  # div_value 1: the dim x dim projection it replaces was square

    def _hidden(self, h: torch.Tensor) -> torch.Tensor:
        return self.transform(h) * self.logit_scale

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x = self._hidden(h)
        return self.asm.log_prob(x.reshape(-1, x.shape[-1])).view(*x.shape[:-1], -1)  # (..., V)

    def output(self, h: torch.Tensor, labels: torch.Tensor | None):
        if labels is None:
            return LMOutput(logits=self(h))
        return LMOutput(loss=nll_over_labels(self._hidden(h), labels, lambda x, y: self.asm(x, y).loss))


def adaptive_softmax(cfg: ModelConfig, tied, bias: bool, transform: nn.Module, **options) -> AdaptiveSoftmax:
    """The model/output factory (output(cfg, tied, bias, transform)): no tied table (the check refuses tying),
    no bias beyond torch's own head_bias."""
    return AdaptiveSoftmax(cfg, transform, **options)


def nll_over_labels(h: torch.Tensor, labels: torch.Tensor, mean_nll) -> torch.Tensor:
    """Mean NLL over the positions whose label is not IGNORE_INDEX, as F.cross_entropy(ignore_index=-100)
    averages: the loop's token weighting of micro-batches (lm/core/objectives.py) relies on that."""
    x, y = h.reshape(-1, h.shape[-1]), labels.reshape(-1)  # (N, D), (N,)
    keep = y != IGNORE_INDEX
    # This sync stays: x[keep] and torch's adaptive softmax (its per-cluster nonzero) read the device anyway.
    if not bool(keep.any()):
        return (x.sum() * 0.0).float()  # a micro-batch without targets: zero loss, graph intact
    return mean_nll(x[keep], y[keep])
