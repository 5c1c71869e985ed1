"""lm.model.linear: model.linear=onednn gives F.linear's values and gradients; auto, the default, takes it where it
is there."""

import pytest
import torch
import torch.nn.functional as F

from lm.config import ConfigError
from lm.model import build_model, linear
from lm.model.config import ModelConfig
from lm.model.linear import Linear, use_kind


def _reference(layer: Linear, x: torch.Tensor):
    """Output and gradients of plain F.linear on copies of the same tensors."""
    w = layer.weight.detach().clone().requires_grad_()
    b = layer.bias.detach().clone().requires_grad_() if layer.bias is not None else None
    xr = x.detach().clone().requires_grad_()
    y = F.linear(xr, w, b)
    return y, xr, w, b


def _onednn(layer: Linear) -> Linear:
    assert linear.onednn_available(), "oneDNN is in every PyTorch CPU build of the pinned torch"
    return use_kind(layer, "onednn")


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(3, 17, 24), (40, 24), (2, 3, 5, 24)])
def test_onednn_path_matches_f_linear(bias, shape, monkeypatch):
    torch.manual_seed(0)
    layer = _onednn(Linear(24, 40, bias=bias))
    x = torch.randn(*shape, requires_grad=True)
    assert linear._fast_path(x, layer.weight)
    calls = []
    monkeypatch.setattr(
        linear, "_onednn_mm", lambda *a: calls.append(1) or torch.ops.mkldnn._linear_pointwise(*a, "none", [], "")
    )
    y = layer(x)
    y_ref, xr, w, b = _reference(layer, x)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(y)
    y.backward(g)
    y_ref.backward(g)
    assert len(calls) == 2, "forward and input gradient run on oneDNN"
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer.weight.grad, w.grad, rtol=1e-5, atol=1e-5)
    if bias:
        torch.testing.assert_close(layer.bias.grad, b.grad, rtol=1e-5, atol=1e-5)


def test_non_contiguous_input_and_grad():
    torch.manual_seed(0)
    layer = _onednn(Linear(16, 8))
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


def test_other_dtypes_and_the_default_run_f_linear(monkeypatch):
    layer = _onednn(Linear(8, 4)).to(torch.bfloat16)
    x = torch.randn(2, 8, dtype=torch.bfloat16)
    assert not linear._fast_path(x, layer.weight)
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    monkeypatch.setattr(linear, "_onednn_mm", lambda *a: pytest.fail("the default must not call oneDNN"))
    layer32 = Linear(8, 4)
    x32 = torch.randn(2, 8)
    assert torch.equal(layer32(x32), F.linear(x32, layer32.weight, layer32.bias))


def test_model_linear_option_sets_every_linear_and_keeps_the_numbers():
    torch.manual_seed(0)
    plain = build_model(ModelConfig(vocab_size=50, dim=32, n_heads=4, max_seq_len=16, linear="torch"))
    torch.manual_seed(0)
    fast = build_model(ModelConfig(vocab_size=50, dim=32, n_heads=4, max_seq_len=16, linear="onednn"))
    layers = [m for m in fast.modules() if isinstance(m, Linear)]
    assert layers and all(m.onednn for m in layers)
    assert not any(m.onednn for m in plain.modules() if isinstance(m, Linear))
    ids = torch.randint(0, 50, (2, 16))
    torch.testing.assert_close(fast(ids, labels=ids).loss, plain(ids, labels=ids).loss, rtol=1e-5, atol=1e-6)


def test_auto_the_default_takes_onednn_where_the_build_has_it(monkeypatch):
    assert ModelConfig().linear == "auto"
    default = build_model(ModelConfig(vocab_size=50, dim=32, n_heads=4, max_seq_len=16))
    assert all(m.onednn for m in default.modules() if isinstance(m, Linear))
    monkeypatch.setattr(linear, "onednn_available", lambda: False)
    without = build_model(ModelConfig(vocab_size=50, dim=32, n_heads=4, max_seq_len=16))
    assert not any(m.onednn for m in without.modules() if isinstance(m, Linear))


def test_onednn_option_without_the_op_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(linear, "onednn_available", lambda: False)
    with pytest.raises(ConfigError, match=r"model.linear=onednn: this PyTorch build .* use model.linear=torch"):
        build_model(ModelConfig(vocab_size=50, dim=32, n_heads=4, max_seq_len=16, linear="onednn"))
    with pytest.raises(ConfigError, match=r"model.linear='mkl' is not one of"):
        build_model(ModelConfig(vocab_size=50, dim=32, n_heads=4, max_seq_len=16, linear="mkl"))
