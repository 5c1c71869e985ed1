"""The Evolved Transformer's cells (So et al. 2019): model/block=evolved.

The searched cells put extra sub-layers in front of the standard self-attention / FFN pair. In the
one-block design they are the Block's `prelude` (lm/model/block.py): each prelude module is one more
residual sub-layer with its own norm, run before the self-attention; the rest of the block is the
usual self-attention (model/attn), cross-attention and FFN. Sub-layer sequences, following the
reference implementation (tensor2tensor's evolved_transformer.py), with d = model.dim, H = model.n_heads:

encoder cell (bidirectional stacks)
  1. GLU:            x W_v * sigmoid(x W_g)                                         (d -> d)
  2. conv branches:  relu(x W: d -> 4d)  +  relu(Conv 3x1: d -> d/2, zero-padded to 4d)
                     -> norm(4d) -> SepConv 9x1: 4d -> d/2, zero-padded to d
  3. self-attention (H heads)                        [Block.self_attn]
  4. FFN (model/ffn)                                 [Block.ffn]

decoder cell (causal stacks)
  1. branched attention: self-attention with 2H heads of Dh/2  +  cross-attention to the encoder
     memory with H heads (only in an encoder-decoder), summed
  2. conv branches:  relu(SepConv 11x1: d -> 2d)  +  SepConv 7x1: d -> d/2, zero-padded to 2d
                     -> norm(2d) -> SepConv 7x1: 2d -> d
  3. self-attention (H heads)                        [Block.self_attn]
  4. cross-attention (encoder-decoder only)           [Block.cross_attn]
  5. Swish FFN: x W1 (d -> 4d) -> swish -> norm(4d) -> W2 (4d -> d)   [Block.ffn]

Every convolution of the decoder cell is causal (left-padded by K - 1): no position sees a later one.
The encoder's are centred ("SAME"). Padded positions are zeroed before each convolution, as the
reference does, so padding reaches no real token. The convolutions keep no state between calls, so
the decoder cell has no KV cache (`kv_cache = False`: the stack's new_cache() is None) and lm.model.generate
reruns the whole sequence at each step.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from lm.config_base import ConfigError
from lm.model.attention import CrossAttention, SelfAttention, key_keep
from lm.model.choices import Arch
from lm.model.linear import Linear, MatmulCount
from lm.model.options import BlockConfig, MoEConfig, RoPEConfig, option_name
from lm.model.registry import register
from lm.model.stack import BlockParts
from lm.zoo.residual import FixupBranch

NO_CACHE = (
    "model/block=evolved has no KV cache for its convolution and branched-attention sub-layers; "
    "pass cache=None (lm.model.generate does: the model's new_cache() is None) or use the vanilla block"
)


@register("block")
@dataclass
class EvolvedConfig(BlockConfig):
    """model/block=evolved: the encoder and decoder cells above, in every block."""

    _target_: str = "lm.zoo.evolved.evolved_block"

    def check(self, model) -> None:
        name = "model/block=evolved"
        self.refuse_query_pooling(model)
        if model.arch != Arch.encoder and isinstance(model.ffn, MoEConfig):
            raise ConfigError(
                f"{name}: the decoder cell's FFN is the paper's Swish FFN, so model/ffn=moe|switch "
                f"would not be used in it; use it with model.arch=encoder or drop it"
            )
        if model.dim % 2 or model.d_head % 2:
            raise ConfigError(
                f"{name} needs an even model.dim (its d/2-wide convolution branches) and an even head "
                f"size (its decoder cell's first attention has 2 x n_heads heads of head_dim / 2): "
                f"got dim={model.dim}, head_dim={model.d_head}"
            )
        if model.arch != Arch.encoder and isinstance(model.pos, RoPEConfig):
            raise ConfigError(
                f"{name} with model/pos={option_name(model.pos)}: the decoder cell's branched attention has "
                f"2 x n_heads heads of head_dim / 2, which the rotation (built for head_dim) does not fit; use "
                f"model/pos=learned, sinusoidal, alibi, t5_bias or none, or model.arch=encoder"
            )


def evolved_block(parts: BlockParts) -> nn.Module:
    """Sub-layers before self-attention (the prelude); in causal stacks the decoder cell's Swish FFN."""
    cfg, causal = parts.cfg, parts.causal
    cross_attn = parts.cross_attention()
    wide = (2 * cfg.n_heads, 2 * cfg.kv_heads, cfg.d_head // 2)
    cells = prelude(
        causal,
        cfg.dim,
        cfg.bias,
        cfg.dropout,
        parts.norm,
        wide_self_attn=lambda: parts.attention(heads=wide),
        cross_attn=parts.cross_attention,
    )
    ffn = SwishFFN(cfg.dim, parts.ffn_bias, cfg.dropout, parts.norm) if causal else parts.ffn()
    return parts.block(parts.attention(), ffn, cross_attn, prelude=cells)


def _keep_only_tokens(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    keep = key_keep(mask, x.shape[1])  # (B, T) or None
    return x if keep is None else x * keep[:, :, None].to(x.dtype)


def _widen(x: torch.Tensor, width: int) -> torch.Tensor:
    """Zero-pad the channels to `width`, how the reference adds branches of different widths."""
    return F.pad(x, (0, width - x.shape[-1]))


class SeparableConv1d(MatmulCount, nn.Module):
    """Depthwise K-tap convolution per channel, then a pointwise (1x1) projection (Chollet 2017)."""

    def __init__(self, d_in: int, d_out: int, kernel_size: int, causal: bool, bias: bool = True):
        super().__init__()
        self.depthwise = nn.Conv1d(d_in, d_in, kernel_size, groups=d_in, bias=False)
        self.pointwise = Linear(d_in, d_out, bias=bias)
        self.pad = (kernel_size - 1, 0) if causal else ((kernel_size - 1) // 2, kernel_size // 2)  # causal / "SAME"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.pad(x.transpose(1, 2), self.pad)  # (B, T, C) -> (B, C, T + K - 1)
        return self.pointwise(self.depthwise(h).transpose(1, 2))  # (B, C, T) -> (B, T, d_out)

    def active_matmul_params(self, count) -> float:
        # per token: K multiply-adds per input channel (depthwise), then the pointwise matrix
        return self.depthwise.weight.numel() + count(self.pointwise)


class Conv1d(MatmulCount, nn.Module):
    """A full K-tap convolution d_in -> d_out ("SAME" padding when not causal)."""

    def __init__(self, d_in: int, d_out: int, kernel_size: int, causal: bool, bias: bool = True):
        super().__init__()
        self.conv = nn.Conv1d(d_in, d_out, kernel_size, bias=bias)
        self.pad = (kernel_size - 1, 0) if causal else ((kernel_size - 1) // 2, kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x.transpose(1, 2), self.pad)).transpose(1, 2)  # (B, T, d_in) -> (B, T, d_out)

    def active_matmul_params(self, count) -> float:
        return self.conv.weight.numel()  # each output position is a (d_out, d_in * K) matrix product


class GLUSublayer(FixupBranch, nn.Module):
    """Encoder step 1: x W_v * sigmoid(x W_g) (Dauphin et al. 2017)."""

    fixup_depth = 1  # model/norm=fixup (lm/zoo/residual.py): one layer, which starts at 0

    def fixup_last(self) -> list[nn.Module]:
        return [self.proj]

    def __init__(self, dim: int, bias: bool):
        super().__init__()
        self.proj = Linear(dim, 2 * dim, bias=bias)

    def forward(self, x, causal, mask, pos, memory=None, memory_mask=None, cache=None):
        return F.glu(self.proj(x), dim=-1)  # (B, T, 2d) -> (B, T, d): first half gated by the second


class EncoderConvBranches(FixupBranch, nn.Module):
    """Encoder step 2: wide ReLU dense | 3x1 ReLU conv, summed, normed, then a 9x1 separable conv."""

    fixup_depth = 3  # model/norm=fixup: dense | conv, then the separable conv's depthwise and pointwise layers

    def fixup_last(self) -> list[nn.Module]:
        return [self.sep.pointwise]

    def __init__(self, dim: int, bias: bool, dropout: float, norm: Callable[[int], nn.Module]):
        super().__init__()
        self.left = Linear(dim, 4 * dim, bias=bias)
        self.right = Conv1d(dim, dim // 2, 3, causal=False, bias=bias)
        self.norm = norm(4 * dim)
        self.sep = SeparableConv1d(4 * dim, dim // 2, 9, causal=False, bias=bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, causal, mask, pos, memory=None, memory_mask=None, cache=None):
        x = _keep_only_tokens(x, mask)
        left = self.drop(F.relu(self.left(x)))  # (B, T, 4d)
        right = self.drop(F.relu(self.right(x)))  # (B, T, d/2)
        h = _keep_only_tokens(self.norm(left + _widen(right, left.shape[-1])), mask)
        return _widen(self.sep(h), x.shape[-1])  # (B, T, d/2) -> (B, T, d)


class DecoderConvBranches(FixupBranch, nn.Module):
    """Decoder step 2: 11x1 ReLU | 7x1 separable convs, summed, normed, then a 7x1 separable conv; causal."""

    fixup_depth = 4  # model/norm=fixup: two separable convs in series, each depthwise then pointwise
    kv_cache = False  # no state between calls: the stack's new_cache() is None (lm/model/stack.py)

    def fixup_last(self) -> list[nn.Module]:
        return [self.sep.pointwise]

    def __init__(self, dim: int, bias: bool, dropout: float, norm: Callable[[int], nn.Module]):
        super().__init__()
        self.left = SeparableConv1d(dim, 2 * dim, 11, causal=True, bias=bias)
        self.right = SeparableConv1d(dim, dim // 2, 7, causal=True, bias=bias)
        self.norm = norm(2 * dim)
        self.sep = SeparableConv1d(2 * dim, dim, 7, causal=True, bias=bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, causal, mask, pos, memory=None, memory_mask=None, cache=None):
        if cache is not None:
            raise ValueError(NO_CACHE)
        x = _keep_only_tokens(x, mask)
        left = self.drop(F.relu(self.left(x)))  # (B, T, 2d)
        right = self.drop(self.right(x))  # (B, T, d/2)
        h = _keep_only_tokens(self.norm(left + _widen(right, left.shape[-1])), mask)
        return self.sep(h)  # (B, T, d)


def _per_narrow_head(mask: torch.Tensor | None, n_heads: int) -> torch.Tensor | None:
    """A per-head score bias (T5's relative bias, ALiBi) is built for the model's H heads; the branched
    attention has 2H heads of Dh/2, so each pair of narrow heads takes the bias of the head it halves."""
    if mask is None or mask.dim() != 4 or mask.shape[1] in (1, n_heads):
        return mask
    return mask.repeat_interleave(n_heads // mask.shape[1], dim=1)  # (B, H, Tq, Tk) -> (B, 2H, Tq, Tk)


class BranchedAttention(FixupBranch, nn.Module):
    """Decoder step 1: self-attention with 2H heads, plus H-head attention to the encoder memory when
    the block has cross-attention."""

    fixup_depth = 4  # model/norm=fixup: attention's W_Q, W_K, W_V, W_O, as for the block's own
    kv_cache = False  # its 2H narrow heads and the cell around them keep no cache

    def __init__(self, self_attn: SelfAttention, cross_attn: CrossAttention | None):
        super().__init__()
        self.self_attn, self.cross_attn = self_attn, cross_attn

    def forward(self, x, causal, mask, pos, memory=None, memory_mask=None, cache=None):
        if cache is not None:
            raise ValueError(NO_CACHE)
        y = self.self_attn(x, causal, _per_narrow_head(mask, self.self_attn.n_heads), pos)
        if self.cross_attn is not None:
            y = y + self.cross_attn(x, memory, memory_mask)
        return y


class SwishFFN(nn.Module):
    """Decoder step 5: x W1 (d -> 4d) -> swish -> norm -> W2 (4d -> d)."""

    def __init__(self, dim: int, bias: bool, dropout: float, norm: Callable[[int], nn.Module]):
        super().__init__()
        self.up = Linear(dim, 4 * dim, bias=bias)
        self.norm = norm(4 * dim)
        self.down = Linear(4 * dim, dim, bias=bias, residual=True)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.norm(self.drop(F.silu(self.up(x)))))


def prelude(
    causal: bool,
    dim: int,
    bias: bool,
    dropout: float,
    norm: Callable[[int], nn.Module],
    wide_self_attn: Callable[[], SelfAttention],
    cross_attn: Callable[[], CrossAttention | None],
) -> list[nn.Module]:
    """The sub-layers an evolved cell runs before the block's self-attention."""
    if not causal:
        return [GLUSublayer(dim, bias), EncoderConvBranches(dim, bias, dropout, norm)]
    return [BranchedAttention(wide_self_attn(), cross_attn()), DecoderConvBranches(dim, bias, dropout, norm)]
