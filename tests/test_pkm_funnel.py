"""Product-key memory (model/block=pkm) and the Funnel encoder (model/stack=funnel), both in lm/zoo: their defining
properties, refused combinations, Params/Ops, and training through lm train with resume."""

import json

import pytest
import torch

from lm.config import ConfigError
from lm.model import build_model
from lm.model.config import model_preset
from lm.model.flops import attention_flops_per_token, matmul_params, num_params
from lm.zoo.funnel import FunnelStack, attention_layers, pair_weights, pool
from lm.zoo.pkm import ProductKeyMemory, product_topk
from tests.engine_support import compose, loaders, metrics, tiny_overrides, train_losses

# -- product-key memory ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n,k,seed", [(5, 1, 0), (8, 3, 1), (16, 16, 2), (32, 7, 3)])
def test_product_topk_equals_brute_force_over_all_key_pairs(n, k, seed):
    g = torch.Generator().manual_seed(seed)
    s1, s2 = torch.randn(6, 3, n, generator=g), torch.randn(6, 3, n, generator=g)
    scores, slots = product_topk(s1, s2, k)
    every = (s1[..., :, None] + s2[..., None, :]).flatten(-2)  # (6, 3, n*n): slot i*n + j
    best, best_slots = every.topk(k, dim=-1)
    torch.testing.assert_close(scores, best)
    assert torch.equal(every.gather(-1, slots), scores)  # the slots really hold those scores
    assert torch.equal(slots.sort(-1).values, best_slots.sort(-1).values)  # continuous scores: no ties


def test_memory_reads_the_softmax_weighted_values_of_the_best_full_keys():
    torch.manual_seed(0)
    mem = ProductKeyMemory(dim=12, n_keys=6, heads=2, k_dim=8, top_k=3)
    x = torch.randn(2, 5, 12)
    q = mem.query(x.reshape(10, 12)).view(10, 2, 8)
    expected = torch.zeros(10, 12)
    for h in range(2):
        # the n_keys**2 full keys: concatenations of one sub-key of each half, slot i * n_keys + j
        full = torch.cat([mem.keys[h, 0][:, None].expand(6, 6, 4), mem.keys[h, 1][None].expand(6, 6, 4)], -1)
        scores, slots = (q[:, h] @ full.reshape(36, 8).T).topk(3, dim=-1)
        expected += (scores.softmax(-1)[..., None] * mem.values.weight[slots]).sum(1)
    torch.testing.assert_close(mem(x), expected.view(2, 5, 12), rtol=1e-5, atol=1e-6)


def test_pkm_replaces_the_ffn_only_in_the_chosen_layers_and_trains():
    cfg = model_preset(
        "tiny",
        [
            "model.n_layers=3",
            "model/block=pkm",
            "model.block.layers=[1]",
            "model.block.n_keys=16",
        ],
    )
    torch.manual_seed(0)
    model = build_model(cfg)
    kinds = [type(b.ffn).__name__ for b in model.decoder.blocks]
    assert kinds == ["MLP", "ProductKeyMemory", "MLP"]
    x = torch.randint(0, 256, (4, 16))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = model(input_ids=x, labels=x).loss.item()
    for _ in range(20):
        loss = model(input_ids=x, labels=torch.roll(x, -1, 1)).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert all(p.grad is not None for p in model.parameters())
    assert loss.item() < 0.7 * first


@pytest.mark.parametrize(
    "override,field",
    [
        ("model.block.layers=[2]", "model.block.layers"),
        ("model.block.layers=[1,1]", "model.block.layers"),
        ("model.block.layers=[]", "model.block.layers"),
        ("model.block.k_dim=7", "model.block.k_dim"),
        ("model.block.top_k=100", "model.block.top_k"),
    ],
)
def test_pkm_refuses_undefined_settings(override, field):
    cfg = model_preset("tiny", ["model/block=pkm", "model.block.layers=[0]", override])
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        build_model(cfg)


def test_pkm_layers_range_is_the_stack_options_not_a_funnel_special_case():
    """PKM's layers may name any block a model/stack option builds (its layer_indices), not only Funnel's: a stack
    option with one extra block per stack admits layer n_layers, the plain stack refuses it."""
    from dataclasses import dataclass, replace

    from lm.model.options import StackConfig

    @dataclass
    class OneMore(StackConfig):
        def layer_indices(self, n_layers: int) -> int:
            return n_layers + 1

    cfg = model_preset("tiny", ["model/block=pkm", "model.block.layers=[2]"])  # tiny: 2 layers
    with pytest.raises(ConfigError, match=r"model\.block\.layers=\[2\] must be distinct block indices in \[0, 2\)"):
        cfg.block.check(cfg)
    cfg.block.check(replace(cfg, stack=OneMore()))  # admitted: the option builds block 2
    funnel = model_preset(
        "tiny", ["model.arch=encoder", "model/stack=funnel", "model.stack.blocks=[1,1]", "model/block=pkm"]
    )
    for layer in (3, 4):  # 2 groups + 2 up-sampling blocks: 0..3
        m = replace(funnel, block=replace(funnel.block, layers=[layer]))
        if layer == 3:
            m.block.check(m)
        else:
            with pytest.raises(ConfigError, match=r"in \[0, 4\)"):
                m.block.check(m)


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_pkm_query_batchnorm_is_refused_in_a_causal_stack(arch):
    """Training's batch statistics mix later tokens' queries into earlier tokens' reads."""
    cfg = model_preset("tiny", [f"model.arch={arch}", "model/block=pkm", "model.block.query_batchnorm=true"])
    with pytest.raises(ConfigError, match=r"model\.block\.query_batchnorm"):
        build_model(cfg)


def test_pkm_query_batchnorm_statistics_leave_the_pads_out():
    """In training, an encoder's pads change neither a real token's output nor the running statistics."""
    cfg = model_preset("tiny", ["model.arch=encoder", "model/block=pkm", "model.block.query_batchnorm=true"])
    torch.manual_seed(0)
    model = build_model(cfg).train()
    g = torch.Generator().manual_seed(0)
    ids, mask = torch.randint(1, 256, (3, 20), generator=g), torch.ones(3, 20, dtype=torch.long)
    mask[1, 9:], mask[2, 4:] = 0, 0
    other = torch.where(mask.bool(), ids, torch.randint(1, 256, (3, 20), generator=g))  # other pad tokens
    bn = model.encoder.blocks[0].ffn.query_norm
    outs, means = [], []
    for batch in (ids, other):
        bn.reset_running_stats()
        with torch.no_grad():
            outs.append(model(input_ids=batch, attention_mask=mask).logits)
        means.append(bn.running_mean.clone())
    real = mask.bool()
    assert (outs[0][real] - outs[1][real]).abs().max() < 1e-5  # was 0.38: the pads' queries set the statistics
    torch.testing.assert_close(means[0], means[1], rtol=0, atol=1e-6)
    assert means[0].abs().max() > 1e-3  # the statistics did update


def test_pkm_ops_count_the_lookups_not_the_table():
    dense = model_preset("tiny", [])
    cfg = model_preset(
        "tiny",
        [
            "model/block=pkm",
            "model.block.layers=[0]",
            "model.block.n_keys=32",
            "model.block.heads=2",
            "model.block.k_dim=16",
            "model.block.top_k=4",
        ],
    )
    mlp = 2 * 64 * 256
    query, keys, reads = 64 * 2 * 16, 2 * 32 * 16, 2 * 4 * 64
    assert matmul_params(cfg) == matmul_params(dense) - mlp + query + keys + reads
    table = 32**2 * 64
    assert num_params(cfg) == num_params(dense) - (mlp + 256 + 64) + (query + 32) + 2 * 2 * 32 * 8 + table


# -- Funnel ----------------------------------------------------------------------------------------------


def _funnel(blocks="[1,1,1]", extra=()):
    cfg = model_preset(
        "tiny",
        [
            "model.arch=encoder",
            f"model.n_layers={sum(eval(blocks))}",
            "model/stack=funnel",
            f"model.stack.blocks={blocks}",
            *extra,
        ],
    )
    torch.manual_seed(0)
    return cfg, build_model(cfg).eval()


def test_sequence_length_halves_per_group_and_is_restored_for_tokens():
    cfg, model = _funnel("[2,1,1]", ["model.stack.decoder_layers=2"])
    lengths = []
    for block in model.encoder.blocks:
        block.register_forward_hook(lambda m, inp, out: lengths.append(out.shape[1]))
    x = torch.randint(0, 256, (2, 16))
    out = model(input_ids=x)
    assert lengths == [16, 16, 8, 4, 16, 16] and out.logits.shape == (2, 16, 256)
    lengths.clear()
    h, padding = model.classify_features(x)
    assert lengths == [16, 16, 8, 4] and h.shape == (2, 4, 64) and padding is None  # no up-sampling blocks ran
    lengths.clear()
    model(input_ids=x[:, :13], labels=x[:, :13])  # odd lengths: 13 -> 7 -> 4
    assert lengths == [13, 13, 7, 4, 13, 13]


def test_query_pooling_attends_over_the_unpooled_keys():
    """The pooling block's attention gets T/2 queries and all T keys/values, and returns T/2 positions."""
    cfg, model = _funnel("[1,1]")
    seen = {}
    model.encoder.blocks[1].self_attn.register_forward_hook(lambda m, inp, out: seen.update(q=out.shape))
    inner = model.encoder.blocks[1].self_attn.attend
    model.encoder.blocks[1].self_attn.attend = lambda q, k, v, mask, is_causal: (
        seen.update(qk=(q.shape[2], k.shape[2])),
        inner(q, k, v, mask, is_causal),
    )[1]
    model(input_ids=torch.randint(0, 256, (2, 10)))
    assert seen["qk"] == (5, 10) and seen["q"] == (2, 5, 64)


def test_padding_is_pooled_consistently():
    """Pads never reach real positions: the real tokens' outputs and the pooled path do not depend on
    what the pads hold, and a pooled position is real when either of its pair is."""
    cfg, model = _funnel("[1,1,1]")
    x = torch.randint(8, 256, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 7:] = 0  # 7 real tokens -> 4 pooled -> 2
    y = x.clone()
    y[1, 7:] = torch.randint(8, 256, (5,))
    with torch.no_grad():
        a, b = model(input_ids=x, attention_mask=mask).logits, model(input_ids=y, attention_mask=mask).logits
        (ha, pa), (hb, pb) = model.classify_features(x, mask), model.classify_features(y, mask)
    torch.testing.assert_close(a[mask.bool()], b[mask.bool()], rtol=1e-5, atol=1e-5)
    assert torch.equal(pa, pb) and pa.tolist() == [[1, 1, 1], [1, 1, 0]]
    torch.testing.assert_close(ha[pa.bool()], hb[pb.bool()], rtol=1e-5, atol=1e-5)
    w = pair_weights(mask.float())
    assert w[1, 3].tolist() == [1.0, 0.0] and w[1, 4].tolist() == [0.0, 0.0]  # (real, pad) -> the real one
    t = torch.arange(12.0).view(1, 12, 1).repeat(2, 1, 1)
    assert pool(t, w, 1)[1, :4, 0].tolist() == [0.5, 2.5, 4.5, 6.0]


def test_funnel_classifier_and_encoder_decoder_memory():
    from lm.model.lm import SequenceClassifier

    cfg, model = _funnel("[1,1]")
    clf = SequenceClassifier(model, n_labels=3)
    out = clf(torch.randint(0, 256, (2, 10)), labels=torch.tensor([0, 2]))
    out.loss.backward()
    assert out.logits.shape == (2, 3)
    assert model.encoder.blocks[-1].self_attn.qkv.weight.grad is None  # the up-sampling blocks did not run
    cfg = model_preset("tiny", ["model.arch=encoder_decoder", "model/stack=funnel", "model.stack.blocks=[1,1]"])
    ed = build_model(cfg)
    assert isinstance(ed.encoder, FunnelStack) and not isinstance(ed.decoder, FunnelStack)
    x = torch.randint(0, 256, (2, 12))
    assert ed(input_ids=x, labels=x[:, :6]).logits.shape == (2, 6, 256)


@pytest.mark.parametrize(
    "overrides,field",
    [
        (["model.arch=decoder", "model.stack.blocks=[1,1]"], "model.arch=decoder"),
        (["model.arch=encoder", "model.stack.blocks=[1,2]"], "model.stack.blocks"),
        (["model.arch=encoder"], "model.stack.blocks"),  # the option picked, its groups not set
        (["model.arch=encoder", "model.stack.blocks=[1,1]", "model/pos=rope"], "model/pos"),
        (["model.arch=encoder", "model.stack.blocks=[1,1]", "model.stack.decoder_layers=-1"], "decoder_layers"),
    ],
)
def test_funnel_refuses_undefined_combinations(overrides, field):
    cfg = model_preset("tiny", ["model/stack=funnel", *overrides])
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        build_model(cfg)


@pytest.mark.parametrize("n_layers,example", [(2, "[1,1]"), (3, "[1,2]"), (1, "[1]")])
def test_funnel_without_groups_names_a_setting_that_works(n_layers, example):
    """The preset leaves model.stack.blocks empty; the refusal gives one that sums to n_layers, which builds."""
    base = ["model/stack=funnel", "model.arch=encoder", f"model.n_layers={n_layers}"]
    with pytest.raises(ConfigError, match=rf"e\.g\. model\.stack\.blocks=\{example[:-1]}\]$") as e:
        build_model(model_preset("tiny", base))
    fix = str(e.value).rsplit(" ", 1)[1]
    model = build_model(model_preset("tiny", [*base, fix]))
    assert model.encoder.groups == json.loads(example)


def test_funnel_ops_scale_with_the_pooled_lengths():
    cfg = model_preset(
        "tiny",
        [
            "model.arch=encoder",
            "model.n_layers=4",
            "model/stack=funnel",
            "model.stack.blocks=[2,2]",
            "model.stack.decoder_layers=1",
        ],
    )
    vanilla = model_preset("tiny", ["model.arch=encoder", "model.n_layers=5"])  # same 5 blocks, no pooling
    block = 4 * 64 * 64 + 2 * 64 * 256  # qkv + out + MLP
    qkv = 3 * 64 * 64
    head = 0.15 * 64 * 256  # the MLM head on the masked positions (model.sparse_prediction)
    # groups: 2 blocks at 1, a pooling block at 1/2 (its qkv on 2x tokens), 1 block at 1/2, 1 up-sampling at 1
    assert matmul_params(cfg) == round(2 * block + 0.5 * block + 0.5 * qkv + 0.5 * block + block + head)
    assert matmul_params(vanilla) == round(5 * block + head)
    assert attention_layers(cfg.stack.blocks, cfg.stack.decoder_layers) == 2 + 1 * 0.5 + 0.25 + 1
    assert attention_flops_per_token(cfg, 32) == round(12 * 3.75 * 4 * 16 * 32)
    assert num_params(cfg) == num_params(vanilla)  # pooling adds no parameters


# -- through lm train: checkpoint/resume --------------------------------------------------------------------


@pytest.mark.parametrize(
    "option",
    [
        ["model/block=pkm", "model.block.layers=[1]", "model.block.n_keys=16"],
        ["model.arch=encoder", "model/stack=funnel", "model.stack.blocks=[1,1]", "model.stack.decoder_layers=1"],
    ],
)
def test_lm_train_resumes_exactly(option, tmp_path):
    from lm.cli.train import train

    objective = "mlm" if "model.arch=encoder" in option else "clm"

    def run(run_dir, steps):
        cfg = compose(tiny_overrides(run_dir, steps) + ["sched=constant", *option])
        train(cfg, loaders=loaders(cfg, objective=objective))

    run(tmp_path / "whole", 6)
    run(tmp_path / "split", 3)
    run(tmp_path / "split", 6)
    whole, split = train_losses(tmp_path / "whole"), train_losses(tmp_path / "split")
    assert list(split) == list(range(1, 7)) and split == whole
    assert all("moe/load_e0" not in m for m in metrics(tmp_path / "whole"))
