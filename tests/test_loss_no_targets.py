"""A micro-batch without targets (labels all -100: a short mlm window, a span batch, a padded micro-batch) among
micro-batches that have some: its loss and gradient are exactly 0, so the step trains as it would without it.

The mean cross-entropy of such a micro-batch was 0/0 = NaN; the loop weights it 0 (its share of the step's label
tokens), but NaN x 0 is NaN, so the whole step was counted non-finite (skipped, or LossDiverged under
train.on_nonfinite=stop). A step whose global batch has no target at all keeps the NaN policy.
"""

import copy

import pytest
import torch

from lm.core.config import OptimConfig, TrainConfig
from lm.core.loop import train_step
from lm.core.optim import adamw
from lm.engine import Dist, SingleEngine
from lm.model import build_model
from lm.model.config import model_preset
from tests.test_electra import SMALL as ELECTRA_SMALL  # its tiny ELECTRA

ENCODER = ["model.arch=encoder", "model.dropout=0.0"]
MODELS = {
    "decoder": ["model.dropout=0.0"],
    "encoder": ENCODER,
    "encoder_chunked": ENCODER + ["model.loss_chunk_size=4"],
    "mos": ["model.dropout=0.0", "model/output=mixture_of_softmaxes"],
    "electra": [*ELECTRA_SMALL, "model.dropout=0.0"],
}


def _step(model, micro, dense=False):
    """One optimizer step's forward and backward: (the step's loss, each parameter's gradient)."""
    model = copy.deepcopy(model)
    torch.manual_seed(0)  # ELECTRA samples its replacements from the global RNG: the same draws in each step
    engine = SingleEngine(TrainConfig(), Dist(rank=0, world_size=1, local_rank=0, device=torch.device("cpu")))
    engine.wrap(model, lambda m: adamw(m, OptimConfig()))
    loss = train_step(engine, micro, dense_labels=dense)
    return float(loss), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _micro(vocab):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(4, vocab, (2, 8), generator=g)
    labels = ids.clone()
    labels[:, ::2] = -100
    with_targets = [{"input_ids": ids[i : i + 1], "labels": labels[i : i + 1]} for i in range(2)]
    none = {"input_ids": ids[:1].flip(1), "labels": torch.full((1, 8), -100)}
    return with_targets, none


@pytest.mark.parametrize("name", list(MODELS))
def test_a_micro_batch_without_targets_changes_neither_loss_nor_gradients(name):
    torch.manual_seed(0)
    model = build_model(model_preset("tiny", MODELS[name]))
    with_targets, none = _micro(model.cfg.vocab_size)
    loss, grads = _step(model, with_targets)
    # last: ELECTRA's sampling of an earlier micro-batch would advance the RNG the others draw from
    loss_with, grads_with = _step(model, with_targets + [none])
    assert loss > 1.0 and loss_with == pytest.approx(loss, rel=1e-6), (loss, loss_with)
    assert grads.keys() <= grads_with.keys()
    for n, g in grads.items():
        torch.testing.assert_close(grads_with[n], g, rtol=1e-5, atol=1e-7, msg=n)
    for n in grads_with.keys() - grads.keys():  # a parameter only the empty micro-batch reached: no gradient
        assert torch.count_nonzero(grads_with[n]) == 0, n


def test_a_step_without_any_target_keeps_the_nan_policy():
    torch.manual_seed(0)
    model = build_model(model_preset("tiny", ENCODER))
    _, none = _micro(model.cfg.vocab_size)
    loss, _ = _step(model, [none, none])
    assert loss != loss  # NaN: the loop's non-finite policy skips the update or stops (lm/core/loop.py)
