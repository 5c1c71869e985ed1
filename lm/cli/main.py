"""`lm <command> ...`: the one console script. Each command is a module of lm/cli with its own `main()`.

    lm --help                      # the commands, one line each
    lm train model=tiny train.max_steps=200
    lm <command> --help            # that command's usage (Hydra apps: overrides and config groups)
    torchrun --nproc_per_node 2 -m lm train engine=ddp   # python -m lm / torchrun -m lm / deepspeed --module lm

Adding a command is one row of COMMANDS. The dispatcher only rewrites sys.argv, so the command's main()
parses what follows its name exactly as `python -m lm.cli.<module>` would.
"""

from __future__ import annotations

import importlib
import sys
from typing import NamedTuple

from lm.cli.errors import entry


class Command(NamedTuple):
    module: str
    summary: str
    function: str = "main"  # the module's function that runs the command


COMMANDS: dict[str, Command] = {
    "train": Command("lm.cli.train", "pretrain a decoder, encoder or encoder-decoder (Hydra overrides)"),
    "finetune": Command("lm.cli.finetune", "finetune a run, an export or a scratch model on GLUE (Hydra overrides)"),
    "prepare": Command("lm.cli.prepare", "text, JSONL, Parquet, CSV/TSV or a registry corpus -> tokenizer + shards"),
    "export": Command("lm.cli.export", "a checkpoint of any engine -> safetensors (+ a Hugging Face directory)"),
    "report": Command("lm.cli.report", "a sweep's comparison table and plots, or one run's card"),
    "attention": Command("lm.cli.attention", "attention heatmaps of a trained model on a text"),
    "eval": Command("lm.cli.eval", "the LM Evaluation Harness or the GLUE probes on a run, checkpoint or export"),
    "preflight": Command("lm.cli.preflight", "check a cluster (ranks, GPUs, all-reduce, disk) before a long run"),
    "quickstart": Command(
        "lm.cli.transfer",
        "the transfer recipe in minutes on a CPU: pretrain, finetune on GLUE, print the table",
        "quickstart",
    ),
    "transfer": Command(
        "lm.cli.transfer", "the GLUE transfer recipe: pretrain, finetune every task pretrained and from scratch"
    ),
}


# what a newcomer runs first, as README.md's "Three commands to run first" shows them
FIRST_RUNS = (
    "  lm quickstart                                                  # pretrain, finetune on GLUE, print the table\n"
    "  lm train model=tiny data=shakespeare_char train.max_steps=200  # a pretraining smoke run\n"
    "  lm train data.source=my_text.txt train.max_steps=200           # your own text"
)


def usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {c.summary}" for name, c in COMMANDS.items())
    return (
        f"usage: lm <command> [args]\n\nPretrain and finetune Transformer language models.\n\n"
        f"commands:\n{rows}\n\nfirst runs (README.md):\n{FIRST_RUNS}\n\n`lm <command> --help` for a command's options; "
        f"`python -m lm <command>` and `torchrun -m lm <command>` work the same way."
    )


def without_launcher_rank(args: list[str]) -> list[str]:
    """`deepspeed --module lm train ...` runs `python -m lm --local_rank=N train ...`: the launcher's flag comes
    before the command name (torch.distributed.launch's `--local-rank=N` likewise). LOCAL_RANK in the environment
    says the same, and that is what lm reads."""
    while args and args[0].startswith(("--local_rank=", "--local-rank=")):
        args = args[1:]
    return args


@entry("lm")
def main(argv: list[str] | None = None) -> None:
    args = without_launcher_rank(sys.argv[1:] if argv is None else list(argv))
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        sys.exit(0 if args else 2)
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        sys.exit(f"lm: unknown command {name!r}; one of: {', '.join(COMMANDS)} (lm --help)")
    command = COMMANDS[name]
    # argv[0] is what argparse prints as the program and what the apps' errors start with
    sys.argv = [f"lm {name}", *rest]
    status = getattr(importlib.import_module(command.module), command.function)()
    sys.exit(status if isinstance(status, int) else 0)
