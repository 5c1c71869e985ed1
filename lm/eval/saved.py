"""A saved model in eval mode, with its tokenizer, from a run directory, checkpoint or lm export directory.

Loading goes through lm.glue.init.load_backbone (lm/core/saved_model.py finds the model; the engine that
wrote a checkpoint consolidates it), as lm finetune's init= and lm attention do.
"""

from typing import Any

from lm.config import ConfigError


def load_model(path, tokenizer: str | None = None) -> tuple[Any, Any]:
    """(model in eval mode, lm.data.tokenizer.Tokenizer). Raises ConfigError naming the path and the fix."""
    model, tok, _ = load_with_weights(path, tokenizer)
    return model, tok


def load_with_weights(path, tokenizer: str | None = None) -> tuple[Any, Any, str | None]:
    """load_model's pair and which weights were read (a checkpoint's step and manifest sha256, an export's
    model.safetensors sha256: lm/glue/init.py's Backbone.weights), which lm eval's record names."""
    from lm.glue.init import InitError, load_backbone
    from lm.model import build_model

    try:
        backbone = load_backbone(str(path), tokenizer=tokenizer)
    except InitError as e:
        # lm finetune's words: its tokenizer= is --tokenizer here, and init=none (random weights) is not offered
        message = str(e).replace("tokenizer=", "--tokenizer ").replace(", or init=none", "")
        raise ConfigError(message[len("init=") :] if message.startswith("init=") else message) from None
    model = build_model(backbone.model_cfg)
    missing, unexpected = model.load_state_dict(backbone.state_dict or {}, strict=False)
    tied = {"head.proj.weight", "head.unfactor.weight"} if backbone.model_cfg.output_tied else set()
    if unexpected or set(missing) - tied:
        raise ConfigError(
            f"{backbone.source} does not match its model config: missing={sorted(set(missing) - tied)}, "
            f"unexpected={sorted(unexpected)}"
        )
    return model.eval(), backbone.tokenizer, backbone.weights
