"""lm quickstart: lm transfer's quickstart preset (RECIPES in lm/cli/transfer.py). Its defaults and a given flag
winning over them, the pretrained arm alone with its dev table, then both arms and the table with --arm all, and
(slow) the whole command end to end on a tiny budget."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lm.cli.transfer import parse_args, quickstart, run_transfer
from tests.glue_support import easy_glue  # noqa: F401 - the easy SST-2-shaped task (a fixture)
from tests.test_transfer import corpus, recipe  # noqa: F401 - the tiny corpus (a fixture) and recipe


def test_the_preset_sets_the_defaults_and_a_given_flag_wins():
    a = parse_args(["--recipe", "quickstart"])
    assert (a.preset, a.tokens, a.tasks, a.seeds, a.out, a.arm) == (
        "glue_transfer_decoder",
        2_000_000,
        ["sst2", "cola", "stsb"],
        [0],
        Path("runs/quickstart"),
        "pretrained",
    )
    a = parse_args(["--recipe", "quickstart", "--arm", "all", "--seeds", "0,1,2", "--tokens", "1e6"])
    assert (a.arm, a.seeds, a.tokens, a.tasks) == ("all", [0, 1, 2], 1_000_000, ["sst2", "cola", "stsb"])
    assert parse_args(["--tasks", "SST-2, cola,sst2"]).tasks == ["sst2", "cola"]  # GLUE's spelling too, each once
    assert parse_args(["--seeds", "1,0,1,00"]).seeds == [1, 0]  # each once: the records name the seeds run
    a = parse_args([])  # lm transfer's own
    assert (a.recipe, a.tokens, a.tasks, a.seeds, a.out, a.arm) == (
        "transfer",
        10_000_000,
        None,
        [0, 1, 2],
        None,
        "all",
    )


def _argv(out: Path, corpus, easy_glue):  # noqa: F811
    r = recipe(out, corpus, easy_glue)  # the tiny corpus, model and task as lm transfer flags
    return [
        "--out",
        str(out),
        "--tasks",
        "sst2",
        "--tokens",
        str(r.tokens),
        "--pretrain",
        *r.pretrain,
        "--finetune",
        *r.finetune,
    ]


def test_the_pretrained_arm_alone_then_both_arms_with_arm_all(tmp_path, corpus, easy_glue, capsys):  # noqa: F811
    out = tmp_path / "q"
    quickstart(_argv(out, corpus, easy_glue))
    printed = capsys.readouterr().out
    assert "| SST-2 | acc |" in printed and "scratch: seeds" not in printed  # the arm's dev table (lm finetune's)
    last = printed.strip().splitlines()[-1]  # what comes next, without lm transfer's --join (a split run's tool)
    assert last == (
        f"results: {out / 'finetune' / 'pretrained' / 'results.json'}; with the other arm and the gain: the same "
        f"command with --arm all"
    )
    assert not (out / "finetune" / "scratch").exists()
    assert (out / "pretrain" / "checkpoints" / "latest").read_text() == "step_00000004"
    results = json.loads((out / "finetune" / "pretrained" / "results.json").read_text())
    assert list(results["columns"]["sst2"]["seeds"]) == ["0"]  # the preset's one seed
    assert "pooling: mean" in (out / "finetune" / "pretrained" / "config.yaml").read_text()
    done = out / "finetune" / "pretrained" / "sst2" / "seed0" / "result.pt"
    mtime = done.stat().st_mtime_ns
    quickstart([*_argv(out, corpus, easy_glue), "--arm", "all"])  # resumes, adds the scratch arm and the table
    printed = capsys.readouterr().out
    assert "| SST-2 | acc |" in printed and "| task | metric | scratch: seeds |" in printed
    assert done.stat().st_mtime_ns == mtime  # not finetuned again
    assert "init: none" in (out / "finetune" / "scratch" / "config.yaml").read_text()
    assert json.loads((out / "transfer.json").read_text())["run"]["command"].startswith(
        "lm transfer --recipe quickstart"
    )
    # the README's next step, three seeds (two here): it was refused, the scratch arm's record naming seed 0 alone
    scratch = out / "finetune" / "scratch" / "sst2" / "seed0" / "result.pt"
    mtimes = (done.stat().st_mtime_ns, scratch.stat().st_mtime_ns)
    quickstart([*_argv(out, corpus, easy_glue), "--arm", "all", "--seeds", "0,1"])
    assert "| task | metric | scratch: seeds |" in capsys.readouterr().out
    assert (done.stat().st_mtime_ns, scratch.stat().st_mtime_ns) == mtimes  # seed 0 read back in both arms
    table = json.loads((out / "transfer.json").read_text())["comparison"]["tasks"]["sst2"]
    assert [list(table[arm]["seeds"]) for arm in ("scratch", "pretrained")] == [["0", "1"], ["0", "1"]]


def test_at_zero_tokens_the_pretrained_arm_is_the_scratch_arm(tmp_path, corpus, easy_glue):  # noqa: F811
    """`lm quickstart --tokens 0` (the pretrained arm alone, nothing pretrained) finetunes from scratch."""
    assert run_transfer(recipe(tmp_path / "z", corpus, easy_glue, tokens=0, seeds=[0], arm="pretrained")) is None
    assert not (tmp_path / "z" / "pretrain").exists()
    record = json.loads((tmp_path / "z" / "transfer_pretrained.json").read_text())
    assert record["dir"] == str(tmp_path / "z" / "finetune" / "scratch") and "sst2" in record["results"]["columns"]


def test_help_describes_the_job():
    out = subprocess.run(
        [sys.executable, "-m", "lm", "quickstart", "--help"], capture_output=True, text=True, check=True
    )
    assert out.stdout.startswith("usage: lm quickstart ")
    assert "task-adaptive" in out.stdout and "--arm all" in out.stdout and "(default 2000000)" in out.stdout


# The curve script's --tiny pretraining (benchmarks/glue_transfer_curve.py): the TinyStories slice, a 1 x 32 model
TINY_PRETRAIN = [
    "data=tinystories_sample_bpe",
    "data.name=tinystories_sample_bpe_512",  # its own cache directory: the preset's 4096 one stays as it is
    "data.vocab_size=512",
    "model.vocab_size=512",
    "model.dim=32",
    "model.n_layers=1",
    "model.n_heads=2",
    "train.progress=false",
    "train.eval_interval=0",
    "sched.warmup_steps=1",
]


@pytest.mark.slow
def test_quickstart_end_to_end_on_a_tiny_budget(tmp_path):
    env = {**os.environ, "LM_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "lm",
            "quickstart",
            "--out",
            str(tmp_path / "qs"),
            "--tasks",
            "rte",
            "--tokens",
            "8192",
            "--arm",
            "all",
            "--pretrain",
            *TINY_PRETRAIN,
            "--finetune",
            "glue.max_train_examples=48",
            "tasks.rte.epochs=1",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "| RTE | acc |" in out.stdout and "| task | metric | scratch: seeds |" in out.stdout  # the table
    for arm in ("pretrained", "scratch"):
        r = json.loads((tmp_path / "qs" / "finetune" / arm / "results.json").read_text())
        assert 0.0 <= r["columns"]["rte"]["median"]["acc"] <= 100.0
    assert (
        tmp_path / "qs" / "pretrain" / "checkpoints" / "latest"
    ).read_text() == "step_00000004"  # 8,192 tokens / 2,048


def test_a_finetune_override_of_every_tasks_train_examples_limits_the_budgets_tasks_too(tmp_path):
    """--finetune glue.max_train_examples=64 (as the end-to-end test above passes it) trained STS-B on the budget's
    2,000 pairs and SST-2 on 5,000 while the table listed the override: the budget's per-task value outranked the
    shared one the user set."""
    from lm.cli.transfer_recipe import Recipe, finetune_config

    def limits(finetune):
        r = Recipe(out=tmp_path / "point", tasks=["sst2", "stsb", "rte"], finetune=finetune)
        cfg = finetune_config(r, tmp_path / "arm", "none", None, "mean", r.tasks)
        return {t: cfg.tasks[t].max_train_examples for t in r.tasks}

    assert limits([]) == {"sst2": 5000, "stsb": 2000, "rte": None}
    assert limits(["glue.max_train_examples=64"]) == {"sst2": 64, "stsb": 64, "rte": 64}
    # a task's own override still outranks the shared one
    assert limits(["glue.max_train_examples=64", "tasks.sst2.max_train_examples=10"]) == {
        "sst2": 10,
        "stsb": 64,
        "rte": 64,
    }
