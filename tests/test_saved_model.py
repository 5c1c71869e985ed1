"""lm/core/saved_model.py: a run directory, a checkpoint or an lm export directory, resolved once for
lm finetune's init= and lm attention, each refusing a wrong path in its own words."""

import json

import pytest
import torch
from safetensors.torch import save_file

from lm.core.checkpoint import CheckpointError
from lm.core.saved_model import find_saved_model

MODEL = {"arch": "decoder", "dim": 32, "norm": {"_target_": "lm.model.norms.RMSNorm"}}


def _export(where, with_config=True):
    where.mkdir(parents=True)
    save_file({"w": torch.arange(6.0).view(2, 3)}, str(where / "model.safetensors"))
    if with_config:
        (where / "config.json").write_text(json.dumps({**MODEL, "_lm_class": "DecoderLM"}))
    return where


def _checkpoint(run):
    step = run / "checkpoints" / "step_00000010"
    step.mkdir(parents=True)
    (step / "trainer.json").write_text("{}")
    (step / "config.yaml").write_text("seed: 3\nmodel:\n  arch: decoder\n  dim: 32\n")
    (run / "checkpoints" / "latest").write_text("step_00000010\n")
    return step


def test_an_export_gives_its_config_without_the_marker_and_its_weights(tmp_path):
    saved = find_saved_model(_export(tmp_path / "export"))
    assert saved.export and saved.path == tmp_path / "export"
    assert saved.model_node() == MODEL
    assert saved.run_config() is None  # not under a checkpoint: no pretraining config
    assert torch.equal(saved.state_dict()["w"], torch.arange(6.0).view(2, 3))


def test_an_export_under_its_checkpoint_reads_the_run_config(tmp_path):
    step = _checkpoint(tmp_path / "run")
    saved = find_saved_model(_export(step / "export"))
    assert saved.export and saved.run_config()["seed"] == 3


def test_a_run_directory_resolves_to_its_latest_checkpoint(tmp_path):
    step = _checkpoint(tmp_path / "run")
    for path in (tmp_path / "run", step):
        saved = find_saved_model(path)
        assert not saved.export and saved.path == step
        assert saved.model_node() == {"arch": "decoder", "dim": 32}
        assert saved.run_config()["seed"] == 3


def test_missing_and_neither_kind_are_refused(tmp_path):
    with pytest.raises(FileNotFoundError):
        find_saved_model(tmp_path / "nowhere")
    half = _export(tmp_path / "half", with_config=False)  # weights without config.json: not an export
    with pytest.raises(CheckpointError, match="is neither a run directory"):
        find_saved_model(half)


def test_each_caller_keeps_its_own_messages(tmp_path):
    from lm.glue.init import InitError, load_backbone
    from lm.report.attention_maps import AttentionMapError, saved_model_config

    nowhere, empty = tmp_path / "nowhere", tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(
        InitError, match=rf"^init={nowhere}: no such directory; .*an lm export directory, or init=none$"
    ):
        load_backbone(str(nowhere))
    with pytest.raises(InitError, match=rf"^init={empty}: {empty} is neither .*; or an lm export directory \("):
        load_backbone(str(empty))
    with pytest.raises(AttentionMapError, match=rf"^{nowhere}: no such directory; .*, or an lm export directory$"):
        saved_model_config(nowhere)
    with pytest.raises(AttentionMapError, match=rf"^{empty}: {empty} is neither .*; or pass an lm export directory \("):
        saved_model_config(empty)


def test_a_hugging_face_directory_is_refused_in_one_line_naming_its_model_type(tmp_path):
    # save_pretrained writes config.json + model.safetensors, an lm export's two files: lm finetune init=<it> read
    # GPT-2's config.json as our model config and failed on one of its keys not being a ModelSchema field
    transformers = pytest.importorskip("transformers")
    from lm.glue.init import load_backbone

    hf = tmp_path / "gpt2"
    transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=2)
    ).save_pretrained(hf)
    with pytest.raises(CheckpointError) as e:
        load_backbone(str(hf), tokenizer=None)
    assert str(e.value) == (
        f"{hf} is a Hugging Face model directory (config.json: model_type='gpt2'), not an lm export; lm reads a "
        f"Hugging Face model through lm.model.convert.from_hf in Python (docs/convert.md)"
    )
    old = tmp_path / "old_export"  # an export written before lm export marked its config.json still loads
    old.mkdir()
    save_file({"w": torch.zeros(1)}, str(old / "model.safetensors"))
    (old / "config.json").write_text(json.dumps(MODEL))
    assert find_saved_model(old).model_node() == MODEL
