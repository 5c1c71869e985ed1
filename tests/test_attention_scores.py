"""model/attn: each scoring function against its formula, written out on small tensors (GQA included), its causal
flag, and the default's SDPA path against its explicit one."""

import math

import pytest
import torch

from lm.model.attention import capture
from lm.model.scores import ScaledDot
from lm.zoo.scores import Additive, Dot, Linformer, Multiplicative
from tests.attention_support import ids, model_of

B, H, KVH, Dh = 2, 4, 2, 8


def qkv(Tq=5, Tk=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(B, H, Tq, Dh, generator=g),
        torch.randn(B, KVH, Tk, Dh, generator=g),
        torch.randn(B, KVH, Tk, Dh, generator=g),
    )


def reference(logits, v, mask=None):
    """softmax over keys of logits (B, H, Tq, Tk) (+ bool mask, True = visible), times v (B, KVH, Tk, Dh)."""
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    v = v.repeat_interleave(H // v.shape[1], dim=1)
    return torch.softmax(logits, dim=-1) @ v


def additive_mask(visible):
    return torch.zeros(visible.shape).masked_fill(~visible, torch.finfo(torch.float32).min)


# -- each score against its formula, written out on small tensors ----------------------------------


def _loop_logits(q, k, pair):
    """logits[b, h, i, j] = pair(h, q[b, h, i], k[b, h // (H/KVH), j]), one pair at a time."""
    out = torch.empty(B, H, q.shape[2], k.shape[2])
    for b in range(B):
        for h in range(H):
            for i in range(q.shape[2]):
                for j in range(k.shape[2]):
                    out[b, h, i, j] = pair(h, q[b, h, i], k[b, h // (H // KVH), j])
    return out


@pytest.mark.parametrize("capturing", [False, True])
def test_scaled_dot_and_dot(capturing):
    q, k, v = qkv()
    visible = torch.rand(B, 1, 5, 7, generator=torch.Generator().manual_seed(3)) > 0.3
    for cls, scale in [(ScaledDot, Dh**-0.5), (Dot, 1.0)]:
        score = cls(H, KVH, Dh, 16, None, 0.0, False)
        score.record = (lambda p: None) if capturing else None  # the explicit path, as capture() uses
        expected = reference(_loop_logits(q, k, lambda h, a, b, scale=scale: a @ b * scale), v, visible)
        torch.testing.assert_close(score(q, k, v, additive_mask(visible), False), expected, rtol=1e-5, atol=1e-6)
    assert ScaledDot(H, KVH, Dh, 16, 0.5, 0.0, False).scale == 0.5  # model.attn_scale


def test_multiplicative_is_q_W_k_per_head():
    q, k, v = qkv()
    score = Multiplicative(H, KVH, Dh, 16, None, 0.0, False)
    torch.testing.assert_close(score.W[2], torch.eye(Dh) / math.sqrt(Dh))  # starts as scaled_dot
    with torch.no_grad():
        score.W.normal_(generator=torch.Generator().manual_seed(1))
    expected = reference(_loop_logits(q, k, lambda h, a, b: a @ score.W[h] @ b), v)
    torch.testing.assert_close(score(q, k, v, None, False), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("d_attn,chunk", [(None, 0), (5, 2)])
def test_additive_is_v_tanh_W1q_W2k_per_head(d_attn, chunk):
    q, k, v = qkv()
    score = Additive(H, KVH, Dh, 16, None, 0.0, False, d_attn=d_attn, query_chunk=chunk)
    assert score.W1.shape == (H, Dh, d_attn or Dh) and score.v.shape == (H, d_attn or Dh)
    W1, W2, va = score.W1.detach(), score.W2.detach(), score.v.detach()
    expected = reference(_loop_logits(q, k, lambda h, a, b: va[h] @ torch.tanh(a @ W1[h] + b @ W2[h])), v)
    torch.testing.assert_close(score(q, k, v, None, False), expected, rtol=1e-5, atol=1e-6)


def test_additive_query_chunks_give_the_same_values_and_gradients():
    q, k, v = qkv(Tq=7)
    whole = Additive(H, KVH, Dh, 16, None, 0.0, True)
    chunked = Additive(H, KVH, Dh, 16, None, 0.0, True, query_chunk=3)
    chunked.load_state_dict(whole.state_dict())
    outs = []
    for score in (whole, chunked):
        y = score(q, k, v, None, True)
        y.square().sum().backward()
        outs.append((y, score.W1.grad, score.v.grad))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shared_kv", [False, True])
def test_linformer_projects_keys_and_values_along_the_sequence(shared_kv):
    q, k, v = qkv(Tq=7, Tk=7)
    score = Linformer(H, KVH, Dh, 16, None, 0.0, False, k=3, shared_kv=shared_kv)
    E = score.E.detach()
    Fp = E if shared_kv else score.F.detach()
    assert E.shape == (3, 16) and (score.F is None) == shared_kv
    visible = torch.ones(B, 7, dtype=torch.bool)
    visible[1, 5:] = False  # the second row has 2 padded keys
    keep = visible[:, None, :, None].float()
    k_proj = E[:, :7] @ (k * keep)  # (B, KVH, 3, Dh): E sliced to the input's 7 positions
    v_proj = Fp[:, :7] @ (v * keep)
    expected = reference(_loop_logits(q, k_proj, lambda h, a, b: a @ b / math.sqrt(Dh)), v_proj)
    mask = additive_mask(visible[:, None, None, :].expand(B, 1, 7, 7))
    torch.testing.assert_close(score(q, k, v, mask, False), expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="model.max_seq_len=16"):
        score(*qkv(Tq=17, Tk=17), None, False)
    with pytest.raises(ValueError, match="cannot be causal"):
        Linformer(H, KVH, Dh, 16, None, 0.0, True)


def test_causal_flag_without_mask_masks_the_future():
    q, k, v = qkv(Tq=6, Tk=6)
    tril = torch.ones(6, 6, dtype=torch.bool).tril()
    for score in (Multiplicative(H, KVH, Dh, 16, None, 0.0, True), ScaledDot(H, KVH, Dh, 16, None, 0.0, True)):
        score.record = lambda p: None
        expected = reference(score.logits(q, k.repeat_interleave(2, 1)).detach(), v, tril)
        torch.testing.assert_close(score(q, k, v, None, True), expected, rtol=1e-5, atol=1e-6)


# -- the default keeps SDPA's fast path ------------------------------------------------------------


def test_default_runs_on_sdpa_with_is_causal(monkeypatch):
    import lm.model.scores as scores

    calls = []
    sdpa = scores.F.scaled_dot_product_attention

    def spy(*a, **kw):
        calls.append((kw["is_causal"], kw["attn_mask"] is None))
        return sdpa(*a, **kw)

    monkeypatch.setattr(scores.F, "scaled_dot_product_attention", spy)
    model = model_of("scaled_dot")
    assert type(model.decoder.blocks[0].self_attn.score) is ScaledDot
    model(ids(2, 9))
    assert calls == [(True, True)] * 2  # both layers: is_causal, no mask tensor (flash-eligible)
    calls.clear()
    with capture(model):
        model(ids(2, 9))
    assert calls == []  # capture computes the same maths explicitly


@pytest.mark.parametrize("arch", ["decoder", "encoder", "encoder_decoder"])
def test_default_explicit_path_equals_sdpa(arch):
    model = model_of("scaled_dot", arch, n_kv_heads=2)
    x = ids(2, 9)
    mask = torch.ones_like(x)
    mask[1, 6:] = 0
    kw = {"decoder_input_ids": ids(2, 5, seed=1)} if arch == "encoder_decoder" else {}
    with torch.no_grad():
        fast = model(x, attention_mask=mask, **kw).logits
        with capture(model):
            explicit = model(x, attention_mask=mask, **kw).logits
    torch.testing.assert_close(fast, explicit, rtol=1e-5, atol=1e-5)
