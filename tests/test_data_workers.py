"""lm prepare's worker pool: results in task order, and a worker the system kills (out of memory) is an
error that names the task, not a wait that never ends (multiprocessing.Pool's behaviour)."""

import os

import pytest

from lm.data.errors import DataError
from lm.data.tasks import SourcePiece
from lm.data.workers import tokenize_tasks


def _init(tag: str) -> None:
    os.environ["LM_TEST_WORKER_TAG"] = tag


def _double(task: SourcePiece) -> tuple:
    return os.environ["LM_TEST_WORKER_TAG"], task.first_line * 2


def _die_on_line_1(task: SourcePiece) -> int:
    if task.first_line == 1:
        os._exit(9)  # what the kernel's OOM killer does to a worker: no exception, no cleanup
    return task.first_line


def _die_on_line_3(task: SourcePiece) -> int:
    if task.first_line == 3:
        os._exit(9)
    return task.first_line


def _tasks(n: int):
    return [
        SourcePiece(path=f"shard-{i}.jsonl.zst", format="jsonl", payload=b"", first_line=i) for i in range(1, n + 1)
    ]


def test_results_come_in_task_order_from_initialised_workers():
    results = list(tokenize_tasks(_tasks(7), 2, ("w",), work=_double, init=_init))
    assert results == [("w", 2 * i) for i in range(1, 8)]


@pytest.mark.parametrize("line, work", [(1, _die_on_line_1), (3, _die_on_line_3)])
def test_a_killed_worker_is_an_error_naming_the_tasks_in_flight_not_a_hang(line, work):
    done = []
    with pytest.raises(
        DataError, match=r"worker process died with these tasks in flight: .*data\.workers=N, now 2"
    ) as e:
        for r in tokenize_tasks(_tasks(6), 2, ("w",), work=work, init=_init):
            done.append(r)
    # the pool fails every task in flight (which one killed it is unknown): results before them came in order
    assert done == list(range(1, len(done) + 1)) and len(done) < line
    assert f"shard-{line}.jsonl.zst (from line {line})" in str(e.value)


def _pid(task: SourcePiece) -> int:
    return os.getpid()


KILLED_PARENT = """
import os, signal
from tests.test_data_workers import _init, _pid, _tasks
from lm.data.workers import tokenize_tasks

results = tokenize_tasks(_tasks(8), 2, ("w",), work=_pid, init=_init)
print(" ".join(str(next(results)) for _ in range(4)), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # the pool still open: the OOM killer's way, no cleanup
"""


def test_workers_end_when_their_parent_is_killed_outright(tmp_path):
    """lm prepare SIGKILLed (the OOM killer, `kill -9` of its pid) left its spawned workers sleeping forever, orphaned,
    each with its memory (~46 MB for a BPE tokenizer): they wait on a task queue whose write end they hold
    themselves. Each now ends within a second or so of its parent."""
    import signal
    import subprocess
    import sys
    import time

    from tests.engine_support import REPO, subprocess_env

    out = tmp_path / "out.txt"
    with open(out, "w") as f:  # a file, not a pipe: orphans holding a pipe's write end would keep run() waiting
        code = subprocess.run([sys.executable, "-c", KILLED_PARENT], cwd=REPO, env=subprocess_env(), stdout=f, stderr=f)
    assert code.returncode == -9, out.read_text()[-2000:]
    workers = {int(pid) for pid in out.read_text().split()}
    assert workers and os.getpid() not in workers
    deadline = time.time() + 60
    while any(_alive(pid) for pid in workers) and time.time() < deadline:
        time.sleep(0.2)
    left = [pid for pid in workers if _alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "orphaned workers outlived their parent"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie has ended already, waiting for init to reap it
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
