"""Product-key memory (model/block=pkm) and the Funnel encoder (model/stack=funnel), both in lm/zoo: their defining
properties, refused combinations, Params/Ops, and training through lm train with resume."""

import json

import pytest
import torch

from lm.config import ConfigError
from lm.model import build_model
from lm.model.attention import build_mask
from lm.model.config import model_preset
from lm.model.flops import attention_flops_per_token, matmul_params, num_params
from lm.zoo.funnel import FunnelStack, pair_weights, pool, pooling_blocks, upsample
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


@pytest.mark.parametrize(
    "separate_cls,at_16,at_13",
    [(False, [16, 16, 8, 4], [13, 13, 7, 4]), (True, [16, 16, 9, 5], [13, 13, 7, 4])],  # cls apart: 1 + ceil((T-1)/2)
)
def test_sequence_length_halves_per_group_and_is_restored_for_tokens(separate_cls, at_16, at_13):
    cfg, model = _funnel("[2,1,1]", ["model.stack.decoder_layers=2", f"model.stack.separate_cls={separate_cls}"])
    lengths = []
    for block in model.encoder.blocks:
        block.register_forward_hook(lambda m, inp, out: lengths.append(out.shape[1]))
    x = torch.randint(0, 256, (2, 16))
    out = model(input_ids=x)
    assert lengths == [*at_16, 16, 16] and out.logits.shape == (2, 16, 256)
    lengths.clear()
    h, padding = model.classify_features(x)
    assert lengths == at_16 and h.shape == (2, at_16[-1], 64) and padding is None  # no up-sampling blocks ran
    lengths.clear()
    model(input_ids=x[:, :13], labels=x[:, :13])  # odd lengths
    assert lengths == [*at_13, 13, 13]


@pytest.mark.parametrize("separate_cls,queries", [(False, 5), (True, 6)])
def test_query_pooling_attends_over_the_unpooled_keys(separate_cls, queries):
    """The pooling block's attention gets T/2 queries (1 + (T-1)/2 with [CLS] apart) and all T keys/values, and
    returns that many positions."""
    cfg, model = _funnel("[1,1]", [f"model.stack.separate_cls={separate_cls}"])
    seen = {}
    model.encoder.blocks[1].self_attn.register_forward_hook(lambda m, inp, out: seen.update(q=out.shape))
    inner = model.encoder.blocks[1].self_attn.attend
    model.encoder.blocks[1].self_attn.attend = lambda q, k, v, mask, is_causal: (
        seen.update(qk=(q.shape[2], k.shape[2])),
        inner(q, k, v, mask, is_causal),
    )[1]
    model(input_ids=torch.randint(0, 256, (2, 10)))
    assert seen["qk"] == (queries, 10) and seen["q"] == (2, queries, 64)


@pytest.mark.parametrize(
    "separate_cls,real,pooled", [(False, 7, [[1, 1, 1], [1, 1, 0]]), (True, 6, [[1, 1, 1, 1], [1, 1, 1, 0]])]
)
def test_padding_is_pooled_consistently(separate_cls, real, pooled):
    """Pads never reach real positions: the real tokens' outputs and the pooled path do not depend on
    what the pads hold, and a pooled position is real when either of its pair is (12 -> 6 -> 3 positions, or
    12 -> 7 -> 4 with [CLS] apart, whose pair (5, 6) is (real, pad) at 6 real tokens)."""
    cfg, model = _funnel("[1,1,1]", [f"model.stack.separate_cls={separate_cls}"])
    x = torch.randint(8, 256, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, real:] = 0
    y = x.clone()
    y[1, real:] = torch.randint(8, 256, (12 - real,))
    with torch.no_grad():
        a, b = model(input_ids=x, attention_mask=mask).logits, model(input_ids=y, attention_mask=mask).logits
        (ha, pa), (hb, pb) = model.classify_features(x, mask), model.classify_features(y, mask)
    torch.testing.assert_close(a[mask.bool()], b[mask.bool()], rtol=1e-5, atol=1e-5)
    assert torch.equal(pa, pb) and pa.tolist() == pooled
    torch.testing.assert_close(ha[pa.bool()], hb[pb.bool()], rtol=1e-5, atol=1e-5)


def test_pair_weights_average_the_real_tokens_of_each_pair():
    mask = torch.ones(2, 12)
    mask[1, 7:] = 0
    w = pair_weights(mask)
    assert w[1, 3].tolist() == [1.0, 0.0] and w[1, 4].tolist() == [0.0, 0.0]  # (real, pad) -> the real one
    t = torch.arange(12.0).view(1, 12, 1).repeat(2, 1, 1)
    assert pool(t, w, 1)[1, :4, 0].tolist() == [0.5, 2.5, 4.5, 6.0]
    mask[1, 6:] = 0  # [CLS] apart: (0, 0), (1, 2), (3, 4), (5, 6): the last is (real, pad)
    w = pair_weights(mask, separate_cls=True)
    assert w.shape == (2, 7, 2) and w[1, :5].tolist() == [[0.5, 0.5], [0.5, 0.5], [0.5, 0.5], [1.0, 0.0], [0.0, 0.0]]
    assert pool(t, w, 1, separate_cls=True)[1, :4, 0].tolist() == [0.0, 1.5, 3.5, 5.0]


def _pooling_calls(model, x, mask):
    """Run the pooled path; per pooling block: (the block, its input, its pooled-residual function, its output, the
    padding of its input)."""
    stack, calls = model.encoder, []

    def record(block):
        return lambda m, args, out: calls.append((block, args[0], args[7], out, args[8]))

    hooks = [
        stack.blocks[i].register_forward_hook(record(stack.blocks[i])) for i in sorted(pooling_blocks(stack.groups))
    ]
    with torch.no_grad():
        model.classify_features(x, mask)
    for h in hooks:
        h.remove()
    paddings = [mask] + [c[4] for c in calls[:-1]]  # a pooling block's padding argument is its output's
    return [(*c[:4], padding) for c, padding in zip(calls, paddings)]


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_cls_after_each_pooling_is_the_unpooled_cls(norm):
    """With separate_cls, at every pooling position 0 is [CLS]'s own state: the pooled residual's position 0 is the
    block's input at 0 bit for bit, and the pooling block's output at 0 is what the same block computes at 0 over the
    full-length sequence (its query unpooled, keys/values all positions). Pooled like the others it is a mix."""
    x = torch.randint(8, 256, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 11:] = 0
    gaps = {}
    for separate_cls in (True, False):
        cfg, model = _funnel("[1,1,1]", [f"model.stack.separate_cls={separate_cls}", f"model.norm_position={norm}"])
        calls = _pooling_calls(model, x, mask)
        assert [c[3].shape[1] for c in calls] == ([9, 5] if separate_cls else [8, 4])
        gaps[separate_cls] = []
        for block, x_in, pool_fn, out, padding in calls:
            positions = torch.arange(x_in.shape[1])
            with torch.no_grad():  # the eager definition: the plain block, every position a query
                full = block(x_in, False, build_mask(False, positions, positions, padding), lambda q, k: (q, k))
            assert torch.equal(pool_fn(x_in)[:, 0], x_in[:, 0]) == separate_cls
            gaps[separate_cls].append((out[:, 0] - full[:, 0]).abs().max().item())
    assert max(gaps[True]) < 1e-5 and min(gaps[False]) > 1e-2, gaps


@pytest.mark.parametrize("separate_cls", [True, False])
@pytest.mark.parametrize("length", [1, 2, 7, 8, 13, 16])
def test_up_sampling_gives_each_position_the_pooled_state_that_covers_it(separate_cls, length):
    """upsample is pooling's inverse map: position t gets the pooled position whose mean includes t (read from
    pooling an identity matrix g times), for lengths odd and even, [CLS] apart or not."""
    for stages in (1, 2, 3):
        cover, keep = torch.eye(length).unsqueeze(0), torch.ones(1, length)
        for _ in range(stages):
            w = pair_weights(keep, separate_cls)
            cover, keep = pool(cover, w, 1, separate_cls), (w.sum(-1) > 0).float()
        owner = (cover[0] > 0).float().argmax(0)  # (length,): the pooled position covering t
        assert ((cover[0] > 0).sum(0) == 1).all()  # each position is in exactly one pooled mean
        h = torch.randn(1, cover.shape[1], 4)
        torch.testing.assert_close(upsample(h, length, 2**stages, separate_cls), h[:, owner], rtol=0, atol=0)


def test_token_outputs_add_the_up_sampled_last_group_to_the_first():
    """What the first up-sampling block reads: the last group's output up-sampled ([CLS]'s own state at 0, each
    other position the pooled state covering it) plus the first group's output."""
    cfg, model = _funnel("[1,1,1]", ["model.stack.decoder_layers=1"])
    seen = {}
    blocks = model.encoder.blocks
    blocks[0].register_forward_hook(lambda m, args, out: seen.update(first=out))
    blocks[2].register_forward_hook(lambda m, args, out: seen.update(last=out))
    blocks[3].register_forward_hook(lambda m, args, out: seen.update(up=args[0]))
    with torch.no_grad():
        model(input_ids=torch.randint(8, 256, (2, 11)))
    assert seen["last"].shape[1] == 4  # 11 -> 6 -> 4: positions 0 | 1-4 | 5-8 | 9-10
    owner = torch.tensor([0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3])
    torch.testing.assert_close(seen["up"], seen["last"][:, owner] + seen["first"], rtol=0, atol=0)


def _hf_structure(separate_cls, truncate_seq=False):
    from transformers import FunnelConfig
    from transformers.models.funnel.modeling_funnel import FunnelAttentionStructure

    return FunnelAttentionStructure(FunnelConfig(separate_cls=separate_cls, truncate_seq=truncate_seq))


@pytest.mark.parametrize("separate_cls", [True, False])
@pytest.mark.parametrize("length", [7, 8, 13, 16])
def test_pooled_positions_match_hugging_face_funnel(separate_cls, length):
    """Which input positions each pooled position averages, and the pooled lengths, over three poolings: the same as
    Hugging Face's FunnelModel (its pool_tensor, separate_cls as set, truncate_seq=False) on an unpadded input."""
    pytest.importorskip("transformers")
    hf, ours, keep = _hf_structure(separate_cls), torch.eye(length).unsqueeze(0), torch.ones(1, length)
    theirs = ours
    for _ in range(3):
        w = pair_weights(keep, separate_cls)
        ours, keep, theirs = pool(ours, w, 1, separate_cls), (w.sum(-1) > 0).float(), hf.pool_tensor(theirs)
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-7)


@pytest.mark.parametrize("separate_cls", [True, False])
def test_stage_lengths_match_hugging_face_funnel_base_model(separate_cls):
    """Each block's output length in Hugging Face's FunnelBaseModel (blocks [1,1,1], truncate_seq=False) and here."""
    pytest.importorskip("transformers")
    from transformers import FunnelBaseModel, FunnelConfig

    hf_cfg = FunnelConfig(
        vocab_size=32, block_sizes=[1, 1, 1], d_model=16, n_head=2, d_head=8, d_inner=32, num_decoder_layers=1
    )
    hf_cfg.separate_cls, hf_cfg.truncate_seq = separate_cls, False
    hf = FunnelBaseModel(hf_cfg).eval()
    cfg, model = _funnel("[1,1,1]", [f"model.stack.separate_cls={separate_cls}"])
    lengths = []
    for block in model.encoder.blocks[:3]:
        block.register_forward_hook(lambda m, args, out: lengths.append(out.shape[1]))
    for length in (13, 16):
        x = torch.randint(0, 32, (1, length))
        with torch.no_grad():
            theirs = [h.shape[1] for h in hf(x, output_hidden_states=True).hidden_states[1:]]
            lengths.clear()
            model.classify_features(x)
        assert lengths == theirs == ([length, 7, 4] if length == 13 else [16, 9, 5] if separate_cls else [16, 8, 4])


@pytest.mark.parametrize("real,same", [(11, True), (10, False)])
def test_pooled_padding_against_hugging_face_funnel(real, same):
    """Hugging Face pools the mask with min (a pair is real only if both are); here either. They agree when no pair
    mixes a real token with a pad ([CLS] apart: an odd number of real tokens); otherwise Hugging Face drops the last
    real token and here it stays real, its pooled state its own (the docstring's rule: no real token lost)."""
    pytest.importorskip("transformers")
    hf, keep = _hf_structure(True), torch.zeros(1, 16)
    keep[0, :real] = 1
    w = pair_weights(keep, separate_cls=True)
    ours, theirs = (w.sum(-1) > 0).float(), hf.pool_tensor(keep, mode="min")
    assert torch.equal(ours, theirs) == same and int(ours.sum()) == 1 + real // 2  # 1 + ceil((real - 1) / 2)
    assert int(theirs.sum()) == 1 + (real - 1) // 2


def test_hugging_face_default_truncate_seq_drops_the_last_position():
    """The authors' default truncate_seq=True keeps 16 -> 8 by dropping position 15 (a real token when unpadded);
    here the length is 1 + ceil(15/2) = 9 and every position is in a pooled mean."""
    pytest.importorskip("transformers")
    eye = torch.eye(16).unsqueeze(0)
    theirs = _hf_structure(True, truncate_seq=True).pool_tensor(eye)
    ours = pool(eye, pair_weights(torch.ones(1, 16), True), 1, True)
    assert theirs.shape[1] == 8 and theirs[0, :, 15].abs().sum() == 0
    assert ours.shape[1] == 9 and (ours[0] > 0).sum(0).tolist() == [1] * 16


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
    # attention in full-length layers: 2 at 1 x 1, the pooling block 1/2 x 1, 1 at 1/2 x 1/2, 1 up-sampling at 1 x 1
    assert attention_flops_per_token(cfg, 32) == round(12 * (2 + 1 * 0.5 + 0.25 + 1) * 4 * 16 * 32)
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


def test_a_funnel_run_saved_before_separate_cls_loads_and_resumes_as_it_ran(tmp_path):
    """A Funnel run saved before model.stack.separate_cls existed pooled [CLS] with its neighbour: its config loads
    with the option off (lm/model/upgrade.py), resuming it under today's default is refused naming the field, and
    with the old value it continues exactly."""
    import yaml

    from lm.cli.train import train
    from lm.model.config import model_from_saved
    from tests.test_checkpoint_safety import reseal

    def run(run_dir, steps, *extra):
        cfg = compose(
            tiny_overrides(run_dir, steps)
            + ["sched=constant", "model.arch=encoder", "model/stack=funnel", "model.stack.blocks=[1,1]", *extra]
        )
        train(cfg, loaders=loaders(cfg, objective="mlm"))

    run(tmp_path / "whole", 6, "model.stack.separate_cls=false")
    run(tmp_path / "old", 3, "model.stack.separate_cls=false")
    for path in [tmp_path / "old" / "config.yaml", *(tmp_path / "old" / "checkpoints").glob("step_*/config.yaml")]:
        saved = yaml.safe_load(path.read_text())
        assert saved["model"]["stack"].pop("separate_cls") is False  # as written before the field existed
        path.write_text(yaml.safe_dump(saved))
    for ckpt in (tmp_path / "old" / "checkpoints").glob("step_*"):
        reseal(ckpt)
    assert model_from_saved(saved["model"]).stack.separate_cls is False
    with pytest.raises(ConfigError, match=r"model\.stack\.separate_cls: False -> True"):
        run(tmp_path / "old", 6)
    run(tmp_path / "old", 6, "model.stack.separate_cls=false")
    assert train_losses(tmp_path / "old") == train_losses(tmp_path / "whole")
