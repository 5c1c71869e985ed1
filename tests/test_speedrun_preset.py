"""experiment=shakespeare_char_nanogpt is nanoGPT's character-level tiny-Shakespeare CPU recipe, value by value;
experiment=shakespeare_char_cpu (the CPU speedrun) differs from it only where its comments say.

The recipe (nanoGPT README, "baby GPT" on a CPU): 4 layers, width 128, 4 heads, context 64, batch 12,
2000 iterations, dropout 0, AdamW betas (0.9, 0.99), weight decay 0.1, lr 1e-3 with 100 warmup steps
and cosine decay to 1e-4, validation loss over 20 batches, the first 90% of the text to train on.
Its speed is measured by the command in docs/results.md, not here.
"""

import pytest

from lm.config import ConfigError
from tests.benchmark_scripts import load
from tests.engine_support import compose


def _compose(experiment):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from lm.config import conf_dir, register_train_configs

    register_train_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        return hydra_compose(config_name="train", overrides=[f"experiment={experiment}", "run_dir=/tmp/unused"])


@pytest.fixture(scope="module")
def cfg():
    return _compose("shakespeare_char_nanogpt")


@pytest.fixture(scope="module")
def speedrun():
    return _compose("shakespeare_char_cpu")


def test_model_is_nanogpts_baby_gpt(cfg):
    from omegaconf import OmegaConf

    from lm.model import build_model

    m = cfg.model
    assert (m.arch, m.n_layers, m.dim, m.n_heads, m.max_seq_len) == ("decoder", 4, 128, 4, 64)
    assert (m.dropout, m.bias, m.norm.bias, m.tie_embeddings, m.norm_position) == (0.0, False, False, True, "pre")
    assert m.ffn.activation == "gelu" and m.pos._target_.endswith("Learned")
    model = build_model(OmegaConf.to_object(m))
    # nanoGPT counts 0.80M parameters for this model at vocabulary 65 (its print excludes the
    # position table); 7 more vocabulary rows of 128 here.
    n_pos = 64 * 128
    assert model.num_params() - n_pos == pytest.approx(0.80e6 + 7 * 128, abs=0.01e6)


def test_training_recipe(cfg):
    t, o, s = cfg.train, cfg.optim, cfg.sched
    assert (t.micro_batch_size, t.grad_accum, t.seq_len, t.max_steps, t.grad_clip) == (12, 1, 64, 2000, 1.0)
    assert (t.eval_batches, t.eval_interval, t.precision) == (20, 250, "fp32")
    assert (o.lr, list(o.betas), o.weight_decay) == (1e-3, [0.9, 0.99], 0.1)
    assert (s.kind, s.warmup_steps) == ("cosine", 100)
    assert o.lr * s.min_lr_ratio == pytest.approx(1e-4)
    assert cfg.data.tokenizer == "char" and cfg.data.split == "contiguous" and cfg.data.val_fraction == 0.1
    assert cfg.data.train_stride == 1  # every offset a window, as nanoGPT's random offsets


def test_char_vocabulary_is_the_65_symbols_plus_reserved_ids(cfg, tmp_path):
    """Tiny Shakespeare has 65 distinct characters; the tokenizer adds only the 7 fixed role ids
    (no sentinels), and the model's vocabulary holds exactly that."""
    from omegaconf import OmegaConf

    from lm.data.prepare import ensure_prepared
    from lm.data.tokenizer import Tokenizer

    data = OmegaConf.to_object(cfg.data)  # the typed DataConfig lm train passes down
    data.dir = str(tmp_path / "data")
    root = ensure_prepared(data)
    tok = Tokenizer.load(root)
    text_ids = [i for i in range(tok.vocab_size) if i not in tok.special_ids]
    assert len(text_ids) == 65
    assert len(tok.special_ids) == 7
    assert tok.vocab_size == cfg.model.vocab_size == 72


def test_speedrun_differs_from_nanogpt_only_in_lr_schedule_steps_and_positions(cfg, speedrun):
    """The speedrun trains nanoGPT's model on nanoGPT's data and batch; what it changes is listed in its
    preset (docs/results.md has the measurements): lr 3e-3, linear decay to zero after 50 warmup steps,
    RoPE instead of the learned position table, 1100 steps."""
    from omegaconf import OmegaConf

    a, b = OmegaConf.to_container(cfg, resolve=True), OmegaConf.to_container(speedrun, resolve=True)
    assert b["model"]["pos"]["_target_"].endswith("RoPE") and a["model"]["pos"]["_target_"].endswith("Learned")
    assert (b["optim"]["lr"], b["train"]["max_steps"]) == (3e-3, 1100)
    assert (b["sched"]["kind"], b["sched"]["warmup_steps"], b["sched"]["min_lr_ratio"]) == ("linear", 50, 0.0)
    for d in (a, b):  # everything else is nanoGPT's recipe
        del d["model"]["pos"], d["train"]["max_steps"], d["optim"]["lr"], d["sched"]
    assert a == b


def test_threads_must_be_positive(tmp_path):
    from lm.cli.train import train
    from tests.engine_support import loaders, tiny_overrides

    c = compose(tiny_overrides(tmp_path, 2) + ["train.threads=0"])
    with pytest.raises(ConfigError, match="train.threads=0"):
        train(c, loaders=loaders(c))


def test_full_val_scoring_windows_tile_the_split_and_target_the_next_token():
    """benchmarks/speedrun_full_val.py scores both programs on the same windows: every whole 64-token window
    from the split's start, each position's target the next token (the last window's target may be the
    token just past it)."""
    import numpy as np

    full_val = load("speedrun_full_val")
    x, y = full_val.windows(np.arange(200, dtype=np.uint16))
    assert x.shape == y.shape == (3, 64)  # (200 - 1) // 64 whole windows
    assert x[1, 0] == 64 and x[2, -1] == 191 and y[2, -1] == 192
    assert (y[:, :-1] == x[:, 1:]).all()
