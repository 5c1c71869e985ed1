"""The static checks are wired and configured: .ci/run runs .ci/lint before the tests, and ruff with the
project's pyproject.toml rejects what it should (one line length, the selected rules, the layout). The full
run over the tree (and basedpyright) is .ci/lint itself; these check the configuration on small samples."""

import subprocess
import sys

from tests.engine_support import REPO

CLEAN = 'import os\n\n\ndef home() -> str:\n    return os.environ.get("HOME", "")\n'


def ruff(*args: str, source: str) -> subprocess.CompletedProcess:
    """ruff on `source` as if it were lm/sample.py, with the repository's configuration."""
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--stdin-filename", "lm/sample.py", "-"],
        input=source,
        cwd=REPO,
        capture_output=True,
        text=True,
    )


def test_ci_runs_the_static_checks_before_the_tests():
    run = (REPO / ".ci" / "run").read_text()
    assert run.index(".ci/lint") < run.index("python -m pytest")
    lint = (REPO / ".ci" / "lint").read_text()
    for command in ("ruff check", "ruff format --check", "basedpyright"):
        assert command in lint, command


def test_a_clean_sample_passes():
    assert ruff("check", source=CLEAN).returncode == 0, ruff("check", source=CLEAN).stdout
    assert ruff("format", "--check", source=CLEAN).returncode == 0


def test_the_line_length_is_120():
    fits = f'x = "{"a" * 114}"\n'  # 120 characters
    assert len(fits) == 121 and ruff("check", source=fits).returncode == 0
    too_long = f"# {'a' * 119}\n"  # a comment of 121 characters: the formatter cannot fix it, the linter flags it
    out = ruff("check", source=too_long)
    assert out.returncode == 1 and "E501" in out.stdout


def test_selected_rules_flag_their_findings():
    samples = {
        "F401": "import os\n",  # pyflakes: unused import
        "I001": "import sys\nimport os\n\nprint(os, sys)\n",  # import order
        "B006": "def f(x=[]):\n    return x\n",  # bugbear: mutable default
        "UP006": "from typing import List\n\n\ndef f(x: List[int]) -> int:\n    return len(x)\n",  # pyupgrade
        "E741": "l = 1\n",  # ambiguous name
    }
    for code, source in samples.items():
        out = ruff("check", "--output-format", "concise", source=source)
        assert out.returncode == 1 and code in out.stdout, (code, out.stdout)


def test_the_formatter_rejects_another_layout():
    out = ruff("format", "--check", source="x = {'a':1}\n")
    assert out.returncode == 1
