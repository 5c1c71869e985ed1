"""Lightweight and dynamic convolutions in place of self-attention (Wu et al. 2019): model/attn=
lightweight_conv | dynamic_conv.

The sub-layer is the paper's (section 3): an input projection d -> 2d followed by a GLU, the
convolution, and the output projection d -> d:

    u = GLU(x W_in)                       (B, T, H*Dh): H heads of Dh channels
    y_t = sum_j w_{t,h,j} u_{t-P+j}        for every channel of head h, j = 0..K-1
    out = y W_out

The K kernel weights are shared by the Dh channels of a head and softmax-normalised over j, so an
output is a convex combination of the K inputs in its window (weight sharing + softmax are what make
the convolution "lightweight"). LightweightConv learns one static kernel per head, w: (H, K);
DynamicConv predicts it at every position from that position's input, w_t = softmax(u_t W_dyn),
W_dyn: (H*Dh, H*K) (fairseq's DynamicConv1dTBC computes it from the GLU output, as here).

Causal (decoders): P = K - 1, the window is u_{t-K+1..t}, so no output sees a later input.
Bidirectional (encoders): P = K // 2 (centred; (K - 1) // 2 for even K). Padded positions are
zeroed before the convolution, so a pad contributes nothing to any output. A kernel tap that falls
off either end of the sequence reads zero padding (no renormalisation, as in the paper's code).

Cross-attention cannot be a convolution (the decoder and the encoder memory are different
sequences): the stack keeps scaled_dot for it, as Wu et al. do for encoder-decoder attention.

capture(): each call records the kernel laid out as a banded (B, H, Tq, Tk) attention matrix,
A[t, s] = w_{t, s - t + P} inside the window and 0 elsewhere. Rows sum to 1 except where the window
hangs over an end of the sequence. During KV-cached generation Tk covers the window's past inputs.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from lm.config_base import ConfigError
from lm.model.attention import LayerCache, _Attention, key_keep
from lm.model.linear import Linear
from lm.model.options import ALiBiConfig, AttnConfig, T5BiasConfig, option_name, positive
from lm.model.registry import register
from lm.model.scores import Score
from lm.zoo.residual import FixupBranch

# -- the option schemas (conf/model/attn/lightweight_conv.yaml, dynamic_conv.yaml) -------------------


@dataclass
class _ConvConfig(AttnConfig):
    """What the two convolution options share."""

    kernel_size: int = 7  # taps per head (Wu et al. grow it with depth: 3, 7, 15, 31, ...)
    weight_dropout: float = 0.0  # DropConnect on the normalised kernel (the paper uses 0.1)
    glu: bool = True  # the GLU input projection d -> 2d -> d; false: a plain d -> d projection
    uses_scale: ClassVar[bool] = False
    uses_dropout: ClassVar[bool] = False  # no attention probabilities to drop: weight_dropout is its own
    self_only: ClassVar[bool] = True  # a window over one sequence: cross-attention keeps scaled_dot

    def uses_qk(self) -> bool:
        return False

    def check(self, model) -> None:
        super().check(model)  # uses_scale = False: model.attn_scale is refused; no q k^T: qk_norm, rope refused
        positive("attn.kernel_size", self.kernel_size)
        if not 0.0 <= self.weight_dropout < 1.0:
            raise ConfigError(f"model.attn.weight_dropout={self.weight_dropout!r} must be in [0, 1)")
        name = option_name(self)
        if model.n_kv_heads not in (None, model.n_heads):
            raise ConfigError(
                f"model.n_kv_heads={model.n_kv_heads}: model/attn={name} has no keys or values to share; unset it"
            )
        if isinstance(model.pos, (ALiBiConfig, T5BiasConfig)):
            raise ConfigError(
                f"model/pos={option_name(model.pos)} biases attention scores, which "
                f"model/attn={name} does not compute; use model/pos=learned, sinusoidal or none"
            )


@register("attn")
@dataclass
class LightweightConvConfig(_ConvConfig):
    """Lightweight convolution (Wu et al. 2019): one softmax-normalised kernel per head in place of
    self-attention; causal in decoders."""

    _target_: str = "lm.zoo.conv_attn.LightweightConv"
    option_file: ClassVar[str] = "lightweight_conv"


@register("attn")
@dataclass
class DynamicConvConfig(_ConvConfig):
    """Dynamic convolution (Wu et al. 2019): each position's kernel is predicted from its input."""

    _target_: str = "lm.zoo.conv_attn.DynamicConv"
    option_file: ClassVar[str] = "dynamic_conv"


# -- the convolutions --------------------------------------------------------------------------------


class _Conv(Score):
    """The convolution over H heads of Dh channels, for ConvAttention. A Score subclass so that
    lm.model.flops counts its forward_flops and capture() sets its `record`."""

    def __init__(self, *shape, kernel_size: int = 7, weight_dropout: float = 0.0, glu: bool = True, **named_shape):
        super().__init__(*shape, **named_shape)
        self.K, self.weight_dropout, self.glu = kernel_size, weight_dropout, glu
        self.P = kernel_size - 1 if self.causal else (kernel_size - 1) // 2  # inputs before t in t's window
        self.make_kernel()

    def make_kernel(self) -> None:
        """The kernel's parameters (the one thing the two convolutions build differently)."""
        raise NotImplementedError

    def kernel(self, u: torch.Tensor) -> torch.Tensor:
        """Softmax-normalised kernel: (H, K) static, or (B, T, H, K) per position."""
        raise NotImplementedError

    def forward(self, u: torch.Tensor, keep: torch.Tensor | None, cache: LayerCache | None = None) -> torch.Tensor:
        """u (B, T, H*Dh) -> (B, T, H*Dh). keep: (B, T) 1 for tokens, 0 for pads, or None."""
        B, T, _ = u.shape
        if keep is not None:
            u = u * keep[:, :, None].to(u.dtype)
        w = F.dropout(self.kernel(u), self.weight_dropout, self.training)  # DropConnect on the kernel (paper: 0.1)
        past = 0
        if cache is not None:  # generation (causal): the window reaches up to K - 1 inputs into the past
            u = self._with_past(u, cache)
            past = u.shape[1] - T
        # left pad P - past: output t's window then starts at padded index t, so unfold yields exactly T windows
        padded = F.pad(u, (0, 0, self.P - past, self.K - 1 - self.P))  # (B, T + K - 1, H*Dh)
        windows = padded.unfold(1, self.K, 1)  # (B, T, H*Dh, K)
        windows = windows.reshape(B, T, self.n_heads, self.head_dim, self.K)  # (B, T, H, Dh, K)
        if self.record is not None:
            self.record(band(w, B, T, past + T, self.P, past))
        if w.dim() == 2:
            y = torch.einsum("bthck,hk->bthc", windows, w.to(u.dtype))
        else:
            y = torch.einsum("bthck,bthk->bthc", windows, w.to(u.dtype))
        return y.reshape(B, T, self.n_heads * self.head_dim)

    def _with_past(self, u: torch.Tensor, cache: LayerCache) -> torch.Tensor:
        """Append u to the cache (as its `k`, (B, 1, T, H*Dh): `length` counts positions) and return the
        last K - 1 past inputs followed by u."""
        if not self.causal:
            raise ValueError("a bidirectional convolution cannot be run incrementally with a cache")
        cache.k = u[:, None] if cache.k is None else torch.cat([cache.k, u[:, None]], dim=2)
        past = min(cache.k.shape[2] - u.shape[1], self.K - 1)
        return cache.k[:, 0, cache.k.shape[2] - u.shape[1] - past :]  # (B, past + T, H*Dh)

    def sublayer(self, dim: int, bias: bool) -> nn.Module:
        return ConvAttention(dim, self.n_heads, self.head_dim, bias, self)

    def forward_flops(self, seq_len: int) -> int:
        # every output channel is a K-tap weighted sum (multiply-adds count 2); no T^2 term
        return 2 * self.n_heads * self.head_dim * self.K


def band(w: torch.Tensor, B: int, Tq: int, Tk: int, P: int, past: int) -> torch.Tensor:
    """The kernel as a (B, H, Tq, Tk) matrix: query t (absolute position past + t) reads key s with
    weight w[..., s - (past + t) + P] when 0 <= s - (past + t) + P < K."""
    K = w.shape[-1]
    w = w[None, None].expand(B, Tq, *w.shape) if w.dim() == 2 else w  # (B, Tq, H, K)
    tap = torch.arange(Tk, device=w.device)[None, :] - (past + torch.arange(Tq, device=w.device))[:, None] + P
    inside = (tap >= 0) & (tap < K)  # (Tq, Tk)
    idx = tap.clamp(0, K - 1)[None, :, None, :].expand(B, Tq, w.shape[2], Tk)  # (B, Tq, H, Tk)
    dense = torch.gather(w, 3, idx) * inside[None, :, None, :]
    return dense.transpose(1, 2).detach()  # (B, H, Tq, Tk)


class LightweightConv(_Conv):
    """One softmax-normalised kernel per head, shared by its channels and by every position."""

    def make_kernel(self) -> None:
        self.weight = nn.Parameter(torch.empty(self.n_heads, self.K))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.weight)  # fairseq's LightweightConv1d init

    def kernel(self, u):
        return self.weight.float().softmax(dim=-1)  # (H, K)


class DynamicConv(_Conv):
    """The kernel of position t is predicted from u_t: softmax(u_t W_dyn) per head (Wu et al. eq. 4)."""

    def make_kernel(self) -> None:
        self.weight_linear = Linear(self.n_heads * self.head_dim, self.n_heads * self.K, bias=False)

    def kernel(self, u):
        B, T, _ = u.shape
        # W_dyn is an nn.Linear, so lm.model.flops counts it as a matmul parameter
        return self.weight_linear(u).view(B, T, self.n_heads, self.K).float().softmax(dim=-1)  # (B, T, H, K)


class ConvAttention(FixupBranch, _Attention):
    """The self-attention sub-layer of Wu et al. 2019: GLU input projection, convolution, output projection."""

    kind = "self"
    fixup_depth = 3  # model/norm=fixup's m (lm/zoo/residual.py): input projection, convolution, output projection

    def __init__(self, dim: int, n_heads: int, head_dim: int, bias: bool, conv: _Conv):
        super().__init__(dim, n_heads, n_heads, head_dim, bias, 0.0, None, None, conv)
        width = n_heads * head_dim
        # GLU: half of the 2d projection gates the other half (Dauphin et al. 2017); without it, d -> d
        self.inp = Linear(dim, 2 * width if conv.glu else width, bias=bias)

    def forward(self, x, causal: bool, mask, pos, cache: LayerCache | None = None):
        """x (B, T, D) -> (B, T, D). pos is unused: the convolution's window is its position signal."""
        if causal != self.score.causal:
            raise ValueError(
                f"this convolution was built {'causal' if self.score.causal else 'bidirectional'} "
                f"and was called with causal={causal}"
            )
        u = self.inp(x)
        u = F.glu(u, dim=-1) if self.score.glu else u  # (B, T, 2*H*Dh) -> (B, T, H*Dh)
        return self.out(self.score(u, key_keep(mask, x.shape[1]), cache))
