"""Parameter sharing across layers (model/stack=shared): one block reused by every layer of a stack (ALBERT,
Lan et al. 2019), and the Universal Transformer (model/stack=universal, Dehghani et al. 2019): one block
applied recurrently for `steps` steps with a timestep embedding added before each step (no adaptive halting).

A shared stack applies `depth` layers with one Block, so layer i runs blocks[i % 1] (lm/model/stack.py's
Stack takes n_blocks); the Block and the residual stream are unchanged, only how many Blocks exist.
"""

import math
from dataclasses import dataclass

import torch
from torch import nn

from lm.config_base import Choice, ConfigError
from lm.model.choices import Arch
from lm.model.linear import MatmulCount
from lm.model.options import StackConfig
from lm.model.registry import register
from lm.model.stack import Components, Stack
from lm.zoo.pkm import PKMConfig
from lm.zoo.transparent import TransparentConfig


class Share(Choice):
    all = "all"  # every stack reuses one block of its own (an encoder block has no cross-attention)
    encoder = "encoder"  # the bidirectional stack only
    decoder = "decoder"  # the causal stack only


class StepKind(Choice):
    sinusoidal = "sinusoidal"  # fixed sinusoids of the step number (Dehghani et al. 2019)
    learned = "learned"  # one learned vector per step


@register("stack")
@dataclass
class SharedConfig(StackConfig):
    """model/stack=shared (universal false) and model/stack=universal (universal true)."""

    _target_: str = "lm.zoo.sharing.shared_stack"
    share: Share = Share.all  # the stacks that reuse one block
    # the Universal Transformer: each stack is one block applied `steps` times (None: its n_layers times),
    # with a timestep embedding added before each step; sinusoids have norm sqrt(dim/2): tensor2tensor's UT
    # also scales token embeddings by sqrt(dim) (model.scale_embeddings=true) so they are not swamped
    universal: bool = False
    steps: int | None = None
    step_embedding: StepKind = StepKind.sinusoidal

    @property
    def option_file(self) -> str:
        return "universal" if self.universal else "shared"

    def depth(self, n_layers: int) -> int:
        return (self.steps or n_layers) if self.universal else n_layers

    def describe(self) -> str:
        if not self.universal:
            return f"model/stack=shared (model.stack.share={self.share})"
        return f"model/stack=universal (model.stack.steps={self.steps or 'n_layers'})"

    def unread(self, model) -> str | None:
        if not self.universal and self.step_embedding != StepKind.sinusoidal:
            return (
                f"model.stack.step_embedding={self.step_embedding.value} has no effect: {self.describe()} adds no "
                f"step embedding (the Universal Transformer's, model/stack=universal, does); drop the override"
            )
        return None

    def check(self, model) -> None:
        stacks = {Arch.decoder: {"decoder"}, Arch.encoder: {"encoder"}, Arch.encoder_decoder: {"encoder", "decoder"}}
        if self.share in ("encoder", "decoder") and self.share not in stacks[model.arch]:
            raise ConfigError(
                f"model.stack.share={self.share}: model.arch={model.arch} has no {self.share} stack; "
                f"use model.stack.share=all or {' / '.join(sorted(stacks[model.arch]))}"
            )
        if self.steps is not None and (not self.universal or not isinstance(self.steps, int) or self.steps < 1):
            raise ConfigError(
                f"model.stack.steps={self.steps!r} must be a positive number of steps, and applies to "
                f"model/stack=universal only (null: as many as the stack has layers)"
            )
        if self.universal and self.share in ("encoder", "decoder"):
            raise ConfigError(
                f"{self.describe()} makes every stack one recurrent block; model.stack.share="
                f"{self.share} would leave the other stack unshared: use all"
            )
        if model.attn_scale_by_layer:
            raise ConfigError(
                f"model.attn_scale_by_layer=true scales each layer differently, so its blocks cannot be "
                f"shared ({self.describe()})"
            )
        if isinstance(model.block, PKMConfig):
            raise ConfigError(
                f"{self.describe()} with model/block=pkm (model.block.layers={list(model.block.layers)}): "
                f"the memory replaces the FFN of chosen blocks, which a shared block cannot single out; "
                f"drop one of them"
            )
        if self.universal and isinstance(model.memory, TransparentConfig):
            raise ConfigError(
                f"{self.describe()} with model/memory=transparent: transparent attention mixes "
                f"model.n_layers encoder layers, the Universal Transformer applies steps; use "
                f"model/stack=shared with it instead"
            )


def shared_stack(
    cfg,
    c: Components,
    n_layers: int,
    causal: bool,
    cross: bool,
    share: Share,
    universal: bool,
    steps: int | None,
    step_embedding: StepKind,
) -> Stack:
    """A SharedStack where the option shares this stack (causal = the decoder, bidirectional = the encoder)."""
    if universal:
        return SharedStack(cfg, c, steps or n_layers, causal, cross, step_embedding)
    if share in ("all", "decoder" if causal else "encoder"):
        return SharedStack(cfg, c, n_layers, causal, cross)
    return Stack(cfg, c, n_layers, causal, cross)


class SharedStack(MatmulCount, Stack):
    """One block applied n_layers times; with a step embedding kind, the Universal Transformer's steps."""

    def __init__(self, cfg, c: Components, n_layers: int, causal: bool, cross: bool, step_embedding: str | None = None):
        super().__init__(cfg, c, n_layers, causal, cross, n_blocks=1)
        self.step_embed = StepEmbedding(cfg.dim, n_layers, step_embedding) if step_embedding else None

    def enter_layer(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        return x if self.step_embed is None else self.step_embed(x, layer)

    def active_matmul_params(self, count) -> float:
        """lm.model.flops: the shared block runs once per layer."""
        return sum(count(m) for name, m in self.named_children() if name != "blocks") + self.depth * sum(
            count(b) for b in self.blocks
        )


class StepEmbedding(nn.Module):
    """The Universal Transformer's timestep embedding: a (D,) vector per step, added to every position."""

    def __init__(self, dim: int, steps: int, kind: str):
        super().__init__()
        if kind == "learned":
            self.table = nn.Embedding(steps, dim)  # initialised with the other embeddings (lm/model/init.py)
        else:
            step = torch.arange(steps, dtype=torch.float32)[:, None]
            inv_freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
            table = torch.zeros(steps, dim)
            table[:, 0::2] = torch.sin(step * inv_freq)
            table[:, 1::2] = torch.cos(step * inv_freq[: dim // 2])
            self.register_buffer("fixed", table, persistent=False)  # (steps, D), recomputed, never saved
            self.table = None

    def forward(self, x: torch.Tensor, step: int) -> torch.Tensor:
        """x: (B, T, D) before step `step` (0-based)."""
        e = self.table.weight[step] if self.table is not None else self.fixed[step]
        return x + e.to(x.dtype)
