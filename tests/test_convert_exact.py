"""Conversion to and from Hugging Face is exact outside the default layouts, or refuses by name.

Every parameter is perturbed first (zero biases and unit norms would hide mapping errors), and
each case is checked both ways: their model -> ours (from_hf) and ours -> theirs (to_hf), the
latter also through save_pretrained / from_pretrained as lm export writes it.
"""

import pytest
import torch

transformers = pytest.importorskip("transformers")
from lm.model import build_model  # noqa: E402
from lm.model.config import GLUConfig, LayerNormConfig, MLPConfig, ModelConfig, RMSNormConfig, RoPEConfig, T5BiasConfig  # noqa: E402
from lm.model.convert import from_hf, to_hf  # noqa: E402
from lm.model.generate import generate  # noqa: E402
from tests.model_support import (  # noqa: E402
    BERT_LAYOUT,
    TINY_LLAMA,
    eval_logits,
    hf_inputs,
    perturb,
    real_positions,
    untie_head,
)

T = transformers
V = 101
TOL = 1e-5  # fp32, relative to the largest |logit| (perturbed untied heads give logits in the tens)


def gpt2(**kw):
    return T.GPT2LMHeadModel(T.GPT2Config(vocab_size=V, n_embd=32, n_layer=3, n_head=4, n_positions=64, **kw))


def llama(**kw):
    return T.LlamaForCausalLM(T.LlamaConfig(**{**TINY_LLAMA, "vocab_size": V, **kw}))


def bert(**kw):
    return T.BertForMaskedLM(
        T.BertConfig(
            vocab_size=V,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=64,
            **kw,
        )
    )


def esm(**kw):
    """ESM-2's layout: pre-norm, rotary, no embedding LayerNorm (token_dropout off: it rescales embeddings)."""
    config = dict(
        vocab_size=V,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        position_embedding_type="rotary",
        emb_layer_norm_before=False,
        pad_token_id=0,
        mask_token_id=3,
    )
    return T.EsmForMaskedLM(T.EsmConfig(**{**config, **kw}))


def t5(untied=False, num_decoder_layers=3, **kw):
    hf = T.T5ForConditionalGeneration(
        T.T5Config(
            vocab_size=V,
            d_model=32,
            d_kv=8,
            d_ff=48,
            num_layers=2,
            num_decoder_layers=num_decoder_layers,
            num_heads=4,
            **{"decoder_start_token_id": 0, **kw},
        )
    )
    return untie_head(hf) if untied else hf


HF_CASES = {
    "gpt2": lambda: gpt2(),
    "gpt2_untied": lambda: untie_head(gpt2(tie_word_embeddings=False)),
    "gpt2_inverse_layer_idx": lambda: gpt2(scale_attn_by_inverse_layer_idx=True),
    "gpt2_unscaled_attn": lambda: gpt2(scale_attn_weights=False),
    "gpt2_both_scalings": lambda: gpt2(scale_attn_weights=False, scale_attn_by_inverse_layer_idx=True),
    "gpt2_relu": lambda: gpt2(activation_function="relu"),
    "llama": lambda: llama(),
    "llama_tied": lambda: llama(tie_word_embeddings=True),
    "llama_attention_bias": lambda: llama(attention_bias=True),
    "llama_mlp_bias": lambda: llama(mlp_bias=True),
    "llama_both_biases": lambda: llama(attention_bias=True, mlp_bias=True),
    "llama_gelu": lambda: llama(hidden_act="gelu"),
    "llama_rope_linear": lambda: llama(rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 500.0}),
    # max_position_embeddings 8 < 12 input tokens: the dynamic base is in play
    "llama_rope_dynamic": lambda: llama(
        max_position_embeddings=8, rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 100.0}
    ),
    "llama_rope_llama3": lambda: llama(
        rope_parameters={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
            "rope_theta": 500.0,
        }
    ),
    "bert": lambda: bert(),
    "bert_relu": lambda: bert(hidden_act="relu"),
    "bert_silu": lambda: bert(hidden_act="silu"),
    "bert_gelu_new": lambda: bert(hidden_act="gelu_new"),
    "esm": lambda: esm(),
    "esm_rope_theta": lambda: esm(rope_theta=500.0, layer_norm_eps=1e-5),
    "t5": lambda: t5(),
    "t5_gelu": lambda: t5(feed_forward_proj="gelu"),
    "t5_gated_gelu_untied": lambda: t5(untied=True, feed_forward_proj="gated-gelu", tie_word_embeddings=False),
    "t5_gated_gelu_tied": lambda: t5(feed_forward_proj="gated-gelu"),
    "t5_gated_relu_untied_scaled": lambda: t5(untied=True, feed_forward_proj="gated-relu"),
    "t5_gated_silu": lambda: t5(feed_forward_proj="gated-silu", tie_word_embeddings=False),
}


def inputs(t5_like: bool, seq=12):
    return hf_inputs(V, t5_like, seq)


def logits(model, kw):
    return real_positions(kw, eval_logits(model, kw))


def max_diff(a, b, kw):
    """max |logit difference| / max(1, max |logit|): the float error of the same sums in another order."""
    la, lb = logits(a, kw), logits(b, kw)
    return ((la - lb).abs().max() / la.abs().max().clamp(min=1)).item()


@pytest.mark.parametrize("name", list(HF_CASES))
def test_from_hf_and_back_with_perturbed_weights(name, tmp_path):
    torch.manual_seed(0)
    hf = perturb(HF_CASES[name]())
    ours, cfg = from_hf(hf)
    kw = inputs(name.startswith("t5"))
    diff = max_diff(hf, ours, kw)
    assert diff < TOL, f"{name} from_hf: max |logit diff| {diff}"
    # not vacuous: the same config with other weights disagrees
    assert max_diff(hf, perturb(build_model(cfg), seed=5), kw) > 1e-2
    assert cfg.tie_embeddings == (
        hf.get_output_embeddings().weight.data_ptr() == hf.get_input_embeddings().weight.data_ptr()
    )
    exported = to_hf(ours)
    assert type(exported) is type(hf)
    assert max_diff(hf, exported, kw) < TOL, f"{name} to_hf"
    exported.save_pretrained(tmp_path)
    reloaded = type(hf).from_pretrained(tmp_path)
    diff = max_diff(hf, reloaded, kw)
    assert diff < TOL, f"{name} save_pretrained/from_pretrained: {diff}"
    again, _ = from_hf(reloaded)
    for key, value in ours.state_dict().items():
        assert torch.equal(value, again.state_dict()[key]), key


def _ours(**kw):
    return ModelConfig(vocab_size=V, dim=32, n_layers=2, n_heads=4, max_seq_len=64, **kw)


OUR_CASES = {
    # the T5 v1.1 layout: GeGLU with tanh GELU, untied, unscaled logits
    "t5_v1_1": lambda: _ours(
        arch="encoder_decoder",
        n_decoder_layers=3,
        head_dim=8,
        bias=False,
        attn_scale=1.0,
        tie_embeddings=False,
        logit_scale=1.0,
        norm=RMSNormConfig(),
        ffn=GLUConfig(activation="gelu_tanh", hidden_dim=48),
        pos=T5BiasConfig(),
    ),
    "t5_mlp_gelu_tanh": lambda: _ours(
        arch="encoder_decoder",
        bias=False,
        attn_scale=1.0,
        logit_scale=32**-0.5,
        norm=RMSNormConfig(),
        ffn=MLPConfig(activation="gelu_tanh"),
        pos=T5BiasConfig(),
    ),
    "t5_glu_exact_gelu_tied_unscaled": lambda: _ours(
        arch="encoder_decoder",
        bias=False,
        attn_scale=1.0,
        norm=RMSNormConfig(),
        ffn=GLUConfig(activation="gelu"),
        pos=T5BiasConfig(),
    ),
    "bert_relu": lambda: _ours(
        **BERT_LAYOUT,
        mlm_activation="relu",
        ffn=MLPConfig(activation="relu"),
    ),
    # the GLUE GPU preset's encoder with BERT's MLM-head transform: EsmForMaskedLM
    "esm_mlm_transform": lambda: _ours(arch="encoder", mlm_transform=True, pos=RoPEConfig(theta=1000.0)),
    "gpt2_layer_scaled": lambda: _ours(attn_scale_by_layer=True, ffn=MLPConfig(activation="gelu_tanh")),
    "gpt2_exact_gelu_untied": lambda: _ours(tie_embeddings=False),
    "llama_rope_llama3_biases": lambda: _ours(
        bias=True,
        ffn_bias=False,
        n_kv_heads=2,
        tie_embeddings=False,
        norm=RMSNormConfig(),
        ffn=GLUConfig(activation="silu"),
        pos=RoPEConfig(theta=500.0, scaling="llama3", factor=8.0, original_max_seq_len=16),
    ),
    "llama_mlp_bias_rope_linear": lambda: _ours(
        bias=False,
        ffn_bias=True,
        norm=RMSNormConfig(),
        ffn=GLUConfig(activation="silu"),
        pos=RoPEConfig(scaling="linear", factor=2.0),
    ),
}


@pytest.mark.parametrize("name", list(OUR_CASES))
def test_to_hf_of_our_layouts(name, tmp_path):
    torch.manual_seed(0)
    ours = perturb(build_model(OUR_CASES[name]()))
    kw = inputs(name.startswith("t5"))
    theirs = to_hf(ours)
    diff = max_diff(ours, theirs, kw)
    assert diff < TOL, f"{name} to_hf: max |logit diff| {diff}"
    theirs.save_pretrained(tmp_path)
    reloaded = type(theirs).from_pretrained(tmp_path)
    assert max_diff(ours, reloaded, kw) < TOL
    back, cfg = from_hf(reloaded)
    assert cfg.tie_embeddings == ours.cfg.tie_embeddings
    assert max_diff(ours, back, kw) < TOL


def test_an_encoder_without_the_mlm_transform_exports_as_esms_encoder_alone(tmp_path):
    """The GLUE GPU preset's encoder (RoPE, pre-norm, no MLM-head transform): ESM's MLM head has the transform, so
    the export is EsmModel, whose last hidden states are ours; a sequence classifier loads it."""
    torch.manual_seed(0)
    ours = perturb(build_model(_ours(arch="encoder", pos=RoPEConfig())))
    theirs = to_hf(ours)
    assert type(theirs) is T.EsmModel
    kw = inputs(False)
    with torch.no_grad():
        h_ours = ours.features(kw["input_ids"], kw["attention_mask"])
        h_theirs = theirs(**kw).last_hidden_state
    real = kw["attention_mask"].bool()
    diff = (h_ours[real] - h_theirs[real]).abs().max() / h_ours[real].abs().max()
    assert diff < TOL, diff
    other = perturb(build_model(ours.cfg), seed=5)  # not vacuous
    with torch.no_grad():
        assert (other.features(kw["input_ids"], kw["attention_mask"])[real] - h_theirs[real]).abs().max() > 1e-2
    theirs.save_pretrained(tmp_path)
    clf = T.EsmForSequenceClassification.from_pretrained(tmp_path, num_labels=2).eval()
    with torch.no_grad():
        h_clf = clf.esm(**kw).last_hidden_state
    assert torch.allclose(h_clf[real], h_theirs[real], atol=1e-6)


ESM_ONLY = r"^Hugging Face ESM with %s is not converted \(ESM-2's layout only\)$"


@pytest.mark.parametrize(
    "hf_factory, match",
    [
        (
            lambda: llama(
                rope_parameters={
                    "rope_type": "yarn",
                    "factor": 4.0,
                    "rope_theta": 10000.0,
                    "original_max_position_embeddings": 16,
                }
            ),
            "rope_type",
        ),
        (lambda: gpt2(add_cross_attention=True), "add_cross_attention=True"),
        (lambda: bert(is_decoder=True), "is_decoder=True"),
        (
            lambda: T.BertForMaskedLM(
                T.BertConfig(
                    vocab_size=V,
                    hidden_size=32,
                    num_hidden_layers=1,
                    num_attention_heads=4,
                    intermediate_size=64,
                    position_embedding_type="relative_key",
                )
            ),
            "position_embedding_type",
        ),
        (lambda: t5(feed_forward_proj="gated-gelu_fast"), "feed_forward_proj='gelu_fast'"),
        (lambda: t5(decoder_start_token_id=None), "T5 config has no decoder_start_token_id"),  # T5Config()'s
        (lambda: esm(token_dropout=True), "token_dropout=True"),
        # an import refusal, not needs()'s "ESM export cannot represent ...; export safetensors instead"
        (
            lambda: esm(emb_layer_norm_before=True),
            ESM_ONLY % r"emb_layer_norm_before=True \(a LayerNorm on the embeddings\)",
        ),
        (lambda: esm(position_embedding_type="absolute"), ESM_ONLY % "position_embedding_type='absolute'"),
        (lambda: esm(tie_word_embeddings=False), ESM_ONLY % "an MLM decoder not tied to the word embeddings"),
    ],
)
def test_from_hf_refuses_what_it_does_not_compute(hf_factory, match):
    with pytest.raises(ValueError, match=match):
        from_hf(hf_factory())


@pytest.mark.parametrize(
    "backbone, auto",
    [
        (lambda: T.GPT2Model(gpt2().config), "AutoModelForCausalLM"),
        (lambda: T.BertModel(bert().config, add_pooling_layer=False), "AutoModelForMaskedLM"),
        (lambda: T.LlamaForSequenceClassification(llama().config), "AutoModelForCausalLM"),
    ],
)
def test_from_hf_of_a_model_without_its_lm_head_names_the_class_to_load(backbone, auto):
    # AutoModel.from_pretrained(dir) gives the backbone: it was an AttributeError traceback ('NoneType' ... 'weight')
    with pytest.raises(
        ValueError, match=f"got {type(backbone()).__name__}: load the directory with transformers.{auto}"
    ):
        from_hf(backbone())


@pytest.mark.parametrize(
    "cfg, match",
    [
        (
            lambda: OUR_CASES["bert_relu"]().__class__(**{**vars(OUR_CASES["bert_relu"]()), "mlm_activation": "gelu"}),
            "mlm_activation='gelu' != model.ffn.activation='relu'",
        ),
        (lambda: _ours(qk_norm=True), "qk_norm"),
        (lambda: _ours(ffn_bias=False), "ffn_bias=False"),
        (lambda: _ours(bias=False), "without biases"),
        (lambda: _ours(n_kv_heads=2), "n_kv_heads=2"),
        (lambda: _ours(norm=LayerNormConfig(bias=False)), "norm.bias=false"),
        (lambda: _ours(arch="encoder", pos=RoPEConfig(), ffn=MLPConfig(activation="gelu_tanh")), "exact gelu only"),
        (
            lambda: _ours(arch="encoder", pos=RoPEConfig(), mlm_transform=True, tie_embeddings=False),
            "tie_embeddings=false",
        ),
        (lambda: _ours(arch="encoder", pos=RoPEConfig(scaling="linear", factor=2.0)), "pos.scaling=linear"),
        # BERT's layout with a gated FFN (lm train model=bert model/ffn=geglu): a KeyError traceback in lm export
        (lambda: _ours(**BERT_LAYOUT, ffn=GLUConfig(activation="gelu")), "glu=True"),
    ],
)
def test_to_hf_refuses_what_it_cannot_represent(cfg, match):
    with pytest.raises(ValueError, match=match):
        to_hf(build_model(cfg()))


GENERATION_CASES = {
    "gpt2": HF_CASES["gpt2"],
    "llama_rope_llama3": HF_CASES["llama_rope_llama3"],
    "llama_rope_dynamic": HF_CASES["llama_rope_dynamic"],  # 6 + 20 tokens: past max_position_embeddings=8
    "llama_both_biases": HF_CASES["llama_both_biases"],
    # transformers' generate cache breaks when a T5 has more decoder than encoder layers: equal stacks here
    "t5_gated_gelu_untied": lambda: t5(
        untied=True, num_decoder_layers=2, feed_forward_proj="gated-gelu", tie_word_embeddings=False
    ),
    "t5": lambda: t5(num_decoder_layers=2),
}


@pytest.mark.parametrize("name", list(GENERATION_CASES))
def test_greedy_generation_matches_hugging_face_generate(name):
    torch.manual_seed(0)
    hf = perturb(GENERATION_CASES[name]())
    ours, _ = from_hf(hf)
    prompt = inputs(False, seq=6)["input_ids"]
    hf.generation_config.eos_token_id = None  # 20 tokens exactly, no early stop
    hf.generation_config.pad_token_id = 0
    with torch.no_grad():
        theirs = hf.generate(input_ids=prompt, max_new_tokens=20, do_sample=False)
    start = 1 if name.startswith("t5") else prompt.shape[1]  # T5 returns the start token; decoders the prompt
    mine = generate(ours, prompt, max_new_tokens=20)
    assert torch.equal(mine, theirs[:, start:]), (mine, theirs)


@pytest.mark.parametrize("option", ["rope_linear", "rope_dynamic", "rope_llama3"])
def test_rope_scaling_options_build_and_train(option):
    """The scaled RoPE variants are ordinary model/pos options: compose, build, one gradient step."""
    from lm.model.config import model_preset

    cfg = model_preset(
        "tiny",
        ["model/ffn=swiglu", f"model/pos={option}", "model.max_seq_len=16", "model.pos.factor=4.0"]
        + (["model.pos.original_max_seq_len=8"] if option != "rope_linear" else []),
    )
    assert cfg.pos.scaling == option.split("_")[1]
    torch.manual_seed(0)
    model = build_model(cfg)
    plain = build_model(
        model_preset(
            "tiny", ["model/ffn=swiglu", "model/pos=rope", "model.max_seq_len=16", f"model.pos.theta={cfg.pos.theta}"]
        )
    )
    plain.load_state_dict(model.state_dict())
    x = torch.randint(0, cfg.vocab_size, (2, 16))
    out = model(input_ids=x, labels=x)
    out.loss.backward()
    assert torch.isfinite(out.loss) and all(p.grad is not None for p in model.parameters())
    with torch.no_grad():  # the scaling is in effect (dynamic: only past original_max_seq_len = 8)
        assert (model(input_ids=x).logits - plain(input_ids=x).logits).abs().max() > 1e-4
        if option == "rope_dynamic":
            assert torch.equal(model(input_ids=x[:, :8]).logits, plain(input_ids=x[:, :8]).logits)
