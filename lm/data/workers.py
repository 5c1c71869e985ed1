"""The tokenizer workers of lm prepare: task -> documents -> token ids per split, in spawned processes,
results in task order with at most 2*workers tasks in flight (memory stays bounded)."""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field

import numpy as np

from lm.data.documents import read_task
from lm.data.errors import DataError
from lm.data.tasks import ReadOptions, SourcePiece
from lm.data.tokenizer import Tokenizer


@dataclass
class Result:
    tokens: dict[str, np.ndarray]
    docs: dict[str, int]
    bytes: int
    bad_records: int = 0
    examples: list[str] = field(default_factory=list)
    invalid_utf8: int = 0
    split_docs: int = 0  # documents tokenized in pieces (longer than max_doc_chars)
    short_docs: int = 0  # dropped: shorter than min_doc_chars
    duplicate_docs: int = 0  # dropped by lm/data/dedup.py (set in the parent, after the worker)
    duplicate_tokens: int = 0
    # With dedup: per split, each document's token count (pieces and EOS together) and doc_key (0 = none),
    # in order, so that lm/data/dedup.py can drop the documents seen in earlier tasks.
    units: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


_W: dict = {}


def _init_worker(tokenizer_path: str, opts: ReadOptions, append_eos: bool, parallel: bool = False) -> None:
    if not parallel:  # one thread per worker process: the processes are the parallelism
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    tok = Tokenizer.load(tokenizer_path)
    _W.update(tok=tok, opts=opts, eos=(tok.eos_id,) if append_eos else (), dtype=token_dtype(tok.vocab_size))


def _work(task: SourcePiece) -> Result:
    docs = read_task(task, _W["opts"])
    parts: dict[str, list[np.ndarray]] = {}
    counts: dict[str, int] = {}
    units = _Units() if _W["opts"].dedup else None
    eos, dtype = _W["eos"], _W["dtype"]
    for lo, hi in _groups(docs.texts, _W["opts"].max_doc_chars):
        # Encoded a group at a time and packed into arrays at once: the tokenizer's per-token objects
        # and Python int lists of a whole task would otherwise all be alive together.
        ids = _W["tok"].encode_batch(docs.texts[lo:hi])
        group: dict[str, list] = {}
        for i, doc_ids in enumerate(ids, lo):  # one pass over the splits
            split = docs.splits[i]
            group.setdefault(split, []).append(doc_ids)
            counts.setdefault(split, 0)
            if docs.ends[i]:
                group[split].append(eos)
                counts[split] += 1
            if units is not None:
                units.add(split, len(doc_ids) + len(eos) * docs.ends[i], docs.keys[i], docs.ends[i])
        for split, p in group.items():
            parts.setdefault(split, []).append(np.fromiter(itertools.chain.from_iterable(p), dtype=dtype))
        del ids, group
    tokens = {s: np.concatenate(p) for s, p in parts.items()}
    return Result(
        tokens,
        counts,
        docs.bytes,
        docs.bad_records,
        docs.examples,
        docs.invalid_utf8,
        docs.split_docs,
        docs.short_docs,
        units=units.arrays() if units is not None else {},
    )


class _Units:
    """Per split, documents as (token count, key): a document's pieces are summed until the one that ends it."""

    def __init__(self):
        self.lengths: dict[str, list[int]] = {}
        self.keys: dict[str, list[int]] = {}
        self.open: dict[str, bool] = {}  # the split's last document has more pieces to come

    def add(self, split: str, n: int, key: int, ends: bool) -> None:
        lengths, keys = self.lengths.setdefault(split, []), self.keys.setdefault(split, [])
        if self.open.get(split):
            lengths[-1] += n
        else:
            lengths.append(n)
            keys.append(key)
        self.open[split] = not ends

    def arrays(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        return {s: (np.array(n, np.int64), np.array(self.keys[s], np.uint64)) for s, n in self.lengths.items()}


def _groups(texts: list[str], max_chars: int) -> Iterator[tuple[int, int]]:
    """[lo, hi) ranges of consecutive texts of at most max_chars characters together (at least one text)."""
    lo, chars = 0, 0
    for i, text in enumerate(texts):
        if i > lo and chars + len(text) > max_chars:
            yield lo, i
            lo, chars = i, 0
        chars += len(text)
    if lo < len(texts):
        yield lo, len(texts)


def tokenize_tasks(
    tasks: Iterable[SourcePiece],
    workers: int,
    init_args: tuple,
    work: Callable[[SourcePiece], Result] = None,
    init: Callable[..., None] = None,
) -> Iterator[Result]:
    """Results in task order; at most 2*workers tasks in flight, so memory stays bounded. `work` and
    `init` default to the tokenizer's (_work, _init_worker); tests pass others."""
    work, init = work or _work, init or _init_worker
    if workers <= 1:
        init(*init_args)
        yield from map(work, tasks)
        return
    # spawn, not fork: the parent may have used the tokenizers thread pool (training), which a fork would break.
    # ProcessPoolExecutor, not multiprocessing.Pool: when the system kills a worker (out of memory), Pool
    # replaces it and the lost task's result never comes, so lm prepare waited forever; the executor
    # fails every pending task with BrokenProcessPool instead, which is reported below.
    pending: deque = deque()  # (task, future), oldest first
    start = (os.getpid(), init, init_args)
    try:
        with ProcessPoolExecutor(workers, mp.get_context("spawn"), _start_worker, start) as pool:
            for task in tasks:
                pending.append((task, pool.submit(work, task)))
                if len(pending) >= 2 * workers:
                    yield pending[0][1].result()
                    pending.popleft()
            while pending:
                yield pending[0][1].result()
                pending.popleft()
    except BrokenProcessPool:  # from result(), or from submit() once the pool is broken
        where = ", ".join(dict.fromkeys(f"{t.path} (from line {t.first_line})" for t, _ in pending))
        raise DataError(
            f"a tokenizer worker process died with these tasks in flight: {where}; killed by the "
            f"system, most often for lack of memory. The progress so far is kept and a rerun resumes "
            f"it; use fewer workers (data.workers=N, now {workers}) or free memory"
        ) from None


def _start_worker(parent: int, init: Callable[..., None], init_args: tuple) -> None:
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    init(*init_args)


def _exit_with_parent(parent: int, poll_s: float = 1.0) -> None:
    """End this worker once its parent is gone. A parent killed outright (SIGKILL, the kernel's OOM killer, a kill
    of its pid alone) cannot stop its workers, and they wait for tasks on a queue whose write end each holds itself:
    they slept, orphaned, holding their memory, until the machine rebooted."""
    while os.getppid() == parent:
        time.sleep(poll_s)
    os._exit(1)


def token_dtype(vocab_size: int):
    return np.uint16 if vocab_size <= 1 << 16 else np.uint32
