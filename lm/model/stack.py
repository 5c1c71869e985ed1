"""Stack: N Blocks + final norm. It owns causal vs bidirectional attention and builds masks once.

`make_block` builds one layer's Block from its parts (BlockParts): the vanilla self-attention,
[cross-attention,] FFN sequence, or the sequence of the model/block option (lm/model/registry.py: the
zoo's evolved and weighted cells, product-key memory). `make_stack` builds a Stack, or the model/stack
option's subclass (the zoo's Funnel encoder, shared blocks and the Universal Transformer).
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from lm.model.attention import CrossAttention, LayerCache, SelfAttention, build_mask
from lm.model.block import RESIDUALS, Block
from lm.model.scores import make_score

if TYPE_CHECKING:  # model code reads the config's values; it does not need its schema module to run
    from lm.model.config import ModelConfig


@dataclass
class Components:
    """Factories for the model's slots (lm/model/registry.py), instantiated from the config groups."""

    norm: Callable[..., nn.Module]  # norm(dim, eps=...)
    ffn: Callable[..., nn.Module]  # ffn(dim, bias=..., dropout=...)
    pos: Callable[..., nn.Module]  # pos(dim, n_heads, head_dim, max_seq_len, causal)
    # model/attn: attn(n_heads, n_kv_heads, head_dim, max_seq_len, scale, dropout, causal); None = scaled_dot
    attn: Callable[..., nn.Module] | None = None
    block: Callable[..., Block] | None = None  # model/block: block(parts: BlockParts); None = vanilla
    stack: Callable[..., nn.Module] | None = None  # model/stack: stack(cfg, c, n_layers, causal, cross); None = Stack
    memory: Callable[..., nn.Module] | None = None  # model/memory: memory(n_encoder_layers, n_decoder_layers)
    embedding: Callable[..., nn.Module] | None = None  # model/embedding: embedding(cfg); None = nn.Embedding
    output: Callable[..., nn.Module] | None = None  # model/output: output(cfg, tied, bias, transform); None = LMHead


class BlockParts:
    """The sub-layers of block `layer` of a stack, each built as the model's options say; a model/block
    option composes its Block from them (and from modules of its own)."""

    def __init__(self, cfg: "ModelConfig", c: Components, layer: int, causal: bool, cross: bool):
        self.cfg, self.c, self.layer, self.causal, self.cross = cfg, c, layer, causal, cross
        self.ffn_bias = cfg.bias if cfg.ffn_bias is None else cfg.ffn_bias

    def norm(self, dim: int | None = None) -> nn.Module:
        return self.c.norm(dim or self.cfg.dim, eps=self.cfg.norm_eps)

    def attention(self, cls=SelfAttention, heads: tuple | None = None, **extra) -> nn.Module:
        """Self-attention of `cls` (SelfAttention or a subclass) with the model/attn score. heads: (n_heads,
        n_kv_heads, head_dim) when not the model's; extra: keyword arguments of cls."""
        return _attention(cls, self.cfg, self.c, self.layer, self.causal, heads, **extra)

    def cross_attention(self, heads: tuple | None = None) -> CrossAttention | None:
        """Cross-attention to the encoder memory when the stack has it (a decoder of an encoder-decoder)."""
        return _attention(CrossAttention, self.cfg, self.c, self.layer, False, heads) if self.cross else None

    def ffn(self, **extra) -> nn.Module:
        """The model/ffn FFN; extra: its keyword arguments (hidden_dim=...)."""
        return self.c.ffn(self.cfg.dim, bias=self.ffn_bias, dropout=self.cfg.dropout, **extra)

    def block(
        self,
        self_attn: nn.Module,
        ffn: nn.Module | None,
        cross_attn: nn.Module | None = None,
        prelude: Sequence[nn.Module] = (),
    ) -> Block:
        """The Block: ffn=None has no FFN sub-layer; prelude: residual sub-layers run before self-attention."""
        return Block(
            self_attn=self_attn,
            ffn=ffn,
            norm=self.norm,
            dropout=self.cfg.dropout,
            cross_attn=cross_attn,
            # a model/norm option's own residual (the zoo's ReZero, Fixup), or model.norm_position's
            residual=self.cfg.norm.residual() or RESIDUALS[self.cfg.norm_position],
            prelude=prelude,
        )


def _attention(
    cls, cfg: "ModelConfig", c: Components, layer: int, causal: bool = False, heads: tuple | None = None, **extra
):
    qk_norm = (lambda d: c.norm(d, eps=cfg.norm_eps)) if cfg.qk_norm else None
    scale = attn_scale(cfg, layer)
    n_heads, n_kv_heads, head_dim = heads or (cfg.n_heads, cfg.kv_heads, cfg.d_head)
    # an option about one sequence's positions (model.attn.self_only) leaves cross-attention on scaled_dot
    factory = None if cls is CrossAttention and cfg.attn.self_only else c.attn
    score = make_score(
        factory,
        causal,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        max_seq_len=cfg.max_seq_len,
        scale=scale,
        dropout=cfg.attn_dropout,
    )
    sublayer = score.sublayer(cfg.dim, cfg.bias) if cls is SelfAttention else None
    if sublayer is not None:
        return sublayer  # a score with its own sub-layer (lm/zoo/conv_attn.py)
    return cls(cfg.dim, n_heads, n_kv_heads, head_dim, cfg.bias, cfg.attn_dropout, scale, qk_norm, score, **extra)


def attn_scale(cfg: "ModelConfig", layer: int) -> float | None:
    """The softmax scale of layer `layer` (0-based); None = the score's default, 1/sqrt(head_dim) (scores.py)."""
    if not cfg.attn_scale_by_layer:
        return cfg.attn_scale
    base = cfg.d_head**-0.5 if cfg.attn_scale is None else cfg.attn_scale
    return base / (layer + 1)  # HF GPT-2 scale_attn_by_inverse_layer_idx (Stanford CRFM Mistral runs)


def make_block(cfg: "ModelConfig", c: Components, cross: bool, layer: int = 0, causal: bool = False) -> Block:
    parts = BlockParts(cfg, c, layer, causal, cross)
    if c.block is not None:
        return c.block(parts)
    cross_attn = parts.cross_attention()  # built in this order: scores that draw their init do so in it
    ffn = parts.ffn()
    return parts.block(parts.attention(), ffn, cross_attn)


def make_stack(cfg: "ModelConfig", c: Components, n_layers: int, causal: bool, cross: bool = False) -> "Stack":
    """A stack of n_layers layers: the model/stack option's (lm/model/registry.py), or a Stack."""
    if c.stack is not None:
        return c.stack(cfg, c, n_layers, causal, cross)
    return Stack(cfg, c, n_layers, causal, cross)


class Stack(nn.Module):
    def __init__(
        self,
        cfg: "ModelConfig",
        c: Components,
        n_layers: int,
        causal: bool,
        cross: bool = False,
        n_blocks: int | None = None,
    ):
        """n_layers: the layers it applies; n_blocks: the distinct blocks it holds (default n_layers). Layer i
        runs blocks[i % n_blocks]: a model/stack option may share blocks between layers (lm/zoo/sharing.py)."""
        super().__init__()
        self.causal = causal
        self.checkpointing = cfg.activation_checkpointing
        self.pos = c.pos(
            dim=cfg.dim, n_heads=cfg.n_heads, head_dim=cfg.d_head, max_seq_len=cfg.max_seq_len, causal=causal
        )
        self.embed_norm = c.norm(cfg.dim, eps=cfg.norm_eps) if cfg.embed_norm else nn.Identity()
        self.drop = nn.Dropout(cfg.dropout)
        self.depth = n_layers
        self.blocks = nn.ModuleList(make_block(cfg, c, cross, i, causal) for i in range(n_blocks or n_layers))
        self.final_norm = c.norm(cfg.dim, eps=cfg.norm_eps) if cfg.final_norm else nn.Identity()

    def new_cache(self) -> list[LayerCache] | None:
        """One LayerCache per application (each sees other keys); None when a sub-layer keeps no state between
        calls (`kv_cache = False`: model/block=evolved's convolutions), so generation reruns the whole sequence."""
        if any(getattr(m, "kv_cache", True) is False for m in self.modules()):
            return None
        return [LayerCache() for _ in range(self.depth)]

    def forward(
        self,
        x: torch.Tensor,
        padding: torch.Tensor | None = None,
        memory: torch.Tensor | None = None,
        memory_padding: torch.Tensor | None = None,
        cache: list[LayerCache] | None = None,
        states: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """x: token embeddings (B, T, D); padding: (B, T_past + T) 1 for tokens, 0 for pads.
        memory: (B, S, D), or a list of one per layer (a model/memory option: lm/zoo/transparent.py).
        states: when a list, the stream after the embeddings and after each block is appended to it."""
        memories = memory if isinstance(memory, list) else [memory] * self.depth
        memory = memories[0] if memories else memory
        past = cache[0].length if cache else 0
        self.pos.check_length(past + x.shape[1])  # from host integers: reading q_pos would sync the device
        q_pos = torch.arange(past, past + x.shape[1], device=x.device)
        k_pos = torch.arange(past + x.shape[1], device=x.device)
        mask = build_mask(self.causal, q_pos, k_pos, padding, self.pos.score_bias(q_pos, k_pos))
        memory_mask = None
        if memory is not None and memory_padding is not None:
            m_pos = torch.arange(memory.shape[1], device=x.device)
            memory_mask = build_mask(False, q_pos, m_pos, memory_padding)
        rotate = self.pos.rotary(q_pos, length=past + x.shape[1])  # host integers again: no device read
        own_padding = None if padding is None else padding[:, past:]  # this call's tokens (an MoE routes no pad)
        x = self.drop(self.embed_norm(self.pos.embed(x, q_pos)))
        if states is not None:
            states.append(x)
        for i in range(self.depth):
            block = self.blocks[i % len(self.blocks)]
            layer_cache = cache[i] if cache else None
            x = self.run_block(
                block, self.enter_layer(x, i), mask, rotate, memories[i], memory_mask, layer_cache, padding=own_padding
            )
            if states is not None:
                states.append(x)
        return self.final_norm(x)

    def run_block(
        self, block: Block, x, mask, rotate, memory=None, memory_mask=None, cache=None, pool=None, padding=None
    ):
        """One block; under activation checkpointing its activations are recomputed in backward."""
        if self.checkpointing and self.training:
            return checkpoint(
                block, x, self.causal, mask, rotate, memory, memory_mask, cache, pool, padding, use_reentrant=False
            )
        return block(x, self.causal, mask, rotate, memory, memory_mask, cache, pool, padding)

    def enter_layer(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        """The stream as layer `layer` (0-based) receives it: unchanged here (the Universal Transformer adds
        its step embedding, lm/zoo/sharing.py)."""
        return x

    def attention_shares(self) -> list[tuple[float, float]]:
        """(queries, keys) of each applied layer's attention as fractions of the input length, for
        lm.model.flops: all of them here (a Funnel's pooled blocks see fewer)."""
        return [(1.0, 1.0)] * self.depth

    def pooled_forward(self, x: torch.Tensor, padding: torch.Tensor | None = None):
        """What sequence classification reads: (hidden states, their padding). Funnel returns its pooled path."""
        return self(x, padding), padding
