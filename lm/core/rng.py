"""A rank's random state and loader state as tensors and plain Python types, so a checkpoint's rank*.pt (and a
finetune's results file) loads with torch.load(weights_only=True)."""

import random

import numpy as np
import torch


def rng_state() -> dict:
    legacy = np.random.get_state()
    assert isinstance(legacy, tuple)  # the global RandomState (MT19937) always gives the legacy tuple
    kind, key, pos, has_gauss, gauss = legacy
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": kind,
            "key": torch.from_numpy(key.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(gauss),
        },
        "python": random.getstate(),
    }  # (version, tuple of ints, None)
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    if isinstance(n, dict):
        np.random.set_state(
            (n["kind"], n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
        )
    else:  # written before RNG states were tensors: numpy's own tuple
        np.random.set_state(n)
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def plain_state(state):
    """numpy scalars -> Python numbers, numpy arrays -> tensors (recursively): what weights_only loads."""
    if isinstance(state, dict):
        return {k: plain_state(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(plain_state(v) for v in state)
    if isinstance(state, np.generic):
        return state.item()
    if isinstance(state, np.ndarray):
        return torch.from_numpy(state.copy())
    return state
