"""Normalisation layers: the `model/norm` config group.

Every norm is built as `norm(dim, eps)`: the option file holds only its own hyperparameters
(e.g. `bias`), the parent supplies the width and epsilon.
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


# -- no norm: ReZero and Fixup (model/norm=rezero*, fixup) -----------------------------------------
# These options change the residual function, not just the norm (lm/model/block.py's RESIDUALS):
# their schemas in lm/model/options.py name it. The factories below build the norm each branch (and
# the final, embedding and q/k norms) still applies: none, or the LayerNorm/RMSNorm of the
# ReZero + norm rows of Narang et al. 2021.

class NoNorm(nn.Identity):
    """The identity, built as norm(dim, eps) like every other option."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()


REZERO_NORMS = {"none": NoNorm, "layernorm": LayerNorm, "rmsnorm": RMSNorm}


def rezero_norm(dim: int, eps: float = 1e-5, with_norm: str = "none") -> nn.Module:
    """ReZero's norm: none (Bachlechner et al. 2020), or a LayerNorm / RMSNorm kept inside the branch."""
    return REZERO_NORMS[with_norm](dim, eps=eps)


def fixup_norm(dim: int, eps: float = 1e-5) -> nn.Module:
    """Fixup has no norm at all (Zhang et al. 2019); its scalars live with the residual function."""
    return NoNorm(dim, eps)
