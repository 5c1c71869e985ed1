"""Attention scores other than scaled_dot (model/attn=dot|multiplicative|additive|linformer): the lectures'
comparison of scoring functions, each a `Score` (lm/model/scores.py) that defines `logits` alone.

| option         | logits(q, k)                              | paper                      |
| dot            | q k^T                                      | Luong et al. 2015 ("dot")  |
| multiplicative | q^T W k, W learned per head                | Luong et al. 2015 ("general") |
| additive       | v^T tanh(W1 q + W2 k), per head            | Bahdanau et al. 2014       |
| linformer      | q (E k)^T / sqrt(Dh), E: (k, max_seq_len)  | Wang et al. 2020           |
"""

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from lm.config_base import ConfigError
from lm.model.choices import Arch
from lm.model.options import ALiBiConfig, AttnConfig, T5BiasConfig, option_name, positive
from lm.model.registry import register
from lm.model.scores import NEG, ScaledDot, Score


@register("attn")
@dataclass
class DotConfig(AttnConfig):
    """softmax(q k^T): no 1/sqrt(d) scaling (Luong et al. 2015, "dot")."""

    _target_: str = "lm.zoo.scores.Dot"
    uses_scale: ClassVar[bool] = False


@register("attn")
@dataclass
class MultiplicativeConfig(AttnConfig):
    """softmax(q^T W k) with a learned W per head (Luong et al. 2015, "general")."""

    _target_: str = "lm.zoo.scores.Multiplicative"
    uses_scale: ClassVar[bool] = False


@register("attn")
@dataclass
class AdditiveConfig(AttnConfig):
    """softmax(v^T tanh(W1 q + W2 k)) per head (Bahdanau et al. 2014). Memory: (B, H, Tq, Tk, d_attn)."""

    _target_: str = "lm.zoo.scores.Additive"
    d_attn: int | None = None  # width of the tanh layer; None = head_dim
    query_chunk: int = 0  # >0: score this many queries at a time, recomputed in backward (bounds memory)
    uses_scale: ClassVar[bool] = False

    def check(self, model) -> None:
        super().check(model)
        if self.d_attn is not None:
            positive("attn.d_attn", self.d_attn)
        if not isinstance(self.query_chunk, int) or self.query_chunk < 0:
            raise ConfigError(
                f"model.attn.query_chunk={self.query_chunk!r} must be 0 (all queries at once) or positive"
            )


@register("attn")
@dataclass
class LinformerConfig(AttnConfig):
    """Keys and values projected along the sequence to k rows (Wang et al. 2020); not causal."""

    _target_: str = "lm.zoo.scores.Linformer"
    k: int | None = None  # projected length; None = max_seq_len // 4 (the paper's n=1024, k=256)
    shared_kv: bool = False  # one projection for keys and values (the paper's key-value sharing)

    def check(self, model) -> None:
        super().check(model)
        if model.arch == Arch.decoder:
            raise ConfigError(
                "model/attn=linformer cannot be used with model.arch=decoder: Linformer projects the keys and values "
                "of all positions into k rows, so every row mixes in future tokens and no causal mask can be applied. "
                "Use it with model.arch=encoder or encoder_decoder (its decoder's causal self-attention keeps "
                "scaled_dot), or pick a causal option: scaled_dot, dot, multiplicative, additive"
            )
        k = linformer_k(self, model.max_seq_len)
        if not isinstance(k, int) or not 1 <= k <= model.max_seq_len:
            raise ConfigError(
                f"model.attn.k={k!r} must be in [1, model.max_seq_len={model.max_seq_len}] "
                f"(the projection maps at most max_seq_len positions to k rows)"
            )
        if isinstance(model.pos, (ALiBiConfig, T5BiasConfig)):
            raise ConfigError(
                f"model/pos={option_name(model.pos)} adds a bias per key position, which "
                f"Linformer projects away into k rows; use model/pos=learned, sinusoidal, rope or none with "
                f"model/attn=linformer"
            )


def linformer_k(cfg: LinformerConfig, max_seq_len: int) -> int:
    """The projected length: model.attn.k, or max_seq_len // 4 when unset (derived, never written back)."""
    return cfg.k if cfg.k is not None else max(1, max_seq_len // 4)


# -- the scores ------------------------------------------------------------------------------------


class Dot(ScaledDot):
    """softmax(q k^T): the unscaled dot product. Its logits grow with Dh (why Vaswani et al. scale)."""

    def __init__(self, n_heads, n_kv_heads, head_dim, max_seq_len, scale, dropout, causal):
        super().__init__(n_heads, n_kv_heads, head_dim, max_seq_len, 1.0, dropout, causal)


class Multiplicative(Score):
    """softmax(q^T W_h k) with a learned (Dh, Dh) matrix per head. W starts at I / sqrt(Dh), so the
    model starts as scaled_dot and learns a bilinear form from there."""

    def __init__(self, *shape, **named_shape):
        super().__init__(*shape, **named_shape)
        self.W = nn.Parameter(torch.empty(self.n_heads, self.head_dim, self.head_dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.W.copy_(torch.eye(self.head_dim).expand_as(self.W) * self.head_dim**-0.5)

    def logits(self, q, k):
        qW = torch.einsum("bhqd,hde->bhqe", q, self.W)  # (B, H, Tq, Dh)
        return qW @ k.transpose(-2, -1)

    def forward_flops(self, seq_len):
        return super().forward_flops(seq_len) + 2 * self.n_heads * self.head_dim**2  # q W


class Additive(Score):
    """softmax(v_h^T tanh(W1_h q + W2_h k)) per head h, W1 and W2: (Dh, d_attn), v: (d_attn,).

    The tanh is taken for every (query, key) pair: a (B, H, Tq, Tk, d_attn) tensor, kept for
    backward. query_chunk > 0 scores that many queries at a time and recomputes them in backward
    (torch.utils.checkpoint), so memory holds one chunk's tensor instead of all of them.
    """

    def __init__(self, *shape, d_attn: int | None = None, query_chunk: int = 0, **named_shape):
        super().__init__(*shape, **named_shape)
        H, Dh = self.n_heads, self.head_dim
        self.d_attn, self.query_chunk = d_attn or Dh, query_chunk
        self.W1 = nn.Parameter(torch.empty(H, Dh, self.d_attn))
        self.W2 = nn.Parameter(torch.empty(H, Dh, self.d_attn))
        self.v = nn.Parameter(torch.empty(H, self.d_attn))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # fan-in scaled (as nn.Linear): W1 q + W2 k stay O(|q|), inside tanh's useful range
        for w in (self.W1, self.W2):
            nn.init.uniform_(w, -(self.head_dim**-0.5), self.head_dim**-0.5)
        nn.init.uniform_(self.v, -(self.d_attn**-0.5), self.d_attn**-0.5)

    def logits(self, q, k):
        q1 = torch.einsum("bhqd,hda->bhqa", q, self.W1)  # (B, H, Tq, d_attn)
        k2 = torch.einsum("bhkd,hda->bhka", k, self.W2)  # (B, H, Tk, d_attn)
        chunk = self.query_chunk
        if not chunk or q1.shape[2] <= chunk:
            return self._pairs(q1, k2)
        parts = [q1[:, :, i : i + chunk] for i in range(0, q1.shape[2], chunk)]
        if torch.is_grad_enabled():
            return torch.cat([checkpoint(self._pairs, p, k2, use_reentrant=False) for p in parts], dim=2)
        return torch.cat([self._pairs(p, k2) for p in parts], dim=2)

    def _pairs(self, q1: torch.Tensor, k2: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(q1[:, :, :, None, :] + k2[:, :, None, :, :])  # (B, H, Tq, Tk, d_attn)
        return torch.einsum("bhqka,ha->bhqk", hidden, self.v)

    def forward_flops(self, seq_len):
        # W1 q and W2 k (a key per token in self-attention), v^T over every pair, then probs @ v
        projections = 2 * 2 * self.n_heads * self.head_dim * self.d_attn
        return projections + 2 * self.n_heads * seq_len * self.d_attn + 2 * self.n_heads * self.head_dim * seq_len


class Linformer(ScaledDot):
    """Scaled dot product against keys and values projected along the sequence to k rows:
    K' = E K, V' = F V with E, F: (k, max_seq_len), one pair per layer shared by the heads (the
    paper's headwise sharing), or E = F with shared_kv. An input of T < max_seq_len positions uses
    E[:, :T]. Padded keys and values are zeroed before the projection, so padding adds nothing; the
    k projected rows are then all visible (no mask). Every row mixes all positions: not causal.
    """

    causal_ok = False

    def __init__(self, *shape, k: int | None = None, shared_kv: bool = False, **named_shape):
        super().__init__(*shape, **named_shape)
        L = self.max_seq_len
        self.k = k if k is not None else max(1, L // 4)  # LinformerConfig's default (linformer_k)
        self.E = nn.Parameter(torch.empty(self.k, L))
        self.F = None if shared_kv else nn.Parameter(torch.empty(self.k, L))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for p in (self.E, self.F):
            if p is not None:
                nn.init.uniform_(p, -(self.k**-0.5), self.k**-0.5)  # as the paper's reference code (1/sqrt(k))

    def keys_values(self, k, v, mask):
        T = k.shape[2]
        if self.max_seq_len < T:
            raise ValueError(
                f"Linformer got {T} key positions; its projections cover model.max_seq_len="
                f"{self.max_seq_len}: raise it or shorten the input"
            )
        if mask is not None:
            # Not causal, so a key is masked for every query or for none: the first query row tells.
            keep = (mask[:, :1, :1, :] > NEG).to(k.dtype).transpose(-2, -1)  # (B, 1, Tk, 1)
            k, v = k * keep, v * keep
        E = self.E[:, :T].to(k.dtype)
        F_ = E if self.F is None else self.F[:, :T].to(v.dtype)
        return E @ k, F_ @ v, None  # (k, T) @ (B, KVH, T, Dh) -> (B, KVH, k, Dh): the k rows are all visible

    def forward_flops(self, seq_len):
        # E K and F V: every key/value token adds to k rows; then the score and value products over k rows
        projections = 2 * 2 * self.k * self.n_kv_heads * self.head_dim
        return projections + super().forward_flops(self.k)
