"""lm.model.linear.Linear: the oneDNN CPU path gives nn.Linear's values and gradients."""

import pytest
import torch
import torch.nn.functional as F

from lm.model import linear
from lm.model.linear import Linear


def _reference(layer: Linear, x: torch.Tensor):
    """Output and gradients of plain F.linear on copies of the same tensors."""
    w = layer.weight.detach().clone().requires_grad_()
    b = layer.bias.detach().clone().requires_grad_() if layer.bias is not None else None
    xr = x.detach().clone().requires_grad_()
    y = F.linear(xr, w, b)
    return y, xr, w, b


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(3, 17, 24), (40, 24), (2, 3, 5, 24)])
def test_onednn_path_matches_f_linear(bias, shape):
    assert linear.ENABLED, "oneDNN is in every PyTorch CPU build; the fast path should be on"
    torch.manual_seed(0)
    layer = Linear(24, 40, bias=bias)
    x = torch.randn(*shape, requires_grad=True)
    assert linear._fast_path(x, layer.weight)
    y = layer(x)
    y_ref, xr, w, b = _reference(layer, x)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(y)
    y.backward(g)
    y_ref.backward(g)
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer.weight.grad, w.grad, rtol=1e-5, atol=1e-5)
    if bias:
        torch.testing.assert_close(layer.bias.grad, b.grad, rtol=1e-5, atol=1e-5)


def test_non_contiguous_input_and_grad():
    torch.manual_seed(0)
    layer = Linear(16, 8)
    base = torch.randn(4, 16, 6, requires_grad=True)
    x = base.transpose(1, 2)  # (4, 6, 16), not contiguous
    y = layer(x)
    y_ref, xr, w, _ = _reference(layer, x)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    g = torch.randn(4, 8, 6).transpose(1, 2)  # a non-contiguous upstream gradient
    y.backward(g)
    y_ref.backward(g)
    torch.testing.assert_close(base.grad.transpose(1, 2), xr.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer.weight.grad, w.grad, rtol=1e-5, atol=1e-5)


def test_other_dtypes_and_switch_fall_back_to_f_linear(monkeypatch):
    layer = Linear(8, 4).to(torch.bfloat16)
    x = torch.randn(2, 8, dtype=torch.bfloat16)
    assert not linear._fast_path(x, layer.weight)
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    monkeypatch.setattr(linear, "ENABLED", False)
    layer32 = Linear(8, 4)
    x32 = torch.randn(2, 8)
    assert not linear._fast_path(x32, layer32.weight)
    assert torch.equal(layer32(x32), F.linear(x32, layer32.weight, layer32.bias))
