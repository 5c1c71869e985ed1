"""Funnel Transformer encoder (Dai et al. 2020): `model.funnel.blocks=[2,2,2]`.

The encoder's blocks are grouped; before each group after the first the sequence is mean-pooled by 2
(stride 2, window 2) with query pooling: that group's first block attends from the pooled queries
over the unpooled keys and values, and its residual stream continues from the pooled states
(Block's `pool` argument). Token-level outputs (MLM; an encoder-decoder's memory) up-sample the last
group's output by repetition to the full length, add the first group's output, and refine with
funnel.decoder_layers ordinary blocks (paper section 2.2). Classification reads only the pooled path
(`pooled_forward`), so the up-sampling blocks do not run.

Padding: pooling averages only the real tokens of each pair, and a pooled position is real when
either of its pair is, so pads never leak into real positions and no real token is lost.
Positions enter as embeddings (learned, sinusoidal, none) before the first block; schemes acting
inside attention (RoPE, ALiBi, T5 bias) would need pooled positions and are refused.
"""

from typing import Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from lm.config_base import ConfigError
from lm.model.attention import build_mask
from lm.model.config import ModelConfig
from lm.model.position import PositionScheme
from lm.model.stack import Components, Stack


def pair_weights(keep: torch.Tensor) -> torch.Tensor:
    """keep: (B, T) 1 for real tokens -> (B, ceil(T/2), 2) weights of each pair's masked mean."""
    keep = F.pad(keep.float(), (0, keep.shape[1] % 2))  # an odd tail pairs with a pad
    pairs = keep.unflatten(1, (-1, 2))  # (B, T2, 2)
    return pairs / pairs.sum(-1, keepdim=True).clamp(min=1)


def pool(t: torch.Tensor, weights: torch.Tensor, dim: int) -> torch.Tensor:
    """Masked mean of adjacent pairs along `dim` (the sequence axis, dim >= 1; batch first)."""
    t = F.pad(t, (0, 0) * (t.ndim - dim - 1) + (0, t.shape[dim] % 2))
    t = t.unflatten(dim, (-1, 2))  # (..., T, ...) -> (..., T2, 2, ...)
    w = weights.view(weights.shape[0], *[1] * (dim - 1), *weights.shape[1:], *[1] * (t.ndim - dim - 2))
    return (t * w.to(t.dtype)).sum(dim + 1)


def stack_class(cfg: ModelConfig):
    """The encoder's stack: a Funnel when model.funnel.blocks is set."""
    return FunnelStack if cfg.funnel.blocks else Stack


class FunnelStack(Stack):
    """Stack whose blocks are funnel.blocks pooled groups, then funnel.decoder_layers full-length blocks."""

    def __init__(self, cfg: ModelConfig, c: Components, n_layers: int, causal: bool, cross: bool = False):
        if causal or cross:
            raise ConfigError("model.funnel.blocks is for the encoder stack only (bidirectional, no cross-attention)")
        super().__init__(cfg, c, n_layers + cfg.funnel.decoder_layers, causal=False)
        hooks = [name for name in ("rotary", "score_bias")
                 if getattr(type(self.pos), name) is not getattr(PositionScheme, name)]
        if hooks:
            raise ConfigError(f"model.funnel.blocks needs positions added to the embeddings (model/pos=learned, "
                              f"sinusoidal or none); {cfg.pos._target_} acts inside attention ({hooks[0]})")
        self.groups: List[int] = list(cfg.funnel.blocks)

    def _encode(self, x: torch.Tensor, padding: Optional[torch.Tensor]):
        """Embedded tokens (B, T, D) -> (last group's output (B, T', D), its padding, first group's output)."""
        positions = torch.arange(x.shape[1], device=x.device)
        x = self.drop(self.embed_norm(self.pos.embed(x, positions)))
        keep = padding if padding is not None else torch.ones(x.shape[:2], device=x.device)
        mask = build_mask(False, positions, positions, padding)
        rotate = self.pos.rotary(positions)  # the identity: checked at build
        i, first = 0, None
        for g, n_blocks in enumerate(self.groups):
            for j in range(n_blocks):
                if g and not j:
                    x, keep, padding, mask = self._pooling_block(self.blocks[i], x, keep, padding)
                else:
                    x = self.run_block(self.blocks[i], x, mask, rotate, padding=padding)
                i += 1
            first = x if first is None else first
        return x, padding, first

    def _pooling_block(self, block, x, keep, padding):
        """Query pooling: pooled queries attend over the unpooled keys/values; the output is (B, ceil(T/2), D)."""
        weights = pair_weights(keep)  # (B, T2, 2)
        q_pos = torch.arange(weights.shape[1], device=x.device)
        k_pos = torch.arange(x.shape[1], device=x.device)
        pooled_queries: Callable = lambda q, k: (pool(q, weights, 2), k)  # q (B, H, T, Dh) -> (B, H, T2, Dh)
        pooled_keep = (weights.sum(-1) > 0).to(keep.dtype)  # (B, T2): real if either of the pair is
        pooled_padding = None if padding is None else pooled_keep.to(padding.dtype)
        x = self.run_block(block, x, build_mask(False, q_pos, k_pos, padding), pooled_queries,
                           pool=lambda h: pool(h, weights, 1), padding=pooled_padding)
        return x, pooled_keep, pooled_padding, build_mask(False, q_pos, q_pos, pooled_padding)

    def forward(self, x: torch.Tensor, padding: Optional[torch.Tensor] = None, memory=None, memory_padding=None,
                cache=None) -> torch.Tensor:
        """Token-level outputs (B, T, D): up-sampled last group + first group, then the decoder blocks."""
        if cache is not None or memory is not None:
            raise ValueError("a Funnel encoder takes no cache or memory")
        T = x.shape[1]
        h, _, first = self._encode(x, padding)
        h = h.repeat_interleave(2 ** (len(self.groups) - 1), dim=1)[:, :T] + first  # (B, T', D) -> (B, T, D)
        positions = torch.arange(T, device=x.device)
        mask, rotate = build_mask(False, positions, positions, padding), self.pos.rotary(positions)
        for block in self.blocks[sum(self.groups):]:
            h = self.run_block(block, h, mask, rotate, padding=padding)
        return self.final_norm(h)

    def pooled_forward(self, x: torch.Tensor, padding: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Classification: the pooled path only, (B, T / 2**(groups-1), D) and its padding."""
        h, padding, _ = self._encode(x, padding)
        return self.final_norm(h), padding

    def active_matmul_params(self, count: Callable[[nn.Module], float]) -> float:
        """Matmul weights per input token (lm/model/flops.py): each block scaled by its token fraction; a
        pooling block projects q, k, v before pooling, on twice its output's tokens."""
        total = sum(count(m) for name, m in self.named_children() if name != "blocks")
        starts = pooling_blocks(self.groups)
        for i, (block, f) in enumerate(zip(self.blocks, token_fractions(self.groups, len(self.blocks)))):
            total += f * count(block) + (f * count(block.self_attn.qkv) if i in starts else 0.0)
        return total


def pooling_blocks(groups: List[int]) -> set:
    """Indices of the blocks that pool (the first of every group after the first)."""
    return {sum(groups[:g]) for g in range(1, len(groups))}


def token_fractions(groups: List[int], n_blocks: int) -> List[float]:
    """Per block, its tokens per input token: 1/2**g in group g, 1 in the up-sampling blocks."""
    fractions = [2.0 ** -g for g, n in enumerate(groups) for _ in range(n)]
    return fractions + [1.0] * (n_blocks - len(fractions))


def attention_layers(cfg: ModelConfig) -> float:
    """The Funnel encoder's attention cost in full-length layers: a block of group g has T/2**g queries over
    T/2**g keys, a pooling block T/2**g queries over T/2**(g-1) keys, an up-sampling block T over T."""
    groups = list(cfg.funnel.blocks)
    starts = pooling_blocks(groups)
    fractions = token_fractions(groups, sum(groups) + cfg.funnel.decoder_layers)
    return sum(f * (2 * f if i in starts else f) for i, f in enumerate(fractions))
