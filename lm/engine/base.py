"""The engine interface the loop is written against, and the single-process engine.

    engine.wrap(model, make_optimizer)       # shard/wrap first, then build the optimizer on what is left
    with engine.micro_step(last=i == n - 1): # autocast; no gradient sync until the last micro-batch
        engine.backward(share)                # share = this micro-batch's part of the global loss sum
    grad_norm = engine.step()                 # unscale, clip, step (skipped if the norm is NaN/inf), zero grads
    engine.save_state(dir) / engine.load_state(dir)   # model + optimizer, in the engine's own format
    Engine.consolidated_state_dict(dir, info)          # offline: the full model state dict (lm export)

`backward` takes a term of the *global* sum (the loop weights each micro-batch by its share of the
step's label tokens over all ranks), so engines that average gradients over ranks undo that here.

No host sync in `step`: the norm stays a device tensor, and a NaN/inf norm (the loop makes a NaN/inf
loss on any rank poison every gradient) skips the update on the device, through the `found_inf`
attribute that torch's fused AdamW reads (as torch.amp.GradScaler sets it; torch/optim/adam.py,
`_step_supports_amp_scaling`). An optimizer without it costs one host sync per step (the norm is read
to decide); DeepSpeed decides inside its own step, so the loop checks the loss first
(`skips_nonfinite_updates = False`, one sync per step).
"""

import contextlib
import math
from collections.abc import Callable
from pathlib import Path
from typing import cast

import torch
from torch import nn

import lm.engine.float8 as float8
from lm.engine.config import TrainSettings
from lm.engine.dist import Dist, EngineError
from lm.engine.formats import MODEL_OPTIM, check_grouping, group_sizes

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Engine:
    """Single process (also the base: precision, clipping, plain torch.save checkpoints)."""

    format = "torch"  # checkpoint layout, recorded in trainer.json: picks the class that reads it back
    needs_process_group = False
    skips_nonfinite_updates = True  # step() leaves the weights alone when the gradient norm is NaN/inf
    writes_async = True  # stage_state: a checkpoint written in the background (train.async_checkpoint)
    takes_float8 = True  # train.float8: wrap() swaps the Linears for torchao's before the engine wraps the model
    # Set by wrap(), which every user of an engine calls first.
    model: nn.Module  # what the loop calls (maybe wrapped or compiled)
    module: nn.Module  # the bare model (state dicts, export)
    optimizer: torch.optim.Optimizer

    def __init__(self, train: TrainSettings, dist: Dist):
        self.train = train
        self.dist = dist
        self.device = dist.device
        self.dtype = DTYPES[train.precision]
        self.scaler = None
        self._snapshot_buffers: dict = {}  # stage_state's CPU storages, reused by the next snapshot
        self.check_launch()
        if train.float8:
            if not self.takes_float8:  # first: no device or package would make this engine take float8
                raise EngineError(
                    f"train.float8=torchao swaps the model's Linears before the engine wraps it, and "
                    f"{type(self).__name__} keeps weights of its own: use engine=single, ddp or fsdp2, "
                    f"or {float8.OFF}"
                )
            float8.check(self.device)

    # -- identity
    @property
    def rank(self) -> int:
        return self.dist.rank

    @property
    def scales_loss(self) -> bool:
        """fp16's dynamic loss scaling is on (here and in DeepSpeed): a NaN/inf gradient norm with a finite loss
        is then an overflow that the scaler skips and answers by lowering the scale, not a divergence."""
        return self.train.precision == "fp16"

    @property
    def world_size(self) -> int:
        return self.dist.world_size

    @property
    def is_main(self) -> bool:
        return self.dist.is_main

    @property
    def name(self) -> str:
        return type(self).__name__

    def check_launch(self) -> None:
        if self.world_size != 1:
            raise EngineError(
                f"engine=single cannot use {self.world_size} processes (each would train alone); "
                f"pick engine=ddp, zero1, zero2, zero3 or fsdp2"
            )

    # -- setup
    def wrap(self, model: nn.Module, make_optimizer: Callable[[nn.Module], torch.optim.Optimizer]) -> "Engine":
        self.module = model.to(self.device)
        if self.train.float8:  # before DDP/FSDP2 wrap it and torch.compile traces it (torchao's order)
            self.module = float8.to_float8(self.module)
        self.model = self._wrap(self.module)
        self.optimizer = make_optimizer(self.module)
        if self.train.precision == "fp16":
            # Dynamic loss scaling (Micikevicius et al. 2018): fp16 gradients underflow without it.
            self.scaler = torch.amp.GradScaler(self.device.type)
        if self.train.compile:
            mode = str(self.train.compile_mode)
            self.model = cast(nn.Module, torch.compile(self.model, mode=mode))  # an OptimizedModule (stub: Callable)
        return self

    def _wrap(self, module: nn.Module) -> nn.Module:
        return module

    # -- one optimizer step
    def micro_step(self, last: bool):
        """Context for one micro-batch's forward and backward."""
        stack = contextlib.ExitStack()
        stack.enter_context(self.autocast())
        if not last:
            stack.enter_context(self._no_sync())
        return stack

    def autocast(self):
        """Mixed-precision context for a forward pass (training or validation)."""
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        stack.enter_context(torch.autocast(self.device.type, dtype=self.dtype))
        if self.device.type == "cpu":
            # torch's CPU flash-attention kernel runs its half-precision backward slower than its fp32 one, where
            # the math path's bf16 matmuls beat fp32 on a CPU with bf16 units.
            from torch.nn.attention import SDPBackend, sdpa_kernel

            stack.enter_context(sdpa_kernel([SDPBackend.MATH]))
        return stack

    def _no_sync(self):
        return contextlib.nullcontext()

    def _grad_average_factor(self) -> float:
        """Gradients get divided by this many ranks by the wrapper's reduction."""
        return 1.0

    def backward(self, share: torch.Tensor) -> None:
        loss = share * self._grad_average_factor()
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def step(self) -> torch.Tensor:
        """Clip, update, zero the gradients; returns the global gradient norm before clipping (a device
        tensor). NaN/inf gradients never reach the weights: the update is skipped when the norm is not finite."""
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        norm = self._clip(self.train.grad_clip or math.inf)
        if self.scaler:
            self.scaler.step(self.optimizer)  # skipped by the scaler when the gradients overflowed
            self.scaler.update()
        elif getattr(self.optimizer, "_step_supports_amp_scaling", False):  # fused AdamW: skip on the device
            # found_inf: read by torch's fused AdamW, undeclared on Optimizer (GradScaler sets it the same way)
            found_inf = (~torch.isfinite(norm)).float()  # 1.0: params, moments and step unchanged
            self.optimizer.found_inf = found_inf  # pyright: ignore[reportAttributeAccessIssue]
            try:
                self.optimizer.step()
            finally:
                del self.optimizer.found_inf  # pyright: ignore[reportAttributeAccessIssue]
        elif torch.isfinite(norm):  # an optimizer that cannot skip on the device: one host sync per step
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def _clip(self, max_norm: float) -> torch.Tensor:
        params = [p for p in self.module.parameters() if p.grad is not None]
        return torch.nn.utils.clip_grad_norm_(params, max_norm)

    def skip_step(self) -> torch.Tensor:
        """Drop this step's gradients without touching weights or optimizer state; returns a NaN norm."""
        self.optimizer.zero_grad(set_to_none=True)
        return torch.tensor(math.nan)

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    # -- checkpoints: each engine owns its on-disk format; lm.core.checkpoint owns the directory around it
    # (atomic rename, `latest`, trainer.json, per-rank RNG) and records `describe()` in trainer.json, whose
    # "format" picks the class that reads the files back (lm.engine.engine_for_format).
    def save_state(self, path: Path) -> None:
        """Model + optimizer (+ loss scaler) under directory `path`, which every rank can see."""
        if self.is_main:
            torch.save(self._state(), Path(path) / MODEL_OPTIM)

    def stage_state(self, path: Path, group=None) -> Callable[[], None]:
        """What save_state(path) writes, snapshotted now (lm/engine/staging.py: a CPU copy); returns the function
        that writes the snapshot, which a background thread calls while training goes on (lm/core/async_save.py).
        `group`: the process group for the write's own collectives (none here: rank 0 writes one file)."""
        if not self.is_main:
            return lambda: None
        from lm.engine.staging import cpu_copy

        state = cpu_copy(self._state(), self._snapshot_buffers)
        return lambda: torch.save(state, Path(path) / MODEL_OPTIM)

    def _state(self) -> dict:
        state = {"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict()}
        if self.scaler:
            state["scaler"] = self.scaler.state_dict()
        return state

    def load_state(self, path: Path) -> None:
        """Restore what save_state wrote (tensors and plain containers only: weights_only=True)."""
        state = torch.load(Path(path) / MODEL_OPTIM, map_location=self.device, weights_only=True)
        self.module.load_state_dict(state["model"])
        check_grouping(path, group_sizes(state["optimizer"]), self.group_sizes())
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])

    def group_sizes(self) -> list[int]:
        """The parameter count of each of this run's optimizer groups (lm.core.optim's weight decay rule)."""
        return [len(g["params"]) for g in self.optimizer.param_groups]

    def load_resharded(self, path: Path, saved: dict) -> None:
        """Restore a checkpoint written by another engine class or world size (`saved`: its trainer.json
        engine record), or raise EngineError saying why not. single/DDP: model_optim.pt is the full state
        whatever the world size; FSDP2's DCP shards and ZeRO's partitions are consolidated (lm/engine/reshard.py,
        lm/engine/ds_reshard.py)."""
        import lm.engine.reshard as reshard

        if saved["format"] == "torch":
            self.load_state(path)
        elif saved["format"] == "dcp":
            reshard.set_full_state(path, self.module, self.optimizer, reshard.full_from_dcp(Path(path) / "dcp"))
        else:
            import lm.engine.ds_reshard as ds_reshard

            why = ds_reshard.source_refusal(saved)
            if why is None and self.train.precision == "fp16":
                why = "fp16's dynamic loss scale stays in DeepSpeed's files; "
                why += f"resume with {reshard.engine_option(saved)} on {saved['world_size']} rank(s)"
            if why:
                raise reshard.refuse(path, saved, self.name, why)
            reshard.set_full_state(path, self.module, self.optimizer, ds_reshard.full_from_deepspeed(path))

    @classmethod
    def consolidated_state_dict(cls, path: Path, info: dict) -> dict[str, torch.Tensor]:
        """The full model state dict of checkpoint `path` in one process, no process group (lm export,
        lm finetune init=). `info` is the `describe()` this engine recorded in trainer.json."""
        return torch.load(Path(path) / MODEL_OPTIM, map_location="cpu", weights_only=True)["model"]

    def describe(self) -> dict:
        """What reading the checkpoint back needs: recorded in trainer.json."""
        return {"engine": self.name, "format": self.format, "world_size": self.world_size}

    # -- introspection (the run's log line, tests, benchmarks)
    def numel(self) -> int:
        """Parameter elements of the whole model, however the engine spreads them over ranks (FSDP2's DTensors
        count their global size)."""
        return sum(p.numel() for p in self.module.parameters())

    def local_numel(self) -> int:
        """Parameter elements stored on this rank."""
        return sum(p.numel() for p in self.module.parameters())

    def close(self) -> None:
        pass


SingleEngine = Engine
