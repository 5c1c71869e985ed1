"""On a CUDA device with the `kernels` extra: each fused op of model.kernels (lm/model/kernels.py) and train.float8
(lm/engine/float8.py) against the eager op it replaces, forward and gradients, on the same weights and inputs.

Tolerances (stated per test, measured as max |fused - eager| / max |eager| over each tensor, or for gradients
that sum many products in another order, also as the cosine of the two gradients):
- fp32 norms: 1e-5 forward, 1e-4 gradients (the same maths, another reduction order);
- bf16 (autocast, as training runs): 1e-2 forward (a bf16 ulp is 2^-8 = 0.4%: two roundings differ by at most a
  couple), 3e-2 and cosine > 0.999 for gradients (a bf16 GEMM's sums in another order; Cut Cross-Entropy also
  skips the gradient blocks whose softmax is below bf16's resolution, its default filter);
- float8: 3% of the loss and gradient cosine > 0.99 (e4m3 keeps 3 mantissa bits: each operand is within 6%,
  and the errors average out over the dot products).
Run with `python -m pytest -m gpu tests/test_kernels_gpu.py` (benchmarks/gpu_kernels.sh does).
"""

import pytest
import torch

from lm.model import build_model
from lm.model.config import model_preset

pytestmark = pytest.mark.gpu

LLAMA = ["model.dim=256", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2", "model.max_seq_len=256"]
GPT2 = ["model.dim=256", "model.n_layers=2", "model.n_heads=4", "model.max_seq_len=256"]


def rel(fused: torch.Tensor, eager: torch.Tensor) -> float:
    return ((fused.float() - eager.float()).abs().max() / eager.float().abs().max().clamp(min=1e-30)).item()


def cosine(fused: torch.Tensor, eager: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(fused.float().flatten(), eager.float().flatten(), dim=0).item()


def _perturb(module: torch.nn.Module) -> None:
    """Weights away from their init (norm weights of 1, biases of 0 would hide a wrong scale or shift)."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * 0.1)


# -- norms ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["layernorm", "layernorm_nobias", "rmsnorm"])
@pytest.mark.parametrize("dtype, fwd_tol, grad_tol", [(torch.float32, 1e-5, 1e-4), (torch.bfloat16, 1e-2, 3e-2)])
def test_liger_norms_match_the_eager_norms(kind, dtype, fwd_tol, grad_tol):
    from lm.model.kernels import LigerLayerNorm, LigerRMSNorm
    from lm.model.norms import LayerNorm, RMSNorm

    torch.manual_seed(0)
    dim = 768
    if kind == "rmsnorm":
        eager, fused = RMSNorm(dim), LigerRMSNorm(dim)
    else:
        bias = kind == "layernorm"
        eager, fused = LayerNorm(dim, bias=bias), LigerLayerNorm(dim, bias=bias)
    eager.cuda()
    _perturb(eager)
    fused.cuda().load_state_dict(eager.state_dict())
    x = (torch.randn(4, 512, dim, device="cuda") * 3 + 1).to(dtype)
    g = torch.randn(4, 512, dim, device="cuda").to(dtype)
    outs, grads = [], []
    for m in (eager, fused):
        xi = x.clone().requires_grad_(True)
        y = m(xi)
        y.backward(g)
        outs.append(y)
        grads.append([xi.grad] + [p.grad for p in m.parameters()])
    assert outs[1].dtype == outs[0].dtype and rel(outs[1], outs[0]) < fwd_tol
    for gf, ge in zip(grads[1], grads[0]):
        assert rel(gf, ge) < grad_tol, (kind, dtype, rel(gf, ge))


# -- GLU --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_liger_glu_matches_the_eager_glu_under_bf16_autocast(activation):
    from lm.model.ffn import GLU
    from lm.model.kernels import LigerGLU

    torch.manual_seed(0)
    eager = GLU(512, activation=activation, bias=False).cuda()
    fused = LigerGLU(512, activation=activation, bias=False).cuda()
    fused.load_state_dict(eager.state_dict())
    x = torch.randn(8, 256, 512, device="cuda")
    g = torch.randn(8, 256, 512, device="cuda")
    outs, grads = [], []
    for m in (eager, fused):
        xi = x.clone().requires_grad_(True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = m(xi)
        y.float().backward(g)
        outs.append(y)
        grads.append([xi.grad] + [p.grad for p in m.parameters()])
    assert rel(outs[1], outs[0]) < 1e-2
    for gf, ge in zip(grads[1], grads[0]):
        assert rel(gf, ge) < 3e-2 and cosine(gf, ge) > 0.999


# -- fused linear cross-entropy ---------------------------------------------------------------------


def _loss_and_grads(model, x, y):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=x, labels=y).loss
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(
    "preset, overrides, kernel",
    [
        ("gpt2", GPT2, "liger"),
        ("gpt2", GPT2, "cce"),  # tied output, GPT-2's 50304 vocabulary
        ("llama", LLAMA + ["model.vocab_size=32000"], "liger"),
        ("llama", LLAMA + ["model.vocab_size=32000"], "cce"),
    ],
)
def test_fused_linear_cross_entropy_matches_the_eager_loss(preset, overrides, kernel):
    torch.manual_seed(0)
    eager = build_model(model_preset(preset, overrides)).cuda()
    fused = build_model(model_preset(preset, overrides + [f"model.kernels.cross_entropy={kernel}"])).cuda()
    fused.load_state_dict(eager.state_dict())
    vocab = eager.cfg.vocab_size
    x = torch.randint(0, vocab, (4, 256), device="cuda")
    y = torch.randint(0, vocab, (4, 256), device="cuda")
    y[:, :16] = -100  # ignored positions (padding, prompts) take no part in the mean
    le, ge = _loss_and_grads(eager, x, y)
    lf, gf = _loss_and_grads(fused, x, y)
    assert abs(lf.item() - le.item()) / le.item() < 5e-3, (lf.item(), le.item())
    assert gf.keys() == ge.keys()
    for name in ge:
        assert cosine(gf[name], ge[name]) > 0.999, (name, cosine(gf[name], ge[name]))
        assert rel(gf[name], ge[name]) < 3e-2 or cosine(gf[name], ge[name]) > 0.9999, (name, rel(gf[name], ge[name]))


def test_fused_linear_cross_entropy_never_allocates_the_logits():
    """GPT-2's vocabulary at 8 x 1024 tokens: the logits alone are 8192 x 50304 x 4 B = 1.65 GB in fp32; the fused
    kernels' peak over the model's own memory stays far below it."""
    peaks = {}
    for kernel in ("torch", "liger", "cce"):
        torch.manual_seed(0)
        model = build_model(
            model_preset("gpt2", GPT2 + ["model.max_seq_len=1024", f"model.kernels.cross_entropy={kernel}"])
        ).cuda()
        x = torch.randint(0, 50304, (8, 1024), device="cuda")
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        _loss_and_grads(model, x, x.roll(-1, 1))
        torch.cuda.synchronize()
        peaks[kernel] = torch.cuda.max_memory_allocated() - base
        del model
        torch.cuda.empty_cache()
    logits = 8 * 1024 * 50304 * 4
    assert peaks["torch"] > logits
    assert peaks["liger"] < peaks["torch"] - logits / 2 and peaks["cce"] < peaks["torch"] - logits / 2, peaks


# -- whole models and lm train ------------------------------------------------------------------------


def test_a_llama_with_every_kernel_matches_the_eager_model():
    torch.manual_seed(0)
    eager = build_model(model_preset("llama", LLAMA + ["model.vocab_size=32000"])).cuda()
    _perturb(eager)
    fused = build_model(
        model_preset(
            "llama",
            LLAMA
            + [
                "model.vocab_size=32000",
                "model.kernels.cross_entropy=liger",
                "model.kernels.norm=liger",
                "model.kernels.glu=liger",
            ],
        )
    ).cuda()
    fused.load_state_dict(eager.state_dict())
    x = torch.randint(0, 32000, (4, 256), device="cuda")
    le, ge = _loss_and_grads(eager, x, x.roll(-1, 1))
    lf, gf = _loss_and_grads(fused, x, x.roll(-1, 1))
    assert abs(lf.item() - le.item()) / le.item() < 5e-3
    for name in ge:
        assert cosine(gf[name], ge[name]) > 0.999, name


def test_lm_train_with_kernels_and_compile_tracks_the_eager_run(tmp_path):
    from lm.cli.train import train
    from tests.engine_support import compose, loaders, tiny_overrides, train_losses

    common = ["train.device=cuda", "model/norm=rmsnorm", "model/ffn=swiglu", "train.compile=true"]
    runs = {}
    for name, extra in (
        ("eager", []),
        ("fused", ["model.kernels.cross_entropy=liger", "model.kernels.norm=liger", "model.kernels.glu=liger"]),
    ):
        cfg = compose(tiny_overrides(tmp_path / name, 8, precision="bf16") + common + extra)
        train(cfg, loaders=loaders(cfg))
        runs[name] = train_losses(tmp_path / name)
    assert max(abs(runs["eager"][s] - runs["fused"][s]) for s in runs["eager"]) < 0.02


# -- float8 -----------------------------------------------------------------------------------------


def _float8_device():
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("float8 needs compute capability >= 8.9 (H100, H200, L40S)")


def test_float8_training_tracks_bf16():
    """The converted model: every block Linear is torchao's Float8Linear, the output layer is not, and its loss and
    gradients are bf16's within float8's precision (3% of the loss, gradient cosine > 0.99)."""
    from torchao.float8.float8_linear import Float8Linear

    from lm.engine.float8 import to_float8
    from lm.model.heads import OutputLinear

    _float8_device()
    torch.manual_seed(0)
    bf16 = build_model(model_preset("llama", LLAMA + ["model.vocab_size=32000"])).cuda()
    f8 = build_model(model_preset("llama", LLAMA + ["model.vocab_size=32000"])).cuda()
    f8.load_state_dict(bf16.state_dict())
    f8 = to_float8(f8)
    kinds = [type(m) for m in f8.modules()]
    assert kinds.count(Float8Linear) == 2 * 4 and OutputLinear in kinds
    assert f8.state_dict().keys() == bf16.state_dict().keys()
    x = torch.randint(0, 32000, (8, 256), device="cuda")
    lb, gb = _loss_and_grads(bf16, x, x.roll(-1, 1))
    lf, gf = _loss_and_grads(f8, x, x.roll(-1, 1))
    assert abs(lf.item() - lb.item()) / lb.item() < 3e-2, (lf.item(), lb.item())
    for name in gb:
        assert cosine(gf[name], gb[name]) > 0.99, (name, cosine(gf[name], gb[name]))


def test_lm_train_with_float8_tracks_bf16(tmp_path):
    from lm.cli.train import train
    from tests.engine_support import compose, loaders, tiny_overrides, train_losses

    _float8_device()
    runs = {}
    for name, extra in (("bf16", []), ("float8", ["train.float8=torchao"])):
        cfg = compose(tiny_overrides(tmp_path / name, 8, precision="bf16") + ["train.device=cuda"] + extra)
        train(cfg, loaders=loaders(cfg))
        runs[name] = train_losses(tmp_path / name)
    assert max(abs(runs["bf16"][s] - runs["float8"][s]) for s in runs["bf16"]) < 0.1


@pytest.mark.parametrize("kernel", ["liger", "cce"])
def test_fused_linear_cross_entropy_of_a_batch_without_targets_is_zero(kernel):
    """A micro-batch whose labels are all -100 (a short mlm window) gives loss 0 and gradient 0, not a NaN mean
    that would turn its step into a skipped non-finite one (tests/test_loss_no_targets.py, the eager paths)."""
    torch.manual_seed(0)
    fused = build_model(model_preset("llama", LLAMA + [f"model.kernels.cross_entropy={kernel}"])).cuda()
    x = torch.randint(0, fused.cfg.vocab_size, (2, 64), device="cuda")
    loss, grads = _loss_and_grads(fused, x, torch.full_like(x, -100))
    assert loss.item() == 0.0
    assert all(torch.count_nonzero(g) == 0 for g in grads.values())
