"""model/attn: each scoring function against its formula, masks with exactly zero leakage in every
stack, GQA, KV-cache generation, capture(), FLOPs and parameter counts, config refusals, ablate_attention."""

import math
import re
from dataclasses import dataclass

import pytest
import torch
from omegaconf import OmegaConf

from lm.config import ConfigError, conf_dir
from lm.model import build_model
from lm.model.attention import capture
from lm.model.config import AttnConfig, ModelConfig, model_from_saved, model_preset, options, schema_name
from lm.model.flops import attention_flops_per_token, flops_per_token, matmul_params, num_params
from lm.model.generate import generate
from lm.model.registry import register
from lm.model.scores import ScaledDot, Score
from lm.zoo.scores import Additive, Dot, Linformer, LinformerConfig, Multiplicative
from tests.model_support import greedy_by_recompute

OPTIONS = ["scaled_dot", "dot", "multiplicative", "additive", "linformer"]
CAUSAL = [o for o in OPTIONS if o != "linformer"]
V = 50
B, H, KVH, Dh = 2, 4, 2, 8


def cfg_of(option, arch="decoder", picks=(), **over) -> ModelConfig:
    """A tiny model with a large init (every dependency visible), composed as lm train would; picks: group
    options (model/stack=funnel)."""
    args = [
        f"model/attn={option}",
        f"model.arch={arch}",
        f"model.vocab_size={V}",
        "model.dim=32",
        "model.max_seq_len=32",
        "model.init_std=0.1",
        *picks,
    ]
    return model_preset("tiny", args + [f"model.{k}={v}" for k, v in over.items()])


def model_of(option, arch="decoder", seed=0, picks=(), **over):
    torch.manual_seed(seed)
    return build_model(cfg_of(option, arch, picks, **over)).eval()


def ids(*shape, seed=0):
    return torch.randint(1, V, shape, generator=torch.Generator().manual_seed(seed))


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


def _perturb_pads(x, mask):
    return torch.where(mask.bool(), x, (x + 7) % V)


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
                _perturb_pads(x, mask),
                attention_mask=mask,
                decoder_input_ids=_perturb_pads(tgt, tmask),
                decoder_attention_mask=tmask,
            ).logits
            assert torch.equal(a[tmask.bool()], b[tmask.bool()])
        else:
            a = model(x, attention_mask=mask).logits
            b = model(_perturb_pads(x, mask), attention_mask=mask).logits
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


def test_parameters_of_each_option():
    L, h, dh = 2, 4, 8  # cfg_of: tiny preset at dim 32 (4 heads of 8)
    base = num_params(cfg_of("scaled_dot", "encoder"))
    assert num_params(cfg_of("dot", "encoder")) == base
    assert num_params(cfg_of("multiplicative", "encoder")) - base == L * h * dh * dh
    assert num_params(cfg_of("additive", "encoder")) - base == L * (2 * h * dh * dh + h * dh)
    assert num_params(cfg_of("linformer", "encoder")) - base == L * 2 * 8 * 32  # k = 32 // 4, E and F
    assert num_params(cfg_of("linformer", "encoder", **{"attn.shared_kv": "true"})) - base == L * 8 * 32
    for option in OPTIONS:  # the count is the built model's
        cfg = cfg_of(option, "encoder")
        assert num_params(cfg) == sum(p.numel() for p in build_model(cfg).parameters())


def test_flops_count_each_option():
    T, L, h, kvh, dh = 16, 2, 4, 4, 8
    base = 12 * L * h * dh * T  # the PaLM attention term: scores and values, forward + backward
    assert attention_flops_per_token(cfg_of("scaled_dot", "encoder"), T) == base
    assert attention_flops_per_token(cfg_of("dot", "encoder"), T) == base
    assert attention_flops_per_token(cfg_of("multiplicative", "encoder"), T) == base + 3 * L * 2 * h * dh * dh
    additive = 3 * L * (2 * 2 * h * dh * dh + 2 * h * T * dh + 2 * h * dh * T)
    assert attention_flops_per_token(cfg_of("additive", "encoder"), T) == additive
    k = 8
    linformer = 3 * L * (2 * 2 * k * kvh * dh + 4 * h * dh * k)  # E K and F V, then k rows instead of T
    assert attention_flops_per_token(cfg_of("linformer", "encoder"), T) == linformer
    cfg = cfg_of("additive", "encoder")
    assert flops_per_token(cfg, T) == 6 * matmul_params(cfg) + additive
    # encoder-decoder with Linformer: encoder self + decoder cross are Linformer, decoder self scaled_dot
    ed = cfg_of("linformer", "encoder_decoder")
    assert attention_flops_per_token(ed, T) == 2 * linformer + base


# -- config: the slot, its files, and bad input ----------------------------------------------------

RNN_PRESETS = ("lstm", "gru", "rnn")  # recurrent: attn null, like their other Transformer slots


def test_every_option_has_a_schema_a_file_and_every_preset_picks_scaled_dot():
    files = {p.stem: p.read_text() for p in (conf_dir() / "model" / "attn").glob("*.yaml")}
    # synthesizers and convolutions (issue #20) are tested in tests/test_synth_conv.py
    others = {"synthesizer_dense", "synthesizer_random", "synthesizer_factorized", "lightweight_conv", "dynamic_conv"}
    assert set(files) == set(OPTIONS) | others
    ours = [c for c in options("attn") if c.__module__.startswith("lm.")]  # not this file's CosineConfig
    assert {c.__module__ for c in ours} == {
        "lm.model.options",
        "lm.zoo.scores",
        "lm.zoo.synthesizer",
        "lm.zoo.conv_attn",
    }  # the core's and the zoo's options
    for cls in ours:
        assert any(schema_name(cls) in text for text in files.values()), cls
    for preset in (conf_dir() / "model").glob("*.yaml"):
        line = "  - attn: null" if preset.stem in RNN_PRESETS else "  - attn: scaled_dot"
        assert line in preset.read_text(), preset.name
        if preset.stem not in RNN_PRESETS:
            assert type(model_preset(preset.stem).attn).__name__ == "ScaledDotConfig"


@pytest.mark.parametrize("preset", RNN_PRESETS)
def test_recurrent_models_refuse_an_attention_option(preset):
    assert model_preset(preset).attn is None
    with pytest.raises(ConfigError, match=re.escape("model/attn=additive is a Transformer option")):
        build_model(model_preset(preset, ["model/attn=additive"]))


@pytest.mark.parametrize("option", OPTIONS)
def test_option_trains_a_tiny_model(option):
    cfg = cfg_of(option, "encoder", init_std=0.02)
    torch.manual_seed(0)
    model = build_model(cfg)
    x = ids(2, 16)
    labels = torch.roll(x, -1, dims=1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(30):
        loss = model(x, labels=labels).loss
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert all(p.grad is not None for p in model.parameters())  # the score's own weights learn too
    assert loss.item() < 0.5 * first, (first, loss.item())


@pytest.mark.parametrize(
    "over,message",
    [
        (["model/attn=linformer"], "model/attn=linformer cannot be used with model.arch=decoder: Linformer projects"),
        (
            ["model/attn=linformer", "model.arch=encoder", "model.attn.k=0"],
            "model.attn.k=0 must be in [1, model.max_seq_len=256]",
        ),
        (
            ["model/attn=linformer", "model.arch=encoder", "model.attn.k=257"],
            "model.attn.k=257 must be in [1, model.max_seq_len=256]",
        ),
        (["model/attn=linformer", "model.arch=encoder", "model/pos=alibi"], "adds a bias per key position"),
        (["model/attn=dot", "model.attn_scale=0.5"], "have no effect with model/attn=dot"),
        (["model/attn=additive", "model.attn.query_chunk=-1"], "model.attn.query_chunk=-1"),
        (["model/attn=additive", "model.attn.d_attn=0"], "model.attn.d_attn=0 must be a positive integer"),
    ],
)
def test_bad_values_fail_before_building(over, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_model(model_preset("tiny", over))


def test_unknown_option_and_wrong_field_are_named():
    with pytest.raises(ConfigError, match="Available options in 'model/attn'.*additive.*dot.*linformer"):
        model_preset("tiny", ["model/attn=luong"])
    with pytest.raises(ConfigError, match="model.attn.k"):  # k belongs to linformer
        model_preset("tiny", ["model/attn=dot", "model.attn.k=3"])


def test_saved_configs_from_before_the_slot_load_as_scaled_dot():
    saved = OmegaConf.to_container(OmegaConf.structured(cfg_of("scaled_dot")), enum_to_str=True)
    del saved["attn"]
    assert type(model_from_saved(saved).attn).__name__ == "ScaledDotConfig"
    again = model_from_saved(
        OmegaConf.to_container(OmegaConf.structured(cfg_of("linformer", "encoder", **{"attn.k": 5})))
    )
    assert isinstance(again.attn, LinformerConfig) and again.attn.k == 5


def test_hugging_face_export_refuses_other_scores():
    pytest.importorskip("transformers")
    from lm.model.convert import to_hf

    with pytest.raises(ValueError, match="model.attn._target_=lm.zoo.scores.Multiplicative"):
        to_hf(model_of("multiplicative"))


# -- a new option is one Score subclass, one registered schema, one YAML file, and capture() reads it ---


class Cosine(Score):
    """A made-up option for the extension test: cosine similarity times a temperature."""

    def __init__(self, n_heads, n_kv_heads, head_dim, max_seq_len, scale, dropout, causal, tau: float = 10.0):
        super().__init__(n_heads, n_kv_heads, head_dim, max_seq_len, scale, dropout, causal)
        self.tau = tau

    def logits(self, q, k):
        return (
            self.tau
            * torch.nn.functional.normalize(q, dim=-1)
            @ torch.nn.functional.normalize(k, dim=-1).transpose(-2, -1)
        )


@register("attn")
@dataclass
class CosineConfig(AttnConfig):
    _target_: str = "tests.test_attention_scores.Cosine"
    tau: float = 10.0


def test_a_new_option_is_one_class_one_schema_one_file(tmp_path):
    (tmp_path / "model" / "attn").mkdir(parents=True)
    (tmp_path / "model" / "attn" / "cosine.yaml").write_text("defaults:\n  - cosine_schema\n  - _self_\ntau: 5.0\n")
    cfg = model_preset("tiny", [f"hydra.searchpath=[file://{tmp_path}]", "model/attn=cosine"])
    model = build_model(cfg).eval()
    assert (
        type(model.decoder.blocks[1].self_attn.score) is Cosine and model.decoder.blocks[1].self_attn.score.tau == 5.0
    )
    x = ids(1, 6)
    with torch.no_grad(), capture(model) as maps:
        model(x)
    assert len(maps) == 2 and torch.all(maps[0]["probs"].triu(1) == 0)  # causal masking comes from the base class


# -- the experiment --------------------------------------------------------------------------------


def test_ablate_attention_runs_every_option_on_one_encoder():
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from lm.config import register_train_configs

    register_train_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
            cfg = compose("train", overrides=["experiment=ablate_attention"], return_hydra_config=True)
            params = {k: str(v).split(",") for k, v in cfg.hydra.sweeper.params.items()}
            assert params == {"model/attn": OPTIONS, "seed": ["0", "1", "2"]}
            models = {
                o: OmegaConf.to_object(
                    compose("train", overrides=["experiment=ablate_attention", f"model/attn={o}"]).model
                )
                for o in OPTIONS
            }
    finally:
        GlobalHydra.instance().clear()
    assert {(m.arch, m.max_seq_len) for m in models.values()} == {("encoder", cfg.train.seq_len)}
    assert [type(m.attn).__name__.removesuffix("Config").lower() for m in models.values()] == [
        "scaleddot",
        "dot",
        "multiplicative",
        "additive",
        "linformer",
    ]
    for m in models.values():
        build_model(m)  # Linformer included: an encoder accepts it


@pytest.mark.parametrize("option", OPTIONS)
def test_funnel_encoder_takes_every_option_and_counts_its_pooled_blocks(option):
    from lm.zoo.funnel import attention_layers

    cfg = cfg_of(option, "encoder", ["model/stack=funnel"], n_layers=4, **{"stack.blocks": "[2,2]"})
    model = build_model(cfg).eval()
    x = ids(2, 12)
    mask = torch.ones_like(x)
    mask[0, 9:] = 0
    with torch.no_grad():
        a = model(x, attention_mask=mask).logits
        b = model(_perturb_pads(x, mask), attention_mask=mask).logits
    assert torch.equal(a[mask.bool()], b[mask.bool()])
    if option == "scaled_dot":  # the per-module sum agrees with Funnel's own count in full-length layers
        assert attention_flops_per_token(cfg, 16) == round(12 * attention_layers([2, 2], 2) * 4 * 8 * 16)


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
