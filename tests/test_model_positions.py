"""Position schemes against their reference implementations, and the settings a scheme cannot compute refused
before building (tests/test_model_behaviour.py: causality, padding and the KV cache of every scheme)."""

import pytest
import torch

from lm.config import ConfigError
from lm.model import build_model
from lm.model.config import ModelConfig, RoPEConfig, T5BiasConfig
from lm.model.position import alibi_slopes, t5_bucket

transformers = pytest.importorskip("transformers")
from transformers.models.bloom.modeling_bloom import build_alibi_tensor  # noqa: E402
from transformers.models.t5.modeling_t5 import T5Attention  # noqa: E402


@pytest.mark.parametrize("n_heads", [1, 2, 3, 5, 6, 8, 12, 16, 20, 24, 40])
def test_alibi_slopes_are_blooms_for_any_head_count(n_heads):
    """Press et al.'s interleaving for a head count that is not a power of two, as BLOOM builds it."""
    theirs = build_alibi_tensor(torch.ones(1, 3), n_heads, torch.float32)[:, 0, 1]  # (H, 1, T): slope * position
    torch.testing.assert_close(alibi_slopes(n_heads).float(), theirs, rtol=1e-6, atol=0)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 16), (32, 20), (64, 256), (6, 10)])
def test_t5_buckets_are_hugging_faces_past_max_distance(bidirectional, num_buckets, max_distance):
    relative = torch.arange(-600, 600)[None, :]  # key minus query position, far past max_distance both ways
    theirs = T5Attention._relative_position_bucket(relative, bidirectional, num_buckets, max_distance)
    assert torch.equal(t5_bucket(relative, bidirectional, num_buckets, max_distance), theirs)


def tiny(arch="decoder", **kw) -> ModelConfig:
    return ModelConfig(**{"arch": arch, "vocab_size": 50, "dim": 32, "n_layers": 1, "n_heads": 4, **kw})


@pytest.mark.parametrize(
    "arch,num_buckets,max_distance,stack",
    [
        ("encoder", 32, 8, "bidirectional"),  # log(8 / 8) = 0 divides: bucket indices of -2^63
        ("decoder", 32, 4, "causal"),  # max_distance below the 16 exact buckets: distance 20 shared bucket 14 with 14
        ("encoder_decoder", 32, 12, "causal"),  # the encoder's 8 exact buckets are fine, the decoder's 16 are not
        ("encoder", 2, 8, "bidirectional"),  # no exact bucket: log(distance / 0)
    ],
)
def test_t5_bias_refuses_buckets_its_log_spacing_cannot_make(arch, num_buckets, max_distance, stack):
    cfg = tiny(arch, pos=T5BiasConfig(num_buckets=num_buckets, max_distance=max_distance))
    with pytest.raises(ConfigError, match=f"a {stack} stack's exact buckets"):
        build_model(cfg)


def test_t5_bias_with_few_buckets_still_builds_where_they_are_enough():
    build_model(tiny("decoder", pos=T5BiasConfig(num_buckets=2, max_distance=2)))  # one exact bucket, one log
    build_model(tiny("encoder_decoder", pos=T5BiasConfig(num_buckets=8, max_distance=5)))


@pytest.mark.parametrize(
    "head_dim,scaling,match",
    [(5, None, "even head dimension, not 5"), (2, "dynamic", "even head dimension above 2, not 2")],
)
def test_rope_refuses_a_head_dimension_it_cannot_rotate(head_dim, scaling, match):
    """An odd head_dim built and then failed in the first forward with a shape error; dynamic scaling at head_dim 2
    divided by zero once a sequence passed the trained length."""
    cfg = tiny(n_heads=2, head_dim=head_dim, pos=RoPEConfig(scaling=scaling, factor=2.0))
    with pytest.raises(ConfigError, match=match):
        build_model(cfg)
    build_model(tiny(n_heads=2, head_dim=head_dim + 1 + (scaling is not None), pos=RoPEConfig(scaling=scaling)))
