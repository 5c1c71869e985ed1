"""The checkpoint files the torch-native engines write, and the safe reader of DCP's metadata: shared by the
engines (lm/engine/base.py, torch_engines.py) and by elastic resume (reshard.py), which reads either."""

import pickle
from pathlib import Path

import torch

MODEL_OPTIM = "model_optim.pt"  # the single/DDP checkpoint file (rank 0 writes it)
DCP = "dcp"  # sub-directory of an FSDP2 checkpoint: torch.distributed.checkpoint shards, one file per rank


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
