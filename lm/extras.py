"""Optional dependencies: the pyproject.toml extra that installs each, and the one-line error when one is missing.

`pip install lm` gives the core (train, finetune, prepare text/JSONL); an entry point or reader that
needs more says which extra to install instead of failing with an ImportError's traceback.
"""

import importlib
import importlib.util
import sys

EXTRAS = {
    "report": ("matplotlib", "markdown"),  # lm report: plots and HTML
    "hf": ("transformers",),  # lm export's Hugging Face directory, benchmarks/hf_step.py's reference models
    "data": ("zstandard", "pyarrow", "datasets"),  # .zst, Parquet and hf:<dataset> sources
    "tensorboard": ("tensorboard",),  # logger.tensorboard=true
    "eval": ("lm_eval", "sklearn"),  # lm eval (the LM Evaluation Harness), train.probe_interval
    # model.kernels.* (Liger-Kernel, Cut Cross-Entropy: lm/model/kernels.py), train.float8=torchao (lm/engine/float8.py)
    "kernels": ("liger_kernel", "cut_cross_entropy", "torchao"),
}


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message names the extra that installs it."""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a dotted name whose parent package is missing
        return False


def missing(extra: str, modules=None) -> list:
    """The modules of `extra` (or the given subset of them) that cannot be imported."""
    return [m for m in (modules or EXTRAS[extra]) if not _installed(m)]


def message(extra: str, what: str, modules) -> str:
    return f"{what} needs {' and '.join(modules)} (not installed): pip install 'lm[{extra}]'"


def require(extra: str, what: str, module: str = None):
    """Import `module` (default: every module of `extra`, returning the first); raise MissingExtra if absent."""
    modules = [module] if module else list(EXTRAS[extra])
    absent = missing(extra, modules)
    if absent:
        raise MissingExtra(message(extra, what, absent))
    return importlib.import_module(modules[0])


def exit_if_missing(prog: str, extra: str) -> None:
    """For a console script that cannot run at all without `extra`: one line on stderr, exit status 1."""
    absent = missing(extra)
    if absent:
        sys.exit(f"{prog}: error: {message(extra, prog, absent)}")
