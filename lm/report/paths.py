"""Reports without this machine's paths: a report committed next to the code (docs/ablations/) should read the
same on any machine, so the data and cache roots become $LM_DATA_MIRROR / $LM_CACHE, paths under the working
directory become relative, and the home directory becomes ~."""

from __future__ import annotations

import os


def portable(text: str) -> str:
    """`text` with this machine's data root, cache root, working directory and home directory written portably."""
    roots = [(os.environ.get(name, ""), f"${name}") for name in ("LM_DATA_MIRROR", "LM_CACHE")]
    roots += [(os.getcwd() + os.sep, ""), (os.path.expanduser("~"), "~")]
    for path, written in roots:  # the most specific first: a cache under the working directory stays $LM_CACHE
        path = path.rstrip(os.sep) if written else path
        if len(path) > 1:
            text = text.replace(path, written)
    return text
