"""Fault injection for `lm-train` on one CPU process: kill runs at random moments, damage checkpoints,
start concurrent runs, change the config on resume; then count exact resumes, clear refusals and
silent corruptions (which must be 0).

    python benchmarks/fault_injection.py --trials 29 --seed 0 --out /tmp/fault

--trials N takes the first N trials of the issue's mix (interleaved so a small N covers every kind):
20 kills (5 of them also damage a random checkpoint file), 3 concurrent second runs, 3 config changes,
2 full disks (a small tmpfs mounted on the run dir: needs root, else those trials are "skipped").
Needs LM_DATA_MIRROR (tiny Shakespeare is prepared once into LM_CACHE).
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lm.core.checkpoint import damage  # noqa: E402 - needs the repo on sys.path

STEPS = 30
TOL = 1e-5
BASE = ["model=tiny", "model.vocab_size=128", "model.max_seq_len=64", "data=shakespeare_char",
        "train.seq_len=64", "train.micro_batch_size=4", "train.ckpt_interval=5", f"train.max_steps={STEPS}",
        "train.log_interval=1", "train.eval_interval=0"]
CHANGED = "model/ffn=relu"  # the config change tried on resume; the refusal must name the ffn field
KINDS = ["kill"] * 15 + ["kill+damage"] * 5 + ["concurrent"] * 3 + ["config_change"] * 3 + ["disk_full"] * 2


def mix(n: int) -> List[str]:
    """The first n trials of an interleaving of KINDS (every kind appears early)."""
    queues = {k: [k] * KINDS.count(k) for k in dict.fromkeys(KINDS)}
    order = []
    while any(queues.values()):
        for k in ["kill", "kill+damage", "concurrent", "config_change", "disk_full", "kill", "kill"]:
            if queues[k]:
                order.append(queues[k].pop())
    return order[:n]


def env(**extra) -> Dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LM_RUN_STAMP")}
    e.update({"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", **extra})
    return e


def command(run_dir: Path, *extra: str) -> List[str]:
    return [sys.executable, "-m", "lm.cli.train", f"run_dir={run_dir}", *BASE, *extra]


def run(run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(command(run_dir, *extra), cwd=REPO, env=env(), capture_output=True, text=True,
                          timeout=600)


def start(run_dir: Path, pause_at: Optional[int], flag: Path) -> subprocess.Popen:
    extra = {"LM_FAULT_PAUSE_AT_STEP": str(pause_at), "LM_FAULT_PAUSE_FILE": str(flag)} if pause_at else {}
    return subprocess.Popen(command(run_dir), cwd=REPO, env=env(**extra), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_paused(proc: subprocess.Popen, flag: Path) -> bool:
    """True once the run is parked at its pause step; False if it ended first."""
    deadline = time.time() + 300
    while not flag.exists():
        if proc.poll() is not None or time.time() > deadline:
            return False
        time.sleep(0.05)
    time.sleep(0.2)
    return True


def kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def losses(run_dir: Path) -> Dict[int, float]:
    out = {}
    path = run_dir / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            m = json.loads(line)
        except json.JSONDecodeError:  # a line cut by the kill
            continue
        if "loss" in m:
            out[m["step"]] = m["loss"]
    return out


def exact(run_dir: Path, reference: Dict[int, float]) -> Optional[str]:
    """None if the run's per-step losses match the reference to TOL, else why not."""
    got = losses(run_dir)
    if sorted(got) != sorted(reference):
        return f"logged steps {sorted(got)[:3]}..{sorted(got)[-3:]} differ from 1..{STEPS}"
    worst = max(abs(got[s] - reference[s]) for s in reference)
    return None if worst <= TOL else f"losses differ from the reference by up to {worst:.3g}"


def message(proc: subprocess.CompletedProcess) -> str:
    """The error message lm-train ended with: from its last `SomethingError: ` line (stdout) to the end."""
    lines = proc.stdout.strip().splitlines()
    starts = [i for i, line in enumerate(lines) if re.match(r"^\w+(Error|Locked|Unwritable): ", line)]
    return "\n".join(lines[starts[-1]:]) if starts else ""


def refusal(proc: subprocess.CompletedProcess, must_name: str) -> Optional[str]:
    """None if `proc` is a clear refusal (exit 1, no traceback, an error message naming must_name)."""
    text = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 1:
        return f"exit code {proc.returncode}, not 1: {text[-300:]}"
    if "Traceback" in text:
        return f"a traceback: {text[-300:]}"
    msg = message(proc)
    if not msg or must_name.lower() not in msg.lower():
        return f"no error message naming {must_name!r}: {text[-300:]!r}"
    return None


def latest_damage(run_dir: Path) -> Optional[str]:
    """None if checkpoints/latest is absent or names a checkpoint that passes its manifest check."""
    pointer = run_dir / "checkpoints" / "latest"
    if not pointer.exists():
        return None
    ckpt = pointer.parent / pointer.read_text().strip()
    why = damage(ckpt) if ckpt.is_dir() else f"{ckpt.name} does not exist"
    return f"latest -> {ckpt.name} is damaged: {why}" if why else None


def damage_random_checkpoint(run_dir: Path, rng: random.Random) -> str:
    ckpts = sorted((run_dir / "checkpoints").glob("step_*"))
    files = [f for c in ckpts for f in sorted(c.rglob("*")) if f.is_file() and f.stat().st_size > 0]
    if not files:
        return "no checkpoint to damage"
    target = rng.choice(files)
    data = bytearray(target.read_bytes())
    if rng.random() < 0.5:
        target.write_bytes(data[: rng.randrange(len(data))])
        return f"truncated {target.relative_to(run_dir)}"
    for i in rng.sample(range(len(data)), min(4, len(data))):
        data[i] ^= 0xFF
    target.write_bytes(data)
    return f"flipped 4 bytes of {target.relative_to(run_dir)}"


def interrupt(run_dir: Path, rng: random.Random, flag: Path) -> str:
    """Kill a run at a random moment: half the time parked inside a random step (the loop's hook), else
    after a random delay (which can land anywhere, checkpoint writes included)."""
    if rng.random() < 0.5:
        step = rng.randint(2, STEPS - 1)
        proc = start(run_dir, step, flag)
        wait_paused(proc, flag)
        kill(proc)
        return f"SIGKILL inside step {step}"
    delay = rng.uniform(1.0, 5.0)
    proc = start(run_dir, None, flag)
    time.sleep(delay)
    kill(proc)
    return f"SIGKILL after {delay:.2f}s"


def disk_full(run_dir: Path, rng: random.Random, reference: Dict[int, float]) -> Dict:
    """The run dir is a tmpfs too small for the checkpoints (one is ~1.4 MB): the run must stop with a clear
    message and leave `latest` intact; after the disk grows (remount), the same command continues exactly."""
    run_dir.mkdir()
    size_kb = rng.randint(1500, 4000)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(run_dir)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        return {"kind": "disk_full", "outcome": "skipped", "notes": [f"mount failed: {mounted.stderr.strip()}"],
                "problems": []}
    try:
        notes, problems = [f"run dir on a {size_kb} kB tmpfs"], []
        full = run(run_dir)
        refused = full.returncode != 0
        if refused:
            why = refusal(full, "space")
            problems += [f"full disk: {why}"] if why else []
            problems += [why for why in [latest_damage(run_dir)] if why]
            notes.append(f"stopped: {message(full).splitlines()[0][:100]}..." if not why else "")
            subprocess.run(["mount", "-o", "remount,size=64m", str(run_dir)], check=True)
            full = run(run_dir)
        if full.returncode != 0:
            problems.append(f"rerun after the disk grew failed: {(full.stdout + full.stderr)[-400:]}")
        else:
            problems += [why for why in [exact(run_dir, reference), latest_damage(run_dir)] if why]
    finally:
        subprocess.run(["umount", str(run_dir)], capture_output=True)
    outcome = "silent_corruption" if problems else ("clear_refusal" if refused else "exact_resume")
    return {"kind": "disk_full", "outcome": outcome, "notes": notes, "problems": problems}


def trial(kind: str, run_dir: Path, rng: random.Random, reference: Dict[int, float]) -> Dict:
    if kind == "disk_full":
        return disk_full(run_dir, rng, reference)
    flag = run_dir.parent / f"{run_dir.name}.paused"
    notes, problems, refused = [], [], False
    if kind == "concurrent":
        step = rng.randint(2, STEPS - 1)
        first = start(run_dir, step, flag)
        if not wait_paused(first, flag):
            problems.append("the first run ended before its pause step")
        second = run(run_dir)
        why = refusal(second, f"pid {first.pid}")  # names the holder
        problems += [f"second run: {why}"] if why else []
        refused = why is None
        kill(first)
        notes.append(f"second run while the first was parked in step {step}")
    else:
        notes.append(interrupt(run_dir, rng, flag))
    if kind == "kill+damage":
        notes.append(damage_random_checkpoint(run_dir, rng))
    if kind == "config_change":
        resumable = (run_dir / "checkpoints" / "latest").exists()
        changed = run(run_dir, CHANGED)
        why = refusal(changed, "ffn")
        if why and changed.returncode == 0 and not resumable:
            why = None  # killed before any checkpoint: nothing to resume, a fresh run with the new config is fine
            notes.append("no checkpoint yet: the changed config started fresh")
            run_dir_reset(run_dir)
        else:
            refused = why is None
        problems += [f"resume with {CHANGED}: {why}"] if why else []
    final = run(run_dir)
    if final.returncode != 0:
        why = refusal(final, "damaged")
        if kind == "kill+damage" and why is None:
            # no intact checkpoint left: a clear stop is the right answer; follow its advice (move the
            # checkpoints away), and the same command must then give the reference trajectory from scratch
            refused = True
            notes.append(f"rerun refused: {message(final).splitlines()[0][:120]}...")
            (run_dir / "checkpoints").rename(run_dir / "checkpoints.moved")
            final = run(run_dir)
        else:
            problems.append(f"rerun failed: {(final.stdout + final.stderr)[-400:]}")
    if final.returncode == 0:
        problems += [why for why in [exact(run_dir, reference)] if why]
    elif not problems:
        problems.append(f"rerun failed: {(final.stdout + final.stderr)[-400:]}")
    problems += [why for why in [latest_damage(run_dir)] if why]
    outcome = "silent_corruption" if problems else ("clear_refusal" if refused else "exact_resume")
    return {"kind": kind, "outcome": outcome, "notes": notes, "problems": problems}


def run_dir_reset(run_dir: Path) -> None:
    """Forget a run that started fresh with a changed config (it holds no resumable state of the original)."""
    shutil.rmtree(run_dir)


def table(summary: Dict) -> str:
    rows = ["| fault kind | trials | exact resumes | clear refusals | silent corruptions | skipped |",
            "|---|---|---|---|---|---|"]
    for kind, c in [*summary["by_kind"].items(), ("**all**", summary["total"])]:
        rows.append(f"| {kind} | {c['trials']} | {c['exact_resume']} | {c['clear_refusal']} | "
                    f"{c['silent_corruption']} | {c['skipped']} |")
    return "\n".join(rows) + "\n"


def summarize(results: List[Dict], outside_touched: bool) -> Dict:
    def counts(rs):
        return {"trials": len(rs), **{o: sum(r["outcome"] == o for r in rs)
                                     for o in ("exact_resume", "clear_refusal", "silent_corruption", "skipped")}}
    by_kind = {k: counts([r for r in results if r["kind"] == k]) for k in dict.fromkeys(r["kind"] for r in results)}
    return {"by_kind": by_kind, "total": counts(results), "outside_run_dir_touched": outside_touched,
            "trials": results}


def outside_state(out: Path) -> List:
    """Name, mtime and bytes of every file in `out` that belongs to no run (the sentinel and anything else)."""
    return [(p.name, p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else None) for p in sorted(out.iterdir())
            if not p.name.startswith(("trial_", "reference", "fault_injection."))]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=len(KINDS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    sentinel = args.out / "sentinel.txt"  # a user file next to every run dir: must stay as it is
    sentinel.write_text("user data, not the run's\n")
    before = outside_state(args.out)

    ref = run(args.out / "reference")
    if ref.returncode != 0:
        sys.exit(f"the reference run failed:\n{ref.stderr[-3000:]}")
    reference = losses(args.out / "reference")
    results = []
    for i, kind in enumerate(mix(args.trials)):
        r = trial(kind, args.out / f"trial_{i:02d}", rng, reference)
        print(f"trial {i:2d} {kind:14s} {r['outcome']:18s} {'; '.join(r['notes'] + r['problems'])}", flush=True)
        results.append(r)
    outside = outside_state(args.out) != before
    summary = summarize(results, outside)
    (args.out / "fault_injection.json").write_text(json.dumps(summary, indent=2) + "\n")
    (args.out / "fault_injection.md").write_text(table(summary))
    print(table(summary) + f"files outside the run dirs touched: {outside}")
    return 1 if summary["total"]["silent_corruption"] or outside else 0


if __name__ == "__main__":
    sys.exit(main())
