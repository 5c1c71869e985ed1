"""Sequence pooling for classifiers (lm.model.heads.pool): what each mode weights, and that right padding
never moves a pooled vector."""

import pytest
import torch

from lm.model import build_model
from lm.model.config import model_preset
from lm.model.heads import pool


def test_weighted_mean_weights_real_token_i_by_i():
    h = torch.tensor([[[1.0], [2.0], [3.0], [100.0]]])  # (B=1, T=4, D=1); the last position is padding
    padding = torch.tensor([[1, 1, 1, 0]])
    assert pool(h, padding, "weighted_mean").item() == pytest.approx((1 * 1 + 2 * 2 + 3 * 3) / (1 + 2 + 3))
    assert pool(h, padding, "mean").item() == pytest.approx(2.0)
    assert pool(h, padding, "last").item() == 3.0
    assert pool(h, None, "weighted_mean").item() == pytest.approx((1 + 4 + 9 + 400) / 10)


def test_an_unknown_pooling_names_the_allowed_ones():
    with pytest.raises(ValueError, match="allowed: first, mean, last, weighted_mean"):
        pool(torch.zeros(1, 2, 3), None, "max")


@pytest.mark.parametrize("how", ["mean", "last", "weighted_mean"])
def test_right_padding_does_not_move_a_causal_decoders_pooled_vector(how):
    torch.manual_seed(0)
    model = build_model(
        model_preset(
            "tiny", ["model.vocab_size=64", "model.dim=32", "model.n_layers=2", "model.n_heads=2", "model.dropout=0.0"]
        )
    ).eval()
    x = torch.randint(1, 64, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 5:] = 0  # the second sequence has 5 real tokens
    with torch.no_grad():
        pooled = model.pooled(x, mask, how=how)
        alone = model.pooled(x[1:, :5], how=how)
        y = x.clone()
        y[1, 5:] = torch.randint(1, 64, (4,))  # other junk in the pads
        junk = model.pooled(y, mask, how=how)
    torch.testing.assert_close(pooled[1], alone[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(junk, pooled, atol=1e-6, rtol=1e-6)


def _tiny(arch: str):
    return model_preset(
        "tiny", [f"model.arch={arch}", "model.vocab_size=64", "model.dim=32", "model.n_heads=2", "model.dropout=0.0"]
    )


def test_first_token_pooling_of_a_causal_decoder_is_refused_as_it_reads_no_input():
    from lm.glue.init import Backbone, InitError, build_classifier

    torch.manual_seed(0)
    x = torch.randint(7, 64, (4, 9))
    x[:, 0] = 1  # [BOS] first, as lm/glue/encode.py lays a decoder's input out
    with torch.no_grad():  # why: the decoder's position 0 is one vector for every input, whatever follows it
        first = build_model(_tiny("decoder")).eval().pooled(x, how="first")
    torch.testing.assert_close(first, first[:1].expand_as(first), atol=0, rtol=0)
    with pytest.raises(InitError, match="pooling=first reads position 0 .* use pooling=last"):
        build_classifier(Backbone(_tiny("decoder"), None, None, "a decoder"), 2, 0.1, pooling="first")
    for arch in ("encoder", "encoder_decoder"):  # position 0 sees the whole input there: allowed
        assert build_classifier(Backbone(_tiny(arch), None, None, arch), 2, 0.1, pooling="first").pooling == "first"
