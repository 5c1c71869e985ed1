"""The offline tasks' data: GLUE dev splits and WikiText-2 from the local mirror ($LM_DATA_MIRROR), read with
lm's own readers (lm/glue/readers.py), as datasets.DatasetDict for the harness (`custom_dataset` in the
YAMLs beside this file). Nothing is downloaded."""

import os
import re
from pathlib import Path

from lm_eval.tasks.wikitext.preprocess_wikitext import process_results, wikitext_detokenizer  # noqa: F401

HEADING = re.compile(r"^ = [^=].* = $")  # an article's title line; " = = Section = = " lines are not


def _glue(task: str):
    import datasets

    from lm.glue.readers import load_eval

    rows = [
        {"sentence1": e.text_a, "sentence2": e.text_b or "", "label": int(e.label), "idx": i}
        for i, e in enumerate(load_eval(task, "dev", hf=False))
    ]
    return datasets.DatasetDict({"validation": datasets.Dataset.from_list(rows)})


def sst2(**_):
    return _glue("sst2")


def rte(**_):
    return _glue("rte")


def mrpc(**_):
    return _glue("mrpc")


def cola(**_):
    return _glue("cola")


def wikitext2(**_):
    """The raw WikiText-2 validation and test files, one document per article (as the harness's own
    EleutherAI/wikitext_document_level), in the `page` field."""
    import datasets

    mirror = Path(os.environ.get("LM_DATA_MIRROR", "data")).expanduser() / "text" / "wikitext-2-raw"
    splits = {}
    for split, name in (("validation", "wiki.valid.raw"), ("test", "wiki.test.raw")):
        path = mirror / name
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} not found: set LM_DATA_MIRROR to the directory holding "
                f"text/wikitext-2-raw/ (the project's data mirror)"
            )
        splits[split] = datasets.Dataset.from_list([{"page": p} for p in articles(path.read_text(encoding="utf-8"))])
    return datasets.DatasetDict(splits)


def articles(text: str) -> list:
    """Split the raw file at its article title lines, each article keeping its title."""
    pages, current = [], []
    for line in text.splitlines(keepends=True):
        if HEADING.match(line.rstrip("\n")) and any(s.strip() for s in current):
            pages.append("".join(current))
            current = []
        current.append(line)
    if any(s.strip() for s in current):
        pages.append("".join(current))
    return pages
