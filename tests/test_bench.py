"""benchmarks/hf_step.py: our model and Hugging Face's in one process, same weights, same batches, same optimizer.

No timing is asserted (speed is measured by running benchmarks/hf_step.py, see docs/results.md); these tests check
that the two sides of the comparison are the same model doing the same work.
"""

import json
import os

import pytest

from tests.benchmark_scripts import load

bench = load("hf_step")

TINY = [
    "--layers",
    "2",
    "--dim",
    "32",
    "--heads",
    "4",
    "--seq",
    "16",
    "--batch",
    "2",
    "--threads",
    "1",
    "--steps",
    "2",
    "--warmup",
    "1",
]


@pytest.mark.parametrize("layout", ["gpt2", "llama"])
@pytest.mark.parametrize("vocab", [65, 9000])  # 9000 >= 8192: our chunked output layer + loss
def test_same_model_same_loss(layout, vocab):
    r = bench.run(bench.parse(TINY + ["--layout", layout, "--vocab", str(vocab)]))
    assert r["params_ours"] == r["params_hf"]
    assert r["loss_chunk"] == (256 if vocab >= 8192 else 0)
    # Same weights, same T-1 targets: the first-step losses agree to float rounding, near ln(V) at init.
    assert r["first_loss_ours"] == pytest.approx(r["first_loss_hf"], abs=2e-4)
    assert r["first_loss_ours"] == pytest.approx(__import__("math").log(vocab), abs=0.3)
    assert r["tokens_per_s_ours"] > 0 and r["tokens_per_s_hf"] > 0 and r["ratio"] > 0


def test_llama_gqa_parameter_counts_match():
    r = bench.run(bench.parse(TINY + ["--layout", "llama", "--vocab", "65", "--kv-heads", "2"]))
    assert r["params_ours"] == r["params_hf"]
    assert r["first_loss_ours"] == pytest.approx(r["first_loss_hf"], abs=2e-4)


def test_onednn_linear_option_gives_the_same_first_loss():
    r = bench.run(bench.parse(TINY + ["--layout", "llama", "--vocab", "65", "--linear", "onednn"]))
    assert r["linear"] == "onednn"
    assert r["first_loss_ours"] == pytest.approx(r["first_loss_hf"], abs=2e-4)


def test_json_line_and_explicit_chunk(capsys):
    bench.main(TINY + ["--vocab", "65", "--loss-chunk", "8", "--json"])
    r = json.loads(capsys.readouterr().out)
    assert r["loss_chunk"] == 8 and r["layout"] == "gpt2" and r["steps"] == 2
    assert set(r) >= {"tokens_per_s_ours", "tokens_per_s_hf", "ratio", "cpu_ratio", "loadavg", "machine", "date"}


@pytest.mark.slow
def test_compiled_sides_run_through_the_loop(capsys):
    """--compile both: ours through lm's engine with train.compile, theirs torch.compile'd, both timed."""
    bench.main(TINY + ["--vocab", "65", "--compile", "both", "--json"])
    r = json.loads(capsys.readouterr().out)
    assert r["compile"] == "both" and r["tokens_per_s_ours"] > 0 and r["tokens_per_s_hf"] > 0


@pytest.mark.parametrize(
    "bad, message",
    [(["--loss-chunk", "big"], "--loss-chunk"), (["--steps", "0"], "--steps"), (["--compile", "yes"], "--compile")],
)
def test_bad_arguments_name_the_flag(bad, message, capsys):
    with pytest.raises(SystemExit):
        bench.parse(bad)
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("layout", ["gpt2", "llama"])
def test_kernel_floor_replays_every_matmul_of_the_hf_model(layout, capsys):
    """benchmarks/kernel_floor.py: its replay covers each weight matrix once (the tied LM head too)."""
    kernel_floor = load("kernel_floor")
    args = bench.parse(TINY + ["--layout", layout, "--vocab", "65"])
    hf = bench.build(args)["hf"]
    shapes = kernel_floor.linear_shapes(hf)
    # Llama: q, k, v, o, gate, up, down per layer + head; GPT-2: c_attn, c_proj, c_fc, mlp c_proj + head.
    assert len(shapes) == args.layers * (7 if layout == "llama" else 4) + 1
    matrix_params = sum(p.numel() for n, p in hf.named_parameters() if p.dim() == 2 and "wpe" not in n)
    embedding_counted_once = 0 if layout == "gpt2" else 65 * args.dim  # GPT-2 ties wte to the head
    assert sum(i * o for i, o, _, _ in shapes) == matrix_params - embedding_counted_once
    kernel_floor.main(TINY[:-4] + ["--layout", layout, "--vocab", "65", "--steps", "1"])
    out = capsys.readouterr().out
    assert "floor fraction" in out and "ceiling" in out


def test_gpu_mfu_times_each_batch_from_one_model_on_cpu():
    """benchmarks/gpu_mfu.py's measuring path runs (CPU, tiny, eager): one row per batch, FLOPs from lm.model.flops."""
    from lm.model.config import model_preset
    from lm.model.flops import flops_per_token

    gpu_mfu = load("gpu_mfu")
    overrides = ["model.n_layers=1", "model.dim=32", "model.n_heads=2", "model.vocab_size=64"]
    rows = gpu_mfu.measure("tiny", 16, [2, 3], 2, False, overrides, device="cpu")
    assert [r["batch"] for r in rows] == [2, 3]
    expected = flops_per_token(model_preset("tiny", ["model.max_seq_len=16", "model.dropout=0.0", *overrides]), 16)
    assert all(r["flops_per_token"] == expected and r["tokens_per_s"] > 0 and r["mfu"] is None for r in rows)


def test_gpu_mfu_also_tries_twice_the_eager_batch_when_compiled(monkeypatch):
    """0 = the largest eager batch, then twice it as an optional compiled try (GPU only), then the fixed ones."""
    gpu_mfu = load("gpu_mfu")
    monkeypatch.setattr(gpu_mfu, "largest_batch", lambda *a, **k: 8)
    assert gpu_mfu.plan_batches([0, 12], None, None, 1024, "cuda", True) == [(8, False), (16, True), (12, False)]
    assert gpu_mfu.plan_batches([0, 12], None, None, 1024, "cuda", False) == [(8, False), (12, False)]
    assert gpu_mfu.plan_batches([0], None, None, 1024, "cpu", True) == [(8, False)]


def test_gpu_mfu_inductor_settings_apply_and_are_recorded(monkeypatch):
    """--inductor KEY=VALUE sets torch._inductor.config (bad keys are refused); rows carry the settings."""
    import torch._inductor.config as inductor

    gpu_mfu = load("gpu_mfu")
    monkeypatch.setattr(inductor, "coordinate_descent_tuning", False)
    assert gpu_mfu.apply_inductor_config(["coordinate_descent_tuning=True"]) == {
        "inductor.coordinate_descent_tuning": True
    }
    assert inductor.coordinate_descent_tuning is True
    with pytest.raises(SystemExit, match="no_such_field"):
        gpu_mfu.apply_inductor_config(["no_such_field=1"])
    overrides = ["model.n_layers=1", "model.dim=32", "model.n_heads=2"]
    first, again = (
        gpu_mfu.measure("tiny", 16, [2], 2, False, overrides, device="cpu", tags={"tag": 1})[0] for _ in range(2)
    )
    assert first["tag"] == 1
    assert first["loss"] == again["loss"]  # seed 0: the same weights and tokens, the same loss


def test_both_speed_benchmarks_time_lm_loop_and_engine_through_the_harness(monkeypatch):
    """hf_step.py and gpu_mfu.py time what users run: each measurement is one Session's loop (lm/core/session.py)."""
    from lm.core import session

    runs, real = [], session.Session.train

    def train(self, lr_at, *rest):
        runs.append(type(self.engine).__name__)
        return real(self, lr_at, *rest)

    monkeypatch.setattr(session.Session, "train", train)
    r = bench.run(bench.parse(TINY + ["--vocab", "65"]))
    assert runs == ["Engine"] and r["tokens_per_s_ours"] > 0
    rows = load("gpu_mfu").measure("tiny", 16, [2, 3], 2, False, ["model.n_layers=1", "model.dim=32"], device="cpu")
    assert runs == ["Engine"] * 3 and len(rows) == 2


def test_cpu_kernel_pairs_do_the_same_maths_on_each_side():
    """benchmarks/cpu_kernels.py times lm's form against the old one: each side must compute the same thing."""
    import torch

    kernels = load("cpu_kernels")
    rope = kernels.rope_pair(batch=2, heads=2, seq=8, head_dim=8)  # asserts equal rotations itself
    glu = kernels.glu_pair(tokens=16, dim=8, hidden=12)  # asserts equal outputs itself
    split = kernels.SplitGLU(8, 12)
    x = torch.randn(4, 8)
    torch.testing.assert_close(kernels.FusedGLU(split)(x), split(x))
    times = kernels.alternate({**rope, "glu": glu["lm"]}, rounds=2, calls=1)
    assert set(times) == {"lm", "old", "glu"} and all(t > 0 for t in times.values())


def test_recipe_step_pairs_see_the_same_batch():
    """benchmarks/recipe_step.py: both sides of each pair time the same tokens (the encoders the same masks)."""
    import argparse

    import torch

    recipe = load("recipe_step")
    runs = recipe.build_runs(list(recipe.PAIRS), argparse.Namespace(batch=2, seq=16))
    for a, b in (("decoder fp32", "decoder bf16 autocast"), ("encoder dense MLM head", "encoder sparse prediction")):
        assert torch.equal(runs[a][2], runs[b][2]) and torch.equal(runs[a][3], runs[b][3])


@pytest.mark.slow  # two tiny rounds of both loops on the GPT-2-layout model (~10 s)
def test_engine_bench_overhead_runs_as_results_md_cites_it(capsys):
    """The command docs/results.md cites failed at once: ensure_prepared was given Hydra's DictConfig (TypeError);
    one round each way in either order, and the table's ratio is lm train's tokens/s over the bare loop's."""
    bench = load("engine_bench")
    bench.main(["overhead", "--steps", "4", "--rounds", "2", "--threads", "1"])
    row = capsys.readouterr().out.strip().splitlines()[-2]  # | bare tok/s | lm tok/s | ratio |
    bare, ours, ratio = (float(c.split()[0]) for c in row.strip("|").split("|"))
    assert bare > 0 and ours > 0 and ratio == pytest.approx(ours / bare, abs=1e-3)


def test_arch_step_speed_builds_the_zoo_rows_it_names():
    """benchmarks/arch_step_speed.py (cited by docs/results.md) stopped at its first zoo row: it built model/block=pkm
    without importing lm.zoo, whose options register on import (ConfigError)."""
    import subprocess
    import sys

    from tests.benchmark_scripts import BENCHMARKS

    args = ["--dim", "32", "--layers", "2", "--heads", "2", "--batch", "2", "--seq", "16", "--steps", "1"]
    out = subprocess.run(
        [sys.executable, str(BENCHMARKS / "arch_step_speed.py"), *args, "--rounds", "1", "--only", "vanilla,pkm"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {
        line.split()[0]: line.split() for line in out.stdout.splitlines() if line.split()[:1] in (["vanilla"], ["pkm"])
    }
    assert rows["vanilla"][-1] == "1.000" and float(rows["pkm"][-1]) > 0


@pytest.mark.slow  # a 0.5 MB corpus through every part (~10 s)
def test_data_bench_builds_its_corpus_from_the_mirrors_plain_text(tmp_path, data_mirror):
    """benchmarks/data_bench.py (cited by docs/results.md) read the mirror's compressed Gutenberg shards as text
    (UnicodeDecodeError at byte 0xb5) since they joined text/; its corpus is the plain-text files only."""
    import subprocess
    import sys

    from tests.benchmark_scripts import BENCHMARKS

    args = ["--mb", "0.5", "--small-mb", "0.2", "--vocab-size", "600", "--rounds", "1", "--loader-seconds", "1"]
    out = subprocess.run(
        [sys.executable, str(BENCHMARKS / "data_bench.py"), *args, "--skip-gpt2", "--work", str(tmp_path / "w")]
        + ["--json", str(tmp_path / "bench.json")],
        capture_output=True,
        text=True,
        env={**os.environ, "LM_DATA_MIRROR": str(data_mirror)},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["corpus_mb"] >= 0.5 and result["tokenization"] and result["loader"] and result["memory"]
    assert "gutenberg" not in result["sources"] and "tinyshakespeare" in result["sources"]
