"""Reading and rendering for lm report: ablation tables, plots and run cards from run directories.

runs.py reads run directories, summary.py turns one run into numbers, variants.py groups runs
into variants and refuses unfair comparisons, stats.py holds the seed-noise rule, table.py /
plots.py / html.py render, sweep.py and card.py write the two kinds of report; the console script
is lm/cli/report.py.
"""

from lm.report.runs import ReportError, Run, load_run, load_runs

__all__ = ["ReportError", "Run", "load_run", "load_runs"]
