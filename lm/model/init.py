"""Weight initialisation schemes, applied after construction so constructors stay plain.

gpt2:   N(0, std) for linear and embedding weights, zero biases, and residual output
        projections scaled by 1/sqrt(2 * n_layers) (Radford et al. 2019, section 2.3).
normal: N(0, std) everywhere, no residual scaling (BERT).
t5:     N(0, fan_in^-1/2) for linear weights, N(0, 1) embeddings (Mesh TensorFlow defaults).
torch:  PyTorch's own defaults (nothing is changed).

An option whose weights start by a rule of its own then applies it: a module that is an OwnInit (the zoo's
adaptive input), an option node's `after_init` (the zoo's Fixup rescales any scheme: lm/zoo/residual.py).
"""

import math

from torch import nn

from lm.model.config import ModelConfig
from lm.model.linear import Linear
from lm.model.registry import slots


class OwnInit:
    """The interface of a module whose weights follow a rule of their own after the scheme's pass over the
    model (the zoo's adaptive input: its banded tables)."""

    def init_weights(self, cfg: ModelConfig) -> None:
        raise NotImplementedError


def _n_layers_applied(cfg: ModelConfig) -> int:
    # GPT-2's 1/sqrt(2 * n_layers) counts two residual branches per layer (attention, FFN); a decoder layer's
    # cross-attention is a third branch, scaled alike but not counted. A shared block counts once per
    # application (model/stack's depth: the Universal Transformer's steps).
    depth = cfg.stack.depth if cfg.stack is not None else (lambda n: n)
    return depth(cfg.n_layers) + (depth(cfg.decoder_layers) if cfg.arch == "encoder_decoder" else 0)


def init_weights(model: nn.Module, cfg: ModelConfig) -> None:
    _base_init(model, cfg)
    for module in model.modules():
        if isinstance(module, OwnInit):
            module.init_weights(cfg)
    for slot in slots():
        option = getattr(cfg, slot, None)
        if option is not None:
            option.after_init(model)


def _base_init(model: nn.Module, cfg: ModelConfig) -> None:
    if cfg.init == "torch":
        return
    residual_std = cfg.init_std / math.sqrt(2 * _n_layers_applied(cfg))
    for module in model.modules():
        if isinstance(module, nn.Linear):
            if cfg.init == "t5":
                std = module.in_features**-0.5
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
