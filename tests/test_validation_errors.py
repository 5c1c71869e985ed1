"""Inputs a user can get wrong are refused before any work, in one line that names the field or file, the
value and the fix (issue 22, item 8): non-finite or out-of-range hyperparameters, an unwritable run_dir,
GLUE files with a header and no examples, an unknown `task=`."""

import errno
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from lm.config import ConfigError, conf_dir
from lm.core.checkpoint import CheckpointError
from lm.core.lock import RunDirUnwritable, lock_run_dir, release
from lm.glue.config import check_task_args, finetune_job
from lm.glue.readers import GlueDataError, read_tsv
from lm.glue.tasks import GLUE_TASKS, get_task
from tests.engine_support import compose as compose_train
from tests.engine_support import loaders, tiny_overrides

# -- hyperparameters ---------------------------------------------------------------------------------

TRAIN_CASES = [
    ("optim.lr=nan", r"optim\.lr=nan must be a finite number > 0, e\.g\. optim\.lr="),
    ("optim.lr=inf", r"optim\.lr=inf must be a finite number > 0"),
    (
        "optim.betas=[2,3]",
        r"optim\.betas=\[2\.0, 3\.0\] must be two numbers, each in \[0, 1\).*optim\.betas=\[0\.9,0\.95\]",
    ),
    ("optim.betas=[0.9,1.0]", r"optim\.betas=\[0\.9, 1\.0\] must be two numbers, each in \[0, 1\)"),
    ("optim.eps=-1", r"optim\.eps=-1\.0 must be a finite number > 0, e\.g\. optim\.eps=1e-8"),
    ("optim.weight_decay=nan", r"optim\.weight_decay=nan must be a finite number >= 0"),
    ("train.ckpt_interval=-1", r"train\.ckpt_interval=-1 must be >= 0 \(0 = only at the end of the run\)"),
    ("train.eval_interval=-5", r"train\.eval_interval=-5 must be >= 0 \(0 = only at the end of the run\)"),
    ("train.grad_clip=inf", r"train\.grad_clip=inf must be a finite number >= 0 \(0 disables clipping\)"),
    ("train.peak_flops=nan", r"train\.peak_flops=nan must be a finite number > 0"),
    ("sched.warmup_steps=-1", r"sched\.warmup_steps=-1 must be >= 0"),
    ("sched.min_lr_ratio=nan", r"sched\.min_lr_ratio=nan must be a number in \[0, 1\]"),
    ("sched.decay_fraction=inf", r"sched\.decay_fraction=inf must be a number in \(0, 1\]"),
]


@pytest.mark.parametrize("override,message", TRAIN_CASES, ids=[c[0] for c in TRAIN_CASES])
def test_lm_train_refuses_bad_hyperparameters_before_any_work(tmp_path, override, message):
    from lm.cli.train import train

    run_dir = tmp_path / "run"
    cfg = compose_train(tiny_overrides(run_dir, 2) + [override])
    with pytest.raises(ConfigError, match=message):
        train(cfg, loaders=loaders(cfg))
    assert not run_dir.exists()  # refused before the run directory (or anything else) was made


def test_the_defaults_and_edge_values_still_pass(tmp_path):
    from lm.core.config import OptimConfig, SchedConfig, TrainConfig, validate_train

    validate_train(TrainConfig(), OptimConfig(), SchedConfig())
    validate_train(
        TrainConfig(eval_interval=0, ckpt_interval=0, grad_clip=0.0),
        OptimConfig(betas=[0.0, 0.999], weight_decay=0.0),
        SchedConfig(warmup_steps=0, min_lr_ratio=1.0),
    )


def finetune_overrides(tmp_path, *extra):
    return [f"run_dir={tmp_path / 'ft'}", "init=none", "task=glue/sst2", "hf=false", *extra]


def compose_finetune(overrides):
    from lm.cli.finetune import register

    register()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        return compose(config_name="finetune", overrides=overrides)


FINETUNE_CASES = [
    ("optim.lr=nan", r"optim\.lr=nan must be a finite number > 0"),
    ("optim.betas=[2,3]", r"optim\.betas=\[2\.0, 3\.0\] must be two numbers, each in \[0, 1\)"),
    ("optim.eps=-1", r"optim\.eps=-1\.0 must be a finite number > 0"),
    ("train.ckpt_interval=-1", r"train\.ckpt_interval=-1 must be >= 0 \(0 = at the end of every epoch\)"),
    ("train.grad_clip=nan", r"train\.grad_clip=nan must be a finite number >= 0"),
    ("tasks.sst2.lr=nan", r"tasks\.sst2\.lr=nan must be a finite number > 0, or null for optim\.lr"),
    ("tasks.sst2.lr=inf", r"tasks\.sst2\.lr=inf must be a finite number > 0"),
    ("tasks.sst2.epochs=nan", r"tasks\.sst2\.epochs=nan must be a finite number > 0"),
    ("tasks.sst2.weight_decay=-1", r"tasks\.sst2\.weight_decay=-1\.0 must be a finite number >= 0"),
    ("tasks.sst2.warmup_ratio=nan", r"tasks\.sst2\.warmup_ratio=nan must be a number in \[0, 1\), or null"),
    ("tasks.sst2.dropout=1.5", r"tasks\.sst2\.dropout=1\.5 must be a number in \[0, 1\)"),
]


@pytest.mark.parametrize("override,message", FINETUNE_CASES, ids=[c[0] for c in FINETUNE_CASES])
def test_lm_finetune_refuses_bad_hyperparameters(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        finetune_job(compose_finetune(finetune_overrides(tmp_path, override)))


# -- run_dir -------------------------------------------------------------------------------------------


def read_only_dir(path: Path, monkeypatch) -> Path:
    """`path` made read-only (0o500). As root chmod does not stop writes: then os.access is made to say so
    for this path (and mkdir under it raises as it would), the way the kernel answers an ordinary user."""
    path.mkdir()
    path.chmod(0o500)
    if os.access(path, os.W_OK):  # root
        real_access, real_mkdir = os.access, Path.mkdir

        def access(p, mode, **kw):
            return False if Path(p).absolute() == path and mode & os.W_OK else real_access(p, mode, **kw)

        def mkdir(self, *a, **kw):
            if self.absolute().parent == path:
                raise PermissionError(errno.EACCES, "Permission denied", str(self))
            return real_mkdir(self, *a, **kw)

        monkeypatch.setattr(os, "access", access)
        monkeypatch.setattr(Path, "mkdir", mkdir)
    return path


@pytest.fixture
def ro(tmp_path, monkeypatch):
    path = read_only_dir(tmp_path / "ro", monkeypatch)
    yield path
    path.chmod(0o700)


@pytest.mark.parametrize("where", ["inside", "itself"])
def test_lock_run_dir_names_an_unwritable_run_dir(ro, where):
    run_dir = ro / "run" if where == "inside" else ro
    with pytest.raises(
        RunDirUnwritable,
        match=rf"^run_dir {run_dir} is not writable: Permission denied.*; "
        rf"pick another run_dir$",
    ):
        lock_run_dir(run_dir)
    release(run_dir)
    assert issubclass(RunDirUnwritable, CheckpointError)  # lm train and lm finetune print it in one line


def test_lock_run_dir_names_a_file_in_the_way(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(
        RunDirUnwritable,
        match=rf"^run_dir {tmp_path / 'f' / 'run'} is not writable: Not a directory; "
        rf"pick another run_dir$",
    ):
        lock_run_dir(tmp_path / "f" / "run")


def test_lm_train_refuses_a_read_only_run_dir_before_training(ro):
    from lm.cli.train import train

    cfg = compose_train(tiny_overrides(ro, 2))
    with pytest.raises(RunDirUnwritable, match=rf"run_dir {ro} is not writable"):
        train(cfg, loaders=loaders(cfg))
    release(ro)
    assert not (ro / "checkpoints").exists() and not (ro / "metrics.jsonl").exists()


def test_the_apps_check_run_dir_before_hydra_creates_it(ro, monkeypatch):
    from lm.cli.app import _check_run_dir_arg

    monkeypatch.setattr(sys, "argv", ["lm train", "model=tiny", f"run_dir={ro / 'a' / 'b'}"])
    with pytest.raises(
        SystemExit,
        match=rf"^lm train: run_dir {ro / 'a' / 'b'} is not writable: Permission denied "
        rf"\({ro}\); pick another run_dir$",
    ):
        _check_run_dir_arg("lm train")
    monkeypatch.setattr(sys, "argv", ["lm train", f"run_dir={ro.parent / 'fine' / 'run'}"])
    _check_run_dir_arg("lm train")  # a writable parent: nothing to say
    monkeypatch.setattr(sys, "argv", ["lm train", "-m", f"run_dir={ro / 'a'},{ro / 'b'}"])
    _check_run_dir_arg("lm train")  # a sweep: each cell's run_dir is checked by lock_run_dir


def run_cli(module, *args, cwd):
    env = {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": ""}
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


def test_cli_says_run_dir_is_not_writable_in_one_line(tmp_path):
    (tmp_path / "f").write_text("x")
    for module, args in (("lm.cli.train", ["model=tiny"]), ("lm.cli.finetune", ["task=glue/rte", "init=none"])):
        p = run_cli(module, *args, f"run_dir={tmp_path / 'f' / 'run'}", cwd=tmp_path)
        assert p.returncode == 1, p.stderr
        assert "Traceback" not in p.stderr and "Traceback" not in p.stdout
        assert f"run_dir {tmp_path / 'f' / 'run'} is not writable: Not a directory" in p.stderr
        assert p.stderr.strip().endswith("pick another run_dir")


# -- GLUE data -----------------------------------------------------------------------------------------


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.mark.parametrize("split", ["train", "dev"])
def test_header_only_glue_file_is_refused_with_its_path(tmp_path, split):
    from lm.glue.config import GlueTaskConfig
    from lm.glue.trainer import load_task_data

    root = tmp_path / "glue_data"
    for s in ("train", "dev"):
        write(root / "SST-2" / f"{s}.tsv", "sentence\tlabel\n" + ("" if s == split else "a fine film\t1\n"))
    path = root / "SST-2" / f"{split}.tsv"
    cfg = GlueTaskConfig(name="sst2", data_root=str(root))
    with pytest.raises(
        GlueDataError,
        match=rf"^{path}: the file has no examples after its header line; restore the "
        rf"SST-2 {split} file",
    ):
        load_task_data(cfg, tokenizer=None, arch="decoder", max_len=16, hf=False, with_test=False)


def test_headerless_cola_file_without_rows_is_refused(tmp_path):
    path = write(tmp_path / "CoLA" / "dev.tsv", "")
    with pytest.raises(GlueDataError, match=rf"^{path}: the file has no examples; restore the CoLA dev file"):
        read_tsv(path, get_task("cola"), "dev")


# -- task= ---------------------------------------------------------------------------------------------

ALLOWED = ", ".join((*GLUE_TASKS, "all"))


@pytest.mark.parametrize(
    "arg,bad",
    [
        ("task=glue/foo", "glue/foo"),
        ("task=foo", "foo"),
        ("task=[glue/rte,glue/foo]", "glue/foo"),
        ("task=glue/glue_schema", "glue/glue_schema"),
    ],
)
def test_unknown_task_lists_the_real_tasks(arg, bad):
    with pytest.raises(
        ConfigError,
        match=rf"^task={bad} is not a task; pick task=glue/<name> with <name> one of "
        rf"{ALLOWED} \(several",
    ):
        check_task_args(["init=none", arg])


@pytest.mark.parametrize(
    "arg",
    [
        "task=glue/all",
        "task=glue/sst2",
        "task=[glue/rte, glue/mrpc]",
        "task=glue/rte,glue/cola",
        "task=choice(glue/rte,glue/cola)",
        "tasks.sst2.lr=1",  # the default task
    ],
)
def test_known_tasks_and_other_args_pass(arg):
    check_task_args([arg])


@pytest.mark.parametrize("arg", ["model=bert", "model.dim=128", "model/ffn=swiglu", "+model.n_segments=2"])
def test_a_model_override_with_a_saved_init_is_refused(arg):
    """init=<run> finetunes the model saved there: model= and model.* (conf/finetune.yaml's init=none baseline) would
    change nothing."""
    with pytest.raises(ConfigError, match=f"^{re.escape(arg)} has no effect with init=runs/x: lm finetune builds"):
        check_task_args(["task=glue/rte", "init=runs/x", arg])


@pytest.mark.parametrize("init", ["none", "scratch", "runs/a,runs/b"])  # the baseline's model; a sweep: the job's
def test_a_model_override_with_init_none_passes(init):
    check_task_args(["task=glue/rte", f"init={init}", "model=bert", "model.dim=128"])


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["task=glue/rte", "tasks.cola.epochs=1"],
            "tasks.cola.epochs=1: cola is not among the tasks this run "
            "finetunes (rte); add it ('task=[glue/rte,glue/cola]') or leave the override out",
        ),
        (["tasks.cola.epochs=1"], "(sst2); add it ('task=[glue/sst2,glue/cola]')"),  # conf/finetune.yaml's default
        (
            ["task=[glue/rte,glue/mrpc]", "+tasks.cola.lr=1"],
            "(rte, mrpc); add it ('task=[glue/rte,glue/mrpc,glue/cola]')",
        ),
        (["task=glue/cola", "task=glue/rte", "tasks.cola.lr=1"], "(rte)"),  # the last task= is Hydra's
        (["task=glue/rte", "tasks.colaa.lr=1"], "tasks.colaa.lr=1: colaa is not a GLUE task; the task names are cola,"),
    ],
)
def test_an_override_of_a_task_not_finetuned_is_refused_naming_the_fix(args, message):
    """Hydra's report would be "Could not override 'tasks.cola.epochs'. To append to your config use
    +tasks.cola.epochs=1 ... Key 'cola' is not in struct", and its advice fails as well."""
    with pytest.raises(ConfigError) as e:
        check_task_args(args)
    assert message in str(e.value)


@pytest.mark.parametrize(
    "args",
    [
        ["task=glue/all", "tasks.cola.epochs=1"],
        ["task=[glue/rte,glue/cola]", "tasks.cola.epochs=1"],
        ["task=glue/cola", "tasks.cola.epochs=1"],
        ["task=glue/rte,glue/cola", "tasks.cola.epochs=1"],  # a sweep: the rte cell is Hydra's to refuse
        ["task=glue/rte", "~tasks.cola"],
        ["task=glue/rte", "tasks=null"],
        ["task=[glue/rte,glue/pair]", "tasks.cola.epochs=1"],  # glue/pair: a task file of the user's (below)
    ],
)
def test_overrides_of_selected_tasks_pass(args, monkeypatch, tmp_path):
    (tmp_path / "task" / "glue").mkdir(parents=True)
    (tmp_path / "task" / "glue" / "pair.yaml").write_text("defaults:\n  - glue/rte\n  - glue/cola\n")
    monkeypatch.setattr("lm.config.conf_dir", lambda: tmp_path)
    check_task_args(args)


@pytest.mark.parametrize(
    "module,args,line",
    [
        (
            "lm.cli.train",
            ["model=tiny", "train.max_step=20"],
            "lm train: train.max_step is not a key of train (TrainConfig); did you mean train.max_steps?",
        ),
        (
            "lm.cli.train",
            ["model=tiny", "train.max_steps=abc"],
            "lm train: train.max_steps: Value 'abc' of type 'str' could not be converted to Integer",
        ),
        (
            "lm.cli.finetune",
            ["task=glue/rte", "init=none", "tasks.rte.epoch=1"],
            "lm finetune: tasks.rte.epoch is not a key of tasks.rte (GlueTaskConfig); did you mean tasks.rte.epochs?",
        ),
        (  # Hydra's 5 lines without the `lm train:` prefix, advising `++train.max_steps=3`
            "lm.cli.train",
            ["model=tiny", "+train.max_steps=3"],
            "lm train: +train.max_steps=3: train.max_steps exists already (a + adds a key the config lacks); drop the "
            "+: train.max_steps=3",
        ),
        (  # Hydra's advice here is a defaults list's `override model: gpt2`, which no command line takes
            "lm.cli.train",
            ["+model=gpt2"],
            "lm train: +model=gpt2: model has an option already (the defaults list chooses one); drop the +: "
            "model=gpt2",
        ),
        (
            "lm.cli.finetune",
            ["task=glue/rte", "init=none", "+tasks.rte.epochs=3"],
            "lm finetune: +tasks.rte.epochs=3: tasks.rte.epochs exists already (a + adds a key the config lacks); "
            "drop the +: tasks.rte.epochs=3",
        ),
        (  # a recurrent model's field on a Transformer: OmegaConf's assertion, without this line a traceback
            "lm.cli.train",
            ["model=tiny", "model.family.hidden=512"],
            "lm train: model.family.hidden=512: model.family is null here (no model/family option is chosen), so it "
            "has no field hidden; choose one (model/family=<option>, see conf/model/family/) or drop "
            "model.family.hidden=512",
        ),
    ],
)
def test_an_override_hydra_cannot_apply_is_one_line_naming_the_key(tmp_path, module, args, line):
    """Not Hydra's 5-7 lines, whose advice for a mistyped key is `+train.max_step=20` (a key nothing reads)."""
    p = run_cli(module, *args, f"run_dir={tmp_path / 'run'}", cwd=tmp_path)
    assert p.returncode == 1 and p.stderr.strip() == line, p.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "preset,args,node",
    [
        ("tiny", ["model.ffn.hidden_mult=3", "model.family.hidden=512"], "family"),  # the override that failed
        ("gpt2", ["+model.stack.steps=3"], "stack"),
        ("lstm", ["model.pos.theta=5.0"], "pos"),
    ],
)
def test_a_field_of_a_null_option_node_is_one_line_naming_its_group(preset, args, node):
    from lm.model.config import model_preset

    arg = args[-1]
    with pytest.raises(ConfigError, match=f"^{re.escape(arg)}: model.{node} is null here .*model/{node}=<option>"):
        model_preset(preset, args)


def test_cli_lists_the_tasks_for_an_unknown_one(tmp_path):
    p = run_cli("lm.cli.finetune", "task=glue/foo", "init=none", cwd=tmp_path)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert p.stderr.strip() == (
        f"lm finetune: task=glue/foo is not a task; pick task=glue/<name> with <name> one of "
        f"{ALLOWED} (several: 'task=[glue/rte,glue/mrpc]'), or task=own for your own files"
    )


@pytest.mark.parametrize(
    "arg,bad,choices",
    [
        (
            "model=gpt3",
            "model=gpt3",
            "in conf/model/; pick one of bert, gpt2, gru, llama, lstm, narang_vanilla, rnn, t5,",
        ),
        ("model/ffn=gelu,swigluu", "model/ffn=swigluu", "in conf/model/ffn/; pick one of elu, geglu, gelu, gelu_tanh,"),
        ("+engine=fsdp", "engine=fsdp", "in conf/engine/; pick one of ddp, deepspeed, fsdp2, single, zero1, zero2,"),
        ("experiment=[narang_row/gelu,narang_row/x]", "experiment=narang_row/x", "in conf/experiment/; pick one of"),
        ("model/ffn=mlp_schema", "model/ffn=mlp_schema", "in conf/model/ffn/"),  # a schema node is no option
    ],
)
def test_an_unknown_group_option_lists_the_groups_options(arg, bad, choices):
    from lm.cli.group_choice import check_group_options
    from lm.config import register_train_configs

    register_train_configs()
    with pytest.raises(ConfigError) as e:
        check_group_options(["model.dim=64", arg])
    assert str(e.value).startswith(f"{bad}: no such option ") and choices in str(e.value)
    assert "schema" not in str(e.value).split("pick one of")[1]


def test_a_mistyped_group_names_the_closest_group():
    """`model/fnn=gelu` was refused as "model/fnn is not a key of the top level; did you mean model?"."""
    from lm.cli.group_choice import check_group_options
    from lm.config import register_train_configs

    register_train_configs()
    with pytest.raises(ConfigError) as e:
        check_group_options(["model/fnn=gelu,swiglu"])
    assert str(e.value).startswith("model/fnn is not a config group; did you mean model/ffn? (options: elu, geglu,")


def test_a_group_choice_left_empty_lists_the_groups_options():
    """`lm train -m model/ffn= ...` (a sweep list not filled in): one line, not Hydra's list with the schema nodes."""
    from lm.cli.group_choice import check_group_options
    from lm.config import register_train_configs

    register_train_configs()
    with pytest.raises(ConfigError) as e:
        check_group_options(["model.dim=64", "model/ffn="])
    assert str(e.value).startswith("model/ffn= names no option; pick one of elu, geglu, gelu, gelu_tanh,")
    assert "schema" not in str(e.value)
    check_group_options(["run_dir=", "model.dim="])  # not group choices: left to the config's own checks


@pytest.mark.parametrize(
    "arg",
    [
        "model/ffn=gelu,swiglu",
        "experiment=narang_row/gelu",  # a ConfigStore node (lm/config.py), no yaml file
        "+model/ffn=geglu",
        "~model/pos",
        "model/pos=null",
        "model/ffn=glob(*)",
        "hydra/launcher=basic",  # Hydra's own
        "model.dim=64",
        "model@foo=gpt2",
    ],
)
def test_known_group_options_and_other_args_pass(arg):
    from lm.cli.group_choice import check_group_options
    from lm.config import register_train_configs

    register_train_configs()
    check_group_options([arg])
    check_group_options(["hydra.searchpath=[file:///elsewhere]", "model=mine"])  # options may live anywhere
    check_group_options(["--config-dir", "/elsewhere", "model=mine"])


def test_cli_says_an_unknown_model_in_one_line(tmp_path):
    p = run_cli("lm.cli.train", "model=gpt3", cwd=tmp_path)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert p.stderr.strip().startswith("lm train: model=gpt3: no such option in conf/model/; pick one of bert, gpt2,")
    assert p.stderr.count("\n") == 1 and not any(tmp_path.iterdir())  # no run_dir left behind
