"""model/attn as a config slot: each option's parameters and FLOPs, its schema and file, config refusals, saved
configs from before the slot, a new option in one class, ablate_attention, and the Funnel encoder over every option."""

import re
from dataclasses import dataclass

import pytest
import torch
from omegaconf import OmegaConf

from lm.config import ConfigError, conf_dir
from lm.model import build_model
from lm.model.attention import capture
from lm.model.config import AttnConfig, model_from_saved, model_preset, options, schema_name
from lm.model.flops import attention_flops_per_token, flops_per_token, matmul_params, num_params
from lm.model.registry import register
from lm.model.scores import Score
from lm.zoo.scores import LinformerConfig
from tests.attention_support import OPTIONS, cfg_of, ids, model_of, perturb_pads

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
    _target_: str = "tests.test_attention_options.Cosine"
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
    cfg = cfg_of(option, "encoder", ["model/stack=funnel"], n_layers=4, **{"stack.blocks": "[2,2]"})
    model = build_model(cfg).eval()
    x = ids(2, 12)
    mask = torch.ones_like(x)
    mask[0, 9:] = 0
    with torch.no_grad():
        a = model(x, attention_mask=mask).logits
        b = model(perturb_pads(x, mask), attention_mask=mask).logits
    assert torch.equal(a[mask.bool()], b[mask.bool()])
    if option == "scaled_dot":  # the per-module sum agrees with Funnel's count in full-length layers, queries x keys:
        # 2 blocks at 1 x 1, the pooling block 1/2 x 1, 1 at 1/2 x 1/2, 2 up-sampling (decoder_layers) at 1 x 1
        assert attention_flops_per_token(cfg, 16) == round(12 * (2 + 0.5 + 0.25 + 2) * 4 * 8 * 16)
