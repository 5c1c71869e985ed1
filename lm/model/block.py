"""The one Transformer block shared by every stack (encoder, decoder, encoder-decoder).

A Block knows from build time whether it has cross-attention; it is told per call whether
attention is causal. Pre- or post-norm, ReZero or Fixup is the residual function it was built
with, not a flag checked in forward.

Block options that change the sub-layer sequence (`model.block`, lm/model/stack.py) fill two more
build-time parts instead of forking the class: `prelude`, extra residual sub-layers run before the
self-attention, each with its own norm (the Evolved Transformer's GLU, convolution branches and
branched attention: lm/model/evolved.py), and `ffn=None`, no FFN sub-layer (the weighted
Transformer, whose attention branches hold the FFNs: lm/model/weighted.py).
"""

from typing import Callable, Dict, Optional, Sequence

import torch
from torch import nn

from lm.model.attention import CrossAttention, LayerCache, SelfAttention
from lm.model.moe import MoE


def _carried(x: torch.Tensor, skip: Optional[Callable]) -> torch.Tensor:
    """What the residual carries: x, or skip(x) when f shortens the sequence (Funnel's pooling)."""
    return x if skip is None else skip(x)


def pre_norm(x: torch.Tensor, norm: nn.Module, f: Callable, drop: nn.Module, s=None,
             skip: Optional[Callable] = None) -> torch.Tensor:
    """x + drop(f(norm(x))): GPT-2, Llama, T5 (Xiong et al. 2020: stable without warmup tricks)."""
    return _carried(x, skip) + drop(f(norm(x)))


def post_norm(x: torch.Tensor, norm: nn.Module, f: Callable, drop: nn.Module, s=None,
              skip: Optional[Callable] = None) -> torch.Tensor:
    """norm(x + drop(f(x))): the original Transformer and BERT."""
    return norm(_carried(x, skip) + drop(f(x)))


def rezero(x: torch.Tensor, norm: nn.Module, f: Callable, drop: nn.Module, s: "BranchScalars",
           skip: Optional[Callable] = None) -> torch.Tensor:
    """x + alpha * drop(f(norm(x))), alpha learned from 0: every block starts as the identity, so deep
    stacks train without a norm (Bachlechner et al. 2020). norm is the identity unless rezero_layernorm/_rmsnorm."""
    return _carried(x, skip) + s.alpha * drop(f(norm(x)))


def fixup(x: torch.Tensor, norm: nn.Module, f: Callable, drop: nn.Module, s: "BranchScalars",
          skip: Optional[Callable] = None) -> torch.Tensor:
    """x + multiplier * drop(f(x + bias)): Fixup's scalar bias before the branch and scalar multiplier after
    it (Zhang et al. 2019); with no norm, the rescaled init (lm/model/init.py) keeps the updates bounded."""
    return _carried(x, skip) + s.multiplier * drop(f(norm(x) + s.bias))


RESIDUALS = {"pre": pre_norm, "post": post_norm, "rezero": rezero, "fixup": fixup}
# The learned scalars a residual function reads, one set per branch, with their initial values.
RESIDUAL_SCALARS: Dict[str, Dict[str, float]] = {"rezero": {"alpha": 0.0}, "fixup": {"bias": 0.0, "multiplier": 1.0}}


class BranchScalars(nn.Module):
    """The scalar parameters of one residual branch (ReZero's alpha; Fixup's bias and multiplier)."""

    def __init__(self, initial: Dict[str, float]):
        super().__init__()
        for name, value in initial.items():
            # shape (1,), not (): DeepSpeed broadcasts parameters as bytes, which a 0-dim tensor cannot be
            self.register_parameter(name, nn.Parameter(torch.full((1,), float(value))))


def _scalars(residual: str) -> Optional[BranchScalars]:
    return BranchScalars(RESIDUAL_SCALARS[residual]) if residual in RESIDUAL_SCALARS else None


class Block(nn.Module):
    def __init__(self, self_attn: SelfAttention, ffn: nn.Module, norm: Callable[[], nn.Module],
                 residual: str, dropout: float, cross_attn: Optional[CrossAttention] = None,
                 prelude: Sequence[nn.Module] = ()):
        """residual: a key of RESIDUALS (model.norm_position, or the one model/norm=rezero*/fixup names).
        prelude: sub-layers f(h, causal, mask, pos, memory, memory_mask, cache) -> (B, T, D) run first."""
        super().__init__()
        self.residual = RESIDUALS[residual]
        self.prelude = nn.ModuleList(prelude) if prelude else None
        self.norm_prelude = nn.ModuleList(norm() for _ in prelude) if prelude else None
        self.scalars_prelude = nn.ModuleList(_scalars(residual) for _ in prelude) if prelude and residual in RESIDUAL_SCALARS else None
        self.self_attn, self.norm_self, self.scalars_self = self_attn, norm(), _scalars(residual)
        self.cross_attn = cross_attn
        self.norm_cross = norm() if cross_attn is not None else None
        self.scalars_cross = _scalars(residual) if cross_attn is not None else None
        self.ffn = ffn
        self.norm_ffn, self.scalars_ffn = (norm(), _scalars(residual)) if ffn is not None else (None, None)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, causal: bool, mask: Optional[torch.Tensor], pos: Callable,
                memory: Optional[torch.Tensor] = None, memory_mask: Optional[torch.Tensor] = None,
                cache: Optional[LayerCache] = None, pool: Optional[Callable] = None,
                padding: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x: (B, T, D). pos rotates q/k (identity unless RoPE). memory: encoder output (B, S, D).
        pool: Funnel's query pooling (lm/model/funnel.py): `pos` pools the queries, so attention returns
        (B, T', D), and the residual carries pool(x); the block's output is (B, T', D).
        padding: (B, T') 1 for the tokens this block outputs, 0 for pads: an MoE FFN routes no pad."""
        for i, (f, norm) in enumerate(zip(self.prelude or (), self.norm_prelude or ())):
            x = self.residual(x, norm, lambda h, f=f: f(h, causal, mask, pos, memory, memory_mask, cache), self.drop,
                              self.scalars_prelude[i] if self.scalars_prelude is not None else None)
        x = self.residual(x, self.norm_self, lambda h: self.self_attn(h, causal, mask, pos, cache), self.drop,
                          self.scalars_self, pool)
        if self.cross_attn is not None:
            x = self.residual(x, self.norm_cross, lambda h: self.cross_attn(h, memory, memory_mask, cache), self.drop,
                              self.scalars_cross)
        if self.ffn is None:
            return x
        # An MoE routes only real tokens, in position order when causal (lm/model/moe.py)
        ffn = (lambda h: self.ffn(h, padding, causal)) if isinstance(self.ffn, MoE) else self.ffn
        return self.residual(x, self.norm_ffn, ffn, self.drop, self.scalars_ffn)
