"""Synthesizer attention (Tay et al. 2020): model/attn=synthesizer_dense | synthesizer_random |
synthesizer_factorized, each with model.attn.mix=none | plus | plus_alpha.

A synthesizer does not compute its attention weights from query-key dot products; it synthesizes
the (Tq, Tk) logits of every head:

    dense       B = relu(q) W [+ b2]           W: (Dh, L), shared by the heads  (logits from the token alone)
    random      B = R_h                        R: (H, L, L) learned, the same for every input
    factorized  B = R1_h R2_h^T                R1, R2: (H, L, k): a rank-k random synthesizer

L = model.max_seq_len: the synthesized (L, L) pattern is sliced to the positions present, rows
Tk - Tq .. Tk - 1 (the queries' positions, also during KV-cached generation) and columns 0 .. Tk - 1.
The mixes with dot-product attention (Tay et al. section 3.2):

    none        logits = B
    plus        logits = B + scale * q k^T
    plus_alpha  logits = (1 - a) * scale * q k^T + a * B,   a = sigmoid(learned scalar), 0.5 at init

This follows the implementation that Narang et al. 2021 (the table this option joins) ran, Mesh
TensorFlow's synthetic attention: the dense synthesizer's first layer is the query projection (so its
hidden layer is relu(q), per head), and every variant keeps the q, k and v projections of the
attention module, used or not, so the Params column counts them as that table does. The paper writes the dense
synthesizer B = W2 relu(W1 x + b1) + b2; that code has neither bias. Here b1 is the query projection's bias
(model.bias) and b2, a learned (L,) bias over key positions starting at 0, is opt-in: model.attn.b2=true
(default false: the code Narang et al. ran, and what configs saved before the option build).

The base class masks the logits (causal: the future gets exactly zero weight; padding: padded keys
get zero weight), takes the softmax, records probabilities for capture(), and multiplies by v.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from lm.config_base import Choice, ConfigError
from lm.model.options import AttnConfig
from lm.model.registry import register, target_option
from lm.model.scores import Score

# -- the option schemas (conf/model/attn/synthesizer_*.yaml) ------------------------------------------


class SynthMix(Choice):
    none = "none"  # the synthesized logits alone
    plus = "plus"  # + scaled q k^T
    plus_alpha = "plus_alpha"  # (1 - a) scaled q k^T + a synthesized, a = sigmoid(learned), 0.5 at init


MIXES = tuple(m.value for m in SynthMix)


@dataclass
class _SynthesizerConfig(AttnConfig):
    """What the three synthesizer options share: the mix with dot-product attention."""

    mix: SynthMix = SynthMix.none
    self_only: ClassVar[bool] = True  # a synthesized (L, L) pattern is about the positions of one sequence

    def uses_qk(self) -> bool:
        return self.mix != SynthMix.none

    def check(self, model) -> None:
        if self.mix == SynthMix.none and (model.attn_scale is not None or model.attn_scale_by_layer):
            raise ConfigError(
                "model.attn_scale / model.attn_scale_by_layer scale q k^T, which model.attn.mix=none "
                "does not compute; unset them or use model.attn.mix=plus|plus_alpha"
            )
        super().check(model)


@register("attn")
@dataclass
class SynthesizerDenseConfig(_SynthesizerConfig):
    """Dense Synthesizer (Tay et al. 2020): logits relu(q) W (+ b2), W: (head_dim, max_seq_len)."""

    _target_: str = "lm.zoo.synthesizer.SynthesizerDense"
    option_file: ClassVar[str] = "synthesizer_dense"
    b2: bool = False  # the paper's second-layer bias over key positions (Mesh TF's code, Narang's rows: none)


SynthesizerRandomConfig = target_option(
    "attn",
    "SynthesizerRandomConfig",
    "lm.zoo.synthesizer.SynthesizerRandom",
    "Random Synthesizer: a learned (max_seq_len, max_seq_len) logit pattern per head.",
    _SynthesizerConfig,
    option_file="synthesizer_random",
)


@register("attn")
@dataclass
class SynthesizerFactorizedConfig(_SynthesizerConfig):
    """Factorized random Synthesizer: the pattern is R1 R2^T of rank factorized_k."""

    _target_: str = "lm.zoo.synthesizer.SynthesizerFactorized"
    option_file: ClassVar[str] = "synthesizer_factorized"
    factorized_k: int = 16

    def check(self, model) -> None:
        if self.factorized_k < 1:
            raise ConfigError(f"model.attn.factorized_k={self.factorized_k!r} must be a positive integer")
        super().check(model)


# -- the scores --------------------------------------------------------------------------------------


class _Synthesizer(Score):
    """Base of the three synthesizers: `synthesized(q, Tq, Tk)` gives B (B or 1, H, Tq, Tk); `logits` mixes it."""

    def __init__(self, *shape, mix: str = "none", **named_shape):
        super().__init__(*shape, **named_shape)
        if mix not in MIXES:
            raise ValueError(f"model.attn.mix={mix!r}: choose one of {MIXES}")
        self.mix = mix
        self.alpha = nn.Parameter(torch.zeros(())) if mix == "plus_alpha" else None  # sigmoid(0) = 0.5

    def synthesized(self, q: torch.Tensor, tq: int, tk: int) -> torch.Tensor:
        raise NotImplementedError

    def _rows_cols(self, tq: int, tk: int) -> slice:
        if tk > self.max_seq_len:
            raise ValueError(
                f"{type(self).__name__} got {tk} key positions; its synthesized pattern covers "
                f"model.max_seq_len={self.max_seq_len}: raise it or shorten the input"
            )
        return slice(tk - tq, tk)  # the queries are the last tq of the tk positions

    def logits(self, q, k):
        synth = self.synthesized(q, q.shape[2], k.shape[2])  # (B or 1, H, Tq, Tk)
        if self.mix == "none":
            return synth.expand(q.shape[0], -1, -1, -1)
        dot = (q @ k.transpose(-2, -1)) * self.scale  # (B, H, Tq, Tk)
        if self.mix == "plus":
            return dot + synth
        a = torch.sigmoid(self.alpha)
        return (1 - a) * dot + a * synth

    def forward_flops(self, seq_len: int) -> int:
        value_product = 2 * self.n_heads * self.head_dim * seq_len  # probs @ v
        dot = 2 * self.n_heads * self.head_dim * seq_len if self.mix != "none" else 0  # q k^T
        return value_product + dot + self.synthesis_flops(seq_len)

    def synthesis_flops(self, seq_len: int) -> int:
        return 0  # random: a lookup


class SynthesizerDense(_Synthesizer):
    """B = relu(q) W (+ b2): each query token's own row of logits over positions 0..L-1."""

    def __init__(self, *shape, b2: bool = False, **named_shape):
        super().__init__(*shape, **named_shape)
        self.W = nn.Parameter(torch.empty(self.head_dim, self.max_seq_len))
        # b2 starts at 0: the initial model is the one without it
        self.b2 = nn.Parameter(torch.zeros(self.max_seq_len)) if b2 else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.uniform_(self.W, -(self.head_dim**-0.5), self.head_dim**-0.5)  # fan-in scaled, as nn.Linear

    def synthesized(self, q, tq, tk):
        self._rows_cols(tq, tk)
        logits = torch.relu(q) @ self.W[:, :tk].to(q.dtype)  # (B, H, Tq, Dh) @ (Dh, Tk) -> (B, H, Tq, Tk)
        return logits if self.b2 is None else logits + self.b2[:tk].to(q.dtype)

    def synthesis_flops(self, seq_len):
        return 2 * self.n_heads * self.head_dim * seq_len


class SynthesizerRandom(_Synthesizer):
    """B = R_h: a learned (L, L) pattern per head, independent of the input."""

    def __init__(self, *shape, **named_shape):
        super().__init__(*shape, **named_shape)
        self.R = nn.Parameter(torch.empty(self.n_heads, self.max_seq_len, self.max_seq_len))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = (3 / self.max_seq_len) ** 0.5  # Glorot-uniform over (L, L), Mesh TF's default initializer
        nn.init.uniform_(self.R, -bound, bound)

    def synthesized(self, q, tq, tk):
        return self.R[None, :, self._rows_cols(tq, tk), :tk].to(q.dtype)  # (1, H, Tq, Tk)


class SynthesizerFactorized(_Synthesizer):
    """B = R1_h R2_h^T: a factorized random synthesizer of rank k (model.attn.factorized_k)."""

    def __init__(self, *shape, factorized_k: int = 16, **named_shape):
        super().__init__(*shape, **named_shape)
        self.k = factorized_k
        self.R1 = nn.Parameter(torch.empty(self.n_heads, self.max_seq_len, factorized_k))
        self.R2 = nn.Parameter(torch.empty(self.n_heads, self.max_seq_len, factorized_k))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # U(-b, b) has variance b^2 / 3; with b = k^-1/4 an entry of R1 R2^T has variance k (b^2 / 3)^2 = 1/9 for any k
        for p in (self.R1, self.R2):
            nn.init.uniform_(p, -(self.k**-0.25), self.k**-0.25)

    def synthesized(self, q, tq, tk):
        rows = self._rows_cols(tq, tk)
        return (self.R1[:, rows] @ self.R2[:, :tk].transpose(-2, -1))[None].to(q.dtype)  # (1, H, Tq, Tk)

    def synthesis_flops(self, seq_len):
        return 2 * self.n_heads * self.k * seq_len  # one row of R1 R2^T per query
