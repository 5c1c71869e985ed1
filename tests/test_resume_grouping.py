"""A checkpoint written under the weight decay grouping before 2026-11-30 (nn.Linear weights only; since then every
matrix but the embedding tables) is refused in lm.engine.formats.check_grouping's one line on every engine, same
layout or elastic. Without the check each engine did something else: FSDP2 loaded it and its first step failed
with KeyError 'betas'; DeepSpeed stage 0 raised torch's ValueError, ZeRO-1/2 blamed its parameter alignment
setting, ZeRO-3 a tensor size; an elastic resume from FSDP2's or ZeRO's files loaded it without a word, the
synthesizer's W matrices in the undecayed group (weight decay 0 where today's is 0.1).

The tiny model with the dense synthesizer: its W (head_dim, max_seq_len), one per layer, is no Linear weight, so the
old groups hold [8, 22] of its 30 parameters, today's [10, 20]. The old rule is tests/old_grouping.py (lm's
param_groups as it was), an LM_PLUGINS module of the writing run.
"""

import pytest

from tests.engine_support import REPO, spawn, spawn_reports, tiny_overrides

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

EXTRA = ["sched=constant", "model/attn=synthesizer_dense"]
REFUSAL = "its optimizer state groups the parameters otherwise than this run's AdamW; it groups its 30 parameters "
REFUSAL += "as [8, 22], this run's as [10, 20]"


def write_old(run_dir, engine, monkeypatch, **train):
    """3 steps on 2 ranks under the old grouping: the checkpoint step_00000003."""
    with monkeypatch.context() as m:
        m.setenv("LM_PLUGINS", str(REPO / "tests" / "old_grouping.py"))  # read by the spawned ranks
        spawn(2, tiny_overrides(run_dir, 3, micro_batch_size=2, **train) + EXTRA + [f"engine={engine}"])


def assert_refused(reports, run_dir, world):
    assert len(reports) == world and all(r[1] == "error" for r in reports), reports
    ckpt = run_dir / "checkpoints" / "step_00000003"
    for _, _, trace in reports:  # the one line, the same on every rank and engine
        last = trace.strip().splitlines()[-1]
        assert last.startswith(f"lm.core.checkpoint.CheckpointError: {ckpt}: {REFUSAL}: it was written under"), trace


@pytest.mark.parametrize("engine", ["fsdp2", "deepspeed", "zero2", "zero3"])
def test_same_layout_resume_of_the_old_grouping_is_refused(engine, tmp_path, monkeypatch):
    write_old(tmp_path, engine, monkeypatch)
    reports = spawn_reports(2, tiny_overrides(tmp_path, 4, micro_batch_size=2) + EXTRA + [f"engine={engine}"])
    assert_refused(reports, tmp_path, 2)


def test_stage_0_in_bf16_resume_of_the_old_grouping_is_refused(tmp_path, monkeypatch):
    """DeepSpeed stage 0 in bf16 saves no param_groups of lm's AdamW but its wrapper's fp32 master groups
    (lm/engine/ds.py's _saved_group_sizes reads their lengths): refused in the same line."""
    write_old(tmp_path, "deepspeed", monkeypatch, precision="bf16")
    overrides = tiny_overrides(tmp_path, 4, micro_batch_size=2, precision="bf16") + EXTRA + ["engine=deepspeed"]
    assert_refused(spawn_reports(2, overrides), tmp_path, 2)


@pytest.mark.parametrize(("saved", "engine", "world"), [("fsdp2", "zero2", 2), ("zero2", "single", 1)])
def test_elastic_resume_of_the_old_grouping_is_refused(saved, engine, world, tmp_path, monkeypatch):
    """FSDP2's shards into ZeRO-2 (lm/engine/ds.py's load_resharded), ZeRO-2's partitions into one process
    (lm/engine/reshard.py's set_full_state); the global batch of 4 is kept (grad_accum 2 on 1 rank)."""
    write_old(tmp_path, saved, monkeypatch)
    reports = spawn_reports(world, tiny_overrides(tmp_path, 4, micro_batch_size=2) + EXTRA + [f"engine={engine}"])
    assert_refused(reports, tmp_path, world)
