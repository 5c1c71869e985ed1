"""The README's commands (issue 48, items 2 and 7): blocks marked `<!-- runnable ... -->` are run as written,
line by line, in a fresh directory (slow: they train); the quickstart's block is run at a small budget by
tests/test_quickstart.py. The fast checks keep the page short and its commands real."""

import os
import re
import subprocess
import sys

import pytest

from lm.cli.main import COMMANDS
from tests.engine_support import REPO
from tests.test_own_text import write_text

README = REPO / "README.md"
RUNNABLE = re.compile(r"<!-- runnable[^>]*-->\n```bash\n(.*?)```", re.S)


def runnable_lines():
    return [line for block in RUNNABLE.findall(README.read_text()) for line in block.splitlines() if line.strip()]


def test_the_readme_is_short_and_marks_its_runnable_blocks():
    assert len(README.read_text().splitlines()) <= 150
    lines = runnable_lines()
    assert any(line.startswith("lm train ") for line in lines) and any("lm finetune " in line for line in lines)


def test_every_lm_command_in_the_readme_exists():
    used = set(re.findall(r"(?<![\w-])lm ([a-z]+)\b", README.read_text()))
    assert {"train", "finetune", "quickstart", "prepare"} <= used
    assert used <= set(COMMANDS) | {"command", "is", "with", "to"}, used - set(COMMANDS)


@pytest.mark.slow
def test_the_readme_runnable_blocks_run(tmp_path):
    bin_dir = tmp_path / "bin"  # `lm` as pip install -e . makes it, for a checkout without the install
    bin_dir.mkdir()
    (bin_dir / "lm").write_text(f'#!/bin/sh\nexec {sys.executable} -m lm "$@"\n')
    (bin_dir / "lm").chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    write_text(work / "my_text.txt", lines=3000)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(REPO), "WANDB_MODE": "offline"}
    for line in runnable_lines():
        # the limit only catches a hang: the finetune trains three RTE seeds, over half an hour on a busy CPU
        p = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", line], cwd=work, env=env, capture_output=True, text=True, timeout=3600
        )
        assert p.returncode == 0, f"{line}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    assert (work / "runs" / "data-shakespeare_char+model-tiny" / "checkpoints" / "latest").is_file()
    assert (
        work
        / "runs"
        / "finetune"
        / "init-runs_data-shakespeare_char+model-tiny+task-glue_rte+tasks.rte.epochs-1"
        / "results.json"
    ).is_file()
