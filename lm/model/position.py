"""Position schemes: the `model/pos` config group.

A scheme is a component with three hooks, so neither the block nor attention branches on its
type: `embed` adds to the token embeddings (learned, sinusoidal), `rotary` returns a
function that rotates q and k (RoPE), `score_bias` returns an additive attention bias (ALiBi, T5).
Every scheme is built as `pos(dim, n_heads, head_dim, max_seq_len, causal)`; the option file
holds only its own hyperparameters. Positions are absolute indices (T,), so a KV cache simply
continues them.
"""

import math
from collections.abc import Callable

import torch
from torch import nn

Rotate = Callable[[torch.Tensor, torch.Tensor], tuple]


def _no_rotation(q: torch.Tensor, k: torch.Tensor) -> tuple:
    return q, k


class PositionScheme(nn.Module):
    """Base: no position information at all (the `none` option, e.g. NoPE ablations)."""

    def __init__(self, dim: int, n_heads: int, head_dim: int, max_seq_len: int, causal: bool):
        super().__init__()
        self.max_seq_len = max_seq_len

    def check_length(self, n: int) -> None:
        """Refuse positions 0..n-1 that the scheme cannot represent (a host-side check: no device sync)."""

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return x

    def rotary(self, positions: torch.Tensor, length: int | None = None) -> Rotate:
        """length: positions[-1] + 1 as a host integer when the caller knows it (as check_length's n)."""
        return _no_rotation

    def score_bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        return None


class NoPosition(PositionScheme):
    pass


class _Table(PositionScheme):
    """Shared bounds check for schemes with a finite position table."""

    def check_length(self, n: int) -> None:
        if n > self.max_seq_len:
            raise ValueError(
                f"position {n - 1} is past the position table of {self.max_seq_len}; "
                f"raise model.max_seq_len or shorten the sequence"
            )


class Learned(_Table):
    """Learned absolute position embeddings (GPT-2, BERT)."""

    def __init__(self, dim, n_heads, head_dim, max_seq_len, causal):
        super().__init__(dim, n_heads, head_dim, max_seq_len, causal)
        self.table = nn.Embedding(max_seq_len, dim)

    def embed(self, x, positions):
        return x + self.table(positions)  # (B, T, D) + (T, D)


class Sinusoidal(_Table):
    """Fixed sinusoids of geometric wavelengths (Vaswani et al. 2017, section 3.5)."""

    def __init__(self, dim, n_heads, head_dim, max_seq_len, causal, base: float = 10000.0):
        super().__init__(dim, n_heads, head_dim, max_seq_len, causal)
        pos = torch.arange(max_seq_len, dtype=torch.float32)[:, None]  # (T, 1)
        inv_freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(base) / dim))  # (ceil(D/2),)
        table = torch.zeros(max_seq_len, dim)  # (T, D): sin in the even channels, cos in the odd ones
        table[:, 0::2] = torch.sin(pos * inv_freq)
        table[:, 1::2] = torch.cos(pos * inv_freq[: dim // 2])
        self.register_buffer("table", table, persistent=False)

    def embed(self, x, positions):
        return x + self.table[positions].to(x.dtype)  # (B, T, D) + (T, D)


ROPE_SCALINGS = (None, "linear", "dynamic", "llama3")


def rope_inv_freq(theta: float, head_dim: int) -> torch.Tensor:
    """theta^(-2i/Dh) for i < Dh/2: the rotation speed of each pair of channels."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))  # (Dh/2,)


def llama3_inv_freq(
    inv_freq: torch.Tensor, factor: float, low_freq_factor: float, high_freq_factor: float, original_max_seq_len: int
) -> torch.Tensor:
    """Llama 3.1's frequency-dependent scaling: wavelengths longer than original/low_freq_factor are slowed
    by `factor`, shorter than original/high_freq_factor kept, and the band between interpolated."""
    wavelen = 2 * math.pi / inv_freq
    low_wavelen, high_wavelen = original_max_seq_len / low_freq_factor, original_max_seq_len / high_freq_factor
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_max_seq_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


class RoPE(PositionScheme):
    """Rotary embeddings (Su et al. 2021), half-split layout as in Hugging Face Llama/GPT-NeoX.

    `scaling` stretches the context a model was trained on (`original_max_seq_len`, default
    max_seq_len) by `factor`: "linear" divides every frequency by it (position interpolation,
    Chen et al. 2023), "llama3" only the low ones (Llama 3.1), "dynamic" raises theta once a
    sequence is longer than original_max_seq_len (dynamic NTK; recomputed per call from the
    furthest position, where Hugging Face keeps the longest length seen in a stateful cache).
    """

    def __init__(
        self,
        dim,
        n_heads,
        head_dim,
        max_seq_len,
        causal,
        theta: float = 10000.0,
        scaling: str | None = None,
        factor: float = 1.0,
        low_freq_factor: float = 1.0,
        high_freq_factor: float = 4.0,
        original_max_seq_len: int | None = None,
    ):
        super().__init__(dim, n_heads, head_dim, max_seq_len, causal)
        if scaling not in ROPE_SCALINGS:
            raise ValueError(f"model.pos.scaling={scaling!r} is not one of {list(ROPE_SCALINGS)}")
        self.theta, self.head_dim, self.scaling, self.factor = theta, head_dim, scaling, factor
        self.original_max_seq_len = original_max_seq_len or max_seq_len
        inv_freq = rope_inv_freq(theta, head_dim)
        if scaling == "linear":
            inv_freq = inv_freq / factor
        elif scaling == "llama3":
            inv_freq = llama3_inv_freq(inv_freq, factor, low_freq_factor, high_freq_factor, self.original_max_seq_len)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def _dynamic_inv_freq(self, seq_len: int) -> torch.Tensor:
        # NTK-aware base for the current length (as transformers' _compute_dynamic_ntk_parameters).
        orig, d = self.original_max_seq_len, self.head_dim
        theta = self.theta * ((self.factor * seq_len / orig) - (self.factor - 1)) ** (d / (d - 2))
        return rope_inv_freq(theta, d).to(self.inv_freq.device)

    def rotary(self, positions, length=None):
        inv_freq = self.inv_freq
        if self.scaling == "dynamic" and positions.numel():
            # The furthest position: the caller's host integer, else read from the device (a sync).
            length = length if length is not None else int(positions[-1]) + 1
            if length > self.original_max_seq_len:
                inv_freq = self._dynamic_inv_freq(length)
        freqs = positions.float()[:, None] * inv_freq[None, :]  # (T, 1) * (1, Dh/2) -> (T, Dh/2)
        cos = freqs.cos().repeat(1, 2)  # (T, Dh): the angles of both halves are freqs
        sin = freqs.sin()  # (T, Dh/2)
        # Half-split RoPE is x * cos + rotate_half(x) * sin with rotate_half(x) = cat(-x2, x1). That
        # equals roll(x, Dh/2) * cat(-sin, sin): one roll and one fused multiply-add per tensor instead of
        # a negation, a concatenation, two products and a sum: fewer kernels, which is what a small model's
        # CPU step is made of (docs/results.md, "CPU kernel choices inside the model").
        signed_sin = torch.cat((-sin, sin), dim=-1)  # (T, Dh)
        half = self.head_dim // 2

        def rotate(q, k):  # q (B, H, T, Dh), k (B, KVH, T, Dh); cos, signed_sin (T, Dh) broadcast over B and heads
            c, s = cos.to(q.dtype), signed_sin.to(q.dtype)
            return torch.addcmul(q * c, q.roll(half, -1), s), torch.addcmul(k * c, k.roll(half, -1), s)

        return rotate


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Head slopes 2^(-8i/n) (Press et al. 2022); for non-powers of two, interleave as the paper does."""

    def power_of_2(n):
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        return torch.tensor(power_of_2(n_heads))
    closest = 2 ** math.floor(math.log2(n_heads))
    extra = power_of_2(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(power_of_2(closest) + extra)


class ALiBi(PositionScheme):
    """Attention with linear biases: score -= slope_h * |i - j| (Press et al. 2022)."""

    def __init__(self, dim, n_heads, head_dim, max_seq_len, causal):
        super().__init__(dim, n_heads, head_dim, max_seq_len, causal)
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    def score_bias(self, q_pos, k_pos):
        distance = (q_pos[:, None] - k_pos[None, :]).abs().float()  # (Tq, 1) - (1, Tk) -> (Tq, Tk)
        return -(self.slopes[:, None, None] * distance)[None]  # (H, 1, 1) * (Tq, Tk) -> (1, H, Tq, Tk)


def t5_bucket(relative: torch.Tensor, bidirectional: bool, num_buckets: int, max_distance: int) -> torch.Tensor:
    """T5's log-bucketed relative positions (Raffel et al. 2020): exact buckets near, log-spaced far."""
    buckets = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative > 0).long() * num_buckets
        relative = relative.abs()
    else:
        relative = -torch.clamp(relative, max=0)
    max_exact = num_buckets // 2
    is_small = relative < max_exact
    far = (
        max_exact
        + (
            torch.log(relative.float().clamp(min=1) / max_exact)
            / math.log(max_distance / max_exact)
            * (num_buckets - max_exact)
        ).long()
    )
    far = torch.clamp(far, max=num_buckets - 1)
    return buckets + torch.where(is_small, relative, far)


class T5Bias(PositionScheme):
    """T5 relative position bias: a learned scalar per head and distance bucket, shared by all layers."""

    def __init__(self, dim, n_heads, head_dim, max_seq_len, causal, num_buckets: int = 32, max_distance: int = 128):
        super().__init__(dim, n_heads, head_dim, max_seq_len, causal)
        self.bidirectional = not causal
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.table = nn.Embedding(num_buckets, n_heads)

    def score_bias(self, q_pos, k_pos):
        relative = k_pos[None, :] - q_pos[:, None]  # (1, Tk) - (Tq, 1) -> (Tq, Tk): key minus query position
        buckets = t5_bucket(relative, self.bidirectional, self.num_buckets, self.max_distance)
        return self.table(buckets).permute(2, 0, 1)[None]  # (Tq, Tk) buckets -> (Tq, Tk, H) -> (1, H, Tq, Tk)
