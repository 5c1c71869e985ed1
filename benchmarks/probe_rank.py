"""Does the GLUE probe rank checkpoints the way finetuning does? (issue 52, item 2)

For each point of one pretraining run, its checkpoints at --steps and the origin (step 0: the same model
untrained), two scores:
- the probe: lm eval <checkpoint> --tasks probe with its defaults (lm/eval/probe.py: standardized linear
  probes on frozen mean-pooled features, the first 1,000 train / 500 dev rows of SST-2, MRPC, STS-B, CoLA);
  the origin's model is built from the run's model config and seed, as lm train built its step 0;
- finetuning: lm finetune on the same four tasks with lm transfer's budget (lm/cli/transfer_recipe.py:
  3 epochs, batch 32, lr 5e-4, 10% warmup + linear decay, best dev epoch) and its pooling (decoder: mean),
  every task's training set cut to its first --max-train rows (the same cut at every point); the origin is
  lm transfer's scratch arm (init=none with the run's model config and tokenizer).
A task's finetune score is the median over seeds of its per-seed score (MRPC, STS-B: the mean of their two
metrics); the finetune average is the mean of the four medians. The table adds Spearman's rank correlation
(scipy.stats.spearmanr) of the probe average with the finetune average over the points, and per task.

    python benchmarks/probe_rank.py runs/glue_decoder --out runs/probe_rank
    python benchmarks/probe_rank.py runs/glue_decoder --out runs/probe_rank --seeds 0,1 --wait 1800 --threads 1
    python benchmarks/probe_rank.py runs/glue_decoder --out runs/probe_rank --table   # what is done

Work goes in seed rounds (seed 0 at every point, then seed 1, ...) and, within a round, in --steps order (spread:
a partial result still spans the range), so a run stopped at any time leaves a table over every point. It
resumes: each point's scores are <out>/points/step_<step>.json (read back, never recomputed; one of another run,
--tasks or --max-train is refused), and each
finetune is an lm finetune run directory <out>/finetune/step_<step>/seed<k> that resumes its own pairs.
--wait: a checkpoint not written yet (the pretraining still running) is taken up later; the run waits up to that
many seconds for it. The table: <out>/probe_rank.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from statistics import fmean, median

TASKS = ("sst2", "mrpc", "stsb", "cola")
STEPS = "100,2000,0,400,1200,200,700"  # spread: the ends first, then the middle
log = logging.getLogger("lm")


# -- the pure part: points read back, the table ---------------------------------------------------------


def point_path(out: Path, step: int) -> Path:
    return out / "points" / f"step_{step:08d}.json"


def read_point(out: Path, step: int) -> dict:
    """The point's record so far ({} when nothing is done): step, tokens, probe {task: score, avg}, finetune
    {seed: {task: score}}."""
    path = point_path(out, step)
    return json.loads(path.read_text()) if path.is_file() else {}


def write_point(out: Path, record: dict) -> None:
    from lm.core.files import atomic_write_text

    path = point_path(out, record["step"])
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(record, indent=1) + "\n")


def finetune_medians(record: dict, tasks=TASKS, seeds=None) -> dict[str, float] | None:
    """{task: median over the seeds done (of `seeds` only, when given), "avg": mean of those}; None before any
    seed is done."""
    seeds = {k: v for k, v in record.get("finetune", {}).items() if seeds is None or int(k) in seeds}
    if not seeds:
        return None
    medians = {t: median(s[t] for s in seeds.values()) for t in tasks}
    return {**medians, "avg": fmean(medians.values())}


def spearman(xs: list[float], ys: list[float]) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(xs, ys).statistic)


def rank_table(records: list[dict], tasks=TASKS, seeds=None) -> str:
    """The markdown table of the points with a probe and a finetune of `seeds` (None: any seed done), by step,
    then Spearman over them (from 3 points)."""
    done = [r for r in records if r.get("probe") and finetune_medians(r, tasks, seeds)]
    done.sort(key=lambda r: r["step"])
    head = ["step", "tokens", *(f"probe {t}" for t in tasks), "probe avg", *(f"ft {t}" for t in tasks), "ft avg"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for r in done:
        ft = finetune_medians(r, tasks, seeds) or {}
        cells = [str(r["step"]), f"{r['tokens']:,}", *(f"{r['probe'][t]:.1f}" for t in (*tasks, "avg"))]
        lines.append("| " + " | ".join([*cells, *(f"{ft[t]:.1f}" for t in (*tasks, "avg"))]) + " |")
    used = [sorted((k for k in r["finetune"] if seeds is None or int(k) in seeds), key=int) for r in done]
    lines += ["", f"{len(done)} points; finetune seeds per point: " + "; ".join(",".join(u) for u in used) + "."]
    if len(done) >= 3:
        lines += ["", f"Spearman(probe avg, finetune avg) = {rank_correlation(done, 'avg', tasks, seeds):.3f}"]
        per_task = ", ".join(f"{t} {rank_correlation(done, t, tasks, seeds):.3f}" for t in tasks)
        lines.append(f"Spearman per task (probe task vs finetune task): {per_task}")
    return "\n".join(lines) + "\n"


def rank_correlation(done: list[dict], key: str, tasks=TASKS, seeds=None) -> float:
    """Spearman of the probe's `key` score with the finetune median's over the points `done`."""
    ft = [finetune_medians(r, tasks, seeds) or {} for r in done]
    return spearman([r["probe"][key] for r in done], [f[key] for f in ft])


# -- the measurement ----------------------------------------------------------------------------------


def checkpoint(run: Path, step: int) -> Path | None:
    """The run's complete checkpoint at `step` (trainer.json is written last), None if not (yet) there; the
    origin (step 0) has none and is always there."""
    path = run / "checkpoints" / f"step_{step:08d}"
    return path if step == 0 or (path / "trainer.json").is_file() else None


def run_config(run: Path) -> dict:
    import yaml

    return yaml.safe_load((run / "config.yaml").read_text())


def origin_model(run: Path):
    """(model in eval mode, tokenizer): the run's model as lm train built it at step 0 (its seed), untrained."""
    import torch

    from lm.data.tokenizer import Tokenizer
    from lm.model import build_model
    from lm.model.config import model_from_saved

    cfg = run_config(run)
    torch.manual_seed(cfg["seed"])  # what lm.core.session.Session.build does before building
    return build_model(model_from_saved(cfg["model"])).eval(), Tokenizer.load(tokenizer_file(run).parent)


def tokenizer_file(run: Path) -> Path:
    return Path(run_config(run)["data"]["dir"]).expanduser() / "tokenizer.json"


def probe_scores(run: Path, step: int, tasks) -> dict[str, float]:
    """{task: score, "avg": mean}, as lm eval <checkpoint> --tasks probe computes them (lm/cli/eval.py)."""
    from lm.eval.probe import load_probe_sets, probe_model
    from lm.eval.saved import load_model

    path = checkpoint(run, step)
    model, tokenizer = origin_model(run) if step == 0 else load_model(path)
    sets = load_probe_sets(tokenizer, model.cfg.arch, tasks, max_len=min(128, model.cfg.max_seq_len))
    return {k[len("probe/") :]: v for k, v in probe_model(model, sets, tokenizer.pad_id).items()}


def finetune_scores(run: Path, step: int, seed: int, out: Path, tasks, max_train: int, threads) -> dict[str, float]:
    """{task: dev score} of one seed: lm transfer's finetune arm (its budget and pooling) on the cut tasks."""
    from omegaconf import OmegaConf

    from lm.cli.transfer_recipe import POOLING, Recipe, family, finetune_arm, finetuned_model_node
    from lm.report.transfer import arm_scores

    node = OmegaConf.create(run_config(run)["model"])
    cut = [f"tasks.{t}.max_train_examples={max_train}" for t in tasks]  # after the budget's own cuts: wins
    more = [*cut, "train.progress=false", *([f"train.threads={threads}"] if threads else [])]
    recipe = Recipe(out=out, seeds=[seed], finetune=more, tasks=list(tasks))
    run_dir = out / "finetune" / f"step_{step:08d}" / f"seed{seed}"
    init, tok = ("none", tokenizer_file(run)) if step == 0 else (str(checkpoint(run, step)), None)
    finetune_arm(recipe, run_dir, init, finetuned_model_node(node), tok, POOLING[family(node)], list(tasks))
    scores = arm_scores(run_dir / "results.json")
    return {t: scores[t]["seeds"][str(seed)] for t in tasks}


def tokens_at(run: Path, step: int) -> int:
    if step == 0:
        return 0
    return int(json.loads((checkpoint(run, step) / "trainer.json").read_text())["tokens"])  # type: ignore[operator]


def made_of(a: argparse.Namespace) -> dict:
    """What a point's scores depend on besides its step and seeds: recorded in it, compared when it is read back."""
    return {"run": str(Path(a.run).resolve()), "tasks": list(a.tasks), "max_train": a.max_train}


def check_made_of(a: argparse.Namespace, step: int, record: dict) -> None:
    """A point of another run, tasks or --max-train in --out is not read back as this call's (the table would mix
    two runs' scores); a point recorded before these keys existed is taken as it is."""
    made = made_of(a)
    diff = [f"{k}: {record[k]!r} -> {made[k]!r}" for k in made if k in record and record[k] != made[k]]
    if diff:
        sys.exit(
            f"probe_rank: {point_path(a.out, step)} holds scores of another {'; '.join(diff)}; name another --out "
            f"(or move that one away)"
        )


def do_point(a: argparse.Namespace, step: int, seed: int) -> None:
    """The point's probe (once) and this seed's finetune, each saved as soon as it is done."""
    record = read_point(a.out, step) or {"step": step, "tokens": tokens_at(a.run, step), "finetune": {}}
    check_made_of(a, step, record)
    record.update(made_of(a))
    if not record.get("probe"):
        t0 = time.perf_counter()
        record["probe"] = probe_scores(a.run, step, a.tasks)
        record["probe_seconds"] = round(time.perf_counter() - t0, 1)
        write_point(a.out, record)
        log.info("probe_rank: step %d probe %s", step, _fmt(record["probe"]))
    if str(seed) not in record["finetune"]:
        t0 = time.perf_counter()
        record["finetune"][str(seed)] = finetune_scores(a.run, step, seed, a.out, a.tasks, a.max_train, a.threads)
        record.setdefault("finetune_seconds", {})[str(seed)] = round(time.perf_counter() - t0, 1)
        write_point(a.out, record)
        log.info("probe_rank: step %d seed %d finetune %s", step, seed, _fmt(record["finetune"][str(seed)]))


def _fmt(scores: dict) -> str:
    return ", ".join(f"{k} {v:.1f}" for k, v in scores.items())


def pending(a: argparse.Namespace, seed: int) -> list[int]:
    return [s for s in a.steps if str(seed) not in read_point(a.out, s).get("finetune", {})]


def run_round(a: argparse.Namespace, seed: int, deadline: float) -> None:
    """Every point's finetune with `seed`, in --steps order; a checkpoint not written yet is taken up when it is."""
    while todo := pending(a, seed):
        ready = [s for s in todo if checkpoint(a.run, s) is not None]
        if ready:
            do_point(a, ready[0], seed)
        elif time.time() < deadline:
            time.sleep(30)
        else:
            sys.exit(f"probe_rank: no checkpoint for steps {todo} in {a.run / 'checkpoints'} after --wait {a.wait} s")


def write_table(a: argparse.Namespace) -> str:
    from lm.core.files import atomic_write_text

    table = rank_table([read_point(a.out, s) for s in a.steps], a.tasks, a.seeds if a.table else None)
    atomic_write_text(a.out / "probe_rank.md", table)
    return table


def _ints(text: str) -> list[int]:
    return [int(s) for s in text.split(",") if s.strip()]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        epilog=(__doc__ or "").split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run", type=Path, help="the lm train run directory whose checkpoints are ranked")
    p.add_argument("--out", type=Path, required=True, help="where the points, finetune runs and table go")
    p.add_argument("--steps", type=_ints, default=_ints(STEPS), help="checkpoint steps, 0 = origin (%(default)s)")
    p.add_argument("--seeds", type=_ints, default=[0, 1, 2], help="finetune seeds, one round each (0,1,2)")
    p.add_argument("--tasks", type=lambda t: t.split(","), default=list(TASKS), help="GLUE tasks (%(default)s)")
    p.add_argument("--max-train", type=int, default=2000, help="each task's first N train rows (%(default)s)")
    p.add_argument("--wait", type=float, default=0, help="seconds to wait for checkpoints not written yet")
    p.add_argument("--threads", type=int, help="torch CPU threads (default torch's: all cores); 1 on a shared CPU")
    p.add_argument(
        "--table", action="store_true", help="only print and write the table of what is done (of --seeds only)"
    )
    return p.parse_args(argv)


def main(argv=None) -> None:
    a = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s", datefmt="%H:%M:%S")
    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    if not a.table:
        from lm.core.loop import Preempted

        deadline = time.time() + a.wait
        try:
            for seed in a.seeds:
                run_round(a, seed, deadline)
                print(write_table(a), flush=True)
        except Preempted as e:  # SIGTERM / Ctrl-C: the finetune in flight saved its place
            sys.exit(f"probe_rank: stopped ({e}); the same command resumes, and --table shows what is done")
    print(write_table(a))


if __name__ == "__main__":
    main()
