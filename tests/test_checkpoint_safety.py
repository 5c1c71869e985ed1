"""Run directories that stay trustworthy: one writer at a time, a full disk leaves no half-written
checkpoint behind, and a checkpoint's pickles cannot run code (issue 22 items 2, 3, 7).

In-process lm train on the synthetic loader of engine_support, tiny model.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from lm.cli.train import train
from lm.core.checkpoint import CheckpointError, consolidated_state_dict, resolve
from lm.core.lock import LOCK_NAME, RunDirLocked, acquire, holder, release
from tests.engine_support import REPO, compose, loaders, subprocess_env, tiny_overrides, train_losses


def run(run_dir, steps=4, extra=(), **train_kw):
    cfg = compose(tiny_overrides(run_dir, steps, **train_kw) + list(extra))
    return train(cfg, loaders=loaders(cfg))


def python(code: str, **popen):
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=subprocess_env(),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


# -- item 2: one writer per run_dir ------------------------------------------------------------------

HOLD = """
    import sys, time
    from lm.core.lock import acquire
    acquire(sys.argv[1])
    print("holding", flush=True)
    time.sleep(120)
"""


def test_second_run_on_a_held_run_dir_refuses_naming_the_holder(tmp_path):
    tmp_path.mkdir(exist_ok=True)
    first = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(HOLD), str(tmp_path)],
        env=subprocess_env(),
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert first.stdout.readline().strip() == "holding"
        with pytest.raises(
            RunDirLocked,
            match=rf"in use by another run \(pid {first.pid} on "
            rf"{socket.gethostname()}, started 20\d\d-.*-c",
        ) as e:
            run(tmp_path)
        assert "wait for it to finish, stop it, or pick another run_dir" in str(e.value)
        assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "checkpoints").exists()
    finally:
        first.kill()
        first.wait()
    # the holder is dead (SIGKILL): the kernel dropped its flock, its lock file does not block
    assert holder(tmp_path)["pid"] == first.pid
    result = run(tmp_path, steps=2)
    assert result.state.step == 2 and holder(tmp_path)["pid"] == os.getpid()
    release(tmp_path)


def test_a_lock_file_left_by_a_dead_process_does_not_block(tmp_path):
    (tmp_path / LOCK_NAME).write_text(
        json.dumps(
            {
                "pid": 999999999,
                "host": socket.gethostname(),
                "start": "2026-01-01T00:00:00+00:00",
                "command": "lm train",
            }
        )
        + "\n"
    )
    run(tmp_path, steps=2)
    assert holder(tmp_path)["pid"] == os.getpid()
    acquire(tmp_path)  # the run released it on return; hold it again, as a long run would
    # and another process is refused while this one holds it, told who holds it
    second = python(f"""
        from lm.core.lock import acquire
        acquire({str(tmp_path)!r})
    """)
    _, err = second.communicate(timeout=60)
    assert second.returncode != 0 and f"pid {os.getpid()} on {socket.gethostname()}" in err, err
    release(tmp_path)
    second = python(f"""
        from lm.core.lock import acquire
        acquire({str(tmp_path)!r})
    """)
    assert second.wait(timeout=60) == 0  # released: free again


def _free(run_dir) -> bool:
    """Whether another open file could lock run_dir now (flock locks belong to the open file, so this
    sees a lock this same process still holds)."""
    import fcntl

    with open(run_dir / LOCK_NAME, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(f, fcntl.LOCK_UN)
        return True


def test_a_run_releases_its_run_dir_when_it_returns_or_raises(tmp_path):
    """One process may run jobs in turn (lm transfer's arms; curve points sharing one scratch arm):
    a finished or failed job must not keep refusing other processes until this one exits."""
    from lm.core.lock import held_run_dir

    run(tmp_path / "a", steps=2)
    assert holder(tmp_path / "a")["pid"] == os.getpid() and _free(tmp_path / "a")
    (tmp_path / "b").mkdir()
    with pytest.raises(RuntimeError, match="boom"), held_run_dir(tmp_path / "b"):
        assert not _free(tmp_path / "b")
        raise RuntimeError("boom")
    assert _free(tmp_path / "b")


def test_a_job_refused_in_a_run_dir_it_made_leaves_no_directory_behind(tmp_path):
    """Refused after the lock (data prepared with other settings, ...): the new run_dir held only .lock. A run_dir
    that was there, or one the job wrote into, stays."""
    from lm.core.lock import held_run_dir

    with pytest.raises(RuntimeError), held_run_dir(tmp_path / "new" / "run"):
        raise RuntimeError("refused")
    assert not (tmp_path / "new" / "run").exists()
    with pytest.raises(RuntimeError), held_run_dir(tmp_path / "wrote"):
        (tmp_path / "wrote" / "config.yaml").write_text("x")
        raise RuntimeError("failed later")
    assert (tmp_path / "wrote" / "config.yaml").is_file()
    (tmp_path / "old").mkdir()
    with pytest.raises(RuntimeError), held_run_dir(tmp_path / "old"):
        raise RuntimeError("refused")
    assert (tmp_path / "old").is_dir()


class Refused(Exception):
    pass


def test_a_job_locking_as_a_refused_one_clears_its_new_run_dir_keeps_a_run_dir_and_the_lock(tmp_path, monkeypatch):
    """Job A is refused in the run_dir it made and clears it as it lets go; job B opened the lock file just before
    (locking is two steps: open, then flock) and gets the lock once A lets go. B must then hold the lock file at
    the path, in a run_dir that exists, not the unlinked file of the directory A removed. The interleaving: A's
    exit runs inside B's open (B is another process: A's entry in `_held` is out of its sight meanwhile)."""
    from lm.core import lock

    run_dir = tmp_path / "new" / "run"
    a = lock.held_run_dir(run_dir)
    a.__enter__()
    a_file = lock._held.pop(run_dir.resolve())
    open_lock_file, opened = lock._open_lock_file, []

    def b_opens(path):
        f = open_lock_file(path)
        opened.append(path)
        if len(opened) == 1:  # B holds A's file open; now A is refused
            lock._held[run_dir.resolve()] = a_file
            a.__exit__(Refused, Refused("refused"), None)
        return f

    monkeypatch.setattr(lock, "_open_lock_file", b_opens)
    with lock.held_run_dir(run_dir):
        assert run_dir.is_dir() and holder(run_dir)["pid"] == os.getpid()
        assert not _free(run_dir)  # the lock B holds is the file at run_dir/.lock
    assert len(opened) == 2  # B locked A's unlinked file first, saw it was not the one at the path, and tried again


def test_the_same_process_may_lock_its_run_dir_again(tmp_path):
    assert acquire(tmp_path) == acquire(tmp_path) == tmp_path.resolve() / LOCK_NAME
    release(tmp_path)


def test_a_lock_file_planted_as_a_symlink_is_refused_and_its_target_left_alone(tmp_path):
    """Issue 49 item 6: `<run_dir>/.lock -> victim.txt` made lm train truncate and overwrite victim.txt."""
    from lm.core.lock import RunDirUnwritable

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / LOCK_NAME).symlink_to(victim)
    with pytest.raises(
        RunDirUnwritable,
        match=rf"the lock file {tmp_path / 'run' / LOCK_NAME} is a symbolic link; "
        rf"lm never writes through it. Remove it \(rm ",
    ):
        run(tmp_path / "run", steps=2)
    assert victim.read_text() == "precious\n" and (tmp_path / "run" / LOCK_NAME).is_symlink()
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [LOCK_NAME]  # nothing written


def test_a_lock_path_that_is_not_a_regular_file_is_refused(tmp_path):
    from lm.core.lock import RunDirUnwritable, lock_run_dir

    os.mkfifo(tmp_path / LOCK_NAME)  # opening a FIFO for writing could block
    with pytest.raises(RunDirUnwritable, match=r"\.lock is not a regular file; lm never writes through it"):
        lock_run_dir(tmp_path)
    (tmp_path / LOCK_NAME).unlink()
    lock_run_dir(tmp_path)  # a plain file again: locked
    assert holder(tmp_path)["pid"] == os.getpid()
    release(tmp_path)


# -- item 3: a full disk -------------------------------------------------------------------------------


def test_torch_save_failing_mid_write_removes_the_partial_checkpoint(tmp_path, monkeypatch):
    """torch.save reports ENOSPC as RuntimeError ('unexpected pos'), not OSError: the half-written
    .tmp-step_* must go all the same, `latest` still names the previous checkpoint, the run resumes. The
    synchronous writer (the background one's failures: tests/test_checkpoint_async.py)."""
    from lm.engine.base import Engine

    real, saves = Engine.save_state, {"n": 0}

    def full_disk(self, path):
        saves["n"] += 1
        if saves["n"] == 2:
            (path / "model_optim.pt").write_bytes(b"PK\x03\x04 half")  # what torch.save leaves behind
            raise RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 1344 vs 1232")
        real(self, path)

    monkeypatch.setattr(Engine, "save_state", full_disk)
    with pytest.raises(CheckpointError) as e:
        run(tmp_path, steps=9, ckpt_interval=3, async_checkpoint="false")
    message = str(e.value)
    assert f"checkpoint {tmp_path / 'checkpoints' / 'step_00000006'} could not be written" in message
    assert "unexpected pos" in message and " MiB free under " in message
    assert "step_00000003 is intact" in message and "run the same command again" in message
    ckpts = tmp_path / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_00000003"]  # no .tmp-step_00000006
    assert (ckpts / "latest").read_text() == "step_00000003"
    monkeypatch.setattr(Engine, "save_state", real)
    assert run(tmp_path, steps=9, ckpt_interval=3, async_checkpoint="false").state.step == 9
    assert list(train_losses(tmp_path)) == list(range(1, 10))


def test_rank_state_failing_to_write_is_cleaned_up_too(tmp_path, monkeypatch):
    from lm.core import checkpoint

    real, calls = torch.save, {"n": 0}

    def save(obj, f, *a, **kw):
        calls["n"] += 1
        if str(f).endswith("rank00000.pt"):
            raise RuntimeError("unexpected pos 64 vs 0")
        return real(obj, f, *a, **kw)

    monkeypatch.setattr(checkpoint.torch, "save", save)
    with pytest.raises(CheckpointError, match="no earlier checkpoint exists"):
        run(tmp_path, steps=2, ckpt_interval=1)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == []


@pytest.mark.parametrize("asynchronous", ["true", "false"])
def test_a_kill_in_keep_lasts_deletion_leaves_nothing_for_good(tmp_path, monkeypatch, asynchronous):
    """keep_last's deletion cut short (a kill mid-rmtree, modelled as an rmtree that removes trainer.json, then the
    process went on: its memory plays no part in the resume) used to leave step_00000004 without its trainer.json:
    no longer a checkpoint, so never pruned again, its model and optimizer files kept on disk for good."""
    import shutil

    from lm.core import checkpoint

    real = shutil.rmtree

    def killed_midway(path, *a, **kw):
        if (Path(path) / "trainer.json").is_file():
            (Path(path) / "trainer.json").unlink()  # the first file gone, then the kill
            return
        real(path, *a, **kw)

    monkeypatch.setattr(checkpoint.shutil, "rmtree", killed_midway)
    run(tmp_path, steps=8, ckpt_interval=4, keep_last=1, async_checkpoint=asynchronous)
    monkeypatch.setattr(checkpoint.shutil, "rmtree", real)
    ckpts = tmp_path / "checkpoints"
    assert not (ckpts / "step_00000004").exists()  # step_00000004 is no step_* directory, whole or half deleted
    assert run(tmp_path, steps=12, ckpt_interval=4, keep_last=1, async_checkpoint=asynchronous).state.step == 12
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_00000012"]  # the debris went with the save
    assert list(train_losses(tmp_path)) == list(range(1, 13))


# -- item 7: no pickled code ---------------------------------------------------------------------------


class Payload:
    """Unpickling this would create a file: what a malicious checkpoint would do instead."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


def reseal(ckpt):
    """Rewrite manifest.json and trainer.json's sha256 of it: what the author of a crafted checkpoint does."""
    from lm.core.checkpoint import _write_manifest

    trainer = json.loads((ckpt / "trainer.json").read_text())
    (ckpt / "trainer.json").write_text(json.dumps({**trainer, "manifest_sha256": _write_manifest(ckpt)}))


def test_a_crafted_pickle_in_a_checkpoint_is_refused(tmp_path):
    run(tmp_path / "run", steps=2, ckpt_interval=2)
    ckpt = resolve(tmp_path / "run")
    marker = tmp_path / "pwned"

    good = torch.load(ckpt / "rank00000.pt", weights_only=True)  # the real file loads with weights_only
    assert isinstance(good["rng"]["numpy"]["key"], torch.Tensor)
    torch.save({**good, "extra": Payload(str(marker))}, ckpt / "rank00000.pt")
    reseal(ckpt)
    with pytest.raises(CheckpointError, match=r"rank00000.pt holds pickled objects .* refuses to load"):
        run(tmp_path / "run", steps=4, ckpt_interval=2)
    assert not marker.exists()

    state = torch.load(ckpt / "model_optim.pt", weights_only=True)
    torch.save({**state, "extra": Payload(str(marker))}, ckpt / "model_optim.pt")
    reseal(ckpt)
    with pytest.raises(CheckpointError, match=r"step_00000002 \(Engine's files\) holds pickled objects"):
        consolidated_state_dict(ckpt)  # what lm export and lm finetune init= read
    assert not marker.exists()


def test_rank_state_of_an_older_checkpoint_still_resumes(tmp_path):
    """Rank files written before the RNG state became tensors (and before checksums) hold numpy's
    tuple: still accepted."""
    import numpy as np

    constant = ["sched=constant", "model.dropout=0.1"]  # dropout: the restored RNG state matters
    run(tmp_path, steps=2, extra=constant, ckpt_interval=2)
    path = resolve(tmp_path) / "rank00000.pt"
    state = torch.load(path, weights_only=True)
    n = state["rng"]["numpy"]
    state["rng"]["numpy"] = (
        n["kind"],
        n["key"].numpy().astype(np.uint32),
        n["pos"],
        n["has_gauss"],
        n["cached_gaussian"],
    )
    torch.save(state, path)
    trainer = json.loads((path.parent / "trainer.json").read_text())
    del trainer["manifest_sha256"]
    (path.parent / "trainer.json").write_text(json.dumps(trainer))
    (path.parent / "manifest.json").unlink()
    run(tmp_path / "whole", steps=4, extra=constant)
    assert run(tmp_path, steps=4, extra=constant).state.step == 4
    assert train_losses(tmp_path) == train_losses(tmp_path / "whole")


# -- item 6: checksums ---------------------------------------------------------------------------------


def flip_bytes(path, n=100):
    data = bytearray(path.read_bytes())
    for i in range(n):
        data[len(data) // 2 + i] ^= 0x10  # inside the tensor data: the zip container still opens
    path.write_bytes(bytes(data))


def test_a_damaged_latest_is_named_and_the_run_resumes_from_the_newest_intact_one(tmp_path, caplog):
    constant = ["sched=constant", "model.dropout=0.1"]
    run(tmp_path / "whole", steps=10, extra=constant, ckpt_interval=4)
    run(tmp_path / "run", steps=8, extra=constant, ckpt_interval=4)
    ckpts = tmp_path / "run" / "checkpoints"
    manifest = json.loads((ckpts / "step_00000008" / "manifest.json").read_text())["files"]
    assert set(manifest) == {"config.yaml", "model_optim.pt", "rank00000.pt"}
    flip_bytes(ckpts / "step_00000008" / "model_optim.pt")
    with caplog.at_level("WARNING", logger="lm"):
        assert run(tmp_path / "run", steps=10, extra=constant, ckpt_interval=4).state.step == 10
    assert (
        f"checkpoint {ckpts / 'step_00000008'} is damaged (model_optim.pt does not match the sha256 written with it"
        in caplog.text
        and f"resuming from {ckpts / 'step_00000004'}" in caplog.text
    ), caplog.text
    assert train_losses(tmp_path / "run") == train_losses(tmp_path / "whole")  # steps 5-8 redone exactly


def test_no_intact_checkpoint_refuses_with_the_options(tmp_path):
    run(tmp_path, steps=2, ckpt_interval=2)
    (resolve(tmp_path) / "rank00000.pt").unlink()
    with pytest.raises(
        CheckpointError,
        match=r"step_00000002 is damaged \(rank00000.pt is missing\) and no older "
        r"checkpoint .* is intact. Options: restore",
    ):
        run(tmp_path, steps=4, ckpt_interval=2)


@pytest.mark.parametrize(
    "damage, reason",
    [
        ("truncate", r"model_optim.pt has \d+ bytes, \d+ when written"),
        ("flip", "model_optim.pt does not match the sha256"),
        ("trainer", r"trainer.json cannot be read"),
    ],
)
def test_export_and_finetune_init_refuse_a_damaged_checkpoint(tmp_path, damage, reason):
    run(tmp_path, steps=4, ckpt_interval=2)
    ckpt = resolve(tmp_path)
    if damage == "truncate":
        data = (ckpt / "model_optim.pt").read_bytes()
        (ckpt / "model_optim.pt").write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        flip_bytes(ckpt / "model_optim.pt")
    else:
        (ckpt / "trainer.json").write_text('{"step": 4, "eng')
    with pytest.raises(
        CheckpointError,
        match=rf"step_00000004 is damaged: {reason}.*Intact checkpoints of this "
        rf"run: step_00000002 \(pass one of them\)",
    ):
        consolidated_state_dict(ckpt)  # what lm export and lm finetune init= read
    assert consolidated_state_dict(ckpt.parent / "step_00000002")


def fake_fsdp2_checkpoint(ckpt, metadata=None):
    """An FSDP2-format checkpoint written by DCP in one process (no process group needed)."""
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    dcp.save({"model": model.state_dict()}, checkpoint_id=ckpt / "dcp", no_dist=True)
    (ckpt / "trainer.json").write_text(
        json.dumps({"step": 1, "engine": {"engine": "FSDP2Engine", "format": "dcp", "world_size": 2}})
    )
    if metadata is not None:
        (ckpt / "dcp" / ".metadata").write_bytes(metadata)
    return model


def test_dcp_metadata_is_read_without_running_pickled_code(tmp_path):
    """torch.distributed.checkpoint unpickles its .metadata with plain pickle: lm checks it first."""
    import pickle

    model = fake_fsdp2_checkpoint(tmp_path / "good")
    assert torch.equal(consolidated_state_dict(tmp_path / "good")["weight"], model.weight)
    marker = tmp_path / "pwned"
    fake_fsdp2_checkpoint(tmp_path / "bad", metadata=pickle.dumps(Payload(str(marker))))
    with pytest.raises(
        CheckpointError,
        match=r"bad \(FSDP2Engine's files\) holds pickled objects .*could run "
        r"code: Unsupported global: (io|builtins).open",
    ):
        consolidated_state_dict(tmp_path / "bad")
    assert not marker.exists()


def test_task_state_with_numpy_values_is_stored_as_plain_types(tmp_path):
    """A task's state (GLUE: metric history with numpy floats) must load back with weights_only=True."""
    import numpy as np

    from lm.core.rng import plain_state as _plain

    state = {"history": [{"acc": np.float32(0.75)}], "best": (np.int64(3), np.arange(3)), "step": 5}
    path = tmp_path / "rank.pt"
    torch.save(_plain(state), path)
    back = torch.load(path, weights_only=True)
    assert back["history"] == [{"acc": 0.75}] and back["step"] == 5 and back["best"][0] == 3
    assert torch.equal(back["best"][1], torch.arange(3))


# -- issue 49 items 1, 2, 8: the checkpoint resumed is the one checked, found by scanning if need be ------


def _sealed(ckpts):
    """Every file of every checkpoint, as bytes (trainer.json holds its write time: a rewrite shows)."""
    return {str(f.relative_to(ckpts)): f.read_bytes() for f in sorted(ckpts.rglob("*")) if f.is_file()}


@pytest.mark.parametrize(
    "damage, change, field",
    [
        ("truncate manifest.json", "model/ffn=relu", r"model\.ffn\.activation: 'gelu' -> 'relu'"),
        ("flip config.yaml", "model/norm=rmsnorm", r"model\.norm\._target_: 'lm\.model\.norms\.LayerNorm' -> "),
    ],
)
def test_a_damaged_latest_checks_the_config_of_the_checkpoint_actually_loaded(tmp_path, damage, change, field):
    """Resuming falls back from a damaged step 8 to step 4: step 4's config is the one compared, so a changed
    model is refused (it trained on with relu, or ended in a state_dict traceback, when step 8's was skipped)."""
    from lm.config import ConfigError

    run(tmp_path, steps=8, ckpt_interval=4)
    ckpt = tmp_path / "checkpoints" / "step_00000008"
    if damage.startswith("truncate"):
        os.truncate(ckpt / "manifest.json", 10)
    else:
        data = bytearray((ckpt / "config.yaml").read_bytes())
        data[5] ^= 1
        (ckpt / "config.yaml").write_bytes(bytes(data))
    losses = train_losses(tmp_path)
    with pytest.raises(
        ConfigError,
        match=rf"(?s)cannot resume {tmp_path / 'checkpoints' / 'step_00000004'} with a "
        rf"different config.*{field}",
    ):
        run(tmp_path, steps=10, ckpt_interval=4, extra=[change])
    assert train_losses(tmp_path) == losses  # nothing trained


def test_a_deleted_latest_resumes_from_the_newest_intact_checkpoint(tmp_path, caplog):
    constant = ["sched=constant", "model.dropout=0.1"]
    run(tmp_path / "whole", steps=10, extra=constant, ckpt_interval=4)
    run(tmp_path / "run", steps=8, extra=constant, ckpt_interval=4, keep_last=3)
    ckpts = tmp_path / "run" / "checkpoints"
    (ckpts / "latest").unlink()
    before = _sealed(ckpts)
    with caplog.at_level("WARNING", logger="lm"):
        assert run(tmp_path / "run", steps=10, extra=constant, ckpt_interval=4, keep_last=3).state.step == 10
    assert f"{ckpts / 'latest'} is missing; resuming from {ckpts / 'step_00000008'}" in caplog.text, caplog.text
    assert train_losses(tmp_path / "run") == train_losses(tmp_path / "whole")  # steps 1-8 kept, 9-10 exact
    after = _sealed(ckpts)
    assert {k: v for k, v in after.items() if k in before} == before  # steps 4 and 8 neither pruned nor rewritten
    assert (ckpts / "latest").read_text() == "step_00000010"


def test_a_deleted_latest_with_no_intact_checkpoint_refuses_and_keeps_everything(tmp_path):
    run(tmp_path, steps=4, ckpt_interval=2)
    ckpts = tmp_path / "checkpoints"
    (ckpts / "latest").unlink()
    for step in ("step_00000002", "step_00000004"):
        (ckpts / step / "rank00000.pt").unlink()
    before, metrics_before = _sealed(ckpts), (tmp_path / "metrics.jsonl").read_bytes()
    with pytest.raises(
        CheckpointError,
        match=rf"{ckpts / 'latest'} is missing and no checkpoint in {ckpts} is "
        rf"intact. Options: restore",
    ):
        run(tmp_path, steps=6, ckpt_interval=2)
    assert _sealed(ckpts) == before and (tmp_path / "metrics.jsonl").read_bytes() == metrics_before


@pytest.mark.parametrize(
    "pointer",
    [
        "../../other/checkpoints/step_00000004",
        "{other}/checkpoints/step_00000004",
        "step_00000009",
        "step_00000004/../step_00000002",
    ],
)
def test_latest_must_name_a_checkpoint_directory_of_this_run(tmp_path, caplog, pointer):
    """`latest` naming another run's checkpoint (by a relative or absolute path, or through a step_* symlink)
    is damaged: this run resumes from its own newest intact checkpoint, never from the other run's."""
    constant = ["sched=constant"]
    run(tmp_path / "other", steps=4, extra=[*constant, "seed=7"], ckpt_interval=2)
    run(tmp_path / "whole", steps=6, extra=constant, ckpt_interval=2)
    run(tmp_path / "run", steps=4, extra=constant, ckpt_interval=2)
    ckpts = tmp_path / "run" / "checkpoints"
    (ckpts / "step_00000009").symlink_to(tmp_path / "other" / "checkpoints" / "step_00000004")
    (ckpts / "latest").write_text(pointer.format(other=tmp_path / "other"))
    with caplog.at_level("WARNING", logger="lm"):
        run(tmp_path / "run", steps=6, extra=constant, ckpt_interval=2)
    assert (
        f"{ckpts / 'latest'} names {pointer.format(other=tmp_path / 'other')!r}, which is not a step_NNNNNNNN "
        f"directory in {ckpts} (treated as damaged); resuming from {ckpts / 'step_00000004'}"
    ) in caplog.text
    assert train_losses(tmp_path / "run") == train_losses(tmp_path / "whole")
    (ckpts / "latest").write_text(pointer.format(other=tmp_path / "other"))
    with pytest.raises(CheckpointError, match="which is not a step_NNNNNNNN directory"):
        resolve(tmp_path / "run")  # lm export and lm finetune init= refuse it too


def test_atomic_writes_get_the_mode_open_would_give_or_keep_the_replaced_files():
    """results.json, config.yaml, report pages: readable by others as any file the user writes (mkstemp's 0600
    was not); a file replaced keeps the mode it had."""
    import stat
    import tempfile
    from pathlib import Path

    from lm.core.files import atomic_write_text

    old = os.umask(0o022)
    try:
        with tempfile.TemporaryDirectory() as d:
            new = atomic_write_text(Path(d) / "results.json", "{}\n")
            assert stat.S_IMODE(new.stat().st_mode) == 0o644 and new.read_text() == "{}\n"
            new.chmod(0o600)
            atomic_write_text(new, "[]\n")
            assert stat.S_IMODE(new.stat().st_mode) == 0o600 and new.read_text() == "[]\n"
            assert [p.name for p in Path(d).iterdir()] == ["results.json"]  # no temporary left
    finally:
        os.umask(old)
