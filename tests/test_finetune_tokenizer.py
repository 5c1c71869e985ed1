"""lm finetune init=RUN checks the tokenizer against the sha256 the pretraining loader recorded in the
checkpoint: a data directory re-prepared with another vocabulary after pretraining is refused (naming
both files and hashes and the fix), and the original tokenizer.json passed as tokenizer= is accepted."""

import shutil

import pytest

from lm.data.prepare import prepare
from lm.glue.init import InitError, load_backbone
from tests.test_finetune import easy_glue, pretrained  # noqa: F401 - fixtures (this module gets its own run)


def _recorded(run_dir):
    from lm.glue.init import _recorded_tokenizer_sha256
    from lm.core.checkpoint import resolve

    return _recorded_tokenizer_sha256(resolve(run_dir))


def test_the_checkpoint_records_the_tokenizer_it_was_trained_with(pretrained):  # noqa: F811
    import hashlib

    original = pretrained / "data" / "tokenizer.json"
    assert _recorded(pretrained / "run") == hashlib.sha256(original.read_bytes()).hexdigest()
    assert load_backbone(str(pretrained / "run")).tokenizer.sha256 == _recorded(pretrained / "run")


def test_a_re_prepared_data_directory_is_refused_and_the_original_file_accepted(pretrained, tmp_path):  # noqa: F811
    from omegaconf import OmegaConf

    from lm.data.config import DataConfig

    run = pretrained / "run"
    keep = tmp_path / "original_tokenizer.json"
    shutil.copy(pretrained / "data" / "tokenizer.json", keep)
    shutil.copytree(pretrained / "data", tmp_path / "data_backup")
    recorded = _recorded(run)
    saved = OmegaConf.load(run / "config.yaml").data
    data = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(DataConfig), saved, {"vocab_size": 300}))
    prepare(data, force=True, progress=False)  # the same directory, another vocabulary (what --force allows)
    try:
        new = (pretrained / "data" / "tokenizer.json").read_bytes()
        assert new != keep.read_bytes()  # the test is meaningful: the vocabulary really changed
        with pytest.raises(InitError) as e:
            load_backbone(str(run))
        msg = str(e.value)
        assert str(pretrained / "data" / "tokenizer.json") in msg and recorded[:12] in msg
        assert "re-prepared" in msg and "tokenizer=<the original tokenizer.json>" in msg
        with pytest.raises(InitError, match=f"not the tokenizer .* was pretrained with .*{recorded[:12]}"):
            load_backbone(str(run), tokenizer=str(pretrained / "data"))  # naming the new file does not help
        backbone = load_backbone(str(run), tokenizer=str(keep))  # the original copy: accepted
        assert backbone.tokenizer.sha256 == recorded
    finally:  # put the run's original data back for any later test of this module
        shutil.rmtree(pretrained / "data")
        shutil.copytree(tmp_path / "data_backup", pretrained / "data")
