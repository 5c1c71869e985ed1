"""cpu_copy: a snapshot of a state dict in CPU memory, for an asynchronous checkpoint write (lm/core/async_save.py).

The training loop goes on updating the weights and moments in place while a background thread writes the
snapshot, so every tensor is copied now. The copy has the original's structure exactly, so torch.save writes the
same bytes for it as for the live state dict (tests/test_checkpoint_async.py compares them): tensors that share a
storage (tied embeddings: the token table and the output layer are one Parameter under two names) share one
copied storage, an object reached twice (the optimizer's param groups share one `betas` tuple) is copied once,
and a module state dict's `_metadata` (each submodule's version, read by load_state_dict) is kept.

`buffers` (the engine's, kept between saves) lends the previous snapshot's CPU storages to the next one: a
checkpoint copies into memory already mapped instead of faulting in fresh pages for the whole state each time.
Safe because a snapshot is only taken once the previous write is done (one write in flight).
"""

import copy
from typing import Any

import torch


@torch.no_grad()
def cpu_copy(obj: Any, buffers: dict | None = None) -> Any:
    """A deep copy of `obj` (dicts, lists, tuples, tensors, plain values) whose tensors live in CPU storages of
    their own: fresh ones, or those `buffers` holds from the previous copy (then refilled with this copy's)."""
    storages: dict = {}
    out = _copy(obj, {}, storages, buffers if buffers is not None else {})
    if buffers is not None:
        buffers.clear()
        buffers.update(storages)
    return out


def _copy(obj: Any, memo: dict[int, Any], storages: dict, buffers: dict) -> Any:
    if id(obj) in memo:
        return memo[id(obj)]
    if isinstance(obj, torch.Tensor):
        out = _copy_tensor(obj, storages, buffers)
    elif isinstance(obj, dict):
        out = type(obj)((k, _copy(v, memo, storages, buffers)) for k, v in obj.items())
        if getattr(obj, "__dict__", None):  # an OrderedDict state dict's `_metadata`
            out.__dict__.update(copy.deepcopy(obj.__dict__))
    elif isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        out = type(obj)(_copy(v, memo, storages, buffers) for v in obj)
    else:
        return obj  # numbers, strings, None, named tuples of them: immutable
    memo[id(obj)] = out
    return out


def _copy_tensor(t: torch.Tensor, storages: dict, buffers: dict) -> torch.Tensor:
    if type(t) is not torch.Tensor:  # a Parameter: its data (DTensors are FSDP2's, staged by DCP itself)
        t = t.detach()
        if type(t) is not torch.Tensor:
            raise TypeError(f"cpu_copy cannot snapshot a {type(t).__name__}; the engine must stage it itself")
    storage = t.untyped_storage()
    # one key per storage, whichever view of it this is (an empty storage has no address: copied alone)
    key = (str(storage.device), storage.data_ptr() if storage.nbytes() else -id(t))
    if key not in storages:
        # as byte tensors: Tensor.copy_ takes torch's fast copy kernels, UntypedStorage.copy_ a slow generic path
        source = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
        lent = buffers.get(key)
        if lent is not None and lent.nbytes() == storage.nbytes():
            target = torch.empty(0, dtype=torch.uint8).set_(lent)
        else:  # pinned host memory when copying from a GPU: the copy runs at the bus's speed
            target = torch.empty(storage.nbytes(), dtype=torch.uint8, pin_memory=storage.device.type == "cuda")
        storages[key] = target.copy_(source).untyped_storage()
    out = torch.empty(0, dtype=t.dtype)
    return out.set_(storages[key], t.storage_offset(), t.size(), t.stride())
