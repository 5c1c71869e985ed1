"""Reproducibility (docs/training.md, "Reproducibility"): the same command gives the same numbers, another seed
other numbers, and nothing but the seed draws them.

lm train runs on a real prepared corpus (the first 60k characters of tiny Shakespeare, character tokens), so the
masks (mlm), the sampled replacements (ELECTRA) and the spans (span corruption) are the loader's and the model's own.
"""

import json

import pytest
import torch

from lm.cli.finetune import finetune
from lm.cli.train import train
from lm.data.tokenizer import train as train_tokenizer
from tests.engine_support import compose, loaders, tiny_overrides, train_losses
from tests.glue_support import easy_glue, easy_task, finetune_cfg, pretrained  # noqa: F401 - fixtures

ARCHS = {
    "decoder": [],
    "encoder": ["model.arch=encoder"],
    "electra": ["model.arch=encoder", "model/family=electra", "model.family.generator_dim=32"],
    "encoder_decoder": ["model.arch=encoder_decoder", "model.n_decoder_layers=1"],
}


@pytest.fixture(scope="module")
def shakespeare(tmp_path_factory, data_mirror):
    """The data overrides of a 60k-character slice of tiny Shakespeare, prepared once (char tokens, sentinels)."""
    work = tmp_path_factory.mktemp("shakespeare")
    (work / "input.txt").write_text((data_mirror / "text" / "tinyshakespeare" / "input.txt").read_text()[:60_000])
    data = {
        "name": "repro",
        "dir": work / "data",
        "source": work / "input.txt",
        "tokenizer": "char",
        "split": "contiguous",
        "val_fraction": 0.1,
        "workers": 1,
    }
    return ["~data", *(f"data.{k}={v}" for k, v in data.items())]


def run_lm_train(run_dir, data: list[str], extra: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from lm.config import conf_dir, register_train_configs

    register_train_configs()
    GlobalHydra.instance().clear()
    overrides = tiny_overrides(run_dir, 4, eval_interval=2, eval_batches=2, threads=1)
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        cfg = hydra_compose(config_name="train", overrides=[*overrides, *data, "model.dropout=0.1", *extra])
    result = train(cfg)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [(r["step"], r.get("loss"), r.get("val_loss")) for r in records if "loss" in r or "val_loss" in r]
    return losses, {k: v.clone() for k, v in result.engine.model.state_dict().items()}


@pytest.mark.parametrize("arch", list(ARCHS))
def test_the_same_command_repeats_its_losses_and_weights_and_another_seed_does_not(tmp_path, shakespeare, arch):
    """With dropout, mlm masks, ELECTRA's sampled replacements and span corruption all drawn: two runs of one
    command agree to the bit (train and val losses, final weights); seed=1 changes every step's training loss
    and the weights."""
    first, weights = run_lm_train(tmp_path / "a", shakespeare, ARCHS[arch])
    again, weights_again = run_lm_train(tmp_path / "b", shakespeare, ARCHS[arch])
    other, weights_other = run_lm_train(tmp_path / "c", shakespeare, [*ARCHS[arch], "seed=1"])
    assert [s for s, loss, _ in first if loss is not None] == [1, 2, 3, 4]
    assert again == first
    assert all(torch.equal(weights[k], weights_again[k]) for k in weights)
    assert all(a[1] != b[1] for a, b in zip(first, other) if a[1] is not None)  # every step's training loss
    assert not all(torch.equal(weights[k], weights_other[k]) for k in weights)


@pytest.mark.parametrize("kind", ["bpe", "char"])
def test_a_tokenizer_trained_twice_is_the_same_file(data_mirror, kind):
    """BPE and char training are deterministic (a unigram tokenizer is not: Hugging Face's trainer reads its words
    from a hash map whose order changes with each map, so docs/data.md says to keep its tokenizer.json)."""
    text = (data_mirror / "text" / "tinyshakespeare" / "input.txt").read_text()[:100_000].split("\n\n")
    first, again = (train_tokenizer(kind, iter(text), vocab_size=600)._tok.to_str() for _ in range(2))
    assert first == again


def test_a_finetuning_job_repeats_each_seeds_results_and_the_seeds_differ(tmp_path, easy_glue, pretrained):  # noqa: F811
    """Two runs of one lm finetune job (seeds 0 and 1, with the head's dropout): every logged number of each seed is
    the same; the two seeds (head init, epoch order, dropout) train to other losses."""

    def job(name):
        task = easy_task(easy_glue, epochs=1, seeds="[0,1]")
        finetune(finetune_cfg(tmp_path / name, [f"init={pretrained / 'run'}", "train.threads=1", *task]))
        return {
            seed: [
                {k: v for k, v in json.loads(line).items() if k not in ("tokens_per_s", "steps_per_s", "memory")}
                for line in (tmp_path / name / "sst2" / f"seed{seed}" / "metrics.jsonl").read_text().splitlines()
            ]
            for seed in (0, 1)
        }

    first, again = job("a"), job("b")
    assert again == first
    losses = {seed: [r["loss"] for r in records if "loss" in r] for seed, records in first.items()}
    assert losses[0] and losses[0] != losses[1]


def test_train_threads_null_runs_on_the_process_count_not_on_an_earlier_runs(tmp_path, monkeypatch):
    """torch keeps one thread count per process: a sweep cell with train.threads=null that ran after a cell with
    train.threads=1 ran on 1 thread, its weights bit-equal to that cell's and 9.9e-7 from the same command run
    alone on 2 threads. Null is the process's own count again after a run that set one."""
    import lm.core.setup

    monkeypatch.setattr(lm.core.setup, "_process_threads", None, raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(3)  # this process's own count (any but 1)
    try:
        for name, threads, expected in (("one", 1, 1), ("null", None, 3)):
            kw = {} if threads is None else {"threads": threads}
            cfg = compose(tiny_overrides(tmp_path / name, 2, **kw))
            train(cfg, loaders=loaders(cfg))
            assert (name, torch.get_num_threads()) == (name, expected)
        assert list(train_losses(tmp_path / "null")) == [1, 2]
    finally:
        torch.set_num_threads(before)
