"""PyTorch-native data parallelism: DDP (replicated) and FSDP2 (`fully_shard`, sharded per Block)."""

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from lm.engine.base import Engine
from lm.engine.formats import DCP, check_dcp_metadata, check_grouping, group_sizes


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
        self.ddp = DistributedDataParallel(
            module,
            device_ids=ids,
            bucket_cap_mb=self.bucket_cap_mb,
            find_unused_parameters=self.find_unused_parameters,
            forward_sync_buffers=False,
        )
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
        self._stager = None  # DCP's stager of asynchronous saves (stage_state)
        if train.precision == "fp16":
            from lm.engine.dist import EngineError

            raise EngineError(
                "engine=fsdp2 with train.precision=fp16 is not supported (no sharded loss scaler "
                "here); use train.precision=bf16, or engine=zero3 for fp16 on a GPU"
            )

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
        from torch.distributed.fsdp import FSDPModule

        module = cast(FSDPModule, self.module)  # fully_shard (in _wrap) made it one

        @contextlib.contextmanager
        def sync_only_on_last():
            module.set_requires_gradient_sync(last)
            try:
                yield
            finally:
                module.set_requires_gradient_sync(True)

        return sync_only_on_last()

    def _grad_average_factor(self) -> float:
        return float(self.world_size)

    def _clip(self, max_norm: float) -> torch.Tensor:
        params = [p for p in self.module.parameters() if p.grad is not None]
        from torch.distributed.tensor import DTensor

        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        return norm.full_tensor() if isinstance(norm, DTensor) else norm  # the global norm, on every rank

    def save_state(self, path: Path) -> None:
        """torch.distributed.checkpoint under `path`/dcp: every rank writes its own shards."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.module, self.optimizer)
        # dcp.save/load: documented API that torch re-exports without __all__ (pyright then calls it private)
        save = dcp.save  # pyright: ignore[reportPrivateImportUsage]
        save({"model": model_sd, "optim": optim_sd}, checkpoint_id=Path(path) / DCP)

    def stage_state(self, path: Path, group=None) -> Callable[[], None]:
        """DCP's async_save: each rank's shards copied to CPU now (its default stager), written by DCP's own
        thread, whose collectives run on `group` (a gloo group of their own: lm/core/async_save.py), never on
        the group FSDP2's all-gathers use. The returned function waits for that write."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        if self._stager is None:  # kept: its CPU storages are reused by the next snapshot
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            self._stager = DefaultStager(
                StagingOptions(
                    use_pinned_memory=self.device.type == "cuda",
                    use_shared_memory=False,
                    use_async_staging=False,
                    use_non_blocking_copy=False,
                )
            )
        model_sd, optim_sd = get_state_dict(self.module, self.optimizer)
        # async_save: documented API that torch re-exports without __all__ (pyright then calls it private)
        async_save = dcp.async_save  # pyright: ignore[reportPrivateImportUsage]
        pending = async_save(
            {"model": model_sd, "optim": optim_sd},
            checkpoint_id=Path(path) / DCP,
            process_group=group,
            async_stager=self._stager,
        )
        upload: Any = getattr(pending, "upload_completion", pending)  # a Future, or an AsyncSaveResponse holding it
        return lambda: upload.result()

    def load_state(self, path: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        model_sd, optim_sd = get_state_dict(self.module, self.optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        check_dcp_metadata(Path(path) / DCP)
        load = dcp.load  # pyright: ignore[reportPrivateImportUsage] - as in save_state
        load(state, checkpoint_id=Path(path) / DCP)
        # DCP has put the saved param_groups (lists of names) in place of this run's: set_state_dict would take
        # another grouping without a word, and the first step fail with KeyError 'betas'
        check_grouping(path, group_sizes(state["optim"]), self.group_sizes())
        set_state_dict(self.module, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])

    def load_resharded(self, path: Path, saved: dict) -> None:
        """Another world size: DCP reshards its own shards onto this mesh (load_state); single/DDP's full
        model_optim.pt is sharded by set_state_dict (lm/engine/reshard.py); ZeRO's partitions: Engine's."""
        import lm.engine.reshard as reshard

        if saved["format"] == "dcp":
            self.load_state(path)
        elif saved["format"] == "torch":
            groups = reshard.group_names(self.module, self.optimizer)
            reshard.set_full_state(path, self.module, self.optimizer, reshard.full_from_torch_file(path, groups))
        else:
            super().load_resharded(path, saved)

    @classmethod
    def consolidated_state_dict(cls, path: Path, info: dict) -> dict[str, torch.Tensor]:
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
        from torch.distributed.tensor import DTensor

        return sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in self.module.parameters())

    def close(self) -> None:
        if self._stager is not None:
            self._stager.close()
            self._stager = None
