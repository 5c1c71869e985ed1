"""glue.pad_to_multiple_of: a batch's length rounded up to a multiple (at most the task's max_len), so a compiled
model (train.compile, train.compile_mode=reduce_overhead's CUDA graphs) meets few distinct shapes. Pads are
masked, so every pooling and pair reading gives the classifier the same logits and loss as the shortest padding;
and train.compile_mode reaches torch.compile."""

import pytest
import torch

from lm.config import ConfigError
from lm.core.config import CompileMode, OptimConfig, SchedConfig, TrainConfig, validate_train
from lm.engine.base import Engine
from lm.engine.dist import Dist
from lm.glue import collate, encode_examples
from lm.glue.encode import padded_length
from lm.glue.readers import Example
from lm.model import SequenceClassifier, build_model
from lm.model.config import model_preset
from tests.test_glue_encode import WordTokenizer

WORDS = ["the", "a", "cat", "dog", "sat", "ran", "on", "under", "mat", "log", "red", "big", "small", "quick", "slow"]


def examples(pair: bool, regression: bool) -> list[Example]:
    """Eight examples of 1-11 words per sentence (lengths that no multiple of 16 fits alike), from 15 words."""
    rows = []
    for i in range(8):
        a = " ".join(WORDS[(i * j) % len(WORDS)] for j in range(1 + (i * 5) % 11))
        b = " ".join(WORDS[(i + j) % len(WORDS)] for j in range(1 + (i * 3) % 7)) if pair else None
        rows.append(Example(i, a, b, i / 2 if regression else i % 2))
    return rows


@pytest.mark.parametrize(
    ("longest", "multiple", "cap", "want"),
    [
        (5, 1, None, 5),
        (5, 8, None, 8),
        (8, 8, None, 8),
        (9, 8, 128, 16),
        (120, 32, 128, 128),
        (100, 64, 110, 110),  # rounded past the cap: the cap
        (130, 32, 128, 130),  # longer than the cap already (never cut): itself
    ],
)
def test_padded_length(longest, multiple, cap, want):
    assert padded_length(longest, multiple, cap) == want


def test_collate_rounds_every_row_of_a_pair_batch_up_to_the_multiple():
    tok = WordTokenizer()
    rows = examples(pair=True, regression=True)
    feats = encode_examples(tok, rows, max_len=24, arch="encoder", pair_input="siamese")
    tight, padded = collate(feats, tok.pad_id), collate(feats, tok.pad_id, multiple=16, cap=24)
    t = tight["input_ids"].shape[1]
    assert padded["input_ids"].shape == (2 * len(rows), min(-(-t // 16) * 16, 24))
    assert padded["input_ids"].shape[1] > t  # the fixtures' longest is not a multiple of 16: this test pads
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        assert torch.equal(padded[key][:, :t], tight[key])
    assert (padded["attention_mask"][:, t:] == 0).all() and (padded["input_ids"][:, t:] == tok.pad_id).all()
    assert torch.equal(padded["labels"], tight["labels"])


@pytest.mark.parametrize(
    ("arch", "pooling", "task", "pair_input"),
    [
        ("encoder", "first", "rte", "joint"),
        ("encoder", "mean", "stsb", "siamese"),
        ("decoder", "last", "mrpc", "both_orders"),
        ("decoder", "weighted_mean", "sst2", "joint"),
    ],
)
def test_pads_change_neither_logits_nor_loss(arch, pooling, task, pair_input):
    tok = WordTokenizer()
    torch.manual_seed(0)
    pos = "rope" if arch == "encoder" else "learned"  # the GPU recipe's encoder; a decoder's learned positions
    cfg = model_preset("tiny", [f"model.arch={arch}", f"model/pos={pos}", "model.vocab_size=74", "model.dim=32"])
    n_labels = 1 if task == "stsb" else 2
    clf = SequenceClassifier(build_model(cfg), n_labels=n_labels, pooling=pooling, dropout=0.0, pair_input=pair_input)
    clf.eval()
    feats = encode_examples(tok, examples(pair=task != "sst2", regression=task == "stsb"), 24, arch, pair_input)
    short, long = collate(feats, tok.pad_id), collate(feats, tok.pad_id, multiple=32, cap=64)
    assert long["input_ids"].shape[1] == 32 > short["input_ids"].shape[1]
    tight, padded = clf(**short), clf(**long)
    torch.testing.assert_close(padded.logits, tight.logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(padded.loss, tight.loss, rtol=0, atol=1e-5)


def test_compile_mode_needs_compile_and_reaches_torch_compile(monkeypatch):
    with pytest.raises(ConfigError, match=r"train.compile_mode=reduce_overhead .* add train.compile=true"):
        validate_train(TrainConfig(compile_mode=CompileMode.reduce_overhead), OptimConfig(), SchedConfig())
    seen = []
    monkeypatch.setattr(torch, "compile", lambda model, mode=None: seen.append(mode) or model)
    model = build_model(model_preset("tiny", ["model.vocab_size=74"]))
    for mode in (CompileMode.default, CompileMode.reduce_overhead):
        engine = Engine(TrainConfig(compile=True, compile_mode=mode), Dist(0, 1, 0, torch.device("cpu")))
        engine.wrap(model, lambda m: torch.optim.AdamW(m.parameters()))
    assert seen == ["default", "reduce-overhead"]
