"""Elastic resume with DeepSpeed ZeRO-1/2/3: a ZeRO checkpoint written on any number of ranks read into the full
FQN-keyed state (lm/engine/reshard.py's interchange form), and a full state put into a live ZeRO engine on any
world size. So a ZeRO run continues on another world size, on DDP/FSDP2/single, and the torch engines' checkpoints
continue on ZeRO, all through the one form.

Consolidate-and-reshard, not DeepSpeed's universal checkpoint (deepspeed.checkpoint.ds_to_universal, then
`load_universal_checkpoint`), for three reasons found in DeepSpeed 0.19's source: the torch engines' checkpoints
would have to be written out as universal files first (per-parameter files plus DeepSpeed's model-state records,
an internal layout), where the safe_set_full_* API below partitions any full state into a live engine of any
stage; ds_to_universal writes three copies of the model to a scratch directory and runs worker processes per
conversion, where reading the partitions here costs one pass over the files; and its ZeRO-3 path keeps no step
per parameter. zero_to_fp32 alone would not do: it consolidates the weights but drops both Adam moments, and a
resume without them is not the same run.

Reading (any stage, any saved world size): each rank's optimizer file holds flat fp32 partitions and, in the same
layout, Adam's exp_avg / exp_avg_sq. ZeRO-1/2 files record where each parameter's fragment lies in the rank's
partition (param_slice_mappings); ZeRO-3 pads each parameter to ceil(numel / world) elements per rank, in the
order of param_shapes. A parameter is its fragments over the ranks in rank order. The fp32 weights rebuilt this
way must equal zero_to_fp32's (a check that the layout is the one read here), and the model state (buffers and
tied names too) is zero_to_fp32's.

Writing: torch AdamW's state for each flat fp32 partition (zeros, the saved step), then every parameter's fp32
master weights and moments through deepspeed.utils.safe_set_full_fp32_param / safe_set_full_optimizer_state
(each rank keeps its own fragment), and the module's own weights from the same values.
"""

import contextlib
import io
import math
from pathlib import Path

import torch
from torch import nn

from lm.engine.dist import EngineError
from lm.engine.formats import TAG, weights_only_loads

MOMENTS = ("exp_avg", "exp_avg_sq")  # torch AdamW's state of a parameter besides its step
STATE = "optimizer_state_dict"  # DeepSpeed's key of the ZeRO optimizer's state in each rank's optimizer file


def source_refusal(saved: dict) -> str | None:
    """Why a DeepSpeed checkpoint (`saved`: its trainer.json engine record) cannot become the full state, or None."""
    from lm.engine.reshard import engine_option

    again = f"resume with {engine_option(saved)} on {saved['world_size']} rank(s)"
    if saved.get("zero_stage", 0) == 0:
        return f"ZeRO stage 0 keeps its optimizer in DeepSpeed's own file; {again}"
    if saved.get("cpu_adam"):
        return f"engine.cpu_adam=true's DeepSpeedCPUAdam keeps a state of its own layout; {again}"
    return None


def full_from_deepspeed(path: Path) -> dict:
    """A ZeRO-1/2/3 checkpoint (any saved world size) as the full FQN-keyed state, without a process group."""
    from deepspeed.utils import zero_to_fp32

    files = Path(path) / TAG
    quiet = io.StringIO()  # zero_to_fp32 prints its progress, on every rank here
    with weights_only_loads(), contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        model = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(str(path), tag=TAG)
        ranks = [torch.load(f, map_location="cpu")[STATE] for f in zero_to_fp32.get_optim_files(str(files))]
        shapes = torch.load(zero_to_fp32.get_model_state_files(str(files))[0], map_location="cpu")["param_shapes"]
    if model is None:  # upstream is unannotated; its inferred type admits None
        raise EngineError(f"DeepSpeed's zero_to_fp32 found no ZeRO partitions under {files}")
    groups = _stage3_groups(ranks, shapes) if int(ranks[0]["zero_stage"]) == 3 else _stage12_groups(ranks, shapes)
    state, param_groups = {}, []
    for hyper, step, full in groups:
        for name, weight in full["fp32"].items():
            if not torch.equal(weight, model[name].float()):
                raise EngineError(
                    f"{path}: DeepSpeed's partitions of {name} are not laid out as lm reads them (another DeepSpeed "
                    f"version?); resume on the world size and engine that wrote it"
                )
            # a step tensor of its own per parameter: torch's AdamW increments each one in place
            state[name] = {"step": torch.tensor(step, dtype=torch.float32), **{k: full[k][name] for k in MOMENTS}}
        param_groups.append({**hyper, "params": list(full["fp32"])})
    return {"model": model, "optim": {"state": state, "param_groups": param_groups}}


def _stage12_groups(ranks: list[dict], shapes: list[dict]):
    """(hyperparameters, step, {"fp32"|moment: {name: full tensor}}) per param group of a ZeRO-1/2 checkpoint."""
    for g, group_shapes in enumerate(shapes):
        base = [r["base_optimizer_state"] for r in ranks]
        flats = {"fp32": [r["single_partition_of_fp32_groups"][g] for r in ranks]}
        flats.update({k: [b["state"][g][k] for b in base] for k in MOMENTS})
        where = [r["param_slice_mappings"][g] for r in ranks]  # name -> its fragment's (start, numel) on that rank
        full = {
            key: {
                name: torch.cat(
                    [flat[r].narrow(0, at[name].start, at[name].numel) for r, at in enumerate(where) if name in at]
                ).view(shape)
                for name, shape in group_shapes.items()
            }
            for key, flat in flats.items()
        }
        hyper = {k: v for k, v in base[0]["param_groups"][g].items() if k != "params"}
        yield hyper, _one_step([b["state"][g]["step"] for b in base]), full


def _stage3_groups(ranks: list[dict], shapes: list[dict]):
    """The same for ZeRO-3: param group i holds the sub-groups its `params` number; in each sub-group's flat
    partitions every parameter takes ceil(numel / world) elements per rank, in param_shapes order."""
    world = len(ranks)
    saved = [r[STATE] for r in ranks]  # torch's state_dict of the optimizer over the flat sub-groups
    for group in saved[0]["param_groups"]:
        full: dict[str, dict[str, torch.Tensor]] = {key: {} for key in ("fp32", *MOMENTS)}
        steps = []
        for k in group["params"]:
            flats = {"fp32": [r["fp32_flat_groups"][k] for r in ranks]}
            flats.update({key: [s["state"][k][key] for s in saved] for key in MOMENTS})
            steps += [s["state"][k]["step"] for s in saved]
            offset = 0
            for name, shape in shapes[k].items():
                numel = math.prod(shape)
                per_rank = math.ceil(numel / world)
                for key, flat in flats.items():
                    full[key][name] = torch.cat([f.narrow(0, offset, per_rank) for f in flat])[:numel].view(shape)
                offset += per_rank
        hyper = {k: v for k, v in group.items() if k != "params"}
        yield hyper, _one_step(steps), full


def _one_step(steps: list) -> float:
    values = {float(s) for s in steps}
    if len(values) != 1:
        raise EngineError(f"the ZeRO checkpoint's partitions disagree on the optimizer step ({sorted(values)})")
    return values.pop()


def put_full_state(engine, full: dict) -> None:
    """Partition a full FQN-keyed state into the live ZeRO-1/2/3 `engine` (what deepspeed.initialize returned), on
    whatever world size it runs: every rank holds `full` and keeps its own fragments."""
    from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

    module, zero = engine.module, engine.optimizer
    model, state = full["model"], full["optim"]["state"]
    params = dict(module.named_parameters())
    untrained = sorted(set(params) - set(state))
    if untrained:  # DeepSpeed's flat partitions hold moments for every parameter, at one step
        raise EngineError(
            f"parameters {untrained[:3]} have no optimizer state in the checkpoint (never updated), which a ZeRO "
            f"partition cannot hold apart from the others; resume with engine=single|ddp|fsdp2"
        )
    _init_adam_state(zero, _one_step([state[n]["step"] for n in params]))
    for name, param in params.items():
        safe_set_full_fp32_param(param, model[name].float())
        for key in MOMENTS:
            safe_set_full_optimizer_state(param, state[name][key].float(), key)
    _set_module_weights(module, model, stage3=hasattr(zero, "fp32_partitioned_groups_flat"))


def _init_adam_state(zero, step: float) -> None:
    """torch AdamW's state of every flat fp32 partition the ZeRO optimizer steps (it creates it lazily, at the
    first step), at `step`, so safe_set_full_optimizer_state has tensors to write into; the step tensor sits where
    torch's AdamW keeps it (on the parameter's device for the fused and capturable kernels, else on the CPU)."""
    if hasattr(zero, "fp32_partitioned_groups_flat"):  # ZeRO-3: sub-groups, each in a param group
        flats = [
            (flat, zero.optimizer.param_groups[zero.sub_group_to_group_id[k]])
            for k, flat in enumerate(zero.fp32_partitioned_groups_flat)
        ]
    else:
        flats = list(zip(zero.single_partition_of_fp32_groups, zero.optimizer.param_groups))
    for flat, group in flats:
        on_device = group.get("fused") or group.get("capturable")
        zero.optimizer.state[flat] = {
            "step": torch.tensor(step, dtype=torch.float32, device=flat.device if on_device else "cpu"),
            **{key: torch.zeros_like(flat) for key in MOMENTS},
        }
    if not hasattr(zero, "fp32_partitioned_groups_flat"):
        # ZeRO-1/2 reach a parameter's moments through fragments linked to this state (lazily, after a step)
        from deepspeed.utils import lazy_init_hp_params_optimizer_state

        for lp_group, flat in zip(zero.bit16_groups, zero.single_partition_of_fp32_groups):
            lazy_init_hp_params_optimizer_state(lp_group, flat, zero.optimizer.state)


def _set_module_weights(module: nn.Module, model: dict, stage3: bool) -> None:
    """The module's own (forward) weights and buffers from the full state, as DeepSpeed derives them from the fp32
    master weights (the same values in fp32; rounded to bf16 under bf16)."""
    if not stage3:  # every rank holds the whole module (views into DeepSpeed's flat buffers: copied in place)
        module.load_state_dict(model)
        return
    import deepspeed

    with torch.no_grad():
        for name, param in module.named_parameters():  # partitioned: gathered, set, partitioned again
            with deepspeed.zero.GatheredParameters([param], modifier_rank=0):
                param.data.copy_(model[name])
        for name, buffer in module.named_buffers():  # buffers are whole on every rank
            if name in model:
                buffer.copy_(model[name])
