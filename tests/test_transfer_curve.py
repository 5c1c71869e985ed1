"""The transfer curve: lm report's curve table, and benchmarks/glue_transfer_curve.py (its section of the doc page,
the archive of points and scratch arms that outlives a session, one curve per recipe, end to end on a tiny model)."""

import json
import shutil
from pathlib import Path

import pytest

from lm.cli.transfer_recipe import Recipe
from lm.report.transfer import compare, curve_table, find_transfers, transfer_table
from tests.benchmark_scripts import load


def test_the_average_row_and_the_curve_table():
    def arm(scores):
        return {
            c: {"metrics": ["score"], "seeds": {str(i): v for i, v in enumerate(vs)}, "median": sorted(vs)[1]}
            for c, vs in scores.items()
        }

    cmp = compare(arm({"sst2": [70, 72, 74], "rte": [50, 54, 52]}), arm({"sst2": [75, 74, 79], "rte": [50, 55, 53]}))
    assert cmp["tasks"]["sst2"]["gain"] == 3 and cmp["tasks"]["rte"]["gain"] == 1
    assert cmp["tasks"]["sst2"]["scratch"]["range"] == 4 and cmp["average"]["gain"] == 2
    assert cmp["average"]["pretrained"]["seeds"] == {"0": 62.5, "1": 64.5, "2": 66.0}
    assert cmp["average"]["scratch"]["median"] == 62
    recipe = {"arch": "encoder", "pooling": "first", "tokens": 3_000_000, "val_loss": 4.25}
    table = curve_table([{"recipe": recipe, "comparison": cmp}])
    assert "| SST-2 | RTE | average gain |" in table
    assert (
        "| encoder (first) | 3,000,000 | 4.250 | – | +3.0 | +1.0 | **+2.0** | 62.0 / 64.0 |" in table
    )  # no pos, probe
    table = curve_table(
        [
            {"recipe": {**recipe, "pos": "rope"}, "comparison": cmp},
            {"recipe": {**recipe, "pos": "learned"}, "comparison": cmp},
        ]
    )
    assert "| encoder (first, rope) | 3,000,000 |" in table and "| encoder (first, learned) | 3,000,000 |" in table
    one = compare(arm({"sst2": [70, 72, 74]}), arm({"sst2": [75, 74, 79]}))
    recipe |= {"preset": "p", "objective": "mlm", "finetune_note": "n", "steps": 2, "tokens_per_step": 8}
    for c, n in ((cmp, "2 tasks"), (one, "1 task")):
        md = transfer_table({"comparison": c, "recipe": recipe, "arms": {"scratch": "s", "pretrained": "p"}})
        assert f"| **average ({n})** | score |" in md


def _curve_script():
    return load("glue_transfer_curve")


def test_the_curve_script_fills_only_its_section():
    curve = _curve_script()
    page = f"# t\nbefore\n{curve.BEGIN}\nold\n{curve.END}\nafter\n"
    assert curve.replace_section(page, "new $1 \\1") == f"# t\nbefore\n{curve.BEGIN}\nnew $1 \\1\n{curve.END}\nafter\n"
    real = (Path(__file__).parents[1] / "docs" / "glue_transfer.md").read_text()
    assert real.count(curve.BEGIN) == 1 and real.count(curve.END) == 1
    # the run list names each run's series and directory (two presets' runs can share a command's text)
    cmp = compare(
        {"rte": {"metrics": ["acc"], "seeds": {"0": 50.0}, "median": 50.0}},
        {"rte": {"metrics": ["acc"], "seeds": {"0": 53.0}, "median": 53.0}},
    )
    run = {"command": "lm transfer --tokens 100", "machine": "m", "finished": "today", "seconds": 12.0}
    recipe = {"arch": "encoder", "pooling": "first", "tokens": 100, "val_loss": None}
    rows = [
        {"recipe": {**recipe, "pos": "learned", "note": "moved"}, "comparison": cmp, "run": run, "dir": "a/0"},
        {"recipe": {**recipe, "pos": "rope"}, "comparison": cmp, "run": run, "dir": "b/0"},
    ]
    text = curve.section(rows, Path("x.png"), "cmd")
    assert (
        "- encoder (first, learned), 100 tokens, in `a/0`: `lm transfer --tokens 100`: m, finished today, 12 s (moved)"
        in text
    )
    assert (
        "- encoder (first, rope), 100 tokens, in `b/0`: `lm transfer --tokens 100`: m, finished today, 12 s\n" in text
    )


def test_the_curve_page_keeps_archived_points_of_earlier_sessions(tmp_path):
    """runs/ does not outlive a session: each finished point is archived (keyed by series and tokens) and the
    page is built from the archive, so a point whose run directory is gone stays on it; a series whose
    preset changed (another position scheme) gets its own record, never overwriting the other's."""
    curve = _curve_script()

    def point(name, tokens, pos, gain):
        out = tmp_path / "runs" / name
        out.mkdir(parents=True)
        cmp = compare(
            {"rte": {"metrics": ["acc"], "seeds": {"0": 50.0}, "median": 50.0}},
            {"rte": {"metrics": ["acc"], "seeds": {"0": 50.0 + gain}, "median": 50.0 + gain}},
        )
        summary = {
            "recipe": {"arch": "encoder", "pooling": "first", "pos": pos, "tokens": tokens, "val_loss": 5.0},
            "comparison": cmp,
            "run": {"command": f"lm transfer --out {out}", "machine": "m", "finished": "today", "seconds": 1.0},
        }
        (out / "transfer.json").write_text(json.dumps(summary))
        (out / "transfer.md").write_text("table\n")
        return out

    archive = tmp_path / "archive"
    first = curve.archive_point(point("a", 1000, "learned", 1.0), archive)
    assert first == archive / "encoder-first-learned" / "1000" and (first / "transfer.md").read_text() == "table\n"
    curve.archive_point(point("b", 1000, "rope", 2.0), archive)  # same arch and tokens, another series
    shutil.rmtree(tmp_path / "runs")  # the next session: run directories gone
    rows = find_transfers([archive])
    assert [(r["recipe"]["pos"], r["comparison"]["average"]["gain"]) for r in rows] == [("learned", 1.0), ("rope", 2.0)]
    text = curve.section(rows, Path("x.png"), "cmd")
    assert f"in `{tmp_path / 'runs' / 'a'}`" in text and f"in `{tmp_path / 'runs' / 'b'}`" in text
    rerun = curve.archive_point(point("c", 1000, "rope", 3.0), archive)  # the same point measured again replaces it
    assert json.loads((rerun / "transfer.json").read_text())["comparison"]["average"]["gain"] == 3.0
    assert len(find_transfers([archive])) == 2


def test_an_archived_point_names_no_path_of_this_machine(tmp_path, monkeypatch):
    """The archive is committed: lm's cache is written $LM_CACHE, what lies in the working directory relative to
    it, a symlinked entry (runs/ on other storage) by its name (lm.report.paths.portable, on every string)."""
    curve = _curve_script()
    work, storage, cache = tmp_path / "work", tmp_path / "storage", tmp_path / "cache"
    (work / "docs").mkdir(parents=True)
    (storage / "runs").mkdir(parents=True)
    (work / "runs").symlink_to(storage / "runs")
    monkeypatch.chdir(work)
    monkeypatch.setenv("LM_CACHE", str(cache))
    record = {
        "recipe": {"tokenizer": f"{cache}/data/x/tokenizer.json", "seeds": [0, 1]},
        "arms": {"scratch": f"{storage}/runs/p/scratch", "pretrained": f"{work}/runs/p/finetune/pretrained"},
        "run": {"command": f"lm transfer --out {storage}/runs/p", "seconds": 1.0},
        "run_dir": f"{work}/docs",
        "elsewhere": "/opt/data/x",
    }
    assert curve.portable_record(record) == {
        "recipe": {"tokenizer": "$LM_CACHE/data/x/tokenizer.json", "seeds": [0, 1]},
        "arms": {"scratch": "runs/p/scratch", "pretrained": "runs/p/finetune/pretrained"},
        "run": {"command": "lm transfer --out runs/p", "seconds": 1.0},
        "run_dir": "docs",
        "elsewhere": "/opt/data/x",
    }


def test_a_finished_scratch_arm_is_archived_and_restored_by_its_record(tmp_path, monkeypatch):
    """runs/ does not outlive a session, the scratch arm's ~55 core-minutes should: its record and each
    pair's sealed result go to <archive>/scratch/<key>/, and the next session's empty scratch directory is
    filled from the entry whose record equals its own (another record restores nothing)."""
    curve = _curve_script()
    record = {"pooling": "first", "seeds": [0, 1], "model": {"dim": 32}}
    arm = tmp_path / "runs" / "scratch"
    for task, seed in [("rte", 0), ("rte", 1)]:
        (arm / task / f"seed{seed}").mkdir(parents=True)
        (arm / task / f"seed{seed}" / "result.pt").write_bytes(b"result %d" % seed)
        (arm / task / f"seed{seed}" / "result.sha256").write_text("abc\n")
    (arm / "rte" / "seed1" / "checkpoints").mkdir()  # an unfinished pair's state is not archived
    (arm / "transfer_arm.json").write_text(json.dumps(record))
    archive = tmp_path / "archive"
    dest = curve.archive_scratch(arm, archive)
    assert dest == archive / "scratch" / curve.scratch_key(record)
    assert sorted(str(f.relative_to(dest)) for f in dest.rglob("*") if f.is_file()) == [
        "archived_arm.json",
        "rte/seed0/result.pt",
        "rte/seed0/result.sha256",
        "rte/seed1/result.pt",
        "rte/seed1/result.sha256",
        "transfer_arm.json",
    ]
    assert json.loads((dest / "archived_arm.json").read_text())["run_dir"] == str(arm)

    shutil.rmtree(tmp_path / "runs")  # the next session
    monkeypatch.setattr(curve, "plan", lambda r: None)
    monkeypatch.setattr(curve, "scratch_record", lambda r, p: dict(record, seeds=[0]))  # another recipe
    r = Recipe(out=tmp_path / "runs" / "0", scratch=arm)
    assert curve.restore_scratch(r, archive) is None and not arm.exists()
    monkeypatch.setattr(curve, "scratch_record", lambda r, p: record)
    assert curve.restore_scratch(r, archive) == dest
    assert (arm / "rte" / "seed1" / "result.pt").read_bytes() == b"result 1"
    assert curve.restore_scratch(r, archive) is None  # a live arm is resumed as it is, never overwritten
    # the point then says its scratch arm was measured elsewhere, and archiving it again keeps that record
    (r.out).mkdir(parents=True)
    cmp = compare(
        {"rte": {"metrics": ["acc"], "seeds": {"0": 50.0}, "median": 50.0}},
        {"rte": {"metrics": ["acc"], "seeds": {"0": 52.0}, "median": 52.0}},
    )
    summary = {
        "recipe": {"arch": "encoder", "pooling": "first", "pos": "rope", "tokens": 100, "val_loss": 5.0},
        "arms": {"scratch": str(arm)},
        "comparison": cmp,
        "run": {"command": "c", "machine": "m", "finished": "today", "seconds": 1.0},
    }
    (r.out / "transfer.json").write_text(json.dumps(summary))
    point = json.loads((curve.archive_point(r.out, archive) / "transfer.json").read_text())
    assert point["scratch_measured"]["run_dir"] == str(arm)
    assert "the scratch arm restored from the archive" in curve.section([point], Path("x.png"), "cmd")
    assert json.loads((curve.archive_scratch(arm, archive) / "archived_arm.json").read_text())["run_dir"] == str(arm)
    # the same recipe's arm measured again elsewhere (not restored): the first measurement stays archived
    again = tmp_path / "runs2" / "scratch"
    shutil.copytree(arm, again)
    (again / "archived_arm.json").unlink()
    (again / "rte" / "seed0" / "result.pt").write_bytes(b"remeasured")
    assert curve.archive_scratch(again, archive) == dest
    assert (dest / "rte" / "seed0" / "result.pt").read_bytes() == b"result 0"
    assert json.loads((dest / "archived_arm.json").read_text())["run_dir"] == str(arm)


def test_runs_of_one_series_with_other_overrides_are_two_curves(tmp_path):
    """A recipe with other finetuning (or pretraining) overrides is its own curve: archived apart, never over
    the other's point, and labelled by the overrides the curves do not share."""
    from lm.report.transfer import series_labels

    curve = _curve_script()
    cmp = compare(
        {"rte": {"metrics": ["acc"], "seeds": {"0": 50.0}, "median": 50.0}},
        {"rte": {"metrics": ["acc"], "seeds": {"0": 52.0}, "median": 52.0}},
    )

    def point(name, finetune, pretrain=()):
        out = tmp_path / name
        out.mkdir()
        recipe = {
            "arch": "encoder",
            "pooling": "mean",
            "pos": "rope",
            "tokens": 1000,
            "val_loss": 5.0,
            "finetune_overrides": list(finetune),
            "pretrain_overrides": list(pretrain),
        }
        run = {"command": "c", "machine": "m", "finished": "today", "seconds": 1.0}
        (out / "transfer.json").write_text(json.dumps({"recipe": recipe, "comparison": cmp, "run": run}))
        return out

    archive = tmp_path / "archive"
    base = curve.archive_point(point("a", ["pooling=mean"]), archive)
    more = curve.archive_point(point("b", ["pooling=mean", "tasks.sst2.max_train_examples=10000"]), archive)
    hot = curve.archive_point(point("c", ["pooling=mean"], ["model.electra.temperature=2"]), archive)
    assert base == archive / "encoder-mean-rope" / "1000" and len({base, more, hot}) == 3
    assert more.parent.name.startswith("encoder-mean-rope-") and hot.parent.name.startswith("encoder-mean-rope-")
    # The folder is a digest of the overrides; the committed archive's names depend on it not changing.
    assert more.parent.name == "encoder-mean-rope-d4a2b4a8"  # docs/glue_transfer/points/ has this folder
    both = curve.archive_point(
        point("d", ["pooling=mean", "tasks.rte.epochs=10"], ["model.electra.temperature=2", "train.threads=1"]), archive
    )
    assert len({base, more, hot, both}) == 4
    rows = find_transfers([archive])
    # Each side is named once, so a finetuning override never reads as a pretraining one.
    assert sorted(series_labels(rows)) == [
        "encoder (mean, rope)",
        "encoder (mean, rope; finetune tasks.sst2.max_train_examples=10000)",
        "encoder (mean, rope; pretrain model.electra.temperature=2)",
        # train.threads=1 changes nothing computed: not part of the label (nor of the curve's key)
        "encoder (mean, rope; pretrain model.electra.temperature=2; finetune tasks.rte.epochs=10)",
    ]
    assert series_labels(rows[:1]) == ["encoder (mean, rope)"]  # one recipe alone: the plain label
    assert "| encoder (mean, rope; finetune tasks.sst2.max_train_examples=10000) | 1,000 |" in curve_table(rows)


def test_a_curve_run_again_with_other_seeds_is_refused_before_any_work(tmp_path, monkeypatch):
    """The archive keys a point by series, overrides and tokens, not by seeds: the curve run again with --seeds 0
    replaced the archived three-seed record of its point (the page rebuilt without it) and put one-seed medians in
    the same curve, under the same label. Refused before any point's work, naming the seeds and tasks to pass."""
    curve = _curve_script()
    cmp = compare(
        {"rte": {"metrics": ["acc"], "seeds": {"0": 50.0}, "median": 50.0}},
        {"rte": {"metrics": ["acc"], "seeds": {"0": 52.0}, "median": 52.0}},
    )
    base = {"arch": "decoder", "pooling": "mean", "pos": "learned", "tasks": ["rte", "mrpc"], "seeds": [0, 1, 2]}
    runs = []

    def run_transfer(r):  # a finished point of the recipe asked for, written where lm transfer writes it
        runs.append((r.tokens, r.seeds))
        r.out.mkdir(parents=True, exist_ok=True)
        record = {**base, "tokens": r.tokens, "val_loss": None, "seeds": r.seeds, "tasks": r.tasks}
        run = {"command": "c", "machine": "m", "finished": "today", "seconds": 1.0}
        (r.out / "transfer.json").write_text(json.dumps({"recipe": record, "comparison": cmp, "run": run, "arms": {}}))

    monkeypatch.setattr(curve, "run_transfer", run_transfer)
    monkeypatch.setattr(curve, "plan", lambda r: None)
    # raising=False: the script had no recipe_record before it checked the archive
    monkeypatch.setattr(
        curve, "recipe_record", lambda r, p: {**base, "seeds": r.seeds, "tasks": r.tasks}, raising=False
    )
    for name in ("restore_scratch", "archive_scratch"):
        monkeypatch.setattr(curve, name, lambda *a: None)
    archive, doc = tmp_path / "points", tmp_path / "page.md"
    doc.write_text(f"{curve.BEGIN}\n{curve.END}\n")
    common = ["--arches", "decoder", "--tasks", "rte,mrpc", "--archive", str(archive), "--doc", str(doc)]
    curve.main([*common, "--root", str(tmp_path / "a"), "--tokens", "0,1000", "--seeds", "0,1,2"])
    point = archive / "decoder-mean-learned" / "1000" / "transfer.json"
    assert json.loads(point.read_text())["recipe"]["seeds"] == [0, 1, 2] and len(runs) == 2
    for tokens, seeds, tasks in (("1000", "0", "rte,mrpc"), ("3000", "0", "rte,mrpc"), ("1000", "0,1,2", "rte")):
        argv = [*common[:2], "--tasks", tasks, *common[4:], "--root", str(tmp_path / "b"), "--tokens", tokens]
        with pytest.raises(
            SystemExit,
            match=r"decoder-mean-learned holds this curve over seeds \[0, 1, 2\] on "
            r"tasks mrpc,rte .* pass --seeds 0,1,2 --tasks mrpc,rte, or another --archive",
        ):
            curve.main([*argv, "--seeds", seeds])
    assert len(runs) == 2 and json.loads(point.read_text())["recipe"]["seeds"] == [0, 1, 2]  # no work, nothing lost
    curve.main([*common, "--root", str(tmp_path / "c"), "--tokens", "3000", "--seeds", "2,1,0"])  # the same seeds
    assert runs[-1] == (3000, [2, 1, 0]) and len(find_transfers([archive])) == 3


@pytest.mark.slow
def test_the_curve_script_end_to_end_tiny(tmp_path):
    import os
    import subprocess
    import sys

    doc = tmp_path / "page.md"
    doc.write_text("# page\n<!-- curve:begin -->\n<!-- curve:end -->\n")
    env = {**os.environ, "LM_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}

    def curve(tokens: str, root: str, *more: str):  # one call of the curve script on the tiny settings
        command = ["benchmarks/glue_transfer_curve.py", "--tiny", "--arches", "decoder", "--tokens", tokens]
        command += ["--tasks", "rte", "--root", str(tmp_path / root), *more, "--doc", str(doc)]
        command += ["--scratch-archive", str(tmp_path / "scratch_archive")]
        return subprocess.run(
            [sys.executable, *command],
            capture_output=True,
            text=True,
            env=env,
            timeout=1200,
            cwd=Path(__file__).parents[1],
        )

    out = curve("0,20000", "runs")
    assert out.returncode == 0, out.stderr[-3000:]
    text = doc.read_text()
    assert "| decoder (mean, learned) | 0 | – | – | +0.0 | **+0.0** |" in text  # no val loss, no probe
    assert "| decoder (mean, learned) | 20,480 |" in text
    assert (tmp_path / "page.png").is_file() and "lm transfer --preset glue_transfer_decoder --tokens 20000" in text
    # the next session (runs/ gone) restores the archived scratch arm instead of training it again
    # (the --tiny overrides are part of the archive's key: decoder-mean-learned-<their digest>)
    [point] = (tmp_path / "runs" / "points").glob("decoder-mean-learned-*/20480/transfer.json")
    first = json.loads(point.read_text())["comparison"]
    again = curve("20000", "runs2", "--archive", str(tmp_path / "runs" / "points"))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "finetuning from scratch" in again.stderr and "restored from" in again.stderr
    assert f"GLUE rte seed 0: done in an earlier run ({tmp_path / 'runs2' / 'decoder' / 'scratch'}" in again.stderr
    second = json.loads(point.read_text())
    assert second["comparison"] == first  # the same scratch arm; the pretrained arm reproduces too
    assert second["scratch_measured"]["run_dir"] == str(tmp_path / "runs" / "decoder" / "scratch")


def test_tiny_pretraining_prepares_its_corpus_in_a_directory_of_its_own():
    """--tiny tokenizes the TinyStories preset at vocabulary 512: into the preset's own directory it made a later
    `lm train data=tinystories_sample_bpe` (the preset's 4096) refused as 'prepared with other settings'."""
    from lm.data.config import data_preset

    tiny = load("glue_transfer_curve").TINY_PRETRAIN
    assert tiny[0] == "data=tinystories_sample_bpe"
    ours = data_preset("tinystories_sample_bpe", [o for o in tiny if o.startswith("data.")])
    preset = data_preset("tinystories_sample_bpe")
    assert (ours.vocab_size, preset.vocab_size) == (512, 4096)
    assert Path(ours.dir).name == "tinystories_sample_bpe_512" and Path(preset.dir).name == "tinystories_sample_bpe"
