"""lm/engine/ds_reshard.py's reading of ZeRO partitions, on hand-made rank files (no DeepSpeed process group): every
parameter's fp32 weights and both Adam moments come back whole from any number of ranks' fragments, and the
partitions' steps must agree. The real files of real runs: tests/test_elastic_resume.py (slow)."""

from types import SimpleNamespace

import pytest
import torch

from lm.engine.dist import EngineError
from lm.engine.ds_reshard import _stage3_groups, _stage12_groups

SHAPES = {"a.weight": torch.Size([3, 2]), "b.bias": torch.Size([3])}  # 6 + 3 elements
FULL = {
    key: {
        name: torch.arange(shape.numel(), dtype=torch.float32).view(shape) + 100 * i + 10 * j
        for j, (name, shape) in enumerate(SHAPES.items())
    }
    for i, key in enumerate(("fp32", "exp_avg", "exp_avg_sq"))
}
HYPER = {"lr": 0.1, "betas": (0.9, 0.95), "weight_decay": 0.0}


def flat(key):
    return torch.cat([FULL[key][name].flatten() for name in SHAPES])  # 9 elements, a.weight then b.bias


def stage12_ranks(world, steps=None):
    """ZeRO-1/2: the group's flat vector padded to a multiple of `world`, cut into equal partitions; each rank
    records where each parameter's fragment lies in its partition (param_slice_mappings)."""
    per = -(-9 // world)
    ranks = []
    for r in range(world):
        lo, hi = r * per, (r + 1) * per
        where, offset = {}, 0
        for name, shape in SHAPES.items():
            start, end = max(offset, lo), min(offset + shape.numel(), hi)
            if start < end:
                where[name] = SimpleNamespace(start=start - lo, numel=end - start)
            offset += shape.numel()

        def part(key, lo=lo):
            return torch.nn.functional.pad(flat(key), (0, per * world - 9))[lo : lo + per]

        state = {
            "step": torch.tensor(float(steps[r] if steps else 7)),
            "exp_avg": part("exp_avg"),
            "exp_avg_sq": part("exp_avg_sq"),
        }
        ranks.append(
            {
                "base_optimizer_state": {"state": {0: state}, "param_groups": [{**HYPER, "params": [0]}]},
                "single_partition_of_fp32_groups": [part("fp32")],
                "param_slice_mappings": [where],
            }
        )
    return ranks


def stage3_ranks(world):
    """ZeRO-3: every parameter padded to ceil(numel / world) elements per rank, in param_shapes order."""
    ranks = []
    for r in range(world):
        parts = {}
        for key in FULL:
            pieces = []
            for name, shape in SHAPES.items():
                per = -(-shape.numel() // world)
                padded = torch.nn.functional.pad(FULL[key][name].flatten(), (0, per * world - shape.numel()))
                pieces.append(padded[r * per : (r + 1) * per])
            parts[key] = torch.cat(pieces)
        state = {"step": torch.tensor(7.0), "exp_avg": parts["exp_avg"], "exp_avg_sq": parts["exp_avg_sq"]}
        ranks.append(
            {
                "optimizer_state_dict": {"state": {0: state}, "param_groups": [{**HYPER, "params": [0]}]},
                "fp32_flat_groups": [parts["fp32"]],
            }
        )
    return ranks


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("stage", ["1/2", "3"])
def test_partitions_of_any_world_size_come_back_whole(stage, world):
    read = (
        _stage12_groups(stage12_ranks(world), [SHAPES])
        if stage == "1/2"
        else _stage3_groups(stage3_ranks(world), [SHAPES])
    )
    ((hyper, step, full),) = list(read)
    assert hyper == HYPER and step == 7.0
    for key in FULL:
        assert list(full[key]) == list(SHAPES)
        for name in SHAPES:
            assert torch.equal(full[key][name], FULL[key][name]), (key, name)


def test_partitions_that_disagree_on_the_step_are_refused():
    with pytest.raises(EngineError, match="disagree on the optimizer step"):
        list(_stage12_groups(stage12_ranks(2, steps=[7, 8]), [SHAPES]))
