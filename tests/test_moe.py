"""Mixture of experts (model/ffn=moe, top-2) and Switch (model/ffn=switch, top-1): routing, capacity,
dropped tokens, the auxiliary losses, their path to the objective and the log, checkpoint/resume, engines."""

import itertools
import math

import pytest
import torch
from omegaconf import OmegaConf

from lm.config import ConfigError
from lm.core import objectives, tracking
from lm.core.tracking import ModelMetrics
from lm.model import build_model
from lm.model.block import pre_norm
from lm.model.config import GLUConfig, SwitchConfig, model_from_saved, model_preset
from lm.model.ffn import MLP
from lm.model.flops import matmul_params, num_params
from lm.model.moe import MoE, balance_loss, expert_capacity, route, sequence_capacity
from tests.engine_support import compose, loaders, metrics, spawn, tiny_overrides, train_losses


def _moe(n_experts=4, top_k=2, capacity_factor=1.0, dim=8, **kw):
    torch.manual_seed(0)
    return MoE(
        dim,
        lambda d, bias, dropout: MLP(d, "relu", 2.0, bias=bias),
        n_experts=n_experts,
        top_k=top_k,
        capacity_factor=capacity_factor,
        **kw,
    )


def _reference(moe: MoE, x: torch.Tensor, padding=None, causal=False, capacity=None):
    """Token by token: the gate-weighted sum of the kept choices' experts (no buffers, no batching).
    capacity: slots per expert and sequence; None = the layer's training capacity."""
    real = None if padding is None else padding.bool()
    limit = (
        None
        if real is None or capacity is not None
        else sequence_capacity(real.sum(1), moe.n_experts, moe.top_k, moe.capacity_factor)
    )
    r = route(moe.router_logits(x).softmax(-1), moe.top_k, capacity or moe.capacity(x.shape[1]), real, causal, limit)
    out = torch.zeros_like(x)
    for b, t, c in itertools.product(*map(range, r.kept.shape)):
        if r.kept[b, t, c]:
            out[b, t] += r.gate[b, t, c] * moe.experts[int(r.expert[b, t, c])](x[b, t : t + 1])[0]
    return out, r


@pytest.mark.parametrize("top_k", [1, 2, 3])
@pytest.mark.parametrize("causal", [False, True])
def test_every_token_reaches_at_most_k_distinct_experts_and_capacity_holds(top_k, causal):
    g = torch.Generator().manual_seed(1)
    probs = torch.randn(2, 100, 5, generator=g).mul(2).softmax(-1)  # 2 sequences (routing groups) of 100 tokens
    C = expert_capacity(100, 5, top_k, 0.8)
    assert math.ceil(0.8 * top_k * 100 / 5) == C
    r = route(probs, top_k, C, causal=causal)
    assert r.expert.shape == r.kept.shape == (2, 100, top_k)
    assert all(len(set(row.tolist())) == top_k for row in r.expert.view(-1, top_k))  # k distinct experts per token
    for b in range(2):  # each sequence holds at most C of its own tokens per expert
        load = torch.bincount(r.expert[b][r.kept[b]], minlength=5)
        assert (load <= C).all()
    assert r.kept.logical_not().any()  # at capacity 0.8 something must drop
    kept_slots = r.slot[r.kept]
    assert kept_slots.unique().numel() == kept_slots.numel()  # no two choices share a slot
    group = torch.arange(2).view(2, 1, 1).expand_as(r.expert)
    assert ((kept_slots // C) == (r.expert * 2 + group)[r.kept]).all()  # each slot in its expert's, group's block
    assert (r.slot[~r.kept] == 5 * 2 * C).all() and (r.gate[~r.kept] == 0).all()


def test_first_choices_fill_slots_before_second_choices_in_an_encoder():
    """GShard's priority: a second choice never takes a slot a later token's first choice needed."""
    probs = torch.tensor([[[0.6, 0.4, 0.0], [0.0, 0.7, 0.3], [0.0, 0.6, 0.4]]])  # expert 1: 2nd of token 0, 1st of 1, 2
    r = route(probs, 2, capacity=2)
    assert r.kept[0, 1, 0] and r.kept[0, 2, 0] and not r.kept[0, 0, 1]


def test_a_decoder_serves_slots_in_position_order():
    """Causal: token 0's second choice keeps its slot; the later token 2 is the one dropped."""
    probs = torch.tensor([[[0.6, 0.4, 0.0], [0.0, 0.7, 0.3], [0.0, 0.6, 0.4]]])
    r = route(probs, 2, capacity=2, causal=True)
    assert r.kept[0, 0, 1] and r.kept[0, 1, 0] and not r.kept[0, 2, 0] and r.kept[0, 2, 1]


def test_pads_claim_no_slot_and_a_sequences_capacity_follows_its_real_tokens():
    probs = torch.tensor([[0.1, 0.9]]).repeat(2, 6, 1)  # every token picks expert 1
    real = torch.tensor([[True] * 6, [False, True, False, True, True, False]])
    limit = sequence_capacity(real.sum(1), 2, 1, 1.0)
    assert limit.tolist() == [3, 2]
    r = route(probs, 1, capacity=3, real=real, limit=limit)
    assert r.kept[0, :, 0].tolist() == [True, True, True, False, False, False]
    assert r.kept[1, :, 0].tolist() == [False, True, False, True, False, False]  # the first 2 real tokens
    assert (r.slot[~real] == 2 * 2 * 3).all() and (r.gate[~real] == 0).all()
    n = torch.arange(200)
    assert sequence_capacity(n, 8, 2, 1.1).tolist() == [expert_capacity(int(i), 8, 2, 1.1) for i in n]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("top_k,capacity_factor", [(1, 1.0), (2, 1.25), (2, 0.5), (1, 0.25)])
def test_layer_equals_the_token_by_token_reference(top_k, capacity_factor, causal):
    moe = _moe(top_k=top_k, capacity_factor=capacity_factor).train()
    x = torch.randn(3, 10, 8)
    padding = torch.ones(3, 10, dtype=torch.long)
    padding[1, 7:] = padding[2, :3] = 0  # right and left pads
    for pad in (None, padding):
        expected, r = _reference(moe, x, pad, causal)
        torch.testing.assert_close(moe(x, pad, causal), expected, rtol=1e-5, atol=1e-6)
        if capacity_factor < 1:
            assert (~r.kept.any(-1)).any()  # some tokens lost every choice
    assert (moe(x, padding, causal)[~padding.bool()] == 0).all()


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_evaluation_drops_nothing_and_routes_no_pad(top_k):
    moe = _moe(top_k=top_k, capacity_factor=0.25).eval()
    x = torch.randn(3, 10, 8)
    padding = torch.ones(3, 10)
    padding[0, 4:] = 0
    expected, r = _reference(moe, x, padding, capacity=10)  # as many slots as tokens: nothing can drop
    assert torch.equal(r.kept, padding.bool()[..., None].expand_as(r.kept))
    with torch.no_grad():
        torch.testing.assert_close(moe(x, padding), expected, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(moe(x)[:1, :4], moe(x[:1, :4]), rtol=1e-5, atol=1e-6)  # one token at a time too
        torch.testing.assert_close(moe(x[:1, 3:4]), moe(x)[:1, 3:4], rtol=1e-5, atol=1e-6)
        assert (moe(x, torch.zeros(3, 10)) == 0).all()


def test_evaluation_calls_every_expert_even_one_no_token_chose():
    """A sharded engine (ZeRO-3, FSDP) gathers an expert's weights inside its forward: a rank whose tokens chose
    no expert e must still call e, or the ranks' collectives stop matching (the ZeRO-3 MoE test failed on that)."""
    moe = _moe(top_k=1).eval()
    calls = [0] * moe.n_experts
    for e, expert in enumerate(moe.experts):
        expert.register_forward_hook(lambda *_, e=e: calls.__setitem__(e, calls[e] + 1))
    x = torch.randn(1, 1, 8)  # one token, top-1: one expert chosen, three not
    with torch.no_grad():
        moe(x)
        moe(x, torch.zeros(1, 1))  # nothing but pads
    assert calls == [2] * moe.n_experts


def test_top2_gates_sum_to_one_and_switch_gate_is_the_router_probability():
    probs = torch.tensor([[[0.5, 0.3, 0.2]]])
    assert torch.allclose(route(probs, 2, 4).gate, torch.tensor([[[0.625, 0.375]]]))
    assert torch.allclose(route(probs, 1, 4).gate, torch.tensor([[[0.5]]]))


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
    r = route(block.ffn.router_logits(block.norm_ffn(seen["h"])).softmax(-1), 1, block.ffn.capacity(16), causal=True)
    dropped = ~r.kept.any(-1)  # (2, 16)
    assert dropped.sum() >= 16  # capacity 0.25: at most 4 x 1 slots for each sequence's 16 tokens
    assert (seen["y"][dropped] == 0).all()
    assert torch.equal(out[dropped], seen["h"][dropped])
    assert not torch.equal(out[~dropped], seen["h"][~dropped])
    assert torch.equal(pre_norm(x, block.norm_ffn, lambda h: torch.zeros_like(h), torch.nn.Identity()), x)


def test_balance_loss_is_at_its_minimum_1_for_a_uniform_router():
    moe = _moe(n_experts=4, top_k=2).train()
    torch.nn.init.zeros_(moe.router.weight)  # every token: probability 1/4 for each expert
    moe(torch.randn(2, 16, 8))
    ((aux, m),) = moe.pop_aux()
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
    ((aux, m),) = moe.pop_aux()
    expected = torch.logsumexp(moe.router_logits(x.reshape(10, 8)), -1).pow(2).mean()
    assert m["moe/z_loss"].item() == pytest.approx(expected.item(), rel=1e-6)
    assert aux.item() == pytest.approx(1e-3 * expected.item(), rel=1e-6)


def test_pads_count_in_no_aux_loss_or_metric():
    moe = _moe(z_loss_weight=1e-3, capacity_factor=0.5).train()
    x = torch.randn(2, 6, 8)
    padding = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    moe(x, padding)
    ((aux, m),) = moe.pop_aux()
    moe(torch.cat([x[0, :4], x[1]])[None])  # the same 10 real tokens in one sequence
    ((_, whole),) = moe.pop_aux()
    for name in ("moe/z_loss", "moe/balance_loss", "moe/load_e0", "moe/load_e3"):
        assert m[name].item() == pytest.approx(whole[name].item(), rel=1e-5), name
    x[0, 4:] = 1e3  # pads' states (whatever they are) move nothing
    moe(x, padding)
    ((aux_again, again),) = moe.pop_aux()
    assert aux_again.item() == pytest.approx(aux.item(), rel=1e-6)
    assert {k: v.item() for k, v in again.items()} == pytest.approx({k: v.item() for k, v in m.items()})


def test_aux_loss_reaches_the_objective_and_metrics_reach_the_log_only_in_training():
    cfg = model_preset("tiny", ["model/ffn=moe", "model.ffn.aux_loss_weight=0.5"])
    torch.manual_seed(0)
    model = build_model(cfg)
    x = torch.randint(0, 256, (2, 16))
    out = model(input_ids=x, labels=x)
    assert out.aux_loss is not None and out.aux_loss.requires_grad
    assert set(out.metrics) >= {
        "moe/balance_loss",
        "moe/dropped_tokens",
        "moe/dropped_choices",
        "moe/load_e0",
        "moe/load_e7",
    }
    assert sum(out.metrics[f"moe/load_e{e}"] for e in range(8)).item() == pytest.approx(1.0)
    # sum over the 2 layers of 0.5 * balance, and metrics are the layer mean
    sink = ModelMetrics()  # the loop's, handed to the task's loss: no module global carries them
    loss = objectives.loss(model, {"input_ids": x, "labels": x}, sink)
    assert loss.item() == pytest.approx((out.loss + out.aux_loss).item(), rel=1e-6)
    assert out.aux_loss.item() == pytest.approx(2 * 0.5 * out.metrics["moe/balance_loss"].item(), rel=1e-5)
    logged = sink.pop()
    assert logged["moe/balance_loss"] == pytest.approx(out.metrics["moe/balance_loss"].item(), rel=1e-5)
    model.eval()
    with torch.no_grad():
        out = model(input_ids=x, labels=x)
    assert out.aux_loss is None and out.metrics == {}
    assert objectives.loss(model, {"input_ids": x, "labels": x}, sink).item() == pytest.approx(out.loss.item())
    assert sink.pop() == {}
    assert not hasattr(tracking, "MODEL_METRICS")


def test_model_metrics_average_over_forwards_and_ranks():
    mm = ModelMetrics()
    mm.add({"a": torch.tensor(1.0)})
    mm.add({"a": torch.tensor(3.0)})
    assert mm.pop(lambda t: t * 2) == {"a": 2.0}  # two "ranks" of identical sums: the same mean
    assert mm.pop() == {}


def test_activation_checkpointing_gives_the_same_gradients_with_the_aux_loss():
    grads = []
    for ckpt in ("false", "true"):
        cfg = model_preset(
            "tiny", ["model/ffn=moe", f"model.activation_checkpointing={ckpt}", "model.ffn.z_loss_weight=0.01"]
        )
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
    cfg = model_preset(
        "tiny",
        [
            "model/ffn=switch",
            "model/ffn@model.ffn.expert=swiglu",
            "model.ffn.expert.hidden_mult=2",
            "model.ffn.n_experts=3",
        ],
    )
    assert type(cfg.ffn) is SwitchConfig and type(cfg.ffn.expert) is GLUConfig
    ffn = build_model(cfg).decoder.blocks[1].ffn
    assert len(ffn.experts) == 3 and ffn.experts[0].gate_up.out_features == 2 * 2 * 64
    saved = OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True)
    again = model_from_saved(saved)
    assert type(again.ffn) is SwitchConfig and type(again.ffn.expert) is GLUConfig and again == cfg


@pytest.mark.parametrize(
    "override,field",
    [
        ("model.ffn.capacity_factor=0", "model.ffn.capacity_factor"),
        ("model.ffn.capacity_factor=-1", "model.ffn.capacity_factor"),
        ("model.ffn.top_k=9", "model.ffn.top_k"),
        ("model.ffn.n_experts=0", "model.ffn.n_experts"),
        ("model.ffn.hidden_mult=2", "model.ffn.expert.hidden_mult"),
        ("model.ffn.aux_loss_weight=-0.1", "model.ffn.aux_loss_weight"),
        ("model/ffn@model.ffn.expert=switch", "model.ffn.expert is an MoE"),
    ],
)
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


# -- lm train: checkpoint/resume and engines ------------------------------------------------------------


def _train(run_dir, steps, extra=()):
    from lm.cli.train import train

    cfg = compose(
        tiny_overrides(run_dir, steps)
        + ["model/ffn=moe", "model.ffn.n_experts=4", "model.ffn.capacity_factor=1.0", *extra]
    )
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


@pytest.mark.parametrize(
    "override,named",
    [
        ("model/ffn=switch", "model/ffn=switch"),
        ("model/block=pkm", "model/block=pkm"),
    ],
)
def test_hugging_face_export_refuses_sparse_options_by_name(override, named):
    pytest.importorskip("transformers")
    from lm.model.convert import to_hf

    model = build_model(model_preset("gpt2", ["model.n_layers=1", "model.dim=64", "model.n_heads=2", override]))
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        to_hf(model)


# -- a token's output depends only on what it may see (issue 49) ------------------------------------------


def _lm(option: str, arch: str = "decoder", extra=()):
    torch.manual_seed(0)
    return build_model(model_preset("tiny", [f"model/ffn={option}", f"model.arch={arch}", *extra]))


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("option", ["moe", "switch"])
def test_a_decoder_stays_causal_under_routing(option, mode):
    """Perturbing positions >= k leaves the logits at positions < k exactly as they were, with the
    default capacity dropping choices in training (claims are served in position order)."""
    model = _lm(option).train(mode == "train")
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (4, 32), generator=g)
    with torch.no_grad():
        base = model(input_ids=x)
        if mode == "train":
            assert base.metrics["moe/dropped_choices"] > 0  # capacity binds: the test is not vacuous
        for k in (1, 6, 20):
            y = x.clone()
            y[:, k:] = torch.randint(0, 256, (4, 32 - k), generator=g)
            logits = model(input_ids=y).logits
            torch.testing.assert_close(logits[:, :k], base.logits[:, :k], rtol=0, atol=1e-5)
            assert (logits[:, k:] - base.logits[:, k:]).abs().max() > 1e-2


@pytest.mark.parametrize("extra", [[], ["model/stack=funnel", "model.stack.blocks=[1,1]"]], ids=["plain", "funnel"])
@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("option", ["moe", "switch"])
def test_an_encoders_pads_take_no_capacity_and_its_batch_neighbours_do_not_matter(option, mode, extra):
    """Each sequence alone, unpadded, gives the same outputs at its real positions as inside a
    right-padded batch of other lengths: pads are not routed and take no slot, capacity follows a
    sequence's own real tokens, and sequences do not compete for slots (a Funnel's pooled blocks too)."""
    model = _lm(option, "encoder", extra).train(mode == "train")
    g = torch.Generator().manual_seed(0)
    lengths = [24, 13, 7]
    batch = torch.zeros(3, 28, dtype=torch.long)  # pad id 0
    mask = torch.zeros(3, 28, dtype=torch.long)
    rows = [torch.randint(1, 256, (n,), generator=g) for n in lengths]
    for i, row in enumerate(rows):
        batch[i, : len(row)], mask[i, : len(row)] = row, 1
    with torch.no_grad():
        padded = model(input_ids=batch, attention_mask=mask)
        if mode == "train":
            assert padded.metrics["moe/dropped_choices"] > 0  # capacity binds: the test is not vacuous
        for i, row in enumerate(rows):
            alone = model(input_ids=row[None]).logits[0]
            torch.testing.assert_close(padded.logits[i, : len(row)], alone, rtol=0, atol=1e-5)


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
@pytest.mark.parametrize("option", ["moe", "switch"])
def test_cached_generation_equals_full_recompute(option, arch):
    """Generation routes one new token per step; evaluation drops nothing, so every step's logits equal
    those of the whole sequence at once, and greedy decoding picks the same tokens either way."""
    from lm.model.generate import generate

    model = _lm(option, arch).eval()
    prompt = torch.randint(1, 256, (4, 10), generator=torch.Generator().manual_seed(0))
    tokens = generate(model, prompt, 24)
    with torch.no_grad():
        cache = model.new_cache()
        if arch == "decoder":
            state, fed, full = None, prompt, model(torch.cat([prompt, tokens], 1)).logits[:, 9:-1]
        else:
            state, fed = (model.encode(prompt), None), torch.zeros_like(prompt[:, :1])
            full = model(prompt, decoder_input_ids=torch.cat([fed, tokens[:, :-1]], 1)).logits
        steps = []
        for t in range(24):
            steps.append(model.next_logits(fed, cache, state))
            fed = tokens[:, t : t + 1]
    torch.testing.assert_close(torch.stack(steps, 1), full, rtol=0, atol=1e-4)
    assert torch.equal(full.argmax(-1), tokens)  # greedy by full recompute picks the generated tokens
