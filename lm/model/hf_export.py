"""The Hugging Face directory lm export writes: the model (to_hf) plus a transformers tokenizer.

`AutoModel*.from_pretrained(dir)` and `AutoTokenizer.from_pretrained(dir)` both work on it, and
its config.json / generation_config.json carry the tokenizer's bos/eos/pad ids (transformers'
generate stops at eos and pads with pad). The tokenizer comes built (lm/cli/export.py reads the run's
tokenizer.json through lm.data): model code never imports lm.data or the config root.
"""

import logging
from pathlib import Path

from lm.model.convert import to_hf

log = logging.getLogger("lm")


class _NoCpuNotice(logging.Filter):
    """save_pretrained has accelerate import deepspeed, when installed (lm[dev] has it), to unwrap a DeepSpeedEngine;
    without CUDA that import warns 'Setting accelerator to CPU. If you have GPU or other accelerator, we were unable
    to detect it.' An export needs no accelerator: the line only alarmed (lm export on a laptop printed it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Setting accelerator to CPU")


_NO_CPU_NOTICE = _NoCpuNotice()


def write_hf_dir(model, out: Path, tokenizer=None) -> Path:
    """Save `to_hf(model)` (ValueError when no family matches) and, when given, `tokenizer` (a transformers
    PreTrainedTokenizerFast) into `out`."""
    hf_model = to_hf(model)
    if hf_model.get_output_embeddings() is None:  # ESM's encoder alone (lm.model.hf_encoders.ESM_BACKBONE)
        log.warning(
            "hf/ holds %s, the encoder without its MLM head (Hugging Face's head has a transform this model "
            "lacks: model.mlm_transform=false); model.safetensors holds the whole model",
            type(hf_model).__name__,
        )
    if tokenizer is not None:
        generation = getattr(hf_model, "generation_config", None)  # masked LMs (BERT) have none
        for role in ("bos", "eos", "pad"):
            token_id = getattr(tokenizer, f"{role}_token_id")
            for config in (hf_model.config, generation):
                if config is not None:
                    setattr(config, f"{role}_token_id", token_id)
        # the trained length: transformers' default (1e30) let truncation=True pass inputs past the position table
        tokenizer.model_max_length = model.cfg.max_seq_len
        tokenizer.save_pretrained(out)
    else:
        log.warning("no tokenizer for the Hugging Face export: config.json has no bos/eos/pad ids")
    logging.getLogger("DeepSpeed").addFilter(_NO_CPU_NOTICE)  # deepspeed's logger, before its import; once
    hf_model.save_pretrained(out)
    return Path(out)
