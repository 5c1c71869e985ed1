"""`Linear`: nn.Linear with a faster fp32 CPU path through oneDNN.

PyTorch runs an fp32 nn.Linear on CPU as MKL sgemm. The oneDNN matmul that every PyTorch CPU build
also ships (torch.ops.mkldnn) ran the forward product x W^T 1.2-1.5x and the input gradient g W
1.1-1.3x faster at Transformer shapes (2048 tokens, width 384..2048) on the 2-core AMD EPYC of
BENCHMARKS.md, and the weight gradient g^T x about 0.85x, so the weight gradient stays on MKL. The
products are the same; only the summation order differs (relative differences ~1e-6).

Everything else is plain F.linear: GPUs, half precision and autocast, torch.compile (which fuses on
its own), builds without oneDNN, and LM_ONEDNN_LINEAR=0 (for A/B timing or a suspected kernel bug).
The weights are an ordinary nn.Linear's: state dicts, init, FSDP and DeepSpeed see no difference.
"""

import os

import torch
import torch.nn.functional as F
from torch import nn


def _onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


ENABLED = os.environ.get("LM_ONEDNN_LINEAR", "1") != "0" and _onednn_available()


def _onednn_mm(x2d: torch.Tensor, weight: torch.Tensor, bias) -> torch.Tensor:
    """x2d (N, in) @ weight (out, in)^T + bias -> (N, out) on oneDNN."""
    return torch.ops.mkldnn._linear_pointwise(x2d, weight, bias, "none", [], "")


class _OneDNNLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        y = _onednn_mm(x.reshape(-1, x.shape[-1]), weight, bias)  # (..., in) -> (N, in) -> (N, out)
        return y.view(*x.shape[:-1], weight.shape[0])

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
    return (ENABLED and x.numel() > 0 and x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
            and not torch.is_autocast_enabled("cpu") and not torch.compiler.is_compiling())


class Linear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _fast_path(x, self.weight):
            return _OneDNNLinear.apply(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)
