"""The loop's logged `tokens` (and so tokens/s) count the tokens the model reads: a padded GLUE micro-batch counts
its real tokens (attention_mask 1), not micro-batch x its padded length; a packed pretraining batch (no mask, no
padding) counts every position, as before. The count is taken on the host (lm/core/prefetch.py), with or without
read-ahead."""

import pytest
import torch

from lm.core import objectives
from lm.core.config import OptimConfig, TrainConfig
from lm.core.fixed_task import FixedTask, Records
from lm.core.session import Session
from lm.engine import Dist, SingleEngine
from lm.glue import collate
from lm.model import SequenceClassifier, build_model
from lm.model.config import model_preset

VOCAB = 64


def features(lengths: list[int], second: list[int] | None = None) -> list[dict]:
    """Encoded examples of the given lengths (token ids 4..), one label each; `second`: a siamese second reading."""
    out = []
    for i, n in enumerate(lengths):
        f = {"input_ids": [4 + (i + j) % 50 for j in range(n)], "attention_mask": [1] * n, "token_type_ids": [0] * n}
        if second is not None:
            m = second[i]
            f["second"] = {"input_ids": [5] * m, "attention_mask": [1] * m, "token_type_ids": [0] * m}
        out.append({**f, "labels": i % 2})
    return out


def test_input_tokens_of_a_padded_batch_are_its_real_tokens():
    batch = collate(features([3, 5, 12]), pad_id=0)
    assert batch["input_ids"].shape == (3, 12)  # 36 positions, padding included
    assert objectives.input_tokens(batch) == 20
    rounded = collate(features([3, 5, 12]), pad_id=0, multiple=16)  # glue.pad_to_multiple_of adds no tokens
    assert rounded["input_ids"].shape == (3, 16) and objectives.input_tokens(rounded) == 20
    pairs = collate(features([3, 5], second=[7, 2]), pad_id=0)  # (2B, T): both readings are read
    assert pairs["input_ids"].shape == (4, 7) and objectives.input_tokens(pairs) == 17


def test_a_packed_batch_counts_every_position():
    ids = torch.arange(2 * 8).reshape(2, 8)
    assert objectives.input_tokens({"input_ids": ids, "labels": ids}) == 16
    span = {"input_ids": ids, "decoder_input_ids": ids[:, :3], "labels": ids[:, :3]}
    assert objectives.input_tokens(span) == 22


def logged(task: FixedTask, make_model, steps: int, prefetch: int, tmp_path) -> list[dict]:
    train = TrainConfig(
        micro_batch_size=4,
        max_steps=steps,
        precision="fp32",
        device="cpu",
        log_interval=2,
        eval_interval=0,
        ckpt_interval=0,
        progress=False,
        prefetch=prefetch,
    )
    engine = SingleEngine(train, Dist(rank=0, world_size=1, local_rank=0, device=torch.device("cpu")))
    records = Records()
    with Session(train, engine, task, tmp_path / "run", "") as session:
        session.build(make_model, 0, OptimConfig(lr=1e-3))
        session.tracker = records
        session.train(lambda step: 1e-3)
    return [r for r in records.records if "loss" in r]


def model_cfg(arch: str):
    return model_preset("tiny", [f"model.arch={arch}", f"model.vocab_size={VOCAB}", "model.dim=32", "model.n_layers=1"])


@pytest.mark.parametrize("prefetch", [0, 1])
def test_finetuning_logs_the_real_tokens_of_its_padded_batches(tmp_path, prefetch):
    # step 1: two micro-batches, 3+5+12 = 20 real of 3x12 = 36, then 9+9 = 18 real of 2x9; step 2: 2+1 = 3 real of 2x2
    steps = [[collate(features([3, 5, 12]), 0), collate(features([9, 9]), 0)], [collate(features([2, 1]), 0)]]
    task = FixedTask([], dense_labels=False)
    task.batches = _Steps(steps)  # several micro-batches a step, as a GLUE step of batch_size > micro_batch_size
    cfg = model_cfg("encoder")
    records = logged(task, lambda: SequenceClassifier(build_model(cfg), n_labels=2), 4, prefetch, tmp_path)
    assert [(r["step"], r["tokens"]) for r in records] == [(2, 41), (4, 82)]  # padded positions: 58, 116


@pytest.mark.parametrize("prefetch", [0, 1])
def test_pretraining_logs_every_position_of_its_packed_batches(tmp_path, prefetch):
    ids = torch.randint(4, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    task = FixedTask([{"input_ids": ids[:, :-1].contiguous(), "labels": ids[:, 1:].contiguous()}])
    cfg = model_cfg("decoder")
    records = logged(task, lambda: build_model(cfg), 4, prefetch, tmp_path)
    assert [(r["step"], r["tokens"]) for r in records] == [(2, 32), (4, 64)]  # 2 x 8 per step


class _Steps:
    """StepBatches cycling over given steps of several micro-batches each (FixedBatches gives one per step)."""

    dense_labels = False

    def __init__(self, steps):
        self.steps, self.index = steps, 0

    def __iter__(self):
        return self

    def __next__(self):
        step = self.steps[self.index % len(self.steps)]
        self.index += 1
        return step

    def state_dict(self) -> dict:
        return {"index": self.index}

    def load_state_dict(self, state: dict) -> None:
        self.index = state["index"]
