"""One self-contained HTML page from the report's Markdown: the same text and tables, with every
PNG it links embedded as base64 so the file can be mailed or attached on its own.

The Markdown carries user strings (run names, overrides, --text, --title, --notes): raw HTML in it is
shown as text, never passed through, and a link or image may point only at a relative path or an
http(s)/mailto URL, so no string reaches the page as markup or script.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

STYLE = """
body { font-family: -apple-system, Segoe UI, Helvetica, Arial, sans-serif; max-width: 1200px;
       margin: 2em auto; padding: 0 1em; color: #222; line-height: 1.45; }
table { border-collapse: collapse; font-size: 0.85em; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
tr:nth-child(even) { background: #f6f6f6; }
code { background: #f0f0f0; padding: 0 0.2em; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
img { max-width: 100%; }
"""


def embed_images(page: str, base: Path) -> str:
    """Each <img> of a PNG beside the page (a relative path inside `base`) inlined as base64."""

    def repl(m: re.Match) -> str:
        src = m.group(2)
        f = base / src
        if src.startswith("/") or ".." in Path(src).parts or not f.is_file():
            return m.group(0)
        data = base64.b64encode(f.read_bytes()).decode("ascii")
        return f'{m.group(1)}src="data:image/png;base64,{data}"'

    return re.sub(r'(<img [^>]*?)src="([^"]+\.png)"', repl, page)


SAFE_URL = re.compile(r"(https?:|mailto:|#|[^:]*$)", re.IGNORECASE)  # a scheme we allow, or none (relative)


def _safe_links(page: str) -> str:
    """href/src values with another scheme (javascript:, data:, ...) replaced by '#'."""

    def repl(m: re.Match) -> str:
        return m.group(0) if SAFE_URL.match(html.unescape(m.group(2)).strip()) else f'{m.group(1)}="#"'

    return re.sub(r'\b(href|src)="([^"]*)"', repl, page)


def to_html(markdown_text: str, title: str, base: Path) -> str:
    import markdown

    md = markdown.Markdown(extensions=["tables", "fenced_code"])
    md.preprocessors.deregister("html_block")  # raw HTML blocks and inline tags become text
    md.inlinePatterns.deregister("html")
    body = _safe_links(md.convert(markdown_text))
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{STYLE}</style></head>\n<body>\n{embed_images(body, base)}\n</body></html>\n"
    )
