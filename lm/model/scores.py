"""Attention scoring functions: the `model/attn` config group.

A score turns queries, keys and values into attention outputs:
    y = softmax(logits(q, k) + mask) @ v                         (B, H, Tq, Dh)
Each option is one subclass of `Score` that defines `logits` (and, where it needs to, `keys_values`,
which reshapes the keys and values before scoring); the base class does masking, softmax,
dropout, GQA and the probabilities `lm.model.attention.capture` reads, so a new option plugs into
all of them by writing `logits` alone. The core has scaled_dot, softmax(q k^T / sqrt(Dh)) on SDPA's
fused kernels (Vaswani et al. 2017); the paper variants live in lm/zoo and register their schemas
(lm/model/registry.py; docs/attention.md lists them).

Every score is built as `score(n_heads, n_kv_heads, head_dim, max_seq_len, scale, dropout, causal)`
plus its own hyperparameters from conf/model/attn/. A subclass with hyperparameters of its own takes the shape
as `*shape, **named_shape` (positional or by name: make_score passes names, tests positions), declares its own
keyword-only, and hands the shape to Score, which keeps it (self.n_heads, ..., self.causal). Masks are the
additive float masks of `lm.model.attention.build_mask` (None when only causality applies, then `is_causal` says so).
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

NEG = torch.finfo(torch.float32).min  # build_mask's value for masked entries


def causal_mask(tq: int, tk: int, device) -> torch.Tensor:
    """(1, 1, Tq, Tk) additive mask: query i sees keys 0..i + (Tk - Tq) (the last Tq keys are its own)."""
    visible = torch.ones(tq, tk, dtype=torch.bool, device=device).tril(tk - tq)
    return torch.zeros(tq, tk, device=device).masked_fill(~visible, NEG)[None, None]


class Score(nn.Module):
    """Base: explicit softmax attention over `logits(q, k)`. Subclasses define `logits`."""

    causal_ok = True  # False when a query's output would mix in later keys whatever the mask (Linformer)

    def __init__(
        self,
        n_heads: int,
        n_kv_heads: int,
        head_dim: int,
        max_seq_len: int,
        scale: float | None,
        dropout: float,
        causal: bool,
    ):
        super().__init__()
        if causal and not self.causal_ok:
            raise ValueError(
                f"{type(self).__name__} cannot be causal (its keys mix positions); "
                f"lm.model.validate.validate_model refuses such a model (the option's check)"
            )
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.max_seq_len, self.dropout, self.causal = max_seq_len, dropout, causal
        self.scale = head_dim**-0.5 if scale is None else scale
        # Set by lm.model.attention.capture: called with the (B, H, Tq, Tk) probabilities of each call.
        self.record: Callable[[torch.Tensor], None] | None = None

    def logits(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """q (B, H, Tq, Dh), k (B, H, Tk, Dh) -> (B, H, Tq, Tk) scores before the mask."""
        raise NotImplementedError

    def keys_values(self, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> tuple:
        """Keys, values and mask as the scores see them (Linformer projects them along the sequence)."""
        return k, v, mask

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, is_causal: bool
    ) -> torch.Tensor:
        """q (B, H, Tq, Dh), k and v (B, KVH, Tk, Dh) -> (B, H, Tq, Dh)."""
        k, v, mask = self.keys_values(k, v, mask)
        k, v = self._expand_kv(k), self._expand_kv(v)  # (B, H, Tk, Dh)
        if is_causal and mask is None:
            mask = causal_mask(q.shape[2], k.shape[2], q.device)
        scores = self.logits(q, k).float()  # (B, H, Tq, Tk)
        if mask is not None:
            # clamp: a masked score plus a very negative logit must stay finite, so a row with no
            # visible key (a left pad) gives a uniform softmax, as build_mask promises, not NaN
            scores = (scores + mask.float()).clamp_min(NEG)
        probs = scores.softmax(dim=-1).to(q.dtype)
        if self.record is not None:
            self.record(probs)
        probs = F.dropout(probs, self.dropout, self.training)
        return probs @ v

    def _expand_kv(self, x: torch.Tensor) -> torch.Tensor:
        # GQA: query head h reads key/value head h // (H / KVH), as SDPA's enable_gqa does
        groups = self.n_heads // self.n_kv_heads
        return x if groups == 1 else x.repeat_interleave(groups, dim=1)

    def sublayer(self, dim: int, bias: bool) -> nn.Module | None:
        """The self-attention sub-layer this score brings, in place of SelfAttention's q, k, v and output
        projections (the convolutions of lm/zoo/conv_attn.py); None: the standard SelfAttention."""
        return None

    def forward_flops(self, seq_len: int) -> int:
        """Forward FLOPs per query token of the score and value products (multiply-adds count 2),
        with seq_len keys; lm.model.flops triples it for training (PaLM's convention)."""
        return 4 * self.n_heads * self.head_dim * seq_len


class ScaledDot(Score):
    """softmax(q k^T * scale): model.attn_scale, default 1/sqrt(Dh). Runs on SDPA (flash / memory-efficient
    kernels, `is_causal` without a mask) unless probabilities are being captured."""

    def logits(self, q, k):
        return (q @ k.transpose(-2, -1)) * self.scale  # (B, H, Tq, Dh) @ (B, H, Dh, Tk) -> (B, H, Tq, Tk)

    def forward(self, q, k, v, mask, is_causal):
        if self.record is not None:
            return super().forward(q, k, v, mask, is_causal)
        k, v, mask = self.keys_values(k, v, mask)
        if mask is not None:
            mask = mask.to(q.dtype)
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=is_causal and mask is None,
            dropout_p=self.dropout if self.training else 0.0,
            scale=self.scale,
            enable_gqa=k.shape[1] != q.shape[1],
        )  # (B, H, Tq, Dh)


def make_score(factory: Callable[..., Score] | None, causal: bool, **shapes) -> Score:
    """The score of one attention module. A causal self-attention keeps scaled_dot when the chosen
    option cannot be causal (the decoder of an encoder-decoder with model/attn=linformer); the option's
    `check` (run by lm.model.validate.validate_model) refuses a decoder-only model with it."""
    cls = getattr(factory, "func", factory)  # Hydra's _partial_ gives a functools.partial
    if factory is None or (causal and not cls.causal_ok):
        return ScaledDot(**shapes, causal=causal)
    return factory(**shapes, causal=causal)
