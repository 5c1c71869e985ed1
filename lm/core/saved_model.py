"""A trained model wherever a run left it: an lm train run directory (its checkpoints/latest), one of its
checkpoints/step_* directories, or an lm export directory (model.safetensors + config.json).

lm finetune's init= (lm/glue/init.py) and lm attention (lm/report/attention_maps.py) both read through
`find_saved_model`; each names a path that is neither in its own words (`init=<path>`, `<path>`).
Like lm/core/checkpoint.py this knows no engine and no model: a checkpoint's weights are consolidated
by the engine that wrote them, and the model config is returned as a plain node for the caller to type
(lm.model.config.model_from_saved).
"""

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from lm.core.checkpoint import CheckpointError, consolidated_state_dict, resolve

EXPORT_MARKERS = (
    "model.safetensors",
    "config.json",
)  # the files of an lm export directory this reads (it may also hold hf/)
LM_CLASS = "_lm_class"  # the key lm export adds to config.json to mark its output (lm/cli/export.py)


@dataclass(frozen=True)
class SavedModel:
    path: Path  # the lm export directory, or the checkpoint directory the given path resolved to
    export: bool  # an lm export directory (else a checkpoint of any engine)

    def run_config(self) -> dict | None:
        """The pretraining run's config.yaml as a plain (unresolved) dict: a checkpoint's own; an export's
        checkpoint's when the export sits where lm export puts it by default (<checkpoint>/export), else None."""
        from omegaconf import OmegaConf

        path = (self.path.parent if self.export else self.path) / "config.yaml"
        if self.export and not path.is_file():
            return None
        config = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        assert isinstance(config, dict)  # lm writes config.yaml as a mapping
        return config

    def model_node(self) -> dict:
        """The saved model config: component slots name their class by `_target_`."""
        if not self.export:
            config = self.run_config()
            assert config is not None  # None only for an export
            return config["model"]
        file = self.path / "config.json"
        try:
            node = json.loads(file.read_text())
        except ValueError as e:  # not JSON, or not UTF-8
            node = e
        if not isinstance(node, dict):
            why = f"not valid JSON: {node}" if isinstance(node, ValueError) else f"a JSON {type(node).__name__}"
            raise CheckpointError(
                f"{file} is {why}, not the model config lm export writes; restore it (export the checkpoint again)"
            )
        if LM_CLASS not in node and "model_type" in node:  # save_pretrained's config.json (ModelSchema has no such key)
            raise CheckpointError(
                f"{self.path} is a Hugging Face model directory (config.json: model_type={node['model_type']!r}), "
                f"not an lm export; lm reads a Hugging Face model through lm.model.convert.from_hf in Python "
                f"(docs/convert.md)"
            )
        node.pop(LM_CLASS, None)
        return node

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The full weights; a checkpoint's files are verified against its manifest before any is read."""
        if not self.export:
            return consolidated_state_dict(self.path)
        from safetensors.torch import load_file

        return load_file(str(self.path / "model.safetensors"))


def recorded_tokenizer_sha256(ckpt) -> str | None:
    """The sha256 of the tokenizer.json a run was pretrained with, as its packed loader recorded it in the
    checkpoint's rank00000.pt; None when not recorded (a run on other loaders, or no checkpoint). A data
    directory re-prepared since holds another file: lm finetune, lm attention and lm export refuse it.
    Raises lm.core.checkpoint.CheckpointError when rank00000.pt cannot be read."""
    from lm.core.checkpoint import load_rank_state  # weights_only, legacy RNG states allowed

    path = Path(ckpt) / "rank00000.pt"
    if not path.is_file():
        return None
    loader = load_rank_state(path).get("loader") or {}
    return loader.get("tokenizer_sha256") if isinstance(loader, dict) else None


def find_saved_model(path) -> SavedModel:
    """The saved model at `path`. Raises FileNotFoundError when `path` does not exist, and
    lm.core.checkpoint.CheckpointError (naming what it looked for) when it is neither kind."""
    path = Path(path).expanduser()
    if all((path / name).is_file() for name in EXPORT_MARKERS):
        return SavedModel(path, export=True)
    if not path.exists():
        raise FileNotFoundError(path)
    return SavedModel(resolve(path), export=False)
