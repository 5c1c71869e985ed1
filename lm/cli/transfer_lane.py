"""`lm transfer --parallel`: the scratch arm in a second process, beside the pretraining.

The scratch arm does not depend on the pretraining, so the two can overlap: on a CPU each process gets
half of the cores (a small model's ops gain less than 2x from a second thread, so two one-thread processes
do more work than one two-thread process). On one GPU it buys no time: processes time-slice the device, so the
pretraining slows by what the lane uses.
The lane is the same recipe run as `lm transfer ... --arm scratch`; it logs to <scratch>/lane.log (appended:
a curve's points share one scratch arm) and resumes like any call.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

from lm.cli.transfer_recipe import LANE_LOG

log = logging.getLogger("lm")


def recipe_argv(r) -> list[str]:
    """The lm transfer arguments that rebuild recipe `r` (lm.cli.transfer.Recipe), as the lane's command line."""
    argv = [
        "--preset",
        r.preset,
        "--tokens",
        str(r.tokens),
        "--out",
        str(r.out),
        "--scratch",
        str(r.scratch),
        "--seeds",
        ",".join(map(str, r.seeds)),
        "--group",
        r.group,
        "--logger",
        r.logger,
    ]
    if r.tasks:
        argv += ["--tasks", ",".join(r.tasks)]
    # `--pretrain=a b` would take one value; each override after the flag is its own argument
    for flag, overrides in (("--pretrain", r.pretrain), ("--finetune", r.finetune)):
        if overrides:
            argv += [flag, *overrides]
    return argv


def split_threads(cores: int) -> int:
    """CPU threads for each of the two processes: half of the cores each (at least one)."""
    return max(1, cores // 2)


def start_scratch_lane(r, threads: int) -> Lane:
    """Starts the scratch arm as `python -m lm.cli.transfer <recipe> --arm scratch --lane` with `threads` CPU
    threads; its output goes to <scratch>/lane.log."""
    r.scratch.mkdir(parents=True, exist_ok=True)
    path = r.scratch / LANE_LOG
    cmd = [sys.executable, "-m", "lm.cli.transfer", *recipe_argv(r), "--arm", "scratch", "--lane"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    out = open(path, "a")  # noqa: SIM115 - the child writes to it; Lane closes it when the arm ends
    log.info(
        "lm transfer: the scratch arm runs beside the pretraining (%d CPU threads each); its log: %s", threads, path
    )
    return Lane(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env), path, out)


class Lane:
    """A running scratch arm: wait() for it, or stop() it (SIGTERM: lm finetune saves its place)."""

    def __init__(self, proc: subprocess.Popen, path: Path, out):
        self.proc, self.path, self._out = proc, path, out

    def wait(self) -> str | None:
        """Waits for the lane; None when it finished its work, else why not (with the log's last lines)."""
        if self.proc.poll() is None:
            log.info("lm transfer: waiting for the scratch arm (%s)", self.path)
        rc = self.proc.wait()
        self._out.close()
        if rc == 0:
            return None
        tail = self.path.read_text(errors="replace").strip().splitlines()[-5:]
        return f"exit status {rc}; the last lines of {self.path}:\n  " + "\n  ".join(tail)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()
