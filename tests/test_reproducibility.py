"""Reproducibility: the same command gives the same numbers, wherever it runs in a process."""

import torch

from lm.cli.train import train
from tests.engine_support import compose, loaders, tiny_overrides, train_losses


def test_train_threads_null_runs_on_the_process_count_not_on_an_earlier_runs(tmp_path, monkeypatch):
    """torch keeps one thread count per process: a sweep cell with train.threads=null that ran after a cell with
    train.threads=1 ran on 1 thread, its weights bit-equal to that cell's and 9.9e-7 from the same command run
    alone on 2 threads. Null is the process's own count again after a run that set one."""
    import lm.core.setup

    monkeypatch.setattr(lm.core.setup, "_process_threads", None, raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(3)  # this process's own count (any but 1)
    try:
        for name, threads, expected in (("one", 1, 1), ("null", None, 3)):
            kw = {} if threads is None else {"threads": threads}
            cfg = compose(tiny_overrides(tmp_path / name, 2, **kw))
            train(cfg, loaders=loaders(cfg))
            assert (name, torch.get_num_threads()) == (name, expected)
        assert list(train_losses(tmp_path / "null")) == [1, 2]
    finally:
        torch.set_num_threads(before)
