"""lm finetune resumes a task/seed pair only with the settings it was trained with (FINETUNE_RESUMABLE in
lm/core/resume.py): a changed lr, weight decay or model is refused before the checkpoint is loaded, naming
the fields and the fix; harmless changes (log interval, keep_last) continue to the uninterrupted result.
Also: save_best=true keeps a loadable best-dev checkpoint with its config.

The interruption is an exception raised by the second dev evaluation (after the epoch-1 checkpoint), in
process: what a kill leaves (checkpoints/ of the pair, no result.pt), without a subprocess.
"""

import json
import logging

import pytest
import torch
from omegaconf import OmegaConf

from lm.cli.finetune import finetune
from lm.config import ConfigError
from lm.glue.run import _checkpoint_digest, _with_moved_paths
from lm.glue.trainer import GlueTask
from tests.glue_support import TINY, easy_task, finetune_cfg, pretrain
from tests.glue_support import easy_glue as easy_glue  # fixtures, re-exported
from tests.glue_support import pretrained as pretrained

EPOCHS = 2


class Interrupted(Exception):
    pass


def overrides(easy_glue, pretrained, *extra):
    return [
        "init=none",
        *TINY,
        f"tokenizer={pretrained / 'data'}",
        "train.log_interval=1",
        *easy_task(easy_glue, epochs=EPOCHS),
        *extra,
    ]


def interrupted_run(run_dir, easy_glue, pretrained, monkeypatch):
    """Run until the second evaluation raises: seed0 keeps its epoch-1 checkpoint and no result.pt."""
    evaluate, calls = GlueTask.evaluate, []

    def failing(self, engine, step):
        calls.append(step)
        if len(calls) == 2:
            raise Interrupted(f"interrupted at step {step}")
        return evaluate(self, engine, step)

    with monkeypatch.context() as m:
        m.setattr(GlueTask, "evaluate", failing)
        with pytest.raises(Interrupted):
            finetune(finetune_cfg(run_dir, overrides(easy_glue, pretrained)))
    pair = run_dir / "sst2" / "seed0"
    assert (pair / "checkpoints" / "latest").is_file() and not (pair / "result.pt").exists()
    return pair


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, easy_glue, pretrained):
    run_dir = tmp_path_factory.mktemp("whole") / "ft"
    finetune(finetune_cfg(run_dir, overrides(easy_glue, pretrained)))
    return run_dir


@pytest.mark.parametrize(
    "change, field",
    [
        ("tasks.sst2.lr=1e-3", "task.lr: 0.003 -> 0.001"),
        ("optim.weight_decay=0.1", "optim.weight_decay: 0.01 -> 0.1"),
        ("model.dim=48", "model.dim: 32 -> 48"),  # init=none: the model built is model=
        ("tasks.sst2.epochs=3", "task.epochs: 2.0 -> 3.0"),
    ],
)
def test_a_changed_setting_that_matters_is_refused_naming_it(
    tmp_path, easy_glue, pretrained, monkeypatch, change, field
):
    run_dir = tmp_path / "ft"
    pair = interrupted_run(run_dir, easy_glue, pretrained, monkeypatch)
    latest = (pair / "checkpoints" / "latest").read_text()
    with pytest.raises(ConfigError) as e:
        finetune(finetune_cfg(run_dir, overrides(easy_glue, pretrained, change)))
    msg = str(e.value)
    assert field in msg, msg
    assert f"delete {pair} to train sst2 seed 0 again" in msg and "FINETUNE_RESUMABLE" in msg
    assert (pair / "checkpoints" / "latest").read_text() == latest  # nothing loaded, trained or written
    assert not (pair / "result.pt").exists() and not (run_dir / "results.json").exists()


def test_harmless_changes_resume_to_the_uninterrupted_result(
    tmp_path, easy_glue, pretrained, monkeypatch, uninterrupted, caplog
):
    run_dir = tmp_path / "ft"
    pair = interrupted_run(run_dir, easy_glue, pretrained, monkeypatch)
    with caplog.at_level(logging.INFO, logger="lm"):
        finetune(finetune_cfg(run_dir, overrides(easy_glue, pretrained, "train.log_interval=2", "train.keep_last=2")))
    assert f"resumed from {pair / 'checkpoints' / 'step_'}" in caplog.text  # not a fresh start
    assert "changed setting: train.keep_last: 1 -> 2" in caplog.text
    got, want = (json.loads((d / "results.json").read_text()) for d in (run_dir, uninterrupted))
    a, b = got["tasks"]["sst2"]["runs"]["0"], want["tasks"]["sst2"]["runs"]["0"]
    assert (a["history"], a["best_epoch"], a["main"]) == (b["history"], b["best_epoch"], b["main"])
    assert got["columns"] == want["columns"]
    assert (run_dir / "submission" / "SST-2.tsv").read_text() == (
        uninterrupted / "submission" / "SST-2.tsv"
    ).read_text()


def test_resume_false_sets_the_earlier_job_aside_and_starts_over(
    tmp_path, easy_glue, pretrained, monkeypatch, uninterrupted, caplog
):
    """resume=false over an interrupted pair with another lr: the earlier job's files move to previous/<time>/
    intact, and the new job neither resumes from nor is refused by its checkpoints."""
    run_dir = tmp_path / "ft"
    pair = interrupted_run(run_dir, easy_glue, pretrained, monkeypatch)
    latest = (pair / "checkpoints" / "latest").read_text()
    before = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*") if p.name != ".lock")
    with caplog.at_level(logging.INFO, logger="lm"):
        finetune(finetune_cfg(run_dir, overrides(easy_glue, pretrained, "resume=false", "tasks.sst2.lr=1e-3")))
    (aside,) = (run_dir / "previous").iterdir()
    assert f"moved to {aside}" in caplog.text and "resumed from" not in caplog.text
    assert sorted(p.relative_to(aside) for p in aside.rglob("*")) == before
    assert (aside / "sst2" / "seed0" / "checkpoints" / "latest").read_text() == latest
    assert json.loads((run_dir / "results.json").read_text())["tasks"]["sst2"]["config"]["lr"] == 1e-3
    assert OmegaConf.load(aside / "config.yaml").tasks.sst2.lr == 0.003  # the earlier job's record, not written over

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lm"):  # and once more: the finished job goes aside too
        finetune(finetune_cfg(run_dir, overrides(easy_glue, pretrained, "resume=false")))
    assert len(list((run_dir / "previous").iterdir())) == 2 and "done in an earlier run" not in caplog.text
    got, want = (json.loads((d / "results.json").read_text()) for d in (run_dir, uninterrupted))
    assert got["columns"] == want["columns"]


def test_save_best_keeps_a_loadable_checkpoint_of_the_best_epoch(tmp_path, easy_glue, pretrained):
    from lm.core.checkpoint import consolidated_state_dict, read_trainer, resolve
    from lm.glue.init import Backbone, build_classifier
    from lm.model.config import model_from_saved

    run_dir = tmp_path / "ft"
    summary = finetune(finetune_cfg(run_dir, overrides(easy_glue, pretrained, "save_best=true")))
    run = summary["tasks"]["sst2"]["runs"]["0"]
    ckpt = resolve(run_dir / "sst2" / "seed0" / "best")
    saved = OmegaConf.to_container(OmegaConf.load(ckpt / "config.yaml"))
    assert saved["seed"] == 0 and saved["task"]["name"] == "sst2" and saved["task"]["lr"] == 0.003
    assert saved["model"]["dim"] == 32 and saved["model"]["arch"] == "decoder"  # enums as plain strings
    trainer = read_trainer(ckpt)
    best = next(h for h in run["history"] if h["epoch"] == run["best_epoch"])
    assert trainer["step"] == best["step"] and trainer["main"] == pytest.approx(run["main"])

    weights = consolidated_state_dict(ckpt)  # verified against its manifest, weights_only
    model = build_classifier(
        Backbone(model_from_saved(saved["model"]), None, None, "none"), n_labels=2, dropout=saved["task"]["dropout"]
    )
    model.load_state_dict(weights)  # strict: every parameter of the classifier, nothing else
    assert all(torch.isfinite(v).all() for v in weights.values())
    assert not (run_dir / "sst2" / "seed0" / "checkpoints").exists()  # the resume checkpoints went with result.pt


def test_a_finished_pair_is_not_reused_with_other_settings(tmp_path, easy_glue, pretrained, uninterrupted, caplog):
    import shutil

    run_dir = tmp_path / "ft"
    shutil.copytree(uninterrupted, run_dir, ignore=shutil.ignore_patterns(".lock"))
    result = run_dir / "sst2" / "seed0" / "result.pt"
    with pytest.raises(ConfigError) as e:  # results.json would mix weight decays
        finetune(finetune_cfg(run_dir, overrides(easy_glue, pretrained, "optim.weight_decay=0.1")))
    msg = str(e.value)
    assert f"cannot reuse the finished {result}" in msg and "optim.weight_decay: 0.01 -> 0.1" in msg
    assert f"delete {result.parent} to train this task/seed again" in msg
    with caplog.at_level(logging.INFO, logger="lm"):  # the same settings: skipped, same results
        finetune(finetune_cfg(run_dir, overrides(easy_glue, pretrained, "train.log_interval=5")))
    assert "seed 0: done in an earlier run" in caplog.text
    got, want = (json.loads((d / "results.json").read_text())["columns"] for d in (run_dir, uninterrupted))
    assert got == want


def test_a_damaged_result_is_named_and_its_pair_trained_again(tmp_path, easy_glue, pretrained, uninterrupted, caplog):
    import shutil

    run_dir = tmp_path / "ft"
    shutil.copytree(uninterrupted, run_dir, ignore=shutil.ignore_patterns(".lock"))
    result = run_dir / "sst2" / "seed0" / "result.pt"
    data = bytearray(result.read_bytes())
    data[len(data) // 2] ^= 0xFF  # still a loadable pickle, perhaps: only the checksum can tell
    result.write_bytes(data)
    with caplog.at_level(logging.INFO, logger="lm"):
        finetune(finetune_cfg(run_dir, overrides(easy_glue, pretrained)))
    assert f"{result} is damaged" in caplog.text and "training this task/seed again" in caplog.text
    got, want = (json.loads((d / "results.json").read_text()) for d in (run_dir, uninterrupted))
    assert got["columns"] == want["columns"]
    assert got["tasks"]["sst2"]["runs"]["0"]["history"] == want["tasks"]["sst2"]["runs"]["0"]["history"]
    assert (run_dir / "sst2" / "seed0" / "result.sha256").read_text().strip() != ""


def test_a_finished_pair_is_reused_from_a_moved_pretraining_run_but_not_a_damaged_copy(
    tmp_path, easy_glue, pretrained, caplog
):
    import shutil

    def from_init(init):
        return ["init=" + str(init), *overrides(easy_glue, pretrained)[1:]]

    run_dir = tmp_path / "ft"
    finetune(finetune_cfg(run_dir, from_init(pretrained / "run")))
    want = json.loads((run_dir / "results.json").read_text())["columns"]
    moved = tmp_path / "moved_run"
    shutil.copytree(pretrained / "run", moved, ignore=shutil.ignore_patterns(".lock"))
    with caplog.at_level(logging.INFO, logger="lm"):  # the same weights at a new path: read back
        finetune(finetune_cfg(run_dir, from_init(moved)))
    assert (
        "holds the same checkpoint as the recorded" in caplog.text and "seed 0: done in an earlier run" in caplog.text
    )
    assert json.loads((run_dir / "results.json").read_text())["columns"] == want

    weights = next(moved.glob("checkpoints/step_*/model_optim.pt"))
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(data)  # no longer the recorded checkpoint, whatever its path says
    _checkpoint_digest.cache_clear()
    result = run_dir / "sst2" / "seed0" / "result.pt"
    saved = torch.load(result, weights_only=True)["config_yaml"]
    new = saved.replace(str(pretrained / "run"), str(moved))
    assert new != saved and _with_moved_paths(saved, new, result) == new  # so the pair is refused on init


def test_a_finished_pair_is_not_reused_once_its_init_run_pretrained_further(tmp_path, easy_glue, pretrained):
    """init=<run> names the run's latest checkpoint: after more pretraining under the same path, a finished pair
    (and so results.json, or lm transfer's table at more tokens) would report the old weights as the new ones."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(pretrained / "run", run, ignore=shutil.ignore_patterns(".lock"))
    run_dir, cfg = tmp_path / "ft", ["init=" + str(run), *overrides(easy_glue, pretrained)[1:]]
    finetune(finetune_cfg(run_dir, cfg))
    result = run_dir / "sst2" / "seed0" / "result.pt"
    before = result.read_bytes()
    pretrain(pretrained, run, max_steps=6)  # the same run, 3 steps more
    with pytest.raises(ConfigError) as e:
        finetune(finetune_cfg(run_dir, cfg))
    msg = str(e.value)
    assert f"cannot reuse the finished {result}" in msg and "init_weights: 'step_00000003, manifest sha256" in msg
    assert "-> 'step_00000006, manifest sha256" in msg and f"delete {result.parent} to train" in msg
    assert result.read_bytes() == before  # kept as it was


def test_a_finished_pair_is_reused_with_a_moved_copy_of_its_tokenizer_but_not_another(
    tmp_path, easy_glue, pretrained, uninterrupted, caplog
):
    """lm transfer shares a scratch arm between corpus configs that share a tokenizer: the path differs
    (another prepared data dir), the file's sha256 does not."""
    import shutil

    def with_tokenizer(path):
        return [o if not o.startswith("tokenizer=") else f"tokenizer={path}" for o in overrides(easy_glue, pretrained)]

    run_dir = tmp_path / "ft"
    shutil.copytree(uninterrupted, run_dir, ignore=shutil.ignore_patterns(".lock"))
    original = pretrained / "data" / "tokenizer.json"
    copy = tmp_path / "other_data" / "tokenizer.json"
    copy.parent.mkdir()
    shutil.copyfile(original, copy)
    with caplog.at_level(logging.INFO, logger="lm"):
        finetune(finetune_cfg(run_dir, with_tokenizer(copy)))
    assert f"tokenizer {copy} holds the same tokenizer as the recorded {pretrained / 'data'}" in caplog.text
    assert "seed 0: done in an earlier run" in caplog.text
    got, want = (json.loads((d / "results.json").read_text())["columns"] for d in (run_dir, uninterrupted))
    assert got == want

    copy.write_bytes(original.read_bytes() + b"\n")  # another file, whatever it decodes to
    with pytest.raises(ConfigError) as e:
        finetune(finetune_cfg(run_dir, with_tokenizer(copy)))
    assert f"tokenizer: '{pretrained / 'data'}' -> '{copy}'" in str(e.value)


def test_a_task_field_newer_than_a_finished_pair_counts_as_its_default(tmp_path, easy_glue, pretrained, uninterrupted):
    """A result.pt written before a GlueTaskConfig field existed (here: its task.dropout line removed, as a
    pair finished before tasks.<task>.whiten did) is reused only while that field keeps its default."""
    import shutil

    import yaml

    from lm.core.files import file_sha256
    from lm.glue.run import RESULT_SHA256

    run_dir = tmp_path / "ft"
    shutil.copytree(uninterrupted, run_dir, ignore=shutil.ignore_patterns(".lock"))
    result = run_dir / "sst2" / "seed0" / "result.pt"
    fields = torch.load(result, weights_only=True)
    saved = yaml.safe_load(fields["config_yaml"])
    del saved["task"]["dropout"]
    torch.save({**fields, "config_yaml": yaml.safe_dump(saved)}, result)
    result.with_name(RESULT_SHA256).write_text(file_sha256(result))
    with pytest.raises(ConfigError, match=r"task\.dropout: 0\.1 -> 0\.3"):
        finetune(finetune_cfg(run_dir, overrides(easy_glue, pretrained, "tasks.sst2.dropout=0.3")))
    finetune(finetune_cfg(run_dir, overrides(easy_glue, pretrained)))  # the default: reused, not retrained
    got, want = (json.loads((d / "results.json").read_text())["columns"] for d in (run_dir, uninterrupted))
    assert got == want
