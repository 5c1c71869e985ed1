"""`lm finetune protocol=<preset>`: one task's grid, as the small BERTs' papers finetune (Turc et al. 2019; ELECTRA).

For each task: every (lr, batch size) cell of the protocol trains with the protocol's first seed; the cell whose
dev main metric is highest is chosen (a tie goes to the first cell in grid order: lrs, then batch sizes); that
cell then trains with the protocol's other seeds, and the task's result is the chosen cell's seeds (their median
in results.json). Each cell is an ordinary task config (its lr, batch size, epochs and seeds set) run by
lm/glue/run.py under `<run_dir>/<task>/<cell>/seed<k>/`, so a rerun skips finished cells and resumes a killed
one exactly as lm finetune resumes task/seed pairs; the chosen cell's first-seed run is one of its seeds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from lm.glue.config import GlueTaskConfig, GridProtocol
from lm.glue.trainer import SeedResult

log = logging.getLogger("lm")


@dataclass(frozen=True)
class Cell:
    lr: float
    batch_size: int
    epochs: float

    @property
    def name(self) -> str:  # the cell's directory under <run_dir>/<task>/
        return f"lr{self.lr:g}_bs{self.batch_size}"


@dataclass
class GridOutcome:
    task: GlueTaskConfig  # the chosen cell's task config (its seeds: the protocol's)
    cell: Cell
    results: list[SeedResult]  # the chosen cell's seeds, in the protocol's order
    scores: dict[Cell, SeedResult]  # every cell's first-seed result, in grid order


def cells(p: GridProtocol, t: GlueTaskConfig) -> list[Cell]:
    """The task's cells in grid order (lrs, then batch sizes)."""
    epochs = p.epochs_of(t)
    return [Cell(lr, b, epochs) for lr in p.lrs for b in p.batch_sizes]


def cell_task(t: GlueTaskConfig, cell: Cell, seeds: list[int]) -> GlueTaskConfig:
    return replace(t, lr=cell.lr, batch_size=cell.batch_size, epochs=cell.epochs, seeds=list(seeds))


def choose(scores: dict[Cell, float]) -> Cell:
    """The cell with the highest score; the first in grid order (dict order) on a tie."""
    best = max(scores.values())
    return next(cell for cell, s in scores.items() if s == best)


def run_grid(
    t: GlueTaskConfig, p: GridProtocol, task_dir: Path, run_seeds: Callable[[GlueTaskConfig, Path], list[SeedResult]]
) -> GridOutcome:
    """Every cell with the first seed, then the chosen cell's other seeds. run_seeds(task config, cell dir)
    trains (or reads back, when finished) each of the config's seeds under <cell dir>/seed<k>/ and returns their
    results in that order."""
    first, grid = p.seeds[0], cells(p, t)
    scores: dict[Cell, SeedResult] = {}
    for i, cell in enumerate(grid, 1):
        log.info("GLUE %s grid cell %d/%d: %s, %g epochs", t.name, i, len(grid), cell.name, cell.epochs)
        (scores[cell],) = run_seeds(cell_task(t, cell, [first]), task_dir / cell.name)
    chosen = choose({c: r.main for c, r in scores.items()})
    log.info(
        "GLUE %s: chose %s (dev %s %.2f), seeds %s", t.name, chosen.name, t.main_metric, scores[chosen].main, p.seeds
    )
    # the chosen cell's first-seed run is one of its seeds: only the others train (also under resume=false)
    others = run_seeds(cell_task(t, chosen, p.seeds[1:]), task_dir / chosen.name) if p.seeds[1:] else []
    return GridOutcome(cell_task(t, chosen, p.seeds), chosen, [scores[chosen], *others], scores)
