"""The chunked output projection + cross-entropy equals the plain one, value and gradients."""

import pytest
import torch
import torch.nn.functional as F

from lm.model.config import ModelConfig
from lm.model import build_model
from lm.model.loss import chunked_cross_entropy, cross_entropy
from tests.benchmark_scripts import load


@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_plain_cross_entropy(with_bias):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(37, 16, generator=g, requires_grad=True)
    w = torch.randn(101, 16, generator=g, requires_grad=True)
    b = torch.randn(101, generator=g, requires_grad=True) if with_bias else None
    labels = torch.randint(0, 101, (37,), generator=g)
    labels[::5] = -100  # some ignored targets
    ref = F.cross_entropy(F.linear(h, w, b), labels, ignore_index=-100)
    ref_grads = torch.autograd.grad(ref * 3.0, [t for t in (h, w, b) if t is not None])
    loss = chunked_cross_entropy(h, w, b, labels, chunk_size=8)
    grads = torch.autograd.grad(loss * 3.0, [t for t in (h, w, b) if t is not None])
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    for a, r in zip(grads, ref_grads):
        torch.testing.assert_close(a, r, rtol=1e-4, atol=1e-6)


class _MatmulDtypes(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the operand dtypes of every matrix multiply dispatched inside it."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] in ("mm", "addmm", "addmm_", "bmm", "matmul", "linear"):
            self.seen.append((func.__name__, [a.dtype for a in args if isinstance(a, torch.Tensor)]))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("h_dtype", [torch.float32, torch.bfloat16])
def test_under_bf16_autocast_every_matmul_stays_bf16_and_matches_the_plain_loss(with_bias, h_dtype):
    """Under autocast the weight is fp32 and the activations fp32 (a final norm's output: norms run in
    fp32) or bf16. The loss must neither fail on mixed dtypes (bf16 h did, in eager mode) nor run a GEMM
    in fp32 (fp32 h did: the whole output layer off the GPU's bf16 path), and must agree with autocast's
    own linear + cross-entropy to bf16 precision."""
    g = torch.Generator().manual_seed(0)
    h32 = torch.randn(40, 16, generator=g, requires_grad=True)
    w = torch.randn(97, 16, generator=g, requires_grad=True)
    b = torch.randn(97, generator=g, requires_grad=True) if with_bias else None
    labels = torch.randint(0, 97, (40,), generator=g)
    labels[::7] = -100
    params = [t for t in (h32, w, b) if t is not None]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = F.cross_entropy(F.linear(h32.to(torch.bfloat16), w, b).float(), labels, ignore_index=-100)
    ref_grads = torch.autograd.grad(ref, params)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = h32.to(h_dtype)
        with _MatmulDtypes() as rec:
            loss = chunked_cross_entropy(h, w, b, labels, chunk_size=16)
    grads = torch.autograd.grad(loss, params)
    assert len(rec.seen) == 3 * 3  # three chunks: logits, grad_h and grad_w each
    assert all(dtypes == [torch.bfloat16, torch.bfloat16] for _, dtypes in rec.seen), rec.seen
    assert [t.dtype for t in grads] == [torch.float32] * len(params)  # the master weights' dtype
    torch.testing.assert_close(loss, ref, rtol=2e-2, atol=2e-2)
    for a, r in zip(grads, ref_grads):
        torch.testing.assert_close(a, r, rtol=5e-2, atol=5e-3)


@pytest.mark.parametrize("arch,tied", [("decoder", True), ("decoder", False), ("encoder", True)])
def test_model_with_chunked_loss_trains_identically(arch, tied):
    def grads(chunk):
        torch.manual_seed(0)
        cfg = ModelConfig(arch=arch, vocab_size=97, dim=32, n_layers=1, n_heads=4, tie_embeddings=tied, loss_chunk_size=chunk)
        model = build_model(cfg)
        x = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(1))
        loss = model(input_ids=x, labels=torch.roll(x, -1, 1)).loss
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in model.named_parameters()}

    loss_plain, g_plain = grads(0)
    loss_chunk, g_chunk = grads(5)
    torch.testing.assert_close(loss_chunk, loss_plain, rtol=1e-5, atol=1e-6)
    for name in g_plain:
        torch.testing.assert_close(g_chunk[name], g_plain[name], rtol=1e-4, atol=1e-6, msg=name)


def _logits_and_labels(n=48, v=97, dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    logits = (3 * torch.randn(n, v, generator=g)).to(dtype).requires_grad_()
    labels = torch.randint(0, v, (n,), generator=g)
    labels[::4] = -100
    return logits, labels


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_cross_entropy_matches_f_cross_entropy(dtype):
    """The torch.compile form (log-sum-exp minus an iota-picked target logit) against F.cross_entropy."""
    logits, labels = _logits_and_labels(dtype=dtype)
    ref = F.cross_entropy(logits.float(), labels, ignore_index=-100)
    (ref_grad,) = torch.autograd.grad(ref * 3.0, logits)
    torch._dynamo.reset()
    loss = torch.compile(cross_entropy, backend="aot_eager", fullgraph=True)(logits, labels)
    (grad,) = torch.autograd.grad(loss * 3.0, logits)
    assert loss.dtype == torch.float32 and grad.dtype == dtype
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-6)
    assert grad[::4].abs().max() == 0  # ignored rows get no gradient


def test_compiled_cross_entropy_is_nan_without_a_valid_label_like_f_cross_entropy():
    logits, labels = _logits_and_labels()
    labels[:] = -100
    torch._dynamo.reset()
    assert F.cross_entropy(logits, labels).isnan()
    assert torch.compile(cross_entropy, backend="aot_eager", fullgraph=True)(logits, labels).isnan()


def test_compiled_cross_entropy_keeps_bf16_logits_for_backward_not_fp32_log_probs():
    """What the GPU's memory bandwidth pays for: F.cross_entropy's decomposition saves the fp32 log-softmax
    (N, V); the compiled form saves the bf16 logits and an (N,) log-sum-exp."""
    g = torch.Generator().manual_seed(2)
    h = torch.randn(64, 16, generator=g, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(1000, 16, generator=g, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, 1000, (64,), generator=g)
    saved_for_backward = load("loss_saved_probe").saved_for_backward
    plain = saved_for_backward(lambda h, w, y: F.cross_entropy(F.linear(h, w).float(), y), h, w, labels)
    ours = saved_for_backward(lambda h, w, y: cross_entropy(F.linear(h, w), y), h, w, labels)
    assert ((64, 1000), torch.float32) in plain  # the baseline this test is about
    assert ((64, 1000), torch.float32) not in ours
    assert ((64, 1000), torch.bfloat16) in ours


def test_compiled_model_loss_and_gradients_equal_the_eager_ones():
    """The model's plain head under torch.compile (the compiled loss form) trains as it does eagerly."""
    def grads(compiled):
        torch.manual_seed(0)
        model = build_model(ModelConfig(vocab_size=97, dim=32, n_layers=1, n_heads=4, dropout=0.0))
        x = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(1))
        labels = torch.roll(x, -1, 1)
        labels[:, -1] = -100
        torch._dynamo.reset()
        run = torch.compile(model, backend="aot_eager") if compiled else model
        loss = run(input_ids=x, labels=labels).loss
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in model.named_parameters()}

    loss_eager, g_eager = grads(False)
    loss_compiled, g_compiled = grads(True)
    torch.testing.assert_close(loss_compiled, loss_eager, rtol=1e-5, atol=1e-6)
    for name in g_eager:
        torch.testing.assert_close(g_compiled[name], g_eager[name], rtol=1e-4, atol=1e-6, msg=name)
