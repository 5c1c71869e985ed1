"""An unwritable default run_dir (no run_dir= given; the current directory is read-only, or a file named
`runs` is in the way) and an unwritable hydra.run.dir= are refused by lm train and lm finetune in one
paragraph naming the path and the fix, before Hydra tries to create the directory (issue 22, item d)."""

import os
import sys

import pytest

from lm.cli.app import _check_run_dir_arg, _default_run_dir_prefix
from tests.test_validation_errors import read_only_dir, run_cli


def test_the_default_prefixes_come_from_the_configs():
    assert _default_run_dir_prefix("train") == "runs/"
    assert _default_run_dir_prefix("finetune") == "runs/finetune/"


def test_a_read_only_current_directory_is_refused_naming_it(tmp_path, monkeypatch):
    ro = read_only_dir(tmp_path / "ro", monkeypatch)
    monkeypatch.chdir(ro)
    monkeypatch.setattr(sys, "argv", ["lm train", "model=tiny"])
    with pytest.raises(SystemExit) as e:
        _check_run_dir_arg("lm train", "train")
    assert str(e.value) == (
        f"lm train: the default run_dir (runs/<overrides>, under the current directory {ro}) is "
        f"not writable: Permission denied ({ro}). Pass run_dir=<a writable directory>, or run "
        f"lm train from a directory you can write to"
    )
    monkeypatch.setattr(sys, "argv", ["lm train", f"run_dir={tmp_path / 'elsewhere'}"])
    _check_run_dir_arg("lm train", "train")  # the fix the message names works
    ro.chmod(0o700)


def test_an_unwritable_hydra_run_dir_is_refused(tmp_path, monkeypatch):
    ro = read_only_dir(tmp_path / "ro", monkeypatch)
    monkeypatch.setattr(sys, "argv", ["lm finetune", f"hydra.run.dir={ro / 'x'}"])
    with pytest.raises(
        SystemExit,
        match=rf"^lm finetune: hydra.run.dir={ro / 'x'} is not writable: Permission "
        rf"denied \({ro}\); pick another hydra.run.dir$",
    ):
        _check_run_dir_arg("lm finetune", "finetune")
    ro.chmod(0o700)


@pytest.mark.parametrize(
    "module, args, prefix",
    [
        ("lm.cli.train", ["model=tiny"], "runs/"),
        ("lm.cli.finetune", ["task=glue/rte", "init=none"], "runs/finetune/"),
    ],
)
def test_cli_default_run_dir_blocked_by_a_file_is_one_paragraph(tmp_path, module, args, prefix):
    (tmp_path / "runs").write_text("a user's file, not a directory\n")
    p = run_cli(module, *args, cwd=tmp_path)
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr + p.stdout and "Error executing job" not in p.stderr
    err = p.stderr.strip()
    assert len(err.splitlines()) == 1, err
    prog = module.replace("lm.cli.", "lm ")
    assert err == (
        f"{prog}: the default run_dir ({prefix}<overrides>, under the current directory {tmp_path}) is "
        f"not writable: Not a directory ({tmp_path / 'runs'}). Pass run_dir=<a writable directory>, or run "
        f"{prog} from a directory you can write to"
    )
    assert (tmp_path / "runs").read_text() == "a user's file, not a directory\n"
    assert sorted(os.listdir(tmp_path)) == ["runs"]  # nothing else created


def test_lm_train_names_a_missing_data_source_in_one_line(tmp_path):
    p = run_cli(
        "lm.cli.train",
        "model=tiny",
        f"run_dir={tmp_path / 'run'}",
        "data.name=bad",
        f"data.source={tmp_path / 'nonexistent.txt'}",
        "train.max_steps=1",
        cwd=tmp_path,
    )
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stdout + p.stderr and "HYDRA_FULL_ERROR" not in p.stdout + p.stderr
    assert f"DataError: {tmp_path / 'nonexistent.txt'}: no such file or directory" in p.stdout + p.stderr


def _resolved_run_dir(tmp_path, module, *args):
    p = run_cli(module, *args, "--cfg", "job", "--resolve", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    return next(line.split(": ", 1)[1] for line in p.stdout.splitlines() if line.startswith("run_dir: "))


def test_the_default_run_dir_is_named_by_the_overrides_so_the_same_command_resumes(tmp_path):
    """Issue 48 item 5: no timestamp in the default run_dir. The same overrides (in any order, and with another
    length or log interval, which resume may change) name the same directory; another model names another."""
    a = _resolved_run_dir(tmp_path, "lm.cli.train", "model=tiny", "model/ffn=swiglu", "train.max_steps=10")
    assert a == "runs/model-tiny+model_ffn-swiglu"
    assert (
        _resolved_run_dir(
            tmp_path, "lm.cli.train", "train.log_interval=1", "model/ffn=swiglu", "model=tiny", "train.max_steps=20"
        )
        == a
    )
    assert _resolved_run_dir(tmp_path, "lm.cli.train", "model=tiny") == "runs/model-tiny"
    assert _resolved_run_dir(tmp_path, "lm.cli.train") == "runs/default"
    own = _resolved_run_dir(tmp_path, "lm.cli.train", f"data.source={tmp_path}/my text.txt")
    assert own.startswith("runs/data-text+data.source-_")  # a data.source implies data=text (lm/cli/own_data.py)
    assert "/" not in own.removeprefix("runs/") and " " not in own  # a path's slashes and spaces nest no directories
    long = _resolved_run_dir(tmp_path, "lm.cli.train", *[f"+x{i}=aaaaaaaaaa" for i in range(12)], "--cfg", "job")
    assert len(long) <= len("runs/") + 96
    assert (
        _resolved_run_dir(tmp_path, "lm.cli.finetune", "task=glue/rte", "init=none")
        == "runs/finetune/init-none+task-glue_rte"
    )


def test_a_sweep_with_one_run_dir_gives_each_cell_its_own_directory():
    """Issue 48 item 6: `lm train -m ... run_dir=X` makes X the sweep directory and X/<job number> each cell's."""
    from lm.cli.app import cells_apart

    assert cells_apart(["-m", "seed=0,1", "run_dir=runs/abl"]) == [
        "-m",
        "seed=0,1",
        "run_dir=runs/abl/${hydra:job.num}",
        "hydra.sweep.dir=runs/abl",
    ]
    assert cells_apart(["--multirun", "run_dir=a", "hydra.sweep.dir=s"]) == [
        "--multirun",
        "hydra.sweep.dir=s",
        "run_dir=a/${hydra:job.num}",
    ]
    for args in (
        ["seed=0", "run_dir=a"],  # one run: the run_dir is the run's
        ["-m", "run_dir=a,b"],  # a swept run_dir already gives each cell its own
        ["-m", "run_dir=${hydra:runtime.output_dir}"],  # an interpolation is the user's plan
        ["-m", "seed=0,1"],
    ):  # no run_dir: the default is runs/<stamp>/<job number>
        assert cells_apart(args) == args
