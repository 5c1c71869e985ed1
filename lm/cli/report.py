"""`lm report <sweep or run dirs>`: a comparison report for a sweep, or a run card for one run."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from lm.cli.errors import entry
from lm.extras import exit_if_missing
from lm.report import narang
from lm.report.runs import ReportError, load_runs
from lm.report.transfer import TransferError
from lm.report.variants import check_comparable, group_variants


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="lm report",
        description="Compare runs of a sweep (table as Markdown + CSV, plots, one HTML page), "
        "or write a run card when given a single run.",
        epilog="examples:\n"
        "  lm train -m experiment=ablate_ffn_norm logger.group=ffn_norm   # the sweep: runs/ffn_norm/<cell>\n"
        "  lm report runs/ffn_norm                   # runs/ffn_norm/report/report.{md,csv,html} + PNGs\n"
        "  lm report runs/ffn_norm --baseline swiglu --notes conclusions.md -o docs/ffn_norm\n"
        "  lm report runs/smoke                      # one run: a run card (config, curves, throughput, MFU)\n"
        "  lm report runs/transfer                   # lm transfer runs: their tables + the gain over tokens\n"
        "Variants are named by the overrides that differ between runs (seeds excluded); a failed cell\n"
        "is a row marked FAILED with its reason. Exit status 2 when the inputs cannot make a report.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("paths", nargs="+", help="sweep directories (searched recursively for runs) or run directories")
    p.add_argument(
        "-o", "--out", type=Path, help="output directory (default: <path>/report for one path, else ./report)"
    )
    p.add_argument("--title", default=None, help="report title")
    p.add_argument("--notes", type=Path, help="a Markdown file whose text is added to the report (conclusions)")
    p.add_argument(
        "--baseline", help="the variant to compare against: a substring of its label (default: the first that finished)"
    )
    p.add_argument("--force", action="store_true", help="tabulate runs even if their data or budget differ")
    p.add_argument("--card", action="store_true", help="write a run card per run instead of a comparison")
    return p.parse_args(argv)


def pick_baseline(variants: list, wanted) -> int:
    if wanted is None:  # the first variant that has a finished run
        return next((i for i, v in enumerate(variants) if v.ok_runs), 0)
    matches = [i for i, v in enumerate(variants) if wanted in v.label]
    if len(matches) != 1:
        labels = ", ".join(repr(v.label) for v in variants)
        raise ReportError(
            f"--baseline {wanted!r} matches {len(matches)} variants; pick a substring of exactly one of: {labels}"
        )
    return matches[0]


def check_out(out: Path, names: list[str]) -> None:
    """Refuse an -o where writing the report would replace a file of these names that lm report did not
    write (the user's notes as report.md, a table or figure of their own): it is left as it is."""
    from lm.report import outputs

    outputs.check_out(out, names, "lm report", "-o", "the report")


def run(args: argparse.Namespace, command: str) -> Path:
    from lm.report import card, sweep
    from lm.report.transfer import CURVE_FILES, find_transfers, write_curve_report

    if find_transfers(args.paths):  # lm transfer directories: their tables and the curve over tokens
        out = args.out or (Path(args.paths[0]) / "report" if len(args.paths) == 1 else Path("report"))
        check_out(out, CURVE_FILES)
        return write_curve_report(args.paths, out, args.title)
    runs = load_runs(args.paths)
    out = args.out or (Path(args.paths[0]) / "report" if len(args.paths) == 1 else Path("report"))
    if args.card or len(runs) == 1:
        for where in [out] if len(runs) == 1 else [out / r.name for r in runs]:
            check_out(where, card.FILES)
        if len(runs) == 1:
            return card.write_run_card(runs[0], out, command)
        for r in runs:
            last = card.write_run_card(r, out / r.name, command)
        return last
    forced = False
    if args.force:
        try:
            check_comparable(runs)
        except ReportError:
            forced = True
    else:
        check_comparable(runs)
    variants = group_variants(runs)
    layout = None
    if narang.applies(variants):  # experiment=narang: Table 1 of Narang et al. 2021, vanilla row as baseline
        layout, variants = narang, narang.order(variants)
    baseline = pick_baseline(variants, args.baseline)
    if layout and args.baseline is None and narang.vanilla_index(variants) is not None:
        baseline = narang.vanilla_index(variants)
    check_out(out, sweep.FILES)
    notes = args.notes.read_text() if args.notes else ""
    title = args.title or f"Ablation report: {', '.join(map(str, args.paths))}"
    return sweep.write_sweep_report(variants, runs, out, title, command, notes, baseline, forced, layout)


@entry("lm report", usage=(ReportError, TransferError))  # status 2: the inputs cannot make a report
def main(argv=None) -> int:
    exit_if_missing("lm report", "report")
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    page = run(args, "lm report " + " ".join(map(shlex.quote, argv)))
    print(f"wrote {page.parent}/ ({page.name})")
    md = page.with_suffix(".md")
    if page.name == "transfer.md":
        text = page.read_text()
        print(text[text.find("| model") : text.find("![")].strip())
    if md.is_file() and md.name == "report.md":
        text = md.read_text()
        start = text.find("## Results")
        print(text[start : text.find("\n## ", start + 1)].strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
