"""lm export never deletes what it did not write (issue 22 item 1): --out must be new, empty, or a
previous export (replaced only with --force, atomically); the run directory, a directory holding it,
the current directory and files are refused with a message, not a traceback."""

import json

import pytest
from safetensors.torch import load_file

from lm.cli import export as export_cli
from lm.cli.export import export, main
from lm.cli.train import train
from lm.core.checkpoint import CheckpointError, consolidated_state_dict, resolve
from tests.engine_support import compose, loaders, tiny_overrides


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("export") / "run"
    cfg = compose(tiny_overrides(path, 2))
    train(cfg, loaders=loaders(cfg))
    return path


def exit_message(argv) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert isinstance(e.value.code, str), e.value.code  # sys.exit(message): status 1, no traceback
    return e.value.code


def test_help_names_every_family_the_hf_directory_converts(capsys):
    """`lm export --help` named GPT-2, Llama, BERT and T5 after ESM joined FAMILIES (README, docs/convert.md)."""
    from lm.model.hf_families import FAMILIES

    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the description
    names = {"gpt2": "GPT-2", "llama": "Llama", "bert": "BERT", "esm": "ESM", "t5": "T5"}
    assert set(FAMILIES) == set(names)
    assert all(name in text for name in names.values()), text
    # an example and the next step: what loads the output (a newcomer's --help named neither)
    assert "lm export runs/" in text and "from_pretrained" in text and "init=<out>" in text


def test_export_writes_the_checkpoint_weights(run_dir, tmp_path):
    out = export(run_dir, tmp_path / "new" / "out", hf=False)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert json.loads((out / "config.json").read_text())["_lm_class"] == "DecoderLM"
    weights, reference = load_file(out / "model.safetensors"), consolidated_state_dict(resolve(run_dir))
    assert weights and all((weights[k] == reference[k]).all() for k in weights)
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["out"]  # no temporary directory left


def test_a_directory_with_user_files_is_refused_even_with_force(run_dir, tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "thesis.txt").write_text("x")
    for force in ([], ["--force"]):
        message = exit_message([str(run_dir), "--out", str(tmp_path / "d"), "--no-hf", *force])
        assert "non-empty directory that is not an lm export output (it holds thesis.txt)" in message
    assert (tmp_path / "d" / "thesis.txt").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


@pytest.mark.parametrize("where", ["run", "parent", "checkpoints"])
def test_the_run_directory_or_one_holding_it_is_refused(run_dir, where):
    out = {"run": run_dir, "parent": run_dir.parent, "checkpoints": run_dir / "checkpoints"}[where]
    before = sorted(p.relative_to(run_dir.parent) for p in run_dir.parent.rglob("*"))
    message = exit_message([str(run_dir), "--out", str(out), "--no-hf", "--force"])
    assert f"--out {out} is the run directory {run_dir} or holds it" in message
    assert sorted(p.relative_to(run_dir.parent) for p in run_dir.parent.rglob("*")) == before


def test_the_current_directory_and_a_file_get_a_clear_message(run_dir, tmp_path, monkeypatch):
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "notes.md").write_text("mine")
    monkeypatch.chdir(tmp_path / "here")
    assert "--out . is the current directory" in exit_message([str(run_dir), "--out", ".", "--no-hf", "--force"])
    assert "--out .. is the current directory (or holds it)" in exit_message([str(run_dir), "--out", "..", "--no-hf"])
    assert exit_message([str(run_dir), "--out", "notes.md", "--no-hf"]) == (
        "lm export: --out notes.md is a file, not a directory; name a directory (new, empty, or a previous export)"
    )  # not "remove it": the file is the user's
    assert (tmp_path / "here" / "notes.md").read_text() == "mine"


def test_a_symbolic_link_is_named_as_one(run_dir, tmp_path):
    """A link to a directory was called "a file, not a directory": untrue, and no hint that its target works."""
    (tmp_path / "target").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "target")
    assert exit_message([str(run_dir), "--out", str(tmp_path / "link"), "--no-hf"]) == (
        f"lm export: --out {tmp_path / 'link'} is a symbolic link (to {tmp_path / 'target'}); name a real directory: "
        "the link's target itself, or a new one"
    )
    assert list((tmp_path / "target").iterdir()) == []


def test_a_previous_export_is_replaced_only_with_force(run_dir, tmp_path, capsys):
    out = tmp_path / "exp"
    main([str(run_dir), "--out", str(out), "--no-hf"])
    assert f"exported {out}: config.json, model.safetensors" in capsys.readouterr().out
    (out / "model.safetensors").write_bytes(b"old")  # to see whether it was replaced
    assert "holds a previous export; pass --force" in exit_message([str(run_dir), "--out", str(out), "--no-hf"])
    assert (out / "model.safetensors").read_bytes() == b"old"
    main([str(run_dir), "--out", str(out), "--no-hf", "--force"])
    assert load_file(out / "model.safetensors")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp"]  # neither the new temp nor the old one left


def test_a_file_a_user_added_to_hf_is_never_replaced_even_with_force(run_dir, tmp_path):
    """--force replaced a previous export whole, checking only its top level: hf/README.md, a model card written by
    hand into the export's Hugging Face directory, was deleted."""
    out = export(run_dir, tmp_path / "exp")
    written = sorted(p.name for p in (out / "hf").iterdir())
    assert {"config.json", "model.safetensors"} <= set(written)
    (out / "hf" / "README.md").write_text("my model card")
    message = exit_message([str(run_dir), "--out", str(out), "--force"])
    assert "non-empty directory that is not an lm export output (it holds hf/README.md)" in message
    assert (out / "hf" / "README.md").read_text() == "my model card"
    (out / "hf" / "README.md").unlink()
    main([str(run_dir), "--out", str(out), "--force"])  # what export wrote alone is a previous export
    assert sorted(p.name for p in (out / "hf").iterdir()) == written


def test_an_empty_directory_is_used(run_dir, tmp_path):
    (tmp_path / "empty").mkdir()
    assert export(run_dir, tmp_path / "empty", hf=False) == tmp_path / "empty"
    assert (tmp_path / "empty" / "model.safetensors").is_file()


def test_a_failed_replacement_leaves_the_previous_export(run_dir, tmp_path, monkeypatch):
    out = export(run_dir, tmp_path / "exp", hf=False)
    before = (out / "model.safetensors").read_bytes()

    def broken(model, out, cfg):
        raise RuntimeError("disk full while writing hf/")

    monkeypatch.setattr(export_cli, "_export_hf", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        export(run_dir, out, hf=True, force=True)
    assert (out / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp"]


def test_the_default_output_sits_in_the_checkpoint(run_dir):
    out = export(run_dir, hf=False)
    assert out == resolve(run_dir) / "export"
    with pytest.raises(CheckpointError, match="previous export"):
        export(run_dir, hf=False)
    assert export(run_dir, hf=False, force=True) == out


def test_a_second_export_to_one_out_waits_and_keeps_the_firsts_files(run_dir, tmp_path):
    """Two exports to one --out at once: the second swept the first's temporary directory away as left by a killed
    export (the first's write then failed) and swapped its own output over the first's without --force."""
    import fcntl
    import os
    import shutil
    import threading

    first = export(run_dir, tmp_path / "first", hf=False)
    out, writing = tmp_path / "exp", tmp_path / ".exp.tmp-1"  # what another export, running, writes
    writing.mkdir()
    (writing / "model.safetensors").write_bytes(b"half")
    fd = os.open(tmp_path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as the running export holds it
    errors = []

    def second():
        try:
            export(run_dir, out, hf=False)
        except CheckpointError as e:
            errors.append(str(e))

    thread = threading.Thread(target=second)
    thread.start()
    thread.join(timeout=5)
    assert thread.is_alive() and (writing / "model.safetensors").read_bytes() == b"half" and not out.exists()
    shutil.copytree(first, out)  # the running export finishes
    shutil.rmtree(writing)
    os.close(fd)
    thread.join()
    assert errors and "holds a previous export; pass --force" in errors[0]
    assert (out / "model.safetensors").read_bytes() == (first / "model.safetensors").read_bytes()


def test_out_below_a_file_is_one_line(run_dir, tmp_path):
    (tmp_path / "notes.md").write_text("mine")
    message = exit_message([str(run_dir), "--out", str(tmp_path / "notes.md" / "exp"), "--no-hf"])
    assert message == (
        f"lm export: --out {tmp_path / 'notes.md' / 'exp'} lies below {tmp_path / 'notes.md'}, which is "
        f"a file, not a directory; name a directory elsewhere"
    )
    assert (tmp_path / "notes.md").read_text() == "mine"


@pytest.mark.parametrize("error", ["safetensors", "oserror"])
def test_a_full_disk_is_one_line_and_keeps_the_previous_export(run_dir, tmp_path, monkeypatch, error):
    import errno

    import safetensors.torch

    out = export(run_dir, tmp_path / "exp", hf=False)
    before = (out / "model.safetensors").read_bytes()

    def full(model, filename, *a, **k):
        if error == "oserror":
            raise OSError(errno.ENOSPC, "No space left on device", filename)
        raise safetensors.SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.torch, "save_model", full)
    message = exit_message([str(run_dir), "--out", str(out), "--no-hf", "--force"])
    assert message.startswith("lm export: ") and "\n" not in message
    assert message.endswith("— free space on that disk, or write somewhere else")
    assert (out / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp"]  # no temporary directory left


def test_the_hugging_face_directory_is_written_without_deepspeeds_no_gpu_warning(run_dir, tmp_path):
    """lm export (the README's) printed DeepSpeed's '[WARNING] ... Setting accelerator to CPU. If you have GPU or other
    accelerator, we were unable to detect it.' on a CPU machine: transformers' save_pretrained imports deepspeed."""
    import importlib.util
    import os
    import subprocess
    import sys

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    p = subprocess.run(
        [sys.executable, "-m", "lm", "export", str(run_dir), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "out" / "hf" / "config.json").is_file()
    if importlib.util.find_spec("deepspeed") is not None:  # without it nothing warned
        assert "Setting accelerator to CPU" not in p.stdout + p.stderr, p.stdout + p.stderr
