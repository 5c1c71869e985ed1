"""Model code: single-device PyTorch. `build_model(cfg)` (lm/model/build.py) is the only place it meets Hydra.

Public API from `lm.model` itself: build_model, ModelConfig, validate_model, Block, DecoderLM, EncoderLM,
EncoderDecoderLM, SequenceClassifier, each imported on first use, so `from lm.model.lm import DecoderLM` reads
only what a GPT needs. From their own modules: model_preset / model_from_saved (lm.model.config), generate
(lm.model.generate), from_hf / to_hf (lm.model.convert), num_params / flops_per_token (lm.model.flops).
"""

import importlib

_HOMES = {
    "build_model": "lm.model.build",
    "components": "lm.model.build",
    "ARCH_CLASSES": "lm.model.build",
    "Block": "lm.model.block",
    "DecoderLM": "lm.model.lm",
    "EncoderLM": "lm.model.lm",
    "EncoderDecoderLM": "lm.model.lm",
    "SequenceClassifier": "lm.model.lm",
    "ModelConfig": "lm.model.config",
    "validate_model": "lm.model.validate",
}

__all__ = [
    "build_model",
    "Block",
    "DecoderLM",
    "EncoderLM",
    "EncoderDecoderLM",
    "SequenceClassifier",
]


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
