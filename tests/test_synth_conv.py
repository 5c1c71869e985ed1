"""Synthesizer, lightweight/dynamic convolutions, the weighted and the Evolved Transformer (#20):
each module against its formula written out, its defining property (causality, padding, learned
branch weights), then through the model: options, capture(), KV cache, Params/Ops, lm train resume,
DDP."""

import pytest
import torch
import torch.nn.functional as F

from lm.model.attention import LayerCache, build_mask
from lm.zoo.conv_attn import ConvAttention, DynamicConv, LightweightConv, band
from lm.zoo.synthesizer import SynthesizerDense, SynthesizerFactorized, SynthesizerRandom

H, DH, L = 2, 4, 16


def _qkv(B=2, T=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, DH, generator=g) for _ in range(3)]


def _probs(score, q, k, v, mask=None, is_causal=True):
    seen = []
    score.record = seen.append
    score(q, k, v, mask, is_causal)
    score.record = None
    return seen[0]


# -- Synthesizer: the logits are synthesized, not q k^T ----------------------------------------------------


def test_random_synthesizer_is_the_learned_pattern_whatever_the_input():
    s = SynthesizerRandom(H, H, DH, L, None, 0.0, True)
    q, k, v = _qkv()
    q2, k2, _ = _qkv(seed=1)
    expected = (s.R[:, :6, :6] + torch.full((6, 6), float("-inf")).triu(1)).softmax(-1)
    assert torch.allclose(_probs(s, q, k, v)[0], expected, atol=1e-6)
    assert torch.allclose(_probs(s, q2, k2, v), _probs(s, q, k, v))  # the input does not matter


def test_dense_synthesizer_row_depends_only_on_its_own_token():
    s = SynthesizerDense(H, H, DH, L, None, 0.0, False)
    q, k, v = _qkv()
    assert torch.allclose(s.logits(q, k), torch.relu(q) @ s.W[:, :6], atol=1e-6)
    q2 = q.clone()
    q2[:, :, 3] += 1.0  # change token 3's query only
    changed = (s.logits(q2, k) - s.logits(q, k)).abs().amax(dim=(0, 1, 3))  # per query row
    assert changed[3] > 0 and torch.all(changed[[0, 1, 2, 4, 5]] == 0)


def test_dense_synthesizer_b2_is_the_papers_bias_over_key_positions():
    """Tay et al.'s B = W2 relu(W1 x + b1) + b2: model.attn.b2=true adds a learned (L,) bias, 0 at init; off by
    default (Mesh TF's code, Narang et al.'s rows), where the option builds no such parameter."""
    from lm.model import build_model
    from lm.model.config import model_preset

    s = SynthesizerDense(H, H, DH, L, None, 0.0, False, b2=True)
    q, k, _ = _qkv()
    assert s.b2.shape == (L,) and torch.count_nonzero(s.b2) == 0
    with torch.no_grad():
        s.b2.copy_(torch.arange(L, dtype=torch.float32))
    assert torch.allclose(s.logits(q, k), torch.relu(q) @ s.W[:, :6] + torch.arange(6.0), atol=1e-6)
    over = ["model.arch=encoder", "model/attn=synthesizer_dense", "model.max_seq_len=32"]
    names = lambda cfg: {n for n, _ in build_model(cfg).named_parameters() if n.endswith(".b2")}  # noqa: E731
    assert names(model_preset("tiny", over)) == set()
    with_b2 = names(model_preset("tiny", [*over, "model.attn.b2=true"]))
    assert with_b2 == {f"encoder.blocks.{i}.self_attn.score.b2" for i in range(2)}


def test_factorized_synthesizer_is_rank_k():
    s = SynthesizerFactorized(H, H, DH, L, None, 0.0, False, factorized_k=3)
    q, k, _ = _qkv(T=10)
    logits = s.logits(q, k)
    assert torch.allclose(logits[0], s.R1[:, :10] @ s.R2[:, :10].transpose(1, 2), atol=1e-6)
    assert all(torch.linalg.matrix_rank(logits[0, h]) == 3 for h in range(H))


@pytest.mark.parametrize("cls", [SynthesizerDense, SynthesizerRandom, SynthesizerFactorized])
def test_plus_adds_the_dot_product_and_plus_alpha_mixes_it_with_a_learned_weight(cls):
    q, k, v = _qkv()
    dot = q @ k.transpose(-2, -1) * DH**-0.5
    torch.manual_seed(0)
    none = cls(H, H, DH, L, None, 0.0, True)
    torch.manual_seed(0)
    plus = cls(H, H, DH, L, None, 0.0, True, mix="plus")
    torch.manual_seed(0)
    alpha = cls(H, H, DH, L, None, 0.0, True, mix="plus_alpha")
    synth = none.logits(q, k)
    assert torch.allclose(plus.logits(q, k), dot + synth, atol=1e-5)
    assert torch.allclose(alpha.logits(q, k), 0.5 * dot + 0.5 * synth, atol=1e-5)  # sigmoid(0) = 1/2
    alpha(q, k, v, None, True).sum().backward()
    assert alpha.alpha.grad is not None and alpha.alpha.grad != 0


def test_synthesizer_masks_the_future_and_padding_and_follows_the_queries_position():
    s = SynthesizerRandom(H, H, DH, L, None, 0.0, True, mix="plus")
    q, k, v = _qkv(T=5)
    pos = torch.arange(5)
    padding = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])  # left padding in row 1
    probs = _probs(s, q, k, v, build_mask(True, pos, pos, padding))
    # future: exactly zero (row 1's first two queries are pads themselves: uniform, as build_mask promises)
    assert torch.all(probs[0].triu(1) == 0) and torch.all(probs[1, :, 2:].triu(3) == 0)
    assert torch.all(probs[1, :, 2:, :2] == 0)  # padded keys: exactly zero for real queries
    assert torch.allclose(probs.sum(-1), torch.ones(2, H, 5))
    # one query at position 4 (a KV-cached step) reads row 4 of R, not row 0
    last = _probs(s, q[:, :, 4:], k, v, None, False)
    assert torch.allclose(last, _probs(s, q, k, v)[:, :, 4:], atol=1e-6)


def test_synthesizer_refuses_more_positions_than_its_pattern():
    s = SynthesizerRandom(H, H, DH, 4, None, 0.0, False)
    q, k, v = _qkv(T=5)
    with pytest.raises(ValueError, match="max_seq_len=4"):
        s(q, k, v, None, False)


# -- convolutions: softmax-normalised, weight-shared, causal kernels ------------------------------------------


def _conv_reference(u, w, P):
    """y_t = sum_j w[t?, h, j] u_{t-P+j} written as a loop. u (B, T, H*Dh), w (H, K) or (B, T, H, K)."""
    B, T, C = u.shape
    K = w.shape[-1]
    y = torch.zeros_like(u)
    for t in range(T):
        for j in range(K):
            s = t - P + j
            if 0 <= s < T:
                wj = w[:, j] if w.dim() == 2 else w[:, t, :, j]  # (H,) or (B, H)
                y[:, t] += wj.repeat_interleave(C // H, dim=-1) * u[:, s]
    return y


@pytest.mark.parametrize("causal,K", [(True, 3), (False, 3), (False, 4)])
def test_lightweight_conv_is_a_softmax_kernel_shared_by_a_heads_channels(causal, K):
    conv = LightweightConv(H, H, DH, L, None, 0.0, causal, kernel_size=K)
    u = torch.randn(2, 7, H * DH)
    w = conv.kernel(u)
    assert torch.allclose(w.sum(-1), torch.ones(H))
    P = K - 1 if causal else (K - 1) // 2
    assert torch.allclose(conv(u, None), _conv_reference(u, w, P), atol=1e-6)


def test_dynamic_conv_predicts_each_positions_kernel_from_its_input():
    conv = DynamicConv(H, H, DH, L, None, 0.0, True, kernel_size=3)
    u = torch.randn(2, 7, H * DH)
    w = conv.kernel(u)  # (B, T, H, K)
    expected = conv.weight_linear(u).view(2, 7, H, 3).softmax(-1)
    assert torch.allclose(w, expected, atol=1e-6)
    assert torch.allclose(conv(u, None), _conv_reference(u, w, 2), atol=1e-6)


@pytest.mark.parametrize("cls", [LightweightConv, DynamicConv])
def test_causal_conv_does_not_see_the_future_and_padding_contributes_nothing(cls):
    attn = ConvAttention(H * DH, H, DH, True, cls(H, H, DH, L, None, 0.0, True, kernel_size=3))
    x = torch.randn(1, 8, H * DH)
    y = attn(x, True, None, None)
    x2 = x.clone()
    x2[:, 5:] = torch.randn(1, 3, H * DH)
    assert torch.equal(attn(x2, True, None, None)[:, :5], y[:, :5])
    # left padding: whatever the pads hold, the real tokens' outputs are the same
    pos = torch.arange(8)
    mask = build_mask(True, pos, pos, torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1]]))
    x3 = x.clone()
    x3[:, :2] = torch.randn(1, 2, H * DH)
    assert torch.allclose(attn(x3, True, mask, None)[:, 2:], attn(x, True, mask, None)[:, 2:], atol=1e-6)


@pytest.mark.parametrize("causal", [True, False])
def test_captured_band_matrix_is_the_linear_map_the_conv_applies(causal):
    conv = DynamicConv(H, H, DH, L, None, 0.0, causal, kernel_size=3)
    u = torch.randn(2, 6, H * DH)
    seen = []
    conv.record = seen.append  # what capture() sets: the same protocol as the scores
    conv(u, None)
    A = seen[0]
    assert A.shape == (2, H, 6, 6)
    per_head = u.view(2, 6, H, DH).transpose(1, 2)  # (B, H, T, Dh)
    y = (A @ per_head).transpose(1, 2).reshape(2, 6, H * DH)
    assert torch.allclose(y, conv(u, None), atol=1e-6)
    if causal:
        assert torch.all(A.triu(1) == 0) and torch.allclose(A[:, :, 2:].sum(-1), torch.ones(2, H, 4))


@pytest.mark.parametrize("cls", [LightweightConv, DynamicConv])
def test_incremental_conv_with_a_cache_matches_the_full_sequence(cls):
    attn = ConvAttention(H * DH, H, DH, True, cls(H, H, DH, L, None, 0.0, True, kernel_size=4))
    x = torch.randn(2, 7, H * DH)
    full = attn(x, True, None, None)
    cache = LayerCache()
    steps = [attn(x[:, :3], True, None, None, cache)] + [
        attn(x[:, t : t + 1], True, None, None, cache) for t in range(3, 7)
    ]
    assert cache.length == 7
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-6)


def test_band_places_the_kernel_on_the_diagonals():
    w = torch.tensor([[0.2, 0.3, 0.5]])  # H = 1, K = 3, causal (P = 2)
    A = band(w, 1, 4, 4, 2, 0)[0, 0]
    assert torch.allclose(A, torch.tensor([[0.5, 0, 0, 0], [0.3, 0.5, 0, 0], [0.2, 0.3, 0.5, 0], [0, 0.2, 0.3, 0.5]]))


# -- through the model: options of model/attn and model/block ----------------------------------------------

from lm.config import ConfigError  # noqa: E402
from lm.model import build_model  # noqa: E402
from lm.model.attention import capture  # noqa: E402
from lm.model.config import model_preset  # noqa: E402
from lm.model.flops import attention_flops_per_token, flops_per_token, matmul_params, num_params  # noqa: E402

OPTIONS = {
    "synth_dense": ["model/attn=synthesizer_dense"],
    "synth_dense_plus": ["model/attn=synthesizer_dense", "model.attn.mix=plus"],
    "synth_random": ["model/attn=synthesizer_random"],
    "synth_random_plus_alpha": ["model/attn=synthesizer_random", "model.attn.mix=plus_alpha"],
    "synth_factorized": ["model/attn=synthesizer_factorized", "model.attn.factorized_k=4"],
    "lightweight_conv": ["model/attn=lightweight_conv", "model.attn.kernel_size=3"],
    "dynamic_conv": ["model/attn=dynamic_conv", "model.attn.kernel_size=3"],
    "weighted": ["model/block=weighted"],
    "evolved": ["model/block=evolved"],
}
SMALL = ["model.n_layers=2", "model.dim=32", "model.n_heads=4", "model.max_seq_len=16"]


def _model(option, extra=()):
    torch.manual_seed(0)
    return build_model(model_preset("tiny", SMALL + OPTIONS[option] + list(extra))).eval()


@pytest.mark.parametrize("option", list(OPTIONS))
def test_decoder_future_tokens_have_no_influence(option):
    model = _model(option)
    x = torch.randint(8, 256, (2, 12))
    y = x.clone()
    y[:, 7:] = torch.randint(8, 256, (2, 5))
    assert torch.equal(model(x).logits[:, :7], model(y).logits[:, :7])
    assert not torch.allclose(model(x).logits[:, 7:], model(y).logits[:, 7:])


@pytest.mark.parametrize("option", list(OPTIONS))
def test_encoder_padding_has_no_influence_on_real_tokens(option):
    model = _model(option, ["model.arch=encoder"])
    x = torch.randint(8, 256, (2, 10))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 6:] = 0
    y = x.clone()
    y[1, 6:] = torch.randint(8, 256, (4,))
    a, b = model(x, attention_mask=mask).logits, model(y, attention_mask=mask).logits
    assert torch.allclose(a[0], b[0]) and torch.allclose(a[1, :6], b[1, :6], atol=1e-5)


@pytest.mark.parametrize("pos", ["t5_bias", "alibi"])
def test_evolved_decoder_gives_its_2h_narrow_heads_the_per_head_score_bias(pos):
    """The branched attention's 2H heads take the bias of the H-head scheme, each pair its head's own."""
    from lm.zoo.evolved import _per_narrow_head

    model = _model("evolved", [f"model/pos={pos}", "model.arch=encoder_decoder"])
    x = torch.randint(8, 256, (2, 12))
    y = x.clone()
    y[:, 7:] = torch.randint(8, 256, (2, 5))
    enc = torch.randint(8, 256, (2, 9))
    out = lambda ids: model(enc, decoder_input_ids=ids).logits  # noqa: E731
    assert torch.equal(out(x)[:, :7], out(y)[:, :7])  # causal with the bias added
    bias = torch.arange(2 * 3 * 4 * 5.0).view(2, 3, 4, 5)  # (B, H=3, Tq, Tk)
    wide = _per_narrow_head(bias, 6)
    assert wide.shape == (2, 6, 4, 5) and torch.equal(wide[:, 0], bias[:, 0]) and torch.equal(wide[:, 1], bias[:, 0])
    assert torch.equal(wide[:, 5], bias[:, 2])
    assert _per_narrow_head(bias[:, :1], 6).shape[1] == 1  # a head-independent mask broadcasts as it is


@pytest.mark.parametrize("option", [o for o in OPTIONS if o != "evolved"])
def test_kv_cached_generation_matches_the_full_forward(option):
    model = _model(option)
    x = torch.randint(8, 256, (2, 9))
    full = model(x).logits
    cache = model.new_cache()
    steps = [model.next_logits(x[:, :4], cache)] + [model.next_logits(x[:, t : t + 1], cache) for t in range(4, 9)]
    assert torch.allclose(torch.stack(steps, 1), full[:, 3:], atol=1e-5)


def test_evolved_refuses_a_kv_cache_by_name():
    model = _model("evolved")
    with pytest.raises(ValueError, match="model/block=evolved"):
        model.next_logits(torch.randint(8, 256, (1, 3)), [LayerCache() for _ in range(2)])


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_evolved_generates_by_recomputing_the_sequence(arch):
    """Its convolutions keep no state, so new_cache() is None and generate() reruns the whole sequence each step
    (lm eval's generation tasks raised the cache's ValueError, whose 'generate without a cache' lm had no way to do):
    each greedy token is the argmax of a full forward over the tokens before it."""
    from lm.model.generate import generate

    model = _model("evolved", [f"model.arch={arch}"])
    assert model.new_cache() is None
    prompt = torch.randint(8, 256, (2, 5))
    out = generate(model, prompt, 6)
    seq = prompt if arch == "decoder" else torch.zeros(2, 1, dtype=torch.long)  # decoder_start_token_id 0
    for t in range(6):
        logits = model(seq).logits if arch == "decoder" else model(prompt, decoder_input_ids=seq).logits
        assert torch.equal(out[:, t], logits[:, -1].argmax(-1))
        seq = torch.cat([seq, out[:, t : t + 1]], 1)


@pytest.mark.parametrize("option", ["synth_dense", "synth_random_plus_alpha", "dynamic_conv", "weighted"])
def test_capture_records_each_layers_probabilities(option):
    model = _model(option)
    x = torch.randint(8, 256, (2, 7))
    with capture(model) as maps:
        model(x)
    assert [m["layer"] for m in maps] == [0, 1] and all(m["kind"] == "self" for m in maps)
    for m in maps:
        assert m["probs"].shape == (2, 4, 7, 7) and torch.all(m["probs"].triu(1) == 0)
        rows = m["probs"].sum(-1)
        assert torch.allclose(rows[:, :, 2:], torch.ones_like(rows[:, :, 2:]), atol=1e-5)  # conv: full windows from t=2


def test_encoder_decoder_keeps_scaled_dot_for_cross_attention():
    from lm.model.scores import ScaledDot

    for option in ("synth_random", "lightweight_conv"):
        model = _model(option, ["model.arch=encoder_decoder"])
        crosses = [b.cross_attn for b in model.decoder.blocks]
        assert all(type(c.score) is ScaledDot for c in crosses)
        assert type(model.decoder.blocks[0].self_attn.score) is not ScaledDot


def test_weighted_block_branch_weights_sum_to_one_are_learned_and_match_vanilla_params():
    from lm.zoo.weighted import WeightedAttention

    model = _model("weighted").train()
    blocks = model.decoder.blocks
    assert all(isinstance(b.self_attn, WeightedAttention) and b.ffn is None for b in blocks)
    w = blocks[0].self_attn.branch_weights()
    assert torch.allclose(w["kappa"], torch.full((4,), 0.25)) and torch.allclose(w["alpha"], torch.full((4,), 0.25))
    x = torch.randint(8, 256, (2, 8))
    model(x, labels=x).loss.backward()
    attn = blocks[0].self_attn
    assert attn.kappa.grad.abs().sum() > 0 and attn.alpha.grad.abs().sum() > 0
    # the formula: sum_i alpha_i FFN_i(kappa_i head_i W^{O_i}), against the module's own output
    q, k, v = [torch.randn(2, 4, 8, 8) for _ in range(3)]
    heads = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    expected = sum(0.25 * attn.branch_ffn[i](0.25 * attn.branch_out[i](heads[:, i])) for i in range(4))
    assert torch.allclose(attn.attend(q, k, v, None, True), expected, atol=1e-5)
    vanilla = num_params(model_preset("tiny", SMALL))
    weighted = num_params(model_preset("tiny", SMALL + OPTIONS["weighted"]))
    # the same matrices; per layer: H - 1 more output-projection and FFN-down biases, kappa and alpha,
    # and no FFN norm (weight + bias)
    assert weighted - vanilla == 2 * (3 * 32 * 2 + 2 * 4 - 2 * 32)


def test_evolved_cells_have_the_papers_sub_layer_sequence():
    from lm.zoo import evolved

    dec = _model("evolved", ["model.arch=encoder_decoder"])
    cell = dec.decoder.blocks[0]
    assert [type(m) for m in cell.prelude] == [evolved.BranchedAttention, evolved.DecoderConvBranches]
    assert cell.prelude[0].self_attn.n_heads == 8 and cell.prelude[0].cross_attn.n_heads == 4
    assert isinstance(cell.ffn, evolved.SwishFFN) and cell.cross_attn is not None
    enc = dec.encoder.blocks[0]
    assert [type(m) for m in enc.prelude] == [evolved.GLUSublayer, evolved.EncoderConvBranches]
    assert not isinstance(enc.ffn, evolved.SwishFFN)
    kernels = [m.depthwise.kernel_size[0] for m in cell.prelude[1].modules() if isinstance(m, evolved.SeparableConv1d)]
    assert kernels == [11, 7, 7]


def test_ops_count_each_option_as_built():
    T, layers, d = 16, 2, 32
    vanilla = model_preset("tiny", SMALL)
    conv = model_preset("tiny", SMALL + OPTIONS["lightweight_conv"])
    # a convolution costs 2 K multiply-adds per channel, whatever T is: no T^2 term
    assert attention_flops_per_token(conv, T) == attention_flops_per_token(conv, 2 * T) == 3 * layers * 2 * d * 3
    random = model_preset("tiny", SMALL + OPTIONS["synth_random"])
    assert attention_flops_per_token(random, T) == attention_flops_per_token(vanilla, T) // 2  # probs @ v only
    factorized = model_preset("tiny", SMALL + OPTIONS["synth_factorized"])
    assert attention_flops_per_token(factorized, T) == 3 * layers * (2 * d * T + 2 * 4 * 4 * T)
    evolved = model_preset("tiny", SMALL + OPTIONS["evolved"])
    assert attention_flops_per_token(evolved, T) == 2 * attention_flops_per_token(vanilla, T)  # + the 2H-head one
    # the decoder cell's separable convolutions: K taps per channel + pointwise, counted per token
    sep = [(32, 64, 11), (32, 16, 7), (64, 32, 7)]
    conv_params = sum(c_in * k + c_in * c_out for c_in, c_out, k in sep)
    glu_free = matmul_params(evolved) - matmul_params(vanilla)
    wide_attn = 4 * d * d  # q, k, v, out of the 2H-head attention
    swish_vs_gelu = 0  # both d -> 4d -> d
    assert glu_free == layers * (conv_params + wide_attn + swish_vs_gelu)
    assert flops_per_token(evolved, T) == 6 * matmul_params(evolved) + attention_flops_per_token(evolved, T)


@pytest.mark.parametrize(
    "overrides,field",
    [
        (["model/attn=lightweight_conv", "model/pos=alibi"], "model/pos=alibi"),
        (["model/attn=dynamic_conv", "model.n_kv_heads=2"], "model.n_kv_heads"),
        (["model/attn=synthesizer_random", "model/pos=rope"], "model/pos=rope"),
        (["model/attn=synthesizer_dense", "model.attn_scale=0.5"], "model.attn_scale"),
        (["model/attn=lightweight_conv", "model/block=weighted"], "model/block=weighted"),
        (["model/block=weighted", "model/ffn=moe"], "model/ffn=moe"),
        (["model/block=evolved", "model.dim=36", "model.n_heads=4"], "head_dim=9"),
        (["model/block=evolved", "model/ffn=moe"], "model/ffn=moe"),  # the decoder cell's FFN is the Swish FFN
        # the decoder cell's 2H heads of Dh/2 do not fit a rotation built for Dh (a RuntimeError in forward before)
        (["model/block=evolved", "model/pos=rope"], "model/pos=rope"),
        (["model/block=evolved", "model.arch=encoder_decoder", "model/pos=rope_dynamic"], "model/pos=rope_dynamic"),
        (["model/block=evolved", "model.arch=encoder", "model/stack=funnel", "model.stack.blocks=[1,1]"], "funnel"),
        (
            ["model/attn=synthesizer_random", "model.arch=encoder", "model/stack=funnel", "model.stack.blocks=[1,1]"],
            "funnel",
        ),
        (
            [
                "model/attn=dynamic_conv",
                "model.arch=encoder",
                "model/stack=funnel",
                "model.stack.blocks=[1,1]",
                "model/pos=none",
            ],
            "funnel",
        ),
    ],
)
def test_undefined_combinations_are_refused_before_building(overrides, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        build_model(model_preset("tiny", SMALL + overrides))


# -- through lm train: checkpoint/resume, and DDP like one process --------------------------------------------

from tests.engine_support import compose, loaders, spawn, tiny_overrides, train_losses  # noqa: E402

TRAIN = {  # lm train overrides (model=tiny at max_seq_len 64)
    "synth_random_plus_alpha": ["model/attn=synthesizer_random", "model.attn.mix=plus_alpha"],
    "synth_dense": ["model/attn=synthesizer_dense"],
    "dynamic_conv": ["model/attn=dynamic_conv", "model.attn.kernel_size=3"],
    "weighted": ["model/block=weighted"],
    "evolved": ["model/block=evolved"],
}


@pytest.mark.parametrize("option", list(TRAIN))
def test_lm_train_resumes_exactly(option, tmp_path):
    from lm.cli.train import train

    def run(run_dir, steps):
        cfg = compose(tiny_overrides(run_dir, steps) + ["sched=constant", *TRAIN[option]])
        train(cfg, loaders=loaders(cfg))

    run(tmp_path / "whole", 6)
    run(tmp_path / "split", 3)
    run(tmp_path / "split", 6)
    whole, split = train_losses(tmp_path / "whole"), train_losses(tmp_path / "split")
    assert list(split) == list(range(1, 7)) and split == whole


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("option", ["synth_random_plus_alpha", "dynamic_conv", "weighted", "evolved"])
def test_ddp_trains_like_one_process(option, tmp_path):
    """2 gloo ranks x micro-batch 2 against one process with 2 micro-batches of 2 (engine_support's
    sample layout): the same losses, so every new parameter (R, alpha, kernels, kappa/alpha, convs)
    is synchronised and none is left without a gradient."""
    from lm.cli.train import train

    extra = [*TRAIN[option], "optim.lr=1e-2"]
    cfg = compose(tiny_overrides(tmp_path / "single", 8, micro_batch_size=2, grad_accum=2) + extra)
    train(cfg, loaders=loaders(cfg))
    reports = spawn(2, tiny_overrides(tmp_path / "dist", 8, micro_batch_size=2) + ["engine=ddp", *extra])
    assert [r[2]["world_size"] for r in reports] == [2, 2]
    single, dist = train_losses(tmp_path / "single"), train_losses(tmp_path / "dist")
    assert list(dist) == list(range(1, 9))
    assert max(abs(dist[s] - single[s]) for s in single) < 1e-5
    assert min(single[s] for s in (6, 7, 8)) < single[1]  # it learns (batches of 4: noisy step to step)


@pytest.mark.parametrize(
    "override,named",
    [
        ("model/block=weighted", "model/block=weighted"),
        ("model/block=evolved", "model/block=evolved"),
        ("model/attn=dynamic_conv", "model.attn._target_"),
    ],
)
def test_hugging_face_export_refuses_the_new_options_by_name(override, named):
    pytest.importorskip("transformers")
    from lm.model.convert import to_hf

    model = build_model(model_preset("gpt2", ["model.n_layers=1", "model.dim=64", "model.n_heads=2", override]))
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        to_hf(model)
