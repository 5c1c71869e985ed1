"""lm finetune end to end on CPU: it learns the easy task (tests/glue_support.py), starts from an lm train
checkpoint or an export, finetunes encoders, encoder-decoders and pair tasks, and follows train.on_nonfinite."""

import json
import random

import pytest

from lm.cli.finetune import finetune
from lm.glue.init import InitError, load_backbone
from lm.glue.submission import check_submission
from tests.glue_support import TINY, dev_acc, easy_pair_glue, easy_task, finetune_cfg, sentence
from tests.glue_support import easy_glue as easy_glue  # a module fixture, re-exported
from tests.glue_support import pretrained as pretrained  # a module fixture, re-exported


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
