"""The Hugging Face directory lm export writes: the model (to_hf) plus the run's tokenizer.

`AutoModel*.from_pretrained(dir)` and `AutoTokenizer.from_pretrained(dir)` both work on it, and
its config.json / generation_config.json carry the tokenizer's bos/eos/pad ids (transformers'
generate stops at eos and pads with pad).
"""

import logging
import os
from pathlib import Path
from typing import Optional

from lm.model.convert import to_hf

log = logging.getLogger("lm")

ROLES = ("bos", "eos", "pad", "unk", "mask", "sep", "cls")


def write_hf_dir(model, out: Path, tokenizer_file: Optional[Path] = None) -> Path:
    """Save `to_hf(model)` (ValueError when no family matches) and, when given, the tokenizer into `out`."""
    hf_model = to_hf(model)
    if tokenizer_file is not None:
        tokenizer = _fast_tokenizer(Path(tokenizer_file))
        generation = getattr(hf_model, "generation_config", None)  # masked LMs (BERT) have none
        for role in ("bos", "eos", "pad"):
            token_id = getattr(tokenizer, f"{role}_token_id")
            for config in (hf_model.config, generation):
                if config is not None:
                    setattr(config, f"{role}_token_id", token_id)
        tokenizer.save_pretrained(out)
    else:
        log.warning("no tokenizer for the Hugging Face export: config.json has no bos/eos/pad ids")
    hf_model.save_pretrained(out)
    return Path(out)


def _fast_tokenizer(path: Path):
    """Our tokenizer (roles found as lm.data.tokenizer finds them) as a transformers fast tokenizer."""
    from tokenizers import Tokenizer as HFTokenizer

    from lm.data.tokenizer import Tokenizer
    from lm.extras import require

    PreTrainedTokenizerFast = require("hf", "writing the tokenizer into lm export's hf/ directory").PreTrainedTokenizerFast

    ours = Tokenizer.load(path)
    # to_str(): the tokenizer as loaded, with any role tokens it had to add, so the ids agree
    tokens = {f"{role}_token": ours.id_to_token(getattr(ours, f"{role}_id")) for role in ROLES}
    return PreTrainedTokenizerFast(tokenizer_object=HFTokenizer.from_str(ours.to_str()), **tokens)


def run_tokenizer_file(run_cfg) -> Optional[Path]:
    """<data.dir>/tokenizer.json of a run's config (as lm prepare writes it), or None when not there."""
    from omegaconf import OmegaConf

    from lm.config import register_train_configs

    data = run_cfg.get("data") if hasattr(run_cfg, "get") else None
    if not data or not data.get("dir"):
        return None
    register_train_configs()  # the ${oc.env:...} resolvers of lm train's config
    try:
        path = Path(os.path.expanduser(str(OmegaConf.create({"data": data}).data.dir))) / "tokenizer.json"
    except Exception:  # noqa: BLE001 - an unresolvable interpolation: no tokenizer to write
        return None
    return path if path.is_file() else None
