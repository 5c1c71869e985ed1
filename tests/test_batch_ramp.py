"""The batch-size ramp (train.batch_ramp_steps, lm/core/pretrain_task.py): micro-batches per step grow from 1 to
grad_accum; the steps hold the uninterrupted run's samples after a resume mid-ramp; what cannot ramp says so."""

import pytest

from lm.config_base import ConfigError
from lm.core.config import OptimConfig, SchedConfig, TrainConfig, resolve_batch, validate_train
from lm.core.pretrain_task import LoaderSteps, ramp_accum
from lm.data.packed import PackedLoader
from lm.engine.dist import EngineError
from lm.engine.ds import ds_config
from tests.engine_support import metrics, train_losses
from tests.test_elastic import data  # noqa: F401 - the module's prepared-data fixture
from tests.test_train_single import run
from tests.token_log import sample_digests


def test_the_ramp_grows_linearly_from_one_to_grad_accum():
    assert [ramp_accum(s, 4, 8) for s in range(10)] == [1, 1, 2, 2, 3, 3, 4, 4, 4, 4]
    assert [ramp_accum(s, 3, 2) for s in range(3)] == [2, 3, 3]
    assert [ramp_accum(s, 4, 1) for s in range(2)] == [4, 4]


def steps(prepared, n, state=None, ramp=6):
    s = LoaderSteps(PackedLoader(prepared, "train", 16, 1, seed=3), 3, ramp)
    if state is not None:
        s.load_state_dict(state)
    return [sample_digests(next(s)) for _ in range(n)], s.state_dict()


def test_a_resume_mid_ramp_continues_with_the_same_samples_and_sizes(data):  # noqa: F811
    whole, _ = steps(data, 9)
    assert [len(d) for d in whole] == [1, 1, 2, 2, 3, 3, 3, 3, 3]
    first, state = steps(data, 3)
    assert state["ramp_step"] == 3 and state["samples_per_step"] == 3  # the batch after the ramp
    rest, _ = steps(data, 6, state)
    assert first + rest == whole
    assert len({d for step in whole for d in step}) == sum(len(d) for d in whole)  # no sample twice


def test_a_resume_inside_the_ramp_on_another_world_size_is_refused(data):  # noqa: F811
    """The ramp counts micro-batches per rank (2 ranks x grad_accum 3: 2, 2, 4, 4, 6, 6 sequences per step; 1 rank x
    grad_accum 6: 1, 2, 3, 4, 5, 6): an elastic resume inside it silently trained other samples per step."""
    two = LoaderSteps(PackedLoader(data, "train", 16, 1, rank=0, world_size=2, seed=3), 3, 6)
    for _ in range(2):
        next(two)
    one = LoaderSteps(PackedLoader(data, "train", 16, 1, seed=3), 6, 6)  # the same 6 sequences per step after it
    with pytest.raises(ConfigError, match=r"at step 2 of its batch ramp .* Resume on 2 rank\(s\) until step 6"):
        one.load_state_dict(two.state_dict())
    for _ in range(4):
        next(two)
    one.load_state_dict(two.state_dict())  # past the ramp: any world size that keeps the global batch
    assert one.step == 6


def test_a_ramp_on_a_state_saved_without_one_is_refused(data):  # noqa: F811
    _, state = steps(data, 2, ramp=0)
    with pytest.raises(ConfigError, match="started without a ramp: resume it with train.batch_ramp_steps=0"):
        steps(data, 1, state)


def test_what_cannot_ramp_is_refused_naming_the_fix():
    with pytest.raises(ConfigError, match=r"from 1 to train.grad_accum, which is 1: set train.grad_accum"):
        resolve_batch(TrainConfig(batch_ramp_steps=10), 1)
    assert resolve_batch(TrainConfig(batch_ramp_steps=10, micro_batch_size=2, global_batch_size=8), 2).grad_accum == 2
    with pytest.raises(ConfigError, match=r"train.batch_ramp_steps=-1 must be an integer >= 0"):
        validate_train(TrainConfig(batch_ramp_steps=-1), OptimConfig(), SchedConfig())
    with pytest.raises(EngineError, match="DeepSpeed fixes gradient_accumulation_steps.*engine=ddp"):
        ds_config(TrainConfig(grad_accum=2, batch_ramp_steps=4), 1, {})


def test_lm_train_ramps_its_tokens_and_resumes_mid_ramp_exactly(tmp_path):
    extra = ["sched=constant", "train.grad_accum=3", "train.batch_ramp_steps=4"]
    run(tmp_path / "whole", steps=6, extra=extra)
    per_micro = 4 * 32  # tiny_overrides: micro-batches of 4 x 32 tokens
    tokens = [m["tokens"] for m in metrics(tmp_path / "whole") if "loss" in m]
    assert tokens == [per_micro * n for n in (1, 3, 6, 9, 12, 15)]  # 1, 2, 3, 3, 3, 3 micro-batches
    run(tmp_path / "split", steps=2, extra=extra)
    run(tmp_path / "split", steps=6, extra=extra)
    assert train_losses(tmp_path / "split") == train_losses(tmp_path / "whole")
