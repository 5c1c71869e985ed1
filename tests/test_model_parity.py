"""Our logits against Hugging Face implementations (code no one here wrote), via lm.model.convert."""

import pytest
import torch

transformers = pytest.importorskip("transformers")
from lm.model import build_model  # noqa: E402
from lm.model.convert import from_hf, to_hf  # noqa: E402
from tests.model_support import TINY_LLAMA, eval_logits, hf_inputs, perturb, real_positions, untie_head  # noqa: E402

V = 101


def _hf_models():
    T = transformers
    return {
        "gpt2": lambda: T.GPT2LMHeadModel(
            T.GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0)
        ),
        "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(vocab_size=V, **TINY_LLAMA)),
        "bert": lambda: T.BertForMaskedLM(
            T.BertConfig(
                vocab_size=V,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=64,
                max_position_embeddings=64,
            )
        ),
        "t5": lambda: T.T5ForConditionalGeneration(
            T.T5Config(vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0)
        ),
        "t5_gated_untied": lambda: untie_head(
            T.T5ForConditionalGeneration(
                T.T5Config(
                    vocab_size=V,
                    d_model=32,
                    d_kv=8,
                    d_ff=48,
                    num_layers=2,
                    num_decoder_layers=3,
                    num_heads=4,
                    feed_forward_proj="gated-gelu",
                    tie_word_embeddings=False,
                    decoder_start_token_id=0,
                )
            )
        ),
    }


def _perturb(hf):
    return perturb(hf, scale=0.1)


def _inputs(name):
    return hf_inputs(V, name.startswith("t5"))


@pytest.mark.parametrize("name", list(_hf_models()))
def test_logits_match_hugging_face(name):
    torch.manual_seed(0)
    hf = _perturb(_hf_models()[name]())
    ours, cfg = from_hf(hf)
    assert cfg.tie_embeddings == (name != "t5_gated_untied" and name != "llama")
    kw = _inputs(name)
    theirs, mine = eval_logits(hf, kw), eval_logits(ours, kw)
    assert theirs.shape == mine.shape
    diff = (real_positions(kw, theirs) - real_positions(kw, mine)).abs().max().item()
    assert diff < 1e-4, f"{name}: max |logit difference| {diff}"
    # The comparison is not vacuous: a model of the same config with other weights disagrees.
    other = eval_logits(build_model(cfg), kw)
    assert (real_positions(kw, theirs) - real_positions(kw, other)).abs().max().item() > 1e-2


@pytest.mark.parametrize("name", list(_hf_models()))
def test_export_round_trip(name):
    torch.manual_seed(0)
    hf = _perturb(_hf_models()[name]())
    ours, _ = from_hf(hf)
    kw = _inputs(name)
    exported = to_hf(ours)
    assert type(exported) is type(hf)
    diff = (eval_logits(hf, kw) - eval_logits(exported, kw)).abs().max().item()
    assert diff < 1e-5


def test_export_refuses_unmatched_layout():
    from lm.model.config import ALiBiConfig, ModelConfig

    cfg = ModelConfig(pos=ALiBiConfig())
    with pytest.raises(ValueError, match="no Hugging Face family matches"):
        to_hf(build_model(cfg))


def test_t5_preset_matches_hugging_face_at_another_width():
    """conf/model/t5.yaml at model.dim=32 is Hugging Face's T5 at d_model=32: the tied output's
    d_model^-1/2 scale follows model.dim (it was fixed at 512^-1/2)."""
    from lm.model.config import model_preset

    T = transformers
    torch.manual_seed(0)
    hf = _perturb(
        T.T5ForConditionalGeneration(
            T.T5Config(vocab_size=V, d_model=32, d_kv=8, d_ff=128, num_layers=2, num_heads=4, decoder_start_token_id=0)
        )
    )
    cfg = model_preset(
        "t5",
        ["model.dim=32", "model.n_heads=4", "model.n_layers=2", "model.n_decoder_layers=2", f"model.vocab_size={V}"],
    )
    assert cfg.logit_scale == pytest.approx(32**-0.5, rel=1e-12)
    ours = build_model(cfg)
    ours.load_state_dict(from_hf(hf)[0].state_dict())  # their weights in the preset's model
    kw = _inputs("t5")
    diff = (eval_logits(hf, kw) - eval_logits(ours, kw)).abs().max().item()
    assert diff < 1e-4, f"max |logit difference| {diff}"
