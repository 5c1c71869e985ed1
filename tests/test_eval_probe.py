"""GLUE probes (lm/eval/probe.py, issue 52 item 1): pooled features of every family, the official metrics,
and in the loop: logged like val loss, training bit-identical with probes off or on, resume exact."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from lm.cli.train import train
from lm.config import ConfigError
from lm.eval.pacing import within_budget
from lm.eval.probe import (
    GlueProbe,
    ProbeSet,
    fit_and_score,
    load_probe_sets,
    pooled_features,
    probe_callbacks,
)
from lm.glue.metrics import compute_metrics
from lm.model import build_model
from lm.model.config import model_preset
from tests.engine_support import compose, loaders, metrics, tiny_overrides, train_losses

SMALL = ["model.vocab_size=64", "model.dim=32", "model.n_layers=2", "model.n_heads=2", "model.dropout=0.0"]
FAMILIES = {
    "decoder": ("tiny", SMALL),
    "encoder": ("bert", SMALL + ["model.mlm_transform=false"]),
    "encoder_decoder": ("t5", SMALL),
    "rnn": ("lstm", ["model.vocab_size=64", "model.dim=32", "model.n_layers=1", "model.dropout=0.0"]),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_pooled_features_do_not_depend_on_the_padding_or_the_batch(family):
    """Each example's vector is its own mean over its real tokens, whatever it is batched with."""
    preset, overrides = FAMILIES[family]
    torch.manual_seed(0)
    model = build_model(model_preset(preset, overrides)).eval()
    g = torch.Generator().manual_seed(1)
    encoded = []
    for n in (3, 9, 5, 12):
        ids = torch.randint(4, 64, (n,), generator=g).tolist()
        encoded.append({"input_ids": ids, "attention_mask": [1] * n, "token_type_ids": [0] * n})
    batched = pooled_features(model, encoded, pad_id=0)
    assert batched.shape == (4, 32) and batched.dtype == np.float32
    for i, e in enumerate(encoded):
        alone = pooled_features(model, [e], pad_id=0)[0]
        np.testing.assert_allclose(batched[i], alone, atol=1e-5, rtol=1e-5)
    assert not np.allclose(batched[0], batched[1])


def test_the_probe_scores_with_the_official_metrics():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 200)
    x = rng.normal(size=(200, 8)) + 3.0 * y[:, None]  # separable: every official metric is perfect
    assert fit_and_score("sst2", x[:100], y[:100], x[100:], y[100:], regression=False) == 100.0
    assert fit_and_score("cola", x[:100], y[:100], x[100:], y[100:], regression=False) == 100.0
    noise = rng.normal(size=(200, 8))  # features that know nothing: MRPC's score is its official mean of F1 and acc
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    expected = compute_metrics(
        "mrpc",
        make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
        .fit(noise[:100], y[:100])
        .predict(noise[100:]),
        y[100:],
    )
    assert fit_and_score("mrpc", noise[:100], y[:100], noise[100:], y[100:], regression=False) == expected["score"]
    scores = x[:, 0] + 0.1 * rng.normal(size=200)  # STS-B: ridge regression, (Pearson + Spearman) / 2
    got = fit_and_score("stsb", x[:100], list(scores[:100]), x[100:], list(scores[100:]), regression=True)
    assert 90.0 < got <= 100.0


def test_probe_sets_are_the_first_rows_of_the_local_splits(data_mirror):
    from lm.data.tokenizer import train as train_tokenizer

    tok = train_tokenizer(
        "char", ["abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ.,'!?-0123456789"], n_sentinels=0
    )
    sets = load_probe_sets(tok, "decoder", ["sst2", "stsb"], train_examples=7, dev_examples=0, max_len=16)
    assert [s.task for s in sets] == ["sst2", "stsb"]
    assert [len(s.train) for s in sets] == [7, 7] and [len(s.dev) for s in sets] == [872, 1500]  # 0 = all dev rows
    assert not sets[0].regression and sets[1].regression
    assert max(len(e["input_ids"]) for s in sets for e in s.train + s.dev) <= 16
    with pytest.raises(ConfigError, match=r"train.probe_tasks=\['sst2', 'mnli'\].*not \['mnli'\]"):
        load_probe_sets(tok, "decoder", ["sst2", "mnli"])  # MNLI has two dev columns


# -- in the loop -------------------------------------------------------------------------------------

PROBE = [
    "train.probe_train_examples=40",
    "train.probe_dev_examples=40",
    "train.probe_max_len=24",
    "train.probe_tasks=[sst2,stsb]",
    "train.downstream_budget=0",  # every probe_interval steps: these tests pin the steps (the budget's own tests below)
]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A prepared data directory's tokenizer.json (char level; the loop reads data.dir's)."""
    from lm.data.tokenizer import train as train_tokenizer

    path = tmp_path_factory.mktemp("data")
    text = Path(__file__).read_text() + "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    train_tokenizer("char", [text], n_sentinels=0).save(path / "tokenizer.json")
    return path


def run(run_dir, tokenizer_dir, steps, probe_interval, extra=()):
    cfg = compose(
        tiny_overrides(run_dir, steps, probe_interval=probe_interval)
        + [f"data.dir={tokenizer_dir}", "sched=constant", "model.dropout=0.1", *PROBE, *extra]
    )
    return train(cfg, loaders=loaders(cfg))


def weights(result):
    return {k: v.clone() for k, v in result.engine.module.state_dict().items()}


def test_probes_are_logged_and_leave_training_bit_identical(tmp_path, tokenizer_dir):
    """Probes every 3 steps and at the end: metrics.jsonl gets their scores; the losses and the final
    weights equal a run without probes (train.probe_interval=0, the default) bit for bit."""
    off = run(tmp_path / "off", tokenizer_dir, 7, 0)
    on = run(tmp_path / "on", tokenizer_dir, 7, 3)
    assert train_losses(tmp_path / "on") == train_losses(tmp_path / "off")  # bit-identical floats
    w_off, w_on = weights(off), weights(on)
    assert all(torch.equal(w_off[k], w_on[k]) for k in w_off)
    probes = [r for r in metrics(tmp_path / "on") if "probe/avg" in r]
    assert [r["step"] for r in probes] == [3, 6, 7]
    assert [r["tokens"] for r in probes] == [s * 4 * 32 for s in (3, 6, 7)]  # a sync point: tokens are current
    for r in probes:
        assert set(r) == {"step", "tokens", "probe/sst2", "probe/stsb", "probe/avg", "probe/seconds"}
        assert 0.0 <= r["probe/sst2"] <= 100.0 and math.isfinite(r["probe/stsb"])
        assert r["probe/avg"] == pytest.approx((r["probe/sst2"] + r["probe/stsb"]) / 2)
    assert not any(k.startswith("probe/") for r in metrics(tmp_path / "off") for k in r)


def test_resume_is_exact_with_probes_on(tmp_path, tokenizer_dir):
    """Stopped after step 4 and resumed to 8: the losses and the probe scores after the resume equal the
    uninterrupted run's (the probe's results are not training state, and it leaves the RNG alone)."""
    run(tmp_path / "whole", tokenizer_dir, 8, 2)
    run(tmp_path / "split", tokenizer_dir, 4, 2)
    run(tmp_path / "split", tokenizer_dir, 8, 2)
    assert train_losses(tmp_path / "split") == train_losses(tmp_path / "whole")
    probes = {
        name: {
            r["step"]: {k: v for k, v in r.items() if k != "probe/seconds"}
            for r in metrics(tmp_path / name)
            if "probe/avg" in r
        }
        for name in ("whole", "split")
    }
    assert sorted(probes["split"]) == [2, 4, 6, 8]
    assert probes["split"] == probes["whole"]


def test_probe_setup_errors_name_the_fix(tmp_path, tokenizer_dir):
    from types import SimpleNamespace

    cfg = compose(tiny_overrides(tmp_path, 2, probe_interval=2) + PROBE)
    with pytest.raises(
        ConfigError,
        match=r"tokenizer.json, which is not there; prepare the data first .* "
        r"train.probe_interval=0",
    ):
        probe_callbacks(
            cfg.train, cfg.model, tmp_path / "nowhere", SimpleNamespace(format="torch", is_main=True, world_size=1)
        )
    fsdp = SimpleNamespace(format="dcp", name="FSDP2Engine", is_main=True)
    with pytest.raises(ConfigError, match="FSDP2Engine shards it; set train.probe_interval=0"):
        probe_callbacks(cfg.train, cfg.model, tokenizer_dir, fsdp)
    with pytest.raises(ConfigError, match=r"train.probe_interval=-1 must be >= 0"):
        run(tmp_path / "bad", tokenizer_dir, 2, -1)


# -- the budget (train.downstream_budget) -----------------------------------------------------------------


def test_within_budget_spreads_the_passes_and_keeps_room_for_the_last():
    assert within_budget(spent=0.0, cost=5.0, elapsed=100.0, remaining=900.0, budget=0.05)  # 5 <= 5, 10 <= 50
    assert not within_budget(0.0, 5.0, 99.0, 900.0, 0.05)  # too early: 5 > 4.95
    assert not within_budget(40.0, 5.0, 900.0, 99.0, 0.05)  # 45 <= 45, but with the last pass 50 > 49.95
    assert within_budget(40.0, 5.0, 900.0, 100.0, 0.05)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def paced(budget, interval=10, steps=1000, step_seconds=1.0, pass_seconds=3.0, setup=0.0):
    """The steps a GlueProbe probes at in a simulated run, and the seconds its passes took: every step takes
    step_seconds, every pass pass_seconds, the set-up before training `setup`; one probed example of 600
    tokens at 100 tokens a step."""
    clock = FakeClock()
    probe = GlueProbe(
        [ProbeSet("sst2", [{"input_ids": [5] * 600, "labels": 0}], [])],
        0,
        interval,
        budget=budget,
        max_steps=steps,
        tokens_per_step=100,
        setup=setup,
        clock=clock,
    )

    def one_pass(engine, step):
        clock.now += pass_seconds
        return {"probe/avg": 50.0}

    probe.evaluate = one_pass
    probed = []
    for step in range(1, steps + 1):
        clock.now += step_seconds
        if probe.due(step, last=step == steps):
            assert probe(type("Engine", (), {"is_main": True}), step) == {"probe/avg": 50.0}
            probed.append(step)
    return probed, probe.spent


def test_the_budget_postpones_passes_to_keep_the_probes_within_their_share_of_training():
    """1000 steps of 1 s, passes of 3 s, budget 5%: the passes take 48 s (<= 50 s), spread over the run. The
    first is placed by the estimate (600 probe tokens = 2 steps' forward work, 1.95 s: step 40); after it, the
    measured 3 s: every 60 steps; the last step always probes, with room kept for it."""
    probed, spent = paced(budget=0.05)
    assert probed == [40, *range(130, 911, 60), 1000]
    assert spent == 3.0 * len(probed) == 48.0 <= 0.05 * 1000
    every, spent_every = paced(budget=0.0)  # no budget: every interval, as before
    assert every == list(range(10, 1001, 10)) and spent_every == 300.0
    short, _ = paced(budget=0.05, steps=30)  # a run too short for any pass in between still probes at its end
    assert short == [30]


def test_the_set_up_is_charged_to_the_budget():
    """10 s of set-up in a 1000 s run at 5%: room for the passes shrinks by 10 s (13 passes, not 16), and the
    set-up plus the passes stay within 50 s; the first waits until 5% of training covers the set-up and its
    estimated 1.95 s (step 250, not 40)."""
    probed, spent = paced(budget=0.05, setup=10.0)
    assert probed == [250, *range(330, 931, 60), 1000]
    assert 10.0 + spent == 10.0 + 3.0 * 13 == 49.0 <= 0.05 * 1000


def test_every_rank_follows_rank_0s_decision(monkeypatch):
    """A due step is a sync point on every rank: the decision is rank 0's, broadcast."""
    from lm.engine import dist as dist_utils

    calls = []
    monkeypatch.setattr(dist_utils, "broadcast_object", lambda obj: calls.append(obj) or False)
    probe = GlueProbe([], 0, interval=2, budget=0.05, max_steps=10, tokens_per_step=100, clock=FakeClock())
    assert [probe.due(s, last=s == 10) for s in range(1, 11)] == [False] * 9 + [True]
    assert len(calls) == 4  # steps 2, 4, 6, 8 asked rank 0; step 10 is the last


def test_downstream_budget_is_checked():
    from lm.core.config import OptimConfig, SchedConfig, TrainConfig, validate_train

    with pytest.raises(ConfigError, match=r"train.downstream_budget=1.5 must be in \[0, 1\)"):
        validate_train(TrainConfig(probe_interval=10, downstream_budget=1.5), OptimConfig(), SchedConfig())


def test_the_readers_stop_at_the_rows_asked_for(data_mirror):
    """The probe reads SST-2's first 1,000 training rows, not its 67k: load_split(limit=) stops reading there."""
    from lm.glue.readers import load_split

    first = load_split("sst2", "train", hf=False, limit=5)
    assert first == load_split("sst2", "train", hf=False)[:5] and len(first) == 5
