"""Position-wise feed-forward networks: the `model/ffn` config group.

Every option is built as `ffn(dim, bias, dropout)`. Hidden sizes default to parameter-matched
values (Shazeer 2020): a plain MLP has 2 matrices of dim x 4*dim; a GLU has 3 matrices, so its
hidden size is 2/3 of that, 8/3*dim, for the same parameter count.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from lm.model.linear import Linear

ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),  # GPT-2's "gelu_new"
    "silu": F.silu,  # = swish with beta 1 (Ramachandran et al. 2017)
    # The rest of Narang et al. 2021's activation rows (Table 1):
    "elu": F.elu,  # Clevert et al. 2015
    "selu": F.selu,  # Klambauer et al. 2017
    "sigmoid": torch.sigmoid,  # a GLU gated by it is Dauphin et al. 2017's GLU
    "softplus": F.softplus,
    "linear": lambda x: x,  # no nonlinearity: a GLU with it is the bilinear layer, LiGLU (Shazeer 2020)
}


def _activation(name: str):
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; allowed: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def hidden_size(dim: int, hidden_mult: float, multiple_of: int, hidden_dim: int | None) -> int:
    """An explicit hidden_dim wins; else round hidden_mult*dim up to a multiple (Llama uses 256)."""
    if hidden_dim:
        return hidden_dim
    return multiple_of * math.ceil(hidden_mult * dim / multiple_of)


class MLP(nn.Module):
    """x -> act(x W_up) W_down, the Transformer FFN of Vaswani et al. 2017."""

    def __init__(
        self,
        dim: int,
        activation: str = "gelu",
        hidden_mult: float = 4.0,
        multiple_of: int = 1,
        hidden_dim: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
    ):
        super().__init__()
        hidden = hidden_size(dim, hidden_mult, multiple_of, hidden_dim)
        self.act = _activation(activation)
        self.up = Linear(dim, hidden, bias=bias)
        self.down = Linear(hidden, dim, bias=bias, residual=True)  # scaled at init (GPT-2)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.dropout(self.act(self.up(x))))


class _SiLUGate(torch.autograd.Function):
    """silu(gate) * up from the stacked (..., 2*hidden) gate-up output, with the backward writing the gate's and the
    up half's gradients into one (..., 2*hidden) tensor. Through chunk() autograd computes the same two gradients
    and then concatenates them: one more write and read of the FFN's widest activation gradient per layer and step
    (on a CPU, where the eager step is memory-bound elementwise work beside the matmuls, that copy is pure waste).
    The same ops in the same order as eager autograd's (mul's grad * other, silu_backward): bit-identical results
    (tests/test_model_components.py)."""

    @staticmethod
    def forward(ctx, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)  # (B, T, 2*hidden) -> 2 x (B, T, hidden), views
        act = F.silu(gate)
        ctx.save_for_backward(gate, up, act)  # what eager autograd saves: silu's input, mul's two operands
        return act * up

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        gate, up, act = ctx.saved_tensors
        hidden = grad.shape[-1]
        grad_in = grad.new_empty(*grad.shape[:-1], 2 * hidden)  # (B, T, 2*hidden): [d gate | d up]
        torch.ops.aten.silu_backward.grad_input(grad * up, gate, grad_input=grad_in[..., :hidden])
        torch.mul(grad, act, out=grad_in[..., hidden:])
        return grad_in


class GLU(nn.Module):
    """x -> (act(x W_gate) * x W_up) W_down: SwiGLU / GeGLU / ReGLU / GLU (sigmoid) / LiGLU (linear), Shazeer 2020."""

    def __init__(
        self,
        dim: int,
        activation: str = "silu",
        hidden_mult: float = 8 / 3,
        multiple_of: int = 1,
        hidden_dim: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
    ):
        super().__init__()
        hidden = hidden_size(dim, hidden_mult, multiple_of, hidden_dim)
        self.act = _activation(activation)
        self.silu = activation == "silu"
        # W_gate and W_up stacked in one (2*hidden, dim) matrix: one matmul (one kernel launch) instead of two
        # half-size ones; the maths is unchanged. On a CPU it is within a few percent of two either way
        # (docs/results.md, "CPU kernel choices inside the model").
        self.gate_up = Linear(dim, 2 * hidden, bias=bias)
        self.down = Linear(hidden, dim, bias=bias, residual=True)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up(x)  # (B, T, 2*hidden)
        if self.silu and gate_up.requires_grad and not torch.compiler.is_compiling():  # compiled, inductor fuses it
            return self.down(self.dropout(_SiLUGate.apply(gate_up)))
        gate, up = gate_up.chunk(2, dim=-1)  # (B, T, 2*hidden) -> 2 x (B, T, hidden)
        return self.down(self.dropout(self.act(gate) * up))
