"""The one Transformer block shared by every stack (encoder, decoder, encoder-decoder).

A Block knows from build time whether it has cross-attention; it is told per call whether
attention is causal. Pre- or post-norm (or a model/norm option's own, the zoo's ReZero and Fixup) is the
residual function it was built with, not a flag checked in forward.

Block options that change the sub-layer sequence (`model.block`, lm/model/stack.py) fill two more
build-time parts instead of forking the class: `prelude`, extra residual sub-layers run before the
self-attention, each with its own norm (the Evolved Transformer's GLU, convolution branches and
branched attention: lm/zoo/evolved.py), and `ffn=None`, no FFN sub-layer (the weighted
Transformer, whose attention branches hold the FFNs: lm/zoo/weighted.py).
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from lm.model.attention import CrossAttention, LayerCache, SelfAttention


def carried(x: torch.Tensor, skip: Callable | None) -> torch.Tensor:
    """What the residual carries: x, or skip(x) when f shortens the sequence (Funnel's pooling)."""
    return x if skip is None else skip(x)


def pre_norm(
    x: torch.Tensor, norm: nn.Module, f: Callable, drop: nn.Module, s=None, skip: Callable | None = None
) -> torch.Tensor:
    """x + drop(f(norm(x))): GPT-2, Llama, T5 (Xiong et al. 2020: stable without warmup tricks)."""
    return carried(x, skip) + drop(f(norm(x)))


def post_norm(
    x: torch.Tensor, norm: nn.Module, f: Callable, drop: nn.Module, s=None, skip: Callable | None = None
) -> torch.Tensor:
    """norm(x + drop(f(x))): the original Transformer and BERT."""
    return norm(carried(x, skip) + drop(f(x)))


class TokenRouter(nn.Module):
    """An FFN whose forward also takes the block's padding and causal: MoE (lm/model/moe.py; no pad is routed,
    tokens are routed in position order) and the product-key memory (lm/zoo/pkm.py; pads stay out of its
    BatchNorm's statistics)."""


class BranchScalars(nn.Module):
    """The scalar parameters of one residual branch (ReZero's alpha; Fixup's bias and multiplier)."""

    def __init__(self, initial: dict[str, float]):
        super().__init__()
        for name, value in initial.items():
            # shape (1,), not (): DeepSpeed broadcasts parameters as bytes, which a 0-dim tensor cannot be
            self.register_parameter(name, nn.Parameter(torch.full((1,), float(value))))


@dataclass(frozen=True)
class Residual:
    """A residual function fn(x, norm, f, drop, scalars, skip) and the learned scalars (name -> initial value) it
    reads, one set per branch: pre- or post-norm here; a model/norm option may bring its own (NormConfig.residual:
    the zoo's ReZero and Fixup)."""

    fn: Callable
    scalars: dict[str, float] = field(default_factory=dict)


RESIDUALS = {"pre": Residual(pre_norm), "post": Residual(post_norm)}  # by model.norm_position


def _scalars(residual: Residual) -> BranchScalars | None:
    return BranchScalars(residual.scalars) if residual.scalars else None


class Block(nn.Module):
    """[prelude sub-layers,] self-attention, [cross-attention,] [FFN]: each a residual branch
    x -> residual(x, norm, sublayer, dropout), pre_norm or post_norm above unless a model/norm option brings its own."""

    def __init__(
        self,
        self_attn: SelfAttention,
        ffn: nn.Module,
        norm: Callable[[], nn.Module],
        residual: Residual,
        dropout: float,
        cross_attn: CrossAttention | None = None,
        prelude: Sequence[nn.Module] = (),
    ):
        """residual: RESIDUALS[model.norm_position], or the one the model/norm option brings (ReZero, Fixup).
        prelude: sub-layers f(h, causal, mask, pos, memory, memory_mask, cache) -> (B, T, D) run first."""
        super().__init__()
        self.residual = residual.fn
        self.prelude = nn.ModuleList(prelude) if prelude else None
        self.norm_prelude = nn.ModuleList(norm() for _ in prelude) if prelude else None
        self.scalars_prelude = (
            nn.ModuleList(_scalars(residual) for _ in prelude) if prelude and residual.scalars else None
        )
        self.self_attn, self.norm_self, self.scalars_self = self_attn, norm(), _scalars(residual)
        self.cross_attn = cross_attn
        self.norm_cross = norm() if cross_attn is not None else None
        self.scalars_cross = _scalars(residual) if cross_attn is not None else None
        self.ffn = ffn
        self.norm_ffn, self.scalars_ffn = (norm(), _scalars(residual)) if ffn is not None else (None, None)
        self.drop = nn.Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        causal: bool,
        mask: torch.Tensor | None,
        pos: Callable,
        memory: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        cache: LayerCache | None = None,
        pool: Callable | None = None,
        padding: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x: (B, T, D). pos rotates q/k (identity unless RoPE). memory: encoder output (B, S, D).
        pool: Funnel's query pooling (lm/zoo/funnel.py): `pos` pools the queries, so attention returns
        (B, T', D), and the residual carries pool(x); the block's output is (B, T', D).
        padding: (B, T') 1 for the tokens this block outputs, 0 for pads: an MoE FFN routes no pad."""
        for i, (f, norm) in enumerate(zip(self.prelude or (), self.norm_prelude or ())):
            x = self.residual(
                x,
                norm,
                lambda h, f=f: f(h, causal, mask, pos, memory, memory_mask, cache),
                self.drop,
                self.scalars_prelude[i] if self.scalars_prelude is not None else None,
            )
        x = self.residual(
            x, self.norm_self, lambda h: self.self_attn(h, causal, mask, pos, cache), self.drop, self.scalars_self, pool
        )
        if self.cross_attn is not None:
            x = self.residual(
                x,
                self.norm_cross,
                lambda h: self.cross_attn(h, memory, memory_mask, cache),
                self.drop,
                self.scalars_cross,
            )
        if self.ffn is None:
            return x
        # An MoE routes only real tokens, in position order when causal (lm/model/moe.py)
        ffn = (lambda h: self.ffn(h, padding, causal)) if isinstance(self.ffn, TokenRouter) else self.ffn
        return self.residual(x, self.norm_ffn, ffn, self.drop, self.scalars_ffn)
