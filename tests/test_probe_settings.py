"""benchmarks/probe_settings.py (issue 52 item 2): probe settings scored from slices of one set of features,
at k=1 the same probe as lm/eval/probe.py, and their ranking against finetuning."""

import numpy as np
import pytest

from tests.benchmark_scripts import load

ps = load("probe_settings")


def features(seed: int = 0, n_train: int = 60, n_dev: int = 40, dim: int = 8):
    """SST-2: labels = sign of feature 0 (separable); STS-B: targets = 5 * sigmoid of feature 1, noiseless."""
    rng = np.random.default_rng(seed)
    x_tr, x_dev = rng.normal(size=(n_train, dim)).astype(np.float32), rng.normal(size=(n_dev, dim)).astype(np.float32)
    cls = lambda x: [int(v > 0) for v in x[:, 0]]  # noqa: E731
    reg = lambda x: [float(5 / (1 + np.exp(-v))) for v in x[:, 1]]  # noqa: E731
    return {"sst2": (x_tr, cls(x_tr), x_dev, cls(x_dev), False), "stsb": (x_tr, reg(x_tr), x_dev, reg(x_dev), True)}


def test_each_setting_scores_its_slices_and_k1_is_lm_probe():
    from lm.eval.probe import fit_and_score

    feats = features()
    out = ps.settings_scores(feats, {"20, 10": (20, 10, 1.0), "60, all": (60, 0, 1.0), "60, all, x100": (60, 0, 100.0)})
    x_tr, y_tr, x_dev, y_dev, _ = feats["sst2"]
    assert out["20, 10"]["sst2"] == fit_and_score("sst2", x_tr[:20], y_tr[:20], x_dev[:10], y_dev[:10], False)
    x_tr, y_tr, x_dev, y_dev, _ = feats["stsb"]
    assert out["60, all"]["stsb"] == pytest.approx(fit_and_score("stsb", x_tr, y_tr, x_dev, y_dev, True))
    assert out["60, all"]["sst2"] > 90 and out["60, all"]["stsb"] > 90  # separable / monotone: near perfect
    assert out["60, all"]["avg"] == pytest.approx((out["60, all"]["sst2"] + out["60, all"]["stsb"]) / 2)
    assert (
        out["60, all, x100"]["sst2"] != out["60, all"]["sst2"] or out["60, all, x100"]["stsb"] != out["60, all"]["stsb"]
    )


def test_table_ranks_each_setting_against_finetuning():
    points = {s: {"up": {"avg": float(s)}, "down": {"avg": -float(s)}} for s in (0, 50, 100, 200)}
    lines = ps.table(points, {0: 30.0, 50: 31.0, 100: 33.0, 200: 34.0}).splitlines()
    assert lines[0].startswith("| probe: train rows, dev rows | 0 | 50 | 100 | 200 |")
    assert lines[2].endswith("| 1.00 |") and lines[3].endswith("| -1.00 |")


def test_a_point_of_another_run_or_cut_is_not_read_back(tmp_path, monkeypatch):
    """--out's points were read back whatever run or --max-train made them: the table mixed two runs' scores."""
    import argparse
    import json

    monkeypatch.setattr(ps, "point_features", lambda run, step, max_train, tasks: features())
    a = argparse.Namespace(run=tmp_path / "run", max_train=60)
    made = {"run": str(a.run.resolve()), "max_train": 60, "tasks": ["sst2", "mrpc", "stsb", "cola"]}
    mine = tmp_path / "step_00000100.json"
    first = ps.point_scores(a, mine, 100, made)
    assert json.loads(mine.read_text()) == {**made, "scores": first} and ps.point_scores(a, mine, 100, made) == first
    for other in ({"max_train": 30}, {"tasks": ["sst2", "stsb"]}):
        with pytest.raises(SystemExit, match="holds scores of another run, --max-train or tasks"):
            ps.point_scores(a, mine, 100, {**made, **other})
    mine.write_text(json.dumps({"run": made["run"], "max_train": 60, "scores": first}))  # before tasks were recorded
    assert ps.point_scores(a, mine, 100, made) == first  # the four default tasks
    with pytest.raises(SystemExit, match="holds scores of another run, --max-train or tasks"):
        ps.point_scores(a, mine, 100, {**made, "tasks": ["sst2", "stsb"]})
    mine.write_text(json.dumps(first))  # written before the run and cut were recorded: read as it is
    assert ps.point_scores(a, mine, 100, {**made, "max_train": 30}) == first


def test_a_rank_run_of_some_tasks_is_scored_on_those(tmp_path, monkeypatch, capsys):
    """probe_rank.py --tasks sst2,stsb wrote points whose finetune scores name those two; probe_settings.py took the
    four default tasks' medians of them (KeyError: 'mrpc') and would have probed all four."""
    import json

    asked = []
    monkeypatch.setattr(ps, "point_features", lambda run, step, max_train, tasks: asked.append(tasks) or features(step))
    (tmp_path / "rank" / "points").mkdir(parents=True)
    run = str((tmp_path / "run").resolve())
    for step, ft in ((0, 40.0), (100, 50.0), (200, 60.0)):
        point = {"step": step, "run": run, "tasks": ["sst2", "stsb"], "finetune": {"0": {"sst2": ft, "stsb": ft + 2}}}
        (tmp_path / "rank" / "points" / f"step_{step:08d}.json").write_text(json.dumps(point))
    ps.main([str(tmp_path / "run"), "--rank-out", str(tmp_path / "rank"), "--out", str(tmp_path / "out")])
    assert asked == [["sst2", "stsb"]] * 3
    assert capsys.readouterr().out.startswith("| probe: train rows, dev rows | 0 | 100 | 200 | Spearman |")
    saved = json.loads((tmp_path / "out" / "step_00000100.json").read_text())
    assert saved["tasks"] == ["sst2", "stsb"] and set(saved["scores"]["1000, all"]) == {"sst2", "stsb", "avg"}
