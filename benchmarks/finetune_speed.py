"""Finetuning speed: lm finetune's steps per second under the settings that change its step, and where one
step's time goes. The GPU recipe's finetuning (the 29M encoder at batch 32) runs far below what the device can
do; this says whether the host (Python, kernel launches) or the device is the bound, before anything is changed.

Each variant is one `lm finetune` process from scratch (init=none: the speed does not depend on the weights) on
one GLUE task, seed 0, one epoch of `--steps` steps; its steps/s is the median of its logged intervals after the
first (compilation and warm-up). `--concurrent N` runs N copies of each variant at once (what lanes sharing one
GPU get each). `--profile` runs the first variant once more under torch.profiler and prints, per step: the
host's wall time, the device's busy time (kernels), the kernel launches (CUDA) or operators (CPU), and the
operators that cost the host most.

    python benchmarks/finetune_speed.py --out /tmp/fs                                  # the GPU recipe's model
    python benchmarks/finetune_speed.py --out /tmp/fs --dim 32 --heads 4 --variants fp32 --steps 100 --profile

On the device (benchmarks/gpu_transfer_data.sh and gpu_devsite.sh made .gpu_data and .devsite):

    export PYTHONPATH=$PWD/.devsite:$PWD LM_DATA_MIRROR=$PWD/.gpu_data
    python benchmarks/finetune_speed.py --out $OUT/fs --variants fp32,bf16,compile32,graphs --profile

(fp32 first: lm finetune's default precision, TF32 off as torch's default, in which the GPU recipe's table of
2026-11-29 was finetuned; lm transfer's budget now finetunes in train.precision=auto, bf16 on a GPU.)

Needs $LM_DATA_MIRROR (glue_data, text/wikitext-2-raw: the tokenizer is trained on it in a second).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = {  # name: lm finetune overrides
    "fp32": ["train.precision=fp32"],
    "bf16": ["train.precision=bf16"],
    "compile": ["train.precision=bf16", "train.compile=true"],
    "compile32": ["train.precision=bf16", "train.compile=true", "glue.pad_to_multiple_of=32"],  # 4 lengths at most
    # CUDA graphs: a step's kernels replayed from one launch; one graph per shape, hence the rounded lengths
    "graphs": [
        "train.precision=bf16",
        "train.compile=true",
        "train.compile_mode=reduce_overhead",
        "glue.pad_to_multiple_of=32",
    ],
}
WARM = 20  # steps before the profiled ones
PAIRS = {"sst2": [], "cola": [], "stsb": ["tasks.stsb.pair_input=siamese"], "mrpc": ["tasks.mrpc.pair_input=siamese"]}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="work directory (tokenizer, one run per variant)")
    p.add_argument("--task", default="sst2", choices=sorted(PAIRS), help="MRPC and STS-B read as siamese pairs")
    p.add_argument("--variants", default="fp32,bf16,compile", help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--interval", type=int, default=50, help="steps per logged interval")
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--concurrent", type=int, default=1, help="copies of each variant run at once")
    p.add_argument("--profile", action="store_true", help="profile the first variant (after the timed runs)")
    p.add_argument("--profile-steps", type=int, default=30)
    return p.parse_args(argv)


def tokenizer(out: Path) -> Path:
    tok = out / "tokenizer"
    if not (tok / "tokenizer.json").is_file():
        text = Path(os.environ["LM_DATA_MIRROR"]) / "text" / "wikitext-2-raw" / "wiki.valid.raw"  # in .gpu_data too
        cmd = ["prepare", str(text), "--vocab-size", "8192", "--out", str(tok), "--no-progress", "--force"]
        subprocess.run([sys.executable, "-m", "lm", *cmd], check=True, stdout=subprocess.DEVNULL)
    return tok


def overrides(args, variant: str, run_dir: Path) -> list[str]:
    t = args.task
    model = [f"model.dim={args.dim}", f"model.n_layers={args.layers}", f"model.n_heads={args.heads}"]
    return [
        f"task=glue/{t}", "init=none", f"tokenizer={tokenizer(args.out)}", "model=tiny", "model.arch=encoder",
        "model/pos=rope", "model.vocab_size=8192", "model.max_seq_len=128", *model, *PAIRS[t], *VARIANTS[variant],
        f"tasks.{t}.seeds=[0]", f"tasks.{t}.epochs=1", f"tasks.{t}.batch_size={args.batch}",
        f"train.micro_batch_size={args.batch}", f"glue.max_train_examples={args.steps * args.batch}",
        f"train.log_interval={args.interval}", "predict_test=false", "hf=false", "resume=false",
        f"run_dir={run_dir}",
    ]  # fmt: skip


def timed(args, variant: str) -> list[dict]:
    """The variant's `--concurrent` processes at once: each one's median steps/s after its first interval."""
    runs, procs = [args.out / f"{variant}_{i}" for i in range(args.concurrent)], []
    for run in runs:
        log = open(run.with_suffix(".log"), "w")  # noqa: SIM115 - closed when the process ends
        procs.append((subprocess.Popen([sys.executable, "-m", "lm", "finetune", *overrides(args, variant, run)],
                                       stdout=log, stderr=subprocess.STDOUT), log, time.perf_counter()))  # fmt: skip
    out = []
    for run, (proc, log, t0) in zip(runs, procs):
        if proc.wait():
            sys.exit(f"{variant}: lm finetune failed (exit {proc.returncode}); see {log.name}")
        log.close()
        wall = time.perf_counter() - t0
        records = [json.loads(line) for line in (run / args.task / "seed0" / "metrics.jsonl").open()]
        rates = [r["steps_per_s"] for r in records if "steps_per_s" in r]  # (the dev scores' records have none)
        out.append({"variant": variant, "steps_per_s": statistics.median(rates[1:] or rates), "wall_s": wall})
    return out


def profiled(argv: list[str], active: int) -> None:
    """lm finetune in this process under torch.profiler: `active` steps after WARM of warm-up."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    import lm.core.loop as loop
    from lm.cli.main import main

    cuda = torch.cuda.is_available()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    starts: list[float] = []
    report: dict = {}

    def ready(p) -> None:
        report["events"] = p.key_averages()

    prof = profile(activities=acts, schedule=schedule(wait=WARM - 5, warmup=5, active=active), on_trace_ready=ready)
    step = loop.train_step

    def counted(*a, **k):  # the loop calls its module's train_step once per step
        starts.append(time.perf_counter())
        out = step(*a, **k)
        prof.step()
        return out

    loop.train_step = counted
    sys.argv = ["lm", "finetune", *argv]
    log = Path(argv[-1].removeprefix("run_dir=")).with_suffix(".log")
    with prof, log.open("w") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        try:
            main()
        except SystemExit as e:
            if e.code:
                raise SystemExit(f"lm finetune failed (exit {e.code}); see {log}") from None
    walls = [b - a for a, b in zip(starts[WARM : WARM + active], starts[WARM + 1 : WARM + 1 + active])]
    summarize(report["events"], active, statistics.median(walls), cuda)


def summarize(events, active: int, wall: float, cuda: bool) -> None:
    kernels = [e for e in events if e.device_type.name == "CUDA"]
    launches = sum(e.count for e in events if "LaunchKernel" in e.key)
    ops = sum(e.count for e in events if e.key.startswith("aten::") and e.device_type.name == "CPU")
    busy_ms = sum(e.self_device_time_total for e in kernels) / 1e3 / active
    print(f"per step: host wall {wall * 1e3:.2f} ms", end="")
    print(f", device busy {busy_ms:.2f} ms, {launches / active:.0f} kernel launches" if cuda else "", end="")
    print(f", {ops / active:.0f} aten operators (nested ones counted too)")
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:12]
    print("host time by operator (self, per step):")
    for e in top:
        print(f"  {e.self_cpu_time_total / 1e3 / active:8.3f} ms  {e.count / active:6.1f}x  {e.key}")


def main() -> None:
    if sys.argv[1:2] == ["--inner-profile"]:
        return profiled(sys.argv[3:], int(sys.argv[2]))
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    names = args.variants.split(",")
    if unknown := [n for n in names if n not in VARIANTS]:
        sys.exit(f"--variants: {', '.join(unknown)} not among {', '.join(VARIANTS)}")
    if args.profile and args.steps < WARM + args.profile_steps + 1:
        sys.exit(
            f"--profile: --steps must be at least {WARM + args.profile_steps + 1} ({WARM} warm, the profiled ones)"
        )
    print(f"{args.task}, batch {args.batch}, {args.layers} x {args.dim}, {args.steps} steps, {args.concurrent} at once")
    for name in names:
        for r in timed(args, name):
            print(f"{r['variant']:8s} {r['steps_per_s']:8.2f} steps/s   (process wall {r['wall_s']:.1f} s)")
    if args.profile:
        run = args.out / f"{names[0]}_profile"
        argv = ["--inner-profile", str(args.profile_steps), *overrides(args, names[0], run)]
        subprocess.run([sys.executable, __file__, *argv], check=True)


if __name__ == "__main__":
    main()
