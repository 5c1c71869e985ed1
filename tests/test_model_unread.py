"""A value the chosen model never reads (a decoder's model.n_decoder_layers, plain RoPE's model.pos.factor, ...) is
refused where a user's config enters (lm train, lm finetune init=none), in one line naming the field, why it does
nothing and the fix (lm/model/validate.py's UNREAD and the options' `unread`); defaults, every preset and every
experiment pass, and a saved config holding such a value still loads."""

import itertools
import re

import pytest
import torch
from hydra import compose
from omegaconf import OmegaConf

import lm.zoo  # noqa: F401 - registers the zoo's options (model/stack=shared, model/family=electra, ...)
from lm.config import ConfigError, conf_dir
from lm.model import build_model
from lm.model.config import model_from_saved, model_preset
from lm.model.validate import refuse_unread, validate_model
from tests.engine_support import compose as compose_train
from tests.engine_support import loaders, tiny_overrides
from tests.test_sweep_experiments import hydra_conf as hydra_conf  # the fixture, re-exported

# (preset, overrides, the refusal's line). Every line is "<override> has no effect: <why>; <fix>".
REFUSED = [
    (
        "gpt2",
        ["model.n_decoder_layers=4"],
        "model.n_decoder_layers=4 has no effect: model.arch=decoder has one stack, of model.n_layers layers; only "
        "encoder_decoder has a decoder stack; set model.n_layers, or model.arch=encoder_decoder",
    ),
    ("bert", ["model.n_decoder_layers=4"], "model.n_decoder_layers=4 has no effect: model.arch=encoder has one stack"),
    (
        "tiny",
        ["model.decoder_start_token_id=1"],
        "model.decoder_start_token_id=1 has no effect: model.arch=decoder reads its inputs as given; only an "
        "encoder-decoder's decoder starts from this token (its targets shifted right, as T5); drop the override, or "
        "set model.arch=encoder_decoder",
    ),
    (
        "tiny",
        ["model.pad_token_id=1"],
        "model.pad_token_id=1 has no effect: a decoder reads it nowhere (batches are padded with the tokenizer's pad "
        "id); an encoder-decoder's shift right and an encoder's Hugging Face export read it; drop the override",
    ),
    (
        "t5",
        ["model.n_segments=2"],
        "model.n_segments=2 has no effect: an encoder-decoder is given no token types, so segment 0's vector alone "
        "would be added to every token; drop the override (segment embeddings are for model.arch=encoder or decoder)",
    ),
    (
        "gpt2",
        ["model.mlm_transform=true"],
        "model.mlm_transform=true has no effect: BERT's transform is part of the masked-LM head, which "
        "model.arch=decoder does not have; drop the override, or set model.arch=encoder",
    ),
    (
        "t5",
        ["model.mlm_activation=relu"],
        "model.mlm_activation=relu has no effect: it is the activation of the masked-LM head's transform "
        "(model.arch=encoder with model.mlm_transform=true), which this model does not have; set "
        "model.mlm_transform=true on an encoder, or drop the override",
    ),
    (
        "bert",
        ["model.mlm_transform=false", "model.mlm_activation=relu"],
        "model.mlm_activation=relu has no effect: it is the activation of the masked-LM head's transform",
    ),
    (
        "gpt2",
        ["model.sparse_prediction=false"],
        "model.sparse_prediction=false has no effect: it confines the masked-LM head to the masked positions, and "
        "model.arch=decoder has no masked-LM head; drop the override",
    ),
    (
        "t5",
        ["model.init_std=0.01"],
        "model.init_std=0.01 has no effect: model.init=t5 draws no weight from N(0, init_std) (t5 scales by fan-in, "
        "torch keeps PyTorch's init); set model.init=gpt2 or normal, or drop the override",
    ),
    ("tiny", ["model.init=torch", "model.init_std=0.01"], "model.init_std=0.01 has no effect: model.init=torch draws"),
    (
        "tiny",
        ["model/norm=fixup", "model.norm_eps=1e-6"],
        "model.norm_eps=1e-06 has no effect: model/norm=fixup builds no norm, so there is no epsilon; drop the "
        "override, or pick a model/norm that builds one (layernorm, rmsnorm)",
    ),
    ("tiny", ["model/norm=rezero", "model.norm_eps=1e-6"], "model.norm_eps=1e-06 has no effect: model/norm=rezero"),
    (
        "tiny",
        ["model/attn=dynamic_conv", "model/pos=none", "model.attn_dropout=0.1"],
        "model.attn_dropout=0.1 has no effect: model/attn=dynamic_conv computes no attention probabilities to drop, "
        "and no cross-attention here does; drop the override (an option's own dropout is under model.attn)",
    ),
    (
        "llama",
        ["model.pos.factor=2.0"],
        "model.pos.factor=2.0 has no effect: plain RoPE (model.pos.scaling=null) scales no frequency; pick a scaling "
        "(model/pos=rope_linear, rope_dynamic or rope_llama3), or drop the override",
    ),
    (
        "llama",
        ["model/pos=rope_linear", "model.pos.high_freq_factor=8.0"],
        "model.pos.high_freq_factor=8.0 has no effect: it bounds the frequency bands of Llama 3.1's scaling "
        "(model.pos.scaling=llama3 only); use model/pos=rope_llama3, or drop the override",
    ),
    ("llama", ["model/pos=rope_dynamic", "model.pos.low_freq_factor=2.0"], "model.pos.low_freq_factor=2.0 has no"),
    (
        "llama",
        ["model/pos=rope_linear", "model.pos.original_max_seq_len=512"],
        "model.pos.original_max_seq_len=512 has no effect: only dynamic and llama3 scaling read the trained context "
        "(linear divides every frequency by model.pos.factor, plain RoPE scales none); set model.pos.scaling=dynamic "
        "or llama3, or drop the override",
    ),
    ("llama", ["model.pos.original_max_seq_len=512"], "model.pos.original_max_seq_len=512 has no effect"),
    (
        "tiny",
        ["model.ffn.hidden_dim=128", "model.ffn.hidden_mult=2"],
        "model.ffn.hidden_mult=2.0 has no effect: model.ffn.hidden_dim sets the hidden size itself; hidden_mult "
        "derives it only when hidden_dim is null; drop model.ffn.hidden_mult or model.ffn.hidden_dim",
    ),
    (
        "llama",
        ["model.ffn.hidden_dim=5000"],  # the preset's multiple_of=256 would not round it
        "model.ffn.multiple_of=256 has no effect: model.ffn.hidden_dim sets the hidden size itself, not rounded to a "
        "multiple; set model.ffn.hidden_dim to a multiple of it, or model.ffn.multiple_of=1",
    ),
    (
        "tiny",
        ["model/ffn=moe", "model.ffn.expert.hidden_dim=100", "model.ffn.expert.multiple_of=8"],
        "model.ffn.expert.multiple_of=8 has no effect: model.ffn.expert.hidden_dim sets the hidden size itself",
    ),
    (
        "tiny",
        ["model/ffn=switch", "model.ffn.expert.hidden_dim=128", "model.ffn.expert.hidden_mult=2"],
        "model.ffn.expert.hidden_mult=2.0 has no effect: model.ffn.expert.hidden_dim sets the hidden size itself",
    ),
    (
        "tiny",
        ["model/stack=shared", "model.stack.step_embedding=learned"],
        "model.stack.step_embedding=learned has no effect: model/stack=shared (model.stack.share=all) adds no step "
        "embedding (the Universal Transformer's, model/stack=universal, does); drop the override",
    ),
    (
        "bert",
        ["model/family=electra", "model.sparse_prediction=false"],
        "model.sparse_prediction=false has no effect with model/family=electra: its generator predicts at the masked "
        "positions only and its discriminator at every token, whatever it says; drop the override",
    ),
]

# The same fields where the model reads them: accepted.
READ = [
    ("t5", ["model.n_decoder_layers=4", "model.decoder_start_token_id=1", "model.pad_token_id=1"]),
    ("bert", ["model.pad_token_id=1", "model.mlm_activation=relu", "model.sparse_prediction=false"]),
    ("tiny", ["model.n_segments=2", "model.init=normal", "model.init_std=0.01"]),
    ("tiny", ["model.arch=encoder", "model/family=electra", "model.mlm_activation=relu"]),  # its heads read it
    ("tiny", ["model/norm=rezero_layernorm", "model.norm_eps=1e-6"]),
    ("narang_vanilla", ["model/attn=dynamic_conv", "model/pos=none", "model.attn_dropout=0.1"]),  # cross-attention
    ("llama", ["model/pos=rope_llama3", "model.pos.factor=4.0", "model.pos.original_max_seq_len=512"]),
    ("llama", ["model/pos=rope_dynamic", "model.pos.original_max_seq_len=512"]),
    ("llama", ["model.ffn.hidden_dim=5632"]),  # a multiple of the preset's 256: what rounding would give
    ("tiny", ["model.ffn.hidden_mult=2", "model.ffn.multiple_of=64"]),
    ("tiny", ["model/stack=universal", "model.stack.step_embedding=learned"]),
]

PRESETS = sorted(p.stem for p in (conf_dir() / "model").glob("*.yaml"))
EXPERIMENTS = sorted(p.stem for p in (conf_dir() / "experiment").glob("*.yaml") if p.stem != "ablate_base")


@pytest.mark.parametrize("preset,overrides,line", REFUSED, ids=[" ".join(c[1]) for c in REFUSED])
def test_a_value_the_model_never_reads_is_refused_in_one_line(preset, overrides, line):
    cfg = model_preset(preset, overrides)
    validate_model(cfg)  # a model can be built: nothing but the entry check refuses it
    with pytest.raises(ConfigError, match="^" + re.escape(line)) as refused:
        refuse_unread(cfg)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("preset,overrides", READ, ids=[" ".join(c[1]) for c in READ])
def test_the_same_fields_pass_where_the_model_reads_them(preset, overrides):
    cfg = model_preset(preset, overrides)
    validate_model(cfg)
    refuse_unread(cfg)


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_passes_at_entry(preset):
    """Presets leave what their model does not read at its default (test_model_components builds each one)."""
    cfg = model_preset(preset)
    validate_model(cfg)
    refuse_unread(cfg)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_and_cell_passes_at_entry(hydra_conf, experiment):
    """Every cell of a sweep (seeds aside): test_sweep_experiments builds the ablate_* cells."""
    cfg = compose("train", overrides=[f"experiment={experiment}"], return_hydra_config=True)
    params = {k: str(v).split(",") for k, v in (cfg.hydra.sweeper.get("params") or {}).items() if k != "seed"}
    for values in itertools.product(*params.values()):
        cell = [f"experiment={experiment}", *(f"{k}={v}" for k, v in zip(params, values))]
        refuse_unread(OmegaConf.to_object(compose("train", overrides=cell).model))


def test_lm_train_refuses_it_before_any_work(tmp_path):
    from lm.cli.train import train

    run_dir = tmp_path / "run"
    cfg = compose_train(tiny_overrides(run_dir, 2) + ["model.n_decoder_layers=3"])
    with pytest.raises(ConfigError, match=r"^model\.n_decoder_layers=3 has no effect: model\.arch=decoder"):
        train(cfg, loaders=loaders(cfg))
    assert not run_dir.exists()


def test_lm_finetune_refuses_it_for_the_model_it_builds(tmp_path):
    """init=none builds model=<preset> as composed: the user's config."""
    from lm.glue.config import finetune_job
    from tests.test_validation_errors import compose_finetune, finetune_overrides

    cfg = compose_finetune(finetune_overrides(tmp_path, "model.sparse_prediction=false"))
    with pytest.raises(ConfigError, match=r"^model\.sparse_prediction=false has no effect: .*model\.arch=decoder"):
        finetune_job(cfg)


def saved(preset: str, **fields) -> dict:
    """A model node as a run's config.yaml holds it, with `fields` set as an earlier run could have set them."""
    node = OmegaConf.to_container(OmegaConf.structured(model_preset(preset, SMALL)), enum_to_str=True)
    return {**node, **fields}


SMALL = ["model.vocab_size=64", "model.dim=32", "model.n_heads=2", "model.n_layers=1"]


def test_a_saved_config_holding_such_a_value_still_loads():
    """They are refused at entry only: a checkpoint trained with one loads as it was saved, weights included (an
    encoder-decoder's model.n_segments built a segment table)."""
    for node in (saved("tiny", n_decoder_layers=3, pad_token_id=5), saved("t5", n_segments=2)):
        torch.manual_seed(0)
        weights = build_model(model_from_saved(node)).state_dict()
        again = build_model(model_from_saved(node))
        again.load_state_dict(weights)  # strict: the same parameters
    assert "embed.seg.weight" in weights


def test_cli_says_it_in_one_line(tmp_path):
    from tests.test_validation_errors import run_cli

    p = run_cli("lm.cli.train", "model=tiny", "model.n_decoder_layers=3", f"run_dir={tmp_path / 'run'}", cwd=tmp_path)
    out = p.stdout + p.stderr
    assert p.returncode == 1 and "Traceback" not in out, out
    assert out.strip() == (
        "ConfigError: model.n_decoder_layers=3 has no effect: model.arch=decoder has one stack, of model.n_layers "
        "layers; only encoder_decoder has a decoder stack; set model.n_layers, or model.arch=encoder_decoder"
    )
    assert not (tmp_path / "run").exists()
