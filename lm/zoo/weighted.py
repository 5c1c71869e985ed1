"""The weighted Transformer's branched attention (Ahmed et al. 2017): model/block=weighted.

Each attention head is a branch with its own output projection and its own FFN; learned weights mix
the branches twice:

    head_i     = Attention(x W_i^Q, x W_i^K, x W_i^V)            (B, T, Dh)
    bar_head_i = kappa_i * head_i W^{O_i}                        (B, T, D)   kappa: the "concat" weights
    out        = sum_i alpha_i * FFN_i(bar_head_i)               (B, T, D)   alpha: the "addition" weights

with kappa and alpha positive and summing to 1 (the paper projects them back onto the simplex after
each update; here they are softmaxes of free logits, starting uniform, which keeps the same
constraint without a projection step). The block's own FFN sub-layer is gone: the branches hold
the FFNs, each with 1/H of the model FFN's hidden size, so Params match the vanilla block
(sum_i W^{O_i} is one D x D matrix, the H branch FFNs one full FFN). Standard multi-head attention
is the special case kappa_i = alpha_i = 1 with one shared FFN applied to the sum.

The scores are the model/attn option's (scaled_dot by default), so capture() and the KV cache work
as for SelfAttention.
"""

import math
from dataclasses import dataclass

import torch
from torch import nn

from lm.config_base import ConfigError
from lm.model.attention import SelfAttention
from lm.model.linear import Linear
from lm.model.options import BlockConfig, MoEConfig, option_name
from lm.model.registry import register
from lm.model.stack import BlockParts
from lm.zoo.conv_attn import DynamicConvConfig, LightweightConvConfig
from lm.zoo.residual import FixupBranch, residual_linears


@register("block")
@dataclass
class WeightedConfig(BlockConfig):
    """model/block=weighted: every block's self-attention is WeightedAttention, whose branches hold the FFNs."""

    _target_: str = "lm.zoo.weighted.weighted_block"

    def check(self, model) -> None:
        name = "model/block=weighted"
        self.refuse_query_pooling(model)
        if isinstance(model.ffn, MoEConfig):
            raise ConfigError(
                f"{name} gives every attention head its own dense FFN (1/n_heads of model/ffn's hidden "
                f"size) in place of the block's FFN, so model/ffn=moe|switch has no FFN to replace; use "
                f"a dense model/ffn"
            )
        if isinstance(model.attn, (LightweightConvConfig, DynamicConvConfig)):
            raise ConfigError(
                f"{name} branches the heads of dot-product attention; it is not defined for "
                f"model/attn={option_name(model.attn)}"
            )


def weighted_block(parts: BlockParts) -> nn.Module:
    """Each head's branch holds an FFN; the block has none."""
    cfg = parts.cfg
    cross_attn = parts.cross_attention()
    ffns = [parts.ffn(hidden_dim=branch_hidden(cfg)) for _ in range(cfg.n_heads)]
    return parts.block(parts.attention(WeightedAttention, ffns=ffns), None, cross_attn)


def branch_hidden(cfg) -> int:
    """Each branch FFN's hidden size: 1/n_heads of what model/ffn gives the vanilla block (rounded up)."""
    from lm.model.ffn import hidden_size

    full = hidden_size(cfg.dim, cfg.ffn.hidden_mult, cfg.ffn.multiple_of, cfg.ffn.hidden_dim)
    return math.ceil(full / cfg.n_heads)


class WeightedAttention(FixupBranch, SelfAttention):
    # model/norm=fixup (lm/zoo/residual.py): the block's one residual branch runs W_Q, W_K, W_V, W^{O_i} and the
    # head's FFN (up, down) in series, so m = 6 and only the FFNs' last layers start at 0: zeroing W^{O_i} too would
    # put two zeros in series, and no gradient would ever reach either
    fixup_depth = 6

    def __init__(
        self,
        dim,
        n_heads,
        n_kv_heads,
        head_dim,
        bias,
        dropout,
        scale,
        qk_norm,
        score=None,
        ffns: list[nn.Module] | None = None,
    ):
        super().__init__(dim, n_heads, n_kv_heads, head_dim, bias, dropout, scale, qk_norm, score)
        if ffns is None or len(ffns) != n_heads:
            raise ValueError(
                f"the weighted Transformer needs one FFN per head: got {len(ffns or [])} for {n_heads} heads"
            )
        del self.out  # replaced by one output projection per branch (the same D x D parameters in all)
        self.branch_out = nn.ModuleList(Linear(head_dim, dim, bias=bias, residual=True) for _ in range(n_heads))
        self.branch_ffn = nn.ModuleList(ffns)
        self.kappa = nn.Parameter(torch.zeros(n_heads))  # logits: softmax gives kappa_i = 1/H at init
        self.alpha = nn.Parameter(torch.zeros(n_heads))

    def fixup_last(self) -> list[nn.Module]:
        return residual_linears(self.branch_ffn)

    def attend(self, q, k, v, mask, is_causal) -> torch.Tensor:
        heads = self.score(q, k, v, mask, is_causal)  # (B, H, T, Dh)
        kappa, alpha = self.kappa.softmax(0).to(heads.dtype), self.alpha.softmax(0).to(heads.dtype)
        out = 0
        for i, (proj, ffn) in enumerate(zip(self.branch_out, self.branch_ffn)):
            out = out + alpha[i] * ffn(kappa[i] * proj(heads[:, i]))  # (B, T, Dh) -> (B, T, D)
        return out

    def branch_weights(self) -> dict:
        """The learned mixing weights (each sums to 1), for inspection and tests."""
        return {"kappa": self.kappa.detach().softmax(0), "alpha": self.alpha.detach().softmax(0)}
