"""The console scripts' one error path (lm/cli/errors.py, issue 49): what a user can fix is one line naming
the file and the fix with exit status 1 (2 for usage errors), a bug keeps its traceback; and the cases
that were tracebacks or silent before: lm quickstart / lm transfer arguments, `+key=` typos, an empty
run directory left behind by a refused config, a schedule that never leaves its warmup."""

import errno
import logging
import pickle
import subprocess
import sys

import pytest

from lm.cli.errors import describe, entry
from lm.config import ConfigError, check_known_keys
from tests.engine_support import compose, loaders, subprocess_env, tiny_overrides


def _exit(main, *args):
    with pytest.raises(SystemExit) as e:
        main(*args)
    return e.value.code


def test_user_errors_become_one_line_with_status_1(capsys):
    def fails(e):
        @entry("lm-x")
        def main():
            raise e

        return _exit(main)

    full = OSError(errno.ENOSPC, "No space left on device", "/out/model.safetensors")
    assert (
        fails(full) == "lm-x: No space left on device (/out/model.safetensors) — free space on that disk, or "
        "write somewhere else"
    )
    assert fails(NotADirectoryError(errno.ENOTDIR, "Not a directory", "/f/x")).startswith(
        "lm-x: Not a directory (/f/x) — a part of that path is a file"
    )
    assert fails(FileExistsError(errno.EEXIST, "File exists", "out")).endswith("remove it, or pick another path")
    assert fails(ConfigError("train.lr=-1 must be > 0")) == "lm-x: train.lr=-1 must be > 0"
    assert "not UTF-8 text" in fails(UnicodeDecodeError("utf-8", b"a\xff", 1, 2, "invalid start byte"))
    assert fails(pickle.UnpicklingError("Weights only load failed")).startswith("lm-x: a file is not one lm wrote")
    assert fails(KeyboardInterrupt()) == 130 and capsys.readouterr().err == "lm-x: interrupted\n"
    from lm.core.loop import Aborted  # the loop's second Ctrl-C: the same line, and where a resume starts

    assert fails(Aborted("run the same command to resume from r/checkpoints/step_00000004")) == 130
    assert (
        capsys.readouterr().err
        == "lm-x: interrupted; run the same command to resume from r/checkpoints/step_00000004\n"
    )


def test_usage_errors_exit_2_and_bugs_keep_their_traceback(capsys):
    @entry("lm-x", usage=(ConfigError,))
    def usage():
        raise ConfigError("--layer 9: the model has 2 layers")

    assert _exit(usage) == 2 and capsys.readouterr().err == "lm-x: error: --layer 9: the model has 2 layers\n"

    @entry("lm-x")
    def bug():
        raise KeyError("rnn")

    with pytest.raises(KeyError):
        bug()
    assert describe(TypeError("x")) is None and describe(RuntimeError("x")) is None


def test_a_closed_pipe_ends_quietly_as_a_sigpipe_would(capsys, monkeypatch):
    """`lm train --help | head -1`: the reader leaves early; no "lm train: Broken pipe" line, status 141 as a shell
    reports for a process the pipe ended (the `lm` dispatcher's own usage too)."""
    from lm.cli.main import main

    @entry("lm-x")
    def reads_on():
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    assert _exit(reads_on) == 141 and capsys.readouterr().err == ""

    def closed(*args, **kwargs):
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    monkeypatch.setattr("builtins.print", closed)
    assert _exit(main, ["--help"]) == 141
    monkeypatch.undo()
    assert capsys.readouterr().err == ""


def test_safetensors_full_disk_is_one_line():
    from safetensors import SafetensorError

    line = describe(SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull })"))
    assert line.endswith("— free space on that disk, or write somewhere else") and "\n" not in line


# -- under torchrun: one rank prints, every rank writes torchrun's error file ------------------------------


def _elastic_rank(monkeypatch, tmp_path, rank):
    """The environment torchrun gives rank `rank`: its RANK and the error file it reads back when the rank fails."""
    error_file = tmp_path / f"error_{rank}.json"
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    return error_file


def _summary(error_file, rank=1):
    """torchrun's own summary of a rank that exited with status 1 and wrote `error_file`."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    failure = ProcessFailure(local_rank=rank, pid=1, exitcode=1, error_file=str(error_file))
    return ChildFailedError("lm", {rank: failure}).format_msg()


def test_under_torchrun_only_rank_0_prints_a_user_error(capsys, monkeypatch, tmp_path):
    """Every rank hits the same user error: rank 0 prints its line, the others exit with status 1 in silence; each
    writes the line as its elastic error file, which torchrun's summary shows instead of 'To enable traceback'."""

    @entry("lm-x")
    def main(e):
        raise e

    @entry("lm-x", usage=(ConfigError,))
    def usage():
        raise ConfigError("--layer 9: the model has 2 layers")

    @entry("lm-x")
    def exits():
        sys.exit("lm-x: run_dir=/r is not writable")  # the sys.exit(message) of lm/cli/app.py and others

    error_file = _elastic_rank(monkeypatch, tmp_path, 1)
    assert _exit(main, ConfigError("train.lr=-1 must be > 0")) == 1 and capsys.readouterr().err == ""
    assert "traceback : lm-x: train.lr=-1 must be > 0\n" in _summary(error_file)
    assert _exit(exits) == 1 and capsys.readouterr().err == ""
    assert "traceback : lm-x: run_dir=/r is not writable\n" in _summary(error_file)
    assert _exit(usage) == 2 and capsys.readouterr().err == ""
    error_file = _elastic_rank(monkeypatch, tmp_path, 0)
    assert _exit(main, ConfigError("train.lr=-1 must be > 0")) == "lm-x: train.lr=-1 must be > 0"  # printed
    assert "traceback : lm-x: train.lr=-1 must be > 0\n" in _summary(error_file, rank=0)


def test_under_torchrun_a_bug_keeps_its_traceback_on_every_rank(monkeypatch, tmp_path):
    @entry("lm-x")
    def bug():
        raise KeyError("rnn")

    error_file = _elastic_rank(monkeypatch, tmp_path, 1)
    with pytest.raises(KeyError):
        bug()
    assert not error_file.exists()


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize(
    ("override", "line"),
    [
        ("train.max_steps=abc", "lm train: train.max_steps: Value 'abc' of type 'str' could not be converted"),
        ("train.world_size=3", "EngineError: train.world_size=3 but the launcher started 2 process(es)"),
    ],
)
def test_a_user_error_under_torchrun_is_said_once(override, line, tmp_path):
    """`torchrun --nproc_per_node 2 -m lm train <a user error>`: the line once (rank 0's), not once per rank, and
    torchrun's summary names it as the root cause, not 'To enable traceback see: ...'. Refused before any work."""
    from tests.engine_support import free_port

    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    rendezvous = ["--master_addr", "127.0.0.1", "--master_port", str(free_port())]
    args = ["-m", "lm", "train", "model=tiny", override, f"run_dir={tmp_path / 'run'}"]
    p = subprocess.run(
        torchrun + rendezvous + args, capture_output=True, text=True, env=subprocess_env(), timeout=300, cwd=tmp_path
    )
    out = p.stdout + p.stderr
    assert p.returncode == 1, out[-3000:]
    assert out.count(line) - out.count(f"traceback : {line}") == 1, out[-3000:]  # said once beside the summary
    root_cause = out.split("Root Cause (first observed failure):", 1)[1]
    assert f"traceback : {line}" in root_cause and "To enable traceback" not in out, out[-3000:]


# -- lm quickstart / lm transfer arguments ----------------------------------------------------------------


@pytest.mark.parametrize("command", ["quickstart", "transfer"])
@pytest.mark.parametrize(
    "args,what",
    [
        (["--tokens", "nan"], "must be finite"),
        (["--tokens", "inf"], "must be finite"),
        (["--tokens", "x"], "not a number of tokens"),
        (["--seeds", "a"], "'a' is not a comma-separated list of seeds"),
        (["--seeds="], "'' is not a comma-separated list of seeds"),
        (["--seeds", "0,-1"], "'0,-1' is not a comma-separated list of seeds, integers >= 0, e.g. 0,1,2"),
        (["--tasks", "sst2,sst3"], "'sst2,sst3': sst3: not a GLUE task; choose from cola,sst2,mrpc,stsb,qqp,mnli,"),
        (["--tasks", ","], "',': no task; choose from cola,sst2"),
    ],
)
def test_bad_numbers_are_usage_errors(command, args, what, capsys, tmp_path):
    from lm.cli import transfer

    main = transfer.quickstart if command == "quickstart" else transfer.main
    assert _exit(main, [*args, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"lm {command}: error: argument {args[0].rstrip('=')}" in err and what in err and "Traceback" not in err


@pytest.mark.parametrize(
    "kw,what",
    [
        (
            {"preset": "bogus"},
            "--preset bogus: no such experiment (conf/experiment/bogus.yaml); pick one of glue_transfer_decoder",
        ),
        (
            {"pretrain": ["bogus.key=1"]},
            "--pretrain bogus.key=1: bogus is not a key of the top level (RunSchema); the keys there: run_dir,",
        ),
        ({"pretrain": ["model=lstm"]}, "--pretrain model=lstm: the model family rnn is not one the recipe finetunes"),
        ({"pretrain": ["+train.max_step=20"]}, "did you mean train.max_steps?"),
        (
            {"pretrain": ["+seed=3"]},
            "--pretrain +seed=3: +seed=3: seed exists already (a + adds a key the config lacks)",
        ),
    ],
)
def test_bad_recipes_are_refused_before_any_work(kw, what, tmp_path):
    from lm.cli.transfer_recipe import Recipe, TransferError, plan

    with pytest.raises(ConfigError) as e:  # TransferError, or the ConfigError of the typed schema
        plan(Recipe(out=tmp_path / "o", tokens=1000, tasks=["rte"], **kw))
    assert what in str(e.value) and isinstance(e.value, (TransferError, ConfigError))
    assert not (tmp_path / "o").exists()


def test_a_chosen_task_without_its_files_is_refused_before_any_work(tmp_path):
    """lm transfer reads GLUE from disk: a --tasks entry with no train/dev file stops the plan (lm finetune would
    say it only after the corpus and the pretraining), unless --finetune skip_missing=true."""
    from lm.cli.transfer_recipe import Recipe, TransferError, plan

    root = tmp_path / "glue_data"
    for split in ("train", "dev"):
        (root / "RTE").mkdir(parents=True, exist_ok=True)
        (root / "RTE" / f"{split}.tsv").write_text("index\tsentence1\tsentence2\tlabel\n")
    kw = {"out": tmp_path / "o", "tokens": 1000, "tasks": ["rte", "qnli"]}
    with pytest.raises(TransferError) as e:
        plan(Recipe(**kw, finetune=[f"glue.data_root={root}"]))
    assert "--tasks: GLUE data missing for qnli:\n  qnli: not found: " in str(e.value)
    assert "leave the task out (on disk: rte)" in str(e.value) and not (tmp_path / "o").exists()
    assert plan(Recipe(**kw, finetune=[f"glue.data_root={root}", "skip_missing=true"])).tasks == ["rte", "qnli"]


def test_the_cli_says_a_bad_preset_in_one_line(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "lm.cli.transfer", "--preset", "bogus", "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=300,
    )
    assert p.returncode == 1 and p.stderr.startswith("lm transfer: --preset bogus: no such experiment"), p.stderr
    assert p.stderr.count("\n") == 1


def test_an_override_hydra_cannot_read_is_one_line_with_the_quoted_form_that_runs(tmp_path):
    """`run_dir=/shared/runs/lr=3e-4` was Hydra's `mismatched input '=' expecting <EOF>` and its grammar's URL,
    naming neither the override nor the fix."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from lm.config import override_parse_error

    run_dir = tmp_path / "lr=3e-4 (2)"
    p = subprocess.run(
        [sys.executable, "-m", "lm", "train", "model=tiny", f"run_dir={run_dir}"],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=300,
    )
    fix = f"\"run_dir='{run_dir}'\""
    assert p.returncode == 1 and p.stderr == (
        f"lm train: cannot read the override run_dir={run_dir}: mismatched input '=' expecting <EOF>; Hydra's "
        f"grammar gives characters such as , = ( ) [ ] ' # a meaning: quote the value, inside the shell's quotes: "
        f"{fix}\n"
    )
    assert not run_dir.exists()
    parse = OverridesParser.create().parse_overrides
    assert parse([fix.strip('"')])[0].value() == str(run_dir)  # the advised form reads as typed
    line = override_parse_error("run_dir=runs/it's", "LexerNoViableAltException: run_dir=runs/it's\n ^")
    assert "a character its grammar does not allow there" in line and line.endswith("""'run_dir="runs/it'"'"'s"'""")
    assert parse(['run_dir="runs/it\'s"'])[0].value() == "runs/it's"


# -- typed schemas: `+key=` -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override,message",
    [
        (
            "+train.max_step=20",
            "train.max_step is not a key of train (TrainConfig), so nothing would read it; did you "
            "mean train.max_steps? Set it without the +",
        ),
        ("+model.dimm=64", "did you mean model.dim?"),
        ("+bogus=1", "bogus is not a key of the top level (RunSchema)"),
    ],
)
def test_a_key_added_with_plus_is_refused_naming_the_close_match(tmp_path, override, message):
    from lm.cli.train import train

    cfg = compose(tiny_overrides(tmp_path / "run", 2) + [override])
    with pytest.raises(ConfigError) as e:
        train(cfg, loaders=loaders(compose(tiny_overrides(tmp_path / "run", 2))))
    assert message in str(e.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("seed", ["-1", "18446744073709551616"])
def test_a_seed_numpy_or_torch_cannot_take_is_refused_before_any_work(tmp_path, seed):
    """seed=-1 trained up to the first batch, then ended in numpy's traceback ('expected non-negative integer',
    from the loader's default_rng); 2**64 in torch.manual_seed's. Now one line before the run_dir is made."""
    from lm.cli.train import train

    cfg = compose(tiny_overrides(tmp_path / "run", 2) + [f"seed={seed}"])
    with pytest.raises(ConfigError) as e:
        train(cfg, loaders=loaders(compose(tiny_overrides(tmp_path / "run", 2))))
    assert str(e.value) == f"seed: {seed} is not a seed (an integer from 0 to 2**64-1); e.g. seed=1337"
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "text,whose",
    [("my: notes\n", "not an lm train run's"), ("tasks: {}\ninit: none\n", "an lm finetune job's"), ("", "not an")],
)
def test_a_run_dir_whose_config_yaml_is_not_lm_trains_is_refused_and_kept(tmp_path, text, whose):
    """run_dir=<a directory of the user's> holding their config.yaml (or an lm finetune job's run_dir): lm train wrote
    its own config.yaml over it (train.log and metrics.jsonl are appended to, the other files left alone)."""
    from lm.cli.train import train

    run_dir = tmp_path / "mine"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(text)
    cfg = compose(tiny_overrides(run_dir, 2))
    with pytest.raises(ConfigError) as e:
        train(cfg, loaders=loaders(cfg))
    assert str(e.value).startswith(f"run_dir={run_dir} holds a config.yaml that is {whose}")
    assert f"pick a new run_dir (e.g. run_dir={tmp_path / 'mine_pretrain'})" in str(e.value)
    assert (run_dir / "config.yaml").read_text() == text and sorted(p.name for p in run_dir.iterdir()) == [
        "config.yaml"
    ]


def test_the_composed_defaults_have_no_stray_keys():
    check_known_keys(compose(["model=tiny"]))


def test_a_refused_config_leaves_no_empty_run_directory(tmp_path):
    """Hydra creates run_dir before the job starts; a job refused before writing removes what it created."""
    (tmp_path / "keep").mkdir()
    for run_dir, gone in ((tmp_path / "new" / "deeper" / "run", tmp_path / "new"), (tmp_path / "keep", None)):
        p = subprocess.run(
            [sys.executable, "-m", "lm.cli.train", "model=tiny", "train.max_steps=0", f"run_dir={run_dir}"],
            capture_output=True,
            text=True,
            env=subprocess_env(),
            timeout=300,
            cwd=tmp_path,
        )
        assert p.returncode == 1 and "train.max_steps=0 must be a positive integer" in p.stdout + p.stderr
        assert "Traceback" not in p.stdout + p.stderr
        if gone is not None:
            assert not gone.exists()  # the run dir and the parents Hydra made for it
    assert (tmp_path / "keep").is_dir()  # a directory that was there before stays


@pytest.mark.parametrize(
    "module,args",
    [
        ("lm.cli.train", ["model=tiny", "train.max_steps=0"]),
        ("lm.cli.finetune", ["task=glue/rte", "init=nowhere/run"]),
    ],
)
def test_a_refused_job_leaves_no_default_run_directory(tmp_path, module, args):
    """Without run_dir= the run directory is named by the overrides (runs/<name>, runs/finetune/<name>): a job
    refused before writing removes it, and runs/ with it when the job made that too."""

    def refused():
        p = subprocess.run(
            [sys.executable, "-m", module, *args],
            capture_output=True,
            text=True,
            env=subprocess_env(),
            timeout=300,
            cwd=tmp_path,
        )
        assert p.returncode == 1 and "Traceback" not in p.stdout + p.stderr, p.stdout + p.stderr

    refused()
    assert not (tmp_path / "runs").exists(), sorted(str(q.relative_to(tmp_path)) for q in tmp_path.rglob("*"))
    (tmp_path / "runs").mkdir()  # a runs/ that was there before stays; the run's own directory does not
    refused()
    assert [q.name for q in (tmp_path / "runs").iterdir()] == []


def test_a_schedule_that_ends_in_its_warmup_warns_once(tmp_path, caplog):
    from lm.cli.train import train

    cfg = compose(tiny_overrides(tmp_path / "run", 2) + ["sched.warmup_steps=5"])
    with caplog.at_level(logging.WARNING, logger="lm"):
        train(cfg, loaders=loaders(cfg))
    warnings = [r.getMessage() for r in caplog.records if "warmup" in r.getMessage()]
    assert warnings == [
        "train.max_steps=2 <= sched.warmup_steps=5: the run ends inside its warmup and never "
        "reaches optim.lr; lower sched.warmup_steps (e.g. sched.warmup_steps=0) or raise "
        "train.max_steps"
    ]
    caplog.clear()
    cfg = compose(tiny_overrides(tmp_path / "run2", 2) + ["sched.warmup_steps=1"])
    with caplog.at_level(logging.WARNING, logger="lm"):
        train(cfg, loaders=loaders(cfg))
    assert not [r for r in caplog.records if "warmup" in r.getMessage()]


def test_the_default_run_directory_is_named_from_the_overrides_hydra_records():
    from lm.cli.app import _default_run_dir_prefix, _task_overrides
    from lm.config import run_name_of

    argv = ["model=tiny", "--cfg", "job", "hydra.job.chdir=false", "hydra/job_logging=stdout", "+train.seed=1", "-m"]
    assert _task_overrides(argv) == ["model=tiny", "+train.seed=1"]
    assert run_name_of(_task_overrides(argv)) == "model-tiny+train.seed-1"
    assert (_default_run_dir_prefix("train"), _default_run_dir_prefix("finetune")) == ("runs/", "runs/finetune/")


def test_a_sweep_with_cfg_is_one_line_that_says_what_works(tmp_path):
    """`lm train -m model/norm=layernorm,rmsnorm seed=0,1,2 --cfg job` (the README's sweep, checked before it
    runs) was Hydra's ValueError traceback (17 lines)."""
    p = subprocess.run(
        [sys.executable, "-m", "lm", "train", "-m", "model/norm=layernorm,rmsnorm", "seed=0,1", "--cfg", "job"],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=tmp_path,
        timeout=300,
    )
    assert (p.returncode, p.stdout) == (1, "")
    assert p.stderr == (
        "lm train: -m and --cfg do not go together (Hydra runs, sweeps or prints, one per command); to print a "
        "cell's config, drop -m and give each swept key one of its values\n"
    )
    assert list(tmp_path.iterdir()) == []  # refused before Hydra made runs/<date>_<time>


def test_one_hydra_mode_passes_a_single_mode_and_names_two():
    from lm.cli.app import _one_hydra_mode

    for args in (["-m", "seed=0,1"], ["--cfg", "job", "model=tiny"], ["--info", "defaults"], ["model=tiny"]):
        _one_hydra_mode("lm train", args)  # one mode or none: Hydra's to run
    with pytest.raises(SystemExit) as e:
        _one_hydra_mode("lm finetune", ["--cfg=all", "--info", "x=1"])
    said = "lm finetune: --cfg and --info do not go together (Hydra runs, sweeps or prints, one per command)"
    assert str(e.value) == said
