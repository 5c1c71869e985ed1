"""Fault injection for `lm train` (one process, DDP, ZeRO-2 and FSDP2 on 2 ranks) and `lm finetune task=glue/all`:
kill runs at random moments (inside steps, inside checkpoint writes, inside asynchronous checkpoint writes, after
random delays), damage checkpoints, start concurrent runs, change the config on resume; then count exact resumes,
clear refusals and silent corruptions (which must be 0).

    python benchmarks/fault_injection.py --trials 32 --ddp-trials 12 --zero2-trials 4 --fsdp2-trials 4 \
        --finetune-trials 6 --seed 0 --out /tmp/fault

--trials N takes the first N single-process trials of the issue's mix (interleaved so a small N covers every
kind): 20 kills (5 of them also damage a random checkpoint file), 3 concurrent second runs, 3 config changes,
2 full disks (a small tmpfs mounted on the run dir: needs root, else those trials are "skipped"), and issue
49's: 2 damaged `latest` plus a config change (the checkpoint actually resumed must be the one compared), 2
deleted `latest` (resume from the newest intact step_*), 1 `.lock` planted as a symlink to a user file, 1
infinite gradient norm (optim.lr=1e3: the run must stop, not finish with frozen weights), 2 `latest` naming
another run's checkpoint; and 4 kills during an asynchronous checkpoint write (train.async_checkpoint=true: parked in
a random phase of a random write's background thread while the loop trains on, then killed after a random delay;
or killed at a random moment), whose rerun (asynchronous too) must give the synchronous reference's losses.
--kinds a,b keeps only those kinds of the single-process mix. --out must be new or empty: an earlier call's runs
there would be resumed, and judged, as this call's trials.
--ddp-trials / --zero2-trials: the same kinds under `torchrun --nproc_per_node 2` (gloo; full disks excluded; ZeRO
refuses asynchronous writes, so has none). --fsdp2-trials: kills during FSDP2's asynchronous writes (DCP's
async_save) on 2 ranks.
--finetune-trials: SIGKILL `lm finetune task=glue/all skip_missing=true` (tiny settings, init = the reference
lm train run), damage a task/seed checkpoint, change optim.weight_decay on resume; the rerun must give the
uninterrupted results.json (timings aside), submission files and per-step losses.
--elastic-trials: issue 51's world-size and engine changes on resume (ELASTIC_LAYOUTS, in turn: single, DDP, FSDP2
and ZeRO-1/2/3 in both directions): SIGKILL on the first layout after a checkpoint, then the same command on another
world size / engine; exact (losses of the uninterrupted 1-process run, global batch kept), or refused in one line
and then exact on the first layout (ZeRO stage 0, engine=deepspeed: lm reads no stage-0 files).
Needs LM_DATA_MIRROR (tiny Shakespeare is prepared once into LM_CACHE; GLUE TSVs from <mirror>/glue_data).
"""

import argparse
import dataclasses
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lm.core.checkpoint import SAVE_PHASES, damage  # noqa: E402 - needs the repo on sys.path

STEPS = 30
TOL = 1e-5
BASE = [
    "model=tiny",
    "model.vocab_size=128",
    "model.max_seq_len=64",
    "data=shakespeare_char",
    "train.seq_len=64",
    "train.micro_batch_size=4",
    "train.ckpt_interval=5",
    f"train.max_steps={STEPS}",
    "train.log_interval=1",
    "train.eval_interval=0",
]
CHANGED = "model/ffn=relu"  # the config change tried on resume; the refusal must name the ffn field
KINDS = (
    ["kill"] * 15
    + ["kill+damage"] * 5
    + ["concurrent"] * 3
    + ["config_change"] * 3
    + ["disk_full"] * 2
    + ["damage+config_change"] * 2
    + ["deleted_latest"] * 2
    + ["symlinked_lock"]
    + ["inf_grad"]
    + ["latest_outside"] * 2
    + ["async_kill"] * 4
)
ISSUE49_KINDS = ["damage+config_change", "deleted_latest", "symlinked_lock", "inf_grad", "latest_outside"]
DDP_KINDS = ["kill"] * 6 + ["kill+damage"] * 2 + ["concurrent"] + ["config_change"] + ["async_kill"] * 2
FSDP2_KINDS = ["async_kill"] * 4
ASYNC = "train.async_checkpoint=true"
ZERO2_KINDS = ["kill"] * 3 + ["kill+damage"]
FINETUNE_KINDS = ["kill"] * 4 + ["kill+damage"] + ["config_change"]
GLUE_TASKS = ["cola", "mrpc", "rte", "sst2", "stsb"]  # those of glue/all with a local train.tsv in the mirror
FINETUNE_CHANGED = "optim.weight_decay=0.05"
# World-size / engine changes on resume (elastic resume): killed on the first layout, the same command rerun on
# the second; 4 sequences per step (micro-batch 1 x grad_accum x world). name: (world, engine) before and after,
# and what a refusal must name (None: it must resume exactly).
ELASTIC_BASE = [a for a in BASE if not a.startswith("train.micro_batch_size=")] + ["train.micro_batch_size=1"]
ELASTIC_GLOBAL = 4
ELASTIC_LAYOUTS = {
    "1->2": ((1, "single"), (2, "ddp"), None),
    "2->1": ((2, "ddp"), (1, "single"), None),
    "2->4": ((2, "fsdp2"), (4, "fsdp2"), None),
    "ddp->fsdp2": ((2, "ddp"), (2, "fsdp2"), None),
    "fsdp2->single": ((2, "fsdp2"), (1, "single"), None),
    "fsdp2->zero2": ((2, "fsdp2"), (2, "zero2"), None),
    "2->3": ((2, "ddp"), (3, "ddp"), "world size that divides 4"),
    "zero2 2->1": ((2, "zero2"), (1, "zero2"), None),
    "zero3->fsdp2": ((2, "zero3"), (2, "fsdp2"), None),
    "ddp->zero3": ((2, "ddp"), (2, "zero3"), None),
    "zero1->single": ((2, "zero1"), (1, "single"), None),
    "fsdp2->zero0": ((2, "fsdp2"), (2, "deepspeed"), "use engine=zero2 (or zero1, zero3)"),
}
ELASTIC_KINDS = list(ELASTIC_LAYOUTS)


@dataclass
class Suite:
    """One kind of job under test: how to start it, its uninterrupted reference, how to compare."""

    name: str  # prefix of its trial kinds in the summary ("" for single-process lm train)
    world: int
    app: str  # "train" | "finetune"
    args: list[str]
    changed: str  # the config change tried on resume
    changed_names: str  # what its refusal must name
    steps: int = STEPS  # optimizer steps of the whole uninterrupted job (set from the reference)
    saves: int = STEPS // 5  # checkpoints it writes
    seconds: float = 20.0  # its wall time
    reference: dict = field(default_factory=dict)
    ref_dir: Path | None = None

    def kind(self, k: str) -> str:
        return f"{self.name}:{k}" if self.name else k


def mix(n: int, kinds: list[str] = KINDS) -> list[str]:
    """The first n trials of an interleaving of `kinds` (every kind appears early)."""
    queues = {k: [k] * kinds.count(k) for k in dict.fromkeys(kinds)}
    order = []
    while any(queues.values()):
        for k in [
            "kill",
            "kill+damage",
            "concurrent",
            "config_change",
            "disk_full",
            *ISSUE49_KINDS,
            "async_kill",
            "kill",
            "kill",
        ]:
            if queues.get(k):
                order.append(queues[k].pop())
    return order[:n]


def env(**extra) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LM_RUN_STAMP")}
    e.update({"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", **extra})
    return e


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def command(suite: Suite, run_dir: Path, *extra: str) -> list[str]:
    launcher = [sys.executable, "-m"]
    if suite.world > 1:  # each rank's output goes to files under <run_dir>.ranks (see output())
        launcher += [
            "torch.distributed.run",
            "--nproc_per_node",
            str(suite.world),
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(free_port()),
            "--log-dir",
            f"{run_dir}.ranks",
            "--redirects",
            "3",
            "-m",
        ]
    return [*launcher, f"lm.cli.{suite.app}", f"run_dir={run_dir}", *suite.args, *extra]


def run(suite: Suite, run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    shutil.rmtree(f"{run_dir}.ranks", ignore_errors=True)
    proc = subprocess.run(
        command(suite, run_dir, *extra), cwd=REPO, env=env(), capture_output=True, text=True, timeout=900
    )
    if suite.world > 1:  # what lm printed: the ranks' own output (torchrun adds its ChildFailedError summary)
        proc.stdout, proc.stderr = output(run_dir, rank0=True), output(run_dir, rank0=False)
    return proc


def output(run_dir: Path, rank0: bool) -> str:
    """Rank 0's (or the other ranks') stdout+stderr of the last torchrun job of `run_dir`."""
    files = sorted(Path(f"{run_dir}.ranks").glob("*/attempt_*/*/std*.log"), key=lambda f: (f.parent.name, f.name))
    return "".join(f.read_text(errors="replace") for f in files if (f.parent.name == "0") == rank0)


def start(suite: Suite, run_dir: Path, pause: dict[str, str], flag: Path) -> subprocess.Popen:
    # benchmarks/fault_pause.py, installed through lm's LM_PLUGINS hook point, reads the LM_FAULT_* variables
    extra = (
        {**pause, "LM_FAULT_PAUSE_FILE": str(flag), "LM_PLUGINS": str(REPO / "benchmarks" / "fault_pause.py")}
        if pause
        else {}
    )
    return subprocess.Popen(
        command(suite, run_dir),
        cwd=REPO,
        env=env(**extra),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def wait_paused(proc: subprocess.Popen, flag: Path, world: int = 1) -> bool:
    """True once the run is parked at its pause point; False if it ended first."""
    deadline = time.time() + 600
    while not flag.exists():
        if proc.poll() is not None or time.time() > deadline:
            return False
        time.sleep(0.05)
    time.sleep(0.2 if world == 1 else 2.0)  # the other ranks reach the pause (or wait at a collective)
    return True


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL the job and every process below it (torchrun starts each rank in a session of its own)."""
    victims = [proc.pid, *descendants(proc.pid)]
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    for pid in victims[1:]:  # not our children: wait until they are gone (or zombies)
        while _stat(pid)[1] not in ("", "Z"):
            time.sleep(0.05)


def _stat(pid: int):
    """(ppid, state) of a process from /proc/<pid>/stat; (0, "") when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[1]), fields[0]
    except (OSError, IndexError):
        return 0, ""


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            children.setdefault(_stat(int(entry.name))[0], []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def losses(run_dir: Path) -> dict[int, float]:
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


def exact(run_dir: Path, reference: dict[int, float], steps: int = STEPS) -> str | None:
    """None if the run's per-step losses match the reference to TOL, else why not."""
    got = losses(run_dir)
    if sorted(got) != sorted(reference):
        return f"logged steps {sorted(got)[:3]}..{sorted(got)[-3:]} differ from 1..{steps}"
    worst = max(abs(got[s] - reference[s]) for s in reference)
    return None if worst <= TOL else f"losses differ from the reference by up to {worst:.3g}"


def _untimed(node):
    """results.json without its wall-clock fields (`seconds`)."""
    if isinstance(node, dict):
        return {k: _untimed(v) for k, v in node.items() if k != "seconds"}
    if isinstance(node, list):
        return [_untimed(v) for v in node]
    return node


def pairs(run_dir: Path) -> list[Path]:
    return sorted(p for p in run_dir.glob("*/seed*") if p.is_dir())


def finetune_exact(run_dir: Path, ref: Path) -> str | None:
    """None if results.json (timings aside), the submission files and every pair's losses equal the reference."""
    if not (run_dir / "results.json").is_file():
        return "no results.json"
    got, want = (
        _untimed(json.loads((d / "results.json").read_text().replace(str(d), "<run_dir>"))) for d in (run_dir, ref)
    )  # timings and the run_dir in file paths aside
    if got != want:
        return "results.json differs from the uninterrupted run's"
    subs = [sorted(p.name for p in (d / "submission").glob("*.tsv")) for d in (run_dir, ref)]
    if subs[0] != subs[1] or any(
        (run_dir / "submission" / n).read_bytes() != (ref / "submission" / n).read_bytes() for n in subs[1]
    ):
        return f"submission files differ ({subs[0]} vs {subs[1]})"
    if [p.relative_to(run_dir) for p in pairs(run_dir)] != [p.relative_to(ref) for p in pairs(ref)]:
        return "a different set of task/seed directories"
    for p in pairs(ref):
        why = exact(run_dir / p.relative_to(ref), losses(p))
        if why:
            return f"{p.relative_to(ref)}: {why}"
    return None


def same_result(suite: Suite, run_dir: Path) -> str | None:
    if suite.app == "finetune":
        return finetune_exact(run_dir, suite.ref_dir)
    return exact(run_dir, suite.reference)


def message(proc: subprocess.CompletedProcess) -> str:
    """The error message the app ended with: from its last `SomethingError: ` line (stdout) to the end."""
    lines = proc.stdout.strip().splitlines()
    starts = [i for i, line in enumerate(lines) if re.match(r"^\w+(Error|Locked|Unwritable|Diverged): ", line)]
    return "\n".join(lines[starts[-1] :]) if starts else ""


def refusal(proc: subprocess.CompletedProcess, must_name: str) -> str | None:
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


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """Every checkpoints/ directory of a job: the run's, or each task/seed pair's."""
    return sorted(p for p in [run_dir / "checkpoints", *run_dir.glob("*/seed*/checkpoints")] if p.is_dir())


def latest_damage(run_dir: Path) -> str | None:
    """None if every checkpoints/latest is absent or names a checkpoint that passes its manifest check."""
    for ckpts in checkpoint_dirs(run_dir):
        pointer = ckpts / "latest"
        if not pointer.exists():
            continue
        ckpt = ckpts / pointer.read_text().strip()
        why = damage(ckpt) if ckpt.is_dir() else f"{ckpt.name} does not exist"
        if why:
            return f"{pointer.relative_to(run_dir)} -> {ckpt.name} is damaged: {why}"
    return None


def damage_random_checkpoint(run_dir: Path, rng: random.Random) -> str:
    ckpts = [c for d in checkpoint_dirs(run_dir) for c in sorted(d.glob("step_*"))]
    files = [f for c in ckpts for f in sorted(c.rglob("*")) if f.is_file() and f.stat().st_size > 0]
    files += sorted(run_dir.glob("*/seed*/result.pt"))  # a finished task/seed of lm finetune
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


def interrupt(suite: Suite, run_dir: Path, rng: random.Random, flag: Path) -> str:
    """Kill a job at a random moment: parked inside a random step, parked at a random phase of a random
    checkpoint write (both by benchmarks/fault_pause.py on lm's hooks), or after a random delay (anywhere)."""
    how = rng.random()
    if how < 0.4:
        step = rng.randint(2, suite.steps - 1)
        pause, what = {"LM_FAULT_PAUSE_AT_STEP": str(step)}, f"SIGKILL inside step {step}"
    elif how < 0.7:
        phase, n = rng.choice(SAVE_PHASES), rng.randint(1, suite.saves)
        pause, what = {"LM_FAULT_PAUSE_IN_SAVE": f"{phase}:{n}"}, f"SIGKILL in checkpoint write {n} before {phase}"
    else:
        return _killed_after_delay(suite, run_dir, rng, flag)
    proc = start(suite, run_dir, pause, flag)
    if not wait_paused(proc, flag, suite.world):
        what += " (never reached: the job ended first)"
    kill(proc)
    flag.unlink(missing_ok=True)
    return what


def async_interrupt(suite: Suite, run_dir: Path, rng: random.Random, flag: Path) -> str:
    """Kill a job that writes its checkpoints in the background (`suite` runs with train.async_checkpoint=true):
    mostly parked in a random phase of a random write's background thread (benchmarks/fault_pause.py on lm's
    save_phase hook) while the loop trains on up to the next save, which waits for it, and killed after a random
    further delay; else killed after a random delay (anywhere, a write in flight or not)."""
    if rng.random() >= 0.75:
        return _killed_after_delay(suite, run_dir, rng, flag)
    phase, n = rng.choice(SAVE_PHASES), rng.randint(1, suite.saves)
    proc = start(suite, run_dir, {"LM_FAULT_PAUSE_IN_SAVE": f"{phase}:{n}"}, flag)
    what = f"SIGKILL in background write {n} before {phase}"
    if wait_paused(proc, flag, suite.world):
        delay = rng.uniform(0.0, 0.1) * suite.seconds  # the loop trains on meanwhile
        time.sleep(delay)
        what += f", {delay:.1f}s later"
    else:
        what += " (never reached: the job ended first)"
    kill(proc)
    flag.unlink(missing_ok=True)
    return what


def _killed_after_delay(suite: Suite, run_dir: Path, rng: random.Random, flag: Path) -> str:
    delay = rng.uniform(0.2, 1.0) * suite.seconds
    proc = start(suite, run_dir, {}, flag)
    time.sleep(delay)
    kill(proc)
    return f"SIGKILL after {delay:.2f}s"


def disk_full(suite: Suite, run_dir: Path, rng: random.Random) -> dict:
    """The run dir is a tmpfs too small for the checkpoints (one is ~1.4 MB): the run must stop with a clear
    message and leave `latest` intact; after the disk grows (remount), the same command continues exactly."""
    run_dir.mkdir()
    size_kb = rng.randint(1500, 4000)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(run_dir)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        return {
            "kind": "disk_full",
            "outcome": "skipped",
            "notes": [f"mount failed: {mounted.stderr.strip()}"],
            "problems": [],
        }
    try:
        notes, problems = [f"run dir on a {size_kb} kB tmpfs"], []
        full = run(suite, run_dir)
        refused = full.returncode != 0
        if refused:
            why = refusal(full, "space")
            problems += [f"full disk: {why}"] if why else []
            problems += [why for why in [latest_damage(run_dir)] if why]
            notes.append(f"stopped: {message(full).splitlines()[0][:100]}..." if not why else "")
            subprocess.run(["mount", "-o", "remount,size=64m", str(run_dir)], check=True)
            full = run(suite, run_dir)
        if full.returncode != 0:
            problems.append(f"rerun after the disk grew failed: {(full.stdout + full.stderr)[-400:]}")
        else:
            problems += [why for why in [exact(run_dir, suite.reference), latest_damage(run_dir)] if why]
    finally:
        subprocess.run(["umount", str(run_dir)], capture_output=True)
    outcome = "silent_corruption" if problems else ("clear_refusal" if refused else "exact_resume")
    return {"kind": "disk_full", "outcome": outcome, "notes": notes, "problems": problems}


def holder_pid(first: subprocess.Popen, run_dir: Path) -> int | None:
    """The pid the lock of run_dir names, if it is `first` or one of its ranks."""
    try:
        pid = json.loads((run_dir / ".lock").read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None
    return pid if pid in (first.pid, *descendants(first.pid)) else None


def resumable_state(run_dir: Path) -> bool:
    """Whether the job left anything a rerun continues from (a checkpoint, or a finished task/seed)."""
    return any((d / "latest").exists() for d in checkpoint_dirs(run_dir)) or any(run_dir.glob("*/seed*/result.pt"))


# -- issue 49: the checkpoint resumed is the one checked; a lock that is a symlink; an infinite gradient --------


def killed_after_checkpoints(suite: Suite, run_dir: Path, rng: random.Random) -> str:
    """SIGKILL the run inside a random step after its second checkpoint (so an older intact one exists)."""
    flag = run_dir.parent / f"{run_dir.name}.paused"
    step = rng.randint(11, suite.steps - 1)
    proc = start(suite, run_dir, {"LM_FAULT_PAUSE_AT_STEP": str(step)}, flag)
    paused = wait_paused(proc, flag, suite.world)
    kill(proc)
    flag.unlink(missing_ok=True)
    return f"SIGKILL inside step {step}" + ("" if paused else " (never reached: the job ended first)")


def pointed(run_dir: Path) -> Path | None:
    pointer = run_dir / "checkpoints" / "latest"
    return run_dir / "checkpoints" / pointer.read_text().strip() if pointer.is_file() else None


def resumed_from(proc: subprocess.CompletedProcess) -> list[str]:
    return re.findall(r"resumed from (\S+) \(step", proc.stdout + proc.stderr)


def finish(suite: Suite, run_dir: Path, kind: str, notes: list[str], problems: list[str], refused: bool) -> dict:
    """The same command as the reference, to the end: it must give the reference's losses."""
    final = run(suite, run_dir)
    if final.returncode != 0:
        problems.append(f"rerun failed: {(final.stdout + final.stderr)[-400:]}")
    else:
        problems += [why for why in [same_result(suite, run_dir)] if why]
        outside = [p for p in resumed_from(final) if not Path(p).resolve().is_relative_to(run_dir.resolve())]
        problems += [f"resumed another run's checkpoint: {outside}"] if outside else []
    problems += [why for why in [latest_damage(run_dir)] if why]
    outcome = "silent_corruption" if problems else ("clear_refusal" if refused else "exact_resume")
    return {"kind": suite.kind(kind), "outcome": outcome, "notes": notes, "problems": problems}


def damage_config_trial(suite: Suite, run_dir: Path, rng: random.Random) -> dict:
    """Damage the checkpoint `latest` names (the issue's repros: manifest.json cut to 10 bytes, or one byte of
    config.yaml flipped), then resume with a changed model: the fallback checkpoint's config must refuse it.
    Then the unchanged command resumes from that fallback, exactly."""
    notes, problems = [killed_after_checkpoints(suite, run_dir, rng)], []
    ckpt = pointed(run_dir)
    if ckpt is None:
        return finish(suite, run_dir, "damage+config_change", notes + ["no checkpoint to damage"], problems, False)
    if rng.random() < 0.5:
        os.truncate(ckpt / "manifest.json", 10)
        notes.append(f"truncated {ckpt.name}/manifest.json to 10 bytes")
    else:
        data = bytearray((ckpt / "config.yaml").read_bytes())
        data[rng.randrange(len(data))] ^= 1
        (ckpt / "config.yaml").write_bytes(bytes(data))
        notes.append(f"flipped a bit of {ckpt.name}/config.yaml")
    changed = run(suite, run_dir, suite.changed)
    why = refusal(changed, suite.changed_names)
    problems += [f"resume with {suite.changed} after the damage: {why}"] if why else []
    return finish(suite, run_dir, "damage+config_change", notes, problems, why is None)


def deleted_latest_trial(suite: Suite, run_dir: Path, rng: random.Random) -> dict:
    """Delete checkpoints/latest of a killed run: the same command must resume from the newest intact step_*
    (saying so), not start over on top of the checkpoints (which gives the same losses, so the log is checked)."""
    notes, problems = [killed_after_checkpoints(suite, run_dir, rng)], []
    newest = pointed(run_dir)
    (run_dir / "checkpoints" / "latest").unlink(missing_ok=True)
    final = run(suite, run_dir)
    if final.returncode == 0 and newest is not None and resumed_from(final) != [str(newest)]:
        problems.append(f"did not resume from {newest.name} (resumed from: {resumed_from(final)}): started over")
    notes.append(f"deleted latest ({newest.name if newest else 'none'})")
    if final.returncode != 0:
        problems.append(f"rerun failed: {(final.stdout + final.stderr)[-400:]}")
    else:
        problems += [why for why in [same_result(suite, run_dir), latest_damage(run_dir)] if why]
    outcome = "silent_corruption" if problems else "exact_resume"
    return {"kind": suite.kind("deleted_latest"), "outcome": outcome, "notes": notes, "problems": problems}


def symlinked_lock_trial(suite: Suite, run_dir: Path, rng: random.Random) -> dict:
    """Replace <run_dir>/.lock of a killed run by a symlink to a user file outside it: the run must refuse in one
    line, leaving the file as it was; without the symlink, the same command resumes exactly."""
    notes = [interrupt(suite, run_dir, rng, run_dir.parent / f"{run_dir.name}.paused")]
    victim = run_dir.parent / f"{run_dir.name}.victim.txt"
    victim.write_text("user data, not the run's\n")
    run_dir.mkdir(exist_ok=True)
    (run_dir / ".lock").unlink(missing_ok=True)
    (run_dir / ".lock").symlink_to(victim)
    first = run(suite, run_dir)
    why = refusal(first, "symbolic link")
    problems = [f"with .lock -> {victim.name}: {why}"] if why else []
    if victim.read_text() != "user data, not the run's\n":
        problems.append(f"{victim.name}, the target of the planted .lock, was overwritten")
    (run_dir / ".lock").unlink()
    return finish(suite, run_dir, "symlinked_lock", notes, problems, why is None)


def inf_grad_trial(suite: Suite, run_dir: Path, rng: random.Random) -> dict:
    """optim.lr=1e3 (constant schedule): the gradient norm becomes inf while the loss stays finite. Under
    on_nonfinite=stop, or skip (after max_nonfinite in a row), the run must stop with a clear message, leaving an
    intact `latest`, instead of finishing (exit 0) with every later update skipped."""
    policy = rng.choice(["stop", "skip"])
    proc = run(suite, run_dir, "sched=constant", "optim.lr=1e3", f"train.on_nonfinite={policy}")
    why = refusal(proc, "Lower optim.lr")
    problems = [f"optim.lr=1e3 train.on_nonfinite={policy}: {why}"] if why else []
    problems += [why for why in [latest_damage(run_dir)] if why]
    notes = [f"on_nonfinite={policy}"] + ([f"stopped: {message(proc).splitlines()[0][:110]}..."] if not why else [])
    outcome = "silent_corruption" if problems else "clear_refusal"
    return {"kind": suite.kind("inf_grad"), "outcome": outcome, "notes": notes, "problems": problems}


def latest_outside_trial(suite: Suite, run_dir: Path, rng: random.Random) -> dict:
    """Point `latest` of a killed run at a checkpoint of the reference run (by a relative or an absolute path):
    the run must never resume it; it resumes from its own newest intact checkpoint."""
    notes, problems = [killed_after_checkpoints(suite, run_dir, rng)], []
    other = rng.choice(sorted((suite.ref_dir / "checkpoints").glob("step_*")))
    ckpts = run_dir / "checkpoints"
    ckpts.mkdir(parents=True, exist_ok=True)
    target = os.path.relpath(other, ckpts) if rng.random() < 0.5 else str(other)
    (ckpts / "latest").write_text(target)
    notes.append(f"latest -> {target}")
    return finish(suite, run_dir, "latest_outside", notes, problems, False)


ISSUE49_TRIALS = {
    "damage+config_change": damage_config_trial,
    "deleted_latest": deleted_latest_trial,
    "symlinked_lock": symlinked_lock_trial,
    "inf_grad": inf_grad_trial,
    "latest_outside": latest_outside_trial,
}


def trial(suite: Suite, kind: str, run_dir: Path, rng: random.Random) -> dict:
    if kind == "disk_full":
        return disk_full(suite, run_dir, rng)
    if kind in ISSUE49_TRIALS:
        return ISSUE49_TRIALS[kind](suite, run_dir, rng)
    flag = run_dir.parent / f"{run_dir.name}.paused"
    notes, problems, refused = [], [], False
    if kind == "async_kill":  # killed and rerun with background writes; compared with the synchronous reference
        suite = dataclasses.replace(suite, args=[*suite.args, ASYNC])
    if kind == "concurrent":
        step = rng.randint(2, suite.steps - 1)
        first = start(suite, run_dir, {"LM_FAULT_PAUSE_AT_STEP": str(step)}, flag)
        if not wait_paused(first, flag, suite.world):
            problems.append("the first run ended before its pause step")
        pid = holder_pid(first, run_dir)
        second = run(suite, run_dir)
        why = refusal(second, f"pid {pid}") if pid else "the lock names no process of the first run"
        problems += [f"second run: {why}"] if why else []
        refused = why is None
        kill(first)
        flag.unlink(missing_ok=True)
        notes.append(f"second run while the first was parked in step {step}")
    else:
        notes.append((async_interrupt if kind == "async_kill" else interrupt)(suite, run_dir, rng, flag))
    if kind == "kill+damage":
        notes.append(damage_random_checkpoint(run_dir, rng))
    if kind == "config_change":
        resumable = resumable_state(run_dir)
        changed = run(suite, run_dir, suite.changed)
        why = refusal(changed, suite.changed_names)
        if why and changed.returncode == 0 and not resumable:
            why = None  # killed before any checkpoint: nothing to resume, a fresh run with the new config is fine
            notes.append("no checkpoint yet: the changed config started fresh")
            shutil.rmtree(run_dir)  # forget it: it holds no resumable state of the original
        else:
            refused = why is None
        problems += [f"resume with {suite.changed}: {why}"] if why else []
    final = run(suite, run_dir)
    if final.returncode != 0:
        why = refusal(final, "damaged")
        if kind == "kill+damage" and why is None:
            # no intact checkpoint left: a clear stop is the right answer; follow its advice (move the
            # checkpoints away), and the same command must then give the reference results from scratch
            refused = True
            notes.append(f"rerun refused: {message(final).splitlines()[0][:120]}...")
            for ckpts in checkpoint_dirs(run_dir):
                if any(damage(c) for c in ckpts.glob("step_*")):
                    ckpts.rename(ckpts.with_name("checkpoints.moved"))
            final = run(suite, run_dir)
        else:
            problems.append(f"rerun failed: {(final.stdout + final.stderr)[-400:]}")
    if final.returncode == 0:
        problems += [why for why in [same_result(suite, run_dir)] if why]
    elif not problems:
        problems.append(f"rerun failed: {(final.stdout + final.stderr)[-400:]}")
    problems += [why for why in [latest_damage(run_dir)] if why]
    outcome = "silent_corruption" if problems else ("clear_refusal" if refused else "exact_resume")
    return {"kind": suite.kind(kind), "outcome": outcome, "notes": notes, "problems": problems}


def elastic_suite(world: int, engine: str, first_world: int) -> Suite:
    """lm train on `world` ranks of `engine` with the first layout's command (its grad_accum: lm keeps the
    global batch by adjusting it)."""
    args = [*ELASTIC_BASE, f"train.grad_accum={ELASTIC_GLOBAL // first_world}", f"engine={engine}"]
    return Suite("elastic", world, "train", args, CHANGED, "ffn")


def elastic_trial(kind: str, run_dir: Path, rng: random.Random, reference_losses: dict[int, float]) -> dict:
    """SIGKILL on the first layout inside a random step after the first checkpoint, then the same command on the
    second layout: the losses of all STEPS must equal the uninterrupted single-process run's, or the resume is
    refused in one line naming the fix and the checkpoint still resumes exactly on the first layout."""
    (w1, e1), (w2, e2), must_name = ELASTIC_LAYOUTS[kind]
    first, second = elastic_suite(w1, e1, w1), elastic_suite(w2, e2, w1)
    first.reference = second.reference = reference_losses
    flag = run_dir.parent / f"{run_dir.name}.paused"
    step = rng.randint(6, STEPS - 1)
    proc = start(first, run_dir, {"LM_FAULT_PAUSE_AT_STEP": str(step)}, flag)
    notes = [f"{e1} on {w1} killed inside step {step}" + ("" if wait_paused(proc, flag, w1) else " (never reached)")]
    kill(proc)
    flag.unlink(missing_ok=True)
    problems: list[str] = []
    resumed = run(second, run_dir)
    if must_name is None:
        if resumed.returncode != 0:
            problems.append(f"resume as {e2} on {w2} failed: {(resumed.stdout + resumed.stderr)[-400:]}")
        else:
            notes.append(f"resumed as {e2} on {w2}")
            problems += [why for why in [exact(run_dir, reference_losses)] if why]
        problems += [why for why in [latest_damage(run_dir)] if why]
        outcome = "silent_corruption" if problems else "exact_resume"
        return {"kind": f"elastic:{kind}", "outcome": outcome, "notes": notes, "problems": problems}
    why = refusal(resumed, must_name)
    problems += [f"{e2} on {w2}: {why}"] if why else []
    notes.append(f"{e2} on {w2} refused: {message(resumed)[:160]}")
    result = finish(first, run_dir, kind, notes, problems, refused=True)
    return {**result, "kind": f"elastic:{kind}"}


def table(summary: dict) -> str:
    rows = [
        "| fault kind | trials | exact resumes | clear refusals | silent corruptions | skipped |",
        "|---|---|---|---|---|---|",
    ]
    for kind, c in [*summary["by_kind"].items(), ("**all**", summary["total"])]:
        rows.append(
            f"| {kind} | {c['trials']} | {c['exact_resume']} | {c['clear_refusal']} | "
            f"{c['silent_corruption']} | {c['skipped']} |"
        )
    return "\n".join(rows) + "\n"


def summarize(results: list[dict], outside_touched: bool) -> dict:
    def counts(rs):
        return {
            "trials": len(rs),
            **{
                o: sum(r["outcome"] == o for r in rs)
                for o in ("exact_resume", "clear_refusal", "silent_corruption", "skipped")
            },
        }

    by_kind = {k: counts([r for r in results if r["kind"] == k]) for k in dict.fromkeys(r["kind"] for r in results)}
    return {"by_kind": by_kind, "total": counts(results), "outside_run_dir_touched": outside_touched, "trials": results}


def outside_state(out: Path) -> list:
    """Name, mtime and bytes of every file in `out` that belongs to no run (the sentinel and anything else)."""
    return [
        (p.name, p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else None)
        for p in sorted(out.iterdir())
        if not p.name.startswith(
            ("trial_", "reference", "fault_injection.", "ddp_", "zero2_", "fsdp2_", "finetune_", "elastic_")
        )
    ]


def reference(suite: Suite, run_dir: Path) -> None:
    """The uninterrupted job: its losses, number of steps and checkpoints, and wall time."""
    t0 = time.time()
    proc = run(suite, run_dir)
    if proc.returncode != 0:
        sys.exit(f"the {suite.name or 'single'} reference run failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    suite.seconds, suite.ref_dir = time.time() - t0, run_dir
    if suite.app == "train":
        suite.reference = losses(run_dir)
        return
    per_pair = [len(losses(p)) for p in pairs(run_dir)]
    suite.steps, suite.saves = sum(per_pair), 2 * len(per_pair)  # a checkpoint at each of the 2 epoch ends


def finetune_suite(init: Path) -> Suite:
    """Tiny lm finetune task=glue/all: 48 train examples per task, 2 epochs of 3 steps, rte with 2 seeds."""
    per_task = [f"tasks.{t}.{k}" for t in GLUE_TASKS for k in ("epochs=2", "batch_size=16", "max_len=32", "seeds=[0]")]
    per_task[per_task.index("tasks.rte.seeds=[0]")] = "tasks.rte.seeds=[0,1]"
    args = [
        "task=glue/all",
        f"init={init}",
        "skip_missing=true",
        "hf=false",
        "glue.max_train_examples=48",
        "train.log_interval=1",
        "train.threads=1",
        "train.progress=false",
        *per_task,
    ]
    return Suite("finetune", 1, "finetune", args, FINETUNE_CHANGED, "optim.weight_decay")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=len(KINDS), help="single-process lm train trials")
    p.add_argument("--ddp-trials", type=int, default=0, help=f"2-rank DDP trials (of {len(DDP_KINDS)})")
    p.add_argument("--zero2-trials", type=int, default=0, help=f"2-rank ZeRO-2 trials (of {len(ZERO2_KINDS)})")
    p.add_argument("--fsdp2-trials", type=int, default=0, help=f"2-rank FSDP2 trials (of {len(FSDP2_KINDS)})")
    p.add_argument("--finetune-trials", type=int, default=0, help=f"lm finetune trials (of {len(FINETUNE_KINDS)})")
    p.add_argument(
        "--elastic-trials",
        type=int,
        default=0,
        help=f"world-size/engine changes on resume (of {', '.join(ELASTIC_KINDS)}, in turn)",
    )
    p.add_argument(
        "--kinds",
        default="",
        help=f"comma-separated: keep only these kinds of the single-process mix (of {', '.join(dict.fromkeys(KINDS))})",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    unknown = set(args.kinds.split(",")) - set(KINDS) if args.kinds else set()
    if unknown:
        p.error(f"--kinds: unknown {sorted(unknown)}; the kinds: {', '.join(dict.fromkeys(KINDS))}")
    kinds = [k for k in KINDS if k in args.kinds.split(",")] if args.kinds else KINDS
    if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        p.error(  # its trials would resume an earlier call's runs there, and judge them as this call's
            f"--out {args.out} is not a new or empty directory: the trials would resume the runs an earlier call "
            f"left there and judge them as this call's; name a new directory"
        )
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    sentinel = args.out / "sentinel.txt"  # a user file next to every run dir: must stay as it is
    sentinel.write_text("user data, not the run's\n")
    before = outside_state(args.out)

    single = Suite("", 1, "train", BASE, CHANGED, "ffn")
    if args.trials or args.ddp_trials or args.zero2_trials or args.fsdp2_trials or args.finetune_trials:
        reference(single, args.out / "reference")  # also the init of the finetuning suite
    plan = [(single, "trial", mix(args.trials, kinds))] if args.trials else []
    for name, n, kinds in (
        ("ddp", args.ddp_trials, DDP_KINDS),
        ("zero2", args.zero2_trials, ZERO2_KINDS),
        ("fsdp2", args.fsdp2_trials, FSDP2_KINDS),
    ):
        if n:
            plan.append((Suite(name, 2, "train", [*BASE, f"engine={name}"], CHANGED, "ffn"), name, mix(n, kinds)))
    if args.finetune_trials:
        plan.append((finetune_suite(args.out / "reference"), "finetune", mix(args.finetune_trials, FINETUNE_KINDS)))
    results = []
    for suite, prefix, kinds in plan:
        if suite is not single:
            reference(suite, args.out / f"{prefix}_reference")
        for i, kind in enumerate(kinds):
            r = trial(suite, kind, args.out / f"{prefix}_{i:02d}", rng)
            print(
                f"{prefix} {i:2d} {r['kind']:22s} {r['outcome']:18s} {'; '.join(r['notes'] + r['problems'])}",
                flush=True,
            )
            results.append(r)
    if args.elastic_trials:
        ref = Suite(
            "elastic",
            1,
            "train",
            [*ELASTIC_BASE, f"train.grad_accum={ELASTIC_GLOBAL}", "engine=single"],
            CHANGED,
            "ffn",
        )
        reference(ref, args.out / "elastic_reference")
        for i in range(args.elastic_trials):
            r = elastic_trial(ELASTIC_KINDS[i % len(ELASTIC_KINDS)], args.out / f"elastic_{i:02d}", rng, ref.reference)
            print(
                f"elastic {i:2d} {r['kind']:22s} {r['outcome']:18s} {'; '.join(r['notes'] + r['problems'])}", flush=True
            )
            results.append(r)
    outside = outside_state(args.out) != before
    summary = summarize(results, outside)
    (args.out / "fault_injection.json").write_text(json.dumps(summary, indent=2) + "\n")
    (args.out / "fault_injection.md").write_text(table(summary))
    print(table(summary) + f"files outside the run dirs touched: {outside}")
    return 1 if summary["total"]["silent_corruption"] or outside else 0


if __name__ == "__main__":
    sys.exit(main())
