"""lm transfer: pretraining then both finetuning arms in one call on a tiny budget, the table's numbers,
the curve report, the presets, and the refusals (another tokenizer or model for finetuning, a shared
scratch arm of another recipe)."""

import json
import random
import re
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from lm.cli.transfer import run_transfer
from lm.cli.transfer_recipe import Recipe, TransferError, check_finetune_overrides, pretrain_config, tokens_per_step
from lm.report.transfer import compare, curve_table, find_transfers, transfer_table, write_curve_report
from tests.benchmark_scripts import load
from tests.engine_support import metrics
from tests.test_finetune import easy_glue, sentence  # noqa: F401 - the easy SST-2-shaped task (a fixture)

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


def test_presets_are_one_size_two_objectives():
    from lm.model import build_model

    sizes = {}
    for preset in ("glue_transfer_decoder", "glue_transfer_encoder"):
        cfg = pretrain_config(Recipe(preset=preset, out=Path("/tmp/unused")))
        model = OmegaConf.to_object(cfg.model)
        sizes[str(model.arch)] = sum(p.numel() for p in build_model(model).parameters())
        assert cfg.data.name == "gutenberg_mix_bpe" and tokens_per_step(cfg) == 16 * 128
        assert (model.dim, model.n_layers, model.vocab_size) == (256, 4, 8192)
        # the encoder's RoPE: learned absolute positions left MLM at the unigram plateau (conf/experiment/...)
        assert cfg.model.pos._target_.endswith("RoPE" if preset.endswith("encoder") else "Learned")
    assert abs(sizes["encoder"] - sizes["decoder"]) / sizes["decoder"] < 0.01  # the MLM head's bias only


def test_the_gpu_preset_is_issue_17s_size():
    """20-50M parameters, bf16, the encoder arm's model family at 256 x 128 tokens a step."""
    from lm.model import build_model

    cfg = pretrain_config(Recipe(preset="glue_transfer_gpu", out=Path("/tmp/unused")))
    n = sum(p.numel() for p in build_model(OmegaConf.to_object(cfg.model)).parameters())
    assert 20e6 < n < 50e6 and cfg.model.arch == "encoder" and cfg.model.pos._target_.endswith("RoPE")
    assert tokens_per_step(cfg) == 256 * 128 and cfg.train.precision == "bf16"
    assert cfg.data.name == "gutenberg_shards_bpe"  # the CPU arms' corpus, from the shards the mirror holds


def test_the_shards_corpus_reads_the_gutenberg_shards_present(tmp_path, monkeypatch):
    """data=gutenberg_shards_bpe globs the mirror's shards (the GPU device carries a subset), and its
    validation is Gutenberg's own validation file."""
    from lm.data.prepare import resolve

    books = tmp_path / "text" / "gutenberg"
    books.mkdir(parents=True)
    for name in (
        "train-00000-of-00010.jsonl.zst",
        "train-00003-of-00010.jsonl.zst",
        "validation-00000-of-00001.jsonl.zst",
    ):
        (books / name).write_bytes(b"")
    monkeypatch.setenv("LM_DATA_MIRROR", str(tmp_path))
    d = OmegaConf.to_object(pretrain_config(Recipe(preset="glue_transfer_gpu", out=Path("/tmp/unused"))).data)
    assert d.source[-1] == f"{tmp_path}/text/gutenberg/train-*.jsonl.zst"
    train = [
        Path(str(f.path)).name
        for f in resolve(d.source[-1:], d.format, split="train", mirror=d.mirror, hf_split=d.hf_split)[0]
    ]
    assert train == ["train-00000-of-00010.jsonl.zst", "train-00003-of-00010.jsonl.zst"]
    assert Path(d.val_source).name == "validation-00000-of-00001.jsonl.zst"


def test_electra_shares_the_encoder_scratch_arm():
    """ELECTRA's discriminator is finetuned as the plain encoder, so the scratch arm an ELECTRA recipe records
    (and would train) is the encoder recipe's: the curve shares one instead of training the same arm twice."""
    from lm.cli.transfer_arms import same_value
    from lm.cli.transfer_recipe import finetuned_model_node

    nodes = {
        p: pretrain_config(Recipe(preset=f"glue_transfer_{p}", out=Path("/tmp/unused"))).model
        for p in ("encoder", "electra")
    }
    assert nodes["electra"].family is not None and nodes["encoder"].family is None
    as_dict = {p: OmegaConf.to_container(finetuned_model_node(n), resolve=True) for p, n in nodes.items()}
    assert as_dict["electra"] == as_dict["encoder"] and same_value("model", as_dict["encoder"], as_dict["electra"])
    assert nodes["electra"].family is not None  # the pretraining config itself is left alone


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


@pytest.mark.slow
def test_the_curve_script_end_to_end_tiny(tmp_path):
    import os
    import subprocess
    import sys

    doc = tmp_path / "page.md"
    doc.write_text("# page\n<!-- curve:begin -->\n<!-- curve:end -->\n")
    env = {**os.environ, "LM_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [
            sys.executable,
            "benchmarks/glue_transfer_curve.py",
            "--tiny",
            "--arches",
            "decoder",
            "--tokens",
            "0,20000",
            "--tasks",
            "rte",
            "--root",
            str(tmp_path / "runs"),
            "--doc",
            str(doc),
            "--scratch-archive",
            str(tmp_path / "scratch_archive"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
        cwd=Path(__file__).parents[1],
    )
    assert out.returncode == 0, out.stderr[-3000:]
    text = doc.read_text()
    assert "| decoder (mean, learned) | 0 | – | – | +0.0 | **+0.0** |" in text  # no val loss, no probe
    assert "| decoder (mean, learned) | 20,480 |" in text
    assert (tmp_path / "page.png").is_file() and "lm transfer --preset glue_transfer_decoder --tokens 20000" in text
    # the next session (runs/ gone) restores the archived scratch arm instead of training it again
    # (the --tiny overrides are part of the archive's key: decoder-mean-learned-<their digest>)
    [point] = (tmp_path / "runs" / "points").glob("decoder-mean-learned-*/20480/transfer.json")
    first = json.loads(point.read_text())["comparison"]
    again = subprocess.run(
        [
            sys.executable,
            "benchmarks/glue_transfer_curve.py",
            "--tiny",
            "--arches",
            "decoder",
            "--tokens",
            "20000",
            "--tasks",
            "rte",
            "--root",
            str(tmp_path / "runs2"),
            "--archive",
            str(tmp_path / "runs" / "points"),
            "--doc",
            str(doc),
            "--scratch-archive",
            str(tmp_path / "scratch_archive"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
        cwd=Path(__file__).parents[1],
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "finetuning from scratch" in again.stderr and "restored from" in again.stderr
    assert f"GLUE rte seed 0: done in an earlier run ({tmp_path / 'runs2' / 'decoder' / 'scratch'}" in again.stderr
    second = json.loads(point.read_text())
    assert second["comparison"] == first  # the same scratch arm; the pretrained arm reproduces too
    assert second["scratch_measured"]["run_dir"] == str(tmp_path / "runs" / "decoder" / "scratch")


def test_a_shared_scratch_arm_recorded_before_a_new_model_field_still_matches(tmp_path):
    """A scratch arm's transfer_arm.json written before ModelConfig grew a field (model.family) holds a
    model node without it; the same model now must match it, and a different model must not."""
    from dataclasses import asdict

    from lm.cli.transfer_arms import check_scratch_arm
    from lm.model.config import model_preset

    node = json.loads(json.dumps(asdict(model_preset("tiny", ["model.dim=32"])), default=str))
    r = Recipe(out=tmp_path / "run", scratch=tmp_path / "scratch")
    r.scratch.mkdir()
    old = {k: v for k, v in node.items() if k != "family"}
    (r.scratch / "transfer_arm.json").write_text(json.dumps({"pooling": "mean", "model": old}))
    check_scratch_arm(r, {"pooling": "mean", "model": node})  # the same model: accepted
    with pytest.raises(TransferError, match=r"differs in \['model'\]"):
        check_scratch_arm(r, {"pooling": "mean", "model": {**node, "dim": 64}})


def test_a_damaged_scratch_arm_record_is_one_line_and_kept(tmp_path):
    """A transfer_arm.json cut short or not a JSON object is refused naming it and the fix (it was a JSONDecodeError
    or AttributeError traceback); the file is left as it was."""
    from lm.cli.transfer_arms import check_scratch_arm

    r = Recipe(out=tmp_path / "run", scratch=tmp_path / "scratch")
    r.scratch.mkdir()
    path = r.scratch / "transfer_arm.json"
    for text in ('{"tokenizer_sha', "[1]"):
        path.write_text(text)
        with pytest.raises(TransferError, match=rf"{re.escape(str(path))} is damaged .* Delete it and the same"):
            check_scratch_arm(r, {"pooling": "mean"})
        assert path.read_text() == text


def test_the_budget_reads_the_similarity_pairs_apart_and_an_override_wins(tmp_path):
    """Both arms read MRPC's and STS-B's pairs as siamese pairs and RTE's as one text (the budget); a --finetune
    override of pair_input wins; a scratch arm recorded under another budget (or before the budget was recorded)
    is not shared."""
    from lm.cli.transfer_arms import check_scratch_arm
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
    assert [o for o in budget(["sst2", "stsb"]) if "pair_input" in o] == ["tasks.stsb.pair_input=siamese"]
    assert "train.precision=auto" in budget(["sst2"])  # bf16 where the device has it, as the pretraining

    r = Recipe(out=tmp_path / "run", scratch=tmp_path / "scratch")
    r.scratch.mkdir()
    (r.scratch / "transfer_arm.json").write_text(json.dumps({"pooling": "mean"}))  # recorded before the budget was
    with pytest.raises(TransferError, match=r"differs in \['budget'\]"):
        check_scratch_arm(r, {"pooling": "mean", "budget": budget(["stsb"])})


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


def _gpu_transfer_tiny(tmp_path, data_mirror, out_name="out", **env_extra):
    """benchmarks/gpu_transfer.sh on the CPU with a tiny model and 1 seed; returns OUT (tmp_path/out_name).
    Calls in one tmp_path share the mirror, the cache and (unless RUN_DIR is given) the run directory."""
    import os
    import subprocess

    repo = Path(__file__).parents[1]
    mirror_home = tmp_path / "mirror"
    if not mirror_home.is_dir():
        mirror_home.mkdir()
        subprocess.run(
            ["bash", str(repo / "benchmarks" / "gpu_transfer_data.sh"), "1", str(data_mirror)],
            cwd=mirror_home,
            check=True,
            capture_output=True,
            timeout=300,
        )
    few = dict.fromkeys(("cola", "mrpc", "stsb", "rte"), "100")
    env = {
        **os.environ,
        "LM_CACHE": str(tmp_path / "cache"),
        "LM_DATA_MIRROR": str(mirror_home / ".gpu_data"),
        "RUN_DIR": str(tmp_path / "run"),
        "TOKENS": "20000",
        "LIMIT": "900",
        "COMPILE": "0",
        "FINETUNE_SST2": "tasks.sst2.max_train_examples=200 tasks.sst2.epochs=1",
        "FINETUNE_OTHER": " ".join(f"tasks.{t}.max_train_examples={n} tasks.{t}.epochs=1" for t, n in few.items()),
        **env_extra,
    }
    out = tmp_path / out_name
    done = subprocess.run(
        [
            "bash",
            "benchmarks/gpu_transfer.sh",
            str(out),
            "--seeds",
            "0",
            "--pretrain",
            "model.dim=32",
            "model.n_layers=1",
            "model.n_heads=2",
            "train.micro_batch_size=8",
            "train.precision=fp32",
            "train.eval_batches=2",
        ],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


@pytest.mark.slow
def test_the_gpu_transfer_script_runs_its_four_lanes_and_merges_them_tiny(tmp_path, data_mirror):
    """benchmarks/gpu_transfer.sh on the CPU with a tiny model: the four lanes run, the second lanes' task
    directories merge into the first lanes' arms, and the table's call finds every task/seed pair finished
    (nothing is trained twice); OUT holds five files (a device call brings back at most 8)."""
    import tarfile

    out = _gpu_transfer_tiny(tmp_path, data_mirror)
    assert sorted(p.name for p in out.iterdir()) == [
        "details.tgz",
        "env.txt",
        "log.txt",
        "transfer.json",
        "transfer.md",
    ]
    summary = json.loads((out / "transfer.json").read_text())
    rows = summary["comparison"]["tasks"]
    assert sorted(rows) == ["cola", "mrpc", "rte", "sst2", "stsb"]
    with tarfile.open(out / "details.tgz") as tar:
        table_log = tar.extractfile("details/table.log").read().decode()
        names = set(tar.getnames())
    assert {"details/scratch_sst2.log", "details/pretrained_other.log", "details/pretrain_metrics.jsonl"} <= names
    assert table_log.count("done in an earlier run") == 10  # 5 tasks x 2 arms x 1 seed, none trained again
    assert "lm transfer (the table) exit status 0" in (out / "log.txt").read_text()


@pytest.mark.slow
def test_the_gpu_transfer_script_narrowed_to_some_scratch_tasks_tiny(tmp_path, data_mirror):
    """SCRATCH_SST2=0 SCRATCH_TASKS=cola,stsb: the scratch arm finetunes only CoLA and STS-B (the other tasks'
    overrides are dropped from its lane, which would refuse them), the pretrained arm all five, and no table is
    written (it needs every task in both arms): the lanes' results come back in details.tgz, and the pretrained
    arm's record, whole, in OUT."""
    import tarfile

    out = _gpu_transfer_tiny(tmp_path, data_mirror, SCRATCH_SST2="0", SCRATCH_TASKS="cola,stsb", COMPILE="1")
    assert sorted(p.name for p in out.iterdir()) == ["details.tgz", "env.txt", "log.txt", "transfer_pretrained.json"]
    with tarfile.open(out / "details.tgz") as tar:
        results = {
            n: json.loads(tar.extractfile(f"details/{n}_results.json").read())["columns"]
            for n in ("scratch_other", "pretrained_other", "pretrained")
        }
        names = set(tar.getnames())
    assert "details/scratch_sst2.log" not in names
    assert sorted(results["scratch_other"]) == ["cola", "stsb"]
    assert sorted(results["pretrained_other"]) == ["cola", "mrpc", "rte", "stsb"]
    assert sorted(results["pretrained"]) == ["cola", "mrpc", "rte", "sst2", "stsb"]  # the arm, whole
    log = (out / "log.txt").read_text()
    assert "lanes finished (any failed or stopped: 0)" in log and "the table" not in log
    record = json.loads((out / "transfer_pretrained.json").read_text())
    assert sorted(record["results"]["columns"]) == ["cola", "mrpc", "rte", "sst2", "stsb"]  # whole: for --join
    # COMPILE=1: the pretraining compiled, after the call's own --pretrain overrides
    assert record["recipe"]["pretrain_overrides"][-2:] == ["train.eval_batches=2", "train.compile=true"]


@pytest.mark.slow
def test_the_gpu_transfer_script_one_arm_per_call_tiny(tmp_path, data_mirror):
    """ARMS=pretrained, then ARMS=scratch on the same machine (RUN_DIR): the second call finds the first's arm
    whole and writes the table, training nothing twice. ARMS=scratch on another machine (a fresh RUN_DIR) brings
    back its arm's record instead, which lm transfer --join puts together with the first call's into the same
    table."""
    import tarfile

    from lm.cli.transfer_join import join_arms

    first = _gpu_transfer_tiny(tmp_path, data_mirror, "first", ARMS="pretrained")
    assert sorted(p.name for p in first.iterdir()) == ["details.tgz", "env.txt", "log.txt", "transfer_pretrained.json"]
    with tarfile.open(first / "details.tgz") as tar:
        assert not any("scratch_" in n for n in tar.getnames())  # no scratch lane ran
    second = _gpu_transfer_tiny(tmp_path, data_mirror, "second", ARMS="scratch")
    assert sorted(p.name for p in second.iterdir()) == [
        "details.tgz",
        "env.txt",
        "log.txt",
        "transfer.json",
        "transfer.md",
    ]
    with tarfile.open(second / "details.tgz") as tar:
        assert tar.extractfile("details/table.log").read().decode().count("done in an earlier run") == 10
        assert not {"details/pretrained_sst2.log", "details/pretrained_other.log"} & set(tar.getnames())  # no lane
    elsewhere = _gpu_transfer_tiny(tmp_path, data_mirror, "elsewhere", ARMS="scratch", RUN_DIR=str(tmp_path / "run2"))
    assert sorted(p.name for p in elsewhere.iterdir()) == ["details.tgz", "env.txt", "log.txt", "transfer_scratch.json"]
    joined = join_arms([first / "transfer_pretrained.json", elsewhere / "transfer_scratch.json"], tmp_path / "j", "")
    table = json.loads((second / "transfer.json").read_text())
    assert joined["comparison"] == table["comparison"]
    assert joined["recipe"]["val_loss"] == table["recipe"]["val_loss"] is not None
