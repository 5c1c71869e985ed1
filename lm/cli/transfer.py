"""`lm transfer`: the GLUE transfer recipe in one command. Pretrain, then finetune every GLUE task from the
pretrained checkpoint AND from scratch (same model, tokenizer and finetuning settings, 3 seeds each),
and write one table (transfer.md / transfer.json: per task and seed, medians, average, gain).

    lm transfer --tokens 10000000                              # decoder (causal LM), mean pooling
    lm transfer --preset glue_transfer_encoder --tokens 10000000   # encoder (MLM), mean pooling
    lm transfer --preset glue_transfer_electra --tokens 10000000   # encoder (ELECTRA's discriminator), [CLS]
    lm transfer --preset glue_transfer_gpu --tokens 300000000  # the 29M GPU size (finetuning: docs/glue_transfer.md)
    lm transfer --tokens 30000000 --pretrain data=gutenberg_mix_tapt_bpe \\
      --finetune pooling=weighted_mean tasks.rte.epochs=10 tasks.stsb.epochs=10     # the CPU recipe (docs/results.md)
    lm transfer --tokens 3000000 --scratch runs/transfer/decoder_scratch   # share the scratch arm across a curve
    lm transfer --tokens 300000 --tasks rte,mrpc --seeds 0 --pretrain model.dim=64 --finetune tasks.rte.epochs=1
    lm transfer --tokens 30000000 --parallel                  # the scratch arm beside the pretraining
    lm transfer --tokens 30000000 --arm scratch               # one arm alone; --arm all then writes the table
    lm transfer --join a/transfer_scratch.json b/transfer_pretrained.json --out c   # or the table from two calls
    lm report runs/transfer                                    # every run's table + the curve over tokens
    lm quickstart                   # = lm transfer --recipe quickstart, the README's first command (its --help)

1. Pretraining: `lm train experiment=<preset>` (conf/experiment/glue_transfer_{decoder,encoder,electra,gpu}.yaml:
   model, corpus, schedule) with train.max_steps = ceil(--tokens / tokens per step), in <out>/pretrain.
   --tokens 0 pretrains nothing (the curve's origin: the pretrained arm is then the scratch arm).
2. Finetuning: lm finetune on each task with the recipe's budget (lm/cli/transfer_recipe.py:
   3 epochs, lr 5e-4, SST-2's first 5,000 and STS-B's first 2,000 training examples, MRPC and STS-B read as
   siamese pairs: tasks.<task>.pair_input, docs/finetuning.md) and the preset's pooling (decoder and encoder:
   mean, electra: first = [CLS]), from <out>/pretrain and from scratch (init=none, the pretraining run's model
   config and tokenizer.json).
3. Tasks: every GLUE task whose train and dev files are in the mirror (--tasks to choose).
Both arms and the pretraining share one wandb group (--group, default the output directory's name;
--logger wandb turns wandb on). The same command resumes: lm train from its latest checkpoint,
lm finetune skipping finished task/seed pairs; another point (--tokens, --preset, --pretrain) in the same --out
is refused before any work (<out>/transfer_point.json records its point), and so is an arm of other --finetune
settings (<arm dir>/transfer_arm.json records its recipe), and a pretrained arm whose pretraining has no checkpoint
(deleted: it would be pretrained again under the arm's pairs). A tokenizer= or model.* finetuning override is
refused: the two arms and the pretraining must use one tokenizer and one model.
"""

from __future__ import annotations

import argparse
import logging
import math
import shlex
import sys
import time
from pathlib import Path

from lm.cli.errors import entry
from lm.cli.transfer_arms import check_arms
from lm.cli.transfer_point import POINT, arm_record_name, check_own_files, check_point, point_of, record_point
from lm.cli.transfer_recipe import (
    ARMS,
    CANDIDATE_TASKS,
    DEFAULT_PRESET,
    Recipe,
    TransferError,
    cpu_cores,
    finetune_arm,
    plan,
    pretrain,
    recipe_record,
    run_record,
    scratch_record,
    spent,
    write_table,
)

log = logging.getLogger("lm")

QUICKSTART = """`lm quickstart` (= `lm transfer --recipe quickstart`): the README's first command. Pretrain a small
decoder on books, finetune it on GLUE, print the table.

    lm quickstart                          # pretrain 2M tokens, finetune on SST-2, CoLA and STS-B (the pretrained arm)
    lm quickstart --arm all                # also finetune the same model from random weights: the table + the gain
    lm quickstart --arm all --seeds 0,1,2  # with three finetuning seeds (3x the finetuning time)
    lm quickstart --tokens 300000 --tasks sst2,rte --out runs/qs-small

It is lm transfer's recipe (docs/glue_transfer.md) cut to minutes on a CPU (~6 on 2 cores with bf16 units, about
twice that without), its pretrained arm alone unless --arm all; every flag of lm transfer works, and a flag given
wins over the preset's default:

1. Corpus: `data=gutenberg_mix_bpe`, prepared once into the cache (~1 min on 2 cores): 724 Project Gutenberg
   books, WikiText-2 raw valid + test, the TinyStories slice and the UNLABELLED training sentences of SST-2,
   CoLA, MRPC, STS-B and RTE (task-adaptive pretraining, Gururangan et al. 2020; labels, dev and test text
   are never used); a byte-level BPE of 8,192 tokens. Files come from $LM_DATA_MIRROR, else the download
   cache, else are downloaded (lm.data.corpora).
2. Pretraining: `lm train experiment=glue_transfer_decoder` (a GPT-style decoder of 4 layers x 256, 5.3M
   parameters; bf16 autocast where the device computes bf16 natively, else fp32) for --tokens tokens,
   batches of 16 x 128.
3. lm finetune on each task from the checkpoint (mean pooling; the recipe's budget: 3 epochs, lr 5e-4, SST-2's
   first 5,000 and STS-B's first 2,000 training examples, STS-B's two sentences read apart and scored by the
   cosine of their pooled features, best dev epoch; bf16 autocast where the device computes bf16 natively, else
   fp32); with --arm all also from scratch
   (init=none: the same model and tokenizer, random weights, the same finetuning settings).

Everything lands under --out (default runs/quickstart): pretrain/ (an lm train run dir), finetune/pretrained/
(and finetune/scratch/), each with results.json / results.md. The same command resumes an interrupted run;
other --tokens in the same --out are refused (a point of the curve per directory): pick a new --out.
"""

# The recipe presets: the defaults of the flags below (a flag given on the command line wins). `quickstart`
# pretrains the tokens that keep its whole default job (corpus, pretraining, three finetunes) within ~15 minutes
# on a 2-core CPU without bf16 units (~6 with them; docs/results.md has the timings).
RECIPES: dict[str, dict] = {
    "transfer": {"tokens": 10_000_000, "tasks": None, "seeds": "0,1,2", "out": None, "arm": "all"},
    "quickstart": {
        "tokens": 2_000_000,
        "tasks": "sst2,cola,stsb",
        "seeds": "0",
        "out": Path("runs/quickstart"),
        "arm": "pretrained",
    },
}


def run_transfer(r: Recipe) -> dict | None:
    """The whole recipe; returns the transfer summary (also written to <out>/transfer.json and transfer.md),
    or None for one arm alone (--arm). Its run record's seconds add up every call's time on this point
    (<out>/transfer_seconds.json), an interrupted one's too (a stop by SIGTERM or Ctrl-C; a SIGKILLed call's
    time is lost); a --parallel call's scratch lane runs inside the parent's time and is not added again."""
    from lm.core.lock import RunDirLocked

    t0 = time.time()
    try:
        return _transfer(r, t0)
    except BaseException as e:
        # counted where the point is recorded: a call refused before (say, in a directory of the user's) writes nothing
        if (r.out / POINT).is_file() and not r.lane:
            spent(r.out, time.time() - t0)
        if isinstance(e, RunDirLocked) and e.run_dir is not None:
            raise TransferError(_in_use(r, e.run_dir, e.holder)) from None
        raise


def _in_use(r: Recipe, run_dir: Path, holder: str) -> str:
    """RunDirLocked in lm transfer's words: its fix is a flag of lm transfer (--out, --scratch), not run_dir=."""
    shared = run_dir == r.scratch.resolve() and not r.scratch.resolve().is_relative_to(r.out.resolve())
    fix = (
        "this call's scratch arm is shared (--scratch): let the other call finish it first (the curve's points one "
        "after another), or give this call a --scratch of its own"
        if shared
        else f"wait for it to finish (the same command then resumes whatever is left), stop it, or give this call "
        f"another --out than {r.out}"
    )
    return f"{run_dir} is in use by another run ({holder}); two runs there would overwrite each other's work: {fix}"


def _transfer(r: Recipe, t0: float) -> dict | None:
    from lm.report.transfer import arm_scores, compare

    p = plan(r)
    pretrained = r.arm_dir("pretrained")
    scratch_runs = r.arm in ("all", "scratch") or not p.steps  # at 0 tokens it is the pretrained arm too
    pretrained_runs = r.arm in ("all", "pretrained") and bool(p.steps)
    point = point_of(
        {"preset": r.preset, "steps": p.steps, "tokens_per_step": p.per_step, "pretrain_overrides": r.pretrain}
    )
    check_point(r.out, point, p.cfg)  # another point's --out: refused before any work
    check_own_files(r.out)
    # each arm's recipe record: an arm of another finetuning recipe is refused before the other arm's hours
    running = {arm for arm, runs in (("scratch", scratch_runs), ("pretrained", pretrained_runs)) if runs}
    check_arms(r, scratch_record(r, p), running)
    record_point(r.out, point)
    lane = _start_lane(r) if r.parallel and p.steps else None
    try:
        if scratch_runs and lane is None:
            log.info("lm transfer: finetuning from scratch on %s (%s)", ", ".join(p.tasks), r.scratch)
            finetune_arm(r, r.scratch, "none", p.model_node, p.tokenizer, p.pooling, p.tasks)
        if pretrained_runs:
            pretrain(r, p)
            log.info("lm transfer: finetuning from %s on %s", r.out / "pretrain", ", ".join(p.tasks))
            finetune_arm(r, pretrained, str(r.out / "pretrain"), p.model_node, None, p.pooling, p.tasks)
    except BaseException:
        if lane is not None:
            lane.stop()
        raise
    failed = lane.wait() if lane is not None else None
    if failed:
        raise TransferError(
            f"the scratch arm, run beside the pretraining, did not finish ({failed})\nThe same "
            f"command resumes it (and reads the pretrained arm back)"
        )
    if r.arm != "all":
        if not r.lane:  # a lane's parent writes the table itself
            from lm.cli.transfer_join import write_arm_record

            write_arm_record(r, p, r.arm_dir(r.arm), t0)  # run_cli says what comes next
        return None
    from lm.cli.transfer_join import set_aside_stale_records

    set_aside_stale_records(r)  # the table is this call's; a one-arm record of older results is not left beside it
    summary = {
        "recipe": recipe_record(r, p),
        "arms": {"scratch": str(r.scratch), "pretrained": str(pretrained)},
        "comparison": compare(arm_scores(r.scratch / "results.json"), arm_scores(pretrained / "results.json")),
        "run": run_record(r.command, spent(r.out, time.time() - t0)),
    }
    return write_table(r.out, summary)


def _start_lane(r: Recipe):
    """--parallel: the scratch arm in a second process; this one keeps the other half of the CPU threads."""
    from lm.cli.transfer_lane import split_threads, start_scratch_lane
    from lm.core.setup import share_threads

    threads = split_threads(cpu_cores())
    share_threads(threads)  # what train.threads=null runs on here; train.threads, when set, still decides
    return start_scratch_lane(r, threads)


# -- command line -------------------------------------------------------------------------------------


def tokens_arg(text: str) -> int:
    """--tokens: a finite number >= 0 (2e6 allowed), as an int."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of tokens (e.g. 2e6)") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the number of tokens must be finite and >= 0 (0 = no pretraining)")
    return int(value)


def seeds_arg(text: str) -> list[int]:
    """--seeds: comma-separated integers, at least one, each once (0,0 ran seed 0 once, but its records said
    [0, 0] and a later --seeds 0 was refused as another recipe's)."""
    seeds = [s.strip() for s in text.split(",")]
    if not all(s.isdigit() for s in seeds):  # no sign: numpy's generators take no negative seed (lm finetune's check)
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of seeds, integers >= 0, e.g. 0,1,2")
    return list(dict.fromkeys(int(s) for s in seeds))


def tasks_arg(text: str) -> list[str]:
    """--tasks: comma-separated GLUE task names (sst2 or SST-2), each once, in the order given."""
    tasks = list(dict.fromkeys(t.strip().lower().replace("-", "") for t in text.split(",") if t.strip()))
    unknown = [t for t in tasks if t not in CANDIDATE_TASKS]
    if unknown or not tasks:
        what = f"{', '.join(unknown)}: not a GLUE task" if unknown else "no task"
        raise argparse.ArgumentTypeError(f"{text!r}: {what}; choose from {','.join(CANDIDATE_TASKS)}")
    return tasks


def _parser(recipe: str = "transfer", prog: str = "lm transfer") -> argparse.ArgumentParser:
    """lm transfer's flags with the defaults of preset `recipe` (RECIPES)."""
    doc = QUICKSTART if recipe == "quickstart" else __doc__
    p = argparse.ArgumentParser(
        prog=prog,
        description=doc.split("\n\n")[0],
        epilog=doc.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--recipe",
        default="transfer",
        choices=list(RECIPES),
        help="the preset of the defaults below (default %(default)s; quickstart: lm quickstart --help)",
    )
    p.add_argument(
        "--preset",
        default=DEFAULT_PRESET,
        help="lm train experiment for the pretraining (conf/experiment/; default %(default)s)",
    )
    p.add_argument(
        "--tokens",
        type=tokens_arg,
        help="pretraining tokens, rounded up to whole steps; 0 = none (default %(default).0f)",
    )
    p.add_argument(
        "--out",
        type=Path,
        help="output directory (default runs/transfer/<preset>_<tokens>; the quickstart's: runs/quickstart)",
    )
    p.add_argument(
        "--tasks",
        type=tasks_arg,
        help="comma-separated GLUE tasks (default: every task with local train/dev data; the "
        "quickstart's: sst2,cola,stsb)",
    )
    p.add_argument("--seeds", type=seeds_arg, help="finetuning seeds (default %(default)s)")
    p.add_argument(
        "--scratch",
        type=Path,
        help="the scratch arm's directory (default <out>/finetune/scratch); share one across the runs of a curve",
    )
    p.add_argument("--group", help="wandb group of the pretraining and both arms (default: the --out name)")
    p.add_argument(
        "--logger",
        default="none",
        choices=["none", "wandb", "tensorboard", "all"],
        help="conf/logger option for every run (default %(default)s)",
    )
    p.add_argument(
        "--pretrain",
        nargs="*",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help="lm train overrides (given twice: both lists, in order)",
    )
    p.add_argument(
        "--finetune",
        nargs="*",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help="lm finetune overrides for both arms, e.g. tasks.sst2.max_train_examples=null pooling=last",
    )
    p.add_argument(
        "--arm",
        choices=ARMS,
        help="all: pretrain, both arms, the table; scratch or pretrained: that arm alone (the pretrained "
        "one with the pretraining), e.g. on separate cores or machines, and its dev table; then a "
        "call with --arm all reads both back and writes the table (default %(default)s)",
    )
    p.add_argument(
        "--parallel",
        action="store_true",
        help="run the scratch arm in a second process beside the pretraining (half of the CPU threads "
        "each; on one GPU both time-slice the device: no time saved on an H100); its log: "
        "<scratch>/lane.log",
    )
    p.add_argument(
        "--join",
        nargs=2,
        type=Path,
        metavar="ARM_JSON",
        help="write the table (in --out) from two one-arm calls' records, <out>/transfer_scratch.json "
        "and <out>/transfer_pretrained.json, e.g. from two machines; runs nothing",
    )
    p.add_argument("--lane", action="store_true", help=argparse.SUPPRESS)  # the --parallel call's second process
    p.set_defaults(recipe=recipe, **RECIPES[recipe])
    return p


def parse_args(argv: list[str], prog: str = "lm transfer") -> argparse.Namespace:
    """Two passes: --recipe picks the defaults, then the flags given override them."""
    first = argparse.ArgumentParser(prog=prog, add_help=False)
    first.add_argument("--recipe", default="transfer", choices=list(RECIPES))
    recipe = first.parse_known_args(argv)[0].recipe
    return _parser(recipe, prog).parse_args(argv)


@entry("lm transfer")
def main(argv: list[str] | None = None) -> None:
    run_cli(sys.argv[1:] if argv is None else argv, "lm transfer")


@entry("lm quickstart")
def quickstart(argv: list[str] | None = None) -> None:
    """`lm quickstart`: lm transfer with the quickstart preset (QUICKSTART)."""
    run_cli(["--recipe", "quickstart", *(sys.argv[1:] if argv is None else argv)], "lm quickstart")


def run_cli(argv: list[str], prog: str) -> None:
    a = parse_args(argv, prog)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s", datefmt="%H:%M:%S")
    if a.join:
        from lm.cli.transfer_join import join_main

        join_main(a.join, a.out, argv)
        return
    recipe = Recipe(
        preset=a.preset,
        tokens=a.tokens,
        out=a.out,
        scratch=a.scratch,
        group=a.group,
        logger=a.logger,
        seeds=a.seeds,
        pretrain=a.pretrain,
        finetune=a.finetune,
        tasks=a.tasks,
        command="lm transfer " + " ".join(map(shlex.quote, argv)),
        arm=a.arm,
        parallel=a.parallel,
        lane=a.lane,
    )
    summary = run_transfer(recipe)
    if summary is not None:
        from lm.report.transfer import transfer_table

        print(transfer_table(summary))
        print(f"results: {recipe.out / 'transfer.json'}, {recipe.out / 'transfer.md'}")
    elif not recipe.lane:  # one arm alone: its dev table (the other arm and the gain come with --arm all)
        from lm.glue.run import print_table

        print(print_table(recipe.arm_dir(recipe.arm)))
        then = "the same command with --arm all"
        if prog != "lm quickstart":  # a split run's other half, elsewhere (the quickstart's newcomer needs neither)
            record = recipe.out / arm_record_name(recipe.arm)
            then += f", or lm transfer --join {record} <the other arm's record> --out <dir>"
        print(f"results: {recipe.arm_dir(recipe.arm) / 'results.json'}; with the other arm and the gain: {then}")


if __name__ == "__main__":
    main()
