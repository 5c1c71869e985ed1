"""ReZero (Bachlechner et al. 2020) and Fixup (Zhang et al. 2019): model/norm=rezero | rezero_layernorm |
rezero_rmsnorm | fixup, the norm options of Narang et al. 2021's Table 1 that change the residual itself.

Each names its residual function (lm/model/block.py's Residual: the function and the learned scalars each
branch holds, in the block's `scalars_*` modules) through NormConfig.residual(), so the Block stays one class;
the norm it builds is the one each branch (and the final, embedding and q/k norms) still applies: none, or the
LayerNorm/RMSNorm of the "ReZero + norm" rows. Fixup also rescales the initial weights (`after_init`).
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from lm.config_base import Choice, ConfigError
from lm.model.attention import _Attention
from lm.model.block import Block, BranchScalars, Residual, carried
from lm.model.choices import NormPosition
from lm.model.linear import Linear
from lm.model.norms import LayerNorm, RMSNorm
from lm.model.options import NormConfig, option_name
from lm.model.registry import register
from lm.model.stack import Stack
from lm.zoo.adaptive import AdaptiveSoftmax

# -- the residual functions ------------------------------------------------------------------------


def rezero(
    x: torch.Tensor, norm: nn.Module, f: Callable, drop: nn.Module, s: BranchScalars, skip: Callable | None = None
) -> torch.Tensor:
    """x + alpha * drop(f(norm(x))), alpha learned from 0: every block starts as the identity, so deep
    stacks train without a norm (Bachlechner et al. 2020). norm is the identity unless rezero_layernorm/_rmsnorm."""
    return carried(x, skip) + s.alpha * drop(f(norm(x)))


def fixup(
    x: torch.Tensor, norm: nn.Module, f: Callable, drop: nn.Module, s: BranchScalars, skip: Callable | None = None
) -> torch.Tensor:
    """x + multiplier * drop(f(x + bias)): Fixup's scalar bias before the branch and scalar multiplier after
    it (Zhang et al. 2019); with no norm, the rescaled init (fixup_rescale) keeps the updates bounded."""
    return carried(x, skip) + s.multiplier * drop(f(norm(x) + s.bias))


REZERO = Residual(rezero, {"alpha": 0.0})
FIXUP = Residual(fixup, {"bias": 0.0, "multiplier": 1.0})


# -- the norms the branches apply ------------------------------------------------------------------


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


# -- the option schemas (conf/model/norm/rezero*.yaml, fixup.yaml) ---------------------------------


class ReZeroNorm(Choice):
    none = "none"  # ReZero proper: no norm anywhere
    layernorm = "layernorm"  # Narang et al.'s "ReZero + LayerNorm"
    rmsnorm = "rmsnorm"  # Narang et al.'s "ReZero + RMS Norm"


@dataclass
class _ResidualNormConfig(NormConfig):
    """What ReZero and Fixup refuse alike: a norm position (they define the residual) and, without a norm, the
    fields that need one."""

    def has_norm(self) -> bool:
        return False

    def check(self, model) -> None:
        name = f"model/norm={option_name(self)}"
        if model.norm_position != NormPosition.pre:
            raise ConfigError(
                f"{name} defines its own residual (x + scalar * f(x)); model.norm_position="
                f"{model.norm_position} does not apply: leave it at pre"
            )
        for field in ("qk_norm", "embed_norm", "mlm_transform"):
            if not self.has_norm() and getattr(model, field):
                raise ConfigError(
                    f"{name} has no norm, but model.{field}=true needs one; set model.{field}=false"
                    f" or pick model/norm=rezero_layernorm or rezero_rmsnorm"
                )


@register("norm")
@dataclass
class ReZeroConfig(_ResidualNormConfig):
    """model/norm=rezero, rezero_layernorm, rezero_rmsnorm: each residual branch is scaled by a learned
    scalar initialised to 0 (Bachlechner et al. 2020), with no norm or a norm inside the branch."""

    _target_: str = "lm.zoo.residual.rezero_norm"
    with_norm: ReZeroNorm = ReZeroNorm.none

    @property
    def option_file(self) -> str:
        """rezero, rezero_layernorm or rezero_rmsnorm: the file that sets with_norm (option_name, for messages)."""
        return "rezero" if self.with_norm == ReZeroNorm.none else f"rezero_{ReZeroNorm(self.with_norm).value}"

    def residual(self) -> Residual:
        return REZERO

    def has_norm(self) -> bool:
        return self.with_norm != ReZeroNorm.none


@register("norm")
@dataclass
class FixupConfig(_ResidualNormConfig):
    """model/norm=fixup: no norm; a scalar bias and multiplier per branch and Fixup's rescaled init (Zhang et al.
    2019)."""

    _target_: str = "lm.zoo.residual.fixup_norm"

    def residual(self) -> Residual:
        return FIXUP

    def after_init(self, model: nn.Module) -> None:
        fixup_rescale(model)


# -- Fixup's initialisation ------------------------------------------------------------------------

# Fixup's m: weight layers in series on a residual branch. An FFN has 2 (up, down). Multi-head attention has 4:
# softmax(q k^T) v ~ q k^T v is three layers in series (W_Q, W_K, W_V), then W_O (the Fixup author's reading,
# github.com/hongyi-zhang/Fixup issue 8, and Mesh TensorFlow's fixup_layers.py, which Narang et al. 2021 ran).
FFN_LAYERS, ATTENTION_LAYERS = 2, 4


def residual_linears(module: nn.Module) -> list[nn.Module]:
    """The Linear(residual=True) layers of a module: those that project back into the residual stream."""
    return [m for m in module.modules() if isinstance(m, Linear) and m.residual]


class FixupBranch:
    """The interface of a residual branch shaped unlike attention (m = 4) or an FFN (m = 2), for Fixup's init: the
    zoo's convolutions, the weighted Transformer's branch, the Evolved Transformer's prelude sub-layers."""

    fixup_depth: ClassVar[int]  # m: weight layers in series on the branch

    def fixup_last(self) -> list[nn.Module]:
        """The layers that end the branch, which start at 0: by default its Linear(residual=True)s."""
        assert isinstance(self, nn.Module)
        return residual_linears(self)


def fixup_scale(n_branches: int, m: int = FFN_LAYERS) -> float:
    """L^(-1/(2m-2)) for L residual branches of m layers each (Zhang et al. 2019, rule 2)."""
    return n_branches ** (-1.0 / (2 * m - 2))


def residual_branches(model: nn.Module) -> int:
    """L: residual branches the input passes through, counting each application of a shared block."""
    stacks = [m for m in model.modules() if isinstance(m, Stack)]
    return sum(s.depth * (3 if s.blocks[0].cross_attn is not None else 2) for s in stacks)


def branches(block: Block) -> list[nn.Module]:
    """The sub-layers a Block wraps in a residual each: its prelude's, self-attention, cross-attention, FFN."""
    return [b for b in (*(block.prelude or ()), block.self_attn, block.cross_attn, block.ffn) if b is not None]


def branch_depth(branch: nn.Module) -> int:
    """m of one branch: what a FixupBranch declares, else by kind (attention's 4, anything else an FFN's 2)."""
    if isinstance(branch, FixupBranch):
        return branch.fixup_depth
    return ATTENTION_LAYERS if isinstance(branch, _Attention) else FFN_LAYERS


def last_layers(branch: nn.Module) -> list[nn.Module]:
    """The layers that end a branch (Fixup starts them at 0)."""
    return branch.fixup_last() if isinstance(branch, FixupBranch) else residual_linears(branch)


@torch.no_grad()
def fixup_rescale(model: nn.Module) -> None:
    """Fixup without norms (Zhang et al. 2019, section 3): the last layer of every residual branch (the
    attention and FFN output projections) starts at 0; every other weight layer (Linear, convolution) of a branch
    is scaled by L^(-1/(2m-2)), m the branch's layers in series: L^(-1/6) in attention (q, k, v: m = 4), L^(-1/2) in
    an FFN (m = 2), L^(-1/4) in model/attn=lightweight_conv|dynamic_conv (input projection, convolution, output:
    m = 3; the lightweight kernel, softmax-normalised, has no scale to set); model/block=weighted's one branch runs
    attention, W^{O_i} and the head's FFN in series (m = 6, only the FFNs' down projections start at 0);
    model/block=evolved's prelude declares its own (lm/zoo/evolved.py). An untied output layer (the classification
    layer) starts at 0. The per-branch scalar bias and multiplier are the block's `scalars_*`: one bias before each
    branch, not the paper's one before every layer and activation inside it (a simplification; Narang et al.'s Mesh
    TensorFlow code adds one more, before the FFN's down projection)."""
    L = residual_branches(model)
    for block in (m for m in model.modules() if isinstance(m, Block)):
        for branch in branches(block):
            last = {id(m) for m in last_layers(branch)}
            for layer in (m for m in branch.modules() if isinstance(m, (nn.Linear, nn.Conv1d))):
                if id(layer) in last:
                    layer.weight.zero_()
                else:
                    layer.weight.mul_(fixup_scale(L, branch_depth(branch)))
    head = getattr(model, "head", None)
    if head is not None and not model.cfg.output_tied:
        for layer in logit_layers(head):
            layer.weight.zero_()


def logit_layers(head: nn.Module) -> list[nn.Module]:
    """The layers of an output module that produce logits, which Fixup starts at 0: the softmax head's (and a
    mixture of softmaxes') projection; the adaptive softmax's head cluster and the last layer of each tail."""
    if isinstance(head, AdaptiveSoftmax):
        return [head.asm.head, *(cluster[-1] for cluster in head.asm.tail)]
    return [head.proj]
