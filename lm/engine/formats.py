"""The checkpoint files each engine writes, and the safe readers of DCP's metadata and DeepSpeed's files: shared by
the engines (lm/engine/base.py, torch_engines.py, ds.py) and by elastic resume (reshard.py, ds_reshard.py), which
reads any of them."""

import contextlib
import pickle
from pathlib import Path

import torch

from lm.engine.dist import EngineError

MODEL_OPTIM = "model_optim.pt"  # the single/DDP checkpoint file (rank 0 writes it)
DCP = "dcp"  # sub-directory of an FSDP2 checkpoint: torch.distributed.checkpoint shards, one file per rank
TAG = "deepspeed"  # sub-directory of a ZeRO checkpoint that holds DeepSpeed's files


class _DCPMetadataUnpickler(pickle.Unpickler):
    """DCP reads its .metadata with plain pickle.load, which runs whatever the file names; this reader
    admits only the classes DCP's metadata is made of (checked before DCP reads it)."""

    def find_class(self, module: str, name: str):
        plain = {
            ("torch", "Size"),
            ("torch.serialization", "_get_layout"),
            ("collections", "OrderedDict"),
            ("pathlib", "PosixPath"),
            ("pathlib", "PurePosixPath"),
            ("pathlib", "WindowsPath"),
            ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        }
        if (
            module == "torch.distributed.checkpoint.metadata"
            or (module, name) in plain
            or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))
        ):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"Unsupported global: {module}.{name} is not part of DCP's metadata")


def check_dcp_metadata(dcp_dir: Path) -> None:
    """Raise pickle.UnpicklingError if `dcp_dir`/.metadata names anything but DCP's metadata classes."""
    with open(Path(dcp_dir) / ".metadata", "rb") as f:
        _DCPMetadataUnpickler(f).load()


def group_sizes(optimizer_state: dict) -> list[int]:
    """The parameter count of each group of an optimizer state_dict (its param_groups' params lists)."""
    return [len(g["params"]) for g in optimizer_state["param_groups"]]


def check_grouping(path: Path, sizes: list[int], own: list[int]) -> None:
    """Refuse a checkpoint whose optimizer state holds the parameters in groups other than this run's: `sizes` is
    the parameter count of each group it saved, `own` this run's optimizer's. Decided from the saved structure before
    the optimizer reads it, not from what loading it does, which differs by engine and is no clear refusal: torch's
    load_state_dict raises a ValueError (single/DDP, DeepSpeed stage 0), FSDP2's set_state_dict loads and the first
    step fails with KeyError 'betas', ZeRO-1/2 blames its parameter alignment setting, ZeRO-3 a tensor size. The
    one refusal for every engine's resume: lm/engine/base.py, torch_engines.py (FSDP2), ds.py, reshard.py (elastic).
    Sizes, not members, because single/DDP's model_optim.pt (torch's Optimizer.state_dict) numbers the parameters
    0..n-1 in group order and so records how many each group holds, never which (FSDP2's DCP files, ZeRO's
    param_shapes and stage 0's group_names.json do name them, but a comparison of names there alone would refuse
    on three engines what the default one takes), and lm's two groups are decayed matrices and the rest, so a rule
    that moves parameters one way between them (the weight decay rule's change, optim.decay_embeddings) changes
    both sizes."""
    if sizes == own:
        return
    raise EngineError(
        f"{path}: its optimizer state groups the parameters otherwise than this run's AdamW; it groups its "
        f"{sum(sizes)} parameters as {sizes}, this run's as {own}: it was written under another weight decay rule "
        f"(since 2026-11-30 weight decay covers every matrix but the embedding tables, before that the Linear "
        f"weights only, so a zoo model's other matrices, such as an RNN's or a synthesizer's, moved group). Resume "
        f"it with the lm version that wrote it, or start a new run_dir"
    )


@contextlib.contextmanager
def weights_only_loads():
    """DeepSpeed's readers call torch.load(..., weights_only=False), which runs whatever a checkpoint's
    pickle says; while they read ours, force weights_only=True and allow only the plain types DeepSpeed
    stores besides tensors (a crafted file then fails with pickle.UnpicklingError instead)."""
    from unittest import mock

    real = torch.load

    def load(*args, **kwargs):
        return real(*args, **{**kwargs, "weights_only": True})

    with mock.patch.object(torch, "load", load), torch.serialization.safe_globals(_ds_safe_globals()):
        yield


def _ds_safe_globals() -> list:
    """The non-tensor classes in DeepSpeed's optimizer-state files (plain data, no code on load)."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, ZeroStageEnum, fragment_address]
