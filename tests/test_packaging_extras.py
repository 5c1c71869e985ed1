"""Optional dependencies: each console script or reader whose extra is missing exits with one line naming
the extra (pip install 'lm[...]'), and pyproject.toml's extras hold what lm/extras.py says they do."""

import json
import re
import sys
from pathlib import Path

import pytest
import tomllib

from lm.extras import EXTRAS, MissingExtra, require
from tests.benchmark_scripts import load

ROOT = Path(__file__).resolve().parents[1]


def block(monkeypatch, *modules):
    """Make `import m` fail for each module, as if it were not installed."""
    for m in modules:
        monkeypatch.setitem(sys.modules, m, None)


def one_line_exit(excinfo, extra):
    msg = str(excinfo.value.code)
    assert "\n" not in msg and f"pip install 'lm[{extra}]'" in msg, msg
    return msg


def test_lm_report_without_matplotlib_says_which_extra(monkeypatch, tmp_path):
    from lm.cli.report import main

    block(monkeypatch, "matplotlib")
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path)])
    assert (
        one_line_exit(e, "report") == "lm report: error: lm report needs matplotlib (not installed): "
        "pip install 'lm[report]'"
    )
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    one_line_exit(e, "report")


def test_hf_step_benchmark_without_transformers_says_which_extra(monkeypatch):
    main = load("hf_step").main

    block(monkeypatch, "transformers")
    with pytest.raises(SystemExit) as e:
        main(["--steps", "1"])
    assert "benchmarks/hf_step.py needs transformers" in one_line_exit(e, "hf")


def test_hf_export_without_transformers_raises_missing_extra(monkeypatch):
    from lm.model import build_model
    from lm.model.config import ModelConfig
    from lm.model.convert import to_hf

    block(monkeypatch, "transformers")
    with pytest.raises(MissingExtra, match=r"converting to a Hugging Face model .* pip install 'lm\[hf\]'"):
        to_hf(build_model(ModelConfig(vocab_size=50, dim=32, n_heads=4, max_seq_len=16)))


@pytest.mark.parametrize("name, blocked", [("a.jsonl.zst", "zstandard"), ("a.parquet", "pyarrow.parquet")])
def test_lm_prepare_without_a_reader_says_which_extra(monkeypatch, tmp_path, name, blocked):
    from lm.cli.prepare import main

    (tmp_path / name).write_bytes(b"not read")
    block(monkeypatch, blocked)
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / name), "--out", str(tmp_path / "out"), "--tokenizer", "char", "--no-progress"])
    msg = one_line_exit(e, "data")
    assert msg.startswith(f"lm prepare: {tmp_path / name}: reading ") and blocked in msg


def test_lm_prepare_text_needs_no_extra(monkeypatch, tmp_path):
    from lm.cli.prepare import main

    block(monkeypatch, "zstandard", "pyarrow", "pyarrow.parquet", "datasets")
    (tmp_path / "a.txt").write_text("".join(f"line {i} of some text\n" for i in range(200)))
    main(
        [
            str(tmp_path / "a.txt"),
            "--out",
            str(tmp_path / "out"),
            "--tokenizer",
            "char",
            "--workers",
            "1",
            "--no-progress",
        ]
    )
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["splits"]["train"]["tokens"] > 0


def test_tensorboard_logging_without_tensorboard_says_which_extra(monkeypatch, tmp_path):
    from lm.core.config import LoggerConfig
    from lm.core.tracking import Tracker

    block(monkeypatch, "tensorboard")
    with pytest.raises(
        MissingExtra, match=r"logger.tensorboard=true needs tensorboard.* pip install 'lm\[tensorboard\]'"
    ):
        Tracker(tmp_path, LoggerConfig(wandb=False, tensorboard=True), {})


def test_require_returns_the_module_when_installed():
    assert require("report", "a test", "markdown").__name__ == "markdown"


def test_pyproject_extras_match_lm_extras_and_dev_has_them_all():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    distribution = {
        "matplotlib": "matplotlib",
        "markdown": "markdown",
        "transformers": "transformers",
        "zstandard": "zstandard",
        "pyarrow": "pyarrow",
        "datasets": "datasets",
        "tensorboard": "tensorboard",
        "lm_eval": "lm-eval",
        "sklearn": "scikit-learn",
        "liger_kernel": "liger-kernel",
        "cut_cross_entropy": "cut-cross-entropy",
        "torchao": "torchao",
    }
    for extra, modules in EXTRAS.items():
        names = {re.split(r"[<>=\[ ]", req)[0] for req in extras[extra]}
        assert {distribution[m] for m in modules} == names, extra
    assert "lm[all]" in extras["dev"] and "accelerate" not in " ".join(project["dependencies"])
    # kernels: CUDA-only, kept out of all/dev (pyproject.toml says why)
    assert set(re.search(r"\[(.*)\]", extras["all"][0]).group(1).split(",")) == set(extras) - {"all", "dev", "kernels"}
    assert {"report", "hf", "data", "tensorboard", "slurm", "launch", "eval"} <= set(extras)
