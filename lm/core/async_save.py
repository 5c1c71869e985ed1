"""BackgroundWrite: the one checkpoint write in flight of an asynchronous Checkpointer (train.async_checkpoint).

Checkpointer.save snapshots the state in the loop's thread (the engine's stage_state: a CPU copy; the ranks'
loader and RNG states) and hands the rest to `start`: writing the files, the ranks' agreement that all of them
wrote theirs, and rank 0's sealing (manifest, trainer.json, rename, `latest`, pruning), the same code as a
synchronous save. So a checkpoint becomes visible exactly as before, only when complete and verified, and a kill
at any moment leaves at most a .tmp-* directory (the next save removes it).

- One write at a time: `wait` (called by the next save, by the loop at the end of the run and before a
  preemption stop) returns once the write in flight is done.
- A failed write is never silent: its thread logs the error at once (rank 0) and `wait` raises it, on every rank
  at the same point, since the ranks agreed on the failure inside the write: the loop's next sync point, where
  `failed` of any rank stops every rank (lm/core/loop.py _sync), else the next save or the end of the run.
- The write's collectives (which rank failed; DCP's planning for FSDP2) run on a gloo process group of their own,
  made once on every rank: collectives of two threads on one group could interleave in a different order on
  different ranks (a hang), and the loop's all-reduces keep running meanwhile.
"""

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("lm")


class BackgroundWrite:
    def __init__(self, is_main: bool):
        self.is_main = is_main
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._group = None
        self._made_group = False

    @property
    def group(self):
        """The process group of the writes' collectives (None: no process group, one rank). Made on first use:
        every rank calls save at the same step, so every rank makes it at the same point (a collective)."""
        if not self._made_group:
            import torch.distributed as dist

            if dist.is_initialized():
                self._group = dist.new_group(backend="gloo")
            self._made_group = True
        return self._group

    def start(self, write: Callable[[], None], name: str) -> None:
        """Run `write` in a background thread; the previous write must be done (wait)."""
        assert self._thread is None, "one checkpoint write at a time: wait() first"

        def run():
            try:
                write()
            except BaseException as e:  # noqa: BLE001 - raised again by wait(), in the loop's thread
                self._error = e
                if self.is_main:
                    log.error(
                        "checkpoint %s failed in the background (the run stops at its next sync point): %s",
                        name,
                        e,
                    )

        # daemon: a second Ctrl-C or an exception ends the process without joining a write (at worst a .tmp-*
        # directory is left, as after a kill)
        self._thread = threading.Thread(target=run, name=f"lm-checkpoint-{name}", daemon=True)
        self._thread.start()

    def failed(self) -> bool:
        """Whether the last write ended with an error that wait() has not raised yet (a look, never a wait)."""
        return self._error is not None

    def wait(self) -> None:
        """Block until the write in flight (if any) is done; raise its error. Joins in short slices, so signals
        (a stop request, a second Ctrl-C) are still handled meanwhile."""
        if self._thread is None:
            return
        while self._thread.is_alive():
            self._thread.join(0.1)
        self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error
