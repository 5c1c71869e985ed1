"""What lm report and lm attention may replace in the directory they write to: their own files, never a user's.

Both write fixed names (report.md, card.html, run_curves.png, grid_decoder_self.png, ...) into a directory the
user names (-o, --out), which may hold the user's own files of those names (their notes as report.md, docs/'s
attention.md, a figure of theirs). A file there is the user's unless it shows it is lm's: its Markdown or HTML
names the command (or is lm attention's page), its CSV starts with lm's table header, its PNG carries SOFTWARE in
its metadata, or (a PNG written before that mark) lm's own Markdown beside it shows it. `check_out` refuses the
whole write before anything is written, so a refused report leaves the directory as it was.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from lm.core.files import nearest_existing
from lm.report.runs import ReportError

SOFTWARE = "lm"  # the PNG "Software" text of lm's figures (matplotlib's default names matplotlib, as a user's has)
ATTENTION_TITLE = "Attention maps: "  # how lm attention's page starts (lm/report/attention_plots.py write_page)
# The first sentence of lm report's transfer.md (lm/report/transfer.py write_curve_report), which lm transfer's own
# transfer.md (the run's table, never lm report's to replace) lacks
CURVE_NOTE = "Gain = pretrained median - scratch median (points), per task and the GLUE-style average."


def save_png(fig, path: Path, **savefig) -> Path:
    """Save and close a matplotlib figure as `path`, marked as lm's, under a temporary name and renamed: a
    reader (or a later check_out) never sees half a picture."""
    import matplotlib.pyplot as plt

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.png")
    try:
        fig.savefig(tmp, metadata={"Software": SOFTWARE}, **savefig)
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
    return path


def check_out(out: Path, names: Iterable[str], command: str, flag: str, what: str) -> None:
    """Refuse `out` (before anything is written) when it is not a directory, or when writing `names` there would
    replace a file `command` did not write; `flag` is the option that picks another directory, `what` the output
    in words ("the report")."""
    above = nearest_existing(out)
    if not above.is_dir():
        raise ReportError(
            f"{flag} {out}: {above} is a file, not a directory; name a directory (new, or one {command} wrote before)"
        )
    for name in names:
        file = Path(out) / name
        if (file.exists() or file.is_symlink()) and not ours(file):
            raise ReportError(
                f"{file} exists and is not a file {command} wrote; {what} would replace it: "
                f"pass {flag} <another directory>, or move the file"
            )


def ours(file: Path) -> bool:
    """Whether `file` is one lm report or lm attention wrote (the module doc says how each kind shows it)."""
    if file.is_symlink() or not file.is_file():
        return False
    if file.suffix == ".png":
        return _png_software(file) == SOFTWARE or any(f"]({file.name})" in text for text in _our_pages(file.parent))
    try:
        text = file.read_text(errors="replace")
    except OSError:
        return False
    return _our_text(file.name, text)


def _our_text(name: str, text: str) -> bool:
    if name == "transfer.md":  # lm report's curve page; lm transfer's own table of that name is the run's
        return CURVE_NOTE in text
    if name.endswith(".csv"):
        return text.startswith("variant,")
    if name.startswith("attention."):
        return text.startswith(f"# {ATTENTION_TITLE}") or f"<title>{ATTENTION_TITLE}" in text
    return "lm report" in text  # "Made with `lm report ...`" in report.md and card.md, and in their HTML pages


def _our_pages(directory: Path) -> list[str]:
    """The text of the Markdown pages lm wrote in `directory`: the figures they link are lm's too."""
    pages = []
    for page in directory.glob("*.md"):
        try:
            text = page.read_text(errors="replace")
        except OSError:
            continue
        if _our_text(page.name, text):
            pages.append(text)
    return pages


def _png_software(file: Path) -> str | None:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(file) as image:
            return image.info.get("Software")
    except (OSError, UnidentifiedImageError, ValueError):  # not a PNG after all: the user's
        return None
