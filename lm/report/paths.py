"""Reports without this machine's paths: a report committed next to the code (docs/ablations/, the GLUE transfer
curve's archive) should read the same on any machine, so the data and cache roots become $LM_DATA_MIRROR /
$LM_CACHE, paths under the working directory become relative (a symlinked entry of it, runs/ on other storage
say, by its name), and the home directory becomes ~."""

from __future__ import annotations

import os


def portable(text: str) -> str:
    """`text` with this machine's data root, cache root, working directory and home directory written portably."""
    roots = [(os.environ.get(name, ""), f"${name}") for name in ("LM_DATA_MIRROR", "LM_CACHE")]
    cwd = os.getcwd()
    links = [e for e in os.scandir(cwd) if e.is_symlink() and e.is_dir()]
    roots += [(os.path.realpath(e.path), e.name) for e in links]
    roots += [(cwd + os.sep, ""), (os.path.expanduser("~"), "~")]
    for path, written in roots:  # the most specific first: a cache under the working directory stays $LM_CACHE
        path = path.rstrip(os.sep) if written else path
        if len(path) > 1:
            text = text.replace(path, written)
    return text
