"""cpu_copy: a snapshot of a state dict in CPU memory, for an asynchronous checkpoint write (lm/core/async_save.py).

The training loop goes on updating the weights and moments in place while a background thread writes the
snapshot, so every tensor is copied now. The copy has the original's structure exactly, so torch.save writes the
same bytes for it as for the live state dict (tests/test_checkpoint_async.py compares them): tensors that share a
storage (tied embeddings: the token table and the output layer are one Parameter under two names) share one
copied storage, an object reached twice (the optimizer's param groups share one `betas` tuple) is copied once,
and a module state dict's `_metadata` (each submodule's version, read by load_state_dict) is kept.
"""

import copy
from typing import Any, Dict

import torch


@torch.no_grad()
def cpu_copy(obj: Any) -> Any:
    """A deep copy of `obj` (dicts, lists, tuples, tensors, plain values) whose tensors live in fresh CPU storages."""
    return _copy(obj, {}, {})


def _copy(obj: Any, memo: Dict[int, Any], storages: Dict) -> Any:
    if id(obj) in memo:
        return memo[id(obj)]
    if isinstance(obj, torch.Tensor):
        out = _copy_tensor(obj, storages)
    elif isinstance(obj, dict):
        out = type(obj)((k, _copy(v, memo, storages)) for k, v in obj.items())
        if getattr(obj, "__dict__", None):  # an OrderedDict state dict's `_metadata`
            out.__dict__.update(copy.deepcopy(obj.__dict__))
    elif isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        out = type(obj)(_copy(v, memo, storages) for v in obj)
    else:
        return obj  # numbers, strings, None, named tuples of them: immutable
    memo[id(obj)] = out
    return out


def _copy_tensor(t: torch.Tensor, storages: Dict) -> torch.Tensor:
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
        storages[key] = torch.empty(storage.nbytes(), dtype=torch.uint8).copy_(source).untyped_storage()
    out = torch.empty(0, dtype=t.dtype)
    return out.set_(storages[key], t.storage_offset(), t.size(), t.stride())
