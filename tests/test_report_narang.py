"""lm report on a synthetic experiment=narang sweep: Table 1's layout (paper order and labels, the
paper's columns, deltas against the vanilla row, early loss at 1/4 of the steps), and the rows
module as data that Hydra composes."""

import json

import pytest
import yaml
from omegaconf import OmegaConf

from lm.cli.report import main
from lm.core.objectives import training_flops_per_token
from lm.model.config import model_preset
from lm.model.flops import flops_per_token, num_params
from lm.sweep.narang_rows import BANDS, HALVES, PAPER_ORDER, ROWS, by_name, row_node
from tests.fixtures.runs.synthetic import loss_at

EFFECT = {"transparent_attention": 0.02, "swiglu": -0.1, "vanilla": 0.0, "adaptive_softmax": 0.05}  # job order
SEEDS = {0: -0.01, 1: 0.01}
MAX_STEPS, VAL_EVERY = 200, 50


def write_run(run_dir, row, seed, offset, glue=None):
    from omegaconf import OmegaConf

    run_dir.mkdir(parents=True)
    base = ["model.arch=encoder_decoder", "model.n_layers=1", "model.n_decoder_layers=1"]
    cfg = model_preset("tiny", base + by_name()[row].overrides)
    config = {
        "model": OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True),
        "seed": seed,
        "data": {"name": "tinystories_sample_bpe"},
        "run_dir": str(run_dir),
        "train": {"seq_len": 64, "max_steps": MAX_STEPS, "micro_batch_size": 8},
    }
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "overrides.yaml").write_text(
        yaml.safe_dump([f"experiment/narang_row={row}", f"seed={seed}", "experiment=narang"])
    )
    with open(run_dir / "metrics.jsonl", "w") as f:
        for step in range(10, MAX_STEPS + 1, 10):
            f.write(
                json.dumps(
                    {"step": step, "loss": loss_at(step, offset), "steps_per_s": 2.0 + seed, "tokens_per_s": 1024.0}
                )
                + "\n"
            )
            if step % VAL_EVERY == 0:
                f.write(json.dumps({"step": step, "val_loss": loss_at(step, offset)}) + "\n")
    if glue is not None:
        (run_dir / "results.json").write_text(json.dumps({"glue": {"median": glue}}))
    return cfg


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("narang")
    cfgs, job = {}, 0
    for row, effect in EFFECT.items():
        for seed, noise in SEEDS.items():
            cfgs[row] = write_run(root / str(job), row, seed, effect + noise, glue=70.0 - 10 * effect)
            job += 1
    assert main([str(root)]) == 0
    return root, cfgs


def table_lines(md: str) -> dict:
    start = md.index("| Modification")
    lines = [line for line in md[start:].splitlines() if line.startswith("| ")][1:]
    return {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in lines}


def test_rows_in_the_papers_order_with_its_labels_and_columns(sweep):
    root, _ = sweep
    md = (root / "report" / "report.md").read_text()
    header = md[md.index("| Modification") :].splitlines()[0]
    assert [c.strip() for c in header.split("|")[1:-1]] == [
        "Modification",
        "Seeds",
        "Params",
        "Ops",
        "Steps/s",
        "Early loss",
        "Final loss",
        "Δ early",
        "Δ final",
        "Probe",
        "GLUE",
        "Δ GLUE",
        "Status",
    ]
    rows = table_lines(md)
    assert list(rows) == ["Vanilla Transformer", "SwiGLU", "Adaptive softmax", "Transparent attention"]
    assert rows["Vanilla Transformer"][6] == "(baseline)"  # Δ early
    assert "Swish" in md[md.index("Rows of Table 1 not in this sweep") :]  # narang_a's, not in this sweep


def test_numbers_deltas_and_early_loss_at_a_quarter(sweep):
    root, cfgs = sweep
    rows = table_lines((root / "report" / "report.md").read_text())
    early_vanilla = loss_at(MAX_STEPS // 4, 0.0)  # the evaluation at step 50 (mean over seeds: noise cancels)
    assert rows["Vanilla Transformer"][4].startswith(f"{early_vanilla:.3f}")
    assert rows["SwiGLU"][7].startswith("-0.100")  # Δ final against vanilla
    assert rows["SwiGLU"][6].startswith("-0.100")  # Δ early
    assert rows["Adaptive softmax"][7].startswith("+0.050")
    assert rows["SwiGLU"][3] == "2.50 ± 0.71"  # steps/s: seeds 2.0 and 3.0
    assert rows["SwiGLU"][10].startswith("+1.00")  # Δ GLUE: 71.0 vs 70.0
    assert rows["SwiGLU"][8] == "–"  # Probe: these runs logged none (tests/test_report_probe.py has some)
    csv_rows = (root / "report" / "report.csv").read_text().splitlines()
    by_variant = {line.split(",")[0]: line.split(",") for line in csv_rows[1:]}
    for row, cfg in cfgs.items():
        rec = by_variant[f"experiment/narang_row={row}"]
        # Params; Ops as lm train's MFU counts them: span corruption's lengths (the data section's defaults)
        assert int(rec[3]) == num_params(cfg)
        assert float(rec[4]) == pytest.approx(training_flops_per_token(cfg, 64, 0.15, 3.0), rel=1e-12)
        assert float(rec[4]) < flops_per_token(cfg, 64) / 2  # not every token through both stacks


@pytest.mark.slow  # composes ~50 rows through Hydra (~1 min); CI's slow stage runs it
def test_every_row_composes_and_names_a_paper_row():
    from lm.config import compose_group

    assert len({r.name for r in ROWS}) == len(ROWS)
    assert all(r.paper in PAPER_ORDER for r in ROWS)
    assert [PAPER_ORDER.index(r.paper) for r in ROWS] == sorted(PAPER_ORDER.index(r.paper) for r in ROWS)
    node = row_node(by_name()["adaptive_softmax_no_proj"])
    assert node == {
        "defaults": [{"override /model/output": "adaptive_softmax"}, "_self_"],
        "model": {"output": {"cutoffs": yaml.safe_load(BANDS), "tail_projection": False}, "tie_embeddings": False},
    }
    assert row_node(by_name()["swiglu"])["defaults"] == [{"override /model/ffn": "swiglu"}, "_self_"]
    for row in ROWS:  # each row through lm train's composition of experiment=narang
        cfg = compose_experiment(row.name)
        assert cfg.model.arch == "encoder_decoder"
        for o in row.overrides:
            key, value = o.split("=", 1)
            if "/" in key:  # model/ffn=swiglu, or model/ffn@model.ffn.expert=relu (a nested node's package)
                group, _, package = key.partition("@")
                node = OmegaConf.select(cfg, package or group.replace("/", "."))
                assert node["_target_"] == compose_group(group, value)._target_, (row.name, o)
            else:  # model.x=1, model.attn.mix=plus, model.block.layers=[1]
                expected = OmegaConf.select(cfg, value[2:-1]) if value.startswith("${") else yaml.safe_load(value)
                if value == BANDS:  # the adaptive rows' band edges: [V/8, V/2] of the experiment's vocabulary
                    expected = [cfg.model.vocab_size // 8, cfg.model.vocab_size // 2]
                if value == HALVES:  # the funnel row's groups: half of the layers each
                    expected = [cfg.model.n_layers // 2] * 2
                actual = OmegaConf.select(cfg, key)
                if OmegaConf.is_list(actual):
                    actual = list(actual)
                assert str(actual).lower() == str(expected).lower(), (row.name, o)


@pytest.mark.parametrize("experiment,bands", [("narang", [512, 2048]), ("narang_gpu", [4096, 16384])])
def test_the_adaptive_rows_keep_each_experiments_band_edges(experiment, bands):
    """The edges experiment=narang and narang_gpu set as model.adaptive_cutoffs before the adaptive options moved to
    the zoo (lm/zoo/adaptive.py): the rows now derive them from the experiment's vocabulary."""
    for row, slot in (
        ("adaptive_input", "embedding"),
        ("adaptive_softmax", "output"),
        ("adaptive_softmax_no_proj", "output"),
    ):
        cfg = compose_experiment(row, experiment)
        assert list(OmegaConf.select(cfg, f"model.{slot}.cutoffs")) == bands, row


@pytest.mark.parametrize("experiment", ["narang", "narang_gpu"])
def test_every_row_of_both_sizes_is_a_valid_model(experiment):
    """Each row's overrides hold at both bases (2 + 2 layers of width 128, 6 + 6 of 512): none is refused before it
    trains (the funnel row's groups once summed to the CPU base's 2 layers only)."""
    from lm.model.validate import refuse_unread, validate_model

    for row in ROWS:
        model = OmegaConf.to_object(compose_experiment(row.name, experiment).model)
        validate_model(model)
        refuse_unread(model)


def compose_experiment(row: str, experiment: str = "narang"):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from lm.config import conf_dir, register_train_configs

    register_train_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        return compose(config_name="train", overrides=[f"experiment={experiment}", f"experiment/narang_row={row}"])
