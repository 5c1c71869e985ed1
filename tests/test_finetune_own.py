"""lm finetune task=own: a user's CSV/TSV/JSONL files finetuned the GLUE way (lm/glue/own.py). End to end on rows of
the mirror's SST-2 (labels as strings, inferred) and STS-B (a pair, regression) with the tiny pretrained run of
tests/glue_support.py; then each refusal's exact line."""

import csv
import json
import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score

import lm.glue.trainer as glue_trainer
from lm.cli.finetune import finetune
from lm.config import ConfigError
from lm.glue.config import GlueTaskConfig, check_task_args, finetune_job
from lm.glue.own import read_rows, resolve
from lm.glue.readers import GlueDataError, GlueDataMissing
from lm.glue.tasks import EVALS, TASKS
from tests.glue_support import easy_glue, finetune_cfg, pretrained  # noqa: F401 - fixtures, helper


def glue_rows(mirror: Path, task: str, n: int) -> list[dict]:
    """The first n rows of the mirror's GLUE train file (GLUE's TSV: tab, no quoting)."""
    with open(mirror / "glue_data" / task / "train.tsv", newline="") as f:
        rows = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [r for _, r in zip(range(n), rows)]


def write_csv(path, header, rows):
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([header, *rows])
    return path


def own_task(**fields) -> list[str]:
    fields = {"epochs": 2, "lr": 3e-3, "batch_size": 16, "max_len": 32, "seeds": "[0]", **fields}
    return ["task=own", *(f"tasks.own.{k}={v}" for k, v in fields.items())]


@pytest.fixture
def dev_predictions(monkeypatch):
    """Every prediction lm finetune makes, in order: (features' count, outputs)."""
    calls, predict = [], glue_trainer.predict

    def recorded(engine, features, *args, **kwargs):
        out = predict(engine, features, *args, **kwargs)
        calls.append((len(features), out))
        return out

    monkeypatch.setattr(glue_trainer, "predict", recorded)
    return calls


def test_a_csv_of_string_labels_finetunes_with_inferred_classes(
    tmp_path,
    data_mirror,
    pretrained,  # noqa: F811
    dev_predictions,
    caplog,
):
    rows = [[r["sentence"], "pos" if r["label"] == "1" else "neg"] for r in glue_rows(data_mirror, "SST-2", 200)]
    train = write_csv(tmp_path / "train.csv", ["sentence", "label"], rows[:160])
    dev = write_csv(tmp_path / "dev.csv", ["Sentence", "Label "], rows[160:])  # a spreadsheet's header
    run_dir = tmp_path / "ft"
    files = [f"tasks.own.train_file={train}", f"tasks.own.dev_file={dev}"]
    with caplog.at_level(logging.INFO, logger="lm"):
        summary = finetune(finetune_cfg(run_dir, [f"init={pretrained / 'run'}", *own_task(), *files]))
    assert caplog.text.count(f"task=own: classes ['neg', 'pos'] from {train}'s labels") == 1
    assert "task=own: 160 train examples, dev {'own': 40}, test none, so no submission file" in caplog.text
    assert summary["tasks"]["own"]["config"]["labels"] == ["neg", "pos"]
    assert summary["tasks"]["own"]["config"]["n_labels"] == 2
    result = json.loads((run_dir / "results.json").read_text())["columns"]["own"]
    assert result["metrics"] == ["acc", "f1"]
    # the dev predictions of the best epoch (one dev pass per epoch, 40 rows), scored by scikit-learn
    passes = [out for n, out in dev_predictions if n == 40]
    best = passes[summary["tasks"]["own"]["runs"]["0"]["best_epoch"] - 1].argmax(-1)
    y = np.array([["neg", "pos"].index(r[1]) for r in rows[160:]])
    seed = result["seeds"]["0"]
    assert seed["acc"] == pytest.approx(100 * accuracy_score(y, best))
    assert seed["f1"] == pytest.approx(100 * f1_score(y, best, pos_label=1))
    assert seed["score"] == seed["acc"]  # the main metric is accuracy, not MRPC's mean with F1
    table = (run_dir / "results.md").read_text()
    assert "# Dev results" in table and f"| own | acc/F1 | {seed['acc']:.1f}/{seed['f1']:.1f} |" in table
    assert "GLUE" not in table and not (run_dir / "submission").exists()
    assert "own" not in TASKS and "own" not in EVALS  # registered for the job only
    # the same command again: the finished pair is read back (its recorded classes are the files' again)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lm"):
        again = finetune(finetune_cfg(run_dir, [f"init={pretrained / 'run'}", *own_task(), *files]))
    assert "GLUE own seed 0: done in an earlier run" in caplog.text
    assert again["dev"]["own"][0] == seed


def test_a_jsonl_pair_regression_finetunes(tmp_path, data_mirror, pretrained, dev_predictions):  # noqa: F811
    rows = [
        {"s1": r["sentence1"], "s2": r["sentence2"], "score": float(r["score"])}
        for r in glue_rows(data_mirror, "STS-B", 160)
    ]
    for name, part in (("train", rows[:120]), ("dev", rows[120:])):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    run_dir = tmp_path / "ft"
    task = own_task(text_a="s1", text_b="s2", label="score", regression="true", max_len=48)
    files = [f"tasks.own.train_file={tmp_path / 'train.jsonl'}", f"tasks.own.dev_file={tmp_path / 'dev.jsonl'}"]
    summary = finetune(finetune_cfg(run_dir, [f"init={pretrained / 'run'}", *task, *files]))
    assert summary["tasks"]["own"]["config"]["n_labels"] == 1
    seed = json.loads((run_dir / "results.json").read_text())["columns"]["own"]["seeds"]["0"]
    passes = [out for n, out in dev_predictions if n == 40]
    best = passes[summary["tasks"]["own"]["runs"]["0"]["best_epoch"] - 1][:, 0]  # unclipped: no known range
    y = np.array([r["score"] for r in rows[120:]])
    assert seed["pearson"] == pytest.approx(100 * pearsonr(best, y)[0])
    assert seed["spearman"] == pytest.approx(100 * spearmanr(best, y)[0])
    assert seed["score"] == pytest.approx((seed["pearson"] + seed["spearman"]) / 2)


def test_own_beside_a_glue_task_under_a_grid_protocol(tmp_path, data_mirror, pretrained):  # noqa: F811
    """'task=[glue/rte,own]' with protocol=: both rows and both grids in the table lm finetune prints after the job
    (the own task is no longer in the registry then), RTE's submission file and none for own."""
    from lm.glue.run import print_table

    rows = [[r["sentence"], r["label"]] for r in glue_rows(data_mirror, "SST-2", 96)]
    train = write_csv(tmp_path / "train.csv", ["sentence", "label"], rows[:64])
    dev = write_csv(tmp_path / "dev.csv", ["sentence", "label"], rows[64:])
    grid = ["protocol=small", "protocol.lrs=[1e-3]", "protocol.batch_sizes=[32]", "protocol.seeds=[0]"]
    overrides = [f"init={pretrained / 'run'}", "task=[glue/rte,own]", f"glue.data_root={data_mirror / 'glue_data'}"]
    overrides += ["glue.max_train_examples=32", f"tasks.own.train_file={train}", f"tasks.own.dev_file={dev}", *grid]
    finetune(finetune_cfg(tmp_path / "ft", [*overrides, "tasks.rte.max_len=32", "tasks.own.max_len=32"]))
    table = print_table(tmp_path / "ft")
    assert "| RTE | acc |" in table and "| own | acc/F1 |" in table and "| GLUE (partial, 1/9) |" in table
    assert "### RTE: dev acc of every cell" in table and "### own: dev score of every cell" in table
    assert sorted(p.name for p in (tmp_path / "ft" / "submission").iterdir()) == ["RTE.tsv"]


def test_own_composes_beside_glue_tasks(tmp_path):
    cfg = finetune_cfg(
        tmp_path, ["init=none", "task=[glue/rte,own]", "tasks.own.train_file=a.csv", "tasks.own.dev_file=b.csv"]
    )
    job = finetune_job(cfg)
    assert list(job.tasks) == ["rte", "own"] and job.tasks["own"].train_file == "a.csv"
    with pytest.raises(ConfigError) as e:
        check_task_args(["init=none", "task=glue/rte", "tasks.own.train_file=a.csv"])
    assert str(e.value) == (
        "tasks.own.train_file=a.csv: own is not among the tasks this run finetunes (rte); add it "
        "('task=[glue/rte,own]') or leave the override out"
    )


# -- refusals --------------------------------------------------------------------------------------------------------


def own_cfg(tmp_path, train_rows, dev_rows=None, header=("sentence", "label"), **fields) -> GlueTaskConfig:
    train = write_csv(tmp_path / "train.csv", header, train_rows)
    dev = write_csv(tmp_path / "dev.csv", header, dev_rows or train_rows)
    return GlueTaskConfig(name="own", train_file=str(train), dev_file=str(dev), **fields)


def refused(cfg, error=GlueDataError) -> str:
    with pytest.raises(error) as e:
        resolve(cfg)
    return str(e.value)


ROWS = [["good film", "pos"], ["bad film", "neg"]]


def test_a_missing_file_is_refused(tmp_path):
    cfg = own_cfg(tmp_path, ROWS)
    (tmp_path / "dev.csv").unlink()
    assert refused(cfg, GlueDataMissing) == f"tasks.own.dev_file={tmp_path / 'dev.csv'}: no such file"


def test_a_missing_column_is_refused(tmp_path):
    cfg = own_cfg(tmp_path, ROWS, header=("text", "label"))
    assert refused(cfg) == (
        f"{tmp_path / 'train.csv'}:1: no column 'sentence' in the header ['text', 'label']; name it with "
        f"tasks.own.text_a="
    )
    (tmp_path / "t.jsonl").write_text('{"sentence": "a", "label": 1}\n{"sentence": "b", "lbl": 0}\n')
    cfg = GlueTaskConfig(name="own", train_file=str(tmp_path / "t.jsonl"), dev_file=str(tmp_path / "t.jsonl"))
    assert refused(cfg) == (
        f"{tmp_path / 't.jsonl'}:2: no field 'label' (has: ['sentence', 'lbl']); name it with tasks.own.label="
    )


def test_a_dev_label_not_among_the_train_labels_is_refused(tmp_path):
    cfg = own_cfg(tmp_path, ROWS, [["good", "pos"], ["so so", "maybe"]])
    assert refused(cfg) == (
        f"{tmp_path / 'dev.csv'}:3: label 'maybe' is not among the train labels ['neg', 'pos']; fix the row, or "
        f"list every class in tasks.own.labels"
    )


def test_a_non_numeric_label_with_regression_is_refused(tmp_path):
    cfg = own_cfg(tmp_path, [["a", "0.5"], ["b", "high"]], regression=True)
    assert refused(cfg) == (
        f"{tmp_path / 'train.csv'}:3: label 'high' is not a number, which tasks.own.regression=true reads; fix the "
        f"row, or drop regression=true for classes"
    )


def test_fewer_than_two_classes_is_refused(tmp_path):
    """Whether the classes are inferred or listed (tasks.own.labels was accepted with one class in train), or
    max_train_examples keeps only a file's first rows (sorted by class: one class): nothing to learn."""
    one_class = f"{tmp_path / 'train.csv'}: fewer than 2 classes among the train labels (['pos']); a classifier needs"
    cfg = own_cfg(tmp_path, [["a", "pos"], ["b", "pos "]], ROWS)
    assert refused(cfg) == f"{one_class} two or more (a numeric score: tasks.own.regression=true)"
    assert refused(replace(cfg, labels=["neg", "pos"])) == refused(cfg)
    cfg = own_cfg(tmp_path, [["a", "neg"], ["b", "neg"], ["c", "pos"]], max_train_examples=2)
    assert refused(cfg) == (
        f"{tmp_path / 'train.csv'}: fewer than 2 classes among the labels of the first 2 train rows "
        f"(tasks.own.max_train_examples: shuffle the file, or raise it) (['neg']); a classifier needs two or more "
        f"(a numeric score: tasks.own.regression=true)"
    )
    assert resolve(replace(cfg, max_train_examples=3)).labels == ["neg", "pos"]


def test_a_score_that_never_varies_is_refused(tmp_path):
    """A regression fit to one value learns nothing; Pearson and Spearman against one value are undefined (scipy's
    nan, which lm.glue.metrics scores 0 in every epoch)."""
    cfg = own_cfg(tmp_path, [["a", "1.5"], ["b", "1.50"]], [["a", "0"], ["b", "1"]], regression=True)
    assert refused(cfg) == (
        f"{tmp_path / 'train.csv'}: the train labels are all 1.5; a regression needs scores that vary (Pearson and "
        f"Spearman of one value are undefined)"
    )
    cfg = own_cfg(tmp_path, [["a", "0"], ["b", "1"]], [["a", "2"], ["b", "2"]], regression=True)
    assert refused(cfg).startswith(f"{tmp_path / 'dev.csv'}: the dev labels are all 2.0; a regression needs")


def test_two_spellings_of_one_class_are_refused(tmp_path):
    """ "Pos" beside "pos", or "1.0" beside "1" (a spreadsheet's export), made a third class of the same one;
    listed in tasks.own.labels, they are two classes on purpose."""
    cfg = own_cfg(tmp_path, [*ROWS, ["fine film", "Pos"]])
    assert refused(cfg) == (
        f"{tmp_path / 'train.csv'}:4: label 'Pos' is 'pos' (line 2) spelt another way; write one spelling, or list "
        f"both in tasks.own.labels if they are two classes"
    )
    assert resolve(replace(cfg, labels=["neg", "pos", "Pos"])).n_labels == 3
    cfg = own_cfg(tmp_path, [["a", "0"], ["b", "1"], ["c", "1.0"]])
    assert refused(cfg).startswith(f"{tmp_path / 'train.csv'}:4: label '1.0' is '1' (line 3) spelt another way")


def test_a_column_named_twice_is_refused(tmp_path):
    """A header naming the label twice (the first was read), or two settings naming one column (a pair of one
    text with itself)."""
    cfg = own_cfg(tmp_path, [["a", "pos", "neg"], ["b", "neg", "pos"]], header=("sentence", "label", "label"))
    assert refused(cfg) == f"{tmp_path / 'train.csv'}:1: the header names 'label' 2 times; rename all but one"
    cfg = own_cfg(
        tmp_path, [["a", "b", "pos"], ["c", "d", "neg"]], header=("sentence1", "sentence2", "label"), text_b="Sentence1"
    )
    assert refused(cfg, ConfigError) == (
        "tasks.own.text_b=Sentence1 names the column tasks.own.text_a reads; name each its own column"
    )


def test_an_empty_text_is_refused(tmp_path):
    cfg = own_cfg(tmp_path, [*ROWS, ["  ", "pos"]])
    assert refused(cfg) == f"{tmp_path / 'train.csv'}:4: the text 'sentence' is empty; fill it or delete the row"
    pair = own_cfg(tmp_path, [["a", "b", "pos"], ["c", "", "neg"]], header=("s1", "s2", "label"), text_a="s1")
    assert refused(replace(pair, text_b="s2")) == (
        f"{tmp_path / 'train.csv'}:3: the text 's2' is empty; fill it or delete the row"
    )
    (tmp_path / "t.jsonl").write_text('{"s1": "a", "s2": "b", "label": 1}\n{"s1": "c", "s2": null, "label": 0}\n')
    pair = replace(pair, text_b="s2", train_file=str(tmp_path / "t.jsonl"))
    assert refused(pair) == f"{tmp_path / 't.jsonl'}:2: the text 's2' is empty; fill it or delete the row"


def test_a_nul_byte_is_refused_naming_the_line(tmp_path):
    """A truncated or corrupted file (csv reads NUL as text since Python 3.11, json never sees a raw one)."""
    (tmp_path / "t.csv").write_bytes(b"sentence,label\ngood,pos\nba\x00d,neg\n")
    (tmp_path / "t.jsonl").write_bytes(b'{"sentence": "good", "label": 1}\n{"sentence": "b\x00", "label": 0}\n')
    for name, line in (("t.csv", 3), ("t.jsonl", 2)):
        cfg = GlueTaskConfig(name="own", train_file=str(tmp_path / name), dev_file=str(tmp_path / name))
        assert refused(cfg).startswith(f"{tmp_path / name}:{line}: the file is UTF-16 or binary, not UTF-8 text")


def test_own_settings_are_refused_before_any_file_is_read(tmp_path):
    with pytest.raises(ConfigError) as e:
        finetune_job(finetune_cfg(tmp_path, ["init=none", "task=own"]))
    assert str(e.value) == (
        "task=own reads your files: set tasks.own.train_file=<file> and tasks.own.dev_file=<file> "
        "(.csv, .tsv or .jsonl)"
    )
    with pytest.raises(ConfigError) as e:
        finetune_job(finetune_cfg(tmp_path, ["init=none", "task=glue/rte", "tasks.rte.train_file=a.csv"]))
    assert str(e.value) == "tasks.rte.train_file is read by task=own only (your own files); drop it for GLUE rte"


def test_a_tsv_is_quoted_as_a_csv_and_integer_classes_sort_as_numbers(tmp_path):
    """.tsv: tab-separated, a quoted field may hold a tab and "" (GLUE's TSVs are read unquoted); classes 1, 2, 10
    in that order, as run_glue's integer column sorts (as strings: 1, 10, 2)."""
    (tmp_path / "t.tsv").write_text('\ufeffsentence\tlabel\n"a\tquoted ""tab"""\t10\nplain\t2\nmore\t1\n')
    cfg = resolve(GlueTaskConfig(name="own", train_file=str(tmp_path / "t.tsv"), dev_file=str(tmp_path / "t.tsv")))
    assert cfg.labels == ["1", "2", "10"] and cfg.n_labels == 3
    assert [(r.text_a, r.label) for r in read_rows(cfg, "train_file")] == [
        ('a\tquoted "tab"', "10"),
        ("plain", "2"),
        ("more", "1"),
    ]


def test_jsonl_labels_may_be_json_booleans(tmp_path):
    """{"label": true} is how many tools write a binary label: its classes are "false", "true" (sorted)."""
    rows = [{"sentence": "good", "label": True}, {"sentence": "bad", "label": False}, {"sentence": "ok", "label": True}]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = resolve(GlueTaskConfig(name="own", train_file=str(tmp_path / "t.jsonl"), dev_file=str(tmp_path / "t.jsonl")))
    assert cfg.labels == ["false", "true"] and cfg.n_labels == 2
    assert [r.label for r in read_rows(cfg, "train_file")] == ["true", "false", "true"]


# -- several ranks ---------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.distributed
def test_own_on_two_ranks_scores_as_one_process(tmp_path):
    """DDP on 2 gloo ranks: the classes and dev scores of one process (acc/F1 95.0/94.7 both, when written), and the
    inferred classes said once (each rank said them, before any rank was quieted)."""
    import random
    import subprocess
    import sys

    from lm.data.tokenizer import train as train_tokenizer
    from tests.engine_support import REPO, free_port, subprocess_env
    from tests.glue_support import TINY, sentence

    rng = random.Random(0)
    for split, n in (("train", 160), ("dev", 60)):
        write_csv(
            tmp_path / f"{split}.csv",
            ["sentence", "label"],
            [[sentence(rng, i % 2), ["neg", "pos"][i % 2]] for i in range(n)],
        )
    texts = [sentence(rng, i % 2) for i in range(400)]
    train_tokenizer("bpe", texts, vocab_size=300, n_sentinels=0).save(tmp_path / "tokenizer.json")

    def run(world: int) -> tuple[dict, str]:
        run_dir = tmp_path / f"ranks{world}"
        args = ["init=none", *TINY, f"tokenizer={tmp_path / 'tokenizer.json'}", "hf=false", f"run_dir={run_dir}"]
        args += ["train.progress=false", "train.threads=1", "model.dropout=0.0", "optim.lr=3e-3", "engine=ddp"]
        args += own_task(
            epochs=2, max_len=24, dropout=0.0, train_file=tmp_path / "train.csv", dev_file=tmp_path / "dev.csv"
        )
        launcher = ["-m", "torch.distributed.run", "--nproc_per_node", str(world), "--master_addr", "127.0.0.1"]
        launcher += ["--master_port", str(free_port())]
        cmd = [sys.executable, *(launcher if world > 1 else []), "-m", "lm.cli.finetune", *args]
        env = subprocess_env(TORCH_ELASTIC_SHUTDOWN_TIMEOUT="5")
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads((run_dir / "results.json").read_text()), proc.stdout + proc.stderr

    (one, _), (two, said) = run(1), run(2)
    assert one["tasks"]["own"]["config"]["labels"] == two["tasks"]["own"]["config"]["labels"] == ["neg", "pos"]
    assert one["columns"]["own"]["seeds"]["0"]["acc"] > 80  # learnt: one sentiment word decides the label
    assert two["columns"]["own"]["seeds"]["0"] == pytest.approx(one["columns"]["own"]["seeds"]["0"], abs=1e-6)
    assert said.count("task=own: classes ['neg', 'pos']") == 1
