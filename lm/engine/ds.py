"""DeepSpeed ZeRO stages 0-3 (Rajbhandari et al. 2020), optionally with CPU offload.

DeepSpeed's JSON is `ds_config(train, engine.config)`: the train.* values (batch sizes, accumulation,
clipping, precision) from the typed TrainConfig, plus the ZeRO options of conf/engine/zero*.yaml, which
must not repeat a train.* value. The optimizer is lm's torch AdamW (a client optimizer
compiles nothing); gradient accumulation boundaries are set by the loop's micro_step().
"""

import contextlib
import json
import logging
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from lm.engine.base import Engine
from lm.engine.dist import EngineError
from lm.engine.formats import DCP, TAG, check_grouping, group_sizes, weights_only_loads

if TYPE_CHECKING:
    import deepspeed
    from deepspeed.runtime.base_optimizer import DeepSpeedOptimizer

# Stage 0 in bf16/fp16 keeps the fp32 master weights in its optimizer's fp32_groups, numbered by group, not named:
# each group's parameter names, written beside DeepSpeed's files, let lm export read the masters, not the module's
# rounded copies.
GROUP_NAMES = "group_names.json"


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
    if getattr(train, "batch_ramp_steps", 0):
        raise EngineError(
            f"train.batch_ramp_steps={train.batch_ramp_steps}: DeepSpeed fixes gradient_accumulation_steps for "
            f"the whole run, so it cannot ramp the batch; use engine=ddp or engine=fsdp2, or train.batch_ramp_steps=0"
        )
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


def half_precision_refusal(precision: str, device: torch.device, shm_comm: bool) -> str | None:
    """Why DeepSpeed cannot train in `precision` on `device`, or None. DeepSpeed asks its accelerator only inside
    deepspeed.initialize, whose ValueError ("Type fp16 is not supported on your device", e.g. on most CPUs) would
    end the run in a traceback after the model is built; asked here, it is one line naming what runs instead."""
    if precision not in ("fp16", "bf16"):
        return None
    _prepare_deepspeed(shm_comm)
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    assert accelerator is not None  # typed Optional upstream; get_accelerator always sets one
    supported = accelerator.is_fp16_supported() if precision == "fp16" else accelerator.is_bf16_supported()
    if supported:
        return None
    other = "bf16" if precision == "fp16" else "fp16"
    return (
        f"train.precision={precision} with DeepSpeed: its {device.type} accelerator has no {precision} here; "
        f"use train.precision={other} or fp32, or engine=single|ddp (torch's autocast, which runs {precision} "
        f"on a {device.type} too)"
    )


class DeepSpeedEngine(Engine):
    format = "deepspeed"
    needs_process_group = True
    # DeepSpeed's step applies whatever gradients it holds (its fp16 overflow check aside): the loop reads
    # each step's loss on the host before calling step() (one sync per step).
    skips_nonfinite_updates = False
    # DeepSpeed's save_checkpoint writes synchronously (its asynchronous writers need Nebula or a newer
    # DeepSpeed's decoupled engine): train.async_checkpoint=true is refused (lm/core/setup.py).
    writes_async = False
    takes_float8 = False  # DeepSpeed keeps flat partitions of its own, not the model's (torchao's) Linears
    model: "deepspeed.DeepSpeedEngine"  # what deepspeed.initialize returns (an nn.Module with its own step)
    # DeepSpeed's wrapper of lm's AdamW (a ZeRO optimizer, not a torch Optimizer); it has param_groups (set_lr)
    optimizer: "torch.optim.Optimizer | DeepSpeedOptimizer"

    def __init__(self, train, dist, config: dict, shm_comm: bool = False, cpu_adam: bool = False):
        super().__init__(train, dist)
        self.config = ds_config(train, dist.world_size, dict(config))
        self.shm_comm = shm_comm
        self.cpu_adam = cpu_adam
        self.stage = int(self.config.get("zero_optimization", {}).get("stage", 0))
        why = half_precision_refusal(train.precision, dist.device, shm_comm)
        if why:
            raise EngineError(why)

    def check_launch(self) -> None:
        pass

    def wrap(self, model: nn.Module, make_optimizer) -> "DeepSpeedEngine":
        _prepare_deepspeed(self.shm_comm)
        import deepspeed

        import lm.engine.reshard as reshard

        optimizer = make_optimizer(model)
        # each param group's parameter names, for elastic resume from single/DDP's file (DeepSpeed's optimizer
        # wraps flat partitions, no longer the module's parameters)
        self.group_names = reshard.group_names(model, optimizer)
        if self.cpu_adam:
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            group = optimizer.defaults
            optimizer = DeepSpeedCPUAdam(
                optimizer.param_groups, lr=group["lr"], betas=group["betas"], eps=group["eps"], adamw_mode=True
            )
        # DeepSpeed asserts on LOCAL_RANK, which only launchers export: one process without one (a ZeRO run resumed
        # on 1 rank) has its 1-rank group already (lm.engine.dist.init)
        os.environ.setdefault("LOCAL_RANK", str(self.dist.local_rank))
        engine, ds_optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=self.config, dist_init_required=False
        )
        assert ds_optimizer is not None  # Optional only when no optimizer is given; we gave one
        self.model, self.optimizer = engine, ds_optimizer
        _undo_warmup_step(ds_optimizer, optimizer)  # optimizer: the AdamW DeepSpeed wraps
        self.module = cast(nn.Module, engine.module)  # typed Tensor | Module by nn.Module.__getattr__
        if self.train.compile:
            self.model.compile(compile_kwargs={"mode": str(self.train.compile_mode)})
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
        # ZeRO's optimizers and DeepSpeed's bf16/fp16 ones report the gradient norm of the step; stage 0 in fp32 steps
        # lm's AdamW itself and reports none (None, read as NaN: a divergence at step 1), so it is measured here,
        # before the step zeroes the gradients (all-reduced by now; DeepSpeed clips them itself).
        own = self._fp32_grad_norm() if self.stage == 0 and self.train.precision == "fp32" else None
        self.model.step()
        norm = self.model.get_global_grad_norm()
        if norm is None:
            norm = own
        return torch.as_tensor(math.nan if norm is None else norm)

    def _fp32_grad_norm(self) -> torch.Tensor:
        return torch.nn.utils.get_total_norm([p.grad for p in self.module.parameters() if p.grad is not None])

    def skip_step(self) -> None:
        raise EngineError(
            "train.on_nonfinite=skip is not supported with DeepSpeed engines (their gradient "
            "partitions cannot be dropped from outside); use train.on_nonfinite=stop"
        )

    def save_state(self, path: Path) -> None:
        """DeepSpeed's own files under `path`/deepspeed: model states, optimizer partitions per rank."""
        self.model.save_checkpoint(str(path), tag=TAG, save_latest=False)
        if self.stage == 0 and self.dist.is_main:
            (Path(path) / TAG / GROUP_NAMES).write_text(json.dumps(self.group_names))

    def group_sizes(self) -> list[int]:
        return [len(g) for g in self.group_names]  # lm's AdamW's groups (DeepSpeed's own hold flat partitions)

    def load_state(self, path: Path) -> None:
        sizes = _saved_group_sizes(Path(path) / TAG)
        if sizes is not None:  # checked first: loading another grouping fails in DeepSpeed's or torch's words
            check_grouping(path, sizes, self.group_sizes())
        with weights_only_loads():
            load_path, _ = self.model.load_checkpoint(
                str(path), tag=TAG, load_optimizer_states=True, load_lr_scheduler_states=False, load_module_strict=True
            )
        if load_path is None:
            raise EngineError(f"DeepSpeed found no checkpoint under {path}/{TAG}")

    def load_resharded(self, path: Path, saved: dict) -> None:
        """Another world size or engine (elastic resume): the checkpoint's full state (a ZeRO checkpoint's
        partitions merged, FSDP2's shards, single/DDP's file) partitioned into this engine by
        lm/engine/ds_reshard.py, which says why it reads them this way; or refused in one line naming the fix."""
        import lm.engine.ds_reshard as ds_reshard
        import lm.engine.reshard as reshard

        why = self._elastic_refusal(saved)
        if why:
            raise reshard.refuse(path, saved, f"{self.name} (ZeRO-{self.stage}) on {self.world_size} rank(s)", why)
        if saved["format"] == "deepspeed":
            full = ds_reshard.full_from_deepspeed(path)
        elif saved["format"] == "dcp":
            full = reshard.full_from_dcp(Path(path) / DCP)
        else:
            full = reshard.full_from_torch_file(path, self.group_names)
        check_grouping(path, group_sizes(full["optim"]), self.group_sizes())  # ZeRO would take another grouping
        ds_reshard.put_full_state(self.model, full)

    def _elastic_refusal(self, saved: dict) -> str | None:
        """Why this engine cannot take the checkpoint `saved` describes from another layout, or None."""
        import lm.engine.ds_reshard as ds_reshard
        import lm.engine.reshard as reshard

        back = f"resume with {reshard.engine_option(saved)} on {saved['world_size']} rank(s)"
        if self.stage == 0:
            stages = "use engine=zero2 (or zero1, zero3)"
            return f"ZeRO stage 0 (engine=deepspeed) takes only its own checkpoints; {stages}, or {back}"
        if self.train.precision == "fp16":
            return f"fp16's dynamic loss scale does not carry over to another engine or world size; {back}"
        if self.cpu_adam:
            fix = back if saved.get("cpu_adam") else "use engine.cpu_adam=false"
            return f"engine.cpu_adam=true's DeepSpeedCPUAdam keeps a state of its own layout; {fix}"
        zero = self.config.get("zero_optimization", {})
        if "nvme" in (zero.get("offload_optimizer", {}).get("device"), zero.get("offload_param", {}).get("device")):
            return f"an NVMe-offloaded optimizer is swapped in DeepSpeed's own files; offload to cpu, or {back}"
        return ds_reshard.source_refusal(saved) if saved["format"] == "deepspeed" else None

    @classmethod
    def consolidated_state_dict(cls, path: Path, info: dict) -> dict[str, torch.Tensor]:
        """Stage 0: rank 0's module states, its fp32 masters where it keeps them; ZeRO-1/2/3: DeepSpeed's
        zero_to_fp32 merges the partitions."""
        with weights_only_loads():
            if info.get("zero_stage", 0) == 0:
                return _stage0_state(Path(path) / TAG)
            from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

            state = get_fp32_state_dict_from_zero_checkpoint(str(path), tag=TAG)
            if state is None:  # upstream is unannotated; its inferred type admits None
                raise EngineError(f"DeepSpeed's zero_to_fp32 found no ZeRO partitions under {path}/{TAG}")
            return state

    def describe(self):
        return {**super().describe(), "zero_stage": self.stage, "cpu_adam": self.cpu_adam}

    def numel(self) -> int:
        if self.stage == 3:  # a partitioned Parameter is empty (numel 0); ds_numel is its full size
            return sum(p.ds_numel for p in self.module.parameters())  # pyright: ignore[reportAttributeAccessIssue]
        return super().numel()

    def local_numel(self) -> int:
        if self.stage == 3:
            # ZeRO-3 hangs each rank's partition on its Parameter as ds_tensor, which torch's stub cannot know
            parts = [p.ds_tensor for p in self.module.parameters()]  # pyright: ignore[reportAttributeAccessIssue]
            return sum(part.numel() for part in parts)
        return super().local_numel()


def _undo_warmup_step(wrapper, inner: torch.optim.Optimizer) -> None:
    """Stage 0 in bf16/fp16 wraps lm's AdamW in DeepSpeed's FP16_UnfusedOptimizer, which steps it once on zero
    gradients when it is built (to create the moments): the fp32 masters got weight decay, and Adam's step count
    starts at 1, so the first real update's bias correction shrank it by a quarter (0.73 x single's). Undone here:
    each master copied back from the low-precision parameter it was cloned from (zero gradients moved nothing
    else), the moments dropped (AdamW makes them again, at step 0, on its first real step)."""
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

    if not isinstance(wrapper, FP16_UnfusedOptimizer):  # ZeRO's optimizers and fp32 stage 0 take no such step
        return
    with torch.no_grad():
        for masters, params in zip(wrapper.fp32_groups, wrapper.fp16_groups, strict=True):
            for master, param in zip(masters, params, strict=True):
                master.copy_(param)
    inner.state.clear()


def _saved_group_sizes(files: Path) -> list[int] | None:
    """The parameter count of each optimizer group a DeepSpeed checkpoint saved, from its (first) model states file,
    memory-mapped: ZeRO-1/2/3 record each group's parameter shapes; stage 0 keeps lm's AdamW's state_dict (fp32) or
    DeepSpeed's wrapper of it (bf16/fp16: its fp32 master groups). None where it holds neither."""
    found = sorted(files.glob("*model_states.pt"))  # stage 0, ZeRO-1/2: mp_rank_00_; ZeRO-3: zero_pp_rank_<r>_
    if not found:
        return None  # DeepSpeed's load says it found no checkpoint
    with weights_only_loads():
        saved = torch.load(found[0], map_location="cpu", mmap=True)
    if saved.get("param_shapes"):
        return [len(g) for g in saved["param_shapes"]]
    optimizer = saved.get("optimizer") or {}
    if "param_groups" in optimizer:
        return group_sizes(optimizer)
    return [len(g) for g in optimizer["fp32_groups"]] if "fp32_groups" in optimizer else None


def _stage0_state(files: Path) -> dict[str, torch.Tensor]:
    """Stage 0's model: the module's states, each parameter replaced by its fp32 master where the optimizer keeps
    one (bf16/fp16: the module holds the rounded copies the forward pass uses). A weight tied to another (the LM
    head) is one tensor under two names, both replaced."""
    saved = torch.load(files / "mp_rank_00_model_states.pt", map_location="cpu")
    module = saved["module"]
    masters = (saved.get("optimizer") or {}).get("fp32_groups")
    if masters is None or not (files / GROUP_NAMES).is_file():  # fp32 (no masters), or saved before the names
        return module
    names = json.loads((files / GROUP_NAMES).read_text())
    # keyed by where a tensor starts and its shape: DeepSpeed may keep every bf16 parameter in one flat storage
    replaced = {}
    for group, tensors in zip(names, masters, strict=True):
        for name, master in zip(group, tensors, strict=True):
            replaced[_where(module[name])] = master
    return {name: replaced.get(_where(t), t) for name, t in module.items()}


def _where(t: torch.Tensor) -> tuple[int, tuple[int, ...]]:
    return t.data_ptr(), tuple(t.shape)
