"""The run harness (lm/core/session.py) and its hook points (lm/core/hooks.py): hooks installed through
LM_PLUGINS reach the loop and every checkpoint write of lm train; lm/ holds no fault-injection code; a Session
driven directly (as the speed benchmarks do) resumes exactly; lm finetune hands only typed objects down."""

import sys
from pathlib import Path

import pytest

from lm.core.checkpoint import SAVE_PHASES
from tests.engine_support import compose, loaders, tiny_overrides, train_losses

PLUGIN = """
calls = {"begin": [], "backward": [], "save": []}


def install(hooks):
    hooks.step_begin.append(calls["begin"].append)
    hooks.after_backward.append(lambda step, micro: calls["backward"].append((step, micro)))
    hooks.save_phase.append(calls["save"].append)
"""


def test_plugin_hooks_reach_every_backward_and_every_checkpoint_phase(tmp_path, monkeypatch):
    from lm.cli.train import train

    plugin = tmp_path / "recording_plugin.py"
    plugin.write_text(PLUGIN)
    monkeypatch.setenv("LM_PLUGINS", str(plugin))
    cfg = compose(tiny_overrides(tmp_path / "run", steps=4, ckpt_interval=2, grad_accum=2))
    train(cfg, loaders=loaders(cfg))
    calls = sys.modules["lm_plugin_recording_plugin"].calls
    assert calls["begin"] == [0, 1, 2, 3]
    assert calls["backward"] == [(step, micro) for step in range(4) for micro in range(2)]
    assert calls["save"] == ["begin", *SAVE_PHASES] * 2  # steps 2 and 4


def test_lm_holds_no_fault_injection_code():
    """The pause points live in benchmarks/fault_pause.py, installed on lm's hooks; lm only calls hooks."""
    lm = Path(__file__).resolve().parents[1] / "lm"
    assert [p.name for p in lm.rglob("*.py") if "LM_FAULT" in p.read_text() or "_fault" in p.read_text()] == []


def test_a_session_driven_directly_resumes_exactly(tmp_path):
    """What lm train does, through the harness's API: 3 steps then 6 give the losses of 6 in one go."""
    import torch

    from lm.cli.train import typed_run
    from lm.core.optim import lr_multiplier
    from lm.core.pretrain_task import PretrainTask
    from lm.core.session import Session
    from lm.engine import Dist, SingleEngine
    from lm.model import build_model

    def run(run_dir, steps):
        cfg = compose(tiny_overrides(run_dir, steps=steps, ckpt_interval=3) + ["model.dropout=0.1"])
        run = typed_run(cfg)
        train_loader, val_loader = loaders(cfg)
        engine = SingleEngine(run.train, Dist(rank=0, world_size=1, local_rank=0, device=torch.device("cpu")))
        task = PretrainTask(train_loader, val_loader, 1, 1)
        with Session(run.train, engine, task, run_dir, "model: tiny\n") as session:
            session.build(lambda: build_model(run.model), run.seed, run.optim)
            session.resume_or_start(True, steps)
            session.track(run.logger, {})
            return session.train(lambda step: run.optim.lr * lr_multiplier(step, run.sched, steps))

    assert run(tmp_path / "whole", 6).step == 6
    assert run(tmp_path / "split", 3).step == 3
    assert run(tmp_path / "split", 6).step == 6
    assert train_losses(tmp_path / "split") == train_losses(tmp_path / "whole")


def test_lm_finetune_hands_only_typed_objects_down(tmp_path, monkeypatch):
    """After entry no DictConfig travels: the engine, the model to build and the trackers' config are typed or plain."""
    from omegaconf import OmegaConf

    import lm.core.setup as setup
    import lm.glue.init as init
    import lm.glue.run as glue_run
    from lm.cli.finetune import finetune
    from lm.model.config import ModelConfig
    from tests.glue_support import TINY, finetune_cfg

    seen = {}
    real_class, real_engine = setup.engine_class, setup.make_engine

    def engine_class(cfg, get_class):
        seen["engine_class"] = cfg
        return real_class(cfg, get_class)

    def make_engine(cfg, instantiate, train_cfg, dist):
        seen["make_engine"] = cfg
        return real_engine(cfg, instantiate, train_cfg, dist)

    def load_backbone(init_, tokenizer, model):
        seen["model"] = model
        return init.Backbone(model, None, None, "none")

    def finetune_glue(job, backbone, make, config, dist):
        seen["config"] = config
        make(job.train.for_task(1, 1)).close()
        return {}

    monkeypatch.setattr(setup, "engine_class", engine_class)
    monkeypatch.setattr(setup, "make_engine", make_engine)
    monkeypatch.setattr(init, "load_backbone", load_backbone)
    monkeypatch.setattr(glue_run, "finetune_glue", finetune_glue)
    finetune(finetune_cfg(tmp_path / "ft", ["init=none", *TINY, "tokenizer=unused", "task=glue/sst2"]))
    assert isinstance(seen["model"], ModelConfig)
    assert not OmegaConf.is_config(seen["engine_class"]) and not OmegaConf.is_config(seen["make_engine"])
    assert isinstance(seen["config"], dict) and not OmegaConf.is_config(seen["config"])


def test_skip_on_deepspeed_is_refused_where_engines_are_made():
    """One refusal for every app: lm.core.setup.make_engine (the DeepSpeed class is not imported for it)."""
    import types

    from lm.config import ConfigError
    from lm.core.setup import make_engine

    class FakeDeepSpeed:
        format = "deepspeed"

        def __init__(self, train, dist):
            pass

    cfg = types.SimpleNamespace(engine=types.SimpleNamespace(_target_="x"))
    train = types.SimpleNamespace(precision="fp32", on_nonfinite="skip")
    with pytest.raises(ConfigError, match="on_nonfinite=skip does not work with DeepSpeed"):
        make_engine(cfg, lambda node: FakeDeepSpeed, train, None)


def test_the_largest_seed_seeds_every_rank():
    """seed=2**64-1 passes lm.config_base.check_seeds; Session.build seeds rank r with seed + r, which on rank 1 ended
    in torch.manual_seed's ValueError ('Overflow when unpacking long long'). It wraps: rank 1 draws as seed 0."""
    import torch

    from lm.config_base import MAX_SEED
    from lm.core.setup import seed_everything

    seed_everything(MAX_SEED + 1)
    assert torch.initial_seed() == 0
    wrapped = torch.rand(3)
    seed_everything(0)
    assert torch.equal(torch.rand(3), wrapped)
    seed_everything(MAX_SEED)
    assert torch.initial_seed() == MAX_SEED
