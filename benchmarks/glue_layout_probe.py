"""Probe (not the recipe): lm transfer with GLUE inputs laid out as [EOS] a [EOS] b [EOS] instead of
[CLS] a [SEP] b [SEP]. Masked-LM pretraining on documents never produces [CLS] or [SEP] (documents are
joined by [EOS]), so this asks whether the pretrained arm loses by meeting them as untrained rows. Both arms
get the same layout; every argument goes to lm transfer (docs/glue_transfer.md, 2026-11-26 11:00 UTC):

    python benchmarks/glue_layout_probe.py --preset glue_transfer_encoder --tokens 3e7 \\
        --out runs/sep_probe/encoder/30000000 --scratch runs/sep_probe/encoder/scratch \\
        --arm pretrained --tasks mrpc,rte,stsb --seeds 0 --finetune pooling=mean
"""

import sys

import lm.glue.encode as encode

_build_inputs = encode.build_inputs


class _EosForSpecials:
    """The tokenizer, with [EOS]'s id wherever the layout asks for [CLS], [SEP] or [BOS]."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer

    def __getattr__(self, name):
        if name in ("cls_id", "sep_id", "bos_id"):
            return self._tokenizer.eos_id
        return getattr(self._tokenizer, name)


def build_inputs(tokenizer, a, b, max_len, arch):
    return _build_inputs(_EosForSpecials(tokenizer), a, b, max_len, arch)


def main(argv: list[str]) -> None:
    if "--parallel" in argv:  # its scratch lane is a plain lm transfer process: [CLS]/[SEP] in one arm only
        sys.exit(
            "glue_layout_probe.py: --parallel runs the scratch arm as a plain lm transfer process, which lays its "
            "inputs out with [CLS]/[SEP]; drop --parallel (or run --arm scratch in a second call of this script)"
        )
    encode.build_inputs = build_inputs  # encode_examples looks it up in its module at call time
    from lm.cli import transfer

    transfer.main(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
