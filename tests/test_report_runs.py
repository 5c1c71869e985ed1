"""lm report's reading side: failed and partial runs, corrupt files, unfair comparisons, run cards."""

import csv
import json

import pytest
import yaml

from lm.cli.report import main
from lm.model.config import model_preset
from lm.model.flops import flops_per_token, num_params
from lm.report.runs import ReportError, find_run_dirs, load_run, load_runs
from lm.report.table import build_rows
from lm.report.variants import check_comparable, group_variants
from tests.fixtures.runs.synthetic import loss_at, make_run


def test_finished_run_is_ok(tmp_path):
    run = load_run(make_run(tmp_path / "r", max_steps=100))
    assert run.ok and run.reason == "" and run.last_step == 100 and len(run.train) == 10


def test_unfinished_run_is_failed_with_the_error_text(tmp_path):
    d = make_run(tmp_path / "r", max_steps=200, stop_at=70)
    assert load_run(d).reason == "stopped at step 70 of 200"
    (d / "error.txt").write_text('Traceback (most recent call last):\n  File "loop.py"\nValueError: batch too big\n')
    run = load_run(d)
    assert run.status == "failed" and run.reason == "ValueError: batch too big"


def test_hydra_job_that_crashed_before_logging(tmp_path):
    """A multirun job dir with only .hydra/ and the job's log: failed, reason from the log."""
    d = tmp_path / "3"
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"train": {"max_steps": 10}}))
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["model/ffn=bogus", "seed=0"]))
    (d / "train.log").write_text(
        "[2026-01-01][lm][INFO] - start\n[2026-01-01][lm][ERROR] - ConfigError: model.ffn has no _target_\n"
    )
    run = load_run(d)
    assert run.status == "failed"
    assert run.reason == "no metrics written: [2026-01-01][lm][ERROR] - ConfigError: model.ffn has no _target_"


def test_diverged_run_is_failed(tmp_path):
    d = make_run(tmp_path / "r", max_steps=30)
    with open(d / "metrics.jsonl", "a") as f:
        f.write('{"step": 40, "loss": NaN}\n')
    assert load_run(d).reason == "loss became nan at step 40"


def test_a_nan_step_that_on_nonfinite_skip_dropped_leaves_a_finished_run_a_result(tmp_path):
    """train.on_nonfinite=skip logs the skipped step's NaN loss and trains on to max_steps: that run is a result (its
    seed counts in the variant's mean), while a run whose last losses are NaN diverged."""
    d = make_run(tmp_path / "r", max_steps=100, val_every=50)
    lines = (d / "metrics.jsonl").read_text().splitlines()
    bad = json.loads(lines[2])
    bad["loss"] = float("nan")
    lines[2] = json.dumps(bad)  # step 30
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    run = load_run(d)
    assert run.ok and run.reason == "", run.reason
    (row,) = build_rows(group_variants([run, load_run(make_run(tmp_path / "s", max_steps=100, val_every=50, seed=1))]))
    assert row["n_ok"] == 2 and row["final_loss"].mean == pytest.approx(loss_at(100, 0) + 0.1)
    with open(d / "metrics.jsonl", "a") as f:
        f.write('{"step": 110, "loss": NaN}\n{"step": 120, "loss": Infinity}\n')
    assert load_run(d).reason == "loss became nan at step 110"


def test_a_run_still_training_is_running_not_failed(tmp_path):
    """A cell whose job still holds its run_dir's lock is unfinished because it is at work: the table, the list
    below it and runs.csv say so, its seed stays out of the numbers, and once the job is gone it is a stopped run."""
    from lm.core import lock

    make_run(tmp_path / "sweep" / "0", ffn="gelu", max_steps=200)
    live = make_run(tmp_path / "sweep" / "1", ffn="swiglu", max_steps=200, stop_at=70)
    lock.acquire(live)
    try:
        run = load_run(live)
        assert (run.status, run.reason) == ("running", "at step 70 of 200")
        assert main([str(tmp_path / "sweep"), "-o", str(tmp_path / "out")]) == 0
    finally:
        lock.release(live)
    md = (tmp_path / "out" / "report.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| `model/ffn=swiglu"))
    assert row.split("|")[2].strip() == "0/1" and row.endswith("| running: at step 70 of 200 |"), row
    assert f"## Runs still training (not in the numbers yet)\n\n- `{live}`: at step 70 of 200" in md
    assert "FAILED" not in md and "## Failed runs" not in md
    rows = {r["run"]: r for r in csv.DictReader((tmp_path / "out" / "runs.csv").read_text().splitlines())}
    assert rows[str(live)]["status"] == "running"
    assert (load_run(live).status, load_run(live).reason) == ("failed", "stopped at step 70 of 200")


def test_torn_last_line_is_dropped_but_a_corrupt_middle_line_fails(tmp_path):
    d = make_run(tmp_path / "r", max_steps=30)
    with open(d / "metrics.jsonl", "a") as f:
        f.write('{"step": 40, "lo')
    run = load_run(d)
    assert run.ok and run.last_step == 30
    lines = (d / "metrics.jsonl").read_text().splitlines()
    (d / "metrics.jsonl").write_text("\n".join([lines[0], "garbage", *lines[1:]]) + "\n")
    run = load_run(d)
    assert run.status == "failed" and f"{d / 'metrics.jsonl'}:2: not valid JSON" in run.reason


def test_binary_metrics_or_results_fail_the_run_naming_the_file(tmp_path):
    for name in ("metrics.jsonl", "results.json"):
        d = make_run(tmp_path / name, max_steps=30)
        (d / name).write_bytes(b"{\xa8\x00\xff")
        run = load_run(d)
        assert run.status == "failed" and run.reason.startswith(f"{d / name}: not UTF-8 text (byte b'\\xa8' at")


@pytest.mark.parametrize("text", [b"a: [1, 2\n", b"\xb5\x00garbage"])
def test_a_damaged_config_yaml_is_one_line_naming_it(tmp_path, capsys, text):
    d = make_run(tmp_path / "r", max_steps=30)
    (d / "config.yaml").write_bytes(text)
    with pytest.raises(ReportError, match=r"config\.yaml: not valid YAML \(.*\); the file is damaged: restore it"):
        load_run(d)
    with pytest.raises(SystemExit) as e:
        main([str(d), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"lm report: error: {d / 'config.yaml'}: not valid YAML")
    assert err.count("\n") == 1


def test_sweep_with_failed_cells_still_reports(tmp_path):
    for seed in (0, 1):
        make_run(tmp_path / f"{seed}", ffn="gelu", seed=seed)
        make_run(tmp_path / f"{seed + 2}", ffn="swiglu", seed=seed, stop_at=50)
    (tmp_path / "2" / "error.txt").write_text("RuntimeError: out of memory\n")
    assert main([str(tmp_path), "-o", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    swiglu = next(line for line in md.splitlines() if line.startswith("| `model/ffn=swiglu"))
    assert swiglu.split("|")[2].strip() == "0/2"
    assert "FAILED: RuntimeError: out of memory" in swiglu
    assert f"- `{tmp_path / '3'}`: stopped at step 50 of 200" in md
    per_run = {r["run"]: r for r in csv.DictReader((tmp_path / "out" / "runs.csv").read_text().splitlines())}
    assert per_run[str(tmp_path / "2")]["status"] == "failed"
    assert float(per_run[str(tmp_path / "0")]["final_loss"]) == pytest.approx(loss_at(200, 0.0))


def test_different_budget_or_data_is_refused_unless_forced(tmp_path):
    make_run(tmp_path / "a", ffn="gelu", max_steps=200)
    make_run(tmp_path / "b", ffn="swiglu", max_steps=100)
    with pytest.raises(ReportError, match=r"(?s)train\.max_steps: 100 .*b\) vs 200 .*a\).*--force"):
        check_comparable(load_runs([tmp_path]))
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path), "-o", str(tmp_path / "out")])
    assert e.value.code == 2
    assert not (tmp_path / "out" / "report.html").exists()
    assert main([str(tmp_path), "-o", str(tmp_path / "out"), "--force"]) == 0
    assert "**forced**" in (tmp_path / "out" / "report.md").read_text()
    make_run(tmp_path / "c", ffn="gelu", max_steps=200, data="tinystories")
    with pytest.raises(ReportError, match=r"data\.name: 'shakespeare_char'.* vs 'tinystories'"):
        check_comparable(load_runs([tmp_path / "a", tmp_path / "c"]))


def test_labels_from_config_when_no_overrides(tmp_path):
    for i, (ffn, norm) in enumerate([("gelu", "layernorm"), ("swiglu", "rmsnorm"), ("swiglu", "rmsnorm")]):
        make_run(tmp_path / str(i), ffn=ffn, norm=norm, seed=i, overrides=False)
    labels = [v.label for v in group_variants(load_runs([tmp_path]))]
    assert labels == ["model/ffn=gelu model/norm=layernorm", "model/ffn=swiglu model/norm=rmsnorm"]


def test_discovery_skips_checkpoints_and_sorts_jobs_numerically(tmp_path):
    for i in (0, 2, 10):
        make_run(tmp_path / "sweep" / str(i), seed=i)
    (tmp_path / "sweep" / "10" / "checkpoints" / "step_100").mkdir(parents=True)
    (tmp_path / "sweep" / "10" / "checkpoints" / "step_100" / "config.yaml").write_text("a: 1\n")
    assert [p.name for p in find_run_dirs([tmp_path])] == ["0", "2", "10"]
    with pytest.raises(ReportError, match="no such file"):
        find_run_dirs([tmp_path / "nope"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportError, match="no run directories under"):
        find_run_dirs([tmp_path / "empty"])


def test_single_run_gets_a_run_card(tmp_path, capsys):
    d = make_run(tmp_path / "r", ffn="swiglu", norm="rmsnorm", max_steps=100, val_every=50, tokens_per_s=2048.0)
    (d / "results.json").write_text(
        json.dumps(
            {
                "columns": {"sst2": {"median": {"acc": 77.5, "score": 77.5}}},
                "glue": {"median": 77.5, "per_seed": {"0": 77.5}, "partial": True},
            }
        )
    )
    assert main([str(d)]) == 0
    md = (d / "report" / "card.md").read_text()
    cfg = model_preset("tiny", ["model/ffn=swiglu", "model/norm=rmsnorm"])
    rows = dict(
        line.strip("|").split("|")[:2] for line in md.splitlines() if line.startswith("| ") and line.count("|") == 3
    )
    rows = {k.strip(): v.strip() for k, v in rows.items()}
    assert rows["parameters"] == f"{num_params(cfg) / 1e3:.2f}k"
    assert rows["FLOPs per token (train)"] == f"{flops_per_token(cfg, 64) / 1e3:.2f}k"
    assert rows["tokens/s (median)"] == "2.05k" and rows["steps/s (median)"] == "4"  # 2048 / 512 tokens per step
    assert rows["MFU (median)"] == "0.01" and rows["peak memory (GiB)"] == "0.5"
    assert rows["final val_loss"] == f"{loss_at(100, 0) + 0.1:.4g}" and rows["GLUE score"] == "77.5"
    assert "ffn:" in md and '"median": 77.5' in md
    html = (d / "report" / "card.html").read_text()
    assert html.count("data:image/png;base64,") == 1


def test_early_validation_loss_is_the_evaluation_at_one_eighth(tmp_path):
    from lm.report.summary import early_final_loss

    run = load_run(make_run(tmp_path / "r", max_steps=400, val_every=50))
    # 1/8 of 400 steps is step 50, where the first evaluation is (not the next one, at 100)
    assert early_final_loss(run) == (
        "val_loss",
        pytest.approx(loss_at(50, 0) + 0.1),
        pytest.approx(loss_at(400, 0) + 0.1),
    )


def test_a_cell_that_failed_before_resolving_its_config_is_still_comparable(tmp_path):
    """A failed Hydra cell has only .hydra/config.yaml, with interpolations where finished runs have values."""
    make_run(tmp_path / "1", ffn="gelu")
    make_run(tmp_path / "2", ffn="swiglu")
    bad = tmp_path / "0"
    (bad / ".hydra").mkdir(parents=True)
    cfg = yaml.safe_load((tmp_path / "1" / "config.yaml").read_text())
    cfg["data"]["dir"] = "${oc.env:LM_CACHE,'~/.cache/lm'}/data/${.name}"
    (bad / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    (bad / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["model.n_heads=3"]))
    (bad / "error.txt").write_text("logged errors:\nConfigError: model.dim=64 is not divisible by model.n_heads=3\n")
    runs = load_runs([tmp_path])
    check_comparable(runs)  # the unresolved data.dir is unknown there, not different
    cfg["data"]["name"] = "tinystories"
    (bad / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(ReportError, match="data.name"):  # resolved values still count
        check_comparable(load_runs([tmp_path]))


def test_default_baseline_is_the_first_variant_that_finished(tmp_path):
    make_run(tmp_path / "0", ffn="relu", stop_at=20)
    make_run(tmp_path / "1", ffn="gelu")
    make_run(tmp_path / "2", ffn="swiglu", offset=-0.1)
    assert main([str(tmp_path), "-o", str(tmp_path / "out")]) == 0
    rows = list(csv.DictReader((tmp_path / "out" / "report.csv").read_text().splitlines()))
    assert [r["variant"] for r in rows] == ["model/ffn=relu", "model/ffn=gelu", "model/ffn=swiglu"]
    assert rows[1]["final_loss_delta"] == "" and float(rows[2]["final_loss_delta"]) == pytest.approx(-0.1)


def test_a_multi_line_error_of_a_cell_reaches_the_report_whole(tmp_path):
    """A resume refusal lists its fields below "old -> new:"; the report's reason kept only that first line."""
    import logging

    from lm.report.runs import load_run
    from lm.sweep.callbacks import _ErrorLines

    lines = _ErrorLines()
    record = logging.LogRecord("lm", logging.ERROR, __file__, 1, "ConfigError: %s", None, None)
    record.args = ("resume r: these fields differ, old -> new:\n  model.ffn.activation: 'gelu' -> 'swiglu'",)
    lines.emit(record)
    (tmp_path / "error.txt").write_text("Traceback ...\nCellExited: exit 1\nlogged errors:\n" + lines.lines[0] + "\n")
    reason = load_run(tmp_path).reason
    assert reason.endswith("old -> new: model.ffn.activation: 'gelu' -> 'swiglu'"), reason


def test_the_run_card_shows_the_last_harness_pass(tmp_path):
    """train.eval_tasks' scores reached metrics.jsonl and the dashboards but not the run card."""
    import json

    from lm.cli.report import main

    run_dir = make_run(tmp_path / "run", max_steps=20)
    with open(run_dir / "metrics.jsonl", "a") as f:
        for step, acc in ((10, 0.5), (20, 0.625)):
            record = {"step": step, "tokens": step * 512, "harness/local_sst2/acc": acc, "harness/seconds": 3.0}
            f.write(json.dumps({**record, "harness/local_wikitext2/word_perplexity": 123456.7}) + "\n")
    assert main([str(run_dir)]) == 0
    md = (run_dir / "report" / "card.md").read_text()
    assert (
        "| local_sst2/acc (step 20) | 0.625 |" in md and "| local_wikitext2/word_perplexity (step 20) | 123.46k |" in md
    )
    assert "harness/seconds" not in md and "seconds (step" not in md


def test_an_encoder_saved_before_sparse_prediction_is_costed_as_it_ran(tmp_path):
    """model.sparse_prediction (on by default since e7ce54d) was read with today's default for a config saved before
    it, whose head ran on every position: the report's FLOPs per token came out below the count its MFU was logged
    with. A config that holds the field is costed by it."""
    from dataclasses import replace

    from lm.core.objectives import training_flops_per_token
    from lm.report.summary import model_cost

    cfg = model_preset("tiny", ["model.arch=encoder"])
    dense, sparse = (training_flops_per_token(replace(cfg, sparse_prediction=s), 64, 0.15, 3.0) for s in (False, True))
    assert sparse < 0.9 * dense  # the head is a large share of a tiny encoder
    d = make_run(tmp_path / "old", model_extra=("model.arch=encoder",))
    config = yaml.safe_load((d / "config.yaml").read_text())
    assert config["model"].pop("sparse_prediction") is True
    (d / "config.yaml").write_text(yaml.safe_dump(config))
    assert model_cost(load_run(d)) == (num_params(cfg), dense)
    assert model_cost(load_run(make_run(tmp_path / "new", model_extra=("model.arch=encoder",)))) == (
        num_params(cfg),
        sparse,
    )


def test_a_recurrent_run_saved_before_sparse_prediction_keeps_its_cost(tmp_path):
    """The encoders' old sparse_prediction=false was given to every config without the field: an LSTM run saved
    before it (2026-11-24 on) then failed RNNConfig's check (a Transformer field off its default) and lost its cost."""
    from omegaconf import OmegaConf

    from lm.report.summary import model_cost

    cfg = model_preset("lstm")
    d = make_run(tmp_path / "old")
    config = yaml.safe_load((d / "config.yaml").read_text())
    config["model"] = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True, enum_to_str=True)
    assert config["model"].pop("sparse_prediction") is True
    (d / "config.yaml").write_text(yaml.safe_dump(config))
    assert model_cost(load_run(d)) == (num_params(cfg), flops_per_token(cfg, 64))
