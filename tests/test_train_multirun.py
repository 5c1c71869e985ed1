"""`lm train -m` without an experiment: one run directory per cell, and a failing cell does not end the
sweep (the next cells still train)."""

import subprocess
import sys

import pytest

from tests.engine_support import REPO, metrics, subprocess_env, train_losses

pytestmark = pytest.mark.slow

TINY_SWEEP = ["-m", "model=tiny", "data=shakespeare_char", "train.seq_len=32", "train.micro_batch_size=2"]


def test_plain_multirun_gives_each_cell_its_own_run_dir_and_survives_a_bad_cell(tmp_path):
    args = [
        *TINY_SWEEP,
        "train.max_steps=2",
        "train.log_interval=1",
        "train.eval_batches=1",
        "sched.warmup_steps=1",
        "model.n_heads=3,4",
        "seed=0,1",
    ]  # n_heads=3 does not divide dim=64: those two cells fail
    proc = subprocess.run(
        [sys.executable, "-m", "lm.cli.train", *args],
        cwd=tmp_path,
        timeout=900,
        text=True,
        capture_output=True,
        env=subprocess_env(LM_CACHE=str(tmp_path / "cache"), PYTHONPATH=str(REPO)),
    )
    assert proc.returncode != 0  # Hydra re-raises the first failure once the sweep is over
    assert "n_heads" in proc.stdout + proc.stderr
    sweep = list((tmp_path / "runs").iterdir())
    assert len(sweep) == 1, sweep
    cells = {p.name: p for p in sweep[0].iterdir() if p.is_dir()}
    trained = {name for name, p in cells.items() if (p / "metrics.jsonl").exists()}
    assert trained == {"2", "3"}, cells  # jobs 0, 1 = n_heads 3 (failed); 2, 3 = n_heads 4 with seeds 0, 1
    first, second = ([m["loss"] for m in metrics(cells[c]) if "loss" in m] for c in ("2", "3"))
    assert len(first) == len(second) == 2 and first != second  # separate runs (different seeds), not a resume


def test_a_multirun_with_an_explicit_run_dir_gives_each_cell_its_own_directory(tmp_path):
    args = [
        *TINY_SWEEP,
        "train.max_steps=1",
        "train.eval_batches=1",
        "sched.warmup_steps=1",
        "seed=0,1",
        "run_dir=sweep",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "lm", "train", *args],
        cwd=tmp_path,
        timeout=900,
        text=True,
        capture_output=True,
        env=subprocess_env(LM_CACHE=str(tmp_path / "cache"), PYTHONPATH=str(REPO)),
    )
    assert proc.returncode == 0, proc.stderr
    cells = sorted(p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir())
    assert cells == ["0", "1"]
    first, second = ([m["loss"] for m in metrics(tmp_path / "sweep" / c) if "loss" in m] for c in cells)
    assert len(first) == len(second) == 1 and first != second  # two runs (seeds 0 and 1), neither resumed
    assert "resumed from" not in proc.stdout + proc.stderr


def _sweep(tmp_path, run_dir, **env):
    """`lm train -m ... seed=0,1,2 run_dir=<run_dir>`: three cells of 4 steps, a checkpoint every step."""
    args = [
        *TINY_SWEEP,
        "train.max_steps=4",
        "train.log_interval=1",
        "train.eval_interval=0",
        "train.ckpt_interval=1",
        "sched.warmup_steps=1",
        "seed=0,1,2",
        f"run_dir={run_dir}",
    ]
    return subprocess.Popen(
        [sys.executable, "-m", "lm.cli.train", *args],
        cwd=tmp_path,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=subprocess_env(LM_CACHE=str(tmp_path / "cache"), PYTHONPATH=str(REPO), **env),
    )


def _finished(proc):
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err[-3000:]
    return out + err


def _parked_in_cell_1(tmp_path, run_dir):
    """The sweep, parked (benchmarks/fault_pause.py) in its 6th optimizer step: cell 1's step 2."""
    import time

    flag = tmp_path / f"paused-{run_dir}"
    proc = _sweep(
        tmp_path,
        run_dir,
        LM_PLUGINS=str(REPO / "benchmarks" / "fault_pause.py"),
        LM_FAULT_PAUSE_FILE=str(flag),
        LM_FAULT_PAUSE_AT_STEP="6",
    )
    deadline = time.time() + 600
    while not flag.exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() < deadline, "the sweep never reached the fault step"
        time.sleep(0.2)
    return proc


def _written(run_dir, step: str) -> None:
    """Wait until `step`'s checkpoint is complete: the checkpoint before the parked step is written by a background
    thread (train.async_checkpoint), which on a loaded machine may still be writing when the step parks."""
    import time

    latest, deadline = run_dir / "checkpoints" / "latest", time.time() + 300
    while not (latest.is_file() and latest.read_text() == step):
        assert time.time() < deadline, f"{latest} never named {step}"
        time.sleep(0.2)


def _same_as_whole(tmp_path, cells):
    for cell in ("0", "1", "2"):
        got, want = train_losses(cells / cell), train_losses(tmp_path / "whole" / cell)
        assert list(got) == [1, 2, 3, 4] and got == want, cell


def test_a_killed_sweep_run_again_resumes_its_unfinished_cell_exactly_and_skips_the_finished(tmp_path):
    """Issue 51 item 2: `lm train -m ... run_dir=sweep` SIGKILLed inside the second cell (cell 1's step 2; a
    checkpoint every step), then the same command again: cell 0 is not trained again (its files stay as they
    were), cell 1 continues from its checkpoint, cell 2 starts, and every cell's losses equal an uninterrupted
    sweep's, bit for bit (one process). A SIGTERM there (preemption) ends the sweep after cell 1's step in
    flight: cell 2 never starts (the sender would kill it within its grace period), and the same command
    finishes the sweep as exactly."""
    import os
    import signal

    _finished(_sweep(tmp_path, "whole"))
    killed = _parked_in_cell_1(tmp_path, "sweep")
    _written(tmp_path / "sweep" / "1", "step_00000001")
    os.kill(killed.pid, signal.SIGKILL)
    killed.communicate()
    cells = tmp_path / "sweep"
    assert (cells / "1" / "checkpoints" / "latest").read_text() == "step_00000001"
    assert not (cells / "2").exists()
    done = _files(cells / "0")

    out = _finished(_sweep(tmp_path, "sweep"))
    assert "sweep/0 finished at step 4 (train.max_steps): this cell is skipped" in out
    assert "resumed from" in out and "sweep/1/checkpoints/step_00000001 (step 1)" in out
    assert _files(cells / "0") == done, "the finished cell was written again"
    _same_as_whole(tmp_path, cells)

    stopped = _parked_in_cell_1(tmp_path, "preempted")
    os.kill(stopped.pid, signal.SIGTERM)
    out = "".join(stopped.communicate(timeout=600))
    cells = tmp_path / "preempted"
    assert stopped.returncode == 1 and "Preempted: SIGTERM" in out, out[-3000:]
    assert (cells / "1" / "checkpoints" / "latest").read_text() == "step_00000002"
    assert not (cells / "2").exists(), "the sweep went on to the next cell after a stop signal"
    _finished(_sweep(tmp_path, "preempted"))
    _same_as_whole(tmp_path, cells)


def _files(run_dir):
    """Each file of a run directory (its .lock aside: the lock's holder is noted there) with its mtime and bytes."""
    return {
        p.relative_to(run_dir): (p.stat().st_mtime_ns, p.read_bytes())
        for p in run_dir.rglob("*")
        if p.is_file() and p.name != ".lock"
    }


def test_a_sweep_whose_stamp_another_sweep_took_runs_in_a_directory_of_its_own(tmp_path):
    """Two `lm train -m` started in the same second (a script's `... &` lines, array jobs) named one directory,
    runs/<date>_<time>/: both sweeps ran their cells there, each refused the cells the other held (one of two cells
    lost per sweep, reproduced) and the directory mixed the two. The other sweep is stood for here by a directory for
    every second this sweep could start in: the sweep runs in <stamp>-2 and leaves them as they were."""
    import datetime

    now = datetime.datetime.now()
    taken = [(now + datetime.timedelta(seconds=s)).strftime("%Y-%m-%d_%H-%M-%S") for s in range(-2, 300)]
    for stamp in taken:
        (tmp_path / "runs" / stamp / "0").mkdir(parents=True)
    args = [*TINY_SWEEP, "train.max_steps=1", "train.eval_batches=1", "sched.warmup_steps=1", "seed=0,1"]
    proc = subprocess.run(
        [sys.executable, "-m", "lm", "train", *args],
        cwd=tmp_path,
        timeout=280,
        text=True,
        capture_output=True,
        env=subprocess_env(LM_CACHE=str(tmp_path / "cache"), PYTHONPATH=str(REPO)),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ours = [p for p in (tmp_path / "runs").iterdir() if p.name not in taken]
    assert len(ours) == 1 and ours[0].name[:-2] in taken and ours[0].name.endswith("-2"), ours
    assert sorted(p.name for p in ours[0].iterdir() if p.is_dir()) == ["0", "1"]
    assert all(len(metrics(ours[0] / c)) > 0 for c in ("0", "1"))
    assert all(sorted(p.name for p in (tmp_path / "runs" / s).iterdir()) == ["0"] for s in taken)
