"""lm transfer: pretraining then both finetuning arms in one call on a tiny budget (one call, one arm at a time,
--parallel, --join), the table's numbers, the pretraining probe, and the refusals (another tokenizer or model for
finetuning, a finetuning override that does not compose, a shared scratch arm of another recipe). The presets are in
test_transfer_presets.py, the records in test_transfer_records.py, reruns in test_transfer_rerun.py, the curve in
test_transfer_curve.py and benchmarks/gpu_transfer.sh in test_transfer_gpu_script.py."""

import json
import random
import re

import pytest

from lm.cli.transfer import run_transfer
from lm.cli.transfer_recipe import Recipe, TransferError, check_finetune_overrides
from lm.report.transfer import curve_table, find_transfers, transfer_table, write_curve_report
from tests.engine_support import metrics
from tests.glue_support import easy_glue, sentence  # noqa: F401 - the easy SST-2-shaped task (a fixture)

TINY_MODEL = ["model.vocab_size=320", "model.dim=32", "model.n_layers=1", "model.n_heads=2", "model.max_seq_len=32"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    work = tmp_path_factory.mktemp("corpus")
    rng = random.Random(1)
    (work / "corpus.txt").write_text("\n".join(sentence(rng, i % 2) for i in range(600)) + "\n")
    return work


def recipe(tmp, corpus, easy_glue, tokens=4 * 4 * 32, **kw):  # noqa: F811
    data = [
        f"data.dir={corpus / 'data'}",
        f"data.source={corpus / 'corpus.txt'}",
        "data.vocab_size=320",
        "data.n_sentinels=0",
        "data.workers=1",
        "data.val_fraction=0.1",
        "data.tokenizer_train_chars=1000000",
    ]
    pretrain = [
        *TINY_MODEL,
        *data,
        "train.micro_batch_size=4",
        "train.seq_len=32",
        "train.eval_batches=1",
        "train.progress=false",
        "sched.warmup_steps=1",
    ]
    finetune = [
        f"glue.data_root={easy_glue}",
        "tasks.sst2.epochs=2",
        "tasks.sst2.max_len=24",
        "optim.lr=3e-3",
        "train.progress=false",
    ]
    return Recipe(
        tokens=tokens, out=tmp, tasks=["sst2"], pretrain=pretrain, finetune=finetune, **{"seeds": [0, 1], **kw}
    )


def test_one_call_pretrains_finetunes_both_arms_and_writes_the_table(tmp_path, corpus, easy_glue):  # noqa: F811
    r = recipe(tmp_path / "t", corpus, easy_glue, group="g1")
    s = run_transfer(r)
    assert s["recipe"]["steps"] == 4 and s["recipe"]["tokens"] == 4 * 4 * 32 and s["recipe"]["pooling"] == "mean"
    assert (tmp_path / "t" / "pretrain" / "checkpoints" / "latest").read_text() == "step_00000004"
    for arm in ("scratch", "pretrained"):  # both arms: the same model, tokenizer, settings and wandb group
        cfg = (tmp_path / "t" / "finetune" / arm / "config.yaml").read_text()
        assert "dim: 32" in cfg and "group: g1" in cfg and "pooling: mean" in cfg and "epochs: 2" in cfg
    assert "group: g1" in (tmp_path / "t" / "pretrain" / "config.yaml").read_text()
    results = {
        a: json.loads((tmp_path / "t" / "finetune" / a / "results.json").read_text())["columns"]["sst2"]
        for a in ("scratch", "pretrained")
    }
    t = s["comparison"]["tasks"]["sst2"]
    for arm in ("scratch", "pretrained"):
        assert t[arm]["seeds"] == {k: v["acc"] for k, v in results[arm]["seeds"].items()}
        assert t[arm]["median"] == pytest.approx(results[arm]["median"]["acc"])
    assert t["gain"] == pytest.approx(t["pretrained"]["median"] - t["scratch"]["median"])
    md = (tmp_path / "t" / "transfer.md").read_text()
    assert md == transfer_table(json.loads((tmp_path / "t" / "transfer.json").read_text()))
    assert f"| SST-2 | acc | {t['scratch']['seeds']['0']:.1f} / {t['scratch']['seeds']['1']:.1f} |" in md
    # The same call again resumes: nothing is retrained (the pretraining is done, each pair has result.pt).
    mtime = (tmp_path / "t" / "finetune" / "scratch" / "sst2" / "seed0" / "result.pt").stat().st_mtime_ns
    again = run_transfer(recipe(tmp_path / "t", corpus, easy_glue, group="g1"))
    assert again["comparison"] == s["comparison"]
    # ... and the record keeps the duration, date and command of the call that did the work, not the read-back's;
    # the point's running total of seconds (every call, interrupted ones too) has grown by the read-back's
    assert again["run"] == s["run"] == json.loads((tmp_path / "t" / "transfer.json").read_text())["run"]
    total = json.loads((tmp_path / "t" / "transfer_seconds.json").read_text())["seconds"]
    assert s["run"]["seconds"] > 0 and total >= s["run"]["seconds"]
    assert (tmp_path / "t" / "finetune" / "scratch" / "sst2" / "seed0" / "result.pt").stat().st_mtime_ns == mtime


def test_zero_tokens_is_the_scratch_arm_and_a_curve_shares_it(tmp_path, corpus, easy_glue):  # noqa: F811
    shared = tmp_path / "scratch"
    zero = run_transfer(recipe(tmp_path / "t0", corpus, easy_glue, tokens=0, scratch=shared, seeds=[0]))
    assert zero["recipe"]["steps"] == 0 and not (tmp_path / "t0" / "pretrain").exists()
    assert zero["comparison"]["average"]["gain"] == 0.0 and zero["arms"]["pretrained"] == str(shared)
    one = run_transfer(recipe(tmp_path / "t1", corpus, easy_glue, tokens=200, scratch=shared, seeds=[0]))
    assert one["recipe"]["steps"] == 2  # 200 tokens at 128 a step: rounded up to whole steps
    assert one["comparison"]["tasks"]["sst2"]["scratch"] == zero["comparison"]["tasks"]["sst2"]["scratch"]
    page = write_curve_report([tmp_path], tmp_path / "report")
    text = page.read_text()
    assert "| decoder (mean, learned) | 0 | – | – | +0.0 | **+0.0** |" in text  # no val loss, no probe
    assert "| decoder (mean, learned) | 256 |" in text
    assert (tmp_path / "report" / "transfer_curve.png").stat().st_size > 1000
    assert [s["recipe"]["tokens"] for s in find_transfers([tmp_path])] == [0, 256]
    other = recipe(tmp_path / "t2", corpus, easy_glue, tokens=0, scratch=shared, seeds=[0, 1])  # more seeds extend it
    other.finetune = [o.replace("optim.lr=3e-3", "optim.lr=1e-3") for o in other.finetune]  # another lr does not
    with pytest.raises(TransferError, match=r"scratch holds a scratch arm of another finetuning recipe \(differs in "):
        run_transfer(other)
    assert not (tmp_path / "t2").exists()  # a refused call leaves nothing behind


HOLD = """
import sys, time
from lm.core.lock import lock_run_dir
for run_dir in sys.argv[1:]:
    lock_run_dir(run_dir)
print("holding", flush=True)
time.sleep(120)
"""


def test_a_second_call_on_a_held_arm_names_lm_transfers_flags(tmp_path, corpus, easy_glue):  # noqa: F811
    """Two lm transfer calls on one --out at once (or two points of a curve sharing one --scratch): the second was
    refused by the arm's run-directory lock in lm train's words, 'pick another run_dir', a setting lm transfer does
    not have. It now names the holder and lm transfer's own fix: another --out, or its own --scratch."""
    import socket
    import subprocess
    import sys

    from tests.engine_support import REPO, subprocess_env

    shared = tmp_path / "shared_scratch"
    args = [sys.executable, "-c", HOLD, str(tmp_path / "t" / "finetune" / "scratch"), str(shared)]
    holder = subprocess.Popen(args, env=subprocess_env(), cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        who = rf"\(pid {holder.pid} on {socket.gethostname()}, started .*\)"
        with pytest.raises(
            TransferError,
            match=rf"finetune/scratch is in use by another run {who}; .*give this call "
            rf"another --out than {tmp_path / 't'}$",
        ):
            run_transfer(recipe(tmp_path / "t", corpus, easy_glue, arm="scratch", seeds=[0]))
        with pytest.raises(
            TransferError, match=r"shared_scratch is in use by .* give this call a --scratch of its own$"
        ):
            run_transfer(recipe(tmp_path / "u", corpus, easy_glue, arm="scratch", seeds=[0], scratch=shared))
    finally:
        holder.kill()
        holder.wait()
    assert not (tmp_path / "t" / "finetune" / "scratch" / "sst2").exists()  # the holder's arm was not written


def test_finetuning_with_another_tokenizer_or_model_is_refused():
    for bad in ("tokenizer=/elsewhere/tokenizer.json", "model.dim=64", "model=bert", "init=runs/other"):
        with pytest.raises(
            TransferError,
            match="the recipe sets .* itself. Both arms finetune the pretraining run's model with its tokenizer",
        ):
            check_finetune_overrides(["tasks.sst2.epochs=1", bad])
    check_finetune_overrides(["tasks.sst2.epochs=1", "pooling=last", "optim.lr=1e-4"])


def test_a_finetuning_override_of_the_tasks_or_seeds_names_the_recipes_flag():
    """--finetune task=... or tasks.<task>.seeds=... would finetune other tasks or seeds than the records and the
    table say (--tasks rte --finetune 'task=[glue/rte,glue/cola]' finetuned CoLA's full train set too)."""
    for bad, flag in (("task=[glue/rte,glue/cola]", "--tasks"), ("tasks.rte.seeds=[3]", "--seeds")):
        with pytest.raises(TransferError, match=rf"--finetune {re.escape(bad)}: .* use {flag} instead"):
            check_finetune_overrides(["tasks.rte.epochs=1", bad])
    check_finetune_overrides(["tasks.rte.max_train_examples=64", "glue.max_train_examples=64"])


def test_a_pretraining_run_with_another_tokenizer_is_refused(tmp_path, corpus, easy_glue):  # noqa: F811
    """The pretraining run's tokenizer differs from the corpus' one the scratch arm would use: refused."""
    from lm.cli.transfer_recipe import check_same_tokenizer
    from lm.data.tokenizer import Tokenizer

    r = recipe(tmp_path / "t", corpus, easy_glue, tokens=128)
    run_transfer(r)
    other = tmp_path / "other.json"
    Tokenizer.load(corpus / "data").save(other)
    data = json.loads(other.read_text())
    vocab = data["model"]["vocab"]
    (a, i), (b, j) = list(vocab.items())[-2:]
    vocab[a], vocab[b] = j, i  # the same size, two ids swapped: another tokenizer
    other.write_text(json.dumps(data))
    with pytest.raises(
        TransferError,
        match=r"trained with a tokenizer \(sha256 \w+\) other than the one the scratch "
        r"arm would use .*other.json",
    ):
        check_same_tokenizer(tmp_path / "t" / "pretrain", other)


def test_a_finetuning_override_that_does_not_compose_fails_before_pretraining(tmp_path):
    """An override of a task that is not finetuned is a TransferError at once, naming the tasks: found
    only when the first arm composed its config, it would come after the whole pretraining run."""
    r = Recipe(out=tmp_path / "point", tokens=10_000_000, tasks=["rte"], finetune=["tasks.sst2.epochs=1"])
    with pytest.raises(
        TransferError,
        match=r"tasks\.sst2\.epochs=1: sst2 is not among the tasks the recipe finetunes \(rte\); add it to --tasks",
    ):
        run_transfer(r)
    assert not r.out.exists()


PROBE = [
    "train.probe_interval=2",
    "train.probe_tasks=[sst2]",
    "train.probe_train_examples=40",
    "train.probe_dev_examples=40",
    "train.probe_max_len=24",
    "train.downstream_budget=0",  # every 2 steps: the test counts the passes
]


def test_the_pretraining_probe_reaches_the_table_and_the_curve(tmp_path, corpus, easy_glue):  # noqa: F811
    """Issue 52: a pretraining with train.probe_interval records its last GLUE probe average in transfer.json;
    the run's table says it and the curve table has a probe column ("–" for a record without one)."""
    r = recipe(tmp_path / "p", corpus, easy_glue, seeds=[0])
    r.pretrain += PROBE
    s = run_transfer(r)
    logged = [m["probe/avg"] for m in metrics(tmp_path / "p" / "pretrain") if "probe/avg" in m]
    assert len(logged) == 2 and s["recipe"]["probe"] == logged[-1]  # steps 2 and 4
    assert f"; GLUE probe average {logged[-1]:.1f}." in (tmp_path / "p" / "transfer.md").read_text()
    older = {**s, "recipe": {k: v for k, v in s["recipe"].items() if k != "probe"}}  # written before probes
    rows = [line.split(" | ") for line in curve_table([s, older]).splitlines() if line.startswith("| decoder")]
    assert [row[3] for row in rows] == [f"{logged[-1]:.1f}", "–"]


def test_parallel_runs_the_scratch_arm_beside_the_pretraining(tmp_path, corpus, easy_glue):  # noqa: F811
    """--parallel: the scratch arm is a second process (lm transfer --arm scratch --lane) logging to
    <scratch>/lane.log; the table is the same kind as a sequential call's, and the time is counted once."""
    r = recipe(tmp_path / "t", corpus, easy_glue, parallel=True)
    s = run_transfer(r)
    lane_log = (r.scratch / "lane.log").read_text()
    assert "finetuning from scratch on sst2" in lane_log and "pretraining" not in lane_log
    for arm in ("scratch", "pretrained"):
        seeds = json.loads((tmp_path / "t" / "finetune" / arm / "results.json").read_text())["columns"]["sst2"]["seeds"]
        assert s["comparison"]["tasks"]["sst2"][arm]["seeds"] == {k: v["acc"] for k, v in seeds.items()}
    assert (tmp_path / "t" / "pretrain" / "checkpoints" / "latest").read_text() == "step_00000004"
    # the lane's time is inside the parent's: the point's total is the one call's seconds, not twice them
    total = json.loads((tmp_path / "t" / "transfer_seconds.json").read_text())["seconds"]
    assert total == pytest.approx(s["run"]["seconds"], abs=0.11)


def test_one_arm_at_a_time_then_the_table(tmp_path, corpus, easy_glue):  # noqa: F811
    """--arm scratch / --arm pretrained run one arm (the second with the pretraining) and write no table; a
    call with --arm all then reads both back without retraining anything."""
    assert run_transfer(recipe(tmp_path / "t", corpus, easy_glue, arm="scratch", seeds=[0])) is None
    assert (tmp_path / "t" / "finetune" / "scratch" / "results.json").is_file()
    assert not (tmp_path / "t" / "pretrain").exists() and not (tmp_path / "t" / "transfer.json").exists()
    assert run_transfer(recipe(tmp_path / "t", corpus, easy_glue, arm="pretrained", seeds=[0])) is None
    done = tmp_path / "t" / "finetune" / "pretrained" / "sst2" / "seed0" / "result.pt"
    mtime = done.stat().st_mtime_ns
    s = run_transfer(recipe(tmp_path / "t", corpus, easy_glue, seeds=[0]))
    assert (
        set(s["comparison"]["tasks"]["sst2"]) >= {"scratch", "pretrained", "gain"} and done.stat().st_mtime_ns == mtime
    )


def test_two_one_arm_calls_elsewhere_join_into_the_table_of_one_call(tmp_path, corpus, easy_glue):  # noqa: F811
    """Each arm in its own output directory (as on two machines) writes transfer_<arm>.json; --join makes the
    same comparison as the call that runs both arms, and refuses two records of one arm or of two recipes."""
    from lm.cli.transfer import main
    from lm.cli.transfer_join import join_arms

    run_transfer(recipe(tmp_path / "a", corpus, easy_glue, arm="scratch", seeds=[0]))
    run_transfer(recipe(tmp_path / "b", corpus, easy_glue, arm="pretrained", seeds=[0]))
    scratch, pretrained = tmp_path / "a" / "transfer_scratch.json", tmp_path / "b" / "transfer_pretrained.json"
    assert json.loads(scratch.read_text())["recipe"]["val_loss"] is None  # only the pretraining's call knows it
    main(["--join", str(pretrained), str(scratch), "--out", str(tmp_path / "j")])
    joined = json.loads((tmp_path / "j" / "transfer.json").read_text())
    whole = run_transfer(recipe(tmp_path / "w", corpus, easy_glue, seeds=[0]))
    assert joined["comparison"] == json.loads(json.dumps(whole["comparison"]))  # the same training, the same numbers
    assert joined["recipe"]["val_loss"] == pytest.approx(whole["recipe"]["val_loss"])
    assert joined["arms"]["scratch"].startswith(str(tmp_path / "a" / "finetune" / "scratch"))
    assert joined["run"]["seconds"] == pytest.approx(
        sum(joined["run"]["arms"][a]["seconds"] for a in ("scratch", "pretrained")), abs=0.11
    )
    assert (tmp_path / "j" / "transfer.md").read_text() == transfer_table(joined)
    with pytest.raises(TransferError, match="are both the scratch arm"):
        join_arms([scratch, scratch], tmp_path / "x", "")
    other = json.loads(pretrained.read_text())
    other["shared"]["seeds"] = [0, 1]
    other["shared"]["model"]["dim"] = 64
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(
        TransferError,
        match=r"different recipes \(they differ in \['model', 'seeds'\]: seeds: \[0\] "
        r"vs \[0, 1\]\)",
    ):
        join_arms([scratch, tmp_path / "other.json"], tmp_path / "x", "")
    other = json.loads(pretrained.read_text())
    other["recipe"]["pretrain_overrides"] += ["train.compile=true"]  # the pretraining's alone: no matter
    (tmp_path / "other.json").write_text(json.dumps(other))
    assert join_arms([scratch, tmp_path / "other.json"], tmp_path / "y", "")["comparison"] == joined["comparison"]
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(TransferError, match=r"bad.json: not an lm transfer arm record \(no arm, recipe, shared, "):
        join_arms([scratch, tmp_path / "bad.json"], tmp_path / "x", "")
    (tmp_path / "cut.json").write_text(scratch.read_text()[:100])  # a half-copied record
    with pytest.raises(TransferError, match="cut.json: cannot be read as JSON"):
        join_arms([tmp_path / "cut.json", pretrained], tmp_path / "x", "")
    assert not (tmp_path / "x").exists()


def test_a_failed_lane_is_an_error_naming_its_log(tmp_path, corpus, easy_glue, monkeypatch):  # noqa: F811
    import lm.cli.transfer_lane as lane

    monkeypatch.setattr(lane, "recipe_argv", lambda r: ["--no-such-flag"])  # the lane exits at once (status 2)
    r = recipe(tmp_path / "t", corpus, easy_glue, parallel=True, seeds=[0])
    with pytest.raises(
        TransferError,
        match=r"(?s)scratch arm, run beside the pretraining, did not finish \(exit "
        r"status 2; the last lines of .*lane\.log.*unrecognized arguments",
    ):
        run_transfer(r)
    assert (tmp_path / "t" / "finetune" / "pretrained" / "results.json").is_file()  # the other arm's work is kept


def test_the_lane_command_rebuilds_the_recipe(tmp_path):
    from lm.cli.transfer import _parser
    from lm.cli.transfer_lane import recipe_argv

    r = Recipe(
        preset="glue_transfer_encoder",
        tokens=3000,
        out=tmp_path / "o",
        scratch=tmp_path / "s",
        seeds=[1, 2],
        tasks=["rte", "cola"],
        group="g",
        pretrain=["model.dim=64", "train.lr=1e-3"],
        finetune=["pooling=first", "tasks.rte.epochs=1"],
    )
    a = _parser().parse_args(recipe_argv(r))
    assert (a.preset, int(a.tokens), a.out, a.scratch, a.seeds, a.tasks, a.group, a.pretrain, a.finetune) == (
        r.preset,
        r.tokens,
        r.out,
        r.scratch,
        [1, 2],
        ["rte", "cola"],
        "g",
        r.pretrain,
        r.finetune,
    )
    assert _parser().parse_args(recipe_argv(Recipe(out=tmp_path / "o"))).pretrain == []
    with pytest.raises(TransferError, match="--arm both: must be one of all, scratch, pretrained"):
        Recipe(arm="both")
    with pytest.raises(TransferError, match="--parallel runs the scratch arm beside the pretraining"):
        Recipe(arm="scratch", parallel=True)
