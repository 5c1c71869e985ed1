"""Product-key memory (Lample et al. 2019), in place of the FFN of the blocks in `layers`:
model/block=pkm model.block.layers=[1].

A memory of n_keys**2 value vectors addressed by product keys: each head's query (k_dim) is split in
two halves, each half scored against its own n_keys sub-keys; the key of slot (i, j) is the
concatenation of sub-key i of the first set and sub-key j of the second, so its score is
s1[i] + s2[j]. The top-k of all n_keys**2 sums lies among the top-k of each half (a pair outside
them is beaten by k pairs inside), so the exact top-k costs two n_keys scorings and a k x k search
instead of n_keys**2 (paper section 3.2). The k best slots' values are summed with softmax weights
(an EmbeddingBag), and heads' reads are summed.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from lm.config_base import ConfigError
from lm.model.block import TokenRouter
from lm.model.choices import Arch
from lm.model.linear import Linear, MatmulCount
from lm.model.options import BlockConfig, positive
from lm.model.registry import register
from lm.model.stack import BlockParts


@register("block")
@dataclass
class PKMConfig(BlockConfig):
    """model/block=pkm: the vanilla block, with a product-key memory in place of the FFN of the blocks in
    `layers` (0-based, in each stack). The memory has n_keys**2 values; each head scores two sets of n_keys
    sub-keys with the two halves of its query and reads the top_k best of their products."""

    _target_: str = "lm.zoo.pkm.pkm_block"
    layers: list[int] = field(default_factory=lambda: [0])  # the first block: every model has one
    n_keys: int = 64  # sub-keys per half
    heads: int = 4
    k_dim: int = 64  # query size per head (each half is k_dim / 2)
    top_k: int = 8
    query_batchnorm: bool = False  # BatchNorm on the queries (the paper's choice for better key usage); encoders only

    def check(self, model) -> None:
        depths = [model.n_layers] + ([model.decoder_layers] if model.arch == Arch.encoder_decoder else [])
        if model.stack is not None:  # a stack option may build more blocks than layers (Funnel's up-sampling)
            depths = [model.stack.layer_indices(n) for n in depths]
        depth = max(depths)
        if (
            not self.layers
            or [i for i in self.layers if not 0 <= i < depth]
            or len(set(self.layers)) != len(self.layers)
        ):
            raise ConfigError(f"model.block.layers={list(self.layers)} must be distinct block indices in [0, {depth})")
        for name in ("n_keys", "heads", "k_dim", "top_k"):
            positive(f"block.{name}", getattr(self, name))
        if self.k_dim % 2:
            raise ConfigError(f"model.block.k_dim={self.k_dim} must be even: the query is split into two halves")
        if self.top_k > self.n_keys:
            raise ConfigError(f"model.block.top_k={self.top_k} must be <= model.block.n_keys={self.n_keys}")
        if self.query_batchnorm and model.arch != Arch.encoder:
            # training's batch statistics mix every position's query into every other's, later ones too
            raise ConfigError(
                f"model.block.query_batchnorm=true with model.arch={model.arch}: BatchNorm's training statistics "
                f"would let a token see later tokens of its causal stack; set it false or use model.arch=encoder"
            )


def pkm_block(
    parts: BlockParts, layers: list[int], n_keys: int, heads: int, k_dim: int, top_k: int, query_batchnorm: bool
) -> nn.Module:
    """The vanilla block; in the listed layers the FFN slot holds the memory."""
    cross_attn = parts.cross_attention()
    if parts.layer in layers:
        ffn = ProductKeyMemory(
            parts.cfg.dim, n_keys, heads, k_dim, top_k, query_batchnorm, parts.ffn_bias, parts.cfg.dropout
        )
    else:
        ffn = parts.ffn()
    return parts.block(parts.attention(), ffn, cross_attn)


def product_topk(s1: torch.Tensor, s2: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """s1, s2: (..., n) half scores -> top-k (scores, slot = i * n + j) of s1[i] + s2[j] over all n**2 pairs."""
    n = s1.shape[-1]
    v1, i1 = s1.topk(k, dim=-1)  # (..., k)
    v2, i2 = s2.topk(k, dim=-1)
    pair = (v1[..., :, None] + v2[..., None, :]).flatten(-2)  # (..., k, k) -> (..., k*k)
    scores, best = pair.topk(k, dim=-1)  # (..., k)
    slot = i1.gather(-1, best // k) * n + i2.gather(-1, best % k)
    return scores, slot


class ProductKeyMemory(MatmulCount, TokenRouter):
    """A TokenRouter so the block passes its padding: BatchNorm's training statistics come from the real
    tokens' queries only, or a batch's pads would shift every real token's read."""

    def __init__(
        self,
        dim: int,
        n_keys: int = 64,
        heads: int = 4,
        k_dim: int = 64,
        top_k: int = 8,
        query_batchnorm: bool = False,
        bias: bool = True,
        dropout: float = 0.0,
    ):
        super().__init__()
        self.n_keys, self.heads, self.k_dim, self.top_k = n_keys, heads, k_dim, top_k
        self.query = Linear(dim, heads * k_dim, bias=bias)
        # BatchNorm on the queries spreads them over the keys (paper section 4.5: better key usage).
        self.query_norm = nn.BatchNorm1d(heads * k_dim) if query_batchnorm else nn.Identity()
        # (heads, 2 halves, n_keys, k_dim / 2); uniform init as the paper's code (1/sqrt(half))
        bound = 1 / math.sqrt(k_dim // 2)
        self.keys = nn.Parameter(torch.empty(heads, 2, n_keys, k_dim // 2).uniform_(-bound, bound))
        self.values = nn.EmbeddingBag(n_keys**2, dim, mode="sum")
        nn.init.normal_(self.values.weight, 0.0, dim**-0.5)
        self.dropout = nn.Dropout(dropout)

    def lookup(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q: (N, heads, k_dim) -> (scores, slots), each (N, heads, top_k)."""
        q1, q2 = q.chunk(2, dim=-1)  # 2 x (N, H, k_dim/2)
        s1 = torch.einsum("nhd,hkd->nhk", q1, self.keys[:, 0])  # (N, H, n_keys)
        s2 = torch.einsum("nhd,hkd->nhk", q2, self.keys[:, 1])
        return product_topk(s1, s2, self.top_k)

    def forward(self, x: torch.Tensor, padding: torch.Tensor | None = None, causal: bool = False) -> torch.Tensor:
        """x: (B, T, D); padding: (B, T), 1 for tokens and 0 for pads; causal: unused (the check refuses
        query_batchnorm there, and without it each token reads the memory alone)."""
        B, T, D = x.shape
        q = self._normed_queries(self.query(x.reshape(B * T, D)), padding)  # (N, H*k_dim)
        scores, slots = self.lookup(q.view(B * T, self.heads, self.k_dim))  # (N, H, k)
        weights = F.softmax(scores.float(), dim=-1).to(x.dtype)
        # every head's k slots in one bag per token: sum over heads of each head's weighted read
        out = self.values(slots.reshape(B * T, -1), per_sample_weights=weights.reshape(B * T, -1))  # (N, D)
        return self.dropout(out).view(B, T, D)

    def _normed_queries(self, q: torch.Tensor, padding: torch.Tensor | None) -> torch.Tensor:
        """BatchNorm (if any) of the (N, H*k_dim) queries, its training statistics over the real tokens only;
        pads get zero queries (their outputs are never read). Evaluation's running statistics are per token."""
        if padding is None or not self.training or not isinstance(self.query_norm, nn.BatchNorm1d):
            return self.query_norm(q)
        real = padding.reshape(-1).bool()  # (N,); indexing by it syncs with the host (an opt-in option)
        return q.new_zeros(q.shape).index_put((real,), self.query_norm(q[real]))

    def active_matmul_params(self, count: Callable[[nn.Module], float]) -> float:
        """Per-token multiply-adds as matmul weights (lm/model/flops.py): the query projection, the
        2 x n_keys sub-key scores of k_dim/2 per head, and the heads * top_k value rows read."""
        return (
            count(self.query)
            + self.heads * self.n_keys * self.k_dim
            + self.heads * self.top_k * self.values.embedding_dim
        )
