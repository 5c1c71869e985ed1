"""A protocol's record in results.json (`protocol`) and its Markdown in results.md (lm/glue/grid.py runs it).

Per task: the chosen cell, its seeds' dev main metric and their median, and every cell's first-seed dev
metrics, so the table shows how much the choice mattered. The caveat (CAVEAT) is in both files.
"""

from __future__ import annotations

from collections.abc import Mapping
from statistics import median
from typing import TYPE_CHECKING, Any

from lm.glue.tasks import TASKS

if TYPE_CHECKING:  # results.py renders a record without loading the trainer (torch)
    from lm.glue.config import GridProtocol
    from lm.glue.grid import Cell, GridOutcome

# Stated wherever a protocol's numbers are written: the cell is chosen on the dev set its score is read from.
CAVEAT = (
    "Dev scores of a cell chosen on dev are optimistic: the selection fits the dev set, so they overstate what the "
    "same setting scores on unseen data. The published grids (Turc et al. 2019, ELECTRA) report GLUE test scores "
    "of dev-selected settings; these dev numbers are not the same measurement and tend to run higher than test scores."
)

SELECTION = (
    "per task, every (lr, batch size) cell trains with the first seed; the cell with the highest dev main metric "
    "(its best epoch) is chosen, the first in grid order on a tie; the task's result is that cell's median over "
    "the seeds, the selecting run being one of them"
)


def protocol_record(p: GridProtocol, grids: Mapping[str, GridOutcome]) -> dict[str, Any]:
    return {
        "name": p.name,
        "lrs": list(p.lrs),
        "batch_sizes": list(p.batch_sizes),
        "epochs": p.epochs,
        "task_epochs": dict(p.task_epochs),
        "seeds": list(p.seeds),
        "selection": SELECTION,
        "caveat": CAVEAT,
        "tasks": {name: _task_record(g) for name, g in grids.items()},
    }


def _cell(c: Cell) -> dict[str, Any]:
    return {"cell": c.name, "lr": c.lr, "batch_size": c.batch_size, "epochs": c.epochs}


def _task_record(g: GridOutcome) -> dict[str, Any]:
    return {
        "metric": g.task.main_metric,
        "chosen": _cell(g.cell),
        "seeds": {str(r.seed): r.main for r in g.results},
        "median": median(r.main for r in g.results),
        "grid": [{**_cell(c), "main": r.main, "best_epoch": r.best_epoch, "dev": r.dev} for c, r in g.scores.items()],
    }


def grid_table(record: Mapping[str, Any]) -> str:
    """The protocol's section of results.md: the chosen cells with their seeds and median, then each task's grid."""
    seeds = [str(s) for s in record["seeds"]]
    lines = [
        f"## Protocol `{record['name']}`: best (lr, batch) cell on dev, median over seeds {', '.join(seeds)}",
        "",
        record["caveat"],
        "",
        "| task | dev metric | lr | batch | epochs | " + " | ".join(f"seed {s}" for s in seeds) + " | median |",
        "|---|---|---:|---:|---:|" + "---:|" * (len(seeds) + 1),
    ]
    for name, t in record["tasks"].items():
        c = t["chosen"]
        lines.append(
            f"| {_title(name)} | {t['metric']} | {c['lr']:g} | {c['batch_size']} | {c['epochs']:g} | "
            + " | ".join(_num(t["seeds"].get(s)) for s in seeds)
            + f" | {_num(t['median'])} |"
        )
    for name, t in record["tasks"].items():
        lines += ["", *_grid_lines(name, t, record["lrs"], record["batch_sizes"], seeds[0])]
    return "\n".join(lines) + "\n"


def _grid_lines(name: str, t: Mapping[str, Any], lrs, batch_sizes, seed: str) -> list[str]:
    """lr rows x batch-size columns of the first seed's dev main metric; the chosen cell in bold."""
    score = {(c["lr"], c["batch_size"]): c["main"] for c in t["grid"]}
    chosen = (t["chosen"]["lr"], t["chosen"]["batch_size"])

    def cell(key) -> str:
        text = _num(score.get(key))
        return f"**{text}**" if key == chosen else text

    return [
        f"### {_title(name)}: dev {t['metric']} of every cell (seed {seed}; the chosen one in bold)",
        "",
        "| lr / batch | " + " | ".join(str(b) for b in batch_sizes) + " |",
        "|---|" + "---:|" * len(batch_sizes),
        *(f"| {lr:g} | " + " | ".join(cell((lr, b)) for b in batch_sizes) + " |" for lr in lrs),
    ]


def _title(name: str) -> str:
    """A task's name in the tables: GLUE's directory name (RTE); task=own's is not in the registry after its job."""
    return TASKS[name].dir if name in TASKS else name


def _num(v) -> str:
    return "–" if v is None else f"{v:.1f}"
