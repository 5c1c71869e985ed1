"""`Linear`: nn.Linear with an optional fp32 CPU path through oneDNN (`model.linear=onednn`).

PyTorch runs an fp32 nn.Linear on CPU as MKL sgemm. The oneDNN matmul that PyTorch CPU builds also
ship (the private op torch.ops.mkldnn._linear_pointwise) can run the forward product x W^T and the
input gradient g W faster at Transformer shapes, but not the weight gradient g^T x, which stays on MKL.
On some CPUs whole training steps of small models run 1.3-1.4x faster with it, on others within a few percent
either way (docs/results.md, "CPU kernel choices inside the model"), so the default `model.linear=auto` takes
oneDNN wherever the PyTorch build has the op; `model.linear=torch` is plain F.linear. The products are the
same; only the summation order differs (~1e-6 relative).

Even with the option on, everything but fp32 CPU eager runs plain F.linear: GPUs, half precision and
autocast, torch.compile (which fuses on its own). The weights are an ordinary nn.Linear's: state
dicts, init, FSDP and DeepSpeed see no difference.
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

KINDS = ("auto", "torch", "onednn")


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _onednn_mm(x2d: torch.Tensor, weight: torch.Tensor, bias) -> torch.Tensor:
    """x2d (N, in) @ weight (out, in)^T + bias -> (N, out) on oneDNN."""
    return torch.ops.mkldnn._linear_pointwise(x2d, weight, bias, "none", [], "")


class _OneDNNLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        y = _onednn_mm(x.reshape(-1, x.shape[-1]), weight, bias)  # (..., in) -> (N, in) -> (N, out)
        return y.view(*x.shape[:-1], weight.shape[0])  # (N, out) -> (..., out)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1])  # (N, out)
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = _onednn_mm(g, weight.t(), None).view(*x.shape)  # g (N, out) @ W (out, in)
        if ctx.needs_input_grad[1]:
            dw = g.t().mm(x.reshape(-1, x.shape[-1]))  # g^T x on MKL: faster than oneDNN for this product
        if ctx.needs_input_grad[2]:  # False when there is no bias
            db = g.sum(0)
        return dx, dw, db


def _fast_path(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (
        x.numel() > 0
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
    )


class Linear(nn.Linear):
    onednn: bool = False  # set per model by use_kind (model.linear)

    def __init__(self, in_features: int, out_features: int, bias: bool = True, residual: bool = False, **kw):
        """residual: the layer projects back into the residual stream (attention output, FFN down): GPT-2's
        init scales it by 1/sqrt(2 * layers) and Fixup's starts it at 0 (lm/model/init.py)."""
        super().__init__(in_features, out_features, bias=bias, **kw)
        self.residual = residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.onednn and _fast_path(x, self.weight):
            return _OneDNNLinear.apply(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


def use_kind(model: nn.Module, kind: str) -> nn.Module:
    """Run every Linear of `model` on `kind` (model.linear): torch (F.linear), onednn, or auto (onednn where this
    PyTorch build has the op, else torch)."""
    if kind not in KINDS:
        raise ValueError(f"model.linear={kind!r} is not one of {KINDS}; use model.linear=auto (the default)")
    if kind == "auto":
        kind = "onednn" if onednn_available() else "torch"
    if kind == "onednn" and not onednn_available():
        raise ValueError(
            f"model.linear=onednn: this PyTorch build ({torch.__version__}) has no oneDNN linear op "
            f"(torch.ops.mkldnn._linear_pointwise); use model.linear=torch"
        )
    for m in model.modules():
        if isinstance(m, Linear):
            m.onednn = kind == "onednn"
    return model


def float8_eligible(module: nn.Module) -> bool:
    """Whether train.float8 (lm/engine/float8.py) may run this module's matmuls in float8: lm's plain Linears whose
    widths are multiples of 16 (float8 GEMMs need them). Not the output layer (heads.py's OutputLinear, a subclass:
    its forward computes the loss, and the vocabulary's logits keep bf16, as torchtitan keeps them), nor any other
    subclass with a forward of its own."""
    return type(module) is Linear and module.in_features % 16 == 0 and module.out_features % 16 == 0


class MatmulCount:
    """The interface lm/model/flops.py counts a module by when its matmul weights per token are not just the
    weights of the Linears below it (MoE's top-k experts, a block shared by several layers, a banded
    embedding's one projection per token): `count(child)` counts a child the usual way."""

    def active_matmul_params(self, count: Callable[[nn.Module], float]) -> float:
        raise NotImplementedError
