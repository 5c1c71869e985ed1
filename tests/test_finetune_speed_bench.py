"""benchmarks/finetune_speed.py on a one-layer model: a variant's steps/s from its metrics, and the profiled step."""

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "finetune_speed.py"


def run(*args, out):
    cmd = [sys.executable, str(BENCH), "--out", str(out), "--dim", "16", "--heads", "2", "--layers", "1", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_a_variant_is_timed_and_a_step_profiled(tmp_path):
    r = run("--variants", "fp32", "--steps", "30", "--interval", "5", "--profile", "--profile-steps", "5", out=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    rate = re.search(r"^fp32 +([\d.]+) steps/s", r.stdout, re.M)
    assert rate and float(rate.group(1)) > 0, r.stdout
    step = re.search(r"per step: host wall ([\d.]+) ms, (\d+) aten operators", r.stdout)
    assert step and float(step.group(1)) > 0 and int(step.group(2)) > 100, r.stdout  # a step's forward, backward, AdamW
    assert "aten::" in r.stdout.split("host time by operator")[1]


def test_refusals(tmp_path):
    r = run("--variants", "fp32,bogus", out=tmp_path)
    assert r.returncode != 0 and "--variants: bogus not among" in r.stderr
    r = run("--steps", "20", "--profile", out=tmp_path)
    assert r.returncode != 0 and "--steps must be at least" in r.stderr
