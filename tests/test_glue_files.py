"""Submission files, results.json / results.md, and the task presets (conf/task/glue)."""

import json
import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from lm.cli.finetune import register
from lm.config import ConfigError, conf_dir
from lm.glue import EVALS, GLUE_TASKS, TASKS, check_submission, load_eval, load_split, write_results, write_submission
from lm.glue.config import GlueTaskConfig, finetune_job, validate_glue_task

FIXTURES = Path(__file__).parent / "fixtures" / "glue"


def _rows(path):
    return [line.split("\t") for line in path.read_text().splitlines()]


def test_submission_format_for_every_column(tmp_path):
    sizes = {}
    for name, e in EVALS.items():
        n = 5
        preds = [0.0, 1.2344, 2.5, 4.9996, 3.0] if name == "stsb" else [i % TASKS[e.task].n_labels for i in range(n)]
        path = write_submission(name, preds, tmp_path)
        assert path == tmp_path / f"{e.submission}.tsv"
        sizes[name] = n
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"{s}.tsv" for s in ["CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI-m", "MNLI-mm", "QNLI", "RTE", "WNLI", "AX"]
    )
    assert _rows(tmp_path / "MNLI-m.tsv") == [
        ["index", "prediction"],
        ["0", "entailment"],
        ["1", "neutral"],
        ["2", "contradiction"],
        ["3", "entailment"],
        ["4", "neutral"],
    ]
    assert [r[1] for r in _rows(tmp_path / "RTE.tsv")[1:]] == ["entailment", "not_entailment"] * 2 + ["entailment"]
    assert [r[1] for r in _rows(tmp_path / "AX.tsv")[1:3]] == ["entailment", "neutral"]
    assert [r[1] for r in _rows(tmp_path / "CoLA.tsv")[1:]] == ["0", "1", "0", "1", "0"]
    assert [r[1] for r in _rows(tmp_path / "STS-B.tsv")[1:]] == ["0.000", "1.234", "2.500", "5.000", "3.000"]
    assert check_submission(tmp_path, expected_rows=sizes) == []
    problems = check_submission(tmp_path)  # against the official test sizes: every file is too short
    assert len(problems) == 11 and "5 rows, the official test set has 1063" in problems[0]


def test_submission_from_logits_with_test_indices(tmp_path):
    test = load_split("qqp", "test", root=FIXTURES, hf=False)
    logits = [[0.1, 2.0], [3.0, -1.0], [0.0, 0.5], [1.0, 0.0]]
    write_submission("qqp", logits, tmp_path, indices=[e.index for e in test])
    assert _rows(tmp_path / "QQP.tsv")[1:] == [["0", "1"], ["1", "0"], ["2", "1"], ["3", "0"]]
    stsb = write_submission("stsb", [[-0.3], [5.7]], tmp_path, indices=[7, 9])  # (N, 1) regression head
    assert _rows(stsb)[1:] == [["7", "0.000"], ["9", "5.000"]]
    with pytest.raises(ValueError, match="3 predictions for 2 indices"):
        write_submission("rte", [0, 1, 1], tmp_path, indices=[0, 1])


def test_mnli_model_writes_matched_mismatched_and_ax(tmp_path):
    sizes = {}
    for name in TASKS["mnli"].evals:
        test = load_eval(name, "test", root=FIXTURES, hf=False)
        write_submission(name, [2] * len(test), tmp_path, indices=[e.index for e in test])
        sizes[name] = len(test)
    assert sizes == {"mnli_m": 3, "mnli_mm": 2, "ax": 4}
    assert check_submission(tmp_path, names=sizes, expected_rows=sizes) == []
    assert _rows(tmp_path / "AX.tsv")[-1] == ["3", "contradiction"]


def test_check_submission_finds_bad_files(tmp_path):
    (tmp_path / "RTE.tsv").write_text("index\tprediction\n0\tentailment\n1\tmaybe\n")
    (tmp_path / "CoLA.tsv").write_text("id\tlabel\n0\t1\n")
    (tmp_path / "STS-B.tsv").write_text("index\tprediction\n0\t5.5\n")
    problems = check_submission(
        tmp_path, names=["rte", "cola", "stsb", "wnli"], expected_rows={"rte": 2, "cola": 1, "stsb": 1}
    )
    assert len(problems) == 4
    assert "RTE.tsv:3: bad row ['1', 'maybe']" in problems[0]
    assert "CoLA.tsv:1: header must be" in problems[1]
    assert "STS-B.tsv:2: bad row" in problems[2] and "WNLI.tsv: missing" in problems[3]


def test_a_run_of_some_tasks_says_how_many_submission_files_it_has_not_a_problem_count(tmp_path):
    """lm finetune task=glue/rte (the README's second command) said 'submission/ is not complete (10 problem(s),
    e.g. .../CoLA.tsv: missing); no submission.zip': the other tasks' files are absent by design, not problems."""
    from lm.glue.run import incomplete_submission

    write_submission("rte", [0, 1] * 1500, tmp_path)  # the official test set's 3,000 rows
    msg = incomplete_submission(tmp_path, check_submission(tmp_path))
    assert msg.startswith(f"{tmp_path}: 1 of the 11 leaderboard files;") and "task=glue/all" in msg
    assert "problem" not in msg
    (tmp_path / "RTE.tsv").write_text("index\tprediction\n0\tmaybe\n")  # a file the leaderboard rejects is named
    msg = incomplete_submission(tmp_path, check_submission(tmp_path))
    assert "problem(s), e.g." in msg and "RTE.tsv: 1 rows" in msg and "no submission.zip" in msg


def test_writes_are_atomic(tmp_path, monkeypatch):
    path = write_submission("sst2", [1, 0], tmp_path)
    before = path.read_text()

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        write_submission("sst2", [0, 0, 0], tmp_path)
    assert path.read_text() == before  # the old file is intact
    assert [p.name for p in tmp_path.iterdir()] == ["SST-2.tsv"]  # and no temporary file is left


# -- results ---------------------------------------------------------------------------------------


def _m(**kv):
    names = list(kv)
    return {**kv, "score": sum(kv.values()) / len(names)}


def test_results_json_and_table(tmp_path):
    dev = {
        "cola": {0: _m(mcc=10.0), 1: _m(mcc=30.0), 2: _m(mcc=20.0)},
        "mrpc": {0: _m(f1=80.0, acc=70.0), 1: _m(f1=84.0, acc=74.0), 2: _m(f1=82.0, acc=78.0)},
        "stsb": {0: _m(pearson=50.0, spearman=40.0), 1: _m(pearson=60.0, spearman=70.0)},
        "mnli_m": {0: _m(acc=60.0)},
        "mnli_mm": {0: _m(acc=62.0)},
    }
    json_path, md_path = write_results(dev, tmp_path, extra={"checkpoint": "runs/x"})
    r = json.loads(json_path.read_text())
    assert r["units"].startswith("points (x100)") and r["checkpoint"] == "runs/x"
    assert list(r["columns"]) == ["cola", "mrpc", "stsb", "mnli_m", "mnli_mm"]
    assert r["columns"]["cola"]["median"] == {"mcc": 20.0, "score": 20.0}
    assert r["columns"]["mrpc"]["median"] == {"f1": 82.0, "acc": 74.0, "score": 78.0}
    assert r["columns"]["stsb"]["median"] == {"pearson": 55.0, "spearman": 55.0, "score": 55.0}  # even: mean of 2
    assert r["columns"]["mrpc"]["seeds"]["1"] == {"f1": 84.0, "acc": 74.0, "score": 79.0}
    # GLUE of the medians over the 4 tasks present: cola 20, mrpc 78, stsb 55, mnli (60 + 62) / 2
    g = r["glue"]
    assert g["partial"] and g["missing_tasks"] == ["sst2", "qqp", "qnli", "rte", "wnli"]
    assert g["median"] == pytest.approx((20 + 78 + 55 + 61) / 4)
    assert g["per_seed"]["0"] == pytest.approx((10 + 75 + 45 + 61) / 4)
    # seeds 1 and 2 did not run every task (MNLI, STS-B): no GLUE score rather than one over other tasks
    assert g["per_seed"]["1"] is None and g["per_seed"]["2"] is None
    md = md_path.read_text()
    assert "| task | metric | seed 0 | seed 1 | seed 2 | median |" in md
    assert "| MRPC | F1/acc | 80.0/70.0 | 84.0/74.0 | 82.0/78.0 | 82.0/74.0 |" in md
    assert "| STS-B | Pearson/Spearman | 50.0/40.0 | 60.0/70.0 | – | 55.0/55.0 |" in md
    assert "| GLUE (partial, 4/9) | score | 47.8 | – | – | 53.5 |" in md and "not comparable" in md
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json", "results.md"]


def test_a_seed_that_some_tasks_did_not_run_has_no_glue_score(tmp_path):
    """task=glue/all's presets: CoLA, MRPC, STS-B, RTE, WNLI run seeds 0-2, the others seed 0 only. Seed 1's GLUE
    score would be the mean of the five small tasks, shown beside seed 0's nine-task score as if comparable."""
    three = {"cola", "mrpc", "stsb", "rte", "wnli"}
    dev = {
        c: {s: _m(**dict.fromkeys(e.metrics, 40.0 + 10 * s)) for s in ((0, 1, 2) if e.task in three else (0,))}
        for c, e in EVALS.items()
        if c != "ax"
    }
    r = json.loads(write_results(dev, tmp_path)[0].read_text())
    assert not r["glue"]["partial"] and r["glue"]["per_seed"] == {"0": pytest.approx(40.0), "1": None, "2": None}
    assert r["glue"]["median"] == pytest.approx((4 * 40.0 + 5 * 50.0) / 9)  # the 3-seed tasks' median is seed 1's
    assert "| GLUE | score | 40.0 | – | – | 45.6 |" in (tmp_path / "results.md").read_text()


def test_full_glue_results_row(tmp_path):
    dev = {c: {0: _m(**dict.fromkeys(e.metrics, 50.0 + i))} for i, (c, e) in enumerate(EVALS.items()) if c != "ax"}
    dev["ax"] = {0: _m(mcc=5.0)}
    r = json.loads(write_results(dev, tmp_path)[0].read_text())
    # task scores 50 51 52 53 54 (55+56)/2 57 58 59 -> 489.5 / 9 = 54.39; AX (5.0) is not in it
    assert r["glue"]["median"] == pytest.approx((50 + 51 + 52 + 53 + 54 + 55.5 + 57 + 58 + 59) / 9)
    assert not r["glue"]["partial"] and r["glue"]["per_seed"]["0"] == r["glue"]["median"]
    md = (tmp_path / "results.md").read_text()
    assert "| GLUE | score | 54.4 | 54.4 |" in md and "| AX | MCC | 5.0 | 5.0 |" in md and "partial" not in md


# -- presets and schema ----------------------------------------------------------------------------

PRESETS = sorted(p.stem for p in (conf_dir() / "task" / "glue").glob("*.yaml"))


def test_there_is_a_preset_per_task_and_all():
    assert sorted([*GLUE_TASKS, "all"]) == PRESETS


def compose_tasks(*overrides):
    """The typed job of `lm finetune init=none <overrides>` (the presets compose under tasks.<name>)."""
    register()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        return finetune_job(compose(config_name="finetune", overrides=["init=none", *overrides]))


@pytest.mark.parametrize("name", PRESETS)
def test_preset_composes_through_hydra_and_validates(name):
    tasks = compose_tasks(f"task=glue/{name}").tasks
    assert list(tasks) == (list(GLUE_TASKS) if name == "all" else [name])
    for key, cfg in tasks.items():
        assert isinstance(cfg, GlueTaskConfig) and cfg.name == key
        validate_glue_task(cfg)
        assert cfg.n_labels == TASKS[key].n_labels and cfg.max_len <= 128 and cfg.seeds


def test_all_composes_the_nine_presets_and_shared_settings_reach_each():
    job = compose_tasks("task=glue/all", "glue.max_train_examples=100", "optim.lr=3e-4", "tasks.rte.lr=1e-3")
    cfgs = list(job.tasks.values())
    assert [c.name for c in cfgs] == list(GLUE_TASKS)
    assert [c.n_labels for c in cfgs] == [2, 2, 2, 1, 2, 3, 2, 2, 2]
    assert all(c.max_train_examples == 100 for c in cfgs)
    assert {c.name: c.epochs for c in cfgs}["rte"] == 10  # each keeps its own hyperparameters
    assert {c.name: c.optim(job.optim).lr for c in cfgs} == {**dict.fromkeys(GLUE_TASKS, 0.0003), "rte": 1e-3}
    assert job.tasks["rte"].optim(job.optim).betas == [0.9, 0.999]  # the rest of the shared optim group
    assert job.tasks["rte"].sched(job.sched, 200).warmup_steps == 20  # warmup_ratio 0.1 of the task's steps
    two = compose_tasks("task=[glue/rte,glue/qqp]", "tasks.qqp.epochs=1").tasks
    assert list(two) == ["rte", "qqp"] and two["qqp"].epochs == 1 and two["rte"].epochs == 10


@pytest.mark.parametrize(
    "fields,message",
    [
        ({"name": "squad"}, "task name 'squad'"),
        ({"name": "stsb", "n_labels": 2}, "set tasks.stsb.n_labels=1"),
        ({"name": "mnli", "n_labels": 3, "main_metric": "acc"}, "tasks.mnli.main_metric='acc'"),
        ({"name": "rte", "max_len": 3}, "tasks.rte.max_len=3"),
        ({"name": "rte", "seeds": []}, "tasks.rte.seeds is empty"),
    ],
)
def test_bad_task_configs_name_the_field(fields, message):
    with pytest.raises(ConfigError, match=message):
        validate_glue_task(GlueTaskConfig(**fields))


def test_unknown_preset_and_unknown_key():
    from hydra.errors import ConfigCompositionException, MissingConfigException

    with pytest.raises(MissingConfigException, match="^In 'finetune': Could not find 'task/glue/squad'"):
        compose_tasks("task=glue/squad")
    with pytest.raises(ConfigCompositionException, match="^Could not override 'tasks.rte.lr_typo'"):
        compose_tasks("task=glue/rte", "tasks.rte.lr_typo=1")


@pytest.mark.parametrize(
    "override,line",
    [
        ("tasks.rte.seeds=[0,-1]", "tasks.rte.seeds: -1 is not a seed (an integer from 0 to 2**64-1); e.g. "),
        ("protocol.seeds=[-2,0]", "protocol.seeds: -2 is not a seed (an integer from 0 to 2**64-1); e.g. "),
    ],
)
def test_a_negative_finetuning_seed_is_refused_when_the_job_is_typed(override, line):
    """tasks.rte.seeds=[-1] passed the checks, then the task's data order (default_rng(-1)) ended the job in numpy's
    traceback after the model was loaded; lm transfer --seeds 0,-1 got there after its pretraining."""
    extra = ["protocol=turc"] if override.startswith("protocol") else []
    with pytest.raises(ConfigError) as e:
        compose_tasks("task=glue/rte", *extra, override)
    assert str(e.value).startswith(line)


@pytest.mark.parametrize(
    "override,line",
    [
        ("seed=5", "seed=5 does not seed lm finetune: each task runs its tasks.<name>.seeds (e.g. tasks.rte.seeds=[5]"),
        ("tasks.rte.seeds=[0,0]", "tasks.rte.seeds=[0, 0] repeats a seed"),
    ],
)
def test_a_seed_lm_finetune_would_not_run_as_asked_is_refused(override, line):
    """seed=5 was accepted and seeded nothing (a sweep seed=0,1,2 ran three identical jobs); tasks.rte.seeds=[0,0] ran
    seed 0 once, where protocol.seeds refused the same repeat."""
    with pytest.raises(ConfigError) as e:
        compose_tasks("task=glue/rte", override)
    assert str(e.value).startswith(line)
    compose_tasks("task=glue/rte", "seed=0", "tasks.rte.seeds=[0,1]")  # the default seed and distinct ones compose
