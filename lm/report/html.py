"""One self-contained HTML page from the report's Markdown: the same text and tables, with every
PNG it links embedded as base64 so the file can be mailed or attached on its own."""

from __future__ import annotations

import base64
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


def embed_images(html: str, base: Path) -> str:
    def repl(m: re.Match) -> str:
        src = m.group(1)
        f = base / src
        if src.startswith("data:") or not f.is_file():
            return m.group(0)
        data = base64.b64encode(f.read_bytes()).decode("ascii")
        return f'src="data:image/png;base64,{data}"'

    return re.sub(r'src="([^"]+\.png)"', repl, html)


def to_html(markdown_text: str, title: str, base: Path) -> str:
    import markdown

    body = markdown.markdown(markdown_text, extensions=["tables", "fenced_code"])
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{title}</title>"
            f"<style>{STYLE}</style></head>\n<body>\n{embed_images(body, base)}\n</body></html>\n")
