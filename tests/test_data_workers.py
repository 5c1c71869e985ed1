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
