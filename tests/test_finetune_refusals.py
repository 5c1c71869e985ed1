"""lm finetune refuses, in one line and before it writes anything, what would lose or mix work (issue 49):
a run_dir that is (or holds) another command's run, an export whose config.json no longer fits its
weights, a result.pt it did not write."""

import json
import pickle

import pytest

from lm.cli.export import export
from lm.cli.finetune import check_run_dir, finetune
from lm.config import ConfigError
from lm.core.checkpoint import CheckpointError
from lm.glue.init import InitError, build_classifier, load_backbone
from tests.glue_support import easy_glue, easy_task, finetune_cfg, pretrained  # noqa: F401 - fixtures, helpers


def test_a_pretraining_run_is_not_a_finetune_run_dir(pretrained, easy_glue):  # noqa: F811
    run = pretrained / "run"
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    with pytest.raises(ConfigError) as e:
        finetune(finetune_cfg(run, [f"init={run}", *easy_task(easy_glue)]))
    assert str(e.value) == (
        f"run_dir={run} is an lm train run (it holds checkpoints/); lm finetune would write its "
        f"config.yaml and results into it: pick a new run_dir, e.g. "
        f"run_dir={pretrained / 'run_finetune'}"
    )
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    assert not (run / "sst2").exists() and not (run / "results.json").exists()


def test_a_directory_holding_another_run_is_refused(pretrained, tmp_path):  # noqa: F811
    with pytest.raises(ConfigError, match=r"holds run/, an lm train run \(it holds checkpoints/\)"):
        check_run_dir(pretrained, "none")
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "config.yaml").write_text("train: {max_steps: 3}\n")
    with pytest.raises(ConfigError, match=r"holds report/, another command's run \(its config.yaml is not"):
        check_run_dir(tmp_path, "none")
    (tmp_path / "report" / "config.yaml").unlink()
    (tmp_path / "models" / "a").mkdir(parents=True)
    with pytest.raises(ConfigError, match=rf"holds init={tmp_path / 'models' / 'a'}, the model finetuning starts"):
        check_run_dir(tmp_path, str(tmp_path / "models" / "a"))


def test_new_and_earlier_finetune_run_dirs_pass(tmp_path):
    check_run_dir(tmp_path / "new", "none")
    (tmp_path / "ft" / "sst2" / "seed0" / "checkpoints").mkdir(parents=True)  # a pair's own checkpoints
    (tmp_path / "ft" / "config.yaml").write_text("init: runs/a\ntasks: {sst2: {}}\n")
    check_run_dir(tmp_path / "ft", "none")


def test_an_export_whose_config_json_was_edited_is_one_line(pretrained, tmp_path):  # noqa: F811
    out = export(pretrained / "run", tmp_path / "exp", hf=False)
    config = json.loads((out / "config.json").read_text())
    config["dim"] *= 2
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(InitError) as e:
        build_classifier(load_backbone(str(out), tokenizer=str(pretrained / "data")), 2, 0.0)
    msg = str(e.value)
    assert msg.startswith(f"{out}: the weights do not fit its config.json (size mismatch for ") and "\n" not in msg
    assert msg.endswith("restore it (an lm export directory: export the checkpoint again)")


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", "\udcff"])
def test_an_export_whose_config_json_is_not_a_json_object_is_one_line(tmp_path, text):
    out = tmp_path / "exp"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"")
    (out / "config.json").write_bytes(text.encode("utf-8", "surrogateescape"))  # "\udcff": the byte 0xff
    with pytest.raises(CheckpointError) as e:
        load_backbone(str(out), tokenizer=None)
    msg = str(e.value)
    assert msg.startswith(f"{out / 'config.json'} is ") and "\n" not in msg
    assert msg.endswith("not the model config lm export writes; restore it (export the checkpoint again)")


class _Payload:
    def __reduce__(self):  # what a crafted pickle does: call something when loaded
        return (exec, ("open('PWNED', 'w').write('ran')",))


def test_a_crafted_result_pt_is_refused_and_never_runs(pretrained, easy_glue, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    pair = tmp_path / "ft" / "sst2" / "seed0"
    pair.mkdir(parents=True)
    (pair / "result.pt").write_bytes(pickle.dumps(_Payload()))
    with pytest.raises(CheckpointError) as e:
        finetune(finetune_cfg(tmp_path / "ft", [f"init={pretrained / 'run'}", *easy_task(easy_glue)]))
    assert str(e.value).startswith(f"{pair / 'result.pt'} is not a result lm finetune wrote, or is damaged (")
    assert str(e.value).endswith(f"delete {pair} to train this task/seed again") and "\n" not in str(e.value)
    assert not (tmp_path / "PWNED").exists() and (pair / "result.pt").is_file()  # nothing ran, nothing deleted
