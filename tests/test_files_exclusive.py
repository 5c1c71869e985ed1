"""lm.core.files.exclusive: one writer at a time for read-modify-write outputs, and no lock file left behind."""

import json
import threading
import time

from lm.core.files import exclusive


def _in_threads(target, n: int) -> None:
    threads = [threading.Thread(target=target) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_holders_never_overlap_and_the_lock_file_is_removed(tmp_path):
    """A waiter that got the lock of a file its holder had just removed used to run beside the next holder."""
    counter, lock = tmp_path / "count", tmp_path / ".count.lock"
    counter.write_text("0")

    def add_five():
        for _ in range(5):
            with exclusive(lock):
                n = int(counter.read_text())
                time.sleep(0.002)  # a read-modify-write: overlapping holders lose increments
                counter.write_text(str(n + 1))

    _in_threads(add_five, 8)
    assert counter.read_text() == "40"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["count"]


def test_a_waiter_is_told_once_and_runs_after_the_holder(tmp_path):
    lock, order, told = tmp_path / "x.lock", [], []
    held = threading.Event()

    def holder():
        with exclusive(lock):
            held.set()
            time.sleep(0.2)
            order.append("holder")

    t = threading.Thread(target=holder)
    t.start()
    held.wait()
    with exclusive(lock, lambda: told.append(1)):
        order.append("waiter")
    t.join()
    assert order == ["holder", "waiter"] and told == [1] and not lock.exists()


def test_two_evaluations_finishing_together_keep_both_tasks(tmp_path, monkeypatch):
    """Two lm eval calls of one checkpoint merging into one eval_results.json: the second read the record before the
    first had written it, and the first's tasks were lost."""
    import lm.cli.eval as ev

    read = ev.earlier_record

    def slow_read(file):
        record = read(file)
        time.sleep(0.1)
        return record

    monkeypatch.setattr(ev, "earlier_record", slow_read)
    file = tmp_path / ev.RESULTS
    same = {"path": "run", "weights": "step_1", "limit": 4, "num_fewshot": None}
    tasks = iter(["local_rte", "local_sst2", "local_cola"])

    def evaluate():
        ev.write_record(file, {**same, "tasks": {next(tasks): {"acc": 0.5}}})

    _in_threads(evaluate, 3)
    assert set(json.loads(file.read_text())["tasks"]) == {"local_rte", "local_sst2", "local_cola"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [ev.RESULTS]
