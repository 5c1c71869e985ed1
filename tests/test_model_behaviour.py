"""Behaviour every stack must have: causality, bidirectionality, padding, KV cache, learning."""

import pytest
import torch

from lm.model import build_model
from lm.model.config import (
    ALiBiConfig,
    LearnedConfig,
    ModelConfig,
    NoPositionConfig,
    RoPEConfig,
    SinusoidalConfig,
    T5BiasConfig,
)
from lm.model.generate import generate
from tests.model_support import greedy_by_recompute

POSITIONS = {
    "none": NoPositionConfig(),
    "learned": LearnedConfig(),
    "sinusoidal": SinusoidalConfig(),
    "rope": RoPEConfig(),
    "alibi": ALiBiConfig(),
    "t5_bias": T5BiasConfig(num_buckets=8, max_distance=16),
}
V = 50


def tiny(arch="decoder", pos="learned", **kw) -> ModelConfig:
    return ModelConfig(
        arch=arch, vocab_size=V, dim=32, n_layers=2, n_heads=4, max_seq_len=32, pos=POSITIONS[pos], init_std=0.1, **kw
    )  # a larger init makes every dependency visible


def ids(*shape, seed=0):
    return torch.randint(1, V, shape, generator=torch.Generator().manual_seed(seed))


def _model(cfg, seed=0):
    torch.manual_seed(seed)
    return build_model(cfg).eval()


@pytest.mark.parametrize("pos", list(POSITIONS))
def test_decoder_never_sees_the_future(pos):
    model = _model(tiny(pos=pos))
    x = ids(2, 10)
    y = x.clone()
    y[:, 6] = (y[:, 6] + 1) % V  # change token 6
    a, b = model(x).logits, model(y).logits
    torch.testing.assert_close(a[:, :6], b[:, :6], rtol=0, atol=1e-6)
    assert (a[:, 6:] - b[:, 6:]).abs().max() > 1e-4  # and the change is seen from position 6 on


@pytest.mark.parametrize("pos", ["learned", "rope", "t5_bias"])
def test_encoder_decoder_decoder_is_causal_and_reads_the_whole_source(pos):
    model = _model(tiny("encoder_decoder", pos=pos))
    src, tgt = ids(2, 9), ids(2, 8, seed=1)
    tgt2 = tgt.clone()
    tgt2[:, 5] = (tgt2[:, 5] + 1) % V
    a = model(src, decoder_input_ids=tgt).logits
    torch.testing.assert_close(a[:, :5], model(src, decoder_input_ids=tgt2).logits[:, :5], rtol=0, atol=1e-6)
    src2 = src.clone()
    src2[:, -1] = (src2[:, -1] + 1) % V  # the last source token reaches the first target position
    assert (a[:, 0] - model(src2, decoder_input_ids=tgt).logits[:, 0]).abs().max() > 1e-4


@pytest.mark.parametrize("pos", list(POSITIONS))
def test_encoder_sees_the_future(pos):
    model = _model(tiny("encoder", pos=pos))
    x = ids(2, 10)
    y = x.clone()
    y[:, 7] = (y[:, 7] + 1) % V
    assert (model(x).logits[:, 0] - model(y).logits[:, 0]).abs().max() > 1e-4


@pytest.mark.parametrize("arch", ["decoder", "encoder", "encoder_decoder"])
@pytest.mark.parametrize("pos", ["learned", "rope", "alibi", "t5_bias"])
def test_padding_does_not_change_real_positions(arch, pos):
    model = _model(tiny(arch, pos=pos))
    x = ids(1, 7)
    padded = torch.cat([x, torch.zeros(1, 5, dtype=torch.long)], dim=1)  # right padding with pad id 0
    mask = torch.cat([torch.ones(1, 7), torch.zeros(1, 5)], dim=1).long()
    if arch == "encoder_decoder":
        tgt = ids(1, 4, seed=3)
        a = model(x, decoder_input_ids=tgt).logits
        b = model(padded, attention_mask=mask, decoder_input_ids=tgt).logits
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    else:
        a = model(x).logits
        b = model(padded, attention_mask=mask).logits[:, :7]
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
@pytest.mark.parametrize("pos", list(POSITIONS))
def test_kv_cache_generation_equals_full_recompute(arch, pos):
    model = _model(tiny(arch, pos=pos, n_kv_heads=2))
    prompt = ids(2, 5)
    cached = generate(model, prompt, max_new_tokens=8)
    assert torch.equal(cached, greedy_by_recompute(model, prompt, arch, 8))


@pytest.mark.parametrize("pos", list(POSITIONS))
@pytest.mark.parametrize("n_kv_heads", [1, 2])
def test_cached_chunks_give_the_full_forwards_logits_at_every_position(pos, n_kv_heads):
    """Several tokens per cached call after the first (a chunked prefill): their queries sit past the cached keys,
    so the causal mask is offset (build_mask), not SDPA's is_causal; every position's logits equal one forward's."""
    model = _model(tiny(pos=pos, n_kv_heads=n_kv_heads, qk_norm=n_kv_heads == 1))
    x = ids(2, 14)
    cache = model.new_cache()
    with torch.no_grad():
        chunks = [model.head(model.features(x[:, a:b], cache=cache)) for a, b in [(0, 5), (5, 8), (8, 9), (9, 14)]]
        torch.testing.assert_close(torch.cat(chunks, dim=1), model(x).logits, rtol=0, atol=1e-5)


def test_sampling_controls():
    model = _model(tiny())
    prompt = ids(3, 4)
    greedy = generate(model, prompt, 6)
    g = torch.Generator().manual_seed(0)
    assert torch.equal(generate(model, prompt, 6, temperature=1.0, top_k=1, generator=g), greedy)
    assert torch.equal(generate(model, prompt, 6, temperature=1.0, top_p=1e-6, generator=g), greedy)
    sampled = generate(model, prompt, 20, temperature=5.0, generator=torch.Generator().manual_seed(0))
    assert not torch.equal(sampled[:, :6], greedy)  # high temperature departs from greedy
    # A stop token ends each row; later positions repeat it.
    stop = int(greedy[0, 2])
    first = greedy[0].tolist().index(stop)
    out = generate(model, prompt[:1], 6, stop_token=stop)
    assert out.shape[1] == first + 1 and torch.equal(out[0], greedy[0, : first + 1])


def test_top_p_zero_keeps_the_most_likely_token():
    """top_p=0 masked every token and sampled from NaNs (RuntimeError); transformers keeps the top token."""
    model = _model(tiny())
    prompt = ids(3, 4)
    g = torch.Generator().manual_seed(0)
    assert torch.equal(generate(model, prompt, 6, temperature=1.0, top_p=0.0, generator=g), generate(model, prompt, 6))


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"temperature": -1.0}, "temperature=-1.0 must be >= 0"),  # sampled the least likely tokens
        ({"temperature": 1.0, "top_p": 1.5}, r"top_p=1.5 must be in \[0, 1\]"),
        ({"attention_mask": torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]])}, "same length: no padding"),  # ignored
    ],
)
def test_generate_refuses_what_it_would_get_wrong(kw, match):
    model = _model(tiny())
    with pytest.raises(ValueError, match=match):
        generate(model, ids(2, 4), 3, **kw)


def test_generate_gives_the_model_back_in_the_mode_it_was_in():
    """generate left a training model in eval mode: a probe's sample mid-training turned dropout off for good."""
    model = _model(tiny())
    model.train()
    generate(model, ids(1, 4), 3)
    assert model.training
    model.eval()
    generate(model, ids(1, 4), 3)
    assert not model.training


def test_generate_names_an_encoder_as_unable():
    model = _model(tiny("encoder"))  # was AttributeError: 'EncoderLM' object has no attribute 'new_cache'
    with pytest.raises(ValueError, match="generate needs a decoder or an encoder-decoder; EncoderLM"):
        generate(model, ids(1, 4), 3)


def test_learned_positions_refuse_sequences_past_the_table():
    model = _model(tiny())
    with pytest.raises(ValueError, match="max_seq_len"):
        model(ids(1, 40))
