"""The lm finetune job around the training: a missing task directory (named, or skipped), a run_dir another job
holds, config errors, MNLI/QQP/AX from official-format fixtures, and W&B runs grouped with their pretraining run."""

import json
import logging

import pytest

from lm.cli.finetune import finetune
from lm.config import ConfigError
from lm.glue.init import InitError
from lm.glue.readers import GlueDataMissing
from lm.glue.submission import check_submission
from tests.glue_support import FIXTURES, finetune_cfg
from tests.glue_support import easy_glue as easy_glue  # a module fixture (pretrained reads it), re-exported
from tests.glue_support import pretrained as pretrained  # a module fixture, re-exported


def test_missing_task_directory_names_the_path_and_how_to_get_it(tmp_path, pretrained, caplog):
    """One error, said once (the hub's answer was also logged as a warning before it), and no run directory: it
    was made, with a config.yaml, before the data was looked for."""
    cfg = finetune_cfg(tmp_path / "x", [f"init={pretrained / 'run'}", "task=glue/rte", f"glue.data_root={tmp_path}"])
    with caplog.at_level(logging.WARNING, logger="lm"), pytest.raises(GlueDataMissing) as e:
        finetune(cfg)
    assert str(tmp_path / "RTE" / "train.tsv") in str(e.value) and "download_glue_data.py" in str(e.value)
    assert str(e.value).splitlines()[1].startswith(f"  rte: not found: {tmp_path / 'RTE' / 'train.tsv'}, ")
    assert not [r for r in caplog.records if "RTE" in r.getMessage()]
    assert not (tmp_path / "x").exists()


def test_skip_missing_runs_the_tasks_that_are_there(tmp_path, pretrained):
    run_dir = tmp_path / "ft"
    cfg = finetune_cfg(
        run_dir,
        [
            f"init={pretrained / 'run'}",
            "task=[glue/rte,glue/qqp]",
            f"glue.data_root={FIXTURES}",
            "skip_missing=true",
            "tasks.rte.epochs=1",
            "tasks.qqp.epochs=1",
            "tasks.rte.seeds=[0]",
        ],
    )
    finetune(cfg)
    results = json.loads((run_dir / "results.json").read_text())
    assert list(results["columns"]) == ["qqp"] and list(results["skipped_tasks"]) == ["rte"]
    assert str(FIXTURES / "RTE" / "train.tsv") in results["skipped_tasks"]["rte"]
    assert "partial" in (run_dir / "results.md").read_text()


def test_a_second_finetune_on_a_held_run_dir_refuses(tmp_path, pretrained):
    """lm finetune takes the same run-dir lock as lm train: a second job on the directory refuses."""
    import subprocess
    import sys

    from lm.core.lock import RunDirLocked
    from tests.engine_support import REPO, subprocess_env

    run_dir = tmp_path / "ft"
    run_dir.mkdir()
    hold = (
        "import sys, time; from lm.core.lock import acquire; acquire(sys.argv[1]); "
        "print('holding', flush=True); time.sleep(120)"
    )
    first = subprocess.Popen(
        [sys.executable, "-c", hold, str(run_dir)], env=subprocess_env(), cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert first.stdout.readline().strip() == "holding"
        with pytest.raises(RunDirLocked, match=rf"in use by another run \(pid {first.pid} on "):
            finetune(finetune_cfg(run_dir, [f"init={pretrained / 'run'}", "task=glue/sst2"]))
        assert not (run_dir / "config.yaml").exists() and not (run_dir / "results.json").exists()
    finally:
        first.kill()
        first.wait()


def test_missing_init_and_unknown_task_field_are_config_errors(tmp_path, pretrained):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigError, match="init=<lm train run dir"):
        finetune(finetune_cfg(tmp_path, []))
    with pytest.raises(InitError, match="no such directory"):
        finetune(finetune_cfg(tmp_path, [f"init={tmp_path / 'nope'}"]))
    init = [f"init={pretrained / 'run'}", f"glue.data_root={FIXTURES}", "task=glue/qqp"]
    with pytest.raises(ConfigCompositionException, match=r"tasks\.qqp\.epoch'"):  # the schema has epochs
        finetune_cfg(tmp_path, [*init, "tasks.qqp.epoch=2"])
    # train.* fields without a meaning in finetuning are not in its schema (a task's batch sets accumulation).
    for field in ("seq_len", "max_steps", "eval_interval", "eval_batches", "global_batch_size", "grad_accum"):
        with pytest.raises(ConfigCompositionException, match=f"train.{field}"):
            finetune_cfg(tmp_path, [*init, f"train.{field}=2"])
    with pytest.raises(ConfigCompositionException, match=r"tasks\.rte\.epochs"):  # rte is not selected
        finetune_cfg(tmp_path, [*init, "+tasks.rte.epochs=2"])


def test_mnli_qqp_and_ax_from_official_format_fixtures(tmp_path, pretrained):
    """glue/all over the fixture tasks: MNLI (matched + mismatched + AX from its model) and QQP."""
    run_dir = tmp_path / "all"
    cfg = finetune_cfg(
        run_dir,
        [
            f"init={pretrained / 'run'}",
            "task=[glue/qqp,glue/mnli]",
            f"glue.data_root={FIXTURES}",
            *(f"tasks.{t}.{k}" for t in ("qqp", "mnli") for k in ("epochs=1", "seeds=[0,1]")),
        ],
    )
    summary = finetune(cfg)
    results = json.loads((run_dir / "results.json").read_text())
    assert list(results["columns"]) == ["qqp", "mnli_m", "mnli_mm"]
    assert set(results["columns"]["mnli_m"]["seeds"]) == {"0", "1"}
    for col in ("mnli_m", "mnli_mm"):
        assert 0.0 <= results["columns"][col]["median"]["acc"] <= 100.0
    assert results["glue"]["partial"] and set(results["glue"]["missing_tasks"]) == {
        "cola",
        "sst2",
        "mrpc",
        "stsb",
        "qnli",
        "rte",
        "wnli",
    }
    rows = {"qqp": 4, "mnli_m": 3, "mnli_mm": 2, "ax": 4}  # the fixtures' test rows
    assert check_submission(run_dir / "submission", names=list(rows), expected_rows=rows) == []
    ax = (run_dir / "submission" / "AX.tsv").read_text().splitlines()
    assert ax[0] == "index\tprediction" and {r.split("\t")[1] for r in ax[1:]} <= {
        "entailment",
        "neutral",
        "contradiction",
    }
    assert summary["submission"]["AX"]["seed"] == summary["tasks"]["mnli"]["best_seed"]
    assert not (run_dir / "submission.zip").exists()  # 4 of 11 files: not a complete submission


def test_wandb_runs_are_finetune_jobs_grouped_with_their_pretraining_run(tmp_path, pretrained, monkeypatch):
    """logger=wandb: every task/seed is a wandb run of job type finetune in the pretraining run's group."""
    from lm.core import tracking

    seen = []
    monkeypatch.setattr(tracking.Tracker, "_start_wandb", lambda self, cfg, config: seen.append((cfg, config)))
    cfg = finetune_cfg(
        tmp_path / "ft",
        [
            f"init={pretrained / 'run'}",
            "logger=wandb",
            "task=glue/qqp",
            f"glue.data_root={FIXTURES}",
            "tasks.qqp.epochs=1",
            "tasks.qqp.seeds=[0,1]",
        ],
    )
    finetune(cfg)
    assert [c.job_type for c, _ in seen] == ["finetune", "finetune"]
    assert {c.group for c, _ in seen} == {"run"}  # the pretraining run dir's name (its logger.group is unset)
    assert [c.name for c, _ in seen] == ["ft-qqp-seed0", "ft-qqp-seed1"]
    assert seen[0][1]["task"]["name"] == "qqp" and seen[0][1]["init"] == str(pretrained / "run")


def test_resume_false_leaves_a_sweep_cells_hydra_directory_in_place(tmp_path):
    """8210423: resume=false moved everything but previous/ and .lock aside, .hydra/ too: a sweep cell's, written by
    Hydra for this very job (its overrides.yaml, read by lm report)."""
    from lm.cli.finetune import _set_aside

    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text("- seed=1\n")
    (tmp_path / "sst2").mkdir()
    for name in ("config.yaml", "results.json"):
        (tmp_path / name).write_text("{}\n")
    _set_aside(tmp_path)
    (aside,) = (tmp_path / "previous").iterdir()
    assert sorted(p.name for p in aside.iterdir()) == ["config.yaml", "results.json", "sst2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".hydra", "previous"]
    assert (tmp_path / ".hydra" / "overrides.yaml").read_text() == "- seed=1\n"


@pytest.mark.slow
def test_a_multirun_gives_each_cell_its_own_run_dir(tmp_path, easy_glue, pretrained):
    """`lm finetune -m optim.lr=1e-3,3e-3` put every cell in one run_dir, runs/finetune/<stamp>: the second cell was
    refused by the first's result (one of two cells ran) and had already written its config.yaml over the first's,
    which then named lr 0.003 beside results trained at 0.001. Each cell now has runs/finetune/<stamp>/<job number>."""
    import subprocess
    import sys

    from tests.engine_support import subprocess_env

    args = ["-m", "init=none", f"tokenizer={pretrained / 'data'}", "model=tiny", "model.vocab_size=320"]
    args += [f"glue.data_root={easy_glue}", "task=glue/sst2", "tasks.sst2.epochs=1", "tasks.sst2.max_len=24"]
    proc = subprocess.run(
        [sys.executable, "-m", "lm", "finetune", *args, "train.progress=false", "optim.lr=1e-3,3e-3"],
        cwd=tmp_path,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sweep,) = (tmp_path / "runs" / "finetune").iterdir()
    for cell, lr in (("0", 0.001), ("1", 0.003)):
        assert json.loads((sweep / cell / "results.json").read_text())["columns"]["sst2"]["seeds"]["0"]["acc"] > 0
        assert f"\n  lr: {lr}\n" in (sweep / cell / "config.yaml").read_text()
    assert not (tmp_path / "multirun").exists()  # Hydra's own sweep directory: multirun.yaml is beside the cells
