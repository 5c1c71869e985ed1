"""The chunked output projection + cross-entropy equals the plain one, value and gradients."""

import pytest
import torch
import torch.nn.functional as F

from lm.model import build_model
from lm.model.config import ModelConfig
from lm.model.loss import chunked_cross_entropy


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
        cfg = ModelConfig(
            arch=arch, vocab_size=97, dim=32, n_layers=1, n_heads=4, tie_embeddings=tied, loss_chunk_size=chunk
        )
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


def test_compiled_backward_fills_no_zero_gradient_for_the_returned_logits():
    """With labels the head returns its logits detached: a compiled step otherwise allocates and zero-fills a
    (B, T, V) gradient for them in backward that nothing reads."""
    from torch.profiler import profile

    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=997, dim=32, n_layers=1, n_heads=4, dropout=0.0))
    x = torch.randint(0, 997, (2, 13), generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    run = torch.compile(model, backend="aot_eager")
    run(input_ids=x[:, :-1], labels=x[:, 1:]).loss.backward()  # compile outside the profile
    with profile(record_shapes=True) as prof:
        out = run(input_ids=x[:, :-1], labels=x[:, 1:])
        out.loss.backward()
    filled = [
        e.input_shapes
        for e in prof.key_averages(group_by_input_shape=True)
        if e.key in ("aten::zero_", "aten::fill_", "aten::zeros")
    ]
    assert filled, "the profiler saw no fills at all: this test no longer observes what it checks"
    assert not any(shapes and shapes[0] == [2, 12, 997] for shapes in filled), filled
    assert out.logits.shape == (2, 12, 997) and not out.logits.requires_grad
