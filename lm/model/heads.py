"""Embeddings in and heads out: token (+segment) embeddings, the LM/MLM output head, pooling.

The model/embedding and model/output slots (lm/model/options.py) may replace the token table and the output
layer (`make_head`): the zoo's adaptive input, adaptive softmax and mixture of softmaxes (lm/zoo).
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from lm.constants import IGNORE_INDEX
from lm.model.linear import Linear, MatmulCount
from lm.model.loss import chunked_cross_entropy, target_mean

if TYPE_CHECKING:  # model code reads the config's values; it does not need its schema module to run
    from lm.model.config import ModelConfig


@dataclass
class LMOutput:
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None  # detached whenever `loss` is given (LMHead.output says why)
    # Training-only extras of the model's components (lm/model/aux.py): the weighted auxiliary loss the
    # objective adds to `loss` (MoE load balancing), and detached scalars the loop logs (per-expert load).
    aux_loss: torch.Tensor | None = None
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)


class Embedding(nn.Module):
    """Token embeddings, plus segment (token type) embeddings when n_segments > 0 (BERT).

    A table (nn.Embedding) narrower than model.dim, V x r from a model/embedding option, is projected to it by
    `proj` (r -> D: a factorized embedding, (V + D) r parameters); a tied plain softmax runs `proj` backwards.
    """

    def __init__(self, cfg: "ModelConfig", table: Callable[..., nn.Module] | None = None):
        """table: the model/embedding option's factory, built as table(cfg); None = one (V, D) table."""
        super().__init__()
        self.tok = table(cfg) if table is not None else nn.Embedding(cfg.vocab_size, cfg.dim)
        width = self.tok.embedding_dim if isinstance(self.tok, nn.Embedding) else cfg.dim
        self.proj = Linear(width, cfg.dim, bias=False) if width != cfg.dim else None
        self.seg = nn.Embedding(cfg.n_segments, cfg.dim) if cfg.n_segments else None
        self.scale = math.sqrt(cfg.dim) if cfg.scale_embeddings else 1.0

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        x = self.tok(input_ids)  # (B, T, D), or (B, T, r) from a narrower table
        if self.proj is not None:
            x = self.proj(x)  # (B, T, r) -> (B, T, D)
        if self.scale != 1.0:  # a multiply by 1 would still be a pass over (B, T, D), forward and backward
            x = x * self.scale
        if self.seg is not None:
            x = x + self.seg(token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids))
        return x


def make_head(
    cfg: "ModelConfig",
    output: Callable[..., nn.Module] | None,
    tied: nn.Embedding | None,
    bias: bool,
    transform: nn.Module,
    tied_proj: nn.Linear | None = None,
) -> nn.Module:
    """The output layer: forward(h) -> logits or log-probs (..., V); output(h, labels) -> LMOutput. output: the
    model/output option's factory, built as output(cfg, tied, bias, transform); None = the softmax LMHead."""
    if output is not None:
        return output(cfg, tied, bias, transform)  # an option that cannot tie refuses it in its check
    return LMHead(cfg, tied, bias, transform, tied_proj)


class LMHead(nn.Module):
    """Hidden states -> vocabulary logits, optionally tied to the token embedding (Press & Wolf 2017).

    `transform` is BERT's dense + activation + norm before the output layer; identity elsewhere.
    Tied to a narrower table (Embedding.proj), the output runs the factorization backwards: h (D) -> r through the
    transpose of the input projection, then -> V through the table; untied, it is a plain D x V layer.
    """

    def __init__(
        self,
        cfg: "ModelConfig",
        tied: nn.Embedding | None,
        bias: bool,
        transform: nn.Module,
        tied_proj: nn.Linear | None = None,
    ):
        """tied: the token table whose weight the output reuses; tied_proj: a narrower table's r -> D
        projection (Embedding.proj), run backwards here."""
        super().__init__()
        self.transform = transform
        self.unfactor = TransposedLinear(tied_proj) if tied is not None and tied_proj is not None else None
        self.proj = OutputLinear(tied.weight.shape[1] if tied is not None else cfg.dim, cfg.vocab_size, bias=bias)
        if tied is not None:
            self.proj.weight = tied.weight
        self.logit_scale = cfg.logit_scale
        self.chunk_size = cfg.loss_chunk_size
        self.loss_kernel = cfg.kernels.cross_entropy.value  # model.kernels.cross_entropy: torch, liger or cce

    def _hidden(self, h: torch.Tensor) -> torch.Tensor:
        h = self.transform(h) * self.logit_scale
        return self.unfactor(h) if self.unfactor is not None else h  # (B, T, D) [-> (B, T, r)]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.proj(self._hidden(h))

    def output(self, h: torch.Tensor, labels: torch.Tensor | None) -> LMOutput:
        if labels is not None and (self.chunk_size or self.loss_kernel != "torch"):
            # The loss without the logits (lm/model/loss.py, lm/model/kernels.py): far less memory traffic at large
            # vocabularies.
            return LMOutput(loss=self.proj(self._hidden(h), labels, self.chunk_size, self.loss_kernel))
        logits = self(h)  # (B, T, V)
        if labels is None:
            return LMOutput(logits=logits)
        # fp32 loss: log-softmax over a large vocabulary loses precision in half precision. (B*T, V) against (B*T,)
        summed = F.cross_entropy(
            logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
        )
        loss = target_mean(summed, labels)  # no targets: 0, not NaN
        # Detached: under torch.compile, returned logits that require grad get a (B, T, V) zero gradient
        # allocated and filled in backward though nothing uses it (13 GB of bf16 at GPT-2's vocabulary and
        # 128 x 1024 tokens). Gradients flow through the loss; for a loss of your own, pass no labels.
        return LMOutput(loss=loss, logits=logits.detach())


class TransposedLinear(MatmulCount, nn.Module):
    """h -> h W with the (D, r) weight of an r -> D Linear: its transpose (D -> r) as the same Parameter,
    registered here too so ZeRO-3 / FSDP2 gather it around this module's forward as well."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight = linear.weight

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.weight.to(h.dtype)  # (B, T, D) @ (D, r) -> (B, T, r)

    def active_matmul_params(self, count) -> int:
        return self.weight.numel()  # lm.model.flops: a matmul like any Linear's


class OutputLinear(Linear):
    """The output layer; given labels, it returns the loss instead of logits: chunked (lm/model/loss.py), or a
    fused kernel's (model.kernels.cross_entropy, lm/model/kernels.py).

    The loss reads the weight inside this module's own forward because ZeRO-3 and FSDP2 gather a
    sharded weight only around the forward (and backward) of the module that holds it.
    """

    def forward(
        self, h: torch.Tensor, labels: torch.Tensor | None = None, chunk_size: int = 0, kernel: str = "torch"
    ) -> torch.Tensor:
        if labels is None:
            return super().forward(h)
        if kernel != "torch":
            from lm.model.kernels import fused_linear_cross_entropy

            return fused_linear_cross_entropy(kernel, h, self.weight, self.bias, labels)
        return chunked_cross_entropy(h, self.weight, self.bias, labels, chunk_size)


def mlm_transform(cfg: "ModelConfig", norm: nn.Module, in_dim: int | None = None) -> nn.Module:
    """BERT's prediction-head transform: dense, activation (GELU in BERT; HF uses hidden_act), norm.
    in_dim: the hidden states' width when not model.dim (a narrower stack's states map back to dim)."""
    return nn.Sequential(Linear(in_dim or cfg.dim, cfg.dim), _Lambda(head_activation(cfg)), norm)


def head_activation(cfg: "ModelConfig"):
    """model.mlm_activation: the activation of the prediction heads (BERT's transform, a model/family's heads)."""
    from lm.model.ffn import ACTIVATIONS  # here: a GPT's head has no activation, so importing heads skips ffn.py

    if cfg.mlm_activation not in ACTIVATIONS:
        raise ValueError(f"model.mlm_activation={cfg.mlm_activation!r} is not one of {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[cfg.mlm_activation]


class _Lambda(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def whitening(x: torch.Tensor, eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean m (D,) and map W (D, D) under which pooled vectors x (N, D) have identity covariance,
    (x - m) W (Su et al. 2021): W = U S^-1/2 from the eigendecomposition of cov(x), in float64; eps keeps
    directions of no variance finite."""
    x = x.double()
    m = x.mean(0)
    s, u = torch.linalg.eigh(torch.cov((x - m).T))  # cov: (D, D)
    return m, u / (s.clamp_min(0) + eps).sqrt()


def pool(h: torch.Tensor, padding: torch.Tensor | None, how: str) -> torch.Tensor:
    """(B, T, D) -> (B, D). first: the [CLS] position; mean: over real tokens; last: last real token;
    weighted_mean: real token i (from 1) weighted i / sum of 1..L (SGPT's position-weighted mean,
    Muennighoff 2022).

    Decoders pool the last real token because only it has seen the whole (causal) input; the weighted
    mean keeps every position but trusts the later ones, which have read more of it, in proportion.
    Assumes right padding.
    """
    if how == "first":
        return h[:, 0]
    if padding is None:
        padding = torch.ones(h.shape[:2], dtype=torch.long, device=h.device)
    if how == "last":
        last = padding.long().sum(1).clamp(min=1) - 1  # (B,)
        return h[torch.arange(h.shape[0], device=h.device), last]
    real = padding.to(h.dtype)  # (B, T)
    if how == "mean":
        w = real
    elif how == "weighted_mean":
        w = real.cumsum(1) * real  # 1, 2, ..., L on the real tokens, 0 on padding
    else:
        raise ValueError(f"unknown pooling {how!r}; allowed: first, mean, last, weighted_mean")
    w = w[..., None]  # (B, T, 1)
    return (h * w).sum(1) / w.sum(1).clamp(min=1)
