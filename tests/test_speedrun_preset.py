"""experiment=shakespeare_char_cpu is nanoGPT's character-level tiny-Shakespeare CPU recipe, value by value.

The recipe (nanoGPT README, "baby GPT" on a CPU): 4 layers, width 128, 4 heads, context 64, batch 12,
2000 iterations, dropout 0, AdamW betas (0.9, 0.99), weight decay 0.1, lr 1e-3 with 100 warmup steps
and cosine decay to 1e-4, validation loss over 20 batches, the first 90% of the text to train on.
Its speed is measured by the command in BENCHMARKS.md, not here.
"""

import pytest

from lm.config import ConfigError
from tests.engine_support import compose


@pytest.fixture(scope="module")
def cfg():
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from lm.config import conf_dir, register_train_configs

    register_train_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        return hydra_compose(config_name="train", overrides=["experiment=shakespeare_char_cpu", "run_dir=/tmp/unused"])


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

    data = OmegaConf.to_object(cfg.data)  # the typed DataConfig lm-train passes down
    data.dir = str(tmp_path / "data")
    root = ensure_prepared(data)
    tok = Tokenizer.load(root)
    text_ids = [i for i in range(tok.vocab_size) if i not in tok.special_ids]
    assert len(text_ids) == 65
    assert len(tok.special_ids) == 7
    assert tok.vocab_size == cfg.model.vocab_size == 72


def test_threads_must_be_positive(tmp_path):
    from lm.cli.train import train
    from tests.engine_support import loaders, tiny_overrides

    c = compose(tiny_overrides(tmp_path, 2) + ["train.threads=0"])
    with pytest.raises(ConfigError, match="train.threads=0"):
        train(c, loaders=loaders(c))
