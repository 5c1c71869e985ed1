"""AdamW parameter groups, LR schedules, and the precision / activation-checkpointing / compile options."""

import math

import pytest
import torch

from lm.cli.train import train
from lm.core.config import OptimConfig, SchedConfig
from lm.core.optim import adamw, lr_multiplier, param_groups
from lm.model import build_model
from lm.model.config import model_preset
from tests.engine_support import compose, loaders, tiny_overrides, train_losses


def test_no_weight_decay_on_norms_biases_and_embeddings():
    model = build_model(model_preset("tiny"))
    decay, no_decay = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    assert decayed and all(n.endswith(".weight") and "norm" not in n and "emb" not in n for n in decayed)
    assert {names[id(p)] for p in no_decay["params"]} >= {n for n in names.values() if n.endswith(".bias")}
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))  # tied head once
    assert no_decay["weight_decay"] == 0.0 and decay["weight_decay"] == 0.1
    assert adamw(model, OptimConfig(weight_decay=0.1)).param_groups[0]["weight_decay"] == 0.1


def test_decay_embeddings_decays_every_matrix_as_nanogpt():
    model = build_model(model_preset("tiny"))  # tied head, learned positions: two embedding tables
    names = {id(p): n for n, p in model.named_parameters()}
    decay, no_decay = adamw(model, OptimConfig(weight_decay=0.1, decay_embeddings=True)).param_groups
    matrices = {n for n, p in model.named_parameters() if p.dim() == 2}
    assert any("emb" in n for n in matrices) and any("pos" in n for n in matrices)
    assert {names[id(p)] for p in decay["params"]} == matrices
    assert all(p.dim() == 1 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


@pytest.mark.parametrize(
    "overrides, decayed, kept",
    [
        (["model/norm=rmsnorm"], ["decoder.blocks.0.ffn.down.weight"], ["decoder.blocks.0.norm_ffn.weight"]),
        (["model/family=lstm"], ["rnn.weight_hh_l0", "rnn.weight_ih_l1"], ["rnn.bias_hh_l0", "embed.tok.weight"]),
        (["model/block=pkm"], ["decoder.blocks.0.ffn.keys"], ["decoder.blocks.0.ffn.values.weight"]),
        (["model/attn=synthesizer_random"], ["decoder.blocks.0.self_attn.score.R"], ["decoder.pos.table.weight"]),
        (["model/attn=additive"], ["decoder.blocks.0.self_attn.score.W1", "decoder.blocks.0.self_attn.score.v"], []),
        (["model/block=evolved"], ["decoder.blocks.0.prelude.1.sep.depthwise.weight"], []),
        (["model/block=weighted"], [], ["decoder.blocks.0.self_attn.kappa", "decoder.blocks.0.self_attn.alpha"]),
        (["model/embedding=factorized", "model.embedding.rank=16"], ["embed.proj.weight"], ["embed.tok.weight"]),
    ],
)
def test_every_matrix_but_the_embedding_tables_is_decayed(overrides, decayed, kept):
    """The rule by shape (lm/core/optim.py): a zoo module's matrix (an RNN's recurrent weights, a score's W, PKM's
    keys) is decayed like a Linear weight; embedding tables (PKM's values too) and every vector are not."""
    import lm.zoo  # noqa: F401 - registers the zoo's options

    model = build_model(model_preset("tiny", overrides))
    tables = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding | torch.nn.EmbeddingBag)}
    decay, no_decay = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    decay_names = {names[id(p)] for p in decay["params"]}
    assert decay_names == {n for n, p in model.named_parameters() if p.dim() >= 2 and id(p) not in tables}
    assert set(decayed) <= decay_names and not set(kept) & decay_names, (decay_names, kept)
    assert all(p.dim() < 2 or id(p) in tables for p in no_decay["params"])


@pytest.mark.parametrize(
    "kind, expected",
    [
        # warmup 4 of 20 steps, floor 0.1: (step + 1) / 5 during warmup, then the decay over steps 4..20 (16 steps)
        # reaches 0.1 at step 20, one past the last step taken (19)
        ("constant", {0: 0.2, 3: 0.8, 4: 1.0, 19: 1.0}),
        ("linear", {0: 0.2, 4: 1.0, 19: 1.0 - 0.9 * 15 / 16, 11: 1.0 - 0.9 * 7 / 16}),
        ("cosine", {0: 0.2, 4: 1.0, 19: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 15 / 16))}),
        ("wsd", {4: 1.0, 15: 1.0, 16: 1.0, 17: 1.0 - 0.9 * 1 / 4, 19: 1.0 - 0.9 * 3 / 4}),  # the last 20% = 4 steps
    ],
)
def test_schedules(kind, expected):
    sched = SchedConfig(kind=kind, warmup_steps=4, min_lr_ratio=0.1, decay_fraction=0.2)
    for step, value in expected.items():
        assert lr_multiplier(step, sched, 20) == pytest.approx(value), (kind, step)


@pytest.mark.parametrize("kind", ["linear", "cosine", "wsd"])
def test_first_and_last_steps_move_with_a_floor_of_zero(kind):
    """lm finetune's linear decay to 0 (and any schedule with min_lr_ratio=0): the first step (0) and the last
    (total - 1) both get a learning rate above 0; before, the last reached the floor: an update of lr 0."""
    sched = SchedConfig(kind=kind, warmup_steps=10, min_lr_ratio=0.0, decay_fraction=0.2)
    assert lr_multiplier(0, sched, 100) == pytest.approx(1 / 11)
    assert lr_multiplier(10, sched, 100) == 1.0
    last = {"linear": 1 / 90, "cosine": 0.5 * (1 + math.cos(math.pi * 89 / 90)), "wsd": 1 / 20}[kind]
    assert lr_multiplier(99, sched, 100) == pytest.approx(last) and last > 0


def test_linear_decay_is_hugging_faces_after_warmup():
    """get_linear_schedule_with_warmup: lr(t) = (T - t) / (T - W) for t >= W (its warmup t / W starts at 0; ours
    (t + 1) / (W + 1) moves from the first step)."""
    sched = SchedConfig(kind="linear", warmup_steps=6, min_lr_ratio=0.0)
    assert [lr_multiplier(t, sched, 40) for t in range(6, 40)] == pytest.approx([(40 - t) / 34 for t in range(6, 40)])


def run(tmp_path, *extra, steps=4):
    cfg = compose(tiny_overrides(tmp_path, steps) + list(extra))
    train(cfg, loaders=loaders(cfg))
    return train_losses(tmp_path)


def test_activation_checkpointing_gives_the_same_losses(tmp_path):
    plain = run(tmp_path / "plain")
    recomputed = run(tmp_path / "ckpt", "model.activation_checkpointing=true")
    assert max(abs(plain[s] - recomputed[s]) for s in plain) < 1e-6


@pytest.mark.parametrize("precision, tol", [("bf16", 0.05), ("fp16", 0.02)])
def test_mixed_precision_tracks_fp32(tmp_path, precision, tol):
    """Autocast bf16, and fp16 with dynamic loss scaling, follow the fp32 run to rounding."""
    fp32 = run(tmp_path / "fp32")
    low = run(tmp_path / precision, f"train.precision={precision}")
    assert all(math.isfinite(v) for v in low.values())
    assert max(abs(fp32[s] - low[s]) for s in fp32) < tol, (fp32, low)


@pytest.mark.slow
def test_compiled_model_gives_the_same_losses(tmp_path):
    torch._dynamo.reset()
    plain = run(tmp_path / "eager")
    compiled = run(tmp_path / "compiled", "train.compile=true")
    assert max(abs(plain[s] - compiled[s]) for s in plain) < 1e-4
