"""The repository is code and reference, not a lab notebook (issue 48, items 4 and 7): no binaries are tracked,
and every relative link in README.md and docs/ resolves."""

import re
import subprocess
from collections.abc import Iterator
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


HOME = re.compile(r"(?<![\w$~./-])/(?:root|home|Users)/")  # a user's home: a path of the machine that wrote it


def test_docs_name_no_home_directory_of_a_machine():
    """Reference pages and the transfer curve's archive are read on other machines: lm's cache is written
    $LM_CACHE (benchmarks/glue_transfer_curve.py), commands use relative or placeholder paths."""
    pages = [f for f in tracked("README.md", "docs") if not f.endswith(".png")]
    found = [f"{f}: {m.group(0)}" for f in pages for m in HOME.finditer((REPO / f).read_text(errors="replace"))]
    assert found == []
    assert HOME.search('"tokenizer": "/root/.cache/lm/x"') and not HOME.search('"$LM_CACHE/data/x" ~/.cache/lm')


def relative_links(page: Path):
    for target in LINK.findall(page.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # https:, mailto:, and anchors within the page
        yield target.split("#", 1)[0]


def test_every_relative_link_in_readme_and_docs_resolves():
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    broken = [
        f"{page.relative_to(REPO)} -> {target}"
        for page in pages
        for target in relative_links(page)
        if not (page.parent / target).exists()
    ]
    assert broken == []


HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$")


def heading_anchors(page: Path) -> Iterator[str]:
    """The #fragments GitHub gives a page's headings: lower case, punctuation (`'`, `:`, `=`, backticks) dropped,
    spaces -> hyphens, a repeated heading -suffixed -1, -2; headings inside ``` blocks are code, not headings."""
    seen: dict[str, int] = {}
    in_code = False
    for line in page.read_text().splitlines():
        in_code ^= line.startswith("```")
        match = None if in_code else HEADING.match(line)
        if match:
            slug = re.sub(r"[^\w\- ]", "", match.group(1).lower()).replace(" ", "-")
            seen[slug] = seen.get(slug, -1) + 1
            yield slug if seen[slug] == 0 else f"{slug}-{seen[slug]}"


def broken_anchors(page: Path):
    """`page.md#x` and `#x` links whose target page has no heading x: a renamed heading breaks them silently."""
    for target in LINK.findall(page.read_text()):
        path, hash_, anchor = target.partition("#")
        if not hash_ or re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue
        linked = page.parent / path if path else page
        if linked.suffix == ".md" and linked.exists() and anchor not in set(heading_anchors(linked)):
            yield target


def test_every_anchor_in_readme_and_docs_names_a_heading():
    pages = [REPO / "README.md", REPO / "docker" / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    broken = [f"{page.relative_to(REPO)} -> {target}" for page in pages for target in broken_anchors(page)]
    assert broken == []


def test_the_anchor_check_reads_headings_as_github_does(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "# Set-up: two commands\n## Config override grammar (Hydra)\n## `protocol=turc` on STS-B's pairs\n"
        "## Notes\n## Notes\n```\n# a comment\n```\n"
        "[a](#set-up-two-commands) [b](page.md#config-override-grammar-hydra) [c](#protocolturc-on-sts-bs-pairs)"
        " [d](#notes-1) [e](#a-comment) [f](#config-override-grammar) [g](https://x.org/#y)\n"
    )
    assert list(broken_anchors(page)) == ["#a-comment", "#config-override-grammar"]


def test_the_link_check_sees_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[ok](page.md) [gone](missing.md#x) ![img](a.png) [web](https://example.com) [here](#top)\n")
    assert list(relative_links(page)) == ["page.md", "missing.md", "a.png"]


def layout_map(text: str):
    """{package dir: file names} of docs/architecture.md's "Layout" block: a line `lm/<pkg>/ ...` opens a
    package, and each line's names ending in .py (before its description) are files of the open one."""
    block = text.split("## Layout: one line per file", 1)[1].split("```")[1]
    found, package = {}, "lm"
    for line in block.splitlines():
        head = line.split()[0] if line.strip() else ""
        if not line.startswith(" ") and head.endswith("/"):
            package = head.rstrip("/") if head.startswith("lm/") else None  # conf/, hydra_plugins/: not lm's
            continue
        if package is None or len(line) - len(line.lstrip()) > 2:
            continue  # not lm's, or a description's continuation
        for name in line.strip().split("  ")[0].split():  # the names before the description
            name = name.removeprefix(f"{package}/")  # top-level files are written lm/config.py
            if name.endswith(".py"):
                folder, _, base = name.rpartition("/")  # tasks/data.py: a file of a sub-directory
                found.setdefault(f"{package}/{folder}" if folder else package, set()).add(base)
    return found


def test_every_file_of_lm_is_in_the_architecture_map_and_every_file_there_exists():
    found = layout_map((REPO / "docs" / "architecture.md").read_text())
    missing = [
        str(p.relative_to(REPO))
        for p in sorted((REPO / "lm").rglob("*.py"))
        if p.name not in found.get(str(p.parent.relative_to(REPO)), set())
    ]
    assert missing == [], f"add a line for each to docs/architecture.md's layout map: {missing}"
    stale = sorted(
        f"{folder}/{name}" for folder, names in found.items() for name in names if not (REPO / folder / name).is_file()
    )
    assert stale == [], f"docs/architecture.md's layout map names files that do not exist: {stale}"


def test_the_map_check_reads_packages_and_files():
    text = (
        "## Layout: one line per file\n\n```\nlm/config.py   root\nlm/model/   the core\n"
        "  lm.py heads.py   families\n  tasks/data.py   data\nconf/   x.py\n```\n"
    )
    assert layout_map(text) == {"lm": {"config.py"}, "lm/model": {"lm.py", "heads.py"}, "lm/model/tasks": {"data.py"}}
