"""The ready-made sweeps (conf/experiment/ablate_*.yaml) and the launcher configs compose, every cell
of every sweep makes a model, and the sizes are matched where the experiment says so."""

import functools
import itertools

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from lm.config import conf_dir, register_train_configs
from lm.model import build_model
from lm.model.flops import num_params
from lm.report.table import PARAM_MISMATCH

EXPERIMENTS = sorted(p.stem for p in (conf_dir() / "experiment").glob("ablate_*.yaml") if p.stem != "ablate_base")


@pytest.fixture(scope="module")
def hydra_conf():
    register_train_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        yield
    _compose.cache_clear()
    GlobalHydra.instance().clear()


def compose_train(overrides):
    return _compose(tuple(overrides)).copy()


@functools.cache
def _compose(overrides: tuple):
    return compose("train", overrides=list(overrides), return_hydra_config=True)


def sweep_params(cfg) -> dict:
    return {k: str(v).split(",") for k, v in cfg.hydra.sweeper.params.items()}


def cells(experiment: str) -> list:
    """Every cell of the experiment's sweep, as override lists (seeds left out: they do not change the model)."""
    params = sweep_params(compose_train([f"experiment={experiment}"]))
    assert params.pop("seed") == ["0", "1", "2"], f"{experiment}: 3 seeds per cell"
    keys = list(params)
    return [[f"{k}={v}" for k, v in zip(keys, values)] for values in itertools.product(*params.values())]


def params_of(experiment: str, cell: list) -> int:
    cfg = compose_train([f"experiment={experiment}", *cell])
    return num_params(OmegaConf.to_object(cfg.model))


def test_every_experiment_is_a_sweep_of_deltas(hydra_conf):
    assert set(EXPERIMENTS) >= {"ablate_ffn", "ablate_ffn_norm", "ablate_norm", "ablate_pos", "ablate_arch"}
    for name in EXPERIMENTS:
        text = (conf_dir() / "experiment" / f"{name}.yaml").read_text()
        assert len([line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]) <= 20, (
            name
        )
        cfg = compose_train([f"experiment={name}"])
        assert str(cfg.logger.group).startswith(f"{name}_") and cfg.hydra.sweep.dir == f"runs/{cfg.logger.group}"
        assert cfg.hydra.launcher._target_ == "hydra_plugins.lm_launchers.sequential.Sequential"
        assert cfg.hydra.output_subdir == ".hydra"
        assert [c._target_ for c in cfg.hydra.callbacks.values()] == [
            "lm.sweep.callbacks.OwnSweepDir",  # conf/train.yaml: runs/ablate_<stamp> is this sweep's alone
            "lm.sweep.callbacks.RecordFailure",
        ]


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_cell_builds_a_model(hydra_conf, experiment):
    for cell in cells(experiment):
        cfg = compose_train([f"experiment={experiment}", *cell])
        model = build_model(OmegaConf.to_object(cfg.model))
        assert sum(p.numel() for p in model.parameters()) == num_params(OmegaConf.to_object(cfg.model)), cell


@pytest.mark.parametrize("experiment", ["ablate_ffn", "ablate_ffn_norm", "ablate_norm", "ablate_arch"])
def test_parameter_matched(hydra_conf, experiment):
    sizes = {" ".join(c): params_of(experiment, c) for c in cells(experiment)}
    base = next(iter(sizes.values()))
    assert all(abs(n / base - 1) <= PARAM_MISMATCH for n in sizes.values()), sizes


def test_arch_cells(hydra_conf):
    models = {}
    for cell in cells("ablate_arch"):
        models[cell[0]] = OmegaConf.to_object(compose_train(["experiment=ablate_arch", *cell]).model)
    dec, enc, encdec = (models[f"experiment/ablate_arch={a}"] for a in ("decoder", "encoder", "encoder_decoder"))
    assert (dec.arch, dec.n_layers) == ("decoder", 7) and (enc.arch, enc.n_layers) == ("encoder", 7)
    assert (encdec.arch, encdec.n_layers, encdec.n_decoder_layers) == ("encoder_decoder", 3, 3)
    assert {m.pos._target_ for m in models.values()} == {"lm.model.position.T5Bias"}
    # 3*12 d^2 + 3*16 d^2 (cross-attention) = 7*12 d^2: equal to within norms and biases
    assert abs(num_params(encdec) / num_params(dec) - 1) < 0.005


def test_pos_sizes_differ_only_by_the_learned_table(hydra_conf):
    sizes = {c[0].split("=")[1]: params_of("ablate_pos", c) for c in cells("ablate_pos")}
    assert set(sizes) == {"learned", "sinusoidal", "rope", "alibi", "t5_bias", "none"}
    m = OmegaConf.to_object(compose_train(["experiment=ablate_pos"]).model)
    assert sizes["learned"] - sizes["none"] == m.max_seq_len * m.dim
    assert sizes["rope"] == sizes["alibi"] == sizes["sinusoidal"] == sizes["none"]
    assert sizes["t5_bias"] - sizes["none"] == 32 * m.n_heads  # one bias per bucket and head, shared by the layers


def test_norm_cells_cover_type_and_placement(hydra_conf):
    got = set()
    for cell in cells("ablate_norm"):
        cfg = compose_train(["experiment=ablate_norm", *cell])
        got.add((cfg.model.norm._target_.rsplit(".", 1)[1], cfg.model.norm_position))
    assert got == {(n, p) for n in ("LayerNorm", "RMSNorm") for p in ("pre", "post")}


def test_cell_overrides_are_its_tags(hydra_conf):
    from hydra.core.hydra_config import HydraConfig

    cfg = compose(
        "train", overrides=["experiment=ablate_ffn_norm", "model/ffn=swiglu", "seed=2"], return_hydra_config=True
    )
    HydraConfig.instance().set_config(cfg)
    assert list(cfg.logger.tags) == ["experiment=ablate_ffn_norm", "model/ffn=swiglu", "seed=2"]


@pytest.mark.parametrize("launcher", ["local_gpus", "slurm"])
def test_submitit_launchers_compose_and_instantiate(hydra_conf, launcher):
    from hydra.utils import instantiate

    cfg = compose_train(["experiment=ablate_ffn_norm", f"hydra/launcher={launcher}"])
    node = cfg.hydra.launcher
    assert (
        node._target_
        == f"hydra_plugins.lm_launchers.submitit_launchers.{'LocalGPUs' if launcher == 'local_gpus' else 'Slurm'}"
    )
    node = OmegaConf.to_container(node, resolve=False)
    node["submitit_folder"] = "/tmp/x/.submitit/%j"
    node["name"] = "lm"
    launcher_obj = instantiate(node)
    assert launcher_obj.params["timeout_min"] >= 1440
    if launcher == "local_gpus":
        assert launcher_obj.cpu_slots == 1 and "cpu_slots" not in launcher_obj.params  # not passed to submitit
        assert launcher_obj.params["gpus_per_node"] is None
    else:
        assert launcher_obj.params["gpus_per_node"] == 1 and launcher_obj.params["array_parallelism"] == 64
