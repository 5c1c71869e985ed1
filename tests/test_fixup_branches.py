"""Fixup's init on branches that are not the plain attention + FFN pair (lm/zoo/residual.py): each layer is scaled
by L^(-1/(2m-2)) with m the layers in series on the residual branch it is in, not by where it sits in the Block."""

import pytest
import torch

from lm.model import Block
from tests.test_narang_components import D, batch, built, tiny

L = 2 * 2  # a 2-layer decoder (or encoder): attention and FFN branches per layer
OVER = ["model.tie_embeddings=false"]

# (options, parameter of block 0, m of its branch); each model's other layers are checked by the generic tests
CASES = [
    # input projection (GLU), convolution, output projection in series: m = 3, 4^(-1/4) = 0.7071
    (["model/attn=lightweight_conv"], "self_attn.inp.weight", 3),
    (["model/attn=dynamic_conv"], "self_attn.inp.weight", 3),
    (["model/attn=dynamic_conv"], "self_attn.score.weight_linear.weight", 3),
    # one branch: W_Q, W_K, W_V, W^{O_i}, the head's FFN up and down: m = 6, 4^(-1/10) = 0.8706
    (["model/block=weighted"], "self_attn.qkv.weight", 6),
    (["model/block=weighted"], "self_attn.branch_out.1.weight", 6),
    (["model/block=weighted"], "self_attn.branch_ffn.0.up.weight", 6),
    # the decoder cell's branched attention: m = 4, 4^(-1/6) = 0.7937; its conv branches: two separable convs
    (["model/block=evolved"], "prelude.0.self_attn.qkv.weight", 4),
    (["model/block=evolved"], "prelude.1.left.depthwise.weight", 4),
    (["model/block=evolved"], "prelude.1.right.pointwise.weight", 4),
    (["model/block=evolved"], "self_attn.qkv.weight", 4),
    (["model/block=evolved"], "ffn.up.weight", 2),
    # the encoder cell's conv branches: dense | conv, then a separable conv: m = 3
    (["model/block=evolved", "model.arch=encoder"], "prelude.1.left.weight", 3),
    (["model/block=evolved", "model.arch=encoder"], "prelude.1.right.conv.weight", 3),
    (["model/block=evolved", "model.arch=encoder"], "prelude.1.sep.depthwise.weight", 3),
]
SCALES = {2: 4**-0.5, 3: 4**-0.25, 4: 4 ** (-1 / 6), 6: 4**-0.1}


def draws(*over) -> tuple[dict, dict, str]:
    """Block 0's parameters under Fixup and, from the same seed, without its init (ReZero's scalars take no RNG)."""
    fixup = built(tiny("model/norm=fixup", *OVER, *over))
    plain = built(tiny("model/norm=rezero", *OVER, *over))
    stack = "encoder" if "model.arch=encoder" in over else "decoder"
    return dict(fixup.named_parameters()), dict(plain.named_parameters()), f"{stack}.blocks.0."


@pytest.mark.parametrize("over,name,m", CASES)
def test_each_layer_is_scaled_by_the_depth_of_its_branch(over, name, m):
    fixup, plain, prefix = draws(*over)
    w, w0 = fixup[prefix + name], plain[prefix + name]
    assert torch.count_nonzero(w0) == w0.numel()
    assert torch.allclose(w, w0 * SCALES[m]), (name, (w / w0).flatten()[0].item(), SCALES[m])


@pytest.mark.parametrize(
    "over,zeroed,kept",
    [
        # only the head FFNs' down projections end the weighted branch; W^{O_i} is a middle layer
        (["model/block=weighted"], ["self_attn.branch_ffn.0.down.weight"], ["self_attn.branch_out.0.weight"]),
        (["model/block=evolved"], ["prelude.0.self_attn.out.weight", "prelude.1.sep.pointwise.weight"], []),
        (
            ["model/block=evolved", "model.arch=encoder"],
            ["prelude.0.proj.weight", "prelude.1.sep.pointwise.weight"],
            [],
        ),
    ],
)
def test_only_each_branchs_last_layers_start_at_zero(over, zeroed, kept):
    fixup, _, prefix = draws(*over)
    assert all(torch.count_nonzero(fixup[prefix + n]) == 0 for n in zeroed)
    assert all(torch.count_nonzero(fixup[prefix + n]) > 0 for n in kept)


@pytest.mark.parametrize(
    "over", [["model/block=weighted"], ["model/block=evolved"], ["model/block=evolved", "model.arch=encoder"]]
)
def test_every_block_is_the_identity_at_init(over):
    model = built(tiny("model/norm=fixup", *over))
    x = torch.randn(2, 7, D)
    for block in (m for m in model.modules() if isinstance(m, Block)):
        assert torch.equal(block(x, "model.arch=encoder" not in over, None, lambda q, k: (q, k)), x)


def test_the_weighted_branch_learns():
    """With W^{O_i} and the FFN's down both at 0 (two zeros in series), no gradient ever reached the branch: after
    3 AdamW steps its qkv and W^{O_i} gradients were exactly 0."""
    cfg = tiny("model/norm=fixup", *OVER, "model/block=weighted")
    model, b = built(cfg), batch(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(3):  # the first step moves only the zero-initialised output layer
        opt.zero_grad()
        model(**b).loss.backward()
        opt.step()
    attn = model.decoder.blocks[0].self_attn
    for p in (attn.qkv.weight, attn.branch_out[0].weight, attn.branch_ffn[0].up.weight, attn.branch_ffn[0].down.weight):
        assert p.grad.abs().max() > 0


def test_an_adaptive_softmax_output_starts_its_logit_layers_at_zero():
    """5b80a23: Fixup zeroed head.proj, which the adaptive softmax lacks (AttributeError at build); its logit layers
    are the head cluster and each tail's last layer (its first, the tail's projection, keeps its draw)."""
    head = built(tiny("model/norm=fixup", *OVER, "model/output=adaptive_softmax")).head.asm
    assert torch.count_nonzero(head.head.weight) == 0 and len(head.tail) == 2
    for tail in head.tail:
        assert (
            torch.count_nonzero(tail[-1].weight) == 0 and torch.count_nonzero(tail[0].weight) == tail[0].weight.numel()
        )
