"""lm finetune protocol=<preset> (lm/glue/grid.py): per task every (lr, batch) cell with the first seed, the dev-best
cell chosen, that cell's median over the seeds (the choosing run one of them); results.json and results.md carry
the grid; a rerun skips finished cells, an interrupted job continues at its next cell, a grown grid reuses its cells.

The end-to-end runs: a scratch tiny decoder on two tasks (the easy SST-2-shaped task of tests/test_finetune.py and
the QQP fixture), protocol=small (a 2 x 1 grid of 1 epoch), 64 training examples each.
"""

import json
import random
import shutil
from pathlib import Path
from statistics import median

import pytest
from hydra import compose, initialize_config_dir

from lm.cli.finetune import finetune, register
from lm.config import ConfigError, conf_dir
from lm.glue import run as glue_run
from lm.glue.config import GlueTaskConfig, GridProtocol, finetune_job
from lm.glue.grid import run_grid
from lm.glue.trainer import SeedResult
from tests.glue_support import FIXTURES, TINY, finetune_cfg, sentence, write_tsv

SMALL_CELLS = ["lr0.001_bs16", "lr0.0001_bs16"]  # conf/protocol/small.yaml in grid order
RUN_ONE = glue_run._run_one  # one task/seed pair; the tests count (and kill) its calls


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """glue_data/ with the easy SST-2 task (200 train, 60 dev, 10 test) and the QQP fixture, and a BPE tokenizer."""
    from lm.data.tokenizer import train as train_tokenizer

    root = tmp_path_factory.mktemp("grid")
    rng = random.Random(0)
    for split, n in (("train", 200), ("dev", 60)):
        rows = [[sentence(rng, i % 2), i % 2] for i in range(n)]
        write_tsv(root / "glue" / "SST-2" / f"{split}.tsv", ["sentence", "label"], rows)
    write_tsv(root / "glue" / "SST-2" / "test.tsv", ["index", "sentence"], [[i, sentence(rng, 1)] for i in range(10)])
    shutil.copytree(FIXTURES / "QQP", root / "glue" / "QQP")
    texts = [sentence(rng, i % 2) for i in range(300)] + (FIXTURES / "QQP" / "train.tsv").read_text().splitlines()
    train_tokenizer("bpe", texts, vocab_size=300, n_sentinels=0).save(root / "tokenizer.json")
    return root


def grid_args(files, *extra):
    return [
        "init=none",
        *TINY,
        f"tokenizer={files / 'tokenizer.json'}",
        "task=[glue/sst2,glue/qqp]",
        f"glue.data_root={files / 'glue'}",
        "glue.max_train_examples=64",
        "tasks.sst2.max_len=24",
        "tasks.qqp.max_len=32",
        "train.threads=1",
        "protocol=small",
        *extra,
    ]


def read(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def trained_pairs(monkeypatch, fail_after: int | None = None) -> list[Path]:
    """The <task>/<cell>/seed<k> directories lm/glue/run.py trains from now on (finished ones it reads back);
    with fail_after, the job dies as the next one starts (a kill between cells)."""
    trained = []

    def counted(t, data, seed, out, *args, **kw):
        if fail_after is not None and len(trained) == fail_after:
            raise RuntimeError("killed")
        trained.append(out)
        return RUN_ONE(t, data, seed, out, *args, **kw)

    monkeypatch.setattr(glue_run, "_run_one", counted)
    return trained


@pytest.fixture(scope="module")
def whole(files, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("whole") / "ft"
    finetune(finetune_cfg(run_dir, grid_args(files)))
    return run_dir


# -- the driver alone -----------------------------------------------------------------------------------


def fake_runs(scores: dict[str, float]):
    calls = []

    def run_seeds(cfg: GlueTaskConfig, out: Path) -> list[SeedResult]:
        calls.append((out.name, cfg.lr, cfg.batch_size, cfg.epochs, list(cfg.seeds)))
        return [SeedResult(s, dev={}, main=scores[out.name] + s, best_epoch=1, test={}) for s in cfg.seeds]

    return calls, run_seeds


def test_the_dev_best_cell_is_chosen_and_runs_only_its_other_seeds(tmp_path):
    p = GridProtocol(name="t", lrs=[1e-3, 1e-4], batch_sizes=[8, 16], epochs=2, seeds=[0, 5, 7])
    scores = {"lr0.001_bs8": 50.0, "lr0.001_bs16": 40.0, "lr0.0001_bs8": 61.0, "lr0.0001_bs16": 61.0}
    calls, run_seeds = fake_runs(scores)
    g = run_grid(GlueTaskConfig(name="rte", epochs=3.0, batch_size=32), p, tmp_path, run_seeds)
    assert g.cell.name == "lr0.0001_bs8"  # the best; the tie with lr0.0001_bs16 goes to the first in grid order
    assert calls == [
        ("lr0.001_bs8", 1e-3, 8, 2, [0]),
        ("lr0.001_bs16", 1e-3, 16, 2, [0]),
        ("lr0.0001_bs8", 1e-4, 8, 2, [0]),
        ("lr0.0001_bs16", 1e-4, 16, 2, [0]),
        ("lr0.0001_bs8", 1e-4, 8, 2, [5, 7]),  # the choosing run is seed 0 of the median: not trained again
    ]
    assert [r.seed for r in g.results] == [0, 5, 7] and g.results[0] is g.scores[g.cell]
    assert (g.task.lr, g.task.batch_size, g.task.epochs, g.task.seeds) == (1e-4, 8, 2, [0, 5, 7])


def test_epochs_are_the_protocols_a_tasks_own_or_its_task_epochs():
    rte, sst2 = GlueTaskConfig(name="rte", epochs=3.0), GlueTaskConfig(name="sst2", epochs=3.0)
    p = GridProtocol(epochs=4.0, task_epochs={"rte": 10.0})
    assert (p.epochs_of(rte), p.epochs_of(sst2)) == (10.0, 4.0)
    assert GridProtocol(epochs=None).epochs_of(sst2) == 3.0


def compose_job(*overrides):
    register()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        return finetune_job(compose(config_name="finetune", overrides=["init=none", *overrides]))


def test_presets_compose_turc_is_the_papers_grid_and_bad_grids_are_one_line():
    turc = compose_job("protocol=turc").protocol
    assert (turc.lrs, turc.batch_sizes, turc.epochs, turc.seeds) == (
        [3e-4, 1e-4, 5e-5, 3e-5],
        [8, 16, 32, 64, 128],
        4.0,
        [0, 1, 2],
    )
    electra = compose_job("protocol=electra").protocol
    assert electra.batch_sizes == [32] and electra.epochs_of(GlueTaskConfig(name="stsb")) == 10.0
    assert compose_job().protocol is None  # without protocol=: one setting per task, as before
    for bad, match in (
        ("protocol.lrs=[]", r"protocol.lrs=\[\] must be distinct finite numbers > 0"),
        ("protocol.lrs=[1e-4,0.0001]", "protocol.lrs=.* distinct"),
        ("protocol.batch_sizes=[0]", "protocol.batch_sizes=.* positive"),
        ("protocol.seeds=[]", "protocol.seeds=.* distinct seeds"),
        ("+protocol.task_epochs.mnli_m=2", r"names \['mnli_m'\], not GLUE tasks"),
    ):
        with pytest.raises(ConfigError, match=match):
            compose_job("protocol=small", bad)


# -- end to end ------------------------------------------------------------------------------------------


def test_each_task_keeps_its_dev_best_cell_and_the_median_over_its_seeds(whole):
    results = read(whole)
    protocol = results["protocol"]
    assert protocol["name"] == "small" and "optimistic" in protocol["caveat"]
    assert set(protocol["tasks"]) == {"sst2", "qqp"}
    for task in ("sst2", "qqp"):
        t = protocol["tasks"][task]
        grid = {c["cell"]: c for c in t["grid"]}
        assert list(grid) == SMALL_CELLS
        best = max(c["main"] for c in grid.values())
        chosen = t["chosen"]["cell"]
        assert grid[chosen]["main"] == best and chosen == next(n for n, c in grid.items() if c["main"] == best)
        # the median is over the chosen cell's seeds 0, 1, 2, seed 0 being the run that chose it
        seeds = results["columns"][task]["seeds"]
        assert set(seeds) == {"0", "1", "2"} == set(t["seeds"])
        assert seeds["0"] == grid[chosen]["dev"][task]
        assert t["median"] == median(t["seeds"].values())
        assert results["columns"][task]["median"]["acc"] == pytest.approx(median(s["acc"] for s in seeds.values()))
        assert results["tasks"][task]["config"]["lr"] == grid[chosen]["lr"]
        for cell in SMALL_CELLS:  # every cell ran seed 0; only the chosen one ran the other seeds
            ran = sorted(p.name for p in (whole / task / cell).iterdir() if (p / "result.pt").is_file())
            assert ran == (["seed0", "seed1", "seed2"] if cell == chosen else ["seed0"])
    md = (whole / "results.md").read_text()
    assert "## Protocol `small`" in md and protocol["caveat"] in md
    assert "### SST-2: dev acc of every cell" in md and "### QQP: dev score of every cell" in md
    for t in protocol["tasks"].values():  # the chosen cell's score is bold in its grid
        assert f"**{next(c['main'] for c in t['grid'] if c['cell'] == t['chosen']['cell']):.1f}**" in md


def test_a_rerun_skips_every_finished_cell(files, whole, monkeypatch):
    before = read(whole)
    trained = trained_pairs(monkeypatch)
    finetune(finetune_cfg(whole, grid_args(files)))
    assert trained == [] and read(whole) == before


def test_a_finished_cell_of_other_settings_refuses_the_job_before_any_cell_trains(files, whole, tmp_path, monkeypatch):
    """sst2's cells gone (they would train first), qqp's finished at max_len 32 and asked at 24: refused up front,
    the run_dir as it was but for .lock (tests/test_finetune_refused_job.py)."""
    run_dir = tmp_path / "ft"
    shutil.copytree(whole, run_dir)
    shutil.rmtree(run_dir / "sst2")
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".lock"}
    trained = trained_pairs(monkeypatch)
    with pytest.raises(ConfigError, match=r"tasks?\.max_len: 32 -> 24") as e:
        finetune(finetune_cfg(run_dir, grid_args(files, "tasks.qqp.max_len=24")))
    assert f"cannot reuse the finished {run_dir / 'qqp' / SMALL_CELLS[0] / 'seed0' / 'result.pt'} " in str(e.value)
    assert trained == [] and not (run_dir / "sst2").exists()
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".lock"} == before


def test_a_job_killed_between_cells_continues_at_the_next_and_a_grown_grid_reuses_its_cells(
    files, whole, tmp_path, monkeypatch
):
    run_dir = tmp_path / "ft"
    first = trained_pairs(monkeypatch, fail_after=3)  # sst2's two cells and its chosen cell's seed 1
    with pytest.raises(RuntimeError, match="killed"):
        finetune(finetune_cfg(run_dir, grid_args(files)))
    assert len(first) == 3 and not (run_dir / "results.json").exists()
    again = trained_pairs(monkeypatch)
    finetune(finetune_cfg(run_dir, grid_args(files)))
    chosen = read(run_dir)["protocol"]["tasks"]["sst2"]["chosen"]["cell"]
    assert again[0] == run_dir / "sst2" / chosen / "seed2" and len(again) == 1 + 4  # then qqp's 2 cells + 2 seeds
    assert not set(again) & set(first)
    for key in ("columns", "protocol"):  # what an uninterrupted job gave
        assert read(run_dir)[key] == read(whole)[key]
    # a grid grown by an lr: its finished cells are read back; only the new cell trains (and, where it wins, its seeds)
    grown = trained_pairs(monkeypatch)
    finetune(finetune_cfg(run_dir, grid_args(files, "protocol.lrs=[1e-3,1e-4,3e-3]")))
    tasks = read(run_dir)["protocol"]["tasks"]
    expected = {
        run_dir / task / "lr0.003_bs16" / f"seed{s}"
        for task in ("sst2", "qqp")
        for s in ((0, 1, 2) if tasks[task]["chosen"]["cell"] == "lr0.003_bs16" else (0,))
    }
    assert set(grown) == expected and len(grown) == len(expected)
    assert [c["cell"] for c in tasks["sst2"]["grid"]] == [*SMALL_CELLS, "lr0.003_bs16"]


@pytest.mark.slow  # two more grids (~30 s); the pair's exact resume is tests/test_finetune_kill_resume.py's
def test_a_cell_killed_mid_training_resumes_from_its_checkpoint(files, whole, tmp_path, monkeypatch, caplog):
    import lm.glue.trainer as trainer

    run_dir, args = tmp_path / "ft", grid_args(files, "train.ckpt_interval=2")  # 4 steps a cell: a checkpoint at 2
    calls, loss = [], trainer.GlueTask.loss

    def dies_at_step_3(self, *a, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("killed")
        return loss(self, *a, **kw)

    monkeypatch.setattr(trainer.GlueTask, "loss", dies_at_step_3)
    with pytest.raises(RuntimeError, match="killed"):
        finetune(finetune_cfg(run_dir, args))
    assert (run_dir / "sst2" / SMALL_CELLS[0] / "seed0" / "checkpoints").is_dir()
    monkeypatch.setattr(trainer.GlueTask, "loss", loss)
    with caplog.at_level("INFO", logger="lm"):
        finetune(finetune_cfg(run_dir, args))
    assert "GLUE sst2 seed 0: resumed from" in caplog.text and "(step 2/4)" in caplog.text
    for key in ("columns", "protocol"):  # what an uninterrupted job gave
        assert read(run_dir)[key] == read(whole)[key]
