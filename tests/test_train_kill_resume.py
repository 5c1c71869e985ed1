"""SIGKILL in the middle of a step, then the same command again: the loss trajectory continues as if
nothing happened. Real `lm train` processes (single, and torchrun with 2 ranks), real data (tiny
Shakespeare, prepared once per module from $LM_DATA_MIRROR). Also: Hydra under torchrun makes one
run directory with one resolved config.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.engine_support import REPO, free_port, metrics, subprocess_env, train_losses

pytestmark = pytest.mark.slow

STEPS = 12
KILL_AT = 7  # checkpoints at 4 and 8: the kill lands between them, inside step 7


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def overrides(run_dir, *extra):
    return [
        f"run_dir={run_dir}",
        "model=tiny",
        "model.max_seq_len=64",
        "data=shakespeare_char",
        "train.seq_len=32",
        "train.micro_batch_size=4",
        f"train.max_steps={STEPS}",
        "train.log_interval=1",
        "train.eval_interval=0",
        "train.eval_batches=2",
        "train.ckpt_interval=4",
        "sched.warmup_steps=2",
        "model.dropout=0.1",
        *extra,
    ]


def command(world):
    if world == 1:
        return [sys.executable, "-m", "lm.cli.train"]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(world),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        "-m",
        "lm.cli.train",
    ]


def run(world, args, cache, cwd=REPO, **env):
    proc = subprocess.run(
        command(world) + args,
        cwd=cwd,
        env=subprocess_env(LM_CACHE=str(cache), **env),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def start_paused(world, args, cache, tmp_path, stdout=subprocess.DEVNULL, **pause):
    """Start the run and wait until it is parked (by default inside step KILL_AT; `pause`: another hook's
    LM_FAULT_PAUSE_* variable)."""
    flag = tmp_path / "paused"
    env = subprocess_env(
        LM_CACHE=str(cache),
        LM_FAULT_PAUSE_FILE=str(flag),  # benchmarks/fault_pause.py parks it
        LM_PLUGINS=str(REPO / "benchmarks" / "fault_pause.py"),
        **(pause or {"LM_FAULT_PAUSE_AT_STEP": str(KILL_AT)}),
    )
    proc = subprocess.Popen(
        command(world) + args,
        cwd=REPO,
        env=env,
        start_new_session=True,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 600
    while not flag.exists():
        if proc.poll() is not None:
            pytest.fail(f"the run ended before its pause: {proc.stderr.read()[-3000:]}")
        assert time.time() < deadline, "the run never reached the fault step"
        time.sleep(0.2)
    time.sleep(0.5 if world == 1 else 2.0)  # let every rank reach the pause
    return proc


def run_and_kill(world, args, cache, tmp_path):
    """Start the run, wait until it is parked inside step KILL_AT, SIGKILL its whole process group."""
    proc = start_paused(world, args, cache, tmp_path)
    victims = [proc.pid, *descendants(proc.pid)]  # torchrun starts each rank in a session of its own
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    proc.wait()
    for pid in victims[1:]:  # not our children: wait until they are gone (or zombies)
        while _state(pid) not in (None, "Z"):
            time.sleep(0.1)


def _state(pid):
    try:
        return _stat(pid)[1]
    except OSError:
        return None


def _stat(pid):
    """(ppid, state) of a process, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[1]), fields[0]


def descendants(pid):
    """Every process below `pid` (Linux /proc)."""
    children = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                children.setdefault(_stat(int(entry.name))[0], []).append(int(entry.name))
            except (OSError, IndexError):
                continue
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


@pytest.mark.parametrize("world, engine, exact", [(1, "single", True), (2, "zero2", False)])
def test_sigkill_then_same_command_continues_the_trajectory(world, engine, exact, cache, tmp_path):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    run(world, overrides(whole, f"engine={engine}"), cache)
    run_and_kill(world, overrides(killed, f"engine={engine}"), cache, tmp_path)

    ckpts = killed / "checkpoints"
    assert (ckpts / "latest").read_text() == "step_00000004"  # the last complete checkpoint before the kill
    assert max(train_losses(killed)) == KILL_AT - 1  # the killed run logged up to step 6

    proc = run(world, overrides(killed, f"engine={engine}"), cache)
    assert "resumed from" in proc.stdout + proc.stderr
    expected, got = train_losses(whole), train_losses(killed)
    assert list(got) == list(range(1, STEPS + 1))  # steps 5-6 were redone once, not logged twice
    if exact:
        assert got == expected  # bit-identical on one CPU process
    else:
        assert max(abs(got[s] - expected[s]) for s in expected) < 1e-5


def test_ranks_of_a_sigkilled_torchrun_stop_with_a_checkpoint(cache, tmp_path):
    """torchrun cannot pass a SIGKILL on: its ranks, parked inside step 7, get SIGTERM from Linux instead
    (lm.engine.dist.stop_with_torchrun) and stop as on a preemption, with a checkpoint of step 7."""
    run_dir = tmp_path / "run"
    proc = start_paused(2, overrides(run_dir, "engine=ddp"), cache, tmp_path)
    ranks = descendants(proc.pid)
    proc.kill()
    proc.wait()
    deadline = time.time() + 120
    try:
        while any(_state(pid) not in (None, "Z") for pid in ranks) and time.time() < deadline:
            time.sleep(0.2)
        assert all(_state(pid) in (None, "Z") for pid in ranks), "the ranks outlived torchrun"
    finally:
        for pid in ranks:  # parked forever without the death signal
            if _state(pid) not in (None, "Z"):
                os.kill(pid, signal.SIGKILL)
    assert (run_dir / "checkpoints" / "latest").read_text() == f"step_{KILL_AT:08d}"


@pytest.mark.parametrize("session_leader", [True, False])
def test_only_a_process_torchrun_started_asks_for_its_death_signal(session_leader):
    """torchrun starts each rank as a session leader; a process a rank starts (same environment) is none and asks
    for no death signal, which would follow whichever thread of the rank started it."""
    code = (
        "import ctypes; from lm.engine.dist import stop_with_torchrun; stop_with_torchrun(); "
        "sig = ctypes.c_int(); ctypes.CDLL(None).prctl(2, ctypes.byref(sig)); print(sig.value)"  # PR_GET_PDEATHSIG
    )
    env = subprocess_env(TORCHELASTIC_RUN_ID="test")
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        start_new_session=session_leader,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stdout.strip() == (str(int(signal.SIGTERM)) if session_leader else "0"), out.stderr[-2000:]


def test_hydra_under_torchrun_makes_one_run_directory(cache, tmp_path):
    """No run_dir given: rank 0's timestamp names one directory for both ranks, with one config."""
    args = [a for a in overrides("unused", "engine=ddp") if not a.startswith("run_dir=")]
    args = [a.replace(f"train.max_steps={STEPS}", "train.max_steps=3") for a in args]
    run(2, args + ["hydra.job.chdir=false"], cache, cwd=tmp_path, PYTHONPATH=str(REPO))
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1, runs
    files = sorted(p.name for p in runs[0].iterdir())
    assert files == [".lock", "checkpoints", "config.yaml", "metrics.jsonl", "train.log"], files
    assert [m["step"] for m in metrics(runs[0]) if "loss" in m] == [1, 2, 3]  # rank 0 alone writes
    assert not (tmp_path / "outputs").exists() and not list(tmp_path.glob("**/.hydra"))


def test_ctrl_c_stops_after_the_step_with_a_checkpoint_and_the_same_command_resumes(cache, tmp_path):
    """Issue 49 item 10: Ctrl-C (SIGINT) in the middle of step 7 printed a KeyboardInterrupt traceback and wrote
    no checkpoint; now it stops like SIGTERM: step 7 finishes, is checkpointed, one line, exit status 1."""
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    run(1, overrides(whole), cache)
    proc = start_paused(1, overrides(stopped), cache, tmp_path, stdout=subprocess.PIPE)
    try:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 1 and "Traceback" not in out + err, out[-2000:] + err[-2000:]
    assert (
        f"SIGINT (Ctrl-C) received: stopped after step {KILL_AT} with checkpoint "
        f"{stopped / 'checkpoints' / f'step_{KILL_AT:08d}'}; run the same command to resume"
    ) in out + err
    assert "Ctrl-C: stopping after the step in flight with a checkpoint" in err
    assert "resumed from" in "".join(run(1, overrides(stopped), cache).stdout)
    assert train_losses(stopped) == train_losses(whole)  # bit-identical, step 7 not redone


def test_a_second_ctrl_c_aborts_at_once_in_one_line(cache, tmp_path):
    """The run is parked inside its second checkpoint write (step 8): the first Ctrl-C asks for a stop, which
    waits for that write; the second aborts at once, with one line and exit status 130, no traceback. The
    half-written checkpoint is never `latest`, and the same command resumes from step 4 exactly."""
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    run(1, overrides(whole), cache)
    proc = start_paused(
        1, overrides(stopped), cache, tmp_path, stdout=subprocess.PIPE, LM_FAULT_PAUSE_IN_SAVE="files:2"
    )
    try:
        proc.send_signal(signal.SIGINT)
        while not proc.stderr.readline().startswith("Ctrl-C: stopping after the step in flight"):  # handled
            assert proc.poll() is None, "the run ended at the first Ctrl-C"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()  # parked in the save hook forever if the test failed before the second Ctrl-C
        proc.wait()
    assert proc.returncode == 130 and "Traceback" not in out + err, out[-2000:] + err[-2000:]
    assert err.strip().splitlines()[-1] == (
        f"lm train: interrupted; run the same command to resume from "  # one line
        f"{stopped / 'checkpoints' / 'step_00000004'}"
    )
    assert (stopped / "checkpoints" / "latest").read_text() == "step_00000004"
    run(1, overrides(stopped), cache)
    assert train_losses(stopped) == train_losses(whole)


def test_sigkill_in_an_asynchronous_write_resumes_from_the_previous_checkpoint(cache, tmp_path):
    """train.async_checkpoint=true: the write of step 8 is parked in its background thread after the rename, before
    `latest` is updated (the loop trains on meanwhile), and the process is killed there. `latest` still names step 4;
    the same command resumes from it and continues bit-identically to an uninterrupted synchronous run."""
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    run(1, overrides(whole), cache)
    proc = start_paused(
        1, overrides(killed, "train.async_checkpoint=true"), cache, tmp_path, LM_FAULT_PAUSE_IN_SAVE="latest:2"
    )
    proc.kill()
    proc.wait()
    ckpts = killed / "checkpoints"
    assert (ckpts / "latest").read_text() == "step_00000004"
    assert (ckpts / "step_00000008" / "trainer.json").is_file()  # complete, renamed, never named by `latest`
    proc = run(1, overrides(killed, "train.async_checkpoint=true"), cache)
    assert f"resumed from {ckpts / 'step_00000004'}" in proc.stdout + proc.stderr
    assert train_losses(killed) == train_losses(whole)
