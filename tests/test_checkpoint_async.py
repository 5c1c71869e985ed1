"""train.async_checkpoint (issue 51 item 3): the loop goes on while a background thread writes the checkpoint, which
is the same checkpoint, byte for byte, as a synchronous save; a failed background write stops the run at its next
sync point (or its end) naming the intact one; a kill in the middle of a background write resumes exactly from the
previous checkpoint; DeepSpeed refuses the option in one line. Tiny model, synthetic data (tests/engine_support.py)."""

import json
import sys
import time
import types

import pytest

from lm.core.checkpoint import CheckpointError
from tests.engine_support import compose, loaders, spawn, tiny_overrides, train_losses


def run(run_dir, steps, asynchronous, **train_kw):
    from lm.cli.train import train

    cfg = compose(tiny_overrides(run_dir, steps, async_checkpoint=str(asynchronous).lower(), **train_kw))
    return train(cfg, loaders=loaders(cfg))


def manifest(ckpt):
    """The sha256 and size of each file of a checkpoint, but config.yaml (it names the run_dir and the option);
    FSDP2's dcp/.metadata as what it says of the shards (it also holds the write's path and a random save id)."""
    files = json.loads((ckpt / "manifest.json").read_text())["files"]
    out = {name: entry for name, entry in files.items() if name not in ("config.yaml", "dcp/.metadata")}
    if "dcp/.metadata" in files:
        from lm.engine.formats import _DCPMetadataUnpickler

        with open(ckpt / "dcp" / ".metadata", "rb") as f:
            meta = _DCPMetadataUnpickler(f).load()
        out["dcp/.metadata"] = (meta.state_dict_metadata, meta.planner_data, meta.storage_data)
    return out


def test_async_and_sync_runs_write_the_same_checkpoints_and_losses(tmp_path):
    run(tmp_path / "sync", 9, False, ckpt_interval=3)
    run(tmp_path / "async", 9, True, ckpt_interval=3)
    assert train_losses(tmp_path / "async") == train_losses(tmp_path / "sync")  # bit-identical
    for step in (3, 6, 9):
        name = f"checkpoints/step_{step:08d}"
        assert manifest(tmp_path / "async" / name) == manifest(tmp_path / "sync" / name), step
    assert (tmp_path / "async" / "checkpoints" / "latest").read_text() == "step_00000009"
    assert not list((tmp_path / "async" / "checkpoints").glob(".tmp-*"))


def test_cpu_copy_is_a_snapshot_with_the_original_structure():
    """Later in-place updates do not reach it; shared storages and objects stay shared; `_metadata` is kept; the
    next copy reuses the previous copy's storages."""
    import io

    import torch

    from lm.engine.staging import cpu_copy

    model = torch.nn.Sequential(torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5, bias=False))
    model[1].weight = model[0].weight  # tied
    betas = (0.9, 0.95)
    state = {"model": model.state_dict(), "groups": [{"betas": betas}, {"betas": betas}]}
    buffers = {}
    snap = cpu_copy(state, buffers)
    before = snap["model"]["0.weight"].clone()
    with torch.no_grad():
        model[0].weight.add_(1.0)
    assert torch.equal(snap["model"]["0.weight"], before)
    assert (
        snap["model"]["0.weight"].untyped_storage().data_ptr() == snap["model"]["1.weight"].untyped_storage().data_ptr()
    )
    assert snap["groups"][0]["betas"] is snap["groups"][1]["betas"]
    assert snap["model"]._metadata == state["model"]._metadata
    saved = [io.BytesIO(), io.BytesIO()]
    torch.save(state, saved[0])
    torch.save(cpu_copy(state), saved[1])
    assert saved[0].getvalue() == saved[1].getvalue()  # what torch.save writes is the same, byte for byte
    lent = {k: v.data_ptr() for k, v in buffers.items()}
    cpu_copy(model.state_dict(), buffers)
    assert {k: v.data_ptr() for k, v in buffers.items()} == lent


PARK_FIRST_WRITE = '''
import threading

parked, released, timed_out, during = threading.Event(), threading.Event(), threading.Event(), []
saves = [0]


def install(hooks):
    hooks.save_phase.append(on_save)
    hooks.step_begin.append(on_step)


def on_save(phase):
    """The first checkpoint's write stays parked (with its files written, nothing sealed) until the loop has
    begun two more steps since that save began; a synchronous save would park the loop itself (the wait times
    out). The steps count from the save's begin, not from the park: a writer thread that reaches its files only
    after the loop has run on to the next save (which waits for this write) would otherwise never be released."""
    if phase == "begin":
        saves[0] += 1
    elif phase == "files" and saves[0] == 1:
        parked.set()
        if not released.wait(30):  # the loop did not go on: the write blocked it
            timed_out.set()


def on_step(step):
    if saves[0] == 1 and not released.is_set():
        during.append(step)
        if len(during) == 2:
            released.set()
'''


def test_the_loop_trains_on_while_the_checkpoint_is_written(tmp_path, monkeypatch):
    plugin = tmp_path / "park_first_write.py"
    plugin.write_text(PARK_FIRST_WRITE)
    monkeypatch.setenv("LM_PLUGINS", str(plugin))
    run(tmp_path / "run", 9, True, ckpt_interval=3)
    park = sys.modules["lm_plugin_park_first_write"]
    assert not park.timed_out.is_set(), "the loop waited for the parked write"
    assert park.released.is_set() and len(park.during) == 2 and park.during[0] >= 3, park.during
    run(tmp_path / "sync", 9, False, ckpt_interval=3)
    assert train_losses(tmp_path / "run") == train_losses(tmp_path / "sync")


def test_a_write_held_back_while_training_moves_on_saves_its_own_steps_state(tmp_path, monkeypatch):
    """The write of step 3's checkpoint starts only after the loop has begun two more steps (whose optimizer steps
    update the parameters and Adam's moments in place): what it writes is still step 3's state, byte for byte the
    synchronous save's, since save() snapshotted it (lm/engine/staging.py) before handing the write on."""
    from lm.engine.base import Engine

    plugin = tmp_path / "hold_first_write.py"
    plugin.write_text(PARK_FIRST_WRITE)
    monkeypatch.setenv("LM_PLUGINS", str(plugin))
    monkeypatch.delitem(sys.modules, "lm_plugin_hold_first_write", raising=False)
    stage, held = Engine.stage_state, []

    def stage_late(self, path, group=None):
        write = stage(self, path, group)

        def late():
            released = sys.modules["lm_plugin_hold_first_write"].released
            held.append(released.wait(30))  # set once the loop began two steps after this save
            write()

        return late

    monkeypatch.setattr(Engine, "stage_state", stage_late)
    run(tmp_path / "async", 9, True, ckpt_interval=3)
    assert held == [True, True, True] and sys.modules["lm_plugin_hold_first_write"].during[0] >= 3
    run(tmp_path / "sync", 9, False, ckpt_interval=3)
    for step in (3, 6, 9):
        name = f"checkpoints/step_{step:08d}"
        assert manifest(tmp_path / "async" / name) == manifest(tmp_path / "sync" / name), step


SLOW_WRITE_THEN_STOP = """
import os
import signal
import time


def install(hooks):
    hooks.step_begin.append(lambda step: os.kill(os.getpid(), signal.SIGTERM) if step == 4 else None)
    hooks.save_phase.append(lambda phase: time.sleep(1.0) if phase == "manifest" else None)  # a slow disk
"""


def test_a_stop_signal_waits_for_the_write_of_its_checkpoint(tmp_path, monkeypatch):
    """SIGTERM in step 5: the loop stops after it with a checkpoint, and raises Preempted only once that checkpoint,
    written in the background (slowly), is complete and `latest`."""
    from lm.core.loop import Preempted

    plugin = tmp_path / "slow_write_then_stop.py"
    plugin.write_text(SLOW_WRITE_THEN_STOP)
    monkeypatch.setenv("LM_PLUGINS", str(plugin))
    with pytest.raises(Preempted, match="SIGTERM received: stopped after step 5 with checkpoint"):
        run(tmp_path / "run", 9, True, ckpt_interval=3)
    ckpts = tmp_path / "run" / "checkpoints"
    assert (ckpts / "latest").read_text() == "step_00000005" and (ckpts / "step_00000005" / "trainer.json").is_file()
    monkeypatch.delenv("LM_PLUGINS")
    run(tmp_path / "run", 9, True, ckpt_interval=3)
    run(tmp_path / "sync", 9, False, ckpt_interval=3)
    assert train_losses(tmp_path / "run") == train_losses(tmp_path / "sync")


@pytest.mark.parametrize("steps", [12, 6])  # the failure surfaces at the next sync point (step 7), or at the run's end
def test_a_failed_background_write_stops_the_run_naming_the_intact_checkpoint(tmp_path, monkeypatch, caplog, steps):
    """The write of step 6 fails (a full disk) and is over before the loop goes on: the run stops at the sync point
    of step 7 (log_interval=1), before logging it, not at the next save (step 9) with three more steps trained and
    no checkpoint written for them."""
    from lm.core.async_save import BackgroundWrite
    from lm.engine.base import Engine

    real, real_start, saves = Engine.stage_state, BackgroundWrite.start, {"n": 0}

    def full_disk_on_second(self, path, group=None):
        saves["n"] += 1
        write = real(self, path, group)
        if saves["n"] != 2:
            return write

        def fail():
            write()
            raise OSError(28, "No space left on device")

        return fail

    def start(self, write, name):
        real_start(self, write, name)
        if saves["n"] == 2:  # the failing write ends before the loop trains step 7
            self._thread.join()

    monkeypatch.setattr(Engine, "stage_state", full_disk_on_second)
    monkeypatch.setattr(BackgroundWrite, "start", start)
    with pytest.raises(CheckpointError) as e:
        run(tmp_path, steps, True, ckpt_interval=3)
    ckpts = tmp_path / "checkpoints"
    assert f"checkpoint {ckpts / 'step_00000006'} could not be written (No space left on device; " in str(e.value)
    assert f"the previous checkpoint {ckpts / 'step_00000003'} is intact" in str(e.value)
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_00000003"]  # no .tmp-*, no step 9
    assert (ckpts / "latest").read_text() == "step_00000003"
    assert max(train_losses(tmp_path)) == 6  # stopped at step 7's sync point, not at step 9's save
    assert any("failed in the background" in r.getMessage() for r in caplog.records)  # said at once
    monkeypatch.setattr(Engine, "stage_state", real)
    monkeypatch.setattr(BackgroundWrite, "start", real_start)
    run(tmp_path, 12, True, ckpt_interval=3)  # the same command resumes from step 3
    run(tmp_path / "sync", 12, False, ckpt_interval=3)
    assert train_losses(tmp_path) == train_losses(tmp_path / "sync")


def test_deepspeed_refuses_async_checkpoints_in_one_line():
    from lm.config import ConfigError
    from lm.core.setup import make_engine

    class FakeDeepSpeed:
        format, writes_async = "deepspeed", False

        def __init__(self, train, dist):
            pass

    cfg = types.SimpleNamespace(engine=types.SimpleNamespace(_target_="x"))
    train = types.SimpleNamespace(precision="fp32", on_nonfinite="stop", async_checkpoint=True)
    with pytest.raises(
        ConfigError,
        match=r"^train.async_checkpoint=true does not work with DeepSpeed engines .*"
        r"use train.async_checkpoint=false$",
    ):
        make_engine(cfg, lambda node: FakeDeepSpeed, train, None)


def test_checkpoints_are_asynchronous_by_default_where_the_engine_can_and_synchronous_on_deepspeed(tmp_path):
    """train.async_checkpoint unset: the background write on engines that stage their state (single, DDP, FSDP2),
    the synchronous one on DeepSpeed, which is not refused; `false` keeps every save synchronous."""
    from lm.core.config import TrainConfig
    from lm.core.session import Session
    from lm.core.setup import make_engine

    class Engine:
        is_main = True

        def __init__(self, writes_async):
            self.writes_async, self.format = writes_async, "torch" if writes_async else "deepspeed"

        def close(self):
            pass

    assert TrainConfig().async_checkpoint is None
    for writes_async in (True, False):
        made = make_engine(
            types.SimpleNamespace(engine=None),
            lambda node, w=writes_async: lambda train, dist: Engine(w),
            types.SimpleNamespace(precision="fp32", on_nonfinite="stop", async_checkpoint=None, float8=False),
            None,
        )
        for option, expected in ((None, writes_async), (False, False)):
            train = TrainConfig(async_checkpoint=option)
            with Session(train, made, None, tmp_path / f"{writes_async}{option}", "") as session:
                assert (session.checkpointer.writes is not None) is expected, (writes_async, option)


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["ddp", "fsdp2"])
def test_two_ranks_write_the_same_checkpoints_asynchronously_and_resume_exactly(engine, tmp_path):
    """DDP (rank 0's CPU copy) and FSDP2 (DCP's async_save) on 2 gloo ranks, the writes' collectives on their own
    group: the checkpoint files equal the synchronous run's, and 4 + 4 steps give the 8-step run's losses."""
    extra = ["sched=constant", f"engine={engine}"]
    spawn(2, tiny_overrides(tmp_path / "sync", 8, micro_batch_size=2, ckpt_interval=4) + extra)
    for steps in (4, 8):
        spawn(
            2,
            tiny_overrides(tmp_path / "async", steps, micro_batch_size=2, ckpt_interval=4, async_checkpoint="true")
            + extra,
        )
    assert train_losses(tmp_path / "async") == train_losses(tmp_path / "sync")
    for step in (4, 8):
        name = f"checkpoints/step_{step:08d}"
        assert manifest(tmp_path / "async" / name) == manifest(tmp_path / "sync" / name), step


def test_a_divergence_while_a_checkpoint_is_written_names_that_checkpoint(tmp_path, monkeypatch):
    """NaN loss at step 4 while step 3's checkpoint is still written in the background (a slow disk): the loop
    waits for that write, then names it as the last good checkpoint (it named none: `latest` was not yet set)."""
    from lm.core import objectives
    from lm.core.loop import LossDiverged
    from lm.engine.base import Engine

    stage, real_loss, calls = Engine.stage_state, objectives.loss, {"n": 0}

    def slow_stage(self, path, group=None):
        write = stage(self, path, group)

        def slow():
            time.sleep(1.0)  # step 4 is trained, and found NaN, long before this write ends
            write()

        return slow

    def nan_at_step_4(model, batch, *metrics):
        calls["n"] += 1
        out = real_loss(model, batch, *metrics)
        return out * float("nan") if calls["n"] == 4 and model.training else out

    monkeypatch.setattr(Engine, "stage_state", slow_stage)
    monkeypatch.setattr(objectives, "loss", nan_at_step_4)
    with pytest.raises(LossDiverged) as e:
        run(tmp_path, 9, True, ckpt_interval=3)
    ckpt = tmp_path / "checkpoints" / "step_00000003"
    assert str(e.value) == (
        f"loss is nan at step 4; no update was applied and the last good checkpoint {ckpt} is intact. "
        "Lower optim.lr, lengthen sched.warmup_steps, or set train.on_nonfinite=skip"
    )


def test_a_divergence_while_a_checkpoint_write_fails_stays_the_error(tmp_path, monkeypatch, caplog):
    """NaN loss at step 4 while step 3's background write is failing: the loop's wait for that write logs the write's
    error and the divergence is raised, naming no checkpoint (none was written), not the write's OSError."""
    from lm.core import objectives
    from lm.core.loop import LossDiverged
    from lm.engine.base import Engine

    real_loss, calls = objectives.loss, {"n": 0}

    def failing_stage(self, path, group=None):
        def fail():
            time.sleep(1.0)  # step 4 is trained, and found NaN, while this write is still in flight
            raise OSError(28, "No space left on device")

        return fail

    def nan_at_step_4(model, batch, *metrics):
        calls["n"] += 1
        out = real_loss(model, batch, *metrics)
        return out * float("nan") if calls["n"] == 4 and model.training else out

    monkeypatch.setattr(Engine, "stage_state", failing_stage)
    monkeypatch.setattr(objectives, "loss", nan_at_step_4)
    with caplog.at_level("ERROR", logger="lm"), pytest.raises(LossDiverged) as e:
        run(tmp_path, 9, True, ckpt_interval=3)
    assert str(e.value) == (
        "loss is nan at step 4; no update was applied. "
        "Lower optim.lr, lengthen sched.warmup_steps, or set train.on_nonfinite=skip"
    )
    ckpt = tmp_path / "checkpoints" / "step_00000003"
    assert f"the checkpoint write in flight failed: checkpoint {ckpt} could not be written (No space" in caplog.text
