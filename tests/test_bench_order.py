"""Benchmarks that time two arms (or more) alternate which runs first, so a drift of the machine (heat, caches, other
load) does not always land on the same arm. Nothing is timed here: stand-ins for each arm record the order."""

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.benchmark_scripts import BENCHMARKS, load


def _fake_tree(root: Path) -> Path:
    """A checkout's stand-in: `python -m lm train` and benchmarks/hf_step.py that only print a line."""
    (root / "lm").mkdir(parents=True)
    (root / "lm" / "__main__.py").write_text("print('step 1100: val_loss 1.5')\n")
    (root / "benchmarks").mkdir()
    (root / "benchmarks" / "hf_step.py").write_text("import sys\nprint(' '.join(sys.argv[1:5]))\n")
    return root


def _ab_trees(tmp_path: Path, *args: str, nanogpt: str = "1") -> str:
    peers, data = tmp_path / "peers", tmp_path / "data"
    prep = peers / "nanogpt" / "data" / "shakespeare_char"
    prep.mkdir(parents=True)
    (prep / "prepare.py").write_text("")
    (peers / "nanogpt" / "train.py").write_text("print('step 2000: train loss 1.0, val loss 1.6')\n")
    (data / "text" / "tinyshakespeare").mkdir(parents=True)
    (data / "text" / "tinyshakespeare" / "input.txt").write_text("text\n")
    old, new = _fake_tree(tmp_path / "old"), _fake_tree(tmp_path / "new")
    env = {**os.environ, "LM_PEERS": str(peers), "LM_DATA_MIRROR": str(data), "NANOGPT": nanogpt}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # `python` is this venv's
    cmd = ["bash", str(BENCHMARKS / "ab_trees.sh"), args[0], str(old), str(new), *args[1:]]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout


def test_ab_trees_speedrun_alternates_the_arms_round_by_round(tmp_path):
    out = _ab_trees(tmp_path, "speedrun", "3")
    arms = re.findall(r"^  (nanoGPT|lm-old|lm-new) wall", out, re.M)
    assert arms == ["nanoGPT", "lm-old", "lm-new", "lm-new", "lm-old", "nanoGPT", "nanoGPT", "lm-old", "lm-new"]
    assert "val_loss 1.5" in out and "val loss 1.6" in out  # each arm's last loss still read from its log
    out = _ab_trees(tmp_path / "two", "speedrun", "2", nanogpt="0")
    assert re.findall(r"^  (nanoGPT|lm-old|lm-new) wall", out, re.M) == ["lm-old", "lm-new", "lm-new", "lm-old"]


def test_ab_trees_hf_step_alternates_which_tree_runs_first(tmp_path):
    lines = _ab_trees(tmp_path, "hf_step", "4").splitlines()
    assert lines == [
        "old --layout gpt2 --vocab 65",
        "new --layout gpt2 --vocab 65",
        "new --layout gpt2 --vocab 50304",
        "old --layout gpt2 --vocab 50304",
        "old --layout llama --vocab 65",
        "new --layout llama --vocab 65",
        "new --layout llama --vocab 50304",
        "old --layout llama --vocab 50304",
    ]


def test_output_layer_reverses_the_variants_order_every_other_round(monkeypatch):
    output_layer = load("output_layer")
    order = []
    fns = {k: (lambda k=k: order.append(k)) for k in ("plain", "matmuls", "chunked")}
    monkeypatch.setattr(output_layer, "variants", lambda *a: fns)
    output_layer.main(["--tokens", "4", "--dim", "2", "--vocab", "3", "--rounds", "3"])
    assert order[3:] == ["plain", "matmuls", "chunked", "chunked", "matmuls", "plain", "plain", "matmuls", "chunked"]


def test_kernel_floor_alternates_the_step_and_its_kernels(monkeypatch):
    kernel_floor = load("kernel_floor")
    order = []
    monkeypatch.setattr(kernel_floor.bench, "train_step", lambda *a: order.append("step"))
    monkeypatch.setattr(kernel_floor, "floor_step", lambda *a: lambda: order.append("floor"))
    tiny = ["--layers", "1", "--dim", "16", "--heads", "2", "--seq", "8", "--batch", "1", "--warmup", "1"]
    kernel_floor.main([*tiny, "--threads", "1", "--steps", "4"])
    assert order == ["step", "floor"] + ["step", "floor", "floor", "step"] * 2  # after the warm-up pair


def test_async_save_alternates_which_kind_saves_first_after_an_untimed_save_of_each(monkeypatch, tmp_path):
    import lm.core.checkpoint

    async_save = load("async_save")
    order = []

    class Checkpointer:
        def __init__(self, path, engine, keep_last, asynchronous=False):
            self.kind = "async" if asynchronous else "sync"

        def save(self, trainer, extra):
            order.append((self.kind, trainer["step"]))

        def wait(self):
            pass

    monkeypatch.setattr(lm.core.checkpoint, "Checkpointer", Checkpointer)
    medians, times = async_save.measure(None, tmp_path, 3)
    assert order == [("sync", 1), ("async", 1), ("sync", 2), ("async", 2), ("async", 3), ("sync", 3)] + [
        ("sync", 4),
        ("async", 4),
    ]
    assert {k: len(v) for k, v in times.items()} == {"sync_s": 3, "async_blocked_s": 3, "async_write_s": 3}
