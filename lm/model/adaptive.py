"""Adaptive input embeddings (Baevski & Auli 2019) and the adaptive softmax (Grave et al. 2017).

Both split the vocabulary into bands by `model.adaptive_cutoffs` [c_1, ..., c_n]: band 0 is ids
[0, c_1), band i is [c_i, c_{i+1}), the last ends at vocab_size. Band i gets width
dim / div_value**i, so rare tokens get fewer parameters and cost fewer FLOPs.

Both assume token ids are ranked by frequency (id 0 the most frequent). That holds for word-level
vocabularies sorted by count, and only approximately for BPE vocabularies: byte-level BPE ids
follow merge order (the 256 byte symbols first, then merges roughly from frequent to rare), so the
bands are only roughly frequency bands here.
"""

import math
from typing import List, Optional

import torch
from torch import nn

from lm.constants import IGNORE_INDEX
from lm.model.config import ModelConfig
from lm.model.heads import LMOutput
from lm.model.init import OwnInit
from lm.model.linear import MatmulCount


def band_edges(cfg: ModelConfig) -> List[int]:
    """[0, c_1, ..., c_n, vocab_size]."""
    return [0, *cfg.cutoffs, cfg.vocab_size]


def band_dims(cfg: ModelConfig) -> List[int]:
    """Width of each band: dim / div_value**i, at least 1."""
    return [max(1, int(cfg.dim // (cfg.adaptive_div_value ** i))) for i in range(len(cfg.cutoffs) + 1)]


class AdaptiveInput(MatmulCount, OwnInit, nn.Module):
    """Token ids -> (B, T, dim): band i looks its ids up in a (|band|, d_i) table, then projects d_i -> dim.

    Every band has a projection, the first too (as fairseq's AdaptiveInput), so each band's scale is
    learned the same way. A token goes through exactly one band's projection.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dim = cfg.dim
        self.edges = band_edges(cfg)
        dims = band_dims(cfg)
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

    With `model.adaptive_tail_projection=false` ("adaptive softmax without projection", Narang et
    al. 2021) the tail clusters read the hidden state directly: width dim, no down-projection.
    """

    def __init__(self, cfg: ModelConfig, transform: nn.Module):
        super().__init__()
        self.transform = transform
        self.logit_scale = cfg.logit_scale
        project = cfg.adaptive_tail_projection
        self.asm = nn.AdaptiveLogSoftmaxWithLoss(cfg.dim, cfg.vocab_size, cfg.cutoffs,
                                                 div_value=cfg.adaptive_div_value if project else 1.0,
                                                 head_bias=cfg.adaptive_head_bias)
        if not project:
            for cluster in self.asm.tail:
                cluster[0] = nn.Identity()  # div_value 1: the dim x dim projection it replaces was square

    def _hidden(self, h: torch.Tensor) -> torch.Tensor:
        return self.transform(h) * self.logit_scale

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x = self._hidden(h)
        return self.asm.log_prob(x.reshape(-1, x.shape[-1])).view(*x.shape[:-1], -1)  # (..., V)

    def output(self, h: torch.Tensor, labels: Optional[torch.Tensor]):
        if labels is None:
            return LMOutput(logits=self(h))
        return LMOutput(loss=nll_over_labels(self._hidden(h), labels, lambda x, y: self.asm(x, y).loss))


def nll_over_labels(h: torch.Tensor, labels: torch.Tensor, mean_nll) -> torch.Tensor:
    """Mean NLL over the positions whose label is not IGNORE_INDEX, as F.cross_entropy(ignore_index=-100)
    averages: the loop's token weighting of micro-batches (lm/core/objectives.py) relies on that."""
    x, y = h.reshape(-1, h.shape[-1]), labels.reshape(-1)  # (N, D), (N,)
    keep = y != IGNORE_INDEX
    # This sync stays: x[keep] and torch's adaptive softmax (its per-cluster nonzero) read the device anyway.
    if not bool(keep.any()):
        return (x.sum() * 0.0).float()  # a micro-batch without targets: zero loss, graph intact
    return mean_nll(x[keep], y[keep])
