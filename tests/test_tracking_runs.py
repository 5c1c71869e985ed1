"""What the dashboards (offline wandb, TensorBoard) record of an lm train run across starts over, failures and
sweeps: each run is one wandb run of its own, a failed run is not marked finished, a sweep's cells are grouped.

In-process runs on the synthetic loader of tests/engine_support.py; wandb offline (no network)."""

import os
import shutil
import struct
import subprocess
import sys

import pytest

from lm.cli.train import train
from lm.core.loop import LossDiverged
from tests.engine_support import compose, loaders, metrics, tiny_overrides

OFFLINE = ["logger=all", "logger.mode=offline"]


def run(run_dir, steps, extra=()):
    cfg = compose(tiny_overrides(run_dir, steps) + OFFLINE + list(extra))
    return train(cfg, loaders=loaders(cfg))


def tensorboard_steps(log_dir, tag="loss") -> list[int]:
    """The steps TensorBoard draws for `tag` (a restarted run's purged steps left out)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return [e.step for e in acc.Scalars(tag)]


def wandb_records(run_dir) -> list:
    """Every record of the run's offline wandb files (the service process is stopped first: that flushes them)."""
    import wandb
    from wandb.proto import wandb_internal_pb2 as pb

    wandb.teardown()
    out = []
    for path in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        for data in _log_records(path.read_bytes()):
            record = pb.Record()
            record.ParseFromString(data)
            out.append(record)
    return out


def _log_records(data: bytes, block: int = 32768):
    """The payloads of a .wandb file: a 7-byte header, then LevelDB's log format (32 KiB blocks of records with a
    7-byte header: crc, length, type full/first/middle/last)."""
    pos, parts = 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0:  # zero padding up to the block's end
            pos += block - pos % block if pos % block else 0
            continue
        parts = chunk if kind in (1, 2) else parts + chunk
        if kind in (1, 4):
            yield parts


def test_resume_false_starts_a_new_wandb_run_and_tensorboard_curve(tmp_path):
    """resume=false where a run is: the new run got the old run's wandb id (so wandb took its steps 1-2 as already
    logged by the old run's 1-3) and wrote its TensorBoard events beside the old ones (one curve 1, 2, 3, 1, 2).
    Both move aside with the old run."""
    run(tmp_path, steps=3)
    old_id = (tmp_path / "wandb_id").read_text()
    run(tmp_path, steps=2, extra=["resume=false"])
    (aside,) = (tmp_path / "previous").iterdir()
    assert (aside / "wandb_id").read_text() == old_id
    assert (tmp_path / "wandb_id").read_text() != old_id
    assert tensorboard_steps(tmp_path / "tensorboard") == [1, 2]
    assert tensorboard_steps(aside / "tensorboard") == [1, 2, 3]
    histories = [r.history.step.num for r in wandb_records(tmp_path) if r.WhichOneof("record_type") == "history"]
    assert histories == [1, 2]


def exit_codes(run_dir) -> list[int]:
    return [r.exit.exit_code for r in wandb_records(run_dir) if r.WhichOneof("record_type") == "exit"]


def test_a_diverged_run_is_a_failed_wandb_run(tmp_path):
    """A run that raised (here LossDiverged: optim.lr=1e30) was closed with wandb.finish(): exit code 0, shown as
    finished on the dashboard beside the runs that completed. It exits 1; a completed run exits 0."""
    with pytest.raises(LossDiverged):
        run(tmp_path / "diverged", steps=4, extra=["optim.lr=1e30", "sched=constant"])
    assert exit_codes(tmp_path / "diverged") == [1]
    run(tmp_path / "completed", steps=2)
    assert exit_codes(tmp_path / "completed") == [0]


def test_a_resume_from_an_earlier_checkpoint_redraws_its_steps_once_in_tensorboard(tmp_path):
    """A run killed after logging steps 3 and 4 but before their checkpoint resumes from step 2 and logs 3 and 4
    again: metrics.jsonl cuts its rows back to step 2, while TensorBoard drew 1, 2, 3, 4, 3, 4 (a curve that goes
    back). Its events from step 3 on are purged now, as metrics.jsonl's rows are."""
    run(tmp_path, steps=4, extra=["train.ckpt_interval=2"])
    ckpts = tmp_path / "checkpoints"
    shutil.rmtree(ckpts / "step_00000004")  # as if killed before this checkpoint was written
    (ckpts / "latest").write_text("step_00000002")
    run(tmp_path, steps=4, extra=["train.ckpt_interval=2"])
    assert [r["step"] for r in metrics(tmp_path) if "loss" in r] == [1, 2, 3, 4]
    assert tensorboard_steps(tmp_path / "tensorboard") == [1, 2, 3, 4]


@pytest.mark.slow
def test_a_plain_sweeps_cells_are_named_grouped_and_tagged_wandb_runs(tmp_path):
    """`lm train -m optim.lr=...` (no experiment naming a group): its cells were wandb runs named "0" and "1" in no
    group and without tags, so two sweeps' runs mixed on the dashboard. Now the sweep directory is their group."""
    env = {k: v for k, v in os.environ.items() if k != "LM_RUN_STAMP"}
    tiny = tiny_overrides(tmp_path / "sweep", steps=2)  # run_dir=X under -m: X/<job number> per cell
    cmd = [sys.executable, "-m", "lm.cli.train", "-m", *tiny, *OFFLINE, "model.vocab_size=128", "optim.lr=0.001,0.003"]
    out = subprocess.run(cmd, cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    for cell, lr in (("0", "0.001"), ("1", "0.003")):
        (run,) = [r.run for r in wandb_records(tmp_path / "sweep" / cell) if r.WhichOneof("record_type") == "run"]
        assert (run.run_group, run.display_name) == ("sweep", f"sweep/{cell}")
        assert f"optim.lr={lr}" in run.tags and "model=tiny" in run.tags
