"""Engine options are typed (lm/engine/config.py) and DeepSpeed's JSON is built from the typed train config."""

import pytest
from omegaconf import OmegaConf

from lm.config import ConfigError
from lm.core.config import resolve_batch
from lm.engine.config import DDPConfig, DeepSpeedConfig, FSDP2Config, SingleConfig
from lm.engine.dist import EngineError
from lm.engine.ds import ds_config
from tests.engine_support import compose, tiny_overrides


@pytest.mark.parametrize(
    "engine,schema",
    [
        ("single", SingleConfig),
        ("ddp", DDPConfig),
        ("fsdp2", FSDP2Config),
        ("zero1", DeepSpeedConfig),
        ("zero3_offload", DeepSpeedConfig),
    ],
)
def test_every_engine_option_composes_to_its_dataclass(tmp_path, engine, schema):
    run = OmegaConf.to_object(compose(tiny_overrides(tmp_path) + [f"engine={engine}"]))
    assert type(run.engine) is schema


def test_deepspeed_json_comes_from_the_typed_train_config(tmp_path):
    cfg = compose(
        tiny_overrides(tmp_path, micro_batch_size=2)
        + ["engine=zero2", "train.global_batch_size=8", "train.precision=bf16", "train.grad_clip=0.5"]
    )
    run = OmegaConf.to_object(cfg)
    train = resolve_batch(run.train, world_size=2)
    assert (train.grad_accum, run.train.grad_accum, cfg.train.grad_accum) == (2, 1, 1)  # derived, never written back
    ds = ds_config(train, 2, run.engine.config)
    assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (
        8,
        2,
        2,
    )
    assert ds["gradient_clipping"] == 0.5 and ds["bf16"]["enabled"] is True and ds["fp16"]["enabled"] is False
    assert ds["zero_optimization"]["stage"] == 2


def test_deepspeed_options_may_not_repeat_a_train_value(tmp_path):
    cfg = compose(tiny_overrides(tmp_path) + ["engine=zero1", "+engine.config.gradient_accumulation_steps=4"])
    run = OmegaConf.to_object(cfg)
    with pytest.raises(EngineError, match=r"engine.config sets \['gradient_accumulation_steps'\].*train\."):
        ds_config(run.train, 1, run.engine.config)


def test_global_batch_size_that_does_not_divide_names_the_sizes(tmp_path):
    run = OmegaConf.to_object(compose(tiny_overrides(tmp_path, micro_batch_size=4) + ["train.global_batch_size=12"]))
    with pytest.raises(
        ConfigError, match=r"global_batch_size=12 is not divisible .* = 8; use a multiple such as \[8, 16"
    ):
        resolve_batch(run.train, world_size=2)


@pytest.mark.parametrize("native,expected", [(True, "bf16"), (False, "fp32")])
def test_precision_auto_is_bf16_only_where_the_device_computes_bf16(tmp_path, monkeypatch, caplog, native, expected):
    """train.precision=auto (the GLUE-transfer presets): a CPU without AVX512-BF16 or AMX emulates bf16, several
    times slower than fp32, so auto picks fp32 there; the engine gets the resolved value, config.yaml keeps auto."""
    import torch

    from lm.cli.train import train
    from lm.engine import dist as dist_utils
    from tests.engine_support import loaders

    monkeypatch.setattr(dist_utils, "computes_bf16", lambda device: native)
    cfg = compose(tiny_overrides(tmp_path, 2) + ["train.precision=auto"])
    with caplog.at_level("INFO", logger="lm"):
        result = train(cfg, loaders=loaders(cfg))
    assert result.engine.dtype == {"bf16": torch.bfloat16, "fp32": torch.float32}[expected]
    assert result.engine.train.precision == expected
    assert f"train.precision=auto: {expected} (cpu {'has' if native else 'lacks'} bf16 units)" in caplog.text
    assert "precision: auto" in (tmp_path / "config.yaml").read_text()


def test_explicit_bf16_on_a_cpu_without_bf16_units_is_kept_with_a_warning(monkeypatch, caplog):
    import torch

    from lm.core.config import TrainConfig
    from lm.core.setup import resolve_precision
    from lm.engine import dist as dist_utils

    monkeypatch.setattr(dist_utils, "computes_bf16", lambda device: False)
    with caplog.at_level("WARNING", logger="lm"):
        kept = resolve_precision(TrainConfig(precision="bf16"), torch.device("cpu"), say=True)
    assert kept.precision == "bf16"
    assert "runs several times slower than fp32; train.precision=auto picks fp32 here" in caplog.text
    assert resolve_precision(TrainConfig(precision="fp32"), torch.device("cpu"), say=True).precision == "fp32"


def test_deepspeed_precision_its_accelerator_lacks_is_refused_in_one_line(monkeypatch):
    """DeepSpeed checks fp16/bf16 only inside deepspeed.initialize, as a ValueError traceback after the model is
    built (fp16 on most CPUs); the engine asks DeepSpeed's accelerator when it is made and names what runs."""
    import torch
    from deepspeed.accelerator import get_accelerator

    from lm.core.config import TrainConfig
    from lm.engine.dist import Dist
    from lm.engine.ds import DeepSpeedEngine

    monkeypatch.setattr(type(get_accelerator()), "is_fp16_supported", lambda self: False)
    dist = Dist(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    config = {"zero_optimization": {"stage": 2}}
    refusal = r"^train.precision=fp16 with DeepSpeed: .*; use train.precision=bf16 or fp32"
    with pytest.raises(EngineError, match=refusal):
        DeepSpeedEngine(TrainConfig(precision="fp16"), dist, config=config)
    assert DeepSpeedEngine(TrainConfig(precision="fp32"), dist, config=config).stage == 2


def test_the_run_log_counts_zero3_parameters_whole(tmp_path):
    """ZeRO-3 leaves each Parameter an empty tensor (its partition hangs off it as ds_tensor): lm train's first log
    line said `0 params`. Engine.numel, which that line prints, counts the whole model on every engine."""
    from lm.model import build_model
    from tests.engine_support import spawn

    overrides = tiny_overrides(tmp_path, 1)
    whole = sum(p.numel() for p in build_model(OmegaConf.to_object(compose(overrides)).model).parameters())
    (report,) = spawn(1, overrides + ["engine=zero3"])
    assert report[2]["numel"] == whole


def test_zero_stage_0_in_fp32_reports_the_gradient_norm(tmp_path):
    """engine=deepspeed in fp32 steps lm's AdamW itself, and DeepSpeed reports no gradient norm for it (None): read
    as NaN, every such run stopped at step 1 as diverged. The engine measures the norm itself: the single engine's."""
    from lm.cli.train import train
    from tests.engine_support import loaders, metrics, spawn

    single = tmp_path / "single"
    cfg = compose(tiny_overrides(single, 2))
    train(cfg, loaders=loaders(cfg))
    spawn(1, tiny_overrides(tmp_path / "ds", 2) + ["engine=deepspeed"])
    norms = [[m["grad_norm"] for m in metrics(run) if "grad_norm" in m] for run in (single, tmp_path / "ds")]
    assert len(norms[1]) == 2 and norms[0] == pytest.approx(norms[1], rel=1e-5)


def test_zero_stage_0_in_bf16_exports_its_fp32_masters(tmp_path):
    """engine=deepspeed in bf16 keeps fp32 master weights in its optimizer and bf16 copies in the module: lm export
    and finetune init= read the rounded copies. The consolidated state is the masters (fp32, not all bf16 values),
    whose bf16 rounding is the module's; the tied LM head is the embedding's master too."""
    import torch

    from lm.core.checkpoint import consolidated_state_dict, resolve
    from tests.engine_support import spawn

    spawn(1, tiny_overrides(tmp_path, 3, precision="bf16") + ["engine=deepspeed"])
    ckpt = resolve(tmp_path)
    state = consolidated_state_dict(ckpt)
    module = torch.load(ckpt / "deepspeed" / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)
    assert {t.dtype for t in state.values()} == {torch.float32}
    assert any(not torch.equal(t, t.bfloat16().float()) for t in state.values())
    assert all(torch.equal(state[k].bfloat16(), v) for k, v in module["module"].items())
    assert torch.equal(state["head.proj.weight"], state["embed.tok.weight"])


def test_zero_stage_0_in_bf16_takes_the_same_first_steps_as_zero1(tmp_path):
    """DeepSpeed's FP16_UnfusedOptimizer (stage 0 in bf16) stepped lm's AdamW once on zero gradients when built: Adam
    then began at step 1, its first updates ~0.73x ZeRO-1's, and step 3's loss was 5.3667 against 5.3635. Both keep
    fp32 masters of bf16 weights, so on one rank their losses now agree to float noise."""
    from tests.engine_support import spawn, train_losses

    runs = {engine: tmp_path / engine for engine in ("deepspeed", "zero1")}
    for engine, run in runs.items():
        spawn(1, tiny_overrides(run, 3, precision="bf16") + [f"engine={engine}"])
    stage0, zero1 = (train_losses(run) for run in runs.values())
    assert list(stage0) == [1, 2, 3]
    assert max(abs(stage0[s] - zero1[s]) for s in stage0) < 1e-5, (stage0, zero1)
