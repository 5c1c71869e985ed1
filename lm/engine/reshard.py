"""Loading a checkpoint written by another engine or world size (elastic resume).

The interchange form is the *full* state keyed by parameter name (FQN), as torch.distributed.checkpoint's
`get_state_dict(..., full_state_dict=True)` has it: {"model": {fqn: tensor}, "optim": {"state": {fqn: {...}},
"param_groups": [{"params": [fqn, ...], ...}]}}. Each source format is read into it, and `set_state_dict`
puts it into any torch-native engine's module and optimizer (FSDP2 shards it for the new mesh; a ZeRO engine
partitions it itself, lm/engine/ds_reshard.py):

    torch (single/DDP model_optim.pt): the full state already; the optimizer's integer ids -> names
    dcp (FSDP2 shards): DCP's offline conversion to one file (any saved world size)
    deepspeed (ZeRO-1/2/3 partitions, any saved world size): lm/engine/ds_reshard.py, which also puts the
        full state into a ZeRO engine

Every rank reads the whole state (CPU memory: the model and both Adam moments once per rank). A resume on
the same engine class, format and world size (FSDP2 on another world size too: DCP reshards itself) never comes
here: each engine's own load_state stays the path of an unchanged resume.
"""

import tempfile
from pathlib import Path

import torch
from torch import nn

from lm.engine.dist import EngineError
from lm.engine.formats import MODEL_OPTIM, check_dcp_metadata, check_grouping, group_sizes


def group_names(module: nn.Module, optimizer: torch.optim.Optimizer) -> list[list[str]]:
    """The parameter names of each of `optimizer`'s param groups, in order (a plain torch optimizer over
    `module`'s parameters: lm.core.optim.adamw builds its groups the same way for every engine)."""
    names = {id(p): n for n, p in module.named_parameters()}
    return [[names[id(p)] for p in g["params"]] for g in optimizer.param_groups]


def full_from_torch_file(path: Path, groups: list[list[str]]) -> dict:
    """model_optim.pt (single/DDP) as the full FQN-keyed state. The file's optimizer numbers parameters in
    param_groups order; lm builds those groups the same way for every engine (lm.core.optim.adamw), so
    position i there is position i of `groups` (group_names of the optimizer being loaded)."""
    state = torch.load(Path(path) / MODEL_OPTIM, map_location="cpu", weights_only=True)
    if "scaler" in state:
        raise EngineError(
            f"{path} was trained with fp16 loss scaling, which only engine=single|ddp keep; "
            f"resume with engine=single or engine=ddp"
        )
    saved = state["optimizer"]
    order = [name for group in groups for name in group]
    ids = [i for g in saved["param_groups"] for i in g["params"]]
    if len(ids) != len(order):
        raise EngineError(
            f"{path}: its optimizer has {len(ids)} parameters in {len(saved['param_groups'])} "
            f"groups, this model's {len(order)} in {len(groups)}: not this model"
        )
    check_grouping(path, group_sizes(saved), [len(g) for g in groups])  # the same parameters, grouped otherwise
    fqn = dict(zip(ids, order))
    optim = {
        "state": {fqn[i]: s for i, s in saved["state"].items()},
        "param_groups": [{**g, "params": [fqn[i] for i in g["params"]]} for g in saved["param_groups"]],
    }
    return {"model": state["model"], "optim": optim}


def full_from_dcp(dcp_dir: Path) -> dict:
    """FSDP2's DCP shards (any saved world size) as the full FQN-keyed state, without a process group."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    check_dcp_metadata(dcp_dir)
    with tempfile.TemporaryDirectory(prefix="lm-reshard-") as scratch:  # private: every rank converts its own
        out = Path(scratch) / "full.pt"
        dcp_to_torch_save(dcp_dir, out)
        return torch.load(out, map_location="cpu", weights_only=True)


def set_full_state(path: Path, module: nn.Module, optimizer: torch.optim.Optimizer, full: dict) -> None:
    """Put a full FQN-keyed state (of checkpoint `path`) into `module` and `optimizer` (plain, DDP's module, or
    FSDP2-sharded). Another grouping is refused first: set_state_dict would take it without a word."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    check_grouping(path, group_sizes(full["optim"]), [len(g["params"]) for g in optimizer.param_groups])

    set_state_dict(
        module,
        optimizer,
        model_state_dict=full["model"],
        optim_state_dict=full["optim"],
        options=StateDictOptions(full_state_dict=True),
    )


OPTIONS = {"Engine": "single", "DDPEngine": "ddp", "FSDP2Engine": "fsdp2"}  # engine class -> its engine= option


def engine_option(saved: dict) -> str:
    """The `engine=` option that wrote the checkpoint `saved` (its trainer.json engine record) describes."""
    if saved["format"] == "deepspeed":
        stage = saved.get("zero_stage", 0)
        return f"engine=zero{stage}" if stage else "engine=deepspeed"
    return f"engine={OPTIONS.get(saved['engine'], saved['engine'])}"


def refuse(path: Path, saved: dict, engine_name: str, why: str) -> EngineError:
    """The one-line refusal of a resume this engine cannot do from `saved` (trainer.json's engine record)."""
    return EngineError(
        f"{path} was written by {saved['engine']} on {saved['world_size']} rank(s) and cannot be "
        f"resumed by {engine_name}: {why}"
    )
