"""The tokenizer workers of lm-prepare: task -> documents -> token ids per split, in spawned processes,
results in task order with at most 2*workers tasks in flight (memory stays bounded)."""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
from collections import deque
from dataclasses import dataclass, field
from typing import Dict, Iterable, Iterator, List

import numpy as np

from lm.data.documents import read_task
from lm.data.tasks import ReadOptions, Task
from lm.data.tokenizer import Tokenizer


@dataclass
class Result:
    tokens: Dict[str, np.ndarray]
    docs: Dict[str, int]
    bytes: int
    bad_records: int = 0
    examples: List[str] = field(default_factory=list)
    invalid_utf8: int = 0


_W: dict = {}


def _init_worker(tokenizer_path: str, opts: ReadOptions, append_eos: bool, parallel: bool = False) -> None:
    if not parallel:  # one thread per worker process: the processes are the parallelism
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    tok = Tokenizer.load(tokenizer_path)
    _W.update(tok=tok, opts=opts, eos=(tok.eos_id,) if append_eos else (), dtype=token_dtype(tok.vocab_size))


def _work(task: Task) -> Result:
    docs = read_task(task, _W["opts"])
    ids = _W["tok"].encode_batch(docs.texts) if docs.texts else []
    parts: Dict[str, list] = {}
    counts: Dict[str, int] = {}
    eos = _W["eos"]
    for doc_ids, ends, split in zip(ids, docs.ends, docs.splits):  # one pass, whatever the number of splits
        if split not in parts:
            parts[split], counts[split] = [], 0
        parts[split].append(doc_ids)
        if ends:
            parts[split].append(eos)
            counts[split] += 1
    tokens = {s: np.fromiter(itertools.chain.from_iterable(p), dtype=_W["dtype"]) for s, p in parts.items()}
    return Result(tokens, counts, docs.bytes, docs.bad_records, docs.examples, docs.invalid_utf8)


def tokenize_tasks(tasks: Iterable[Task], workers: int, init_args: tuple) -> Iterator[Result]:
    """Results in task order; at most 2*workers tasks in flight, so memory stays bounded."""
    if workers <= 1:
        _init_worker(*init_args)
        yield from map(_work, tasks)
        return
    # spawn, not fork: the parent may have used the tokenizers thread pool (training), which a fork would break
    with mp.get_context("spawn").Pool(workers, _init_worker, init_args) as pool:
        pending: deque = deque()
        for task in tasks:
            pending.append(pool.apply_async(_work, (task,)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def token_dtype(vocab_size: int):
    return np.uint16 if vocab_size <= 1 << 16 else np.uint32
