"""The `glue:<task>,<task>...` source: the unlabelled TRAIN sentences of GLUE tasks, one per line.

Task-adaptive pretraining (Gururangan et al. 2020): text of the finetuning tasks' own training sets,
never their labels and never dev or test text. lm quickstart pretrains on it, and a data config
names it as one source among others (conf/data/gutenberg_mix_bpe.yaml):

    source: [gutenberg, wikitext2_heldout, "glue:sst2,cola,mrpc,stsb,rte"]

The file is derived from the GLUE data (the mirror's glue_data/, else the Hugging Face copy) into
the download cache, and rewritten only when its text changes, so a prepared directory's recorded
source (size, mtime) stays valid between runs.
"""

from __future__ import annotations

from pathlib import Path

from lm.data.errors import DataError

PREFIX = "glue:"


def parse_tasks(source: str) -> list[str]:
    """`glue:sst2,cola` -> ["sst2", "cola"]; unknown task names are refused, naming the known ones."""
    from lm.glue.tasks import TASKS

    tasks = [t.strip() for t in source[len(PREFIX) :].split(",") if t.strip()]
    unknown = [t for t in tasks if t not in TASKS]
    if not tasks or unknown:
        raise DataError(
            f"source {source!r}: {'unknown GLUE task(s) ' + str(unknown) if unknown else 'no task named'}; "
            f"write glue:<task>[,<task>...] with tasks from {sorted(TASKS)}"
        )
    return tasks


def sentences(tasks: list[str], root=None) -> str:
    """One sentence per line from the TRAIN split of each task (both sentences of a pair), newlines flattened."""
    from lm.glue.readers import GlueDataMissing, load_split

    lines: list[str] = []
    for t in tasks:
        try:
            examples = load_split(t, "train", root)  # the local TSV, else the Hugging Face copy
        except GlueDataMissing as e:
            raise DataError(f"glue:{t}: {e}") from None
        for e in examples:
            lines += [s for s in (e.text_a, e.text_b) if s]
    return "\n".join(x.replace("\n", " ") for x in lines) + "\n"


def write_sentences(path: Path, tasks: list[str], root=None) -> Path:
    """Write (atomically, only when the text changed) the train sentences of `tasks` to `path`."""
    from lm.core.files import atomic_write_text

    text = sentences(tasks, root)
    if not (path.is_file() and path.read_text(encoding="utf-8") == text):
        atomic_write_text(path, text)
    return path


def glue_source(source: str, mirror: Path | None) -> Path:
    """The derived sentence file of a `glue:` source, under the download cache."""
    from lm.data.corpora import cache_dir

    tasks = parse_tasks(source)
    root = mirror / "glue_data" if mirror and (mirror / "glue_data").is_dir() else None
    return write_sentences(cache_dir() / "derived" / f"glue_train_sentences_{'_'.join(tasks)}.txt", tasks, root)
