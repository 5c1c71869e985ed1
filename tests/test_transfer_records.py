"""lm transfer's records in --out and in a scratch arm, checked without running the recipe: which files there are
its own, which reruns are the same arm, the finetuning budget a scratch arm is recorded under, and damaged records
refused in one line."""

import json
import re

import pytest

from lm.cli.transfer_recipe import Recipe, TransferError


def test_a_rerun_adding_a_finetune_override_that_changes_nothing_computed_keeps_the_scratch_arm(tmp_path):
    """A stopped call run again with --finetune train.threads=1 (or train.progress=true) was refused as another
    recipe's scratch arm (differs in ['finetune'], no more said), advising to remove the finished arm; lm finetune
    itself resumes a pair across those. An override that changes what is computed is still refused, naming it (and
    not the rest of the list, where it was hard to find)."""
    from lm.cli.transfer_arms import check_arms

    r = Recipe(out=tmp_path / "run", scratch=tmp_path / "scratch")
    r.scratch.mkdir()
    old = ["tasks.rte.epochs=5", "optim.lr=3e-3"]
    (r.scratch / "transfer_arm.json").write_text(json.dumps({"seeds": [0], "finetune": old}))
    check_arms(r, {"seeds": [0], "finetune": [*old, "train.threads=1", "train.progress=true"]}, {"scratch"})
    with pytest.raises(
        TransferError, match=r"differs in \['finetune'\]; --finetune optim.lr=3e-3 -> optim.lr=1e-3; see "
    ):
        check_arms(
            r, {"seeds": [0], "finetune": ["tasks.rte.epochs=5", "optim.lr=1e-3", "train.threads=1"]}, {"scratch"}
        )


def test_a_users_seconds_file_at_out_is_refused_not_counted(tmp_path):
    """A user's transfer_seconds.json in --out was read as the point's running total (its 5 s added to the run
    record's seconds) and replaced; lm transfer's own is accepted."""
    from lm.cli.transfer_point import check_own_files

    (tmp_path / "transfer_seconds.json").write_text('{"elapsed": 5}\n')
    with pytest.raises(TransferError, match=r"transfer_seconds.json exists and is not a file lm transfer wrote"):
        check_own_files(tmp_path)
    (tmp_path / "transfer_seconds.json").write_text('{"seconds": 5.0}\n')
    check_own_files(tmp_path)


def test_a_point_is_the_same_whatever_order_its_overrides_were_typed_in(tmp_path):
    """--pretrain model.dim=48 train.seq_len=64 then --pretrain train.seq_len=64 model.dim=48 in the same --out was
    refused as another recipe's point; a key given twice in another order is another point (the last one wins)."""
    from lm.cli.transfer_point import POINT, check_point

    point = {"preset": "p", "steps": 4, "tokens_per_step": 128, "pretrain_schedule": []}
    (tmp_path / POINT).write_text(json.dumps(point | {"pretrain_overrides": ["model.dim=48", "train.seq_len=64"]}))
    check_point(tmp_path, point | {"pretrain_overrides": ["train.seq_len=64", "model.dim=48"]})
    (tmp_path / POINT).write_text(json.dumps(point | {"pretrain_overrides": ["model.dim=48", "model.dim=64"]}))
    with pytest.raises(TransferError, match="holds the point of another recipe"):
        check_point(tmp_path, point | {"pretrain_overrides": ["model.dim=64", "model.dim=48"]})


def test_an_arm_is_compared_on_the_tasks_both_records_name_seeds_aside(tmp_path):
    """The pretrained arm's record (and either arm's where a call does not run it) is compared as lm finetune compares
    a finished pair: an SST-2 arm extended by CoLA, with CoLA's own overrides and other seeds, is the same arm; another
    SST-2 setting, or one that sets every task, is not."""
    from lm.cli.transfer_arms import check_arms

    r = Recipe(out=tmp_path / "run", tokens=100, arm="pretrained")
    budget = ["task=[glue/sst2]", "optim.lr=5e-4", "tasks.sst2.epochs=3"]
    old = {"tasks": ["sst2"], "seeds": [0], "budget": budget, "finetune": ["tasks.sst2.lr=2e-4", "optim.lr=1e-4"]}
    (r.out / "finetune" / "pretrained").mkdir(parents=True)
    (r.out / "finetune" / "pretrained" / "transfer_arm.json").write_text(json.dumps(old))
    wider = {
        "tasks": ["sst2", "cola"],
        "seeds": [0, 1, 2],
        "budget": ["task=[glue/sst2,glue/cola]", "optim.lr=5e-4", "tasks.sst2.epochs=3", "tasks.cola.epochs=3"],
        "finetune": ["optim.lr=1e-4", "tasks.cola.epochs=4", "tasks.sst2.lr=2e-4", "train.progress=false"],
    }
    check_arms(r, wider, {"pretrained"})
    written = json.loads((r.out / "finetune" / "pretrained" / "transfer_arm.json").read_text())
    assert written["tasks"] == ["sst2", "cola"]  # the wider record speaks for both tasks now
    for key, change, words in (
        ("finetune", ["tasks.sst2.lr=1e-3"], r"--finetune tasks.sst2.lr=2e-4 -> tasks.sst2.lr=1e-3"),
        ("finetune", ["glue.max_train_examples=64"], r"--finetune \(none\) -> glue.max_train_examples=64"),
        ("budget", ["tasks.cola.epochs=2"], r"budget: "),
    ):
        other = {**wider, key: [o for o in wider[key] if not o.startswith(change[0].split("=")[0] + "=")] + change}
        with pytest.raises(TransferError, match=rf"holds a pretrained arm of another finetuning recipe .*{words}"):
            check_arms(r, other, {"pretrained"})


def test_a_scratch_arm_recorded_with_model_linear_torch_is_the_same_arm(tmp_path):
    """An arm recorded before model.linear's default became auto (8edd062) holds linear: torch, the same products:
    the rerun was refused as another recipe's (differs in ['model'], naming no field), advising to remove the
    finished arm. Another value of a field that computes (dim) is still refused."""
    from dataclasses import asdict

    from lm.cli.transfer_arms import check_arms
    from lm.model.config import model_preset

    node = json.loads(json.dumps(asdict(model_preset("tiny", ["model.dim=32"])), default=str))
    assert node["linear"] == "auto"
    r = Recipe(out=tmp_path / "run", scratch=tmp_path / "scratch")
    r.scratch.mkdir()
    (r.scratch / "transfer_arm.json").write_text(json.dumps({"seeds": [0], "model": {**node, "linear": "torch"}}))
    check_arms(r, {"seeds": [0], "model": node}, {"scratch"})
    with pytest.raises(TransferError, match=r"differs in \['model'\]"):
        check_arms(r, {"seeds": [0], "model": {**node, "dim": 64}}, {"scratch"})


def test_a_restored_scratch_arm_extended_by_a_seed_is_archived_as_measured_here(tmp_path, monkeypatch):
    """A curve's scratch arm restored from the archive, then extended by a seed (lm transfer now accepts more seeds
    and its record names them): it is archived under its new record's key, as measured in this session's directory
    (it said it was the restored arm, measured elsewhere), and its point no longer says it was restored; the entry it
    was restored from stays as it was."""
    from tests.benchmark_scripts import load

    curve = load("glue_transfer_curve")
    old = {"pooling": "mean", "tasks": ["rte"], "seeds": [0]}
    entry = tmp_path / "archive" / "scratch" / curve.scratch_key(old)
    (entry / "rte" / "seed0").mkdir(parents=True)
    (entry / "rte" / "seed0" / "result.pt").write_bytes(b"result 0")
    (entry / "transfer_arm.json").write_text(json.dumps(old))
    elsewhere = {"run_dir": "/elsewhere/scratch", "machine": "m", "finished": "monday"}
    (entry / "archived_arm.json").write_text(json.dumps(elsewhere))
    monkeypatch.setattr(curve, "plan", lambda r: None)
    monkeypatch.setattr(curve, "scratch_record", lambda r, p: old)
    r = Recipe(out=tmp_path / "runs" / "0", scratch=tmp_path / "runs" / "scratch")
    assert curve.restore_scratch(r, tmp_path / "archive") == entry
    assert curve.archive_scratch(r.scratch, tmp_path / "archive") == entry  # unchanged: the restored arm itself
    (r.scratch / "rte" / "seed1").mkdir()  # the next call adds seed 1
    (r.scratch / "rte" / "seed1" / "result.pt").write_bytes(b"result 1")
    (r.scratch / "transfer_arm.json").write_text(json.dumps({**old, "seeds": [0, 1]}))
    dest = curve.archive_scratch(r.scratch, tmp_path / "archive")
    assert dest == tmp_path / "archive" / "scratch" / curve.scratch_key({**old, "seeds": [0, 1]}) != entry
    assert (dest / "rte" / "seed1" / "result.pt").read_bytes() == b"result 1"
    assert json.loads((dest / "archived_arm.json").read_text())["run_dir"] == str(r.scratch)
    assert json.loads((entry / "archived_arm.json").read_text()) == elsewhere
    assert not (entry / "rte" / "seed1").exists()
    assert curve.restored_from(r.scratch) is None  # so its point says nothing of a restore (archive_point)


def test_a_shared_scratch_arm_recorded_before_a_new_model_field_still_matches(tmp_path):
    """A scratch arm's transfer_arm.json written before ModelConfig grew a field (model.family) holds a
    model node without it; the same model now must match it, and a different model must not."""
    from dataclasses import asdict

    from lm.cli.transfer_arms import check_arms
    from lm.model.config import model_preset

    node = json.loads(json.dumps(asdict(model_preset("tiny", ["model.dim=32"])), default=str))
    r = Recipe(out=tmp_path / "run", scratch=tmp_path / "scratch")
    r.scratch.mkdir()
    old = {k: v for k, v in node.items() if k != "family"}
    (r.scratch / "transfer_arm.json").write_text(json.dumps({"pooling": "mean", "model": old}))
    check_arms(r, {"pooling": "mean", "model": node}, {"scratch"})  # the same model: accepted
    with pytest.raises(TransferError, match=r"differs in \['model'\]"):
        check_arms(r, {"pooling": "mean", "model": {**node, "dim": 64}}, {"scratch"})


def test_a_damaged_scratch_arm_record_is_one_line_and_kept(tmp_path):
    """A transfer_arm.json cut short or not a JSON object is refused naming it and the fix (it was a JSONDecodeError
    or AttributeError traceback); the file is left as it was."""
    from lm.cli.transfer_arms import check_arms

    r = Recipe(out=tmp_path / "run", scratch=tmp_path / "scratch")
    r.scratch.mkdir()
    path = r.scratch / "transfer_arm.json"
    for text in ('{"tokenizer_sha', "[1]"):
        path.write_text(text)
        with pytest.raises(TransferError, match=rf"{re.escape(str(path))} is damaged .* Delete it and the same"):
            check_arms(r, {"pooling": "mean"}, {"scratch"})
        assert path.read_text() == text


def test_the_budget_reads_the_similarity_pairs_apart_and_an_override_wins(tmp_path):
    """Both arms read MRPC's and STS-B's pairs as siamese pairs and RTE's as one text (the budget); a --finetune
    override of pair_input wins; a scratch arm recorded under another budget (or before the budget was recorded)
    is not shared."""
    from lm.cli.transfer_arms import check_arms
    from lm.cli.transfer_recipe import budget, finetune_config

    def pair_inputs(finetune):
        r = Recipe(out=tmp_path / "point", tasks=["mrpc", "stsb", "rte"], finetune=finetune)
        cfg = finetune_config(r, tmp_path / "arm", "none", None, "mean", r.tasks)
        return {t: cfg.tasks[t].pair_input for t in r.tasks}, cfg.tasks.stsb.fit_head

    assert pair_inputs([]) == ({"mrpc": "siamese", "stsb": "siamese", "rte": "joint"}, True)
    # STS-B read as one text has no cosine score: the budget's fit_head follows, and validates
    joint = pair_inputs(["tasks.stsb.pair_input=joint"])
    assert joint == ({"mrpc": "siamese", "stsb": "joint", "rte": "joint"}, False)
    assert pair_inputs(["tasks.stsb.fit_head=false"])[1] is False
    # a fit_head the user sets stands, however Hydra spells it (lm finetune then refuses it with pair_input=joint)
    assert pair_inputs(["tasks.stsb.pair_input=joint", "tasks.stsb.fit_head=True"])[1] is True
    assert [o for o in budget(["sst2", "stsb"]) if "pair_input" in o] == ["tasks.stsb.pair_input=siamese"]
    assert "train.precision=auto" in budget(["sst2"])  # bf16 where the device has it, as the pretraining

    r = Recipe(out=tmp_path / "run", scratch=tmp_path / "scratch")
    r.scratch.mkdir()
    (r.scratch / "transfer_arm.json").write_text(json.dumps({"pooling": "mean"}))  # recorded before the budget was
    with pytest.raises(TransferError, match=r"differs in \['budget'\]"):
        check_arms(r, {"pooling": "mean", "budget": budget(["stsb"])}, {"scratch"})


def test_a_damaged_arm_record_is_one_line_naming_it(tmp_path):
    """A hand-edited or damaged record (no dir, no run seconds, results that are no results.json) is a TransferError
    naming the file and the call that writes it again, not a KeyError/TypeError traceback; nothing is written."""
    from lm.cli.transfer_join import join_arms

    results = {"columns": {"rte": {"metrics": ["acc"], "seeds": {"0": {"acc": 50.0}}, "median": {"acc": 50.0}}}}
    run = {"command": "lm transfer", "machine": "m", "finished": "", "seconds": 1.0}
    recipe = {"preset": "p", "arch": "decoder", "objective": "causal LM", "finetune_note": "", "tokens": 2048}
    recipe |= {"steps": 1, "tokens_per_step": 2048, "val_loss": None, "probe": None}
    good = {"recipe": recipe, "shared": {"seeds": [0]}, "dir": "d", "results": results, "run": run}
    scratch = tmp_path / "scratch.json"
    scratch.write_text(json.dumps({"arm": "scratch", **good}))
    for name, damage in {
        "nodir": {"dir": None},
        "norun": {"run": {}},
        "columns": {"results": {"columns": 3}},
        "noresults": {"results": {}},
        "shared": {"shared": None},
        "recipe": {"recipe": {"preset": "p"}},
    }.items():
        record = {"arm": "pretrained", **good, **damage}
        record = {k: v for k, v in record.items() if v is not None or k != "dir"}
        (tmp_path / f"{name}.json").write_text(json.dumps(record))
        with pytest.raises(TransferError, match=rf"{name}.json: (a damaged|not an) lm transfer arm record"):
            join_arms([scratch, tmp_path / f"{name}.json"], tmp_path / "x", "")
    assert not (tmp_path / "x").exists()
    (tmp_path / "ok.json").write_text(json.dumps({"arm": "pretrained", **good}))
    assert join_arms([scratch, tmp_path / "ok.json"], tmp_path / "x", "")["comparison"]["tasks"]["rte"]["gain"] == 0
    table = (tmp_path / "x" / "transfer.md").read_text()
    (tmp_path / "longer.json").write_text(json.dumps({"arm": "pretrained", **good, "recipe": {**recipe, "steps": 2}}))
    with pytest.raises(
        TransferError, match=r"x holds the point of another recipe \(steps: 1 -> 2; see .*transfer.json"
    ):
        join_arms([scratch, tmp_path / "longer.json"], tmp_path / "x", "")  # that point's table is not replaced
    assert (tmp_path / "x" / "transfer.md").read_text() == table
