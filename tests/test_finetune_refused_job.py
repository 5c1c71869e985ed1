"""A refused lm finetune leaves its run_dir as it found it: every task/seed pair an earlier job finished or left
partway is compared with the settings this job would train it with before any task trains and before config.yaml
is written. The job here lists QQP before SST-2; the earlier job trained SST-2 at lr 1e-3, this one asks 3e-3, so
without the up-front check it trained QQP whole, rewrote config.yaml to say 0.003 beside SST-2's results at 0.001,
and only then was refused. Only .lock changes: it names the refused job, its last holder."""

import os

import pytest

from lm.cli.finetune import finetune
from lm.config import ConfigError
from lm.core.lock import LOCK_NAME
from lm.glue.trainer import GlueTask
from tests.glue_support import FIXTURES, TINY, finetune_cfg
from tests.glue_support import easy_glue as easy_glue  # fixtures, re-exported
from tests.glue_support import pretrained as pretrained


class Interrupted(Exception):
    pass


def job(run_dir, easy_glue, pretrained, tasks, lr):
    sst2 = ["epochs=2", "batch_size=16", "max_len=24", "seeds=[0]", f"data_root={easy_glue}", "max_train_examples=32"]
    qqp = ["epochs=1", "batch_size=4", "max_len=24", "seeds=[0]", f"data_root={FIXTURES}"]
    fields = {"sst2": sst2, "qqp": qqp}
    names = ",".join(f"glue/{t}" for t in tasks)
    return finetune_cfg(
        run_dir,
        [
            "init=none",
            *TINY,
            f"tokenizer={pretrained / 'data'}",
            f"task=[{names}]",
            f"optim.lr={lr}",
            *(f"tasks.{t}.{f}" for t in tasks for f in fields[t]),
        ],
    )


def snapshot(run_dir) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def refused_unchanged(run_dir, easy_glue, pretrained, refusal: str) -> None:
    before = snapshot(run_dir)
    with pytest.raises(ConfigError) as e:
        finetune(job(run_dir, easy_glue, pretrained, ["qqp", "sst2"], 3e-3))
    assert refusal in str(e.value) and "optim.lr: 0.001 -> 0.003" in str(e.value), str(e.value)
    after = snapshot(run_dir)
    assert not (run_dir / "qqp").exists()  # QQP, listed first, did not train
    assert after.keys() == before.keys()
    assert {k: v for k, v in after.items() if k != LOCK_NAME} == {k: v for k, v in before.items() if k != LOCK_NAME}
    assert f'"pid": {os.getpid()}' in after[LOCK_NAME].decode()  # the last holder: the refused job


def test_a_finished_pair_of_other_settings_refuses_the_job_before_it_writes(tmp_path, easy_glue, pretrained):
    run_dir = tmp_path / "ft"
    finetune(job(run_dir, easy_glue, pretrained, ["sst2"], 1e-3))
    pair = run_dir / "sst2" / "seed0"
    assert (pair / "result.pt").is_file()
    refused_unchanged(run_dir, easy_glue, pretrained, f"cannot reuse the finished {pair / 'result.pt'} ")


def test_a_partial_pair_of_other_settings_refuses_the_job_before_it_writes(
    tmp_path, easy_glue, pretrained, monkeypatch
):
    """The earlier job was stopped by its second dev evaluation: SST-2 seed 0 keeps its epoch-1 checkpoint."""
    run_dir = tmp_path / "ft"
    evaluate, calls = GlueTask.evaluate, []

    def failing(self, engine, step):
        calls.append(step)
        if len(calls) == 2:
            raise Interrupted(f"interrupted at step {step}")
        return evaluate(self, engine, step)

    with monkeypatch.context() as m:
        m.setattr(GlueTask, "evaluate", failing)
        with pytest.raises(Interrupted):
            finetune(job(run_dir, easy_glue, pretrained, ["sst2"], 1e-3))
    pair = run_dir / "sst2" / "seed0"
    assert (pair / "checkpoints" / "latest").is_file() and not (pair / "result.pt").exists()
    refused_unchanged(run_dir, easy_glue, pretrained, f"cannot resume {pair / 'checkpoints' / 'step_'}")
