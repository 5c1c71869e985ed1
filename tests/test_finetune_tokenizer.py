"""lm finetune init=RUN checks the tokenizer against the sha256 the pretraining loader recorded in the
checkpoint: a data directory re-prepared with another vocabulary after pretraining is refused (naming
both files and hashes and the fix), and the original tokenizer.json passed as tokenizer= is accepted."""

import contextlib
import shutil

import pytest

from lm.core.checkpoint import resolve
from lm.data.prepare import prepare
from lm.glue.init import InitError, load_backbone

# fixtures; `as` re-exports them (this module gets its own run)
from tests.glue_support import easy_glue as easy_glue
from tests.glue_support import pretrained as pretrained


def _recorded(run_dir):
    from lm.core.checkpoint import resolve
    from lm.glue.init import _recorded_tokenizer_sha256

    return _recorded_tokenizer_sha256(resolve(run_dir))


def test_the_checkpoint_records_the_tokenizer_it_was_trained_with(pretrained):  # noqa: F811
    import hashlib

    original = pretrained / "data" / "tokenizer.json"
    assert _recorded(pretrained / "run") == hashlib.sha256(original.read_bytes()).hexdigest()
    assert load_backbone(str(pretrained / "run")).tokenizer.sha256 == _recorded(pretrained / "run")


@contextlib.contextmanager
def re_prepared(pretrained, tmp_path):
    """The run's data directory prepared again with another vocabulary (what --force allows); yields a copy of
    the original tokenizer.json, and puts the original data back afterwards for later tests of this module."""
    from omegaconf import OmegaConf

    from lm.data.config import DataConfig

    run = pretrained / "run"
    keep = tmp_path / "original_tokenizer.json"
    shutil.copy(pretrained / "data" / "tokenizer.json", keep)
    shutil.copytree(pretrained / "data", tmp_path / "data_backup")
    saved = OmegaConf.load(run / "config.yaml").data
    data = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(DataConfig), saved, {"vocab_size": 300}))
    prepare(data, force=True, progress=False)
    try:
        assert (pretrained / "data" / "tokenizer.json").read_bytes() != keep.read_bytes()  # it really changed
        yield keep
    finally:
        shutil.rmtree(pretrained / "data")
        shutil.copytree(tmp_path / "data_backup", pretrained / "data")


def test_a_re_prepared_data_directory_is_refused_and_the_original_file_accepted(pretrained, tmp_path):  # noqa: F811
    run = pretrained / "run"
    recorded = _recorded(run)
    with re_prepared(pretrained, tmp_path) as keep:
        with pytest.raises(InitError) as e:
            load_backbone(str(run))
        msg = str(e.value)
        assert str(pretrained / "data" / "tokenizer.json") in msg and recorded[:12] in msg
        assert "re-prepared" in msg and "tokenizer=<the original tokenizer.json>" in msg
        with pytest.raises(InitError, match=f"not the tokenizer .* was pretrained with .*{recorded[:12]}"):
            load_backbone(str(run), tokenizer=str(pretrained / "data"))  # naming the new file does not help
        backbone = load_backbone(str(run), tokenizer=str(keep))  # the original copy: accepted
        assert backbone.tokenizer.sha256 == recorded


def test_lm_export_refuses_to_put_a_re_prepared_tokenizer_in_hf(pretrained, tmp_path):  # noqa: F811
    """issue 49 item 4: hf/ got the data directory's new tokenizer beside the old weights."""
    from lm.cli.export import main

    run, out = pretrained / "run", tmp_path / "exp"
    recorded = _recorded(run)
    with re_prepared(pretrained, tmp_path) as keep:
        for extra in ([], ["--tokenizer", str(pretrained / "data")]):
            with pytest.raises(SystemExit) as e:
                main([str(run), "--out", str(out), *extra])
            msg = str(e.value.code)
            assert msg.startswith(f"lm export: {pretrained / 'data' / 'tokenizer.json'} (") and "\n" not in msg
            assert f"is not the tokenizer {resolve(run)} was pretrained with (sha256 {recorded[:12]}" in msg
            assert "--tokenizer <the original tokenizer.json>" in msg and "--no-hf" in msg
            assert not out.exists()  # refused before anything was written
        main([str(run), "--out", str(out), "--no-hf"])  # the weights alone need no tokenizer
        main([str(run), "--out", str(out), "--force", "--tokenizer", str(keep)])  # the original file: accepted
        assert (out / "hf" / "tokenizer.json").is_file()
