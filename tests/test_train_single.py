"""lm train in one process: run directory contents, exact resume, NaN/inf losses, full disks, bad configs.

Runs in-process on the synthetic loader of engine_support (a learnable random walk), tiny model.
"""

import errno
import json
import math
import re

import pytest
import torch
from hydra.errors import ConfigCompositionException

from lm.cli.train import train
from lm.config import ConfigError
from lm.core.checkpoint import CheckpointError
from lm.core.loop import LossDiverged
from lm.engine.dist import EngineError
from tests.engine_support import compose, loaders, metrics, tiny_overrides, train_losses


def run(run_dir, steps=10, extra=(), **train_kw):
    cfg = compose(tiny_overrides(run_dir, steps, **train_kw) + list(extra))
    return cfg, train(cfg, loaders=loaders(cfg))


def test_run_directory_holds_config_metrics_and_checkpoints(tmp_path):
    _, result = run(
        tmp_path,
        steps=12,
        extra=["optim.lr=1e-2", "model.vocab_size=32"],
        ckpt_interval=4,
        keep_last=2,
        eval_interval=6,
    )
    records = metrics(tmp_path)
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, 13))
    assert set(steps[0]) >= {"step", "tokens", "loss", "lr", "grad_norm", "tokens_per_s", "memory"}
    assert steps[-1]["tokens"] == 12 * 4 * 32  # steps x micro-batch x seq_len, one rank
    vals = [r for r in records if "val_loss" in r]
    assert [r["step"] for r in vals] == [6, 12]
    assert vals[-1]["val_ppl"] == pytest.approx(math.exp(vals[-1]["val_loss"]), rel=1e-6)
    assert steps[-1]["loss"] < steps[0]["loss"] - 0.3  # it learns the walk

    ckpts = tmp_path / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_00000008", "step_00000012"]  # keep_last=2
    assert (ckpts / "latest").read_text() == "step_00000012"
    trainer = json.loads((ckpts / "step_00000012" / "trainer.json").read_text())
    assert trainer["step"] == 12 and trainer["engine"]["world_size"] == 1
    config = (tmp_path / "config.yaml").read_text()
    assert "${" not in config and "max_steps: 12" in config  # resolved, once, at the top of the run
    assert result.state.step == 12


def test_resume_continues_bit_identically(tmp_path):
    """Stopping after step 5 and running the same command again gives the uninterrupted run's losses
    exactly (weights, AdamW moments, loader position and RNG all restored). Constant LR so that the
    shorter first leg has the same schedule."""
    extra = ["sched=constant", "model.dropout=0.1"]  # dropout: the RNG state must be restored too
    run(tmp_path / "whole", steps=10, extra=extra)
    run(tmp_path / "split", steps=5, extra=extra)
    _, resumed = run(tmp_path / "split", steps=10, extra=extra)
    whole, split = train_losses(tmp_path / "whole"), train_losses(tmp_path / "split")
    assert list(split) == list(range(1, 11))  # no step repeated or skipped in metrics.jsonl
    assert split == whole  # bit-identical floats
    assert resumed.state.step == 10


def test_resume_false_sets_the_run_already_there_aside(tmp_path):
    """resume=false where a run is: its checkpoints stayed beside the new run's (keep_last pruned the old run's,
    a damaged `latest` fell back to the old run's newest) and its metrics.jsonl was cut to nothing. They move to
    run_dir/previous/<time>/, whole; the new run starts in an empty checkpoints directory."""
    run(tmp_path, steps=6, ckpt_interval=2)
    old = metrics(tmp_path)
    _, result = run(tmp_path, steps=4, extra=["resume=false"], ckpt_interval=2, keep_last=1)
    assert result.state.step == 4
    (aside,) = (tmp_path / "previous").iterdir()
    names = ["latest", "step_00000002", "step_00000004", "step_00000006"]
    assert sorted(p.name for p in (aside / "checkpoints").iterdir()) == names
    assert metrics(aside) == old and "max_steps: 6" in (aside / "config.yaml").read_text()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_00000004"]
    assert [r["step"] for r in metrics(tmp_path) if "loss" in r] == [1, 2, 3, 4]
    run(tmp_path, steps=2, extra=["resume=false"])  # again, within the same second or not: a second directory
    assert len(list((tmp_path / "previous").iterdir())) == 2


def test_resume_false_twice_in_one_second_sets_each_run_aside_in_its_own_directory(tmp_path, monkeypatch):
    """1e9b4e8: the second resume=false within a second named the same previous/<time>/ (FileExistsError); the test
    above starts over twice but rarely within one second, so here the clock stands still."""
    from types import SimpleNamespace

    import lm.core.session
    from lm.core.session import set_aside

    clock = SimpleNamespace(gmtime=lambda: None, strftime=lambda fmt, t: "20260101T000000Z")
    monkeypatch.setattr(lm.core.session, "time", clock)  # set_aside's clock only
    for run_no in (1, 2, 3):
        (tmp_path / "metrics.jsonl").write_text(f"run {run_no}\n")
        set_aside(tmp_path)
    previous = tmp_path / "previous"
    stamps = ["20260101T000000Z", "20260101T000000Z-1", "20260101T000000Z-2"]
    assert sorted(p.name for p in previous.iterdir()) == stamps
    assert [(previous / s / "metrics.jsonl").read_text() for s in stamps] == ["run 1\n", "run 2\n", "run 3\n"]


def test_resume_on_another_engine_continues_exactly(tmp_path):
    """Elastic resume (docs/training.md): a single-process checkpoint continues under DDP (one rank here: the
    same arithmetic), with the uninterrupted run's losses. Refusals of what cannot change: tests/test_elastic.py."""
    from lm.engine import dist as dist_utils

    extra = ["sched=constant"]
    run(tmp_path / "whole", steps=6, extra=extra)
    run(tmp_path / "split", steps=3, extra=extra)
    try:
        run(tmp_path / "split", steps=6, extra=[*extra, "engine=ddp"])
    finally:
        dist_utils.shutdown()  # the 1-rank process group DDP made
    assert train_losses(tmp_path / "split") == train_losses(tmp_path / "whole")


def _nan_at(monkeypatch, step_calls):
    """Make the training loss NaN on the given forward calls (1-based)."""
    from lm.core import objectives

    real, calls = objectives.loss, {"n": 0}

    def loss(model, batch, *metrics):
        calls["n"] += 1
        out = real(model, batch, *metrics)
        return out * float("nan") if calls["n"] in step_calls and model.training else out

    monkeypatch.setattr(objectives, "loss", loss)


def test_nan_loss_stops_before_the_update_and_keeps_the_checkpoint(tmp_path, monkeypatch):
    _nan_at(monkeypatch, {7})
    with pytest.raises(LossDiverged, match=r"loss is nan at step 7.*step_00000004 is intact.*optim.lr"):
        run(tmp_path, steps=10, ckpt_interval=4)
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_00000004"
    assert max(train_losses(tmp_path)) and max(train_losses(tmp_path)) <= 6  # nothing logged past step 6


def test_nan_loss_skip_drops_the_step_and_goes_on(tmp_path, monkeypatch):
    _nan_at(monkeypatch, {3})
    cfg, result = run(tmp_path, steps=6, on_nonfinite="skip")
    losses = train_losses(tmp_path)
    assert math.isnan(losses[3]) and all(math.isfinite(v) for s, v in losses.items() if s != 3)
    assert result.state.step == 6


class _InfGradient(torch.autograd.Function):
    """The identity forward; an infinite gradient backward: a finite loss whose gradient norm is inf (what
    optim.lr=1e3 reaches after a few steps)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * math.inf


def _inf_gradient_at(monkeypatch, step_calls):
    """Make the training loss's gradient inf on the given forward calls (1-based); the loss stays finite."""
    from lm.core import objectives

    real, calls = objectives.loss, {"n": 0}

    def loss(model, batch, *metrics):
        calls["n"] += 1
        out = real(model, batch, *metrics)
        return _InfGradient.apply(out) if calls["n"] in step_calls and model.training else out

    monkeypatch.setattr(objectives, "loss", loss)


def test_an_infinite_gradient_norm_with_a_finite_loss_stops_the_run(tmp_path, monkeypatch):
    """Issue 49 item 3: every update skipped on the device while the loss stayed finite, and the run exited 0."""
    _inf_gradient_at(monkeypatch, {7})
    with pytest.raises(
        LossDiverged,
        match=r"gradient norm is (inf|nan) with a finite loss \(\d.*\) at step 7; no "
        r"update was applied and the last good checkpoint .*step_00000004 is intact"
        r".*set train.on_nonfinite=skip",
    ):
        run(tmp_path, steps=10, ckpt_interval=4, log_interval=2)
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_00000004"
    losses = train_losses(tmp_path)
    assert max(losses) == 6 and all(math.isfinite(v) for v in losses.values())


def test_an_infinite_gradient_norm_under_skip_is_logged_counted_and_limited(tmp_path, monkeypatch, caplog):
    _inf_gradient_at(monkeypatch, {3})
    with caplog.at_level("WARNING", logger="lm"):
        _, result = run(tmp_path / "one", steps=6, on_nonfinite="skip")
    assert result.state.step == 6
    assert re.search(
        r"step 3: gradient norm is (inf|nan) with a finite loss \(.*\), update skipped \(1/10 in a row\)", caplog.text
    ), caplog.text
    grad_norms = {m["step"]: m["grad_norm"] for m in metrics(tmp_path / "one") if "grad_norm" in m}
    assert not math.isfinite(grad_norms[3]) and all(math.isfinite(v) for s, v in grad_norms.items() if s != 3)
    _inf_gradient_at(monkeypatch, {2, 3, 4})
    with pytest.raises(
        LossDiverged,
        match=r"at step 4; .*\(3 consecutive non-finite steps\).*raise "
        r"train.max_nonfinite",
    ):
        run(tmp_path / "three", steps=8, on_nonfinite="skip", max_nonfinite=2)


def test_an_infinite_gradient_norm_under_fp16_loss_scaling_is_the_scalers_overflow():
    """fp16's GradScaler skips an overflowing step and lowers its scale: not a divergence for the policy."""
    from types import SimpleNamespace

    from lm.core.config import TrainConfig
    from lm.core.loop import State, _policy

    state = State(step=5)
    for scales, expected in ((True, 0), (False, 1)):
        engine = SimpleNamespace(scales_loss=scales, skips_nonfinite_updates=True, is_main=True)
        state.nonfinite = 0
        _policy(TrainConfig(on_nonfinite="skip"), engine, state, 5, 2.5, math.inf, None)
        assert state.nonfinite == expected
    with pytest.raises(LossDiverged, match="loss is nan at step 5"):  # a NaN loss counts under fp16 too
        _policy(
            TrainConfig(),
            SimpleNamespace(scales_loss=True, skips_nonfinite_updates=True, is_main=False),
            state,
            5,
            math.nan,
            math.nan,
            None,
        )


def test_full_disk_during_a_checkpoint_keeps_the_previous_one(tmp_path, monkeypatch):
    from lm.engine.base import Engine

    real, saves = Engine.save_state, {"n": 0}

    def save(self, path):
        saves["n"] += 1
        if saves["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, path)

    monkeypatch.setattr(Engine, "save_state", save)
    # the synchronous writer (a failed background write: tests/test_checkpoint_async.py)
    with pytest.raises(CheckpointError, match=r"No space left.*step_00000003 is intact.*resume"):
        run(tmp_path, steps=9, ckpt_interval=3, async_checkpoint="false")
    ckpts = tmp_path / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_00000003"]  # no half-written step 6
    assert (ckpts / "latest").read_text() == "step_00000003"
    # and the run resumes from it once the disk has room again
    monkeypatch.setattr(Engine, "save_state", real)
    _, result = run(tmp_path, steps=9, ckpt_interval=3, async_checkpoint="false")
    assert result.state.step == 9 and list(train_losses(tmp_path)) == list(range(1, 10))


def test_unknown_key_and_unknown_engine_fail_at_composition(tmp_path):
    with pytest.raises(ConfigCompositionException, match="train.max_stpes"):
        compose(tiny_overrides(tmp_path) + ["train.max_stpes=3"])
    with pytest.raises(ConfigCompositionException, match=r"engine/zero9(.|\n)*zero3"):  # lists the options
        compose(tiny_overrides(tmp_path) + ["engine=zero9"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.precision=fp8", "Invalid value 'fp8', expected one of [fp32, bf16, fp16, auto]"),
        ("sched.kind=exp", "Invalid value 'exp', expected one of [cosine, linear, constant, wsd]"),
        ("train.on_nonfinite=ignore", "Invalid value 'ignore', expected one of [stop, skip]"),
        ("train.device=tpu", "Invalid value 'tpu', expected one of [auto, cpu, cuda]"),
        ("engine.bucket_cap_mb=big", "Value 'big' of type 'str' could not be converted to Integer"),
    ],
)
def test_wrong_choice_fails_at_composition_naming_the_allowed_values(tmp_path, override, message):
    """Choices are Enums in the schemas: Hydra refuses the value while composing, before anything runs."""
    extra = ["engine=ddp"] if override.startswith("engine.") else []
    with pytest.raises(ConfigCompositionException, match=re.escape(override)) as info:
        compose(tiny_overrides(tmp_path) + extra + [override])
    assert message in str(info.value.__cause__)


@pytest.mark.parametrize(
    "override, error, message",
    [
        ("train.world_size=2", EngineError, "train.world_size=2 but the launcher started 1"),
        ("train.global_batch_size=6", ConfigError, "global_batch_size=6 is not divisible"),
        ("train.seq_len=512", ConfigError, "train.seq_len=512 exceeds model.max_seq_len=64"),
    ],
)
def test_bad_training_config_is_refused_before_training(tmp_path, override, error, message):
    with pytest.raises(error, match=message):
        run(tmp_path, extra=[override])
    assert not (tmp_path / "metrics.jsonl").exists()


def test_missing_data_source_names_the_path(tmp_path, monkeypatch):
    monkeypatch.setenv("LM_CACHE", str(tmp_path / "cache"))
    cfg = compose(
        tiny_overrides(tmp_path / "run")
        + [f"data.source={tmp_path}/nowhere/*.txt", "data.name=missing", "data.tokenizer=char"]
    )
    from lm.data.errors import DataError

    with pytest.raises(DataError) as e:  # the path alone was matched: any error quoting the config passed
        train(cfg)
    assert str(e.value) == (
        f"{tmp_path}/nowhere/*.txt: no file matches this glob; check the pattern (quote it so the shell does not "
        "expand it)"
    )


def test_export_of_a_single_process_checkpoint_loads_in_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    from lm.cli.export import export

    gpt2 = [
        "model=gpt2",
        "model.dim=32",
        "model.n_layers=2",
        "model.n_heads=4",
        "model.vocab_size=64",
        "model.max_seq_len=64",
    ]
    cfg, result = run(tmp_path, steps=3, extra=gpt2)
    out = export(tmp_path)
    assert {p.name for p in out.iterdir()} >= {"model.safetensors", "config.json", "hf"}
    hf = AutoModelForCausalLM.from_pretrained(out / "hf").eval()
    x = loaders(cfg)[1].batch(0)["input_ids"]
    model = result.engine.module.eval()
    with torch.no_grad():
        ours = model(input_ids=x).logits
        theirs = hf(input_ids=x).logits
    assert torch.allclose(ours, theirs, atol=1e-4), (ours - theirs).abs().max()


def test_tensorboard_and_offline_wandb_sinks(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc key: wandb must go offline, not prompt or hang
    run(tmp_path / "run", steps=2, extra=["logger=all", "logger.project=lm-test"])
    assert list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))
    offline = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(offline) == 1 and (tmp_path / "run" / "wandb_id").read_text().strip() in offline[0].name


@pytest.mark.parametrize("sig, name", [("SIGTERM", "SIGTERM"), ("SIGINT", r"SIGINT \(Ctrl-C\)")])
def test_sigterm_checkpoints_the_finished_step_and_the_same_command_resumes(tmp_path, monkeypatch, caplog, sig, name):
    """A scheduler's SIGTERM (or SIGUSR1), or Ctrl-C, mid-step: the step completes, is checkpointed (although
    ckpt_interval=0 would write only at the end), the run stops, and running again loses nothing."""
    import os
    import signal

    from lm.core import objectives
    from lm.core.loop import Preempted

    run(tmp_path / "whole", steps=8, extra=["model.dropout=0.1"])
    real, calls = objectives.loss, {"n": 0}
    before = signal.getsignal(getattr(signal, sig))

    def loss(model, batch, *metrics):
        calls["n"] += 1
        if calls["n"] == 5 and model.training:
            os.kill(os.getpid(), getattr(signal, sig))
        return real(model, batch, *metrics)

    monkeypatch.setattr(objectives, "loss", loss)
    with pytest.raises(
        Preempted,
        match=rf"{name} received: stopped after step 5 with checkpoint .*step_00000005; "
        rf"run the same command to resume",
    ):
        run(tmp_path / "stopped", steps=8, extra=["model.dropout=0.1"])
    assert signal.getsignal(getattr(signal, sig)) is before  # the loop put the previous handler back
    monkeypatch.setattr(objectives, "loss", real)
    with caplog.at_level("INFO", logger="lm"):  # lm train's Hydra logging config sets INFO
        run(tmp_path / "stopped", steps=8, extra=["model.dropout=0.1"])
    assert train_losses(tmp_path / "stopped") == train_losses(tmp_path / "whole")
    assert "resumed from" in (tmp_path / "stopped" / "train.log").read_text()


def test_a_second_ctrl_c_aborts_at_once_without_a_checkpoint(tmp_path, monkeypatch):
    """Issue 49 item 10: the first Ctrl-C asks for a checkpointed stop; a second one does not wait for it. Step 4's
    checkpoint written synchronously (a background write still in flight is lost to an abort, as after a kill)."""
    import os
    import signal

    from lm.core import objectives

    real, calls = objectives.loss, {"n": 0}
    before = signal.getsignal(signal.SIGINT)

    def loss(model, batch, *metrics):
        calls["n"] += 1
        if calls["n"] == 5 and model.training:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
        return real(model, batch, *metrics)

    monkeypatch.setattr(objectives, "loss", loss)
    with pytest.raises(KeyboardInterrupt) as e:
        run(tmp_path, steps=8, ckpt_interval=4, async_checkpoint="false")
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_00000004"  # step 5 was not checkpointed
    assert str(e.value) == f"run the same command to resume from {tmp_path / 'checkpoints' / 'step_00000004'}"
    assert max(train_losses(tmp_path)) == 4
    assert signal.getsignal(signal.SIGINT) is before


def test_keep_last_keeps_a_checkpoint_holding_an_export_and_prunes_it_once_moved(tmp_path, caplog):
    """lm export's default output is <checkpoint>/export: a run continued with a larger train.max_steps used to prune
    that checkpoint, export and all, at its next save."""
    from lm.cli.export import export

    run(tmp_path, steps=4, ckpt_interval=4, keep_last=1)
    first = tmp_path / "checkpoints" / "step_00000004"
    out = export(tmp_path, hf=False)
    assert out == first / "export"
    with caplog.at_level("WARNING", logger="lm"):
        run(tmp_path, steps=12, ckpt_interval=4, keep_last=1)
    assert (out / "model.safetensors").is_file()
    assert caplog.text.count(f"kept {first} past train.keep_last=1: it holds export") == 1
    ckpts = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert ckpts == ["latest", "step_00000004", "step_00000012"]  # step 8 pruned as usual
    out.rename(tmp_path / "export")
    run(tmp_path, steps=16, ckpt_interval=4, keep_last=1)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_00000016"]


def test_under_a_progress_bar_train_log_still_gets_each_logged_steps_line(tmp_path, monkeypatch, caplog):
    """On a terminal the bar shows the loss and the per-step line was logged nowhere: train.log held no training
    loss. It now gets the line; the terminal does not (the bar is there)."""
    import sys

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    cfg = compose(tiny_overrides(tmp_path, 3, progress=True))
    with caplog.at_level("INFO", logger="lm"):
        train(cfg, loaders=loaders(cfg))
    text = (tmp_path / "train.log").read_text()
    losses = train_losses(tmp_path)
    for step in (1, 2, 3):
        assert f"step {step}: loss {losses[step]:.4f}, lr " in text
    # not on the "lm" logger, whose lines reach the terminal, beside the bar
    assert [r.getMessage() for r in caplog.records if r.name == "lm" and ": loss " in r.getMessage()] == []


def test_a_resume_with_a_smaller_keep_last_removes_the_older_checkpoints_and_says_which(tmp_path, caplog):
    """train.keep_last 3 -> 1 on resume: the next save removed three checkpoints at once with no word but the
    resume's "changed setting" line. Removing them is what keep_last asks for; the log now names them."""
    run(tmp_path, steps=6, ckpt_interval=2, keep_last=3)
    with caplog.at_level("WARNING", logger="lm"):
        run(tmp_path, steps=8, ckpt_interval=2, keep_last=1)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_00000008"]
    removed = "train.keep_last=1: removed the older checkpoints step_00000002, step_00000004, step_00000006"
    assert caplog.text.count(removed) == 1
    caplog.clear()
    with caplog.at_level("WARNING", logger="lm"):
        run(tmp_path, steps=12, ckpt_interval=2, keep_last=1)  # steady rotation, one at a time: nothing said
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_00000012"]
    assert "removed the older checkpoints" not in caplog.text


def test_a_checkpoint_whose_optimizer_groups_differ_is_refused_in_one_line(tmp_path, monkeypatch):
    """A zoo model's checkpoint written when weight decay covered the Linear weights only (before 2026-11-30) holds
    AdamW groups of other sizes: torch's load_state_dict raised a bare ValueError; the resume now names the cause.
    It is decided from the saved param_groups (lm.engine.formats.check_grouping), not from torch's message, which
    lm matched once: torch's check is reworded here, and the refusal stands."""
    import lm.core.optim as optim

    def linear_only(model, weight_decay, decay_embeddings=False):  # the rule that wrote such checkpoints
        linear = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
        groups = ([], [])
        for p in model.parameters():
            groups[id(p) not in linear].append(p)
        return [{"params": groups[0], "weight_decay": weight_decay}, {"params": groups[1], "weight_decay": 0.0}]

    extra = ["model/attn=synthesizer_dense"]  # its (max_seq_len, max_seq_len) W is no nn.Linear: it moved group
    with monkeypatch.context() as m:
        m.setattr(optim, "param_groups", linear_only)
        run(tmp_path, steps=2, extra=extra)
    real = torch.optim.Optimizer.load_state_dict

    def reworded(self, state_dict):  # torch's group-size ValueError in other words, as a torch release may put it
        try:
            real(self, state_dict)
        except ValueError:
            raise ValueError("optimizer state does not fit") from None

    monkeypatch.setattr(torch.optim.Optimizer, "load_state_dict", reworded)
    with pytest.raises(CheckpointError, match=r"step_00000002: its optimizer state groups the parameters otherwise"):
        run(tmp_path, steps=4, extra=extra)


def test_a_checkpoint_from_before_the_fixed_val_sample_is_resumed_with_a_warning(tmp_path, monkeypatch, caplog):
    """Validation reads a fixed sample of the val split since 2026-11-30 (its first micro-batches before): a run of
    the earlier reading resumed now steps in val_loss, which the resume says; one of today's says nothing."""
    import lm.core.pretrain_task as pretrain_task

    def before(self):  # the task state of a checkpoint written before val_sample was recorded
        return self.batches.state_dict()

    with monkeypatch.context() as m:
        m.setattr(pretrain_task.PretrainTask, "state_dict", before)
        run(tmp_path / "old", steps=2)
    run(tmp_path / "new", steps=2)
    for name, warned in (("old", True), ("new", False)):
        caplog.clear()
        with caplog.at_level("WARNING", logger="lm"):
            run(tmp_path / name, steps=3)
        assert ("its val_loss may step at this resume" in caplog.text) == warned, name
