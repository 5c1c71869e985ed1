"""model/attn in every stack: masks give the future and padding exactly zero influence, KV-cache generation equals
recomputing, and capture() reads each option's probabilities, once per application of a shared block."""

import pytest
import torch

from lm.model.attention import capture
from lm.model.generate import generate
from lm.model.scores import ScaledDot
from lm.zoo.scores import Linformer
from tests.attention_support import OPTIONS, V, ids, model_of, perturb_pads
from tests.model_support import greedy_by_recompute

CAUSAL = [o for o in OPTIONS if o != "linformer"]


# -- masks in every stack: the future and padding have exactly zero influence ----------------------


@pytest.mark.parametrize("option", CAUSAL)
def test_decoder_never_sees_the_future(option):
    model = model_of(option, n_kv_heads=2)
    x = ids(2, 10)
    y = x.clone()
    y[:, 6] = (y[:, 6] + 1) % V
    with torch.no_grad():
        a, b = model(x).logits, model(y).logits
    assert torch.equal(a[:, :6], b[:, :6])
    assert (a[:, 6:] - b[:, 6:]).abs().max() > 1e-4


@pytest.mark.parametrize("option", OPTIONS)
def test_encoder_decoder_decoder_is_causal_and_reads_the_source(option):
    model = model_of(option, "encoder_decoder")
    src, tgt = ids(2, 9), ids(2, 8, seed=1)
    tgt2 = tgt.clone()
    tgt2[:, 5] = (tgt2[:, 5] + 1) % V
    src2 = src.clone()
    src2[:, -1] = (src2[:, -1] + 1) % V
    with torch.no_grad():
        a = model(src, decoder_input_ids=tgt).logits
        assert torch.equal(a[:, :5], model(src, decoder_input_ids=tgt2).logits[:, :5])
        assert (a[:, 0] - model(src2, decoder_input_ids=tgt).logits[:, 0]).abs().max() > 1e-4


@pytest.mark.parametrize("option", OPTIONS)
def test_encoder_sees_the_future(option):
    model = model_of(option, "encoder")
    x = ids(2, 10)
    y = x.clone()
    y[:, 7] = (y[:, 7] + 1) % V
    with torch.no_grad():
        assert (model(x).logits[:, 0] - model(y).logits[:, 0]).abs().max() > 1e-4


# every option in every stack it can serve (a decoder with Linformer is refused: test_bad_values_...)
ARCH_OPTIONS = [
    (o, a) for a in ("decoder", "encoder", "encoder_decoder") for o in OPTIONS if (o, a) != ("linformer", "decoder")
]


@pytest.mark.parametrize("option,arch", ARCH_OPTIONS)
def test_padding_has_exactly_zero_influence(option, arch):
    model = model_of(option, arch, n_kv_heads=2)
    x = ids(2, 12)
    mask = torch.ones_like(x)
    mask[0, 8:] = 0  # right padding
    mask[1, :3] = 0  # left padding
    with torch.no_grad():
        if arch == "encoder_decoder":
            tgt = ids(2, 6, seed=1)
            tmask = torch.ones_like(tgt)
            tmask[1, 4:] = 0
            a = model(x, attention_mask=mask, decoder_input_ids=tgt, decoder_attention_mask=tmask).logits
            b = model(
                perturb_pads(x, mask),
                attention_mask=mask,
                decoder_input_ids=perturb_pads(tgt, tmask),
                decoder_attention_mask=tmask,
            ).logits
            assert torch.equal(a[tmask.bool()], b[tmask.bool()])
        else:
            a = model(x, attention_mask=mask).logits
            b = model(perturb_pads(x, mask), attention_mask=mask).logits
            assert torch.equal(a[mask.bool()], b[mask.bool()])


@pytest.mark.parametrize("arch", ["encoder", "encoder_decoder"])
def test_linformer_right_padding_equals_the_unpadded_input(arch):
    """Zeroed padded keys add nothing to E K, and E is sliced by length: a padded batch equals the short one."""
    model = model_of("linformer", arch)
    x = ids(1, 7)
    padded = torch.cat([x, torch.zeros(1, 5, dtype=torch.long)], dim=1)
    mask = torch.cat([torch.ones(1, 7), torch.zeros(1, 5)], dim=1).long()
    kw = {"decoder_input_ids": ids(1, 4, seed=3)} if arch == "encoder_decoder" else {}
    with torch.no_grad():
        a = model(x, **kw).logits
        b = model(padded, attention_mask=mask, **kw).logits
    torch.testing.assert_close(a, b if kw else b[:, :7], rtol=0, atol=1e-5)


# -- GQA and KV-cache generation -------------------------------------------------------------------


@pytest.mark.parametrize("option,arch", [(o, a) for o, a in ARCH_OPTIONS if a != "encoder"])
def test_kv_cache_generation_equals_full_recompute(option, arch):
    model = model_of(option, arch, n_kv_heads=2)
    assert model.cfg.kv_heads == 2
    prompt = ids(2, 5)
    cached = generate(model, prompt, max_new_tokens=8)
    assert torch.equal(cached, greedy_by_recompute(model, prompt, arch, 8))


def test_encoder_decoder_linformer_keeps_scaled_dot_in_the_decoder_self_attention():
    model = model_of("linformer", "encoder_decoder")
    assert {type(b.self_attn.score) for b in model.encoder.blocks} == {Linformer}
    assert {type(b.self_attn.score) for b in model.decoder.blocks} == {ScaledDot}
    assert {type(b.cross_attn.score) for b in model.decoder.blocks} == {Linformer}  # over the source: no future


# -- capture(): probabilities of any option --------------------------------------------------------


@pytest.mark.parametrize("option", OPTIONS)
def test_capture_reads_probabilities(option):
    arch = "encoder_decoder" if option == "linformer" else "decoder"
    model = model_of(option, arch, n_kv_heads=2)
    x = ids(2, 10)
    mask = torch.ones_like(x)
    mask[1, 7:] = 0
    tgt = ids(2, 6, seed=1)
    kw = {"decoder_input_ids": tgt} if arch == "encoder_decoder" else {}
    with torch.no_grad():
        plain = model(x, attention_mask=mask, **kw).logits
        with capture(model) as maps:
            seen = model(x, attention_mask=mask, **kw).logits
    torch.testing.assert_close(seen, plain, rtol=1e-5, atol=1e-5)  # capturing does not change the output
    assert all(
        type(b.self_attn.score).__name__ and b.self_attn.score.record is None
        for s in ("encoder", "decoder")
        if hasattr(model, s)
        for b in getattr(model, s).blocks
    )
    where = [(m["stack"], m["layer"], m["kind"]) for m in maps]
    if arch == "decoder":
        assert where == [("decoder", 0, "self"), ("decoder", 1, "self")]
    else:
        assert where == [
            ("encoder", 0, "self"),
            ("encoder", 1, "self"),
            ("decoder", 0, "self"),
            ("decoder", 0, "cross"),
            ("decoder", 1, "self"),
            ("decoder", 1, "cross"),
        ]
    for m in maps:
        p = m["probs"]
        assert p.shape[:2] == (2, 4) and not p.requires_grad
        torch.testing.assert_close(p.sum(-1), torch.ones(p.shape[:-1]), rtol=0, atol=1e-5)
    if arch == "decoder":
        p = maps[0]["probs"]
        assert p.shape == (2, 4, 10, 10)
        assert torch.all(p.triu(1) == 0)  # causal rows: zero above the diagonal
        assert torch.all(p[1, :, :, 7:] == 0)  # padded keys: zero
    else:
        k = model.encoder.blocks[0].self_attn.score.k
        assert maps[0]["probs"].shape == (2, 4, 10, k)  # Linformer: Tk = k projected positions
        assert maps[2]["probs"].shape == (2, 4, 6, 6) and torch.all(maps[2]["probs"].triu(1) == 0)
        assert maps[3]["probs"].shape == (2, 4, 6, k)


def test_capture_during_cached_generation_records_one_query_per_step():
    model = model_of("additive")
    with capture(model) as maps:
        generate(model, ids(1, 4), max_new_tokens=3)
    assert [m["probs"].shape[2:] for m in maps if m["layer"] == 0] == [(4, 4), (1, 5), (1, 6)]


# -- parameters and FLOPs per option ---------------------------------------------------------------


@pytest.mark.parametrize("option,over", [("shared", {}), ("universal", {"stack.steps": 3})])
def test_capture_labels_each_application_of_a_shared_block(option, over):
    model = model_of("multiplicative", "encoder_decoder", picks=[f"model/stack={option}"], **over)
    depth = over.get("stack.steps", 2)
    assert len(model.decoder.blocks) == 1
    with torch.no_grad(), capture(model) as maps:
        model(ids(1, 6), decoder_input_ids=ids(1, 4, seed=1))
        model(ids(1, 6), decoder_input_ids=ids(1, 4, seed=1))  # a second forward starts again at layer 0
    dec_self = [m["layer"] for m in maps if m["stack"] == "decoder" and m["kind"] == "self"]
    assert dec_self == list(range(depth)) * 2
    assert [m["layer"] for m in maps if m["stack"] == "encoder"] == list(range(depth)) * 2
