"""Every option file and preset composes with Hydra, builds, runs forward/backward, and learns."""

from pathlib import Path

import pytest
import torch

from lm.config import ConfigError, ModelConfig, compose_model, conf_dir
from lm.model import build_model, model_config
from lm.model.flops import flops_per_token, matmul_params, num_params

OPTIONS = [(slot, p.stem) for slot in ("norm", "ffn", "pos") for p in sorted((conf_dir() / "model" / slot).glob("*.yaml"))]
PRESETS = sorted(p.stem for p in (conf_dir() / "model").glob("*.yaml"))


def _batch(cfg, B=2, T=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(1, cfg.vocab_size, (B, T), generator=g)
    if cfg.arch == "encoder_decoder":
        return {"input_ids": x, "labels": torch.randint(1, cfg.vocab_size, (B, T // 2), generator=g)}
    return {"input_ids": x, "labels": torch.roll(x, -1, dims=1)}


def test_every_option_and_preset_is_tested():
    assert len(OPTIONS) == 2 + 6 + 9, OPTIONS  # pos: 6 schemes + rope_linear, rope_dynamic, rope_llama3
    assert set(PRESETS) >= {"tiny", "transformer", "gpt2", "llama", "bert", "t5"}


@pytest.mark.parametrize("slot,option", OPTIONS)
def test_option_trains_a_tiny_model(slot, option):
    """Each option composes into the tiny preset, and 30 AdamW steps lower the loss on a fixed batch."""
    cfg = model_config(compose_model("tiny", [f"{slot}={option}", "vocab_size=64", "dim=48", "n_heads=4"]))
    torch.manual_seed(0)
    model = build_model(cfg)
    batch = _batch(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(30):
        loss = model(**batch).loss
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    assert loss.item() < 0.5 * first, (first, loss.item())


# Full-size forward/backward costs seconds; Llama's 1.1B is run at 2 layers (its full size is
# built on the meta device and counted below).
PRESET_DEPTH = {"llama": ["n_layers=2"]}


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_builds_and_runs_forward_backward(preset):
    cfg = model_config(compose_model(preset, PRESET_DEPTH.get(preset, [])))
    model = build_model(cfg)
    out = model(**_batch(cfg, B=1, T=8))
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert model.embed.tok.weight.grad is not None


@pytest.mark.parametrize("preset,millions", [("gpt2", 124.48), ("bert", 109.51), ("t5", 60.51), ("llama", 1100.05),
                                             ("transformer", 63.08)])
def test_preset_parameter_counts(preset, millions):
    # gpt2 124.4M at vocab 50257 (+0.04M padding to 50304); bert-base 109.5M; t5-small 60.5M; TinyLlama 1.1B.
    assert num_params(model_config(compose_model(preset))) / 1e6 == pytest.approx(millions, abs=0.01)


def test_num_params_matches_the_built_model():
    for preset, over in [("tiny", []), ("tiny", ["ffn=swiglu", "n_kv_heads=2", "tie_embeddings=false"])]:
        cfg = model_config(compose_model(preset, over))
        assert num_params(cfg) == sum(p.numel() for p in build_model(cfg).parameters())


@pytest.mark.parametrize("glu", ["swiglu", "geglu", "reglu"])
@pytest.mark.parametrize("mlp", ["relu", "gelu"])
def test_glu_variants_are_parameter_matched(glu, mlp):
    base = ["dim=96", "bias=false"]  # 8/3 * 96 = 256 exactly
    a = num_params(model_config(compose_model("tiny", base + [f"ffn={mlp}"])))
    b = num_params(model_config(compose_model("tiny", base + [f"ffn={glu}"])))
    assert a == b
    # With bias the GLU has one more hidden-size bias vector per layer.
    cfg = model_config(compose_model("tiny", ["dim=96", f"ffn={glu}"]))
    ffn = build_model(cfg).decoder.blocks[0].ffn
    assert ffn.gate_up.out_features == 2 * 256


def test_gqa_and_mqa_shrink_only_the_key_value_projections():
    d, h = 64, 8
    counts = {kv: num_params(model_config(compose_model("tiny", [f"dim={d}", f"n_heads={h}", f"n_kv_heads={kv}", "bias=false"])))
              for kv in (8, 2, 1)}
    head_dim = d // h
    for kv in (2, 1):
        assert counts[8] - counts[kv] == 2 * 2 * d * (h - kv) * head_dim  # 2 layers x (k and v)


def test_flops_per_token_follows_the_palm_formula():
    cfg = model_config(compose_model("gpt2"))
    n = matmul_params(cfg)
    per_layer = 768 * 3 * 768 + 768 * 768 + 2 * 768 * 3072  # qkv, attention out, MLP up and down
    assert n == 12 * per_layer + 50304 * 768  # plus the (tied) output projection
    assert flops_per_token(cfg, 1024) == 6 * n + 12 * 12 * 12 * 64 * 1024


@pytest.mark.parametrize("override,field", [
    (["dim=100", "n_heads=3"], "model.dim=100 is not divisible by model.n_heads=3"),
    (["n_kv_heads=3"], "model.n_kv_heads=3 does not divide model.n_heads=4"),
    (["norm_position=middle"], "model.norm_position='middle' is not one of"),
    (["arch=rnn"], "model.arch='rnn' is not one of"),
    (["init=xavier"], "model.init='xavier' is not one of"),
])
def test_impossible_models_fail_at_build_time(override, field):
    with pytest.raises(ConfigError, match=field.replace("(", r"\(").replace("[", r"\[")):
        build_model(compose_model("tiny", override))


def test_unknown_field_and_wrong_type_are_named():
    with pytest.raises(ConfigError, match="n_layer"):
        build_model({"n_layer": 3})
    with pytest.raises(ConfigError, match="dim"):
        build_model({"dim": "wide"})


def test_unknown_component_names_the_slot():
    cfg = ModelConfig(ffn={"_target_": "lm.model.ffn.NoSuchFFN", "_partial_": True})
    with pytest.raises(ConfigError, match="model.ffn could not be built"):
        build_model(cfg)


def test_unknown_group_option_lists_the_choices():
    from hydra.errors import MissingConfigException

    with pytest.raises(MissingConfigException, match="swiglu"):
        compose_model("tiny", ["ffn=swishglu"])
