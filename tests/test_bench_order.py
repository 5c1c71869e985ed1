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


def _recorder(order: list, tag_at: int):
    """A timed block's stand-in: records the arm (its positional argument tag_at) and takes 1 s."""
    return lambda *a: order.append(a[tag_at]) or 1.0


def test_ablation_speed_alternates_the_variants_and_the_norms(monkeypatch):
    import torch

    import lm.model.norms

    ablation = load("ablation_speed")
    norm_ops, order = ablation.norm_ops, []
    monkeypatch.setattr(ablation, "make", lambda ffn, norm, args: (torch.nn.Linear(1, 1), f"{ffn}+{norm}"))
    monkeypatch.setattr(ablation, "steps", _recorder(order, 1))  # steps(model, opt=the tag, x, y, n)
    monkeypatch.setattr(ablation, "norm_ops", lambda args: {"LayerNorm": 1.0})
    monkeypatch.setattr("sys.argv", ["ablation_speed.py", "--rounds", "3", "--dim", "4", "--batch", "1", "--seq", "2"])
    ablation.main()
    first = ["gelu+layernorm", "gelu+rmsnorm", "swiglu+layernorm", "swiglu+rmsnorm"]
    assert order[4:] == first + first[::-1] + first  # after the warm-up, in the order of VARIANTS

    class Norm:  # each norm's stand-in records its calls; the identity, so the script's equality check holds
        def __init__(self, dim, name="ln"):
            self.name, self.weight, self.eps = name, None, 0.0

        def __call__(self, h):
            return order.append(self.name) or h * 1

    order.clear()
    monkeypatch.setattr(lm.model.norms, "LayerNorm", Norm)
    monkeypatch.setattr(lm.model.norms, "RMSNorm", lambda dim: Norm(dim, "rms"))
    monkeypatch.setattr(ablation.F, "rms_norm", lambda h, *a: order.append("F") or h * 1)
    norm_ops(ablation.parse_args(), calls=1)
    assert order[2:] == ["ln", "rms", "F", "F", "rms", "ln", "ln", "rms", "F"]  # after the equality check's pair


def test_arch_step_speed_alternates_the_variants(monkeypatch):
    import torch

    arch = load("arch_step_speed")
    order = []
    monkeypatch.setattr(arch, "make", lambda name, args: (torch.nn.Linear(1, 1), name))
    monkeypatch.setattr(arch, "steps", _recorder(order, 1))  # steps(model, opt=the tag, batch, n)
    argv = ["--only", "vanilla,weighted", "--rounds", "3", "--dim", "16", "--layers", "2", "--heads", "2"]
    monkeypatch.setattr("sys.argv", ["arch_step_speed.py", *argv, "--seq", "8", "--batch", "1", "--device", "cpu"])
    arch.main()
    assert order[2:] == ["vanilla", "weighted", "weighted", "vanilla", "vanilla", "weighted"]


def test_recipe_step_alternates_the_sides_of_a_pair(monkeypatch):
    recipe = load("recipe_step")
    order = []
    monkeypatch.setattr(recipe, "build_runs", lambda names, args: {n: (None, n, None, None, False) for n in names})
    monkeypatch.setattr(recipe, "steps", _recorder(order, 1))  # steps(model, opt=the tag, x, y, n, bf16)
    pair = ["decoder fp32", "decoder bf16 autocast"]
    monkeypatch.setattr("sys.argv", ["recipe_step.py", "--only", ",".join(pair), "--rounds", "3"])
    recipe.main()
    assert order[2:] == pair + pair[::-1] + pair


def test_engine_bench_overhead_alternates_the_bare_loop_and_lm_train(monkeypatch):
    import argparse
    from types import SimpleNamespace

    import torch
    from omegaconf import OmegaConf

    import lm.data.prepare

    bench = load("engine_bench")
    order = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # the test process keeps its threads
    monkeypatch.setattr(bench, "compose", lambda overrides: SimpleNamespace(data=OmegaConf.create({})))
    monkeypatch.setattr(lm.data.prepare, "ensure_prepared", lambda data: None)
    monkeypatch.setattr(bench, "bare_tokens_per_s", lambda steps: order.append("bare") or 1.0)
    monkeypatch.setattr(bench, "lm_train_tokens_per_s", lambda steps: order.append("lm") or 1.0)
    bench.overhead(argparse.Namespace(threads=1, rounds=3, steps=4))
    assert order == ["bare", "lm", "lm", "bare", "bare", "lm"]
