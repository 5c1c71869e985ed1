"""The GLUE transfer curve: lm transfer at several pretraining token counts, for the decoder (causal LM)
and the encoder (masked LM) presets of one size; writes the curve table and its PNG into
docs/glue_transfer.md (between its `<!-- curve:begin -->` / `<!-- curve:end -->` markers).

    python benchmarks/glue_transfer_curve.py                        # the measurement (hours on a CPU)
    python benchmarks/glue_transfer_curve.py --tiny                 # end-to-end check in minutes
    python benchmarks/glue_transfer_curve.py --arches decoder --tokens 0,3e6 --root runs/gtc  # a part
    python benchmarks/glue_transfer_curve.py --arches electra       # the ELECTRA arm (replaced-token detection)

Each (arch, tokens) point is one lm transfer run in <root>/<arch>/<tokens>; the scratch arm does not
depend on the tokens, so each arch's runs share one (<root>/<arch>/scratch; ELECTRA's is the encoder's,
<root>/encoder/scratch, since its discriminator is finetuned as that same encoder). Every run resumes: an
interrupted curve continues where it stopped when the same command runs again (points already done
are read back, not retrained). A session's runs/ may not outlive it, so every finished point's
transfer.json is also copied into the committed archive <archive>/<series>[-<overrides digest>]/<tokens>/ (default
docs/glue_transfer/points): the page is built from the archive, and a point measured by an earlier
session stays on it (a point run again replaces its archived record; a curve of other seeds or tasks than its
archived points is refused before any work: check_archive). The scratch arm is archived too, outside
git since it holds binaries (--scratch-archive, default <root>/scratch_archive; <it>/scratch/<key>/: each
task/seed pair's result.pt, keyed by the arm's transfer_arm.json record: a curve run again with more seeds or tasks
extends the arm, whose record then names them, and archives it under a new key), and a later curve with the same
--scratch-archive restores the entry of its record (the same seeds and tasks) instead of finetuning it again;
lm finetune's resume check still refuses a restored pair whose settings differ. --tiny swaps in 0/100k/300k
tokens, a 1 x 32 model, the TinyStories slice as corpus, one seed, RTE and MRPC with 64 training
examples and 1 epoch, and writes to <root>/ and --doc /tmp/glue_transfer_tiny.md instead of the real
page (and archives under <root>/points).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import platform
import re
import shlex
import shutil
import sys
import time
from pathlib import Path

from lm.cli.transfer import run_transfer
from lm.cli.transfer_lane import recipe_argv
from lm.cli.transfer_recipe import Recipe, plan, recipe_record, scratch_record
from lm.core.files import atomic_write_text
from lm.report.paths import portable
from lm.report.transfer import TRANSFER, curve_table, find_transfers, overrides, plot_curve, series, series_labels

TOKENS = "0,3e6,1e7,3e7"
# ELECTRA finetunes its discriminator as the plain encoder, so its scratch arm is the encoder's (shared)
SCRATCH_OF = {"electra": "encoder"}
BEGIN, END = "<!-- curve:begin -->", "<!-- curve:end -->"
ARCHIVE = Path("docs/glue_transfer/points")
TINY_PRETRAIN = [
    "data=tinystories_sample_bpe",
    "data.name=tinystories_sample_bpe_512",  # its own cache directory: the preset's 4096 one stays as it is
    "data.vocab_size=512",
    "model.vocab_size=512",
    "model.dim=32",
    "model.n_layers=1",
    "model.n_heads=2",
    "train.progress=false",
    "train.eval_interval=0",
    "sched.warmup_steps=5",
]
TINY_FINETUNE = ["glue.max_train_examples=64", "train.progress=false"]  # + 1 epoch for each task


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--tokens", default=TOKENS, help="comma-separated pretraining token counts (default %(default)s)")
    p.add_argument(
        "--arches",
        default="decoder,encoder",
        help="presets glue_transfer_<arch>: decoder, encoder, electra (default %(default)s)",
    )
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--tasks", help="comma-separated GLUE tasks (default: every task with local data)")
    p.add_argument("--root", type=Path, default=Path("runs/glue_transfer"), help="runs go to <root>/<arch>/<tokens>")
    p.add_argument(
        "--doc", type=Path, default=Path("docs/glue_transfer.md"), help="page whose curve section is rewritten"
    )
    p.add_argument(
        "--archive",
        type=Path,
        default=None,
        help=f"committed copies of every finished point's {TRANSFER}, from which the page is built "
        f"(default {ARCHIVE}; with --tiny <root>/points)",
    )
    p.add_argument(
        "--scratch-archive",
        type=Path,
        default=None,
        help="finished scratch arms (their result.pt files), restored by a later curve instead of "
        "finetuned again (default <root>/scratch_archive; outside git)",
    )
    p.add_argument("--logger", default="none", choices=["none", "wandb", "tensorboard", "all"])
    p.add_argument("--pretrain", nargs="*", default=[], metavar="KEY=VALUE", help="lm train overrides for every run")
    p.add_argument("--finetune", nargs="*", default=[], metavar="KEY=VALUE", help="lm finetune overrides for every run")
    p.add_argument(
        "--parallel",
        action="store_true",
        help="lm transfer --parallel: each point's scratch arm beside its pretraining (the first point that "
        "finetunes it; the others read it back)",
    )
    p.add_argument("--tiny", action="store_true", help="a few-minute end-to-end check (see above)")
    return p


def replace_section(text: str, body: str) -> str:
    """The page with the text between the curve markers replaced (the markers are kept)."""
    if BEGIN not in text or END not in text:
        raise SystemExit(f"the page has no {BEGIN} ... {END} section to fill")
    return re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _: f"{BEGIN}\n{body}\n{END}", text, flags=re.S)


def archive_point(out: Path, archive: Path) -> Path:
    """Copy the finished point in `out` to <archive>/<series>[-<overrides digest>]/<tokens>/ (its transfer.json,
    with the run directory it was measured in as `run_dir`, and its transfer.md): the record outlives runs/.
    Keyed by the series and the recipe's overrides, so neither a preset whose model changed (the encoder's
    positions) nor a recipe with other overrides (SST-2's training examples) overwrites another curve's point."""
    summary = json.loads((out / TRANSFER).read_text())
    scratch = summary.get("arms", {}).get("scratch")
    measured = restored_from(Path(scratch)) if scratch else None
    if measured:  # a restored scratch arm: say when it was measured
        summary["scratch_measured"] = measured
    dest = archive / series_key(summary) / str(summary["recipe"]["tokens"])
    dest.mkdir(parents=True, exist_ok=True)
    record = portable_record({**summary, "run_dir": str(out)})
    atomic_write_text(dest / TRANSFER, json.dumps(record, indent=2) + "\n")
    if (out / "transfer.md").is_file():
        atomic_write_text(dest / "transfer.md", portable((out / "transfer.md").read_text()))
    return dest


def check_archive(record: dict, archive: Path) -> None:
    """Refuse a point (its recipe_record) whose seeds or tasks differ from those of its curve's points already in the
    archive. The archive keys a point by series, overrides and tokens, not by seeds: a curve run again with --seeds 0
    replaced the three-seed record of each point it ran (the page lost it; runs/ may not outlive the session), and
    its new points sat in one curve, under one label, beside medians over other seeds."""
    folder = archive / series_key({"recipe": record})
    for path in sorted(folder.glob(f"*/{TRANSFER}")):
        old = json.loads(path.read_text())["recipe"]
        seeds, tasks = sorted(old.get("seeds") or []), sorted(old.get("tasks") or [])
        new_seeds, new_tasks = sorted(record["seeds"]), sorted(record["tasks"])
        if (seeds, tasks) != (new_seeds, new_tasks):
            raise SystemExit(
                f"{folder} holds this curve over seeds {seeds} on tasks {','.join(tasks)} ({path}); this run's "
                f"seeds {new_seeds} on {','.join(new_tasks)} would replace its points' records and mix the two in one "
                f"curve: pass --seeds {','.join(map(str, seeds))} --tasks {','.join(tasks)}, or another --archive"
            )


def portable_record(value):
    """`value` (a point's record: dicts, lists, strings) with every string written without this machine's paths
    (lm.report.paths.portable: the archive is committed)."""
    if isinstance(value, dict):
        return {k: portable_record(v) for k, v in value.items()}
    if isinstance(value, list):
        return [portable_record(v) for v in value]
    return portable(value) if isinstance(value, str) else value


def series_key(summary) -> str:
    """The archive's folder for a curve: series() as a slug, then a digest of the overrides when there are any
    (the points archived before overrides were part of the key had none besides pooling)."""
    key = re.sub(r"[^a-z0-9]+", "-", series(summary).lower()).strip("-")
    extra = overrides(summary)
    return key + ("-" + hashlib.sha256(json.dumps(extra).encode()).hexdigest()[:8] if extra else "")


PROVENANCE = "archived_arm.json"  # in an archived (and a restored) scratch arm: where and when it was measured


def scratch_key(record) -> str:
    """The archive's name for a scratch arm: a digest of its transfer_arm.json record (model, tokenizer,
    pooling, tasks, seeds, finetuning overrides), so ELECTRA's arm and the encoder's are one entry. The record
    names the seeds and tasks the arm holds (lm/cli/transfer_arms.py), so an arm extended by more of them gets a new
    entry (an entry already there is never added to: archive_scratch)."""
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]


def restored_from(scratch: Path) -> dict | None:
    """Where and when a restored scratch arm was measured (its PROVENANCE), while it is still the archived arm: an
    arm extended since by more seeds or tasks (lm transfer accepts them; its record then names them) is partly this
    session's work, and is archived as measured here under its new record's key."""
    path = scratch / PROVENANCE
    if not path.is_file():
        return None
    measured = json.loads(path.read_text())
    key = measured.pop("key", None)  # the entry it was restored from (none: restored before keys were noted)
    if key is not None and key != scratch_key(json.loads((scratch / "transfer_arm.json").read_text())):
        return None
    return measured


def _arm_files(scratch: Path):
    """The files a finished scratch arm is resumed from: its record and each task/seed pair's sealed result."""
    return [
        scratch / "transfer_arm.json",
        *sorted(scratch.glob("*/seed*/result.pt")),
        *sorted(scratch.glob("*/seed*/result.sha256")),
    ]


def archive_scratch(scratch: Path, archive: Path) -> Path:
    """Copy the scratch arm's record and finished pairs to <archive>/scratch/<key>/ (small files: the pairs'
    dev metrics and history, no weights), with where and when they were measured (kept from a restored arm).
    An entry already there stays: it is the arm restored into this run, or an earlier measurement that a new
    one (another machine's, say) must not replace; the new arm's scores are in its point's transfer.json."""
    dest = archive / "scratch" / scratch_key(json.loads((scratch / "transfer_arm.json").read_text()))
    if (dest / "transfer_arm.json").is_file():
        return dest
    for f in _arm_files(scratch):
        target = dest / f.relative_to(scratch)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        shutil.copyfile(f, tmp)
        os.replace(tmp, target)  # a copy cut short never looks like a finished pair
    results = list(scratch.glob("*/seed*/result.pt"))
    measured = {
        "run_dir": str(scratch),
        "machine": f"{platform.node()} ({platform.machine()})",
        "finished": time.strftime(
            "%Y-%m-%d %H:%M:%S %Z", time.localtime(max((f.stat().st_mtime for f in results), default=0))
        ),
    }
    measured = restored_from(scratch) or measured
    atomic_write_text(dest / PROVENANCE, json.dumps(measured, indent=2) + "\n")
    return dest


def restore_scratch(r: Recipe, archive: Path) -> Path | None:
    """Before a curve's first run of a session: fill an empty scratch directory from the archived arm with the
    same record, if there is one (lm transfer then resumes each pair instead of training it)."""
    if (r.scratch / "transfer_arm.json").is_file():
        return None  # this session's arm (finished or not) is resumed as it is
    src = archive / "scratch" / scratch_key(scratch_record(r, plan(r)))
    if not (src / "transfer_arm.json").is_file():
        return None
    shutil.copytree(src, r.scratch, dirs_exist_ok=True)
    measured = json.loads((src / PROVENANCE).read_text())
    atomic_write_text(r.scratch / PROVENANCE, json.dumps({**measured, "key": src.name}, indent=2) + "\n")
    logging.info(
        "scratch arm %s restored from %s (measured %s)",
        r.scratch,
        src,
        measured["finished"],
    )
    return src


def section(summaries, png: Path, command: str) -> str:
    # the series and the directory name each run: a preset whose model changed since (the encoder's positions)
    # ran the same command text into a directory that was moved afterwards (its recipe's note says so)
    runs = "\n".join(
        f"- {label}, {s['recipe']['tokens']:,} tokens, in `{s.get('run_dir') or s['dir']}`: "
        f"`{s['run']['command']}`: "
        f"{s['run']['machine']}, finished {s['run']['finished']}, {s['run']['seconds']:.0f} s"
        + (f" ({s['recipe']['note']})" if s["recipe"].get("note") else "")
        + (
            f" (the scratch arm restored from the archive: measured in `{s['scratch_measured']['run_dir']}`, "
            f"finished {s['scratch_measured']['finished']}; the seconds are this point's own work)"
            if s.get("scratch_measured")
            else ""
        )
        for s, label in zip(summaries, series_labels(summaries))
    )
    return (
        f"Written by `{command}` on {time.strftime('%Y-%m-%d')}.\n\n{curve_table(summaries)}\n"
        f"![GLUE dev gain over scratch against pretraining tokens]({png.name})\n\nRuns (every one, none dropped):\n\n"
        f"{runs}\n"
    )


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    a = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s", datefmt="%H:%M:%S")
    tokens = [int(float(t)) for t in a.tokens.split(",")]
    seeds = [int(s) for s in a.seeds.split(",")]
    tasks = a.tasks.split(",") if a.tasks else None
    pretrain, finetune, doc = a.pretrain, a.finetune, a.doc
    archive = a.archive or (a.root / "points" if a.tiny else ARCHIVE)
    scratch_archive = a.scratch_archive or a.root / "scratch_archive"  # result.pt binaries: never in git
    if a.tiny:
        tasks, seeds = tasks or ["rte", "mrpc"], [seeds[0]]
        tokens = tokens if a.tokens != TOKENS else [0, 100_000, 300_000]
        pretrain = [*TINY_PRETRAIN, *pretrain]
        finetune = [*TINY_FINETUNE, *(f"tasks.{t}.epochs=1" for t in tasks), *finetune]
        if doc == Path("docs/glue_transfer.md"):
            doc = Path("/tmp/glue_transfer_tiny.md")
            if not doc.is_file():
                doc.write_text(f"# tiny check\n\n{BEGIN}\n{END}\n")
    recipes = []
    for arch in a.arches.split(","):
        scratch = a.root / SCRATCH_OF.get(arch, arch) / "scratch"
        for n in tokens:
            recipe = Recipe(
                preset=f"glue_transfer_{arch}",
                tokens=n,
                out=a.root / arch / str(n),
                scratch=scratch,
                seeds=seeds,
                tasks=tasks,
                group=f"glue_transfer_{arch}_{n}",
                logger=a.logger,
                pretrain=pretrain,
                finetune=finetune,
                parallel=a.parallel and n > 0,
            )
            recipe.command = "lm transfer " + " ".join(map(shlex.quote, recipe_argv(recipe)))
            recipe.command += " --parallel" if recipe.parallel else ""
            recipes.append(recipe)
    for recipe in recipes:  # every point, before the first one's work
        check_archive(recipe_record(recipe, plan(recipe)), archive)
    for recipe in recipes:
        restore_scratch(recipe, scratch_archive)
        run_transfer(recipe)
        archive_point(recipe.out, archive)
        archive_scratch(recipe.scratch, scratch_archive)
    summaries = find_transfers([archive])  # this call's points and every earlier session's
    png = plot_curve(summaries, doc.with_suffix(".png"))
    command = "python benchmarks/glue_transfer_curve.py " + " ".join(map(shlex.quote, argv))
    doc.write_text(replace_section(doc.read_text(), section(summaries, png, command)))
    print(curve_table(summaries))
    print(f"wrote {doc} and {png}")


if __name__ == "__main__":
    main()
