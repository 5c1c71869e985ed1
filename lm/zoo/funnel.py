"""Funnel Transformer encoder (Dai et al. 2020): `model/stack=funnel model.stack.blocks=[2,2,2]`.

The encoder's blocks are grouped; before each group after the first the sequence is mean-pooled by 2
(stride 2, window 2) with query pooling: that group's first block attends from the pooled queries
over the unpooled keys and values, and its residual stream continues from the pooled states
(Block's `pool` argument). Token-level outputs (MLM; an encoder-decoder's memory) up-sample the last
group's output by repetition to the full length, add the first group's output, and refine with
`decoder_layers` ordinary blocks (paper section 2.2). Classification reads only the pooled path
(`pooled_forward`), so the up-sampling blocks do not run.

[CLS]: with `separate_cls` (the default) position 0 is kept apart, as in the authors' code and Hugging Face's
FunnelModel (separate_cls=True in both): it pairs with itself, so after every pooling it is the [CLS] state itself
(its query, its residual), never a mean with its neighbour, and pairs start at position 1; up-sampling gives position
0 back its own state. The default is the authors' because a classifier (pooling=first) reads position 0 of the pooled
path: pooled like the others, that position is the mean over positions 0 .. 2**g - 1 after g poolings, not [CLS].
`separate_cls=false` pools every position alike, as Mesh TensorFlow's version (which Narang et al. ran, and
the narang row keeps) and configs saved before this option (they load with it off, lm/model/upgrade.py). Lengths: T ->
1 + ceil((T-1)/2) per pooling (512 -> 257 -> 129), ceil(T/2) without; the authors' `truncate_seq` (on by default
there) instead drops the last position to keep 512 -> 256, losing a real token when it is not a pad, so it is not
offered. The FLOPs count (token_fractions) takes 1/2**g of the tokens in group g, so with separate_cls it leaves out
that group's one extra position (129 of T=512 counted as 128 in group 2: 0.8% of that group).

Against the paper: its post-norm pooling block is LN(pool(h) + MHA(Q=pool(h), KV=h)); here under post-norm it is
exactly that, and under pre-norm pool(h) + MHA(Q=pool(LN(h)), KV=LN(h)): the norm is the branch's input as in every
pre-norm block, the queries are pooled from it (after the linear q projection, the same thing), the residual
carries pool(h). (Mesh TensorFlow's version, which Narang et al. ran, instead runs a full-length block and pools its
output.) Deliberate simplification: positions are absolute embeddings, not the paper's Transformer-XL relative
attention (nor T5's bias: see below).

Padding: pooling averages only the real tokens of each pair, and a pooled position is real when
either of its pair is, so pads never leak into real positions and no real token is lost ([CLS], paired with
itself, is real when it is). Hugging Face's pooled mask takes the min of the pair instead: a real token paired
with a pad drops out there.
Positions enter as embeddings (learned, sinusoidal, none) before the first block; schemes acting
inside attention (RoPE, ALiBi, T5 bias) would need pooled positions and are refused.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from lm.config_base import ConfigError
from lm.model.attention import build_mask
from lm.model.choices import Arch
from lm.model.linear import MatmulCount
from lm.model.options import StackConfig, option_name
from lm.model.position import PositionScheme
from lm.model.registry import register
from lm.model.stack import Components, Stack


@register("stack")
@dataclass
class FunnelConfig(StackConfig):
    """model/stack=funnel: the encoder's blocks are grouped by `blocks`; between groups the sequence is
    mean-pooled by 2 with query pooling. Token-level outputs (MLM, an encoder-decoder's memory) are
    up-sampled to full length and refined by decoder_layers blocks; classification reads only the pooled path.
    Causal stacks (an encoder-decoder's decoder) stay plain Stacks."""

    _target_: str = "lm.zoo.funnel.funnel_stack"
    blocks: list[int] = field(default_factory=list)  # encoder blocks per group, summing to model.n_layers
    decoder_layers: int = 2  # full-length blocks after up-sampling
    # Position 0 ([CLS]) kept apart from pooling, as in the authors' code and Hugging Face's FunnelConfig (both
    # default on): a classifier reads an unmixed [CLS]. Configs saved before this field load with it off, as they
    # ran (lm/model/upgrade.py).
    separate_cls: bool = True
    pools_queries = True

    def layer_indices(self, n_layers: int) -> int:
        """The encoder's pooled groups, then its up-sampling blocks (a causal stack builds fewer)."""
        return n_layers + self.decoder_layers

    def check(self, model) -> None:
        if model.arch == Arch.decoder:
            raise ConfigError(
                "model/stack=funnel on a decoder (model.arch=decoder): pooling would let a token see "
                "its pooled future; use model.arch=encoder or encoder_decoder"
            )
        if (
            not self.blocks
            or any(not isinstance(b, int) or b < 1 for b in self.blocks)
            or sum(self.blocks) != model.n_layers
        ):
            raise ConfigError(
                f"model.stack.blocks={list(self.blocks)} must be positive and sum to model.n_layers={model.n_layers}: "
                f"the encoder's blocks per pooled group, e.g. model.stack.blocks={_example_groups(model.n_layers)}"
            )
        if not isinstance(self.decoder_layers, int) or self.decoder_layers < 0:
            raise ConfigError(f"model.stack.decoder_layers={self.decoder_layers!r} must be >= 0")
        if model.attn.self_only:
            raise ConfigError(
                f"model/attn={option_name(model.attn)} with model/stack=funnel: Funnel pools the "
                f"queries, which moves them off the positions this option's pattern/window is laid "
                f"out on; use scaled_dot"
            )
        if model.memory is not None:
            raise ConfigError(
                f"model/memory={option_name(model.memory)} with model.stack.blocks={list(self.blocks)}: a "
                f"Funnel encoder's layers have different lengths, so they cannot be mixed; drop one "
                f"of them"
            )


def funnel_stack(
    cfg,
    c: Components,
    n_layers: int,
    causal: bool,
    cross: bool,
    blocks: list[int],
    decoder_layers: int,
    separate_cls: bool,
) -> Stack:
    """The encoder stack is a FunnelStack; a causal stack (an encoder-decoder's decoder) a plain Stack."""
    if causal or cross:
        return Stack(cfg, c, n_layers, causal, cross)
    return FunnelStack(cfg, c, n_layers, list(blocks), decoder_layers, separate_cls)


def with_cls_apart(t: torch.Tensor, dim: int) -> torch.Tensor:
    """t with position 0 doubled along `dim`: pairing then starts at position 1 and [CLS] pairs with itself, so its
    pooled state is itself (0.5 c + 0.5 c = c exactly), as in Hugging Face's pool_tensor (a port of the authors')."""
    return torch.cat([t.narrow(dim, 0, 1), t], dim)


def pair_weights(keep: torch.Tensor, separate_cls: bool = False) -> torch.Tensor:
    """keep: (B, T) 1 for real tokens -> (B, T2, 2) weights of each pair's masked mean: T2 = ceil(T/2), or
    1 + ceil((T-1)/2) with separate_cls."""
    keep = with_cls_apart(keep.float(), 1) if separate_cls else keep.float()
    keep = F.pad(keep, (0, keep.shape[1] % 2))  # an odd tail pairs with a pad
    pairs = keep.unflatten(1, (-1, 2))  # (B, T2, 2)
    return pairs / pairs.sum(-1, keepdim=True).clamp(min=1)


def pool(t: torch.Tensor, weights: torch.Tensor, dim: int, separate_cls: bool = False) -> torch.Tensor:
    """Masked mean of adjacent pairs along `dim` (the sequence axis, dim >= 1; batch first); `weights` from
    pair_weights with the same separate_cls."""
    t = with_cls_apart(t, dim) if separate_cls else t
    t = F.pad(t, (0, 0) * (t.ndim - dim - 1) + (0, t.shape[dim] % 2))
    t = t.unflatten(dim, (-1, 2))  # (..., T, ...) -> (..., T2, 2, ...)
    w = weights.view(weights.shape[0], *[1] * (dim - 1), *weights.shape[1:], *[1] * (t.ndim - dim - 2))
    return (t * w.to(t.dtype)).sum(dim + 1)


def upsample(h: torch.Tensor, length: int, stride: int, separate_cls: bool) -> torch.Tensor:
    """(B, T', D) pooled `stride`-fold -> (B, length, D): each position gets the pooled state that covers it. With
    separate_cls pooled position j >= 1 covers positions (j-1)*stride+1 .. j*stride and position 0 is [CLS]'s own
    (Hugging Face's upsample without truncate_seq)."""
    if not separate_cls:
        return h.repeat_interleave(stride, dim=1)[:, :length]
    return torch.cat([h[:, :1], h[:, 1:].repeat_interleave(stride, dim=1)[:, : length - 1]], dim=1)


class FunnelStack(MatmulCount, Stack):
    """Stack whose blocks are `groups` pooled groups, then decoder_layers full-length blocks."""

    def __init__(self, cfg, c: Components, n_layers: int, groups: list[int], decoder_layers: int, separate_cls: bool):
        super().__init__(cfg, c, n_layers + decoder_layers, causal=False)
        hooks = [
            name
            for name in ("rotary", "score_bias")
            if getattr(type(self.pos), name) is not getattr(PositionScheme, name)
        ]
        if hooks:
            raise ConfigError(
                f"model/stack=funnel needs positions added to the embeddings (model/pos=learned, "
                f"sinusoidal or none); model/pos={option_name(cfg.pos)} acts inside attention ({hooks[0]})"
            )
        self.groups: list[int] = groups
        self.separate_cls = separate_cls

    def _encode(self, x: torch.Tensor, padding: torch.Tensor | None):
        """Embedded tokens (B, T, D) -> (last group's output (B, T', D), its padding, first group's output)."""
        positions = torch.arange(x.shape[1], device=x.device)
        x = self.drop(self.embed_norm(self.pos.embed(x, positions)))
        keep = padding if padding is not None else torch.ones(x.shape[:2], device=x.device)
        mask = build_mask(False, positions, positions, padding)
        rotate = self.pos.rotary(positions)  # the identity: checked at build
        i, first = 0, None
        for g, n_blocks in enumerate(self.groups):
            for j in range(n_blocks):
                if g and not j:
                    x, keep, padding, mask = self._pooling_block(self.blocks[i], x, keep, padding)
                else:
                    x = self.run_block(self.blocks[i], x, mask, rotate, padding=padding)
                i += 1
            first = x if first is None else first
        return x, padding, first

    def _pooling_block(self, block, x, keep, padding):
        """Query pooling: pooled queries attend over the unpooled keys/values; the output is (B, T2, D), T2 as
        pair_weights says."""
        weights = pair_weights(keep, self.separate_cls)  # (B, T2, 2)
        q_pos = torch.arange(weights.shape[1], device=x.device)
        k_pos = torch.arange(x.shape[1], device=x.device)

        def pooled_queries(q, k):  # q (B, H, T, Dh) -> (B, H, T2, Dh)
            return pool(q, weights, 2, self.separate_cls), k

        pooled_keep = (weights.sum(-1) > 0).to(keep.dtype)  # (B, T2): real if either of the pair is
        pooled_padding = None if padding is None else pooled_keep.to(padding.dtype)
        x = self.run_block(
            block,
            x,
            build_mask(False, q_pos, k_pos, padding),
            pooled_queries,
            pool=lambda h: pool(h, weights, 1, self.separate_cls),
            padding=pooled_padding,
        )
        return x, pooled_keep, pooled_padding, build_mask(False, q_pos, q_pos, pooled_padding)

    def forward(
        self, x: torch.Tensor, padding: torch.Tensor | None = None, memory=None, memory_padding=None, cache=None
    ) -> torch.Tensor:
        """Token-level outputs (B, T, D): up-sampled last group + first group, then the decoder blocks."""
        if cache is not None or memory is not None:
            raise ValueError("a Funnel encoder takes no cache or memory")
        T = x.shape[1]
        h, _, first = self._encode(x, padding)
        h = upsample(h, T, 2 ** (len(self.groups) - 1), self.separate_cls) + first  # (B, T', D) -> (B, T, D)
        positions = torch.arange(T, device=x.device)
        mask, rotate = build_mask(False, positions, positions, padding), self.pos.rotary(positions)
        for block in self.blocks[sum(self.groups) :]:
            h = self.run_block(block, h, mask, rotate, padding=padding)
        return self.final_norm(h)

    def pooled_forward(
        self, x: torch.Tensor, padding: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Classification: the pooled path only, (B, about T / 2**(groups-1), D) and its padding; position 0 is
        [CLS]'s own state with separate_cls."""
        h, padding, _ = self._encode(x, padding)
        return self.final_norm(h), padding

    def attention_shares(self) -> list[tuple[float, float]]:
        return attention_shares(self.groups, len(self.blocks) - sum(self.groups))

    def active_matmul_params(self, count: Callable[[nn.Module], float]) -> float:
        """Matmul weights per input token (lm/model/flops.py): each block scaled by its token fraction; a
        pooling block projects q, k, v before pooling, on twice its output's tokens."""
        total = sum(count(m) for name, m in self.named_children() if name != "blocks")
        starts = pooling_blocks(self.groups)
        for i, (block, f) in enumerate(zip(self.blocks, token_fractions(self.groups, len(self.blocks)))):
            total += f * count(block) + (f * count(block.self_attn.qkv) if i in starts else 0.0)
        return total


def pooling_blocks(groups: list[int]) -> set:
    """Indices of the blocks that pool (the first of every group after the first)."""
    return {sum(groups[:g]) for g in range(1, len(groups))}


def token_fractions(groups: list[int], n_blocks: int) -> list[float]:
    """Per block, its tokens per input token: 1/2**g in group g, 1 in the up-sampling blocks."""
    fractions = [2.0**-g for g, n in enumerate(groups) for _ in range(n)]
    return fractions + [1.0] * (n_blocks - len(fractions))


def attention_shares(groups: list[int], decoder_layers: int) -> list[tuple[float, float]]:
    """(queries, keys) of each block as fractions of T (lm/model/flops.py via FunnelStack.attention_shares)."""
    starts = pooling_blocks(groups)
    return [
        (f, 2 * f if i in starts else f) for i, f in enumerate(token_fractions(groups, sum(groups) + decoder_layers))
    ]


def _example_groups(n_layers: int) -> str:
    """A valid model.stack.blocks for n_layers, for the refusal's example: two groups, or one for a single layer."""
    half = n_layers // 2
    return f"[{half},{n_layers - half}]" if half else f"[{n_layers}]"
