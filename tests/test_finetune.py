"""lm finetune end to end on CPU: it learns an easy task, starts from an lm train checkpoint or an export,
writes results and the leaderboard's files, runs MNLI/QQP/AX from official-format fixtures, and refuses
bad input (missing data, a foreign tokenizer, an unknown task field) with messages that name the fix.

The easy task is SST-2-shaped (official TSV layout, written to tmp): a sentence is positive when it
holds one of four positive words, negative when it holds one of four negative words, among neutral
filler; a bag-of-words model separates it, so a tiny decoder reaches far above chance in a few epochs.
"""

import csv
import json
import logging
import random
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from lm.cli.finetune import finetune, register
from lm.config import ConfigError, conf_dir
from lm.glue.init import InitError, load_backbone
from lm.glue.readers import GlueDataMissing
from lm.glue.submission import check_submission
from tests.benchmark_scripts import load

FIXTURES = Path(__file__).parent / "fixtures" / "glue"
POS, NEG = ["great", "lovely", "superb", "wonderful"], ["awful", "boring", "dreadful", "terrible"]
FILLER = [
    "the",
    "a",
    "film",
    "movie",
    "story",
    "plot",
    "actors",
    "scene",
    "was",
    "is",
    "and",
    "it",
    "this",
    "really",
    "quite",
]
TINY = ["model=tiny", "model.vocab_size=320", "model.dim=32", "model.n_layers=1", "model.n_heads=2"]


def sentence(rng, label):
    words = rng.choices(FILLER, k=rng.randint(3, 8))
    words.insert(rng.randrange(len(words) + 1), rng.choice(POS if label else NEG))
    return " ".join(words)


def write_tsv(path, header, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f, delimiter="\t", quoting=csv.QUOTE_NONE, lineterminator="\n")
        w.writerows([header, *rows])


@pytest.fixture(scope="module")
def easy_glue(tmp_path_factory):
    """glue_data/SST-2/{train,dev,test}.tsv of the easy task: 400 train, 100 dev, 30 test."""
    root = tmp_path_factory.mktemp("glue_data")
    rng = random.Random(0)
    for split, n in (("train", 400), ("dev", 100)):
        labels = [i % 2 for i in range(n)]
        write_tsv(root / "SST-2" / f"{split}.tsv", ["sentence", "label"], [[sentence(rng, y), y] for y in labels])
    write_tsv(root / "SST-2" / "test.tsv", ["index", "sentence"], [[i, sentence(rng, i % 2)] for i in range(30)])
    return root


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, easy_glue):
    """A 3-step lm train run (single engine) on a BPE tokenizer of 320 tokens; returns its run dir."""
    work = tmp_path_factory.mktemp("pretrain")
    rng = random.Random(1)
    text = "\n".join(sentence(rng, i % 2) for i in range(600)) + "\n"
    (work / "corpus.txt").write_text(text)
    pretrain(work, work / "run", max_steps=3)
    return work


def pretrain(work, run_dir, max_steps: int) -> None:
    """lm train of the `pretrained` fixture's run (its corpus and data dir under `work`) to max_steps in run_dir:
    the same command continues a copy of the run."""
    from lm.cli.train import train
    from lm.config import register_train_configs

    register_train_configs()
    overrides = [
        *TINY,
        f"run_dir={run_dir}",
        f"train.max_steps={max_steps}",
        "train.seq_len=32",
        "train.micro_batch_size=4",
        "train.eval_interval=0",
        "train.eval_batches=1",
        "train.ckpt_interval=3",
        "train.progress=false",
    ]
    data = {
        "name": "easy",
        "dir": work / "data",
        "source": work / "corpus.txt",
        "tokenizer": "bpe",
        "vocab_size": 320,
        "n_sentinels": 0,
        "workers": 1,
        "val_fraction": 0.1,
        "doc_split": "line",
    }
    overrides += ["~data", *(f"data.{k}={v}" for k, v in data.items())]  # no preset: DataConfig's defaults + these
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        cfg = compose(config_name="train", overrides=overrides)
    train(cfg)


def finetune_cfg(run_dir, overrides):
    register()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        return compose(
            config_name="finetune", overrides=[f"run_dir={run_dir}", "hf=false", "train.progress=false", *overrides]
        )


def easy_task(root, **task):
    fields = {"epochs": 6, "lr": 3e-3, "batch_size": 16, "max_len": 24, "seeds": [0], **task}
    return ["task=glue/sst2", f"glue.data_root={root}", *(f"tasks.sst2.{k}={v}" for k, v in fields.items())]


def dev_acc(run_dir, seed="0"):
    return json.loads((Path(run_dir) / "results.json").read_text())["columns"]["sst2"]["seeds"][seed]["acc"]


def test_scratch_finetune_learns_the_easy_task_and_writes_its_files(tmp_path, easy_glue, pretrained):
    run_dir = tmp_path / "ft"
    cfg = finetune_cfg(run_dir, ["init=none", *TINY, f"tokenizer={pretrained / 'data'}", *easy_task(easy_glue)])
    summary = finetune(cfg)
    acc = dev_acc(run_dir)
    assert acc > 85.0, f"dev accuracy {acc} on a task a bag of words solves (chance is 50)"
    assert summary["tasks"]["sst2"]["runs"]["0"]["best_epoch"] >= 1
    history = summary["tasks"]["sst2"]["runs"]["0"]["history"]
    assert len(history) == 6 and max(h["main"] for h in history) == pytest.approx(acc)
    # The leaderboard's file: header, 30 rows keyed 0..29, label strings "0"/"1".
    assert check_submission(run_dir / "submission", names=["sst2"], expected_rows={"sst2": 30}) == []
    rows = (run_dir / "submission" / "SST-2.tsv").read_text().splitlines()
    assert rows[0] == "index\tprediction" and len(rows) == 31 and {r.split("\t")[1] for r in rows[1:]} <= {"0", "1"}
    assert "| SST-2 | acc |" in (run_dir / "results.md").read_text()
    metrics = [json.loads(line) for line in (run_dir / "sst2" / "seed0" / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in metrics if "epoch" in m] == [1, 2, 3, 4, 5, 6]


def test_precision_auto_is_chosen_once_for_the_whole_job(tmp_path, easy_glue, pretrained, monkeypatch, caplog):
    """train.precision=auto (lm transfer's budget) is resolved once, before the tasks and seeds: every engine gets
    the choice, the log says it once, config.yaml keeps auto (a job resumed on other hardware is the same job)."""
    import lm.glue.run as glue_run
    from lm.engine import dist as dist_utils

    monkeypatch.setattr(dist_utils, "computes_bf16", lambda device: False)
    precisions = []
    make = glue_run._run_one

    def recorded(t, data, seed, out, job, *rest):
        precisions.append(job.train.precision)
        return make(t, data, seed, out, job, *rest)

    monkeypatch.setattr(glue_run, "_run_one", recorded)
    run_dir = tmp_path / "auto"
    overrides = ["init=none", *TINY, f"tokenizer={pretrained / 'data'}", "train.precision=auto"]
    with caplog.at_level("INFO", logger="lm"):
        finetune(finetune_cfg(run_dir, [*overrides, *easy_task(easy_glue, epochs=1, seeds="[0,1]")]))
    assert precisions == ["fp32", "fp32"]
    assert caplog.text.count("train.precision=auto: fp32 (cpu lacks bf16 units)") == 1
    assert "precision: auto" in (run_dir / "config.yaml").read_text()


def test_finetune_from_an_lm_train_checkpoint_uses_its_weights_and_tokenizer(tmp_path, easy_glue, pretrained):
    from lm.core.checkpoint import consolidated_state_dict, resolve

    backbone = load_backbone(str(pretrained / "run"))
    assert (
        backbone.tokenizer.sha256 == json.loads((pretrained / "data" / "meta.json").read_text())["tokenizer"]["sha256"]
    )
    ckpt = consolidated_state_dict(resolve(pretrained / "run"))
    from lm.glue.init import build_classifier

    model = build_classifier(backbone, n_labels=2, dropout=0.1)
    emb = model.backbone.embed.tok.weight
    assert emb.shape == ckpt["embed.tok.weight"].shape and bool((emb == ckpt["embed.tok.weight"]).all())
    run_dir = tmp_path / "ft"
    finetune(finetune_cfg(run_dir, [f"init={pretrained / 'run'}", *easy_task(easy_glue, epochs=4)]))
    assert dev_acc(run_dir) > 80.0
    assert (run_dir / "submission" / "SST-2.tsv").is_file()


def test_init_from_an_lm_export_directory(tmp_path, pretrained):
    from lm.cli.export import export

    out = export(pretrained / "run", tmp_path / "export", hf=False)
    with pytest.raises(InitError, match="without hf/tokenizer.json .*needs tokenizer="):  # --no-hf: no tokenizer
        load_backbone(str(out))
    backbone = load_backbone(str(out), tokenizer=str(pretrained / "data"))
    assert backbone.state_dict is not None and backbone.model_cfg.vocab_size == 320
    # with its hf/ (lm export's default), the export carries the pretraining tokenizer: no tokenizer= needed
    from lm.data.tokenizer import Tokenizer

    shared = load_backbone(str(export(pretrained / "run", tmp_path / "shared")))
    text = "The cat sat on the mat. <eos> and more"
    assert shared.tokenizer.encode(text) == Tokenizer.load(pretrained / "data").encode(text)
    assert shared.tokenizer.vocab_size == backbone.tokenizer.vocab_size


def test_a_foreign_tokenizer_is_refused(tmp_path, pretrained):
    from lm.data.tokenizer import train as train_tokenizer

    other = train_tokenizer(
        "bpe", ["completely different text " * 50, "zebra quantum xylophone"], vocab_size=300, n_sentinels=0
    )
    other.save(tmp_path / "tokenizer.json")
    with pytest.raises(InitError, match="not the tokenizer .* was pretrained with"):
        load_backbone(str(pretrained / "run"), tokenizer=str(tmp_path / "tokenizer.json"))
    big = train_tokenizer(
        "bpe", [sentence(random.Random(i), 1) for i in range(200)] + ["x" * 10] * 5, vocab_size=400, n_sentinels=0
    )
    if big.vocab_size <= 320:
        pytest.fail(f"test setup: the big tokenizer has only {big.vocab_size} tokens")
    big.save(tmp_path / "big.json")
    cfg = finetune_cfg(tmp_path / "x", ["init=none", *TINY, f"tokenizer={tmp_path / 'big.json'}"])
    with pytest.raises(InitError, match=r"has \d+ tokens but model.vocab_size=320.*set model.vocab_size=384"):
        finetune(cfg)


def test_missing_task_directory_names_the_path_and_how_to_get_it(tmp_path, pretrained, caplog):
    """One error, said once (the hub's answer was also logged as a warning before it), and no run directory: it
    was made, with a config.yaml, before the data was looked for."""
    cfg = finetune_cfg(tmp_path / "x", [f"init={pretrained / 'run'}", "task=glue/rte", f"glue.data_root={tmp_path}"])
    with caplog.at_level(logging.WARNING, logger="lm"), pytest.raises(GlueDataMissing) as e:
        finetune(cfg)
    assert str(tmp_path / "RTE" / "train.tsv") in str(e.value) and "download_glue_data.py" in str(e.value)
    assert str(e.value).splitlines()[1].startswith(f"  rte: not found: {tmp_path / 'RTE' / 'train.tsv'}, ")
    assert not [r for r in caplog.records if "RTE" in r.getMessage()]
    assert not (tmp_path / "x").exists()


def test_skip_missing_runs_the_tasks_that_are_there(tmp_path, pretrained):
    run_dir = tmp_path / "ft"
    cfg = finetune_cfg(
        run_dir,
        [
            f"init={pretrained / 'run'}",
            "task=[glue/rte,glue/qqp]",
            f"glue.data_root={FIXTURES}",
            "skip_missing=true",
            "tasks.rte.epochs=1",
            "tasks.qqp.epochs=1",
            "tasks.rte.seeds=[0]",
        ],
    )
    finetune(cfg)
    results = json.loads((run_dir / "results.json").read_text())
    assert list(results["columns"]) == ["qqp"] and list(results["skipped_tasks"]) == ["rte"]
    assert str(FIXTURES / "RTE" / "train.tsv") in results["skipped_tasks"]["rte"]
    assert "partial" in (run_dir / "results.md").read_text()


def test_a_second_finetune_on_a_held_run_dir_refuses(tmp_path, pretrained):
    """lm finetune takes the same run-dir lock as lm train: a second job on the directory refuses."""
    import subprocess
    import sys

    from lm.core.lock import RunDirLocked
    from tests.engine_support import REPO, subprocess_env

    run_dir = tmp_path / "ft"
    run_dir.mkdir()
    hold = (
        "import sys, time; from lm.core.lock import acquire; acquire(sys.argv[1]); "
        "print('holding', flush=True); time.sleep(120)"
    )
    first = subprocess.Popen(
        [sys.executable, "-c", hold, str(run_dir)], env=subprocess_env(), cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert first.stdout.readline().strip() == "holding"
        with pytest.raises(RunDirLocked, match=rf"in use by another run \(pid {first.pid} on "):
            finetune(finetune_cfg(run_dir, [f"init={pretrained / 'run'}", "task=glue/sst2"]))
        assert not (run_dir / "config.yaml").exists() and not (run_dir / "results.json").exists()
    finally:
        first.kill()
        first.wait()


def test_missing_init_and_unknown_task_field_are_config_errors(tmp_path, pretrained):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigError, match="init=<lm train run dir"):
        finetune(finetune_cfg(tmp_path, []))
    with pytest.raises(InitError, match="no such directory"):
        finetune(finetune_cfg(tmp_path, [f"init={tmp_path / 'nope'}"]))
    init = [f"init={pretrained / 'run'}", f"glue.data_root={FIXTURES}", "task=glue/qqp"]
    with pytest.raises(ConfigCompositionException, match=r"tasks\.qqp\.epoch'"):  # the schema has epochs
        finetune_cfg(tmp_path, [*init, "tasks.qqp.epoch=2"])
    # train.* fields without a meaning in finetuning are not in its schema (a task's batch sets accumulation).
    for field in ("seq_len", "max_steps", "eval_interval", "eval_batches", "global_batch_size", "grad_accum"):
        with pytest.raises(ConfigCompositionException, match=f"train.{field}"):
            finetune_cfg(tmp_path, [*init, f"train.{field}=2"])
    with pytest.raises(ConfigCompositionException, match=r"tasks\.rte\.epochs"):  # rte is not selected
        finetune_cfg(tmp_path, [*init, "+tasks.rte.epochs=2"])


def test_mnli_qqp_and_ax_from_official_format_fixtures(tmp_path, pretrained):
    """glue/all over the fixture tasks: MNLI (matched + mismatched + AX from its model) and QQP."""
    run_dir = tmp_path / "all"
    cfg = finetune_cfg(
        run_dir,
        [
            f"init={pretrained / 'run'}",
            "task=[glue/qqp,glue/mnli]",
            f"glue.data_root={FIXTURES}",
            *(f"tasks.{t}.{k}" for t in ("qqp", "mnli") for k in ("epochs=1", "seeds=[0,1]")),
        ],
    )
    summary = finetune(cfg)
    results = json.loads((run_dir / "results.json").read_text())
    assert list(results["columns"]) == ["qqp", "mnli_m", "mnli_mm"]
    assert set(results["columns"]["mnli_m"]["seeds"]) == {"0", "1"}
    for col in ("mnli_m", "mnli_mm"):
        assert 0.0 <= results["columns"][col]["median"]["acc"] <= 100.0
    assert results["glue"]["partial"] and set(results["glue"]["missing_tasks"]) == {
        "cola",
        "sst2",
        "mrpc",
        "stsb",
        "qnli",
        "rte",
        "wnli",
    }
    rows = {"qqp": 4, "mnli_m": 3, "mnli_mm": 2, "ax": 4}  # the fixtures' test rows
    assert check_submission(run_dir / "submission", names=list(rows), expected_rows=rows) == []
    ax = (run_dir / "submission" / "AX.tsv").read_text().splitlines()
    assert ax[0] == "index\tprediction" and {r.split("\t")[1] for r in ax[1:]} <= {
        "entailment",
        "neutral",
        "contradiction",
    }
    assert summary["submission"]["AX"]["seed"] == summary["tasks"]["mnli"]["best_seed"]
    assert not (run_dir / "submission.zip").exists()  # 4 of 11 files: not a complete submission


def test_wandb_runs_are_finetune_jobs_grouped_with_their_pretraining_run(tmp_path, pretrained, monkeypatch):
    """logger=wandb: every task/seed is a wandb run of job type finetune in the pretraining run's group."""
    from lm.core import tracking

    seen = []
    monkeypatch.setattr(tracking.Tracker, "_start_wandb", lambda self, cfg, config: seen.append((cfg, config)))
    cfg = finetune_cfg(
        tmp_path / "ft",
        [
            f"init={pretrained / 'run'}",
            "logger=wandb",
            "task=glue/qqp",
            f"glue.data_root={FIXTURES}",
            "tasks.qqp.epochs=1",
            "tasks.qqp.seeds=[0,1]",
        ],
    )
    finetune(cfg)
    assert [c.job_type for c, _ in seen] == ["finetune", "finetune"]
    assert {c.group for c, _ in seen} == {"run"}  # the pretraining run dir's name (its logger.group is unset)
    assert [c.name for c, _ in seen] == ["ft-qqp-seed0", "ft-qqp-seed1"]
    assert seen[0][1]["task"]["name"] == "qqp" and seen[0][1]["init"] == str(pretrained / "run")


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp2_checkpoint_finetuned_with_ddp_on_two_ranks(tmp_path, easy_glue):
    """Pretrain with FSDP2 on 2 ranks (sharded DCP checkpoint), finetune that checkpoint with DDP on 2 ranks."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1", "LM_CACHE": str(tmp_path / "cache")}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    pre = subprocess.run(
        [
            *torchrun,
            "-m",
            "lm.cli.train",
            "engine=fsdp2",
            f"run_dir={tmp_path / 'pre'}",
            "train.max_steps=3",
            "train.eval_batches=1",
            "train.world_size=2",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert pre.returncode == 0, pre.stderr[-3000:]
    assert (
        json.loads((tmp_path / "pre" / "checkpoints" / "step_00000003" / "trainer.json").read_text())["engine"][
            "format"
        ]
        == "dcp"
    )
    # No dropout, so 2 DDP ranks (one micro-batch of 8 each) and 1 process (two of 8) compute the same steps.
    task = easy_task(easy_glue, epochs=4, lr=3e-3, max_len=64, dropout=0.0)
    common = [
        f"init={tmp_path / 'pre'}",
        "hf=false",
        "train.micro_batch_size=8",
        "pooling=mean",
        "train.log_interval=1",
        *task,
    ]
    ft = subprocess.run(
        [
            *torchrun,
            "-m",
            "lm.cli.finetune",
            "engine=ddp",
            f"run_dir={tmp_path / 'ddp'}",
            "train.world_size=2",
            *common,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert ft.returncode == 0, ft.stderr[-3000:]
    assert "| SST-2 | acc |" in ft.stdout
    assert check_submission(tmp_path / "ddp" / "submission", names=["sst2"], expected_rows={"sst2": 30}) == []
    finetune(finetune_cfg(tmp_path / "single", [c for c in common if c != "hf=false"]))
    losses = {
        d: [
            json.loads(line)["loss"]
            for line in (tmp_path / d / "sst2" / "seed0" / "metrics.jsonl").read_text().splitlines()
            if '"loss"' in line
        ][:20]
        for d in ("ddp", "single")
    }
    assert len(losses["ddp"]) == 20
    # The same global-mean gradient on 2 ranks as in 1 process: the first steps' losses agree to float
    # rounding (later, rounding differences grow in this near-chance regime, so only early steps are compared).
    assert losses["ddp"] == pytest.approx(losses["single"], rel=1e-4)
    history = json.loads((tmp_path / "ddp" / "results.json").read_text())["tasks"]["sst2"]["runs"]["0"]["history"]
    assert len(history) == 4 and max(h["main"] for h in history) > 55.0  # it trains (a char-level model, slowly)


@pytest.mark.parametrize("arch", ["encoder", "encoder_decoder"])
def test_encoder_and_encoder_decoder_models_finetune_too(tmp_path, easy_glue, pretrained, arch):
    """The same job for the other two families ([CLS] pooling for the encoder, last token for the T5-style
    model, whose decoder reads the input shifted right)."""
    run_dir = tmp_path / arch
    finetune(
        finetune_cfg(
            run_dir,
            ["init=none", *TINY, f"model.arch={arch}", f"tokenizer={pretrained / 'data'}", *easy_task(easy_glue)],
        )
    )
    assert dev_acc(run_dir) > 80.0


def test_a_decoder_finetunes_with_position_weighted_mean_pooling(tmp_path, easy_glue, pretrained):
    """pooling=weighted_mean (SGPT's position weights) from the lm train checkpoint learns the easy task."""
    run_dir = tmp_path / "wmean"
    finetune(finetune_cfg(run_dir, [f"init={pretrained / 'run'}", "pooling=weighted_mean", *easy_task(easy_glue)]))
    assert "pooling: weighted_mean" in (run_dir / "config.yaml").read_text()
    assert dev_acc(run_dir) > 80.0


def easy_pair_glue(root, similarity: bool = False):
    """glue_data/STS-B of an easy symmetric pair task: each sentence holds one sentiment word, the score
    is 2.5 x the number of positive ones (0, 2.5 or 5), whichever sentence comes first; with similarity,
    5 when the two words agree and 0 when not (what a siamese model's cosine can express)."""
    rng = random.Random(2)
    header = ["index", "sentence1", "sentence2", "score"]
    for split, n in (("train", 400), ("dev", 100)):
        labels = [(i % 2, (i // 2) % 2) for i in range(n)]
        score = (lambda a, b: 5.0 * (a == b)) if similarity else (lambda a, b: 2.5 * (a + b))
        rows = [[i, sentence(rng, a), sentence(rng, b), score(a, b)] for i, (a, b) in enumerate(labels)]
        write_tsv(root / "STS-B" / f"{split}.tsv", header, rows)
    test = [[i, sentence(rng, i % 2), sentence(rng, 1)] for i in range(20)]
    write_tsv(root / "STS-B" / "test.tsv", ["index", "sentence1", "sentence2"], test)
    return root


@pytest.mark.parametrize("pair_input,whiten", [("both_orders", False), ("siamese", False), ("siamese", True)])
def test_a_pair_task_finetunes_with_each_pair_input(tmp_path, pretrained, pair_input, whiten):
    """tasks.stsb.pair_input=both_orders (GPT-1's similarity input) and =siamese (Sentence-BERT's cosine;
    whitened or not) from the lm train checkpoint learn an easy pair task, and the config and submission file
    record the run."""
    root, run_dir = easy_pair_glue(tmp_path / "glue_data", similarity=pair_input == "siamese"), tmp_path / "pair"
    fields = {"epochs": 6, "lr": 3e-3, "batch_size": 16, "max_len": 40, "seeds": [0], "pair_input": pair_input}
    fields["whiten"] = whiten
    task = ["task=glue/stsb", f"glue.data_root={root}", *(f"tasks.stsb.{k}={v}" for k, v in fields.items())]
    finetune(finetune_cfg(run_dir, [f"init={pretrained / 'run'}", "pooling=mean", *task]))
    assert f"pair_input: {pair_input}" in (run_dir / "config.yaml").read_text()
    assert f"whiten: {str(whiten).lower()}" in (run_dir / "config.yaml").read_text()
    score = json.loads((run_dir / "results.json").read_text())["columns"]["stsb"]["seeds"]["0"]["pearson"]
    assert score > 90.0, f"dev Pearson {score} on a task a bag of words solves"
    assert check_submission(run_dir / "submission", names=["stsb"], expected_rows={"stsb": 20}) == []


def test_linear_probe_of_frozen_features(pretrained, easy_glue):
    """benchmarks/glue_probe.py: logistic regression on pooled frozen features, pretrained and random init."""
    glue_probe = load("glue_probe")
    rows = glue_probe.probe(str(pretrained / "run"), "sst2", 0, 24, str(easy_glue))
    assert set(rows) == {(w, p) for w in ("pretrained", "random init") for p in ("mean", "last")}
    # One sentiment word among fillers: its embedding moves the mean, so even random features separate
    # the classes well; the last token (a filler or the word) sees the word only through attention.
    assert rows[("random init", "mean")][1] > 75 and rows[("pretrained", "mean")][1] > 75
    assert all(0 <= acc <= 100 for pair in rows.values() for acc in pair)


def test_zero_shot_similarity_of_frozen_features(pretrained, tmp_path):
    """benchmarks/glue_probe.py on STS-B: cos of each sentence's pooled features, read alone, against the
    dev scores; no training. Half the pairs are a sentence and itself (score 5, cos exactly 1), half two
    different sentences (score 0, cos below 1): every weight and pooling correlates strongly, raw or
    whitened (fit on the training pairs, which are built the same way)."""
    rng = random.Random(3)
    for split in ("train", "dev"):
        rows = [
            [i, s, s if i % 2 else sentence(rng, 1 - i % 2), 5.0 * (i % 2)]
            for i, s in enumerate(sentence(rng, i % 2) for i in range(60))
        ]
        write_tsv(tmp_path / "STS-B" / f"{split}.tsv", ["index", "sentence1", "sentence2", "score"], rows)
    glue_probe = load("glue_probe")
    got = glue_probe.similarity(str(pretrained / "run"), "stsb", 24, str(tmp_path))
    weights, poolings = ("pretrained", "random init"), ("mean", "weighted_mean", "last")
    assert set(got) == {(w, p, k) for w in weights for p in poolings for k in ("raw", "whitened")}
    assert all(r > 50 for pair in got.values() for r in pair), got


def test_next_word_logprobs_of_right_padded_batches_are_each_sequence_alone(pretrained):
    """benchmarks/glue_probe.py --label-words: a batch of sequences of different lengths, right-padded, gives
    each one the next-word log-probabilities it gets alone (a causal model's real positions never see pads)."""
    from lm.eval.saved import load_model

    glue_probe = load("glue_probe")
    model, tok = load_model(pretrained / "run")
    ids = [tok.encode(t) for t in ("a good film . It was", "bad . It was", "the plot is fine and the cast good")]
    batched = glue_probe.next_word_logprobs(model, ids, tok.pad_id, batch=3)  # (3, V)
    alone = np.concatenate([glue_probe.next_word_logprobs(model, [x], tok.pad_id, batch=1) for x in ids])
    assert batched.shape == (3, model.cfg.vocab_size)
    np.testing.assert_allclose(batched, alone, atol=1e-4)
    np.testing.assert_allclose(np.exp(batched).sum(1), 1.0, atol=1e-4)


def test_label_word_probe_scores_each_template_and_word_pair(pretrained, easy_glue):
    glue_probe = load("glue_probe")
    rows = glue_probe.label_words(str(pretrained / "run"), str(easy_glue), max_len=24)
    pairs = [f"{a.strip()}/{b.strip()}" for a, b in glue_probe.LABEL_WORDS]
    weights = ("pretrained", "random init")
    assert set(rows) == {(w, t, p) for w in weights for t in glue_probe.TEMPLATES for p in pairs}
    assert all(0 <= auc <= 100 for auc in rows.values())


def test_whitening_gives_identity_covariance():
    glue_probe = load("glue_probe")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, 4)) @ rng.normal(size=(4, 4)) + 3.0  # correlated, off-centre
    m, w = glue_probe.whitening(x)
    np.testing.assert_allclose(np.cov(((x - m) @ w).T), np.eye(4), atol=1e-4)
    np.testing.assert_allclose(m, x.mean(0))


def test_a_nonfinite_loss_follows_train_on_nonfinite(tmp_path, easy_glue, pretrained, monkeypatch):
    """The loop's NaN policy: stop (the default) names the step and the fix; skip drops that update and goes on."""
    import math

    from lm.core import objectives
    from lm.core.loop import LossDiverged
    from lm.glue.trainer import GlueTask

    calls = []

    def poisoned(self, model, batch, metrics=None):  # the 3rd micro-batch's loss is NaN (one micro-batch per step here)
        calls.append(1)
        loss = objectives.loss(model, batch, metrics)
        return loss * math.nan if len(calls) == 3 else loss

    monkeypatch.setattr(GlueTask, "loss", poisoned)
    common = [
        "init=none",
        *TINY,
        f"tokenizer={pretrained / 'data'}",
        *easy_task(easy_glue, epochs=1),
        "train.log_interval=1",
    ]
    with pytest.raises(LossDiverged, match=r"loss is nan at step 3; no update was applied.*train.on_nonfinite=skip"):
        finetune(finetune_cfg(tmp_path / "stop", common))
    calls.clear()
    run_dir = tmp_path / "skip"
    finetune(finetune_cfg(run_dir, [*common, "train.on_nonfinite=skip"]))
    records = [json.loads(line) for line in (run_dir / "sst2" / "seed0" / "metrics.jsonl").read_text().splitlines()]
    steps = {r["step"]: r for r in records if "loss" in r}
    assert list(steps) == list(range(1, 26))  # 400 examples / batch 16: every step ran
    assert math.isnan(steps[3]["grad_norm"]) and all(math.isfinite(steps[s]["grad_norm"]) for s in steps if s != 3)
    assert all(r["tokens_per_s"] > 0 for r in steps.values())  # throughput, as in pretraining
    assert 0.0 <= dev_acc(run_dir) <= 100.0
