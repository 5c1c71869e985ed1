"""Weight initialisation schemes, applied after construction so constructors stay plain.

gpt2:   N(0, std) for linear and embedding weights, zero biases, and residual output
        projections scaled by 1/sqrt(2 * n_layers) (Radford et al. 2019, section 2.3).
normal: N(0, std) everywhere, no residual scaling (BERT).
t5:     N(0, fan_in^-1/2) for linear weights, N(0, 1) embeddings (Mesh TensorFlow defaults).
torch:  PyTorch's own defaults (nothing is changed).

model/norm=fixup then rescales any of them (Zhang et al. 2019, section 3): see fixup_rescale.
"""

import math

import torch
from torch import nn

from lm.model.config import FixupConfig, ModelConfig
from lm.model.linear import Linear


class OwnInit:
    """The interface of a module whose weights follow a rule of their own after the scheme's pass over the
    model (the zoo's adaptive input: its banded tables)."""

    def init_weights(self, cfg: ModelConfig) -> None:
        raise NotImplementedError


def _n_residual_layers(cfg: ModelConfig) -> int:
    # Each block adds two residual branches (attention and FFN), three with cross-attention.
    # A shared block counts once per application (model/stack's depth: the Universal Transformer's steps).
    depth = cfg.stack.depth if cfg.stack is not None else (lambda n: n)
    return depth(cfg.n_layers) + (depth(cfg.decoder_layers) if cfg.arch == "encoder_decoder" else 0)


def init_weights(model: nn.Module, cfg: ModelConfig) -> None:
    _base_init(model, cfg)
    for module in model.modules():
        if isinstance(module, OwnInit):
            module.init_weights(cfg)
    if isinstance(cfg.norm, FixupConfig):
        fixup_rescale(model)


# Fixup's m: weight layers in series on each residual branch (value then output projection; up then down).
FIXUP_BRANCH_LAYERS = 2


def fixup_scale(n_branches: int, m: int = FIXUP_BRANCH_LAYERS) -> float:
    """L^(-1/(2m-2)) for L residual branches of m layers each (Zhang et al. 2019, rule 2)."""
    return n_branches ** (-1.0 / (2 * m - 2))


def residual_branches(model: nn.Module) -> int:
    """L: residual branches the input passes through, counting each application of a shared block."""
    from lm.model.stack import Stack

    return sum(s.depth * (3 if s.blocks[0].cross_attn is not None else 2) for s in model.modules() if isinstance(s, Stack))


@torch.no_grad()
def fixup_rescale(model: nn.Module) -> None:
    """Fixup without norms (Zhang et al. 2019, section 3): the last layer of every residual branch (the
    attention and FFN output projections) starts at 0, every other layer inside a branch is scaled by
    L^(-1/(2m-2)), and an untied output layer (the classification layer) starts at 0. The per-branch
    scalar bias and multiplier live in lm/model/block.py."""
    from lm.model.block import Block

    scale = fixup_scale(residual_branches(model))
    for block in (m for m in model.modules() if isinstance(m, Block)):
        for layer in (m for m in block.modules() if isinstance(m, nn.Linear)):
            if isinstance(layer, Linear) and layer.residual:
                layer.weight.zero_()
            else:
                layer.weight.mul_(scale)
    head = getattr(model, "head", None)
    if head is not None and not model.cfg.output_tied:
        head.proj.weight.zero_()


def _base_init(model: nn.Module, cfg: ModelConfig) -> None:
    if cfg.init == "torch":
        return
    residual_std = cfg.init_std / math.sqrt(2 * _n_residual_layers(cfg))
    for module in model.modules():
        if isinstance(module, nn.Linear):
            if cfg.init == "t5":
                std = module.in_features ** -0.5
            elif cfg.init == "gpt2" and isinstance(module, Linear) and module.residual:
                std = residual_std
            else:
                std = cfg.init_std
            nn.init.normal_(module.weight, 0.0, std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            std = 1.0 if cfg.init == "t5" else cfg.init_std
            nn.init.normal_(module.weight, 0.0, std)
