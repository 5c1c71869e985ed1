"""Process-group setup, launcher detection and the world-size guard.

Every launcher (torchrun, `accelerate launch --multi_gpu`, the `deepspeed` launcher) exports RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; we read those, never a launcher's API, and
then assert that the process group really has that many ranks (accelerate can
silently run one unsynchronised process per rank, or one process instead of N).
"""

import ctypes
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist


class EngineError(RuntimeError):
    """The engine cannot run as configured or launched; the message says why and what to do."""


@dataclass
class Dist:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_world_size() -> int:
    """How many processes the launcher started, by its environment (1 without a launcher)."""
    if "WORLD_SIZE" in os.environ:
        return int(os.environ["WORLD_SIZE"])
    asked = _accelerate_simple_launcher_processes()
    if asked > 1:
        raise EngineError(
            f"`accelerate launch --num_processes {asked}` without --multi_gpu started ONE process here "
            f"(accelerate's simple launcher on CPU). Launch with `accelerate launch --multi_gpu "
            f"--num_processes {asked} ...` (it runs torchrun; lm uses gloo on CPU) "
            f"or `torchrun --nproc_per_node {asked}`"
        )
    return 1


def _accelerate_simple_launcher_processes() -> int:
    """--num_processes of a parent `accelerate launch` that exported no WORLD_SIZE (Linux only)."""
    try:
        argv = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return 0
    if not any(a.endswith("accelerate") for a in argv[:2]) or "launch" not in argv:
        return 0
    for i, a in enumerate(argv):
        if a.replace("-", "_") == "__num_processes" and i + 1 < len(argv) and argv[i + 1].isdigit():
            return int(argv[i + 1])
        if a.replace("-", "_").startswith("__num_processes="):
            return int(a.split("=", 1)[1])
    return 0


def stop_with_torchrun() -> None:
    """Have Linux send this rank SIGTERM when the torchrun that started it dies. torchrun passes its own SIGTERM
    or Ctrl-C on to its ranks, but a SIGKILL (kill -9, the OOM killer) leaves them training on without it;
    SIGTERM stops them as a preemption does (a checkpoint after the step in flight, lm/core/loop.py).

    Only in the process torchrun (or `accelerate launch`, which runs it) started: torch starts each rank as a
    session leader, which a process the rank starts in turn is not. The signal follows the thread that started
    the process, which in torch's agent is its main thread. A torchrun killed before this call goes unnoticed."""
    if sys.platform != "linux" or "TORCHELASTIC_RUN_ID" not in os.environ or os.getsid(0) != os.getpid():
        return
    pr_set_pdeathsig = 1  # <linux/prctl.h>
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)


def pick_device(preference: str = "auto") -> torch.device:
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if preference == "cuda" and not torch.cuda.is_available():
        raise EngineError("train.device=cuda but no CUDA device is visible; use train.device=auto or cpu")
    if preference in ("auto", "cuda") and torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def computes_bf16(device: torch.device) -> bool:
    """Whether the device has bf16 arithmetic: a CUDA GPU that supports it, or a CPU with AVX512-BF16 or AMX.
    Elsewhere torch emulates bf16 through fp32 conversions, and autocast runs several times slower than fp32."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)  # a V100 emulates it too
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # torch.cpu's own (private) probes
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def init(device: torch.device, need_group: bool = False, expected: int | None = None) -> Dist:
    """Join the launcher's process group (or make a 1-rank one when the engine needs a group).

    `expected` (train.world_size) is what the user meant to launch; a mismatch is an error.
    """
    world = launched_world_size()
    if expected is not None and expected != world:
        raise EngineError(
            f"train.world_size={expected} but the launcher started {world} process(es); "
            f"launch {expected} (torchrun --nproc_per_node {expected}) or drop train.world_size"
        )
    if not dist.is_initialized() and (world > 1 or need_group):
        backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
        if world > 1:
            dist.init_process_group(backend)
        else:  # one rank needs no rendezvous: an in-memory store, no port
            # HashStore: documented API that torch re-exports without __all__ (pyright then calls it private)
            store = dist.HashStore()  # pyright: ignore[reportPrivateImportUsage]
            dist.init_process_group(backend, store=store, rank=0, world_size=1)
    actual = dist.get_world_size() if dist.is_initialized() else 1
    if actual != world:
        raise EngineError(
            f"the process group has {actual} rank(s) but the launcher started {world}; "
            f"refusing to train unsynchronised (check MASTER_ADDR/MASTER_PORT and the launcher)"
        )
    rank = dist.get_rank() if dist.is_initialized() else 0
    return Dist(rank=rank, world_size=world, local_rank=int(os.environ.get("LOCAL_RANK", 0)), device=device)


def barrier(group=None) -> None:
    """`group`: a process group of every rank (None: the default one; lm/core/async_save.py has its own)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier(group=group)


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


# How long the other ranks wait for one rank's work that takes as long as its input does (lm train preparing a corpus on
# first use: a 10B-token corpus is hours on a few cores). The default group's timeout (30 minutes for gloo) ended
# that wait with "Timed out waiting 1800000ms"; a rank that dies instead is seen by the launcher, which stops the rest.
PATIENT_TIMEOUT = timedelta(days=7)


@contextmanager
def patient_group(timeout: timedelta = PATIENT_TIMEOUT) -> Iterator:
    """A gloo group of every rank whose collectives wait up to `timeout` while the block runs (None: one rank, no
    group). Making it is a collective: every rank enters the block at the same point."""
    group = (
        dist.new_group(backend="gloo", timeout=timeout) if dist.is_initialized() and dist.get_world_size() > 1 else None
    )
    try:
        yield group
    finally:
        if isinstance(group, dist.ProcessGroup):  # new_group's type also admits a rank outside it; every rank is in
            dist.destroy_process_group(group)


def any_rank(flag: bool, group=None) -> bool:
    """True on every rank when `flag` is true on some rank (used to fail together, not hang)."""
    t = torch.tensor([1.0 if flag else 0.0])
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return bool(t.item())


def broadcast_object(obj):
    """rank 0's `obj` on every rank."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def shutdown() -> None:
    """Destroy the process group: without it rank 0 may abort at exit (gloo races on teardown)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def exit_after_success() -> None:
    """End a finished multi-process run without the interpreter's teardown.

    Every file is closed and the process group destroyed by now; what is left are C++ destructors of
    communication objects that wrappers (DDP, DeepSpeed) still reference, run in arbitrary order at
    interpreter exit. There gloo's worker threads have been seen to abort the process ("terminate called
    without an active exception", SIGABRT) after the run completed, which launchers report as a failed job.
    """
    if launched_world_size() > 1:
        import logging
        import sys

        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
