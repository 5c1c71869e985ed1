"""lm report with GLUE probe scores (issue 52): a tiny lm train run with train.probe_interval logs real probe
scores; the run card shows the last average and draws the probes beside the loss, a sweep's plots get a probe
panel and its table a probe column, and the Narang table's Probe column holds them ("–" for a row without)."""

import json

import pytest

from lm.cli.report import main
from lm.report import plots
from lm.report.runs import load_run, load_runs
from lm.report.summary import summarize
from tests.engine_support import metrics
from tests.fixtures.runs.synthetic import make_run
from tests.test_eval_probe import run as train_with_probes
from tests.test_eval_probe import tokenizer_dir  # noqa: F401 - a prepared tokenizer (a fixture)
from tests.test_report_narang import table_lines, write_run


@pytest.fixture(scope="module")
def probed(tmp_path_factory, tokenizer_dir):  # noqa: F811
    """A real tiny run probed at steps 2 and 4 (SST-2 and STS-B), and its probe records."""
    run_dir = tmp_path_factory.mktemp("probed") / "run"
    train_with_probes(run_dir, tokenizer_dir, steps=4, probe_interval=2)
    records = [r for r in metrics(run_dir) if "probe/avg" in r]
    assert [r["step"] for r in records] == [2, 4]
    return run_dir, records


def _add_probes(run_dir, records):
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def test_the_run_card_shows_the_last_probe_average_beside_the_loss(probed):
    run_dir, records = probed
    run = load_run(run_dir)
    assert run.ok and summarize(run)["probe"] == records[-1]["probe/avg"]
    assert main([str(run_dir)]) == 0
    md = (run_dir / "report" / "card.md").read_text()
    assert f"| GLUE probe average (last) | {records[-1]['probe/avg']:.4g} |" in md
    assert (run_dir / "report" / "run_curves.png").stat().st_size > 0


def test_a_sweep_gets_a_probe_panel_and_column_empty_for_runs_without(probed, tmp_path):
    _, records = probed
    for job, ffn in enumerate(("gelu", "swiglu")):
        make_run(tmp_path / str(job), ffn=ffn, max_steps=100, val_every=50)
    assert [p[1] for p in plots.sweep_panels(load_runs([tmp_path]))] == ["loss", "val_loss"]  # no probes: as before
    _add_probes(tmp_path / "1", [{**r, "step": r["step"] * 25} for r in records])  # at steps 50 and 100 of 100
    assert [p[1] for p in plots.sweep_panels(load_runs([tmp_path]))] == ["loss", "val_loss", "probe/avg"]
    assert main([str(tmp_path)]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    head = next(line for line in md.splitlines() if line.startswith("| variant"))
    assert head.split(" | ")[-2:] == ["GLUE probe", "status |"]
    rows = {line.split(" | ")[0]: line.split(" | ") for line in md.splitlines() if line.startswith("| `")}
    assert rows["| `model/ffn=swiglu`"][-2] == f"{records[-1]['probe/avg']:.1f}"
    assert rows["| `model/ffn=gelu`"][-2] == "–"
    assert "probe_mean" in (tmp_path / "report" / "report.csv").read_text()


def test_the_narang_table_has_a_probe_column(probed, tmp_path):
    _, records = probed
    for job, (row, seed) in enumerate([("vanilla", 0), ("vanilla", 1), ("swiglu", 0), ("swiglu", 1)]):
        write_run(tmp_path / str(job), row, seed, 0.01 * job)
    for job in (0, 1):  # the vanilla rows probed (steps 100 and 200 of 200)
        _add_probes(tmp_path / str(job), [{**r, "step": r["step"] * 50} for r in records])
    assert main([str(tmp_path)]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    header = [c.strip() for c in md[md.index("| Modification") :].splitlines()[0].split("|")[2:-1]]
    rows = table_lines(md)
    assert rows["Vanilla Transformer"][header.index("Probe")] == f"{records[-1]['probe/avg']:.1f} ± 0.0"  # 2 seeds
    assert rows["SwiGLU"][header.index("Probe")] == "–"
