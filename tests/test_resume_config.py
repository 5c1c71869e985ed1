"""Resuming a run with another config: fields that change the maths are refused before the checkpoint is
loaded (lm/core/resume.py), the run's files keep describing its weights; RESUMABLE fields continue."""

import logging

import pytest

from lm.config import ConfigError
from lm.core.resume import RESUMABLE, config_changes, resumable
from tests.engine_support import train_losses
from tests.test_train_single import run


@pytest.fixture(scope="module")
def gelu_run(tmp_path_factory):
    """A 4-step gelu run with its checkpoint at step 4 (copied per test: resuming writes into it)."""
    root = tmp_path_factory.mktemp("gelu")
    run(root, steps=4)
    return root


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".lock"))
    return dst


def test_another_ffn_is_refused_naming_the_field_and_the_fix(gelu_run, tmp_path):
    r = _copy(gelu_run, tmp_path / "r")
    before = (r / "config.yaml").read_text()
    with pytest.raises(ConfigError, match=r"(?s)model\.ffn\.activation: 'gelu' -> 'relu'.*run_dir=<a new"):
        run(r, steps=6, extra=["model/ffn=relu"])
    assert (r / "config.yaml").read_text() == before  # still says gelu, like the weights
    assert list(train_losses(r)) == [1, 2, 3, 4]  # nothing trained


def test_another_shape_is_refused_before_any_size_mismatch(gelu_run, tmp_path):
    r = _copy(gelu_run, tmp_path / "r")
    with pytest.raises(ConfigError) as e:
        run(r, steps=6, extra=["model.dim=32", "model.norm_position=post"])
    msg = str(e.value)
    assert "model.dim: 64 -> 32" in msg and "model.norm_position: 'pre' -> 'post'" in msg
    assert "size mismatch" not in msg


def test_a_zoo_slot_filled_or_emptied_is_refused_before_the_weights_load(gelu_run, tmp_path):
    """model.block is null in the run and an option in the command (or the reverse): the node is a key on one
    side only, which the comparison used to skip, so the resume reached load_state_dict's traceback."""
    r = _copy(gelu_run, tmp_path / "r")
    with pytest.raises(ConfigError, match=r"model\.block: None -> 'lm\.zoo\.pkm\.pkm_block'") as e:
        run(r, steps=6, extra=["model/block=pkm"])
    assert "state_dict" not in str(e.value)
    assert list(train_losses(r)) == [1, 2, 3, 4]  # nothing trained


def test_a_larger_max_steps_and_other_resumable_fields_continue(gelu_run, tmp_path, caplog):
    r = _copy(gelu_run, tmp_path / "r")
    with caplog.at_level(logging.WARNING, logger="lm"):
        _, result = run(r, steps=7, extra=["train.log_interval=1", "train.keep_last=1"])
    assert result.state.step == 7
    assert list(train_losses(r)) == list(range(1, 8))
    assert "train.max_steps: 4 -> 7" in caplog.text  # an allowed change is still written down
    assert "max_steps: 7" in (r / "config.yaml").read_text()


def test_a_run_from_before_model_linear_auto_resumes_under_the_new_default(tmp_path, caplog):
    """model.linear changes the kernel, not the products: a run that recorded torch (the default before auto)
    continues under auto."""
    run(tmp_path, steps=2, extra=["model.linear=torch"])
    with caplog.at_level(logging.WARNING, logger="lm"):
        _, result = run(tmp_path, steps=3)
    assert result.state.step == 3 and "model.linear: 'torch' -> 'auto'" in caplog.text


def test_max_steps_below_the_step_says_so(gelu_run, tmp_path):
    r = _copy(gelu_run, tmp_path / "r")
    with pytest.raises(
        ConfigError,
        match=r"train\.max_steps=2 is below the step of .*step_00000004 \(4\).*"
        r"set train\.max_steps above 4",
    ):
        run(r, steps=2)


def test_max_steps_equal_to_the_step_logs_that_the_run_is_complete(gelu_run, tmp_path, caplog):
    """A resumable field changed on a complete run trains nothing, so config.yaml keeps the settings the weights
    trained under (it recorded the new optim.lr that no step used)."""
    r = _copy(gelu_run, tmp_path / "r")
    before = (r / "config.yaml").read_text()
    with caplog.at_level(logging.WARNING, logger="lm"):
        _, result = run(r, steps=4, extra=["optim.lr=0.01"])
    assert result.state.step == 4
    assert "at step 4 = train.max_steps: the run is complete" in caplog.text
    assert "raise train.max_steps" in caplog.text
    assert "lr: 0.01" not in before and (r / "config.yaml").read_text() == before


def test_the_comparison_itself():
    saved = {
        "seed": 1,
        "model": {"dim": 64, "ffn": {"activation": "gelu"}},
        "train": {"max_steps": 4},
        "logger": {"tags": ["a"]},
        "data": {"name": "x"},
    }
    new = {
        "seed": 2,
        "model": {"dim": 64, "ffn": {"activation": "relu"}, "added_field": 1},
        "train": {"max_steps": 9},
        "logger": {"tags": ["b"]},
        "data": {"name": "x"},
    }
    refused, allowed = config_changes(saved, new)
    assert refused == ["model.ffn.activation: 'gelu' -> 'relu'", "seed: 1 -> 2"]
    assert allowed == ["logger.tags: ['a'] -> ['b']", "train.max_steps: 4 -> 9"]
    assert resumable("logger.wandb") and resumable("train.max_steps") and not resumable("train.max_steps_x")
    assert [f for f in RESUMABLE if f.startswith("model")] == ["model.linear"]  # the kernel only, not the products
    pkm = {"_target_": "lm.zoo.pkm.pkm_block", "layers": [0]}
    assert config_changes({"model": {"block": None}}, {"model": {"block": pkm}}) == (
        ["model.block: None -> 'lm.zoo.pkm.pkm_block'"],
        [],
    )
    assert config_changes({"model": {"block": pkm}}, {"model": {"block": None}})[0] == [
        "model.block: 'lm.zoo.pkm.pkm_block' -> None"
    ]
    assert config_changes({"model": {"x": None}}, {"model": {"x": {"a": 1}}})[0] == ["model.x: None -> {'a': 1}"]
    assert config_changes({"model": {}}, {"model": {"block": pkm}}) == ([], [])  # a slot added since: skipped


def test_another_zero_stage_is_resharded_not_refused():
    """zero1 -> zero3 changes memory, not the maths: allowed as zero1 -> fsdp2 -> zero3 already was; every other
    engine.config value still refused. One DeepSpeedEngine class writes each stage's own files, so a stage change
    on the same world size is an elastic resume (load_resharded), not the engine's own load_state."""
    from lm.core.checkpoint import same_layout
    from lm.core.resume import FINETUNE_RESUMABLE

    def ds(stage, bucket=5e8):
        return {"engine": {"config": {"zero_optimization": {"stage": stage, "reduce_bucket_size": bucket}}}}

    for may_change in (RESUMABLE, FINETUNE_RESUMABLE):
        assert config_changes(ds(1), ds(3), may_change) == ([], ["engine.config.zero_optimization.stage: 1 -> 3"])
        assert config_changes(ds(1), ds(1, 1e6), may_change)[0]  # another DeepSpeed option: refused
    zero1 = {"engine": "DeepSpeedEngine", "format": "deepspeed", "world_size": 2, "zero_stage": 1, "cpu_adam": False}
    assert same_layout(zero1, dict(zero1))
    assert not same_layout(zero1, {**zero1, "zero_stage": 3})
    assert not same_layout(zero1, {**zero1, "world_size": 1})
    assert same_layout(
        {"engine": "Engine", "format": "torch", "world_size": 1},
        {"engine": "Engine", "format": "torch", "world_size": 1},
    )


def _spelled_as_before_the_zoo(yaml_text: str, **model) -> str:
    """A run's config.yaml as lm wrote it before model.embedding/output, the adaptive fields and the family nodes
    moved to the zoo (lm/model/upgrade.py; 4fe193c, 2026-11-28, wrote exactly these keys)."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(OmegaConf.create(yaml_text))
    node = {k: v for k, v in cfg["model"].items() if k not in ("family", "embedding", "output")}
    node |= {"rnn": None, "electra": None, "embedding": "standard", "output": "softmax", "adaptive_cutoffs": None}
    node |= {"adaptive_div_value": 4.0, "adaptive_tail_projection": True, "adaptive_head_bias": False}
    node |= {"mos_components": 4, "factorized_embedding": 0, **model}
    return OmegaConf.to_yaml({**cfg, "model": node})


def test_a_run_saved_before_the_zoo_options_moved_resumes(gelu_run, tmp_path):
    """Its checkpoint says model.embedding: standard and model.output: softmax, which a config composed now spells
    null: compared raw, every such run was refused ("model.embedding: 'standard' -> None"). Compared as the model
    it loads as, it continues; an old choice that is not today's default is still refused, named."""
    from tests.test_checkpoint_safety import reseal

    r = _copy(gelu_run, tmp_path / "r")
    ckpt = r / "checkpoints" / "step_00000004"
    now = (ckpt / "config.yaml").read_text()
    (ckpt / "config.yaml").write_text(_spelled_as_before_the_zoo(now))
    reseal(ckpt)
    _, result = run(r, steps=6)
    assert result.state.step == 6 and list(train_losses(r)) == list(range(1, 7))

    r2 = _copy(gelu_run, tmp_path / "r2")
    ckpt = r2 / "checkpoints" / "step_00000004"
    (ckpt / "config.yaml").write_text(_spelled_as_before_the_zoo(now, output="mixture_of_softmaxes"))
    reseal(ckpt)
    with pytest.raises(ConfigError, match=r"model\.output: 'lm\.zoo\.mos\.MixtureOfSoftmaxes' -> None"):
        run(r2, steps=6)


def test_a_norm_saved_at_its_old_home_compares_as_the_zoo_option():
    """ReZero/Fixup's `_target_` moved to lm.zoo.residual: the same norm, so no refusal; another norm still is."""
    from lm.core.resume import refuse_changes

    def cfg(target):
        return f"model:\n  norm:\n    _target_: {target}\n    _partial_: true\n"

    refuse_changes(cfg("lm.model.norms.rezero_norm"), cfg("lm.zoo.residual.rezero_norm"), RESUMABLE, "resume", "x", "")
    with pytest.raises(ConfigError, match=r"model\.norm\._target_: 'lm\.zoo\.residual\.fixup_norm' -> 'lm\.zoo"):
        refuse_changes(cfg("lm.model.norms.fixup_norm"), cfg("lm.zoo.residual.rezero_norm"), RESUMABLE, "x", "x", "")
