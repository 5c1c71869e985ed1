"""The CPU memory that `lm train` logs is the running program's own peak, not its parent's."""

import subprocess
import sys

import pytest

REPO_ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the inherited floor is Linux's ru_maxrss")
def test_peak_rss_ignores_the_parents_pages_and_sees_its_own_growth():
    parent = bytearray(1 << 30)  # a 1 GiB parent, like a long-lived pytest worker or launcher
    parent[:: 1 << 12] = b"\x01" * len(range(0, 1 << 30, 1 << 12))  # touch every page: resident
    script = (
        "import torch\n"
        "from lm.core.tracking import peak_rss_bytes\n"
        "before = peak_rss_bytes()\n"
        "x = torch.ones(1 << 26)  # 256 MiB, written, so resident\n"
        "print(before, peak_rss_bytes())\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    before, after = map(int, run.stdout.split())
    assert before < 900 << 20, f"{before >> 20} MiB at start: the parent's 1 GiB leaked into the child's peak"
    assert after - before > 200 << 20, f"grew {(after - before) >> 20} MiB for a 256 MiB tensor"
    del parent
