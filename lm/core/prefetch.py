"""Prefetch: the next steps' micro-batches are prepared in a background thread while the current step runs.

    steps = Prefetcher(task.batches, device, depth=1)   # a StepBatches itself (lm/core/task.py)
    micro = next(steps)          # this step's micro-batches, already on `device` (non_blocking copies)
    steps.tokens                 # their input tokens (objectives.input_tokens), counted on the host before the copy
    steps.state_dict()           # the position after the batches handed out, not after those prefetched

The thread reads (and on CUDA pins) up to `depth` steps ahead; the loop's thread only issues the
host-to-device copies, which are asynchronous from pinned memory, so neither the loader nor the copy
stalls the device. Exact resume is unchanged: each prefetched step carries the source's state_dict()
taken right after it was read, and `state_dict()` returns the one of the last step handed out, so a
checkpoint records what was consumed. `close()` rewinds the source to that position.

The source must not draw from global random generators (ours key theirs by sample position: lm/data/packed.py,
lm/glue/trainer.py), since a second thread would interleave with the training thread's draws.
"""

from __future__ import annotations

import copy
import queue
import threading

import torch

from lm.core import objectives

_DONE = object()  # the thread's last item when the source ends (StopIteration)


class _Failed:
    def __init__(self, error: BaseException):
        self.error = error


def _count(micro: list[dict[str, torch.Tensor]]) -> int:
    return sum(objectives.input_tokens(b) for b in micro)


class Prefetcher:
    """StepBatches over `steps`, `depth` steps read ahead in a daemon thread (depth 0: read on demand)."""

    def __init__(self, steps, device: torch.device, depth: int = 1):
        self.steps, self.device, self.depth = steps, device, depth
        self.pin = device.type == "cuda" and torch.cuda.is_available()  # pinned host memory: async copies
        self.dense_labels = getattr(steps, "dense_labels", False)  # lm/core/loop.py reads it
        self._state: dict | None = None  # the source's state after the last step handed out
        self.tokens = 0  # the last step's input tokens, counted on the host: the loop logs them without a device read
        self._queue: queue.Queue | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def __iter__(self):
        return self

    def __next__(self) -> list[dict[str, torch.Tensor]]:
        if self.depth == 0:
            micro, self._state = next(self.steps), None
            self.tokens = _count(micro)
        else:
            if self._thread is None:
                self._start()
            assert self._queue is not None  # _start() made it
            item = self._queue.get()
            if item is _DONE:
                raise StopIteration
            if isinstance(item, _Failed):
                raise item.error
            micro, self.tokens, self._state = item
        return [{k: v.to(self.device, non_blocking=True) for k, v in b.items()} for b in micro]

    def _start(self) -> None:
        self._state = copy.deepcopy(self.steps.state_dict())  # nothing handed out yet
        self._queue = queue.Queue(maxsize=self.depth)
        self._stop.clear()
        self._thread = threading.Thread(target=self._fill, name="lm-prefetch", daemon=True)
        self._thread.start()

    def _fill(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    micro = next(self.steps)
                except StopIteration:
                    self._put(_DONE)
                    return
                tokens = _count(micro)  # here, off the training thread
                if self.pin:
                    micro = [{k: v.pin_memory() for k, v in b.items()} for b in micro]
                self._put((micro, tokens, copy.deepcopy(self.steps.state_dict())))
        except BaseException as e:  # noqa: BLE001 - handed to the training thread, which raises it
            self._put(_Failed(e))

    def _put(self, item) -> None:
        assert self._queue is not None  # the filler thread runs between _start() and close()
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def state_dict(self) -> dict:
        if self._state is None:  # nothing read ahead (depth 0, or not started)
            return self.steps.state_dict()
        return copy.deepcopy(self._state)

    def load_state_dict(self, state: dict) -> None:
        self._halt()
        self.steps.load_state_dict(state)
        self._state = None

    def close(self) -> None:
        """Stop the thread and rewind the source to what was handed out (its own state_dict() is then exact)."""
        consumed = self._state
        self._halt()
        if consumed is not None:
            self.steps.load_state_dict(consumed)
        self._state = None

    def _halt(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread, self._queue = None, None
