"""The LM Evaluation Harness adapter (lm/eval/harness.py, issue 52 item 3): its scores against direct
computation on the model, against the harness's own Hugging Face backend on the lm export directory (the
outside check), and `python -m lm.cli.eval`."""

import json
import random
import re

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("lm_eval", reason="needs the eval extra: pip install 'lm[eval]'")

from lm_eval.api.instance import Instance  # noqa: E402

from lm.eval.harness import HarnessError, LMAdapter, evaluate  # noqa: E402
from tests.engine_support import compose, tiny_overrides  # noqa: E402

WORDS = [
    "the",
    "a",
    "film",
    "movie",
    "story",
    "was",
    "is",
    "and",
    "it",
    "this",
    "really",
    "quite",
    "good",
    "bad",
    "great",
    "awful",
    "cat",
    "sat",
    "on",
    "mat",
]
GPT2 = [
    "model=gpt2",
    "model.dim=32",
    "model.n_layers=2",
    "model.n_heads=4",
    "model.vocab_size=320",
    "model.max_seq_len=48",
]
PAIRS = [
    ("The cat sat on", " the mat"),
    ("it was", " really good."),
    ("", "a film"),
    ("this movie is ", "bad"),
    ("Question: is it good?\nAnswer:", " yes"),
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny GPT-2 trained 3 steps on a 320-token BPE tokenizer, and its lm export directory (with hf/)."""
    from lm.cli.export import export
    from lm.cli.train import train

    work = tmp_path_factory.mktemp("harness")
    rng = random.Random(0)
    (work / "corpus.txt").write_text("\n".join(" ".join(rng.choices(WORDS, k=12)) for _ in range(400)) + "\n")
    train(compose(tiny_overrides(work / "run", 3, ckpt_interval=3) + GPT2 + words_data(work)))  # prepares the data
    return work / "run", export(work / "run")


def words_data(work) -> list[str]:
    """The data overrides of a BPE corpus of WORDS in work/corpus.txt (prepared into work/data)."""
    from tests.glue_support import corpus_data

    return corpus_data(work, "words")


@pytest.fixture(scope="module")
def adapter(exported):
    return LMAdapter.from_saved(exported[0], batch_size=3)


def requests(kind, args):
    return [Instance(kind, {}, a, i) for i, a in enumerate(args)]


def direct_loglikelihood(adapter, context, continuation):
    """log p(continuation | context) from one forward of the whole sequence, the harness's token split."""
    ctx, cont = (
        adapter._encode_pair(context, continuation)
        if context
        else ([adapter.prefix_token_id], adapter.tok_encode(continuation))
    )
    ids = torch.tensor([ctx + cont])
    with torch.no_grad():
        logp = F.log_softmax(adapter.model(input_ids=ids[:, :-1]).logits.float(), -1)[0]
    return sum(logp[len(ctx) - 1 + i, t].item() for i, t in enumerate(cont))


def test_loglikelihood_is_the_continuations_log_probability(adapter):
    got = adapter.loglikelihood(requests("loglikelihood", PAIRS))
    for (context, continuation), (ll, greedy) in zip(PAIRS, got):
        assert ll == pytest.approx(direct_loglikelihood(adapter, context, continuation), abs=1e-4)
        assert ll < 0 and isinstance(greedy, bool)
    alone = LMAdapter(adapter.model, adapter.tokenizer, batch_size=1).loglikelihood(requests("loglikelihood", PAIRS))
    assert [a for a, _ in alone] == pytest.approx([a for a, _ in got], abs=1e-5)  # padding is never read


def test_rolling_loglikelihood_is_the_documents_perplexity(adapter):
    """-(token count) x the model's own mean loss on the document after the prefix token (one window;
    documents longer than max_length are checked against the Hugging Face backend below)."""
    text = "the cat sat on the mat and it was really good"
    ids = adapter.tok_encode(text)
    x = torch.tensor([[adapter.prefix_token_id] + ids[:-1]])
    with torch.no_grad():
        loss = adapter.model(input_ids=x, labels=torch.tensor([ids])).loss.item()
    (ll,) = adapter.loglikelihood_rolling(requests("loglikelihood_rolling", [(text,)]))
    assert ll == pytest.approx(-loss * len(ids), rel=1e-5)


def test_generate_until_is_greedy_with_the_kv_cache_and_stops_at_until(adapter):
    from tests.model_support import greedy_by_recompute

    prompt = "the cat sat"
    ids = torch.tensor([adapter.tok_encode(prompt)])
    reference = greedy_by_recompute(adapter.model, ids, "decoder", 8)[0].tolist()
    (text,) = adapter.generate_until(requests("generate_until", [(prompt, {"until": [], "max_gen_toks": 8})]))
    eot = adapter.eot_token_id
    assert text == adapter.tok_decode(
        [t for t in reference[: reference.index(eot)] if t != eot] if eot in reference else reference
    )
    if len(text) > 2:
        stop = text[1:3]
        (cut,) = adapter.generate_until(requests("generate_until", [(prompt, {"until": [stop], "max_gen_toks": 8})]))
        assert cut == text.split(stop)[0]


def test_an_encoder_is_refused_naming_what_works(adapter):
    from lm.model import build_model
    from lm.model.config import model_preset

    bert = build_model(
        model_preset("bert", ["model.vocab_size=320", "model.dim=32", "model.n_layers=1", "model.n_heads=2"])
    )
    with pytest.raises(HarnessError, match="encoder \\(masked LM\\) has none: evaluate a decoder, RNN"):
        LMAdapter(bert, adapter.tokenizer)


@pytest.fixture(scope="module")
def hf(exported):
    """The harness's own Hugging Face backend on lm export's hf/ directory, fp32."""
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=str(exported[1] / "hf"), device="cpu", batch_size=3, dtype="float32")


def test_the_harness_hf_backend_on_the_export_gives_the_same_loglikelihoods(adapter, hf):
    """The outside check: lm_eval's own Hugging Face backend (`hf`) on lm export's hf/ directory gives the
    same per-document log-likelihoods (1e-4, fp32) and rolling log-likelihoods over several windows."""
    assert (hf.prefix_token_id, hf.eot_token_id, hf.max_length) == (
        adapter.prefix_token_id,
        adapter.eot_token_id,
        adapter.max_length,
    )
    ours = adapter.loglikelihood(requests("loglikelihood", PAIRS))
    theirs = hf.loglikelihood(requests("loglikelihood", PAIRS))
    assert [o[0] for o in ours] == pytest.approx([t[0] for t in theirs], abs=1e-4)
    assert [o[1] for o in ours] == [t[1] for t in theirs]
    docs = [(" ".join(WORDS[i:] + WORDS[:i]) * 3,) for i in range(3)]
    assert min(len(adapter.tok_encode(d)) for (d,) in docs) > adapter.max_length  # several windows each
    assert adapter.loglikelihood_rolling(requests("loglikelihood_rolling", docs)) == pytest.approx(
        hf.loglikelihood_rolling(requests("loglikelihood_rolling", docs)), abs=1e-4
    )


@pytest.mark.slow  # two harness runs of two tasks each (about a minute on a busy CPU)
def test_the_harness_hf_backend_on_the_export_gives_the_same_task_scores(adapter, hf):
    for task, limit, metric in (("local_sst2", 16, "acc,none"), ("local_wikitext2", 1, "word_perplexity,none")):
        a, b = (evaluate(model, [task], limit=limit)["results"][task][metric] for model in (adapter, hf))
        assert a == pytest.approx(b, rel=1e-4), task


def test_cli_writes_results_and_prints_a_table(exported, tmp_path, capsys):
    from lm.cli.eval import main

    run_dir, _ = exported
    main([str(run_dir), "--tasks", "local_rte,probe", "--limit", "40", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "| local_rte | acc |" in out and "| probe | avg |" in out
    record = json.loads((tmp_path / "eval_results.json").read_text())
    assert set(record["tasks"]) == {"local_rte", "probe"} and 0.0 <= record["tasks"]["local_rte"]["acc"] <= 1.0
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "missing"), "--tasks", "local_rte"])
    assert isinstance(e.value.code, str) and "\n" not in e.value.code and "no such directory" in e.value.code


def test_a_mistyped_local_task_is_refused_with_the_closest_before_the_model_loads(monkeypatch):
    """--tasks local_rtee loaded the model, indexed the harness's ~15,000 tasks (7 s here) and ended in its
    "Spec 'local_rtee' is not a registered task/group/tag name", suggesting nothing."""
    import lm.eval.saved
    from lm.cli.eval import main

    def never(*a, **kw):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(lm.eval.saved, "load_with_weights", never)
    with pytest.raises(SystemExit) as e:
        main(["nowhere", "--tasks", "probe,local_rtee"])
    assert e.value.code == (
        "lm eval: error: --tasks local_rtee: lm has no task of that name; did you mean local_rte? (lm's own: "
        "local_glue, local_cola, local_mrpc, local_rte, local_sst2, local_wikitext2, probe)"
    )


def test_before_the_harness_index_only_lms_own_prefix_is_checked():
    from lm.eval.harness import refuse_unknown

    refuse_unknown(["hellaswag", "hellaswagg", "local_glue", "local_*", "local_sst?"], "--tasks")  # the harness's
    with pytest.raises(HarnessError) as e:
        refuse_unknown(["local_sst2", "local_qqp"], "train.eval_tasks")
    assert str(e.value).startswith("train.eval_tasks local_qqp: lm has no task of that name (lm's own: local_glue,")


def test_a_task_the_harness_lacks_is_refused_with_the_closest_before_the_probe_runs(exported, monkeypatch):
    """--tasks probe,hellaswagg ran the probe, then the harness said its one line (no hint); the harness's own
    names (rte, hellaswag, a glob) still pass."""
    import lm.eval.harness as harness
    import lm.eval.probe
    from lm.cli.eval import main

    built, build = [], harness.task_manager

    def keep(tasks=()):  # the index lm eval builds, to ask it about the harness's own names below
        built.append(build(tasks))
        return built[-1]

    monkeypatch.setattr(harness, "task_manager", keep)
    monkeypatch.setattr(lm.eval.probe, "probe_model", lambda *a, **kw: pytest.fail("the probe ran"))
    with pytest.raises(SystemExit) as e:
        main([str(exported[0]), "--tasks", "probe,local_rte,hellaswagg", "--out", str(exported[0].parent / "e")])
    assert e.value.code == (
        "lm eval: error: --tasks hellaswagg: neither lm nor the harness has a task of that name; did you mean "
        "hellaswag? (lm's own: local_glue, local_cola, local_mrpc, local_rte, local_sst2, local_wikitext2, probe)"
    )
    (index,) = built
    harness.refuse_unknown(["rte", "hellaswag", "local_rte", "arc_*"], "--tasks", index)


def test_cli_keeps_every_earlier_result_and_refuses_a_file_it_did_not_write(exported, tmp_path, capsys):
    """eval_results.json of other tasks, weights or settings was replaced; a user's file of that name too, and a
    file where --out's directory belongs failed only after the evaluation (a traceback, the results lost)."""
    from lm.cli.eval import main
    from lm.cli.export import is_export

    run_dir, export_dir = exported
    out = tmp_path / "out"
    out.mkdir()
    (out / "eval_results.json").write_text('{"my": "numbers"}')
    (tmp_path / "file").write_text("mine")
    for where, says in (
        (out, "eval_results.json exists and is not a record lm eval wrote"),
        (tmp_path / "file", "is a file, not a directory"),
    ):
        with pytest.raises(SystemExit) as e:
            main([str(run_dir), "--tasks", "nonexistent_task", "--out", str(where)])  # refused before the tasks load
        assert says in e.value.code and "\n" not in e.value.code
    assert (out / "eval_results.json").read_text() == '{"my": "numbers"}' and (tmp_path / "file").read_text() == "mine"
    (out / "eval_results.json").unlink()
    for task, limit in (("local_rte", "4"), ("local_sst2", "4"), ("local_sst2", "6")):
        main([str(run_dir), "--tasks", task, "--limit", limit, "--out", str(out)])
    (aside,) = out.glob("eval_results.*Z.json")  # the --limit 4 record, moved aside by the --limit 6 one
    earlier, record = (json.loads(f.read_text()) for f in (aside, out / "eval_results.json"))
    assert set(earlier["tasks"]) == {"local_rte", "local_sst2"} and earlier["limit"] == 4  # the same settings merged
    assert set(record["tasks"]) == {"local_sst2"} and record["limit"] == 6
    assert record["weights"] == earlier["weights"] and record["weights"].startswith("step_00000003, manifest sha256")
    assert sorted(p.name for p in out.iterdir()) == [aside.name, "eval_results.json"]  # no lock file left
    main([str(export_dir), "--tasks", "local_rte", "--limit", "4"])  # beside an export, not in it
    assert (export_dir.with_name("export-eval") / "eval_results.json").is_file() and is_export(export_dir)
    capsys.readouterr()


def test_an_unwritable_out_is_refused_before_the_evaluation(tmp_path, monkeypatch):
    """As root chmod does not stop writes: os.access is made to say what it says to a user without permission."""
    import os

    from lm.cli.errors import describe
    from lm.cli.eval import results_file

    monkeypatch.setattr(os, "access", lambda path, mode: str(path) != str(tmp_path))
    with pytest.raises(PermissionError) as e:
        results_file(tmp_path / "new" / "out")  # its nearest existing directory cannot be written
    assert describe(e.value) == f"Permission denied ({tmp_path}) — fix its permissions, or pick another path"


def test_a_missing_path_names_only_what_lm_eval_takes(tmp_path):
    from lm.config import ConfigError
    from lm.eval.saved import load_model

    with pytest.raises(ConfigError) as e:
        load_model(tmp_path / "missing")
    assert str(e.value) == (
        f"{tmp_path / 'missing'}: no such directory; pass an lm train run directory, one of its "
        f"checkpoints/step_* directories, an lm export directory"
    )  # not lm finetune's `init=none`, which lm eval has no way to take


def test_cli_without_the_eval_extra_says_which_to_install(monkeypatch):
    import sys

    from lm.cli.eval import main

    monkeypatch.setitem(sys.modules, "lm_eval", None)
    with pytest.raises(SystemExit) as e:
        main(["anywhere"])
    assert e.value.code == "lm eval: error: lm eval needs lm_eval (not installed): pip install 'lm[eval]'"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--limit", "0"], "argument --limit: '0': a count of documents (1, 2, ...) or a fraction between 0 and 1"),
        (["--limit", "-3"], "argument --limit: '-3': a count of documents"),
        (["--limit", "1.5"], "argument --limit: '1.5': a count of documents"),
        (["--tasks", "probe", "--limit", "0.5"], "--limit 0.5: the probe reads a number of rows, not a fraction"),
        (["--batch-size", "0"], "argument --batch-size: '0': at least 1"),
        (["--num-fewshot", "-1"], "argument --num-fewshot: '-1': at least 0"),
        (["--device", "cuda"], "--device cuda: this machine has no CUDA device torch can use; leave --device out"),
        (["--device", "gpu"], "--device gpu: not a torch device; cpu or cuda"),
    ],
)
def test_cli_refuses_bad_settings_in_one_line_before_loading(argv, message, monkeypatch, capsys):
    """Before: --limit 0 failed after the loading with the harness's `did not find any docs`, a negative one with
    islice's message, 1.5 ran as 1 with the record saying 1.5, the probe ran 1000/500 rows for --limit 0.5,
    --batch-size 0 failed in range(), --device cuda on a machine without CUDA was an AssertionError traceback."""
    from lm.cli.eval import parse_args

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as e:
        parse_args(["nowhere", *argv])
    assert e.value.code == 2
    assert f"lm eval: error: {message}" in capsys.readouterr().err
    args = parse_args(["nowhere", "--limit", "0.25", "--batch-size", "1", "--num-fewshot", "0"])
    assert (args.limit, args.batch_size, args.num_fewshot, args.device) == (0.25, 1, 0, "cpu")
    assert parse_args(["nowhere", "--tasks", "probe", "--limit", "200"]).limit == 200


# -- in the training loop (train.eval_tasks) -----------------------------------------------------------------


def test_harness_tasks_in_the_loop_are_logged_and_leave_training_bit_identical(exported, tmp_path):
    """train.eval_tasks=[local_sst2] every 2 steps of 4 (budget off): metrics.jsonl gets the harness's accuracy at
    steps 2 and 4, the step-4 record equals lm eval's on the final weights, and the losses (dropout on: the
    harness seeds torch, numpy and python RNGs) equal a run without it bit for bit."""
    from lm.cli.train import train
    from tests.engine_support import metrics, train_losses

    work = exported[0].parent

    def run(name, *extra):
        overrides = tiny_overrides(tmp_path / name, 4) + GPT2 + words_data(work) + ["model.dropout=0.1", *extra]
        return train(compose(overrides))

    run("off")
    on = run(
        "on",
        "train.eval_tasks=[local_sst2]",
        "train.eval_tasks_interval=2",
        "train.eval_tasks_limit=8",
        "train.downstream_budget=0",
    )
    assert train_losses(tmp_path / "on") == train_losses(tmp_path / "off")
    records = [r for r in metrics(tmp_path / "on") if "harness/local_sst2/acc" in r]
    assert [r["step"] for r in records] == [2, 4]
    tokenizer = LMAdapter.from_saved(exported[0]).tokenizer
    direct = evaluate(LMAdapter(on.engine.module, tokenizer), ["local_sst2"], limit=8)["results"]["local_sst2"]
    assert records[-1]["harness/local_sst2/acc"] == direct["acc,none"]
    assert not any(k.startswith("harness/") for r in metrics(tmp_path / "off") for k in r)


def test_harness_tasks_in_the_loop_refuse_what_cannot_work(exported, tmp_path):
    from lm.cli.train import train
    from lm.config import ConfigError

    work = exported[0].parent
    base = tiny_overrides(tmp_path / "r", 2) + words_data(work)
    # a typo is refused with the closest, as lm eval refuses it, before the data, the model or the run_dir are
    # touched (it was refused once the model was built, a config.yaml written in the run_dir, with no hint)
    for typo, hint in (
        ("local_sst22", "lm has no task of that name; did you mean local_sst2?"),
        ("hellaswagg", "neither lm nor the harness has a task of that name; did you mean hellaswag?"),
    ):
        with pytest.raises(ConfigError, match=re.escape(f"train.eval_tasks {typo}: {hint} (lm's own: local_glue")):
            train(compose(base + GPT2 + [f"train.eval_tasks=[local_sst2,{typo}]"]))
        assert not (tmp_path / "r").exists()
    with pytest.raises(ConfigError, match="an encoder .masked LM. has none of; use the GLUE probes"):
        train(
            compose(
                base
                + [
                    "model=bert",
                    "model.dim=32",
                    "model.n_layers=1",
                    "model.n_heads=2",
                    "model.vocab_size=320",
                    "train.eval_tasks=[local_sst2]",
                ]
            )
        )
    assert not (tmp_path / "r").exists()


def test_a_continuation_longer_than_the_models_positions_is_refused_and_one_that_fits_is_scored(adapter):
    """A continuation of max_length tokens is scored from the last max_length inputs (the context cut from the
    left); one token more has no position to be predicted from: refused in one line, for a decoder (it was a
    RuntimeError traceback from gather) and an encoder-decoder (its continuation was cut to max_length tokens and
    scored as if that were all of it)."""
    from lm.model import build_model
    from lm.model.config import model_preset

    cont = adapter.tok_encode(" the cat sat on the mat")
    assert len(cont) > 4
    short = LMAdapter(adapter.model, adapter.tokenizer, max_length=len(cont))
    ctx = adapter.tok_encode("it was really")
    ((ll, _),) = short._loglikelihood_tokens([(None, ctx, cont)])
    inputs = torch.tensor([(ctx + cont)[-(len(cont) + 1) : -1]])
    with torch.no_grad():
        logp = F.log_softmax(adapter.model(input_ids=inputs).logits.float(), -1)[0]
    assert ll == pytest.approx(sum(logp[i, t].item() for i, t in enumerate(cont)), abs=1e-4)
    t5 = build_model(
        model_preset("t5", ["model.vocab_size=320", "model.dim=32", "model.n_layers=1", "model.n_heads=2"])
    )
    for model in (t5, adapter.model):
        tight = LMAdapter(model, adapter.tokenizer, max_length=len(cont) - 1)
        with pytest.raises(HarnessError, match=f"a continuation of {len(cont)} tokens does not fit in the model's"):
            tight.loglikelihood(requests("loglikelihood", [("it was really", " the cat sat on the mat")]))


def test_an_encoder_decoder_is_refused_a_perplexity_task_before_anything_runs():
    """local_wikitext2 (rolling log-likelihoods) on an encoder-decoder: refused before lm eval evaluates the other
    tasks and before lm train trains (it failed at the run's first harness pass, after the training and before the
    final checkpoint: the run was lost); tags are expanded, the other tasks pass."""
    from types import SimpleNamespace

    from lm.config import ConfigError
    from lm.eval.harness_loop import check_tasks

    train_cfg = SimpleNamespace(eval_tasks=["local_sst2", "local_wikitext2"])
    with pytest.raises(ConfigError, match=r"evaluate the other tasks alone: train.eval_tasks=\[local_sst2\]$"):
        check_tasks(train_cfg, SimpleNamespace(arch="encoder_decoder"))
    check_tasks(train_cfg, SimpleNamespace(arch="decoder"))  # a decoder scores perplexity
    train_cfg.eval_tasks = ["local_glue"]
    check_tasks(train_cfg, SimpleNamespace(arch="encoder_decoder"))  # and an encoder-decoder the rest

    from lm.eval.harness import refuse_unscorable, rolling_tasks, task_manager

    index = task_manager(["local_glue", "local_wikitext2"])
    assert rolling_tasks(index, ["local_glue", "local_wikitext2"]) == ["local_wikitext2"]
    refuse_unscorable(index, ["local_glue", "local_sst2"], "encoder_decoder", "--tasks")
    refuse_unscorable(index, ["local_glue", "local_wikitext2"], "decoder", "--tasks")
    alone = "evaluate the other tasks alone: --tasks local_glue$"
    with pytest.raises(HarnessError, match=f"local_wikitext2 scores rolling .* {alone}"):
        refuse_unscorable(index, ["local_glue", "local_wikitext2"], "encoder_decoder", "--tasks")


def test_a_harness_pass_that_fails_in_the_loop_keeps_the_training(exported, tmp_path):
    """A harness task the model cannot score (continuations longer than its 8 positions) failed at the last step,
    before the final save: the run ended with no checkpoint at all (train.ckpt_interval=0 here)."""
    from lm.cli.train import train
    from lm.eval.harness import HarnessError
    from tests.engine_support import train_losses

    work = exported[0].parent
    chars = [o for o in words_data(work) if not o.startswith(("data.name=", "data.dir=", "data.tokenizer="))]
    chars += ["data.name=words_char", f"data.dir={tmp_path / 'chars'}", "data.tokenizer=char"]  # " positive": 9 tokens
    overrides = tiny_overrides(tmp_path / "run", 4) + GPT2 + chars
    overrides += ["model.max_seq_len=8", "train.seq_len=8", "train.eval_tasks=[local_sst2]", "train.eval_tasks_limit=2"]
    with pytest.raises(HarnessError, match="does not fit in the model's 8 positions"):
        train(compose(overrides))
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["latest", "step_00000004"]
    assert sorted(train_losses(tmp_path / "run")) == [1, 2, 3, 4]
