"""Shared pytest fixtures."""

import os
from pathlib import Path

import pytest

import lm.zoo  # noqa: F401 - the paper variants register their options, as every entry point (lm.config) does

# The real corpora (tiny Shakespeare, WikiText-2 valid/test, a TinyStories slice, GLUE) live next to the
# repository, never inside it; lm.data reads registry corpora from this mirror before downloading.
DATA_MIRROR = (Path(__file__).resolve().parents[1] / ".." / "shared" / "data").resolve()


@pytest.fixture(autouse=True, scope="session")
def _lm_data_mirror():
    """Point LM_DATA_MIRROR at ../shared/data unless the caller set it."""
    old = os.environ.get("LM_DATA_MIRROR")
    os.environ.setdefault("LM_DATA_MIRROR", str(DATA_MIRROR))
    yield
    if old is None:
        os.environ.pop("LM_DATA_MIRROR", None)


@pytest.fixture(scope="session")
def data_mirror(_lm_data_mirror) -> Path:
    """The local data mirror directory (LM_DATA_MIRROR)."""
    return Path(os.environ.get("LM_DATA_MIRROR", DATA_MIRROR))


def pytest_collection_modifyitems(config, items):
    """gpu tests need CUDA: without it they are skipped, saying so (run them with `-m gpu` on a GPU machine)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run `python -m pytest -m gpu` on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
