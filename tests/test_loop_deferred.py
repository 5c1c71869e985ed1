"""What the loop decides at sync points instead of every step (lm/core/loop.py): the NaN/inf policy, the
preemption check every train.stop_check_interval steps, and the prefetched batches' resume position."""

import math
import os
import signal

import pytest
import torch

from lm.core.loop import LossDiverged, Preempted
from lm.core.prefetch import Prefetcher
from tests.engine_support import SyntheticLoader, train_losses
from tests.test_train_single import _nan_at, run


def test_nan_between_log_steps_stops_at_the_next_sync_point_before_the_checkpoint(tmp_path, monkeypatch):
    """Step 7's loss is NaN; the next sync point is step 8's checkpoint: the policy stops there, naming step 7,
    and step 8 is not written (the last checkpoint is step 4's)."""
    _nan_at(monkeypatch, {7})
    with pytest.raises(
        LossDiverged,
        match=r"loss is nan at step 7; no update was applied.*step_00000004 is intact"
        r".*seen at the sync point after step 8",
    ):
        run(tmp_path, steps=12, ckpt_interval=4, log_interval=5)
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_00000004"
    assert list(train_losses(tmp_path)) == [5]


@pytest.mark.parametrize("fused", ["true", "false"])
def test_skipping_on_the_device_trains_exactly_as_skipping_at_each_step(tmp_path, monkeypatch, fused):
    """on_nonfinite=skip with NaN at steps 3 and 4: logging every 6 steps (the skip decided on the device, the
    policy applied at step 6) gives the losses of logging every step, bit for bit."""
    _nan_at(monkeypatch, {3, 4})
    run(tmp_path / "every", steps=12, on_nonfinite="skip", extra=[f"optim.fused={fused}"])
    _nan_at(monkeypatch, {3, 4})
    run(tmp_path / "sixth", steps=12, on_nonfinite="skip", log_interval=6, extra=[f"optim.fused={fused}"])
    every, sixth = train_losses(tmp_path / "every"), train_losses(tmp_path / "sixth")
    assert math.isnan(every[3]) and math.isnan(every[4])
    assert sixth == {6: every[6], 12: every[12]}


def test_too_many_nonfinite_steps_in_a_row_stop_at_the_sync_point(tmp_path, monkeypatch):
    _nan_at(monkeypatch, {2, 3, 4})
    with pytest.raises(
        LossDiverged,
        match=r"loss is nan at step 4.*\(3 consecutive non-finite steps\)"
        r".*seen at the sync point after step 5",
    ):
        run(tmp_path, steps=10, on_nonfinite="skip", max_nonfinite=2, log_interval=5)


def test_a_signal_is_acted_on_at_the_next_stop_check(tmp_path, monkeypatch):
    """SIGTERM during step 5 with stop checks every 3 steps and no log step before the end: the run stops after
    step 6 with a checkpoint, and the same command then finishes with the uninterrupted run's losses."""
    from lm.core import objectives

    kw = dict(steps=8, log_interval=8, stop_check_interval=3, extra=["model.dropout=0.1"])
    run(tmp_path / "whole", **kw)
    real, calls = objectives.loss, {"n": 0}

    def loss(model, batch, *metrics):
        calls["n"] += 1
        if calls["n"] == 5 and model.training:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(model, batch, *metrics)

    monkeypatch.setattr(objectives, "loss", loss)
    with pytest.raises(Preempted, match=r"stopped after step 6 with checkpoint .*step_00000006"):
        run(tmp_path / "stopped", **kw)
    monkeypatch.setattr(objectives, "loss", real)
    run(tmp_path / "stopped", **kw)
    assert train_losses(tmp_path / "stopped") == train_losses(tmp_path / "whole")


def _walk(**kw):
    return SyntheticLoader(vocab_size=32, seq_len=8, micro_batch_size=2, **kw)


class Steps:
    """One micro-batch per step from a SyntheticLoader (the StepBatches interface)."""

    def __init__(self, loader):
        self.loader, self.it = loader, iter(loader)

    def __next__(self):
        return [next(self.it)]

    def state_dict(self):
        return self.loader.state_dict()

    def load_state_dict(self, state):
        self.loader.load_state_dict(state)
        self.it = iter(self.loader)


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_prefetcher_state_is_what_was_handed_out_not_what_was_read_ahead(depth):
    steps = Prefetcher(Steps(_walk()), torch.device("cpu"), depth)
    got = [next(steps)[0]["input_ids"] for _ in range(4)]
    assert steps.state_dict() == {"index": 4}
    assert all(torch.equal(g, _walk().batch(i)["input_ids"]) for i, g in enumerate(got))
    steps.close()  # rewinds the source to the consumed position
    assert steps.steps.state_dict() == {"index": 4}
    steps.load_state_dict({"index": 2})
    assert torch.equal(next(steps)[0]["input_ids"], _walk().batch(2)["input_ids"])
    assert steps.state_dict() == {"index": 3}
    steps.close()


def test_prefetcher_raises_the_sources_error_in_the_training_thread():
    class Broken(Steps):
        def __next__(self):
            raise ValueError("shard 3 is corrupt")

    steps = Prefetcher(Broken(_walk()), torch.device("cpu"), 2)
    with pytest.raises(ValueError, match="shard 3 is corrupt"):
        next(steps)
    steps.close()


@pytest.mark.parametrize("fused", [True, False])
def test_engine_step_leaves_weights_and_moments_alone_when_the_norm_is_nan(fused):
    from lm.core.config import TrainConfig
    from lm.engine.base import Engine
    from lm.engine.dist import Dist

    engine = Engine(TrainConfig(), Dist(0, 1, 0, torch.device("cpu")))
    engine.wrap(torch.nn.Linear(4, 3), lambda m: torch.optim.AdamW(m.parameters(), lr=0.1, fused=fused))
    engine.module(torch.randn(2, 4)).sum().backward()
    assert math.isfinite(float(engine.step()))
    before = {k: v.clone() for k, v in engine.module.state_dict().items()}
    moments = [{k: v.clone() for k, v in s.items()} for s in engine.optimizer.state.values()]
    (engine.module(torch.randn(2, 4)).sum() * math.nan).backward()
    assert math.isnan(float(engine.step()))
    assert all(torch.equal(before[k], v) for k, v in engine.module.state_dict().items())
    for saved, now in zip(moments, engine.optimizer.state.values()):
        assert all(torch.equal(saved[k], now[k]) for k in saved)  # step count, exp_avg, exp_avg_sq
    assert all(p.grad is None for p in engine.module.parameters())
