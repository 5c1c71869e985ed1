"""DeepSpeed ZeRO stages 0-3 (Rajbhandari et al. 2020), optionally with CPU offload.

DeepSpeed's JSON is `ds_config(train, engine.config)`: the train.* values (batch sizes, accumulation,
clipping, precision) from the typed TrainConfig, plus the ZeRO options of conf/engine/zero*.yaml, which
must not repeat a train.* value. The optimizer is lm's torch AdamW (a client optimizer
compiles nothing); gradient accumulation boundaries are set by the loop's micro_step().
"""

import contextlib
import logging
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from lm.engine.base import Engine
from lm.engine.dist import EngineError

if TYPE_CHECKING:
    import deepspeed
    from deepspeed.runtime.base_optimizer import DeepSpeedOptimizer

TAG = "deepspeed"  # sub-directory of a checkpoint that holds DeepSpeed's files


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


def _prepare_deepspeed(shm_comm: bool) -> None:
    """Keep first use cheap: no shared-memory comm op compile (~50 s) unless asked, quiet logs."""
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.expanduser("~/.cache/lm/torch_extensions"))
    import importlib

    from deepspeed.utils import logger

    # import_module, not `import deepspeed.comm.torch as m`: deepspeed.comm's attribute `torch` is torch itself.
    ds_torch_comm = importlib.import_module("deepspeed.comm.torch")

    if not shm_comm:
        ds_torch_comm.build_shm_op = lambda: None  # pyright: ignore[reportAttributeAccessIssue] - ModuleType
    logger.setLevel(logging.WARNING)


def ds_config(train, world_size: int, options: dict) -> dict:
    """DeepSpeed's JSON: what train.* decides, plus `options` (engine.config), which may not repeat it."""
    from_train = {
        "train_batch_size": train.micro_batch_size * train.grad_accum * world_size,
        "train_micro_batch_size_per_gpu": train.micro_batch_size,
        "gradient_accumulation_steps": train.grad_accum,
        "gradient_clipping": train.grad_clip,
        "bf16": {"enabled": train.precision == "bf16"},
        "fp16": {"enabled": train.precision == "fp16", "loss_scale": 0, "initial_scale_power": 16},  # dynamic
    }
    repeated = sorted(set(from_train) & set(options))
    if repeated:
        raise EngineError(
            f"engine.config sets {repeated}, which lm derives from train.* (micro_batch_size, "
            f"grad_accum/global_batch_size, grad_clip, precision); set those train.* fields instead"
        )
    if options.get("optimizer") or options.get("scheduler"):
        raise EngineError(
            "engine.config has an optimizer/scheduler section; lm builds AdamW (optim=...) "
            "and sets the learning rate each step (sched=...): remove the section"
        )
    return {**from_train, **options}


class DeepSpeedEngine(Engine):
    format = "deepspeed"
    needs_process_group = True
    # DeepSpeed's step applies whatever gradients it holds (its fp16 overflow check aside): the loop reads
    # each step's loss on the host before calling step() (one sync per step).
    skips_nonfinite_updates = False
    # DeepSpeed's save_checkpoint writes synchronously (its asynchronous writers need Nebula or a newer
    # DeepSpeed's decoupled engine): train.async_checkpoint=true is refused (lm/core/setup.py).
    writes_async = False
    model: "deepspeed.DeepSpeedEngine"  # what deepspeed.initialize returns (an nn.Module with its own step)
    # DeepSpeed's wrapper of lm's AdamW (a ZeRO optimizer, not a torch Optimizer); it has param_groups (set_lr)
    optimizer: "torch.optim.Optimizer | DeepSpeedOptimizer"

    def __init__(self, train, dist, config: dict, shm_comm: bool = False, cpu_adam: bool = False):
        super().__init__(train, dist)
        self.config = ds_config(train, dist.world_size, dict(config))
        self.shm_comm = shm_comm
        self.cpu_adam = cpu_adam
        self.stage = int(self.config.get("zero_optimization", {}).get("stage", 0))

    def check_launch(self) -> None:
        pass

    def wrap(self, model: nn.Module, make_optimizer) -> "DeepSpeedEngine":
        _prepare_deepspeed(self.shm_comm)
        import deepspeed

        optimizer = make_optimizer(model)
        if self.cpu_adam:
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            group = optimizer.defaults
            optimizer = DeepSpeedCPUAdam(
                optimizer.param_groups, lr=group["lr"], betas=group["betas"], eps=group["eps"], adamw_mode=True
            )
        engine, ds_optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=self.config, dist_init_required=False
        )
        assert ds_optimizer is not None  # Optional only when no optimizer is given; we gave one
        self.model, self.optimizer = engine, ds_optimizer
        self.module = cast(nn.Module, engine.module)  # typed Tensor | Module by nn.Module.__getattr__
        if self.train.compile:
            self.model.compile()
        return self

    def autocast(self):
        return contextlib.nullcontext()  # DeepSpeed keeps bf16/fp16 weights itself (config bf16/fp16)

    def micro_step(self, last: bool):
        # DeepSpeed reduces (and for ZeRO-2/3 partitions) gradients only at the boundary.
        self.model.set_gradient_accumulation_boundary(last)
        return contextlib.nullcontext()

    def backward(self, share: torch.Tensor) -> None:
        # DeepSpeed averages over ranks; we already weighted the micro-batches ourselves.
        self.model.backward(share * self.world_size, scale_wrt_gas=False)

    def step(self) -> torch.Tensor:
        self.model.step()
        norm = self.model.get_global_grad_norm()
        return torch.as_tensor(math.nan if norm is None else norm)

    def skip_step(self) -> None:
        raise EngineError(
            "train.on_nonfinite=skip is not supported with DeepSpeed engines (their gradient "
            "partitions cannot be dropped from outside); use train.on_nonfinite=stop"
        )

    def save_state(self, path: Path) -> None:
        """DeepSpeed's own files under `path`/deepspeed: model states, optimizer partitions per rank."""
        self.model.save_checkpoint(str(path), tag=TAG, save_latest=False)

    def load_state(self, path: Path) -> None:
        with weights_only_loads():
            load_path, _ = self.model.load_checkpoint(
                str(path), tag=TAG, load_optimizer_states=True, load_lr_scheduler_states=False, load_module_strict=True
            )
        if load_path is None:
            raise EngineError(f"DeepSpeed found no checkpoint under {path}/{TAG}")

    def load_resharded(self, path: Path, saved: dict) -> None:
        """Refused: DeepSpeed reloads its optimizer partitions only on the world size that wrote them (its own
        check), and lm has no converter between its files and the torch engines' yet (docs/training.md).

        The path chosen for later is DeepSpeed's universal checkpoint (deepspeed.checkpoint.ds_to_universal,
        then `checkpoint.load_universal`), not consolidate-and-reshard: it is DeepSpeed's maintained converter
        of the fp32 master partitions *and* both Adam moments for stages 1-3, while zero_to_fp32 consolidates
        the weights only (a resume from it would drop the moments without a word), and its per-parameter files
        are what a converter to and from the torch engines' full state (lm/engine/reshard.py) would read. Not
        wired in yet: the conversion needs `universal_checkpoint_info` in the saved client state (or its
        inject option), an offline multi-process pass over every rank's files, and load_universal set in the
        JSON before deepspeed.initialize."""
        import lm.engine.reshard as reshard

        if saved["format"] == "deepspeed":
            why = (
                f"DeepSpeed reloads ZeRO partitions only on the world size that wrote them; resume on "
                f"{saved['world_size']} rank(s), or start a new run_dir from the weights (lm export {path})"
            )
        else:
            why = (
                f"lm cannot convert {saved['engine']}'s files into DeepSpeed's; resume with "
                f"engine=single|ddp|fsdp2, or start a new run_dir from the weights (lm export {path})"
            )
        raise reshard.refuse(path, saved, f"{self.name} (ZeRO-{self.stage}) on {self.world_size} rank(s)", why)

    @classmethod
    def consolidated_state_dict(cls, path: Path, info: dict) -> dict[str, torch.Tensor]:
        """Stage 0: rank 0's module states; ZeRO-1/2/3: DeepSpeed's zero_to_fp32 merges the partitions."""
        with weights_only_loads():
            if info.get("zero_stage", 0) == 0:
                return torch.load(Path(path) / TAG / "mp_rank_00_model_states.pt", map_location="cpu")["module"]
            from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

            state = get_fp32_state_dict_from_zero_checkpoint(str(path), tag=TAG)
            if state is None:  # upstream is unannotated; its inferred type admits None
                raise EngineError(f"DeepSpeed's zero_to_fp32 found no ZeRO partitions under {path}/{TAG}")
            return state

    def describe(self):
        return {**super().describe(), "zero_stage": self.stage}

    def local_numel(self) -> int:
        if self.stage == 3:
            # ZeRO-3 hangs each rank's partition on its Parameter as ds_tensor, which torch's stub cannot know
            parts = [p.ds_tensor for p in self.module.parameters()]  # pyright: ignore[reportAttributeAccessIssue]
            return sum(part.numel() for part in parts)
        return super().local_numel()
