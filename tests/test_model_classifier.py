"""The sequence classification / regression head on all three families."""

import pytest
import torch

from lm.model import SequenceClassifier, build_model
from lm.model.config import ModelConfig


def _data(n=256, T=10, V=30, seed=0):
    """Label = whether token 7 appears in the (right-padded) sequence: needs the whole input."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(8, V, (n, T), generator=g)
    labels = torch.randint(0, 2, (n,), generator=g)
    pos = torch.randint(1, T - 3, (n,), generator=g)
    x[labels == 1, pos[labels == 1]] = 7
    lengths = torch.randint(T - 3, T + 1, (n,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    x = x.masked_fill(mask == 0, 0)
    x[labels == 1, pos[labels == 1]] = 7
    return x, mask, labels


@pytest.mark.parametrize(
    "arch",
    ["decoder", "encoder", pytest.param("encoder_decoder", marks=pytest.mark.slow)],  # ~45 s: CI's slow stage
)
def test_classifier_learns_on_every_family(arch):
    torch.manual_seed(0)
    cfg = ModelConfig(arch=arch, vocab_size=30, dim=32, n_layers=2, n_heads=4, max_seq_len=16)
    clf = SequenceClassifier(build_model(cfg), n_labels=2, dropout=0.0)
    assert clf.pooling == ("first" if arch == "encoder" else "last")
    x, mask, y = _data()
    opt = torch.optim.AdamW(clf.parameters(), lr=3e-3)
    for _ in range(200):
        out = clf(x, attention_mask=mask, labels=y)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    clf.eval()
    xt, mt, yt = _data(seed=1)
    acc = (clf(xt, attention_mask=mt).logits.argmax(-1) == yt).float().mean().item()
    assert acc > 0.8, acc


def test_regression_head_uses_mse_and_padding_is_ignored():
    torch.manual_seed(0)
    cfg = ModelConfig(arch="decoder", vocab_size=30, dim=32, n_layers=1, n_heads=4, max_seq_len=16)
    clf = SequenceClassifier(build_model(cfg), n_labels=1).eval()
    x = torch.randint(1, 30, (1, 6))
    padded = torch.cat([x, torch.zeros(1, 4, dtype=torch.long)], 1)
    mask = torch.cat([torch.ones(1, 6), torch.zeros(1, 4)], 1).long()
    a, b = clf(x).logits, clf(padded, attention_mask=mask).logits
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    target = torch.tensor([2.5])
    out = clf(x, labels=target)
    torch.testing.assert_close(out.loss, (a.squeeze(-1) - target).pow(2).mean())
    assert clf.backbone.head is None  # the LM head is dropped (unused parameters break DDP)
