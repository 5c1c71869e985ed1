"""lm-report: ablation tables, plots and run cards from run directories.

runs.py reads run directories, summary.py turns one run into numbers, variants.py groups runs
into variants and refuses unfair comparisons, stats.py holds the seed-noise rule, table.py /
plots.py / html.py render, sweep.py and card.py write the two kinds of report, cli.py is the
console script.
"""

from lm.report.runs import ReportError, Run, load_run, load_runs


def main(argv=None) -> int:
    from lm.cli.report import main as _main

    return _main(argv)


__all__ = ["main", "ReportError", "Run", "load_run", "load_runs"]
