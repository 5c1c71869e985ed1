"""Mixture of experts (model/ffn=moe, top-2) and Switch (model/ffn=switch, top-1): routing, capacity,
dropped tokens, the auxiliary losses, their path to the objective and the log, checkpoint/resume, engines."""

import math

import pytest
import torch
from omegaconf import OmegaConf

from lm.config import ConfigError
from lm.core import objectives
from lm.core.tracking import MODEL_METRICS, ModelMetrics
from lm.model import build_model
from lm.model.block import Block, pre_norm
from lm.model.config import GLUConfig, MoEConfig, SwitchConfig, model_from_saved, model_preset
from lm.model.flops import matmul_params, num_params
from lm.model.ffn import MLP
from lm.model.moe import MoE, balance_loss, expert_capacity, route
from tests.engine_support import compose, loaders, metrics, spawn, tiny_overrides, train_losses


def _moe(n_experts=4, top_k=2, capacity_factor=1.0, dim=8, **kw):
    torch.manual_seed(0)
    return MoE(dim, lambda d, bias, dropout: MLP(d, "relu", 2.0, bias=bias), n_experts=n_experts, top_k=top_k,
               capacity_factor=capacity_factor, **kw)


def _reference(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """Token by token: the gate-weighted sum of the kept choices' experts (no buffers, no batching)."""
    tokens = x.reshape(-1, x.shape[-1])
    r = route(moe.router_logits(tokens).softmax(-1), moe.top_k, moe.capacity(tokens.shape[0]))
    out = torch.zeros_like(tokens)
    for n in range(tokens.shape[0]):
        for c in range(moe.top_k):
            if r.kept[n, c]:
                out[n] += r.gate[n, c] * moe.experts[int(r.expert[n, c])](tokens[n:n + 1])[0]
    return out.view_as(x), r


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_every_token_reaches_at_most_k_distinct_experts_and_capacity_holds(top_k):
    g = torch.Generator().manual_seed(1)
    probs = torch.randn(200, 5, generator=g).mul(2).softmax(-1)
    C = expert_capacity(200, 5, top_k, 0.8)
    assert C == math.ceil(0.8 * top_k * 200 / 5)
    r = route(probs, top_k, C)
    assert r.expert.shape == r.kept.shape == (200, top_k)
    assert all(len(set(row.tolist())) == top_k for row in r.expert)  # k distinct experts per token
    assert (r.kept.sum(1) <= top_k).all()
    load = torch.zeros(5, dtype=torch.long).index_add(0, r.expert[r.kept], torch.ones_like(r.expert[r.kept]))
    assert (load <= C).all() and r.kept.logical_not().any()  # at capacity 0.8 something must drop
    kept_slots = r.slot[r.kept]
    assert kept_slots.unique().numel() == kept_slots.numel()  # no two choices share a slot
    assert ((kept_slots // C) == r.expert[r.kept]).all()  # each slot lies in its expert's block
    assert (r.slot[~r.kept] == 5 * C).all() and (r.gate[~r.kept] == 0).all()


def test_first_choices_fill_slots_before_second_choices():
    """GShard's priority: a second choice never takes a slot a later token's first choice needed."""
    probs = torch.tensor([[0.6, 0.4, 0.0], [0.0, 0.7, 0.3], [0.0, 0.6, 0.4]])  # expert 1: 2nd of token 0, 1st of 1, 2
    r = route(probs, 2, capacity=2)
    assert r.kept[1, 0] and r.kept[2, 0] and not r.kept[0, 1]


@pytest.mark.parametrize("top_k,capacity_factor", [(1, 1.0), (2, 1.25), (2, 0.5), (1, 0.25)])
def test_layer_equals_the_token_by_token_reference(top_k, capacity_factor):
    moe = _moe(top_k=top_k, capacity_factor=capacity_factor).train()
    x = torch.randn(3, 10, 8)
    expected, r = _reference(moe, x)
    torch.testing.assert_close(moe(x), expected, rtol=1e-5, atol=1e-6)
    if capacity_factor < 1:
        assert (~r.kept.any(1)).any()  # some tokens lost every choice


def test_top2_gates_sum_to_one_and_switch_gate_is_the_router_probability():
    probs = torch.tensor([[0.5, 0.3, 0.2]])
    assert torch.allclose(route(probs, 2, 4).gate, torch.tensor([[0.625, 0.375]]))
    assert torch.allclose(route(probs, 1, 4).gate, torch.tensor([[0.5]]))


def test_dropped_tokens_pass_through_the_residual_unchanged():
    """A pre-norm block: tokens that lost every choice leave the FFN sub-layer exactly as they entered it."""
    torch.manual_seed(0)
    cfg = model_preset("tiny", ["model/ffn=switch", "model.ffn.capacity_factor=0.25", "model.ffn.n_experts=4"])
    block = build_model(cfg).decoder.blocks[0].train()
    seen = {}
    block.norm_ffn.register_forward_hook(lambda m, inp, out: seen.update(h=inp[0].detach()))
    block.ffn.register_forward_hook(lambda m, inp, out: seen.update(y=out.detach()))
    x = torch.randn(2, 16, cfg.dim)
    out = block(x, True, None, lambda q, k: (q, k))
    tokens = seen["h"].reshape(-1, cfg.dim)
    r = route(block.ffn.router_logits(block.norm_ffn(tokens)).softmax(-1), 1, block.ffn.capacity(32))
    dropped = ~r.kept.any(1)
    assert dropped.sum() >= 16  # capacity 0.25: at most 4 x 2 slots for 32 tokens
    assert (seen["y"].reshape(-1, cfg.dim)[dropped] == 0).all()
    assert torch.equal(out.reshape(-1, cfg.dim)[dropped], tokens[dropped])
    assert not torch.equal(out.reshape(-1, cfg.dim)[~dropped], tokens[~dropped])
    assert torch.equal(pre_norm(x, block.norm_ffn, lambda h: torch.zeros_like(h), torch.nn.Identity()), x)


def test_balance_loss_is_at_its_minimum_1_for_a_uniform_router():
    moe = _moe(n_experts=4, top_k=2).train()
    torch.nn.init.zeros_(moe.router.weight)  # every token: probability 1/4 for each expert
    moe(torch.randn(2, 16, 8))
    (aux, m), = moe.pop_aux()
    assert m["moe/balance_loss"].item() == pytest.approx(1.0, abs=1e-6)
    assert aux.item() == pytest.approx(0.01, abs=1e-8)  # aux_loss_weight * 1
    # a perfectly balanced hard assignment with matching probabilities is also at 1; skew raises it
    onehot = torch.eye(4).repeat(8, 1)  # 32 tokens, 8 per expert
    assert balance_loss(onehot * 0.7 + 0.075, onehot.argmax(1, keepdim=True)).item() == pytest.approx(1.0)
    skewed = torch.tensor([[0.7, 0.1, 0.1, 0.1]]).repeat(32, 1)
    assert balance_loss(skewed, skewed.argmax(1, keepdim=True)).item() == pytest.approx(4 * 0.7)


def test_z_loss_is_the_mean_squared_log_partition_and_is_weighted():
    moe = _moe(z_loss_weight=1e-3, aux_loss_weight=0.0).train()
    x = torch.randn(2, 5, 8)
    moe(x)
    (aux, m), = moe.pop_aux()
    expected = torch.logsumexp(moe.router_logits(x.reshape(10, 8)), -1).pow(2).mean()
    assert m["moe/z_loss"].item() == pytest.approx(expected.item(), rel=1e-6)
    assert aux.item() == pytest.approx(1e-3 * expected.item(), rel=1e-6)


def test_aux_loss_reaches_the_objective_and_metrics_reach_the_log_only_in_training():
    cfg = model_preset("tiny", ["model/ffn=moe", "model.ffn.aux_loss_weight=0.5"])
    torch.manual_seed(0)
    model = build_model(cfg)
    x = torch.randint(0, 256, (2, 16))
    out = model(input_ids=x, labels=x)
    assert out.aux_loss is not None and out.aux_loss.requires_grad
    assert set(out.metrics) >= {"moe/balance_loss", "moe/dropped_tokens", "moe/dropped_choices", "moe/load_e0",
                                "moe/load_e7"}
    assert sum(out.metrics[f"moe/load_e{e}"] for e in range(8)).item() == pytest.approx(1.0)
    # sum over the 2 layers of 0.5 * balance, and metrics are the layer mean
    MODEL_METRICS.clear()
    loss = objectives.loss(model, {"input_ids": x, "labels": x})
    assert loss.item() == pytest.approx((out.loss + out.aux_loss).item(), rel=1e-6)
    assert out.aux_loss.item() == pytest.approx(2 * 0.5 * out.metrics["moe/balance_loss"].item(), rel=1e-5)
    logged = MODEL_METRICS.pop()
    assert logged["moe/balance_loss"] == pytest.approx(out.metrics["moe/balance_loss"].item(), rel=1e-5)
    model.eval()
    with torch.no_grad():
        out = model(input_ids=x, labels=x)
    assert out.aux_loss is None and out.metrics == {}
    assert objectives.loss(model, {"input_ids": x, "labels": x}).item() == pytest.approx(out.loss.item())
    assert MODEL_METRICS.pop() == {}


def test_model_metrics_average_over_forwards_and_ranks():
    mm = ModelMetrics()
    mm.add({"a": torch.tensor(1.0)})
    mm.add({"a": torch.tensor(3.0)})
    assert mm.pop(lambda t: t * 2) == {"a": 2.0}  # two "ranks" of identical sums: the same mean
    assert mm.pop() == {}


def test_activation_checkpointing_gives_the_same_gradients_with_the_aux_loss():
    grads = []
    for ckpt in ("false", "true"):
        cfg = model_preset("tiny", ["model/ffn=moe", f"model.activation_checkpointing={ckpt}",
                                    "model.ffn.z_loss_weight=0.01"])
        torch.manual_seed(0)
        model = build_model(cfg)
        x = torch.randint(0, 256, (2, 16))
        objectives.loss(model, {"input_ids": x, "labels": x}).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        assert all(model.decoder.blocks[i].ffn._aux == [] for i in range(2))  # nothing stale kept
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-5, atol=1e-7)
    assert grads[0]["decoder.blocks.0.ffn.router.weight"].abs().sum() > 0


def test_experts_hold_any_ffn_option_and_the_saved_config_round_trips():
    cfg = model_preset("tiny", ["model/ffn=switch", "model/ffn@model.ffn.expert=swiglu",
                                "model.ffn.expert.hidden_mult=2", "model.ffn.n_experts=3"])
    assert type(cfg.ffn) is SwitchConfig and type(cfg.ffn.expert) is GLUConfig
    ffn = build_model(cfg).decoder.blocks[1].ffn
    assert len(ffn.experts) == 3 and ffn.experts[0].gate_up.out_features == 2 * 2 * 64
    saved = OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True)
    again = model_from_saved(saved)
    assert type(again.ffn) is SwitchConfig and type(again.ffn.expert) is GLUConfig and again == cfg


@pytest.mark.parametrize("override,field", [
    ("model.ffn.capacity_factor=0", "model.ffn.capacity_factor"),
    ("model.ffn.capacity_factor=-1", "model.ffn.capacity_factor"),
    ("model.ffn.top_k=9", "model.ffn.top_k"),
    ("model.ffn.n_experts=0", "model.ffn.n_experts"),
    ("model.ffn.hidden_mult=2", "model.ffn.expert.hidden_mult"),
    ("model.ffn.aux_loss_weight=-0.1", "model.ffn.aux_loss_weight"),
    ("model/ffn@model.ffn.expert=switch", "model.ffn.expert is an MoE"),
])
def test_undefined_combinations_are_refused_before_building(override, field):
    cfg = model_preset("tiny", ["model/ffn=moe", override])
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        build_model(cfg)


def test_flops_count_only_the_active_experts():
    dense = model_preset("tiny", [])
    per_expert = 2 * 64 * 256  # MLP up + down at hidden 4 * 64
    for option, k in (("moe", 2), ("switch", 1)):
        cfg = model_preset("tiny", [f"model/ffn={option}"])
        router = 64 * 8
        assert matmul_params(cfg) == matmul_params(dense) + 2 * (router + (k - 1) * per_expert)
        assert num_params(cfg) > num_params(dense) + 2 * 7 * per_expert  # but all 8 experts are parameters


# -- lm-train: checkpoint/resume and engines ------------------------------------------------------------

def _train(run_dir, steps, extra=()):
    from lm.cli.train import train

    cfg = compose(tiny_overrides(run_dir, steps) + ["model/ffn=moe", "model.ffn.n_experts=4",
                                                    "model.ffn.capacity_factor=1.0", *extra])
    return train(cfg, loaders=loaders(cfg))


def test_lm_train_logs_expert_load_and_resumes_exactly(tmp_path):
    extra = ["sched=constant", "model.ffn.z_loss_weight=0.001"]
    _train(tmp_path / "whole", 6, extra)
    _train(tmp_path / "split", 3, extra)
    _train(tmp_path / "split", 6, extra)
    whole, split = train_losses(tmp_path / "whole"), train_losses(tmp_path / "split")
    assert list(split) == list(range(1, 7)) and split == whole
    logged = [m for m in metrics(tmp_path / "whole") if "loss" in m]
    assert all(0 <= m["moe/dropped_tokens"] <= m["moe/dropped_choices"] <= 1 for m in logged)
    assert all(sum(m[f"moe/load_e{e}"] for e in range(4)) == pytest.approx(1, abs=1e-5) for m in logged)
    assert all("moe/balance_loss" not in m for m in metrics(tmp_path / "whole") if "val_loss" in m)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("engine", ["ddp", "zero3", "fsdp2"])
def test_data_parallel_engines_train_moe_like_one_process(engine, tmp_path):
    """2 gloo ranks x micro-batch 2 run the same forwards as one process with 2 micro-batches of 2
    (engine_support's sample layout), and routing/capacity are per forward: so the losses, aux loss
    included, and the logged expert loads match the single process. Experts are replicated (DDP, no
    unused parameters) or sharded like any weight (ZeRO-3, FSDP2)."""
    from lm.cli.train import train

    moe = ["model/ffn=moe", "model.ffn.n_experts=4", "model.ffn.capacity_factor=1.0", "optim.lr=1e-2"]
    cfg = compose(tiny_overrides(tmp_path / "single", 6, micro_batch_size=2, grad_accum=2) + moe)
    train(cfg, loaders=loaders(cfg))
    reports = spawn(2, tiny_overrides(tmp_path / "dist", 6, micro_batch_size=2) + [f"engine={engine}", *moe])
    info = [r[2] for r in reports]
    assert [i["world_size"] for i in info] == [2, 2]
    if engine in ("zero3", "fsdp2"):
        total = sum(i["local_numel"] for i in info)
        assert all(0.4 < i["local_numel"] / total < 0.6 for i in info)
    single, dist = train_losses(tmp_path / "single"), train_losses(tmp_path / "dist")
    assert list(dist) == list(range(1, 7))
    assert max(abs(dist[s] - single[s]) for s in single) < 1e-5 and single[6] < single[1]
    logged = {m["step"]: m for m in metrics(tmp_path / "dist") if "loss" in m}
    for m in (m for m in metrics(tmp_path / "single") if "loss" in m):
        assert logged[m["step"]]["moe/load_e0"] == pytest.approx(m["moe/load_e0"], abs=1e-5)
        assert logged[m["step"]]["moe/dropped_tokens"] == pytest.approx(m["moe/dropped_tokens"], abs=1e-5)


@pytest.mark.parametrize("override,named", [("model/ffn=switch", "model/ffn=switch"),
                                            ("model/block=pkm", "model/block=pkm"),
                                            ])
def test_hugging_face_export_refuses_sparse_options_by_name(override, named):
    pytest.importorskip("transformers")
    from lm.model.convert import to_hf

    model = build_model(model_preset("gpt2", ["model.n_layers=1", "model.dim=64", "model.n_heads=2", override]))
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        to_hf(model)
