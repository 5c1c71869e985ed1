"""A stop signal (SIGTERM, SIGUSR1, Ctrl-C) that lands in the last step of one training loop of a process that
runs several in turn (lm finetune's task/seed pairs, lm transfer's pretraining then finetuning) stops the job
before the next loop trains: the request is never dropped because the loop it reached had nothing left to do."""

import signal
import subprocess
import sys

import tests.test_train_kill_resume as kr
from tests.test_finetune_kill_resume import files, finetune, overrides  # noqa: F401 - the module's fixture


def test_sigterm_in_the_last_step_of_a_seed_stops_before_the_next_seed(files, tmp_path, monkeypatch):  # noqa: F811
    """The signal reached seed 0's loop after its last stop check; that loop's handlers were then restored and the
    request was dropped: seed 1 trained all its steps, and the job ignored the preemption until SIGKILL."""
    run_dir = tmp_path / "run"
    args = [*overrides(files, run_dir), "tasks.sst2.epochs=1"]  # seed 0: steps 1..10, seed 1: 11..20
    monkeypatch.setattr(kr, "KILL_AT", 10)  # parked inside seed 0's last step
    monkeypatch.setattr(kr, "command", lambda world: [sys.executable, "-m", "lm.cli.finetune"])
    proc = kr.start_paused(1, args, files, tmp_path, stdout=subprocess.PIPE)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert (run_dir / "sst2" / "seed0" / "result.pt").is_file()  # seed 0 was complete anyway
    assert not (run_dir / "sst2" / "seed1" / "metrics.jsonl").is_file() or not kr.metrics(run_dir / "sst2" / "seed1")
    assert proc.returncode == 1 and "SIGTERM received in the last steps of the run before" in out + err, err[-2000:]
    log = finetune(args).stdout  # the same command finishes the job
    assert "seed 0: done in an earlier run" in log
    assert (run_dir / "results.json").is_file()
