"""Elastic resume in one process: the global batch arithmetic (lm/core/elastic.py), the packed stream's steps
across world sizes (the same samples in every step, tests/token_log.py's digests), the task states' guards,
the validation sample kept (the same val windows on another world size), the refusal of a checkpoint written
before elastic resume, and the torch engines' resharding
(lm/engine/reshard.py) single -> FSDP2 -> single, bit for bit. The multi-process runs: test_elastic_resume.py."""

import json

import pytest
import torch

from lm.config_base import ConfigError
from lm.core.config import OptimConfig, TrainConfig
from lm.core.elastic import keep_global_batch, kept_grad_accum, kept_val_windows
from lm.core.pretrain_task import LoaderSteps, PretrainTask
from lm.data.packed import PackedLoader
from lm.data.prepare import prepare
from tests.token_log import sample_digests

T = 16


@pytest.fixture(scope="module")
def data(tmp_path_factory, data_mirror):
    root = tmp_path_factory.mktemp("elastic")
    text = (data_mirror / "text/tinystories/tiny_stories_train_slice.txt").read_text().split("\n")
    (root / "stories.txt").write_text("\n".join(text[:200]))
    return prepare(
        {
            "source": str(root / "stories.txt"),
            "doc_split": "line",
            "tokenizer": "bpe",
            "vocab_size": 400,
            "val_fraction": 0.1,
            "workers": 1,
            "shard_tokens": 5000,
        },
        root / "data",
        progress=False,
    )


def test_kept_grad_accum_keeps_the_global_batch_or_names_the_world_sizes_that_can():
    assert kept_grad_accum(8, 1, 2) == 4
    assert kept_grad_accum(8, 2, 4) == 1
    with pytest.raises(ConfigError, match=r"resume on a world size that divides 8 \(1, 2, 4, 8\)") as e:
        kept_grad_accum(8, 1, 3)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="resume with the micro-batch size it was trained with"):
        kept_grad_accum(6, 4, 1)


def steps_on(data, world, grad_accum, n, state=None):
    """n steps of LoaderSteps on `world` ranks from `state`: per step the sorted digests of all ranks' samples,
    and rank 0's state after them."""
    ranks = [
        LoaderSteps(PackedLoader(data, "train", T, 1, rank=r, world_size=world, seed=3), grad_accum)
        for r in range(world)
    ]
    for r in ranks:
        if state is not None:
            r.load_state_dict(state)
    per_rank = [[next(r) for _ in range(n)] for r in ranks]  # rank -> step -> its micro-batches
    return [sorted(d for mine in per_rank for d in sample_digests(mine[s])) for s in range(n)], ranks[0].state_dict()


@pytest.mark.parametrize("first,second", [(2, 1), (1, 2), (2, 4), (4, 2)])
def test_steps_hold_the_same_samples_after_a_world_size_change(data, first, second):
    G = 4
    reference, _ = steps_on(data, 1, G, 6)
    before, state = steps_on(data, first, G // first, 3)
    assert state["samples_per_step"] == G and state["samples_consumed"] == 3 * G
    after, _ = steps_on(data, second, kept_grad_accum(state["samples_per_step"], 1, second), 3, state)
    assert before + after == reference
    assert all(len(step) == G and len(set(step)) == G for step in reference)  # G distinct samples per step


def test_a_task_state_of_another_global_batch_is_refused_naming_grad_accum(data):
    state = LoaderSteps(PackedLoader(data, "train", T, 1, world_size=2), 2).state_dict()  # 4 per step
    with pytest.raises(ConfigError, match=r"4 sequences per step, this run on 3: set train.grad_accum=4"):
        LoaderSteps(PackedLoader(data, "train", T, 1), 3).load_state_dict(state)


def fake_checkpoint(run_dir, samples_per_step, step=4):
    ckpt = run_dir / "checkpoints" / f"step_{step:08d}"
    ckpt.mkdir(parents=True)
    torch.save(
        {"loader": {"samples_consumed": 40, "samples_per_step": samples_per_step}, "rng": {}}, ckpt / "rank00000.pt"
    )


def test_the_same_command_on_another_world_size_gets_the_grad_accum_that_keeps_the_batch(tmp_path):
    fake_checkpoint(tmp_path, 8)
    train = TrainConfig(micro_batch_size=2, grad_accum=2)  # 2 x 2 x 2 ranks = 8
    assert keep_global_batch(train, tmp_path, 2, True).grad_accum == 2
    assert keep_global_batch(train, tmp_path, 1, True).grad_accum == 4
    assert keep_global_batch(train, tmp_path, 4, True).grad_accum == 1
    with pytest.raises(ConfigError, match=r"divides 4 \(1, 2, 4\)"):
        keep_global_batch(train, tmp_path, 3, True)
    assert keep_global_batch(train, tmp_path / "new", 3, True) is train  # nothing to resume: unchanged


def test_kept_val_windows_keeps_a_count_the_ranks_split_else_the_nearest_that_they_do():
    assert kept_val_windows(20, 2, 100) == 20 and kept_val_windows(20, 4, 100) == 20
    assert kept_val_windows(10, 3, 100) == 9 and kept_val_windows(11, 3, 100) == 12  # 1 window off either way
    assert kept_val_windows(5, 2, 100) == 4  # a tie: the smaller, cheaper pass
    assert kept_val_windows(1, 2, 100) == 2  # a window per rank at least
    assert kept_val_windows(50, 4, 30) == 28  # at most the split this world size can split


def val_tasks(data, world, eval_batches, micro=1):
    """PretrainTask of each of `world` ranks (4 sequences per step), over the val split's windows of T tokens."""
    return [
        PretrainTask(
            PackedLoader(data, "train", T, micro, rank=r, world_size=world),
            PackedLoader(data, "val", T, micro, rank=r, world_size=world),
            4 // (micro * world),
            eval_batches,
        )
        for r in range(world)
    ]


def rows(batches) -> list[tuple]:
    return sorted(tuple(row.tolist()) for b in batches for row in b["input_ids"])


def scored_windows(tasks) -> list[tuple]:
    """Every window a validation pass of these ranks scores (its input ids), sorted."""
    passes = [t.val_sample.batches() for t in tasks]
    assert len({n for _, n in passes}) == 1  # every rank the same number of forwards
    return rows(b for batches, n in passes for b in list(batches)[:n])


@pytest.mark.parametrize("world,micro,eval_batches", [(2, 1, 6), (2, 2, 3), (4, 1, 6)])
def test_validation_scores_the_runs_windows_after_a_world_size_change(data, world, micro, eval_batches, caplog):
    """6 val windows on 1 rank (eval_batches x micro-batch), kept on 2 ranks (3 micro-batches of 1 window, or one
    of 2 and one of 1), not the eval_batches x micro x world a new run there scores; on 4 ranks, which cannot split
    6, the nearest count they can (4 or 8: the smaller), said so."""
    first = val_tasks(data, 1, eval_batches, micro)
    state = first[0].state_dict()
    assert (state["val_windows"], state["val_eval_batches"]) == (6, eval_batches)
    resumed = val_tasks(data, world, eval_batches, micro)
    assert resumed[0].val_sample.recorded == 6 * world  # a new run on that layout would score these
    with caplog.at_level("WARNING", logger="lm"):
        for task in resumed:
            task.load_state_dict(state)
    kept = 4 if world == 4 else 6
    assert len(scored_windows(resumed)) == kept
    assert scored_windows(resumed) == rows(PackedLoader(data, "val", T, 1).first_windows(kept))
    assert resumed[0].state_dict()["val_windows"] == 6  # the run's count, for a later resume on a layout that splits it
    said = (
        "validation scores 4 val windows on 4 rank(s) instead of the run's 6 (the nearest count they split evenly: -2"
    )
    assert (said in caplog.text) == (world == 4)
    if world == 2:
        assert scored_windows(first) == scored_windows(resumed)


def test_a_checkpoint_without_the_count_or_with_another_eval_batches_scores_this_runs_count(data, caplog):
    """A checkpoint written before the count was recorded resumes as before (eval_batches micro-batches per rank of
    this layout), with a warning; a train.eval_batches changed on resume asks for another sample: this run's count."""
    state = val_tasks(data, 1, 6)[0].state_dict()
    old = {k: v for k, v in state.items() if k not in ("val_windows", "val_eval_batches")}
    with caplog.at_level("INFO", logger="lm"):
        for task in (two := val_tasks(data, 2, 6)):
            task.load_state_dict(old)
        assert two[0].val_sample.scored == two[0].state_dict()["val_windows"] == 12
        assert "does not record how many val windows its validation scores" in caplog.text
        for task in (fewer := val_tasks(data, 2, 2)):
            task.load_state_dict(state)
        assert fewer[0].val_sample.scored == fewer[0].state_dict()["val_windows"] == 4
        assert "train.eval_batches 6 -> 2: validation scores 4 val windows from here on (6 before)" in caplog.text


def test_a_new_run_scores_eval_batches_micro_batches_of_every_rank_as_before(data):
    """The fixed count changes nothing for a new run: the first eval_batches micro-batches of the val loader."""
    for task in val_tasks(data, 2, 3, micro=2):
        batches, n = task.val_sample.batches()
        loader = iter(task.val_loader)
        assert n == 3 and all(torch.equal(a["input_ids"], next(loader)["input_ids"]) for a in batches)


# -- the checkpoint side -----------------------------------------------------------------------------------


def engine_pair(cls, need_group):
    from lm.core.optim import adamw
    from lm.engine import dist as dist_utils
    from lm.model import build_model
    from lm.model.config import model_preset

    torch.manual_seed(0)
    engine = cls(TrainConfig(), dist_utils.init(torch.device("cpu"), need_group=need_group))
    return engine.wrap(build_model(model_preset("tiny", [])), lambda m: adamw(m, OptimConfig()))


def train_step(engine):
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(5))
    with engine.micro_step(True):
        engine.backward(engine.model(input_ids=x, labels=x).loss)
    engine.step()


def full_state(engine):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model, optim = get_state_dict(engine.module, engine.optimizer, options=StateDictOptions(full_state_dict=True))
    return model, optim["state"]


def assert_same(a, b):
    (ma, oa), (mb, ob) = a, b
    assert ma.keys() == mb.keys() and oa.keys() == ob.keys()
    assert all(torch.equal(ma[k], mb[k]) for k in ma)
    assert all(torch.equal(oa[k][n], ob[k][n]) for k in oa for n in oa[k])


def test_single_to_fsdp2_to_single_reshards_model_and_optimizer_bit_for_bit(tmp_path):
    from lm.engine import FSDP2Engine, SingleEngine
    from lm.engine import dist as dist_utils

    try:
        single = engine_pair(SingleEngine, False)
        train_step(single)
        (tmp_path / "a").mkdir()
        single.save_state(tmp_path / "a")
        fsdp2 = engine_pair(FSDP2Engine, True)  # a 1-rank process group: DTensor parameters all the same
        fsdp2.load_resharded(tmp_path / "a", {"format": "torch", "engine": "Engine", "world_size": 1})
        assert_same(full_state(single), full_state(fsdp2))
        (tmp_path / "b").mkdir()
        fsdp2.save_state(tmp_path / "b")
        back = engine_pair(SingleEngine, False)
        back.load_resharded(tmp_path / "b", {"format": "dcp", "engine": "FSDP2Engine", "world_size": 1})
        assert_same(full_state(single), full_state(back))
        train_step(single)
        train_step(back)  # Adam's step count and moments came along: the next update is the same too
        assert_same(full_state(single), full_state(back))
    finally:
        dist_utils.shutdown()


def test_a_checkpoint_from_before_elastic_resume_is_refused_on_another_world_size(tmp_path):
    from lm.core.checkpoint import Checkpointer, CheckpointError
    from lm.engine import DDPEngine, Dist, SingleEngine

    single = engine_pair(SingleEngine, False)
    path = Checkpointer(tmp_path, single).save({"step": 1, "tokens": 0}, {"samples_consumed": 4})
    trainer = json.loads((path / "trainer.json").read_text())
    assert trainer["elastic"] is True
    del trainer["elastic"]  # as lm wrote it before this change (trainer.json is outside the manifest)
    (path / "trainer.json").write_text(json.dumps(trainer))
    two = DDPEngine(TrainConfig(), Dist(rank=0, world_size=2, local_rank=0, device=torch.device("cpu")))
    with pytest.raises(
        CheckpointError,
        match=r"before lm could resume on another engine or world size; this run "
        r"is DDPEngine on 2\. Resume with the same engine and world size",
    ):
        Checkpointer(tmp_path, two).load(path)


def glue_task(n_train, world):
    from lm.glue.config import GlueTaskConfig
    from lm.glue.tasks import get_task
    from lm.glue.trainer import GlueTask, Split, TaskData

    data = TaskData(task=get_task("sst2"), train=Split(features=[{"input_ids": [5, 6]}] * n_train), dev={}, test={})
    return GlueTask(
        GlueTaskConfig(name="sst2", batch_size=16), data, seed=0, rank=0, world_size=world, micro_batch_size=8, pad_id=0
    )


def test_a_finetune_pair_resumes_on_a_world_size_with_the_same_steps_per_epoch_only():
    state = glue_task(16 * 5 + 2, 2).state_dict()  # a last batch of 2 examples: trained on 1 or 2 ranks
    glue_task(16 * 5 + 2, 1).load_state_dict(state)  # 6 steps per epoch on 1 rank too
    with pytest.raises(ConfigError, match=r"ran 6 steps per epoch, this world size gives 5 .*resume on at most 2 rank"):
        glue_task(16 * 5 + 2, 4).load_state_dict(state)
    with pytest.raises(ConfigError, match=r"ran 5 steps per epoch, this world size gives 6 .*resume on more than 2"):
        glue_task(16 * 5 + 2, 1).load_state_dict(glue_task(16 * 5 + 2, 3).state_dict())


def test_a_torch_checkpoint_of_another_weight_decay_grouping_is_named_so_on_an_elastic_resume(tmp_path):
    """A checkpoint written when weight decay covered the Linear weights only (before b3abb50) holds the same
    parameters in AdamW groups of other sizes. Resumed elsewhere (single/DDP's file onto FSDP2, say) it was refused
    as 'not this model'; the same-layout resume names the grouping (lm/core/checkpoint.py), and so does this one."""
    import lm.zoo  # noqa: F401 - registers model/attn=synthesizer_dense
    from lm.core.optim import adamw
    from lm.engine import EngineError
    from lm.engine.formats import MODEL_OPTIM
    from lm.engine.reshard import full_from_torch_file, group_names
    from lm.model import build_model
    from lm.model.config import model_preset

    model = build_model(model_preset("tiny", ["model/attn=synthesizer_dense"]))  # its W is no nn.Linear
    linear = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    params = list(model.parameters())
    old = torch.optim.AdamW(
        [{"params": [p for p in params if id(p) in linear]}, {"params": [p for p in params if id(p) not in linear]}]
    )
    torch.save({"model": model.state_dict(), "optimizer": old.state_dict()}, tmp_path / MODEL_OPTIM)
    groups = group_names(model, adamw(model, OptimConfig()))
    sizes = [len(g) for g in groups]
    with pytest.raises(
        EngineError,
        match=rf"groups its {len(params)} parameters as \[\d+, \d+\], this run's as "
        rf"\[{sizes[0]}, {sizes[1]}\]: it was written under another weight decay rule",
    ):
        full_from_torch_file(tmp_path, groups)
