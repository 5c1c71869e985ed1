"""The repository is code and reference, not a lab notebook (issue 48, items 4 and 7): no binaries are tracked,
and every relative link in README.md and docs/ resolves."""

import re
import subprocess
from pathlib import Path

from tests.engine_support import REPO

BINARY = (".pt", ".safetensors", ".bin")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)


def tracked(*patterns: str):
    out = subprocess.run(["git", "ls-files", "--", *patterns], cwd=REPO, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_no_checkpoints_or_weights_are_tracked():
    binaries = [f for f in tracked() if f.endswith(BINARY)]
    assert binaries == [], f"binaries belong in run directories, not in git: {binaries[:10]}"


def relative_links(page: Path):
    for target in LINK.findall(page.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # https:, mailto:, and anchors within the page
        yield target.split("#", 1)[0]


def test_every_relative_link_in_readme_and_docs_resolves():
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    broken = [f"{page.relative_to(REPO)} -> {target}" for page in pages for target in relative_links(page)
              if not (page.parent / target).exists()]
    assert broken == []


def test_the_link_check_sees_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[ok](page.md) [gone](missing.md#x) ![img](a.png) [web](https://example.com) [here](#top)\n")
    assert list(relative_links(page)) == ["page.md", "missing.md", "a.png"]
