"""The chunked cross-entropy (model.loss_chunk_size) under parameter sharding: ZeRO-3 and FSDP2 gather a
module's weights only around that module's forward, so the loss must read the output weight there.
2 gloo ranks must train like one process with the same global batch (engine_support)."""

import pytest

from lm.cli.train import train
from tests.engine_support import compose, loaders, spawn, tiny_overrides, train_losses

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

STEPS = 10
TOL = 1e-5
CHUNKED = ["model.loss_chunk_size=24"]  # 4 x 32 tokens per rank: several chunks, the last one partial


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("single_chunked")
    cfg = compose(tiny_overrides(run_dir, STEPS, micro_batch_size=4) + CHUNKED)
    train(cfg, loaders=loaders(cfg))
    return train_losses(run_dir)


def test_chunked_loss_matches_the_full_loss_in_one_process(single, tmp_path):
    cfg = compose(tiny_overrides(tmp_path, STEPS, micro_batch_size=4))
    train(cfg, loaders=loaders(cfg))
    full = train_losses(tmp_path)
    assert max(abs(full[s] - single[s]) for s in single) < TOL


@pytest.fixture(scope="module")
def single_untied(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("single_chunked_untied")
    cfg = compose(tiny_overrides(run_dir, STEPS, micro_batch_size=4) + CHUNKED + UNTIED)
    train(cfg, loaders=loaders(cfg))
    return train_losses(run_dir)


UNTIED = ["model.tie_embeddings=false"]  # then the output weight belongs to the head alone


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("engine", ["zero3", "fsdp2"])
def test_chunked_loss_under_sharded_engines_matches_single_process(engine, tied, single, single_untied, tmp_path):
    reference = single if tied else single_untied
    spawn(
        2,
        tiny_overrides(tmp_path, STEPS, micro_batch_size=2) + CHUNKED + [f"engine={engine}"] + ([] if tied else UNTIED),
    )
    losses = train_losses(tmp_path)
    assert list(losses) == list(reference) == list(range(1, STEPS + 1))
    worst = max(abs(losses[s] - reference[s]) for s in reference)
    assert worst < TOL, f"{engine}: max |loss - single| = {worst:.2e} over {STEPS} steps"
    assert reference[STEPS] < reference[1]
