"""`lm quickstart`: the README's main job. Pretrain a small decoder on books, finetune it on GLUE, print the table.

    lm quickstart                          # pretrain 2M tokens, finetune on SST-2, CoLA and STS-B (README: timing)
    lm quickstart --compare                # also finetune the same model from random weights: both tables + the gain
    lm quickstart --compare --seeds 0,1,2  # with three finetuning seeds (3x the finetuning time)
    lm quickstart --tokens 300000 --tasks sst2,rte --out runs/qs-small
    lm quickstart --pretrain train.precision=fp32   # a CPU without bf16 units (see below)

It is lm transfer's recipe (lm/cli/transfer.py, docs/glue_transfer.md) cut to a ~15-minute CPU budget:

1. Corpus: `data=gutenberg_mix_bpe`, prepared once into the cache (~1 min on 2 cores): 724 Project Gutenberg
   books, WikiText-2 raw valid + test, the TinyStories slice and the UNLABELLED training sentences of SST-2,
   CoLA, MRPC, STS-B and RTE (task-adaptive pretraining, Gururangan et al. 2020; labels, dev and test text
   are never used); a byte-level BPE of 8,192 tokens. Files come from $LM_DATA_MIRROR, else the download
   cache, else are downloaded (lm.data.corpora).
2. Pretraining: `lm train experiment=glue_transfer_decoder` (a GPT-style decoder of 4 layers x 256, 5.3M
   parameters; bf16 autocast, which a CPU without bf16 units runs slower than fp32) for --tokens tokens,
   batches of 16 x 128.
3. lm finetune on each task from the checkpoint (mean pooling; 3 epochs, lr 5e-4, SST-2's first 5,000 and
   STS-B's first 2,000 training examples, best dev epoch); with --compare also from scratch (init=none: the
   same model and tokenizer, random weights, the same finetuning settings).

Everything lands under --out (default runs/quickstart): pretrain/ (an lm train run dir), finetune/pretrained/
(and finetune/scratch/), each with results.json / results.md. The same command resumes an interrupted run.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Dict, List

from lm.cli.errors import entry

log = logging.getLogger("lm")

DEFAULT_TASKS = ("sst2", "cola", "stsb")
PRESET = "glue_transfer_decoder"
# Pretraining tokens: the most that leaves the whole default job (corpus, pretraining, three finetunes) inside
# a ~15-minute budget on a 2-core CPU, with room for slower ones (docs/results.md has the timings).
TOKENS = 2_000_000
# The quickstart's finetuning budget, the same for every task and for both inits (conf/task/glue/ holds
# the full recipes): 3 epochs at lr 5e-4 (tiny models want more than BERT's 2e-5..1e-4, Turc et al.
# 2019), the first 5000 of SST-2's 67k training sentences and the first 2000 of STS-B's 5749 pairs.
QUICK_EXAMPLES = {"sst2": 5000, "stsb": 2000}


def quick_overrides(tasks: List[str], seeds: List[int]) -> List[str]:
    """The quickstart budget as lm finetune overrides of the selected tasks (tasks.<task>.<field>)."""
    out = [f"task=[{','.join(f'glue/{t}' for t in tasks)}]", "optim.lr=5e-4"]
    for t in tasks:
        out += [f"tasks.{t}.epochs=3", f"tasks.{t}.seeds=[{','.join(map(str, seeds))}]"]
        out += [f"tasks.{t}.max_train_examples={QUICK_EXAMPLES[t]}"] if t in QUICK_EXAMPLES else []
    return out


def run(recipe, compare: bool) -> Dict[str, Path]:
    """Pretrain, then finetune from the checkpoint (and from scratch with `compare`); returns the arms' dirs."""
    from lm.cli.transfer import finetune_arm, plan, pretrain

    p = plan(recipe)
    arms = {}  # name: (run dir, init, tokenizer)
    if p.steps:
        pretrain(recipe, p)
        arms["pretrained"] = (recipe.out / "finetune" / "pretrained", str(recipe.out / "pretrain"), None)
    if compare or not p.steps:  # --tokens 0 pretrains nothing: only the scratch arm is left to run
        arms["scratch"] = (recipe.scratch, "none", p.tokenizer)
    for name, (run_dir, init, tokenizer) in arms.items():
        log.info("lm quickstart: finetuning the %s model on %s", name, ", ".join(p.tasks))
        finetune_arm(recipe, run_dir, init, p.model_node, tokenizer, p.pooling, p.tasks)
    return {name: run_dir for name, (run_dir, _, _) in arms.items()}


def compare_table(pre, scratch) -> str:
    """Markdown: per column, the task score of every seed and the median, from scratch vs pretrained.

    `pre` and `scratch` are finetuning run directories, or lists of them (one per task) whose
    results.json columns are merged.
    """
    a, b = _columns(pre), _columns(scratch)
    lines = ["| task | metric (task score) | from scratch: seeds | median | pretrained: seeds | median | gain |",
             "|---|---|---|---:|---|---:|---:|"]
    for col, r in a.items():
        if col not in b:
            continue
        seeds = lambda x: " / ".join(f"{_score(m, x['metrics']):.1f}" for _, m in sorted(x["seeds"].items()))  # noqa: E731
        s, p = b[col]["median"]["score"], r["median"]["score"]
        lines.append(f"| {col} | {'/'.join(r['metrics'])} | {seeds(b[col])} | {s:.1f} | {seeds(r)} | {p:.1f} | "
                     f"{p - s:+.1f} |")
    return "\n".join(lines) + "\n"


def _columns(dirs) -> Dict:
    out = {}
    for d in ([dirs] if isinstance(dirs, (str, Path)) else dirs):
        out.update(json.loads((Path(d) / "results.json").read_text())["columns"])
    return out


def _score(metrics: Dict, keys: List[str]) -> float:
    return sum(metrics[k] for k in keys) / len(keys)


def _parser() -> argparse.ArgumentParser:
    from lm.cli.transfer import seeds_arg, tokens_arg

    p = argparse.ArgumentParser(prog="lm quickstart", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("runs/quickstart"), help="output directory (default %(default)s)")
    p.add_argument("--tasks", default=",".join(DEFAULT_TASKS),
                   help="comma-separated GLUE tasks with local train/dev data (default %(default)s)")
    p.add_argument("--tokens", type=tokens_arg, default=TOKENS,
                   help="pretraining tokens, rounded up to whole steps of 2,048; 0 = none (default %(default)d)")
    p.add_argument("--seeds", type=seeds_arg, default="0",
                   help="comma-separated finetuning seeds (default %(default)s)")
    p.add_argument("--compare", action="store_true", help="also finetune the same model from scratch (init=none)")
    p.add_argument("--preset", default=PRESET, help="the pretraining experiment (default %(default)s; "
                   "glue_transfer_encoder: the masked-LM encoder of the same size)")
    p.add_argument("--pretrain", nargs="*", default=[], metavar="KEY=VALUE",
                   help="lm train overrides, e.g. train.precision=fp32 model.n_layers=2")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="lm finetune overrides for both arms, e.g. optim.lr=3e-4 tasks.sst2.epochs=1")
    return p


@entry("lm quickstart")
def main(argv=None) -> None:
    from lm.cli.transfer import Recipe
    from lm.glue.run import print_table

    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s", datefmt="%H:%M:%S")
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    recipe = Recipe(preset=args.preset, tokens=args.tokens, out=args.out, tasks=tasks, seeds=args.seeds,
                    pretrain=args.pretrain, finetune=args.set)
    t0 = time.perf_counter()
    arms = run(recipe, args.compare)
    for name, title in (("pretrained", "Finetuned from the pretrained checkpoint"),
                        ("scratch", "From scratch (same model, random init)")):
        if name in arms:
            print(f"\n{title}:\n")
            print(print_table(arms[name]))
    if len(arms) == 2:
        print(compare_table(arms["pretrained"], arms["scratch"]))
    print(f"done in {(time.perf_counter() - t0) / 60:.1f} min; results under {recipe.out}")


if __name__ == "__main__":
    main()
