"""PyTorch-native data parallelism: DDP (replicated) and FSDP2 (`fully_shard`, sharded per Block)."""

import contextlib
import pickle
from pathlib import Path
from typing import Dict

import torch
from torch import nn

from lm.engine.base import Engine

DCP = "dcp"  # sub-directory of an FSDP2 checkpoint: torch.distributed.checkpoint shards, one file per rank


class _DCPMetadataUnpickler(pickle.Unpickler):
    """DCP reads its .metadata with plain pickle.load, which runs whatever the file names; this reader
    admits only the classes DCP's metadata is made of (checked before DCP reads it)."""

    def find_class(self, module: str, name: str):
        plain = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
                 ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
                 ("torch.distributed.checkpoint.filesystem", "_StorageInfo")}
        if (module == "torch.distributed.checkpoint.metadata" or (module, name) in plain
                or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"Unsupported global: {module}.{name} is not part of DCP's metadata")


def check_dcp_metadata(dcp_dir: Path) -> None:
    """Raise pickle.UnpicklingError if `dcp_dir`/.metadata names anything but DCP's metadata classes."""
    with open(Path(dcp_dir) / ".metadata", "rb") as f:
        _DCPMetadataUnpickler(f).load()


class DDPEngine(Engine):
    """DistributedDataParallel: gradients all-reduced (averaged) in buckets during backward."""

    needs_process_group = True

    def __init__(self, train, dist, bucket_cap_mb: int = 25, find_unused_parameters: bool = False):
        super().__init__(train, dist)
        self.bucket_cap_mb = bucket_cap_mb
        self.find_unused_parameters = find_unused_parameters

    def check_launch(self) -> None:
        pass  # any world size; one rank is plain training with a no-op all-reduce

    def _wrap(self, module: nn.Module) -> nn.Module:
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == "cuda" else None
        # forward_sync_buffers=False: DDP would otherwise broadcast every buffer from rank 0 before each
        # forward (a collective per micro-batch); ours are constants built from the config (RoPE frequencies,
        # sinusoid tables), equal on every rank, and DDP still syncs them once at construction.
        self.ddp = DistributedDataParallel(module, device_ids=ids, bucket_cap_mb=self.bucket_cap_mb,
                                           find_unused_parameters=self.find_unused_parameters,
                                           forward_sync_buffers=False)
        return self.ddp

    def _no_sync(self):
        return self.ddp.no_sync()

    def _grad_average_factor(self) -> float:
        return float(self.world_size)


class FSDP2Engine(Engine):
    """FSDP2 (Zhao et al. 2023; torch `fully_shard`): each Block is one all-gather/reduce-scatter unit.

    Mixed precision is FSDP's own policy (compute in bf16/fp16, reduce gradients in fp32), not autocast.
    Checkpoints go through torch.distributed.checkpoint: one shard file per rank.
    """

    format = "dcp"
    needs_process_group = True

    def __init__(self, train, dist, reshard_after_forward: bool = True):
        super().__init__(train, dist)
        self.reshard_after_forward = reshard_after_forward
        if train.precision == "fp16":
            from lm.engine.dist import EngineError

            raise EngineError("engine=fsdp2 with train.precision=fp16 is not supported (no sharded loss scaler "
                              "here); use train.precision=bf16, or engine=zero3 for fp16")

    def check_launch(self) -> None:
        pass

    def _wrap(self, module: nn.Module) -> nn.Module:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        from lm.model import Block

        mesh = init_device_mesh(self.device.type, (self.world_size,))
        mp = MixedPrecisionPolicy(param_dtype=self.dtype, reduce_dtype=torch.float32)
        for block in [m for m in module.modules() if isinstance(m, Block)]:
            fully_shard(block, mesh=mesh, reshard_after_forward=self.reshard_after_forward, mp_policy=mp)
        fully_shard(module, mesh=mesh, reshard_after_forward=self.reshard_after_forward, mp_policy=mp)
        return module

    def autocast(self):
        return contextlib.nullcontext()  # the MixedPrecisionPolicy casts parameters instead

    def micro_step(self, last: bool):
        @contextlib.contextmanager
        def sync_only_on_last():
            self.module.set_requires_gradient_sync(last)
            try:
                yield
            finally:
                self.module.set_requires_gradient_sync(True)
        return sync_only_on_last()

    def _grad_average_factor(self) -> float:
        return float(self.world_size)

    def _clip(self, max_norm: float) -> torch.Tensor:
        params = [p for p in self.module.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # the global norm, on every rank

    def save_state(self, path: Path) -> None:
        """torch.distributed.checkpoint under `path`/dcp: every rank writes its own shards."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.module, self.optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=Path(path) / DCP)

    def load_state(self, path: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        model_sd, optim_sd = get_state_dict(self.module, self.optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        check_dcp_metadata(Path(path) / DCP)
        dcp.load(state, checkpoint_id=Path(path) / DCP)
        set_state_dict(self.module, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])

    def load_resharded(self, path: Path, saved: Dict) -> None:
        """Another world size: DCP reshards its own shards onto this mesh (load_state); single/DDP's full
        model_optim.pt is sharded by set_state_dict (lm/engine/reshard.py)."""
        from lm.engine import reshard

        if saved["format"] == "dcp":
            self.load_state(path)
        elif saved["format"] == "torch":
            reshard.set_full_state(self.module, self.optimizer,
                                   reshard.full_from_torch_file(path, self.module, self.optimizer))
        else:
            super().load_resharded(path, saved)

    @classmethod
    def consolidated_state_dict(cls, path: Path, info: Dict) -> Dict[str, torch.Tensor]:
        """DCP's offline conversion (any world size, no process group) to a torch.save file, read back."""
        import tempfile

        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        # A private scratch file: several processes (the ranks of a finetuning job) may consolidate the
        # same checkpoint at once.
        with tempfile.TemporaryDirectory(prefix="lm-consolidate-") as scratch:
            out = Path(scratch) / "consolidated.pt"
            check_dcp_metadata(Path(path) / DCP)
            dcp_to_torch_save(Path(path) / DCP, out)
            return torch.load(out, map_location="cpu", weights_only=True)["model"]

    def local_numel(self) -> int:
        return sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in self.module.parameters())
