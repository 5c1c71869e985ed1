"""Tiny models for the model/attn tests (tests/test_attention_*.py): one per option and stack, composed as lm train
composes them, and their inputs."""

import torch

from lm.model import build_model
from lm.model.config import ModelConfig, model_preset

OPTIONS = ["scaled_dot", "dot", "multiplicative", "additive", "linformer"]
V = 50


def cfg_of(option, arch="decoder", picks=(), **over) -> ModelConfig:
    """A tiny model with a large init (every dependency visible), composed as lm train would; picks: group
    options (model/stack=funnel)."""
    args = [
        f"model/attn={option}",
        f"model.arch={arch}",
        f"model.vocab_size={V}",
        "model.dim=32",
        "model.max_seq_len=32",
        "model.init_std=0.1",
        *picks,
    ]
    return model_preset("tiny", args + [f"model.{k}={v}" for k, v in over.items()])


def model_of(option, arch="decoder", seed=0, picks=(), **over):
    torch.manual_seed(seed)
    return build_model(cfg_of(option, arch, picks, **over)).eval()


def ids(*shape, seed=0):
    return torch.randint(1, V, shape, generator=torch.Generator().manual_seed(seed))


def perturb_pads(x, mask):
    """`x` with every padded position (mask 0) changed: what a mask with zero leakage never shows."""
    return torch.where(mask.bool(), x, (x + 7) % V)
