"""Normalisation layers: the `model/norm` config group.

Every norm is built as `norm(dim, eps)`: the option file holds only its own hyperparameters
(e.g. `bias`), the parent supplies the width and epsilon. (No norm at all, ReZero and Fixup: lm/zoo/residual.py.)
"""

import torch
import torch.nn.functional as F
from torch import nn


class LayerNorm(nn.Module):
    """LayerNorm (Ba et al. 2016) with an optional bias (GPT-2/BERT keep it, many recent models drop it)."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """RMSNorm (Zhang & Sennrich 2019): rescale by the root mean square, no centering, no bias."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 as Llama and T5 do: the mean of squares underflows in half precision.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)
