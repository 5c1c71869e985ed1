"""Transparent attention (model/memory=transparent; Bapna et al. 2018, "Training Deeper Neural Machine
Translation Models with Transparent Attention").

Decoder layer j cross-attends to a learned softmax-weighted combination of every encoder state
(the embeddings and each layer's output) instead of the last layer's alone:
    memory_j = norm( sum_i softmax(w_j)_i h_i ),   i = 0 (embeddings) .. N (last layer)
which gives the lower encoder layers a direct gradient path from every decoder layer.

The states are residual streams; the encoder's final norm (identity when model.final_norm is
false, as in post-norm stacks whose layer outputs are normalised already) is applied to each mix,
so the decoder reads memories on the scale it reads without this option. w starts at 0: every
decoder layer begins with the plain average of the encoder states.
"""

from dataclasses import dataclass

import torch
from torch import nn

from lm.config_base import ConfigError
from lm.model.choices import Arch
from lm.model.options import MemoryConfig
from lm.model.registry import register


@register("memory")
@dataclass
class TransparentConfig(MemoryConfig):
    """model/memory=transparent: every decoder layer cross-attends to its learned mix of the encoder states."""

    _target_: str = "lm.zoo.transparent.TransparentMemory"

    def check(self, model) -> None:
        if model.arch != Arch.encoder_decoder:
            raise ConfigError(
                f"model/memory=transparent with model.arch={model.arch}: transparent attention mixes "
                f"encoder layers into cross-attention, which only encoder_decoder has"
            )


class TransparentMemory(nn.Module):
    def __init__(self, n_encoder_layers: int, n_decoder_layers: int):
        super().__init__()
        self.weights = nn.Parameter(
            torch.zeros(n_decoder_layers, n_encoder_layers + 1)
        )  # w_j, one row per decoder layer

    def forward(self, states: list[torch.Tensor], norm: nn.Module) -> list[torch.Tensor]:
        """states: N+1 tensors (B, S, D) -> one memory (B, S, D) per decoder layer."""
        s = torch.softmax(self.weights.float(), dim=-1).to(states[0].dtype)  # (L_dec, N+1)
        stacked = torch.stack(states)  # (N+1, B, S, D)
        mixed = torch.einsum("ln,nbsd->lbsd", s, stacked)  # (L_dec, B, S, D)
        return [norm(m) for m in mixed.unbind(0)]
