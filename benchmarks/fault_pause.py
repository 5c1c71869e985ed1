"""An LM_PLUGINS plugin (lm/core/hooks.py) that parks an lm train / lm finetune process at a chosen point, so
a test or benchmarks/fault_injection.py can SIGKILL it exactly there:

    LM_PLUGINS=benchmarks/fault_pause.py LM_FAULT_PAUSE_FILE=<flag> LM_FAULT_PAUSE_AT_STEP=N lm train ...
        parks in the N-th optimizer step the process runs (after its first micro-batch's backward, before
        the update), counted over every run of the process: a fresh lm train parks in step N, lm finetune
        in the task/seed where its steps reach N
    ... LM_FAULT_PAUSE_IN_SAVE=<phase>:<n>
        parks at <phase> (lm.core.checkpoint.SAVE_PHASES) of the n-th checkpoint the process writes; with
        train.async_checkpoint=true that parks the write's background thread, and the loop trains on up to its
        next checkpoint, which waits for the parked one

It touches LM_FAULT_PAUSE_FILE when it parks, then sleeps until killed; a step parked this way also goes on
once a stop signal (SIGTERM, SIGUSR1, Ctrl-C) reached the loop, which then stops as it would for a signal in
that step (a parked save keeps sleeping: a test's first Ctrl-C there waits, its second aborts).
"""

import os
import time
from pathlib import Path

PLUGIN = str(Path(__file__).resolve())  # what LM_PLUGINS names
_counts = {"steps": 0, "saves": 0}  # over every run of this process


def install(hooks) -> None:
    if os.environ.get("LM_FAULT_PAUSE_AT_STEP"):
        hooks.after_backward.append(_at_step)
    if os.environ.get("LM_FAULT_PAUSE_IN_SAVE"):
        hooks.save_phase.append(_in_save)


def _at_step(step: int, micro: int) -> None:
    if micro != 0:
        return
    _counts["steps"] += 1
    if _counts["steps"] == int(os.environ["LM_FAULT_PAUSE_AT_STEP"]):
        from lm.core.loop import stop_requested

        _park(until=stop_requested)


def _in_save(phase: str) -> None:
    if phase == "begin":
        _counts["saves"] += 1
    elif os.environ["LM_FAULT_PAUSE_IN_SAVE"] == f"{phase}:{_counts['saves']}":
        _park()


def _park(until=lambda: False) -> None:
    if os.environ.get("LM_FAULT_PAUSE_FILE"):
        Path(os.environ["LM_FAULT_PAUSE_FILE"]).touch()
    while not until():
        time.sleep(0.1)
