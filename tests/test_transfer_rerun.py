"""lm transfer run again in the same directory: a rerun with overrides that change nothing computed is the same
experiment (one curve in lm report, the record of the call that did the work kept), resume=false starts the
finetunes over without losing the arm's recipe record, an --arm all call leaves no stale one-arm record, another
recipe's point and a pretrained arm whose pretraining is gone are refused before any work, and a point finished
over several calls counts all their seconds."""

import json

import pytest

from lm.cli.transfer import run_transfer
from lm.cli.transfer_recipe import Recipe, TransferError
from lm.report.transfer import compare, find_transfers, overrides, series_labels
from tests.glue_support import easy_glue, sentence  # noqa: F401 - the easy SST-2-shaped task (a fixture)
from tests.test_transfer import corpus, recipe  # noqa: F401 - the tiny corpus (a fixture) and recipe

CMP = compare(
    {"rte": {"metrics": ["acc"], "seeds": {"0": 50.0}, "median": 50.0}},
    {"rte": {"metrics": ["acc"], "seeds": {"0": 53.0}, "median": 53.0}},
)


def _point(out, tokens, finetune, pretrain=(), run=None):
    out.mkdir(parents=True)
    recipe = {
        "arch": "decoder",
        "pooling": "mean",
        "pos": "learned",
        "tokens": tokens,
        "val_loss": 5.0,
        "preset": "p",
        "objective": "causal LM",
        "finetune_note": "the budget",
        "steps": tokens // 100,
        "tokens_per_step": 100,
        "seeds": [0],
        "tasks": ["rte"],
        "finetune_overrides": list(finetune),
        "pretrain_overrides": list(pretrain),
    }
    run = run or {"command": "c", "machine": "m", "finished": "today", "seconds": 1.0}
    arms = {"scratch": "s", "pretrained": "p"}
    (out / "transfer.json").write_text(json.dumps({"recipe": recipe, "arms": arms, "comparison": CMP, "run": run}))
    return out


def test_overrides_that_change_nothing_computed_do_not_split_a_curve(tmp_path):
    """Two points of one experiment, one of them run with --finetune train.progress=false resume=false
    glue.data_root=<elsewhere> and --pretrain train.threads=1 data.workers=1, were two curves in lm report (labels
    naming those overrides); an override that changes the results still makes its own curve."""
    _point(tmp_path / "a", 1000, ["tasks.rte.epochs=10"], ["model.dim=64"])
    _point(
        tmp_path / "b",
        2000,
        ["tasks.rte.epochs=10", "train.progress=false", "resume=false", "glue.data_root=/elsewhere/glue_data"],
        ["model.dim=64", "train.threads=1", "data.workers=1"],
    )
    rows = find_transfers([tmp_path])
    assert [r["recipe"]["tokens"] for r in rows] == [1000, 2000]
    assert overrides(rows[0]) == overrides(rows[1]) == ("pretrain model.dim=64", "tasks.rte.epochs=10")
    assert series_labels(rows) == ["decoder (mean, learned)", "decoder (mean, learned)"]
    # the schedule's keys (resumable only to recover from a NaN loss) and any other override still split
    _point(tmp_path / "c", 1000, ["tasks.rte.epochs=10"], ["model.dim=64", "optim.lr=1e-3"])
    labels = series_labels(find_transfers([tmp_path]))
    assert labels.count("decoder (mean, learned; pretrain optim.lr=1e-3)") == 1 and len(set(labels)) == 2


def test_a_read_back_with_a_harmless_override_keeps_the_run_record_of_the_work(tmp_path):
    """A call that only read finished arms back keeps the run record (command, date, seconds) of the call that did
    the work; with one more --finetune train.progress=false it took that record over."""
    from lm.cli.transfer_recipe import write_table

    worked = {"command": "lm transfer --seeds 0", "machine": "m", "finished": "monday", "seconds": 812.5}
    out = _point(tmp_path / "t", 1000, ["tasks.rte.epochs=10"], run=worked)
    again = json.loads((out / "transfer.json").read_text())
    again["recipe"]["finetune_overrides"] += ["train.progress=false"]
    again["run"] = {
        "command": "lm transfer ... train.progress=false",
        "machine": "m",
        "finished": "tue",
        "seconds": 1.0,
    }
    assert write_table(out, again)["run"] == worked
    assert json.loads((out / "transfer.json").read_text())["run"]["seconds"] == 812.5
    other = json.loads((out / "transfer.json").read_text())
    other["recipe"]["finetune_overrides"] = ["tasks.rte.epochs=3"]  # other work: this call's record
    other["run"] = {"command": "lm transfer epochs 3", "machine": "m", "finished": "wed", "seconds": 5.0}
    assert write_table(out, other)["run"]["seconds"] == 5.0


def test_finetune_resume_false_starts_the_arms_over_and_keeps_everything(tmp_path, corpus, easy_glue, caplog):  # noqa: F811
    """--finetune resume=false finetunes both arms again; each earlier arm is set aside (kept, its place logged),
    never the pretraining. It also moved the scratch arm's recipe record (transfer_arm.json) into previous/, so the
    arm was left without it: a curve's next point of another recipe was no longer refused there."""
    import logging

    from lm.cli.transfer import run_transfer

    out = tmp_path / "t"
    first = run_transfer(recipe(out, corpus, easy_glue, seeds=[0]))
    record = (out / "finetune" / "scratch" / "transfer_arm.json").read_text()
    ckpt = out / "pretrain" / "checkpoints" / "step_00000004"
    weights = {p.name: p.stat().st_mtime_ns for p in ckpt.iterdir()}
    r = recipe(out, corpus, easy_glue, seeds=[0])
    r.finetune += ["resume=false"]
    with caplog.at_level(logging.INFO, logger="lm"):
        again = run_transfer(r)
    assert (out / "finetune" / "scratch" / "transfer_arm.json").read_text() == record
    assert {p.name: p.stat().st_mtime_ns for p in ckpt.iterdir()} == weights  # the pretraining untouched
    assert not (out / "pretrain" / "previous").exists()
    for arm in ("scratch", "pretrained"):
        (aside,) = (out / "finetune" / arm / "previous").iterdir()
        assert f"moved to {aside}" in caplog.text
        old = json.loads((aside / "results.json").read_text())["columns"]["sst2"]["seeds"]["0"]["acc"]
        assert old == first["comparison"]["tasks"]["sst2"][arm]["seeds"]["0"]
        assert (aside / "sst2" / "seed0" / "result.pt").is_file()  # kept, not deleted
        assert (out / "finetune" / arm / "sst2" / "seed0" / "result.pt").is_file()  # finetuned again
        assert not (aside / "transfer_arm.json").exists()
    # the same recipe, the same numbers (CPU, seeded)
    assert again["comparison"] == json.loads(json.dumps(first["comparison"]))


def test_an_arm_all_call_sets_aside_a_one_arm_record_of_older_results(tmp_path, corpus, easy_glue, caplog):  # noqa: F811
    """--arm pretrained --seeds 0, then --arm all --seeds 0,1: transfer_pretrained.json (seed 0 alone) stayed beside
    the table of seeds 0 and 1, and a --join of it made a table of the old results. It is moved to
    <out>/previous/<time>/ (kept as it was, its place logged); a record that still holds its arm's results stays."""
    import logging

    from lm.cli.transfer import run_transfer

    out = tmp_path / "t"
    run_transfer(recipe(out, corpus, easy_glue, arm="scratch", seeds=[0, 1]))
    run_transfer(recipe(out, corpus, easy_glue, arm="pretrained", seeds=[0]))
    old = (out / "transfer_pretrained.json").read_text()
    assert list(json.loads(old)["results"]["columns"]["sst2"]["seeds"]) == ["0"]
    scratch = (out / "transfer_scratch.json").read_text()
    with caplog.at_level(logging.INFO, logger="lm"):
        table = run_transfer(recipe(out, corpus, easy_glue, seeds=[0, 1]))
    assert list(table["comparison"]["tasks"]["sst2"]["pretrained"]["seeds"]) == ["0", "1"]
    assert not (out / "transfer_pretrained.json").exists()
    (moved,) = (out / "previous").glob("*/transfer_pretrained.json")
    assert moved.read_text() == old and f"moved to {moved}" in caplog.text
    assert (out / "transfer_scratch.json").read_text() == scratch  # still its arm's results
    assert list((out / "previous").glob("*/transfer_scratch.json")) == []
    # the same call again finds nothing stale
    run_transfer(recipe(out, corpus, easy_glue, seeds=[0, 1]))
    assert len(list((out / "previous").iterdir())) == 1


def test_a_pretrained_arm_of_another_finetuning_recipe_is_refused_before_any_arm_trains(tmp_path, corpus, easy_glue):  # noqa: F811
    """--arm pretrained at optim.lr=3e-3, then --arm all at 1e-3: the scratch arm finetuned in full before lm finetune
    refused the pretrained arm's finished pairs (their config differs). The pretrained arm keeps a recipe record too
    (transfer_arm.json), so the call is refused before any work, naming the override; a matching call (more seeds, an
    override that changes nothing computed) reads the finished pair back, and resume=false finetunes the arm over
    (beside a scratch arm of its recipe: one of another, which it could not be tabled with, is refused too)."""
    from lm.cli.transfer import run_transfer
    from lm.cli.transfer_recipe import TransferError

    out = tmp_path / "t"
    run_transfer(recipe(out, corpus, easy_glue, arm="pretrained", seeds=[0]))
    done = out / "finetune" / "pretrained" / "sst2" / "seed0" / "result.pt"
    mtime = done.stat().st_mtime_ns
    for arm in ("all", "scratch"):  # --arm scratch too: its arm could never be tabled with that pretrained one
        other = recipe(out, corpus, easy_glue, arm=arm, seeds=[0])
        other.finetune = [o.replace("optim.lr=3e-3", "optim.lr=1e-3") for o in other.finetune]
        with pytest.raises(
            TransferError,
            match=r"t/finetune/pretrained holds a pretrained arm of another finetuning recipe \(differs in "
            r"\['finetune'\]; --finetune optim.lr=3e-3 -> optim.lr=1e-3; see .*pretrained/transfer_arm.json\): .*"
            r"pass another --out, or --finetune resume=false to finetune the arm over",
        ):
            run_transfer(other)
        assert not (out / "finetune" / "scratch").exists()  # no scratch arm finetuned (nor recorded) for nothing
    same = recipe(out, corpus, easy_glue, seeds=[0, 1])
    same.finetune += ["train.threads=1"]
    table = run_transfer(same)
    assert done.stat().st_mtime_ns == mtime  # read back, not finetuned again
    assert list(table["comparison"]["tasks"]["sst2"]["pretrained"]["seeds"]) == ["0", "1"]
    assert json.loads((out / "finetune" / "pretrained" / "transfer_arm.json").read_text())["seeds"] == [0, 1]
    over = recipe(out, corpus, easy_glue, arm="pretrained", seeds=[0])
    over.finetune = [o.replace("optim.lr=3e-3", "optim.lr=1e-3") for o in over.finetune] + ["resume=false"]
    # the scratch arm (3e-3) would not be tabled with it: refused before the pretraining is read
    with pytest.raises(TransferError, match=r"scratch holds a scratch arm of another finetuning recipe .*--scratch"):
        run_transfer(over)
    assert done.stat().st_mtime_ns == mtime
    over.scratch = tmp_path / "s2"
    run_transfer(over)
    (aside,) = (out / "finetune" / "pretrained" / "previous").iterdir()
    assert (aside / "sst2" / "seed0" / "result.pt").is_file() and done.stat().st_mtime_ns != mtime
    record = json.loads((out / "finetune" / "pretrained" / "transfer_arm.json").read_text())
    assert "optim.lr=1e-3" in record["finetune"] and record["seeds"] == [0]


def test_added_seeds_extend_the_scratch_arm_and_fewer_read_it_back(tmp_path, corpus, easy_glue):  # noqa: F811
    """--seeds 0, then --seeds 0,1 (the README's lm quickstart --arm all, then --seeds 0,1,2) was refused: the
    scratch arm's record was compared whole, seeds included ("holds a scratch arm of another recipe (differs in
    ['seeds']; seeds: [0] -> [0, 1])"), advising to remove the finished arm. It is compared as the pretrained arm
    is (the tasks both name, seeds aside): the seed-0 pair is read back, seed 1 finetuned, the record names both.
    A later --seeds 0 reads its pair back and tables seed 0 alone; another optim.lr is still refused, before work."""
    from lm.cli.transfer import run_transfer
    from lm.cli.transfer_recipe import TransferError

    out = tmp_path / "t"
    first = run_transfer(recipe(out, corpus, easy_glue, seeds=[0]))
    done = out / "finetune" / "scratch" / "sst2" / "seed0" / "result.pt"
    mtime = done.stat().st_mtime_ns
    table = run_transfer(recipe(out, corpus, easy_glue, seeds=[0, 1]))
    assert done.stat().st_mtime_ns == mtime  # read back, not finetuned again
    scratch = table["comparison"]["tasks"]["sst2"]["scratch"]["seeds"]
    assert list(scratch) == ["0", "1"]
    assert scratch["0"] == first["comparison"]["tasks"]["sst2"]["scratch"]["seeds"]["0"]
    assert json.loads((out / "finetune" / "scratch" / "transfer_arm.json").read_text())["seeds"] == [0, 1]
    seed1 = (out / "finetune" / "scratch" / "sst2" / "seed1" / "result.pt").stat().st_mtime_ns
    fewer = run_transfer(recipe(out, corpus, easy_glue, seeds=[0]))
    assert [list(fewer["comparison"]["tasks"]["sst2"][arm]["seeds"]) for arm in ("scratch", "pretrained")] == [
        ["0"]
    ] * 2
    assert fewer["comparison"]["tasks"]["sst2"]["scratch"]["seeds"]["0"] == scratch["0"]
    assert (done.stat().st_mtime_ns, (done.parent.parent / "seed1" / "result.pt").stat().st_mtime_ns) == (mtime, seed1)
    # the record still says what the arm holds (a curve's archive keys the arm by it)
    assert json.loads((out / "finetune" / "scratch" / "transfer_arm.json").read_text())["seeds"] == [0, 1]
    other = recipe(out, corpus, easy_glue, seeds=[0, 1, 2])
    other.finetune = [o.replace("optim.lr=3e-3", "optim.lr=1e-3") for o in other.finetune]
    other.scratch, other.out = out / "finetune" / "scratch", tmp_path / "u"  # a curve's next point, say
    with pytest.raises(TransferError, match=r"scratch holds a scratch arm of another .*optim.lr=3e-3 -> optim.lr=1e-3"):
        run_transfer(other)
    assert not (tmp_path / "u" / "pretrain").exists()
    assert not (out / "finetune" / "scratch" / "sst2" / "seed2").exists()


def test_an_out_of_another_point_is_refused_before_any_work(tmp_path, corpus, easy_glue):  # noqa: F811
    """lm quickstart --tokens N grown in the same --out continued that point's pretraining (its checkpoint pruned,
    keep_last=1) before lm finetune refused the pairs; another model was refused by lm train only after the scratch
    arm had finetuned. Both are refused before any work, the point's checkpoint and table kept."""
    out = tmp_path / "t"
    run_transfer(recipe(out, corpus, easy_glue, seeds=[0]))
    ckpts, table = out / "pretrain" / "checkpoints", (out / "transfer.json").read_text()
    with pytest.raises(TransferError, match=r"t holds the point of another recipe \(steps: 4 -> 8; see .*point.json\)"):
        run_transfer(recipe(out, corpus, easy_glue, seeds=[0], tokens=8 * 4 * 32))
    other = recipe(out, corpus, easy_glue, seeds=[0], scratch=tmp_path / "s2")
    other.pretrain = [*other.pretrain, "model.dim=48"]
    with pytest.raises(TransferError, match=r"\(--pretrain \(none\) -> model.dim=48; see "):
        run_transfer(other)
    assert not (tmp_path / "s2").exists()  # no scratch arm finetuned for nothing
    # lm train would resume at another optim.lr or warmup (its NaN recovery): read back (or continued) under a table
    # naming the new rate, the point's model was pretrained at the recipe's 2e-3 after 1 warmup step
    for extra, change in (
        (["optim.lr=1e-2"], r"--pretrain \(none\) -> optim.lr=1e-2"),
        (["sched.warmup_steps=3"], r"--pretrain \(none\) -> sched.warmup_steps=3"),
    ):
        faster = recipe(out, corpus, easy_glue, seeds=[0])
        faster.pretrain = [*faster.pretrain, *extra]
        with pytest.raises(TransferError, match=rf"t holds the point of another recipe \({change}; see "):
            run_transfer(faster)
    assert "lr: 0.002" in (out / "pretrain" / "config.yaml").read_text()
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_00000004"]
    assert (out / "transfer.json").read_text() == table
    (out / "transfer_point.json").unlink()  # a directory from before the record: its table says which point
    with pytest.raises(TransferError, match=r"\(steps: 4 -> 2; see .*transfer.json\)"):
        run_transfer(recipe(out, corpus, easy_glue, seeds=[0], tokens=2 * 4 * 32))
    same = recipe(out, corpus, easy_glue, seeds=[0])
    same.pretrain = [*same.pretrain, "train.threads=1"]  # changes nothing computed: the same point, read back
    assert run_transfer(same)["comparison"] == json.loads(table)["comparison"]
    point = json.loads((out / "transfer_point.json").read_text())
    assert point["steps"] == 4 and point["pretrain_schedule"] == ["sched.warmup_steps=1"]
    del point["pretrain_schedule"]  # a record from before the schedule was the point's: not compared on it
    (out / "transfer_point.json").write_text(json.dumps(point))
    assert run_transfer(same)["comparison"] == json.loads(table)["comparison"]
    notes = tmp_path / "notes"  # a directory of the user's as --out: its transfer.md would be replaced at the end
    notes.mkdir()
    (notes / "transfer.md").write_text("# my notes on transfer\n")
    with pytest.raises(TransferError, match=r"notes/transfer.md exists and is not a file lm transfer wrote"):
        run_transfer(recipe(notes, corpus, easy_glue, seeds=[0]))
    assert sorted(p.name for p in notes.iterdir()) == ["transfer.md"]  # refused before anything is written there


def test_an_unrecorded_out_with_a_pretraining_is_compared_with_it_before_any_work(tmp_path, corpus, easy_glue):  # noqa: F811
    """An --out from an lm transfer older than transfer_point.json, stopped before its table (no record says its
    point): lm quickstart --tokens grown there continued its pretraining (step_00000004 pruned for step_00000008)
    before lm finetune refused the pairs, and recorded the new point over it. Its pretrain/config.yaml is compared
    instead: another point is refused before any work, the command that made it goes on there and records it."""
    out = tmp_path / "t"
    first = run_transfer(recipe(out, corpus, easy_glue, seeds=[0]))
    for name in ("transfer_point.json", "transfer.json", "transfer.md", "transfer_seconds.json"):
        (out / name).unlink()
    ckpts = out / "pretrain" / "checkpoints"
    grown = recipe(out, corpus, easy_glue, seeds=[0], tokens=8 * 4 * 32)
    with pytest.raises(
        TransferError, match=r"t holds the pretraining of another recipe \(train.max_steps: 4 -> 8; see "
    ):
        run_transfer(grown)
    other = recipe(out, corpus, easy_glue, seeds=[0])
    other.pretrain = [*other.pretrain, "model.dim=48", "optim.lr=1e-2"]
    with pytest.raises(TransferError, match=r"\(model.dim: 32 -> 48; optim.lr: 0.002 -> 0.01; see .*older than"):
        run_transfer(other)
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_00000004"]
    assert not (out / "transfer_point.json").exists()  # nothing recorded by a refused call
    same = recipe(out, corpus, easy_glue, seeds=[0])
    same.pretrain = [*same.pretrain, "train.threads=1"]  # changes nothing computed: that point, read back
    assert run_transfer(same)["comparison"] == first["comparison"]
    assert json.loads((out / "transfer_point.json").read_text())["steps"] == 4


def test_a_pretrained_arm_whose_pretraining_is_gone_is_refused_before_any_work(tmp_path, corpus, easy_glue):  # noqa: F811
    """<out>/pretrain deleted (or an --out of an older layout), its pretrained arm kept: lm transfer pretrained again,
    then lm finetune refused the arm's pairs as of other weights only after that pretraining (pairs finished before
    init_weights was recorded were read back beside the new pretraining's: two checkpoints in one median). Refused
    before any work, naming the fixes; --finetune resume=false sets the arm aside and finetunes it from the new one."""
    out = tmp_path / "t"
    run_transfer(recipe(out, corpus, easy_glue, seeds=[0]))
    pretrained = out / "finetune" / "pretrained"
    (out / "pretrain" / "checkpoints").rename(tmp_path / "gone")
    with pytest.raises(
        TransferError,
        match=r"pretrained holds 1 task/seed pair\(s\) finetuned from a pretraining that is no longer in .*t/pretrain "
        r"\(e.g. .*sst2/seed0\): .*pass another --out, or delete .*pretrained \(or --finetune resume=false",
    ):
        run_transfer(recipe(out, corpus, easy_glue, seeds=[0, 1]))
    assert not (out / "pretrain" / "checkpoints").exists()  # not pretrained again
    assert not (out / "finetune" / "scratch" / "sst2" / "seed1").exists()  # nor the scratch arm extended
    over = recipe(out, corpus, easy_glue, seeds=[0, 1])
    over.finetune += ["resume=false"]
    again = run_transfer(over)
    assert sorted(again["comparison"]["tasks"]["sst2"]["pretrained"]["seeds"]) == ["0", "1"]
    (aside,) = (pretrained / "previous").iterdir()
    assert (aside / "sst2" / "seed0" / "result.pt").is_file()  # the old pairs kept, apart from the new ones
    assert (out / "pretrain" / "checkpoints" / "step_00000004").is_dir()


def test_an_interrupted_call_still_counts_its_seconds(tmp_path, monkeypatch):
    """A point finished over several calls (a stop, then the same command) reports their summed time."""
    import time

    import lm.cli.transfer as transfer

    def stopped(r, t0):
        r.out.mkdir(parents=True, exist_ok=True)
        (r.out / "transfer_point.json").write_text("{}")  # as a call records its point before any work
        time.sleep(0.2)
        raise KeyboardInterrupt

    monkeypatch.setattr(transfer, "_transfer", stopped)
    r = Recipe(out=tmp_path / "point")
    for calls in (1, 2):
        with pytest.raises(KeyboardInterrupt):
            transfer.run_transfer(r)
        assert json.loads((r.out / "transfer_seconds.json").read_text())["seconds"] >= 0.2 * calls
