"""benchmarks/attention_cost.py at tiny sizes (issue 18, "The cost of attention"): every variant builds
lm's own layer and measures a forward+backward; slopes are fitted on the log-log line; a curve stops
before a point its last two points say would pass the cap. Timings are not asserted (shared machine)."""

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import attention_cost as bench  # noqa: E402


def tiny_args(*extra):
    return bench.parse_args(
        ["--dim", "32", "--heads", "2", "--repeats", "1", "--linformer-k", "16", "--device", "cpu", *extra]
    )


@pytest.mark.parametrize("variant", bench.VARIANTS)
def test_each_variant_measures_one_layer(variant):
    args = tiny_args()
    layer, forward = bench.build_layer(variant, 24, args)
    import torch

    assert forward(torch.randn(1, 24, 32)).shape == (1, 24, 32)
    point = bench.measure_point(variant, 24, args)
    assert point["variant"] == variant and point["T"] == 24 and point["seconds"] > 0 and point["peak_bytes"] >= 0
    assert point["linformer_k"] == (16 if variant == "linformer" else None)
    if variant == "linformer":
        assert layer.score.k == 16 and type(layer.score).__name__ == "Linformer"
    if variant == "lstm":
        assert isinstance(layer, torch.nn.LSTM) and layer.hidden_size == 32


def test_slopes_and_the_stopping_rule():
    quadratic = [{"T": T, "seconds": 1e-6 * T**2, "peak_bytes": 100 * T} for T in (128, 256, 512, 1024)]
    assert math.isclose(bench.fit_slope(quadratic, "seconds"), 2.0, rel_tol=1e-9)
    assert math.isclose(bench.fit_slope(quadratic, "peak_bytes"), 1.0, rel_tol=1e-9)
    # next 2048: 1.048576 s * 2**2 = 4.19 s; memory 102400 * 2 = 204800 bytes
    assert bench.next_over(quadratic, 2048, "seconds", 4.0) and not bench.next_over(quadratic, 2048, "seconds", 4.5)
    assert bench.next_over(quadratic, 2048, "peak_bytes", 204799)
    assert not bench.next_over([], 2048, "seconds", 1e-9)  # the first point always runs


@pytest.mark.slow
def test_the_script_writes_its_table_plot_and_json(tmp_path):
    out = tmp_path / "cost"
    argv = [
        "--tmin",
        "16",
        "--tmax",
        "32",
        "--dim",
        "32",
        "--heads",
        "2",
        "--repeats",
        "1",
        "--linformer-k",
        "16",
        "--device",
        "cpu",
        "--variants",
        "scaled_dot,lstm",
        "--fit-from",
        "16",
        "--out",
        str(out),
    ]
    assert bench.main(argv) == 0
    result = json.loads((out / "attention_cost.json").read_text())
    assert [p["T"] for p in result["curves"]["scaled_dot"]["points"]] == [16, 32]
    assert [p["T"] for p in result["curves"]["lstm"]["points"]] == [16, 32]
    md = (out / "attention_cost.md").read_text()
    assert "| 16 |" in md and "| scaled_dot |" in md and "Command: `python benchmarks/attention_cost.py" in md
    assert (out / "attention_cost.png").read_bytes()[:4] == b"\x89PNG"
