"""benchmarks/probe_rank.py's pure parts (issue 52 item 2): the table and its rank correlation from given
scores, and the resume that reads finished points back instead of probing or finetuning them again."""

import argparse
import json

import pytest

from tests.benchmark_scripts import load

pr = load("probe_rank")
TASKS = ("sst2", "mrpc", "stsb", "cola")


def record(step: int, probe: float, finetune: dict[int, float]) -> dict:
    """A point whose every task scores `probe` (probe) and, per seed, finetune[seed] (+ 1 per task index)."""
    return {
        "step": step,
        "tokens": step * 2048,
        "probe": {**dict.fromkeys(TASKS, probe), "avg": probe},
        "finetune": {str(s): {t: v + i for i, t in enumerate(TASKS)} for s, v in finetune.items()},
    }


def test_finetune_median_is_per_task_over_seeds_then_averaged():
    r = record(100, 50.0, {0: 60.0, 1: 70.0, 2: 62.0})
    ft = pr.finetune_medians(r, TASKS)
    assert ft == {"sst2": 62.0, "mrpc": 63.0, "stsb": 64.0, "cola": 65.0, "avg": 63.5}
    assert pr.finetune_medians(r, TASKS, seeds=[0, 1])["sst2"] == 65.0  # the mean of two
    assert pr.finetune_medians(record(0, 1.0, {}), TASKS) is None


def test_table_sorts_by_step_and_ranks_the_averages():
    # probe order 0 < 100 < 400 < 2000; finetune agrees except 100 and 400 swap: rho = 1 - 6*2/(4*15) = 0.8
    records = [
        record(2000, 40.0, {0: 80.0}),
        record(0, 10.0, {0: 50.0}),
        record(400, 30.0, {0: 60.0}),
        record(100, 20.0, {0: 70.0}),
        {"step": 700, "tokens": 0, "probe": {**dict.fromkeys(TASKS, 1.0), "avg": 1.0}, "finetune": {}},  # not done
    ]
    table = pr.rank_table(records, TASKS)
    rows = [line for line in table.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [row.split(" | ")[0].strip("| ") for row in rows] == ["0", "100", "400", "2000"]
    assert rows[1] == "| 100 | 204,800 | 20.0 | 20.0 | 20.0 | 20.0 | 20.0 | 70.0 | 71.0 | 72.0 | 73.0 | 71.5 |"
    assert "4 points" in table
    assert "Spearman(probe avg, finetune avg) = 0.800" in table
    assert "sst2 0.800" in table


def test_rank_correlation_is_minus_one_for_a_reversed_order():
    done = [record(s, float(s), {0: -float(s)}) for s in (0, 100, 200)]
    assert pr.rank_correlation(done, "avg", TASKS) == pytest.approx(-1.0)


def test_table_with_seeds_keeps_only_points_that_have_them():
    records = [record(0, 1.0, {0: 1.0, 1: 2.0}), record(100, 2.0, {0: 3.0})]
    table = pr.rank_table(records, TASKS, seeds=[1])
    assert "1 points; finetune seeds per point: 1." in table and "Spearman" not in table


def args(tmp_path, **kw) -> argparse.Namespace:
    return argparse.Namespace(
        run=tmp_path / "run", out=tmp_path / "out", tasks=list(TASKS), max_train=2000, threads=None, **kw
    )


def test_resume_reads_done_points_back_and_computes_only_what_is_missing(tmp_path, monkeypatch):
    a = args(tmp_path)
    done = record(100, 20.0, {0: 70.0})
    pr.write_point(a.out, done)
    calls = []
    monkeypatch.setattr(pr, "probe_scores", lambda *x: calls.append("probe") or {})
    monkeypatch.setattr(pr, "finetune_scores", lambda run, step, seed, *x: calls.append(seed) or {"sst2": 1.0})

    pr.do_point(a, 100, 0)  # probe and seed 0 done: nothing runs
    assert calls == [] and pr.read_point(a.out, 100) == done
    pr.do_point(a, 100, 1)  # seed 1 only
    assert calls == [1]
    back = pr.read_point(a.out, 100)
    assert back["probe"] == done["probe"] and back["finetune"]["0"] == done["finetune"]["0"]
    assert back["finetune"]["1"] == {"sst2": 1.0} and set(back["finetune_seconds"]) == {"1"}


def test_a_point_of_another_run_or_cut_is_not_read_back(tmp_path, monkeypatch):
    """A second call with the same --out and another run or --max-train read the first call's points back as its
    own: the table mixed two runs' scores."""
    a = args(tmp_path)
    pr.write_point(a.out, {**record(100, 20.0, {0: 70.0}), **pr.made_of(a)})
    before = pr.read_point(a.out, 100)
    monkeypatch.setattr(pr, "finetune_scores", lambda *x: {"sst2": 1.0})
    other_cut, other_run = args(tmp_path), args(tmp_path)
    other_cut.max_train, other_run.run = 500, tmp_path / "other_run"
    with pytest.raises(SystemExit, match=r"step_00000100.json holds scores of another max_train: 2000 -> 500; name"):
        pr.do_point(other_cut, 100, 1)
    with pytest.raises(SystemExit, match=r"holds scores of another run: '.*/run' -> '.*/other_run'"):
        pr.do_point(other_run, 100, 1)
    assert pr.read_point(a.out, 100) == before
    pr.do_point(a, 100, 1)  # the same run and cut: resumed
    assert set(pr.read_point(a.out, 100)["finetune"]) == {"0", "1"}


def test_pending_and_checkpoint_follow_the_files(tmp_path):
    a = args(tmp_path, steps=[100, 0, 200])
    pr.write_point(a.out, record(100, 20.0, {0: 70.0}))
    assert pr.pending(a, 0) == [0, 200] and pr.pending(a, 1) == [100, 0, 200]
    ckpt = a.run / "checkpoints" / "step_00000200"
    ckpt.mkdir(parents=True)
    assert pr.checkpoint(a.run, 200) is None  # being written: trainer.json comes last
    (ckpt / "trainer.json").write_text(json.dumps({"step": 200, "tokens": 409600}))
    assert pr.checkpoint(a.run, 200) == ckpt and pr.tokens_at(a.run, 200) == 409600
    assert pr.checkpoint(a.run, 0) is not None and pr.tokens_at(a.run, 0) == 0  # the origin: always there
