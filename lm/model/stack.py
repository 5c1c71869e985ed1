"""Stack: N Blocks + final norm. It owns causal vs bidirectional attention and builds masks once."""

from dataclasses import dataclass
from typing import Callable, List, Optional

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from lm.model import evolved
from lm.model.config import BlockKind, ModelConfig
from lm.model.attention import CrossAttention, LayerCache, SelfAttention, build_mask
from lm.model.block import Block
from lm.model.pkm import memory_or_ffn
from lm.model.scores import make_score
from lm.model.weighted import WeightedAttention, branch_hidden
from lm.model.sharing import StepEmbedding, depth, n_blocks


@dataclass
class Components:
    """Factories for the block's slots, from the config groups model/norm, model/ffn, model/pos."""

    norm: Callable[..., nn.Module]  # norm(dim, eps=...)
    ffn: Callable[..., nn.Module]  # ffn(dim, bias=..., dropout=...)
    pos: Callable[..., nn.Module]  # pos(dim, n_heads, head_dim, max_seq_len, causal)
    # model/attn: attn(n_heads, n_kv_heads, head_dim, max_seq_len, scale, dropout, causal); None = scaled_dot
    attn: Optional[Callable[..., nn.Module]] = None


def _attention(cls, cfg: ModelConfig, c: Components, layer: int, causal: bool = False, heads: Optional[tuple] = None,
               **extra):
    """heads: (n_heads, n_kv_heads, head_dim) when not the model's (the evolved decoder cell's wide attention);
    extra: keyword arguments of cls (the weighted Transformer's branch FFNs)."""
    qk_norm = (lambda d: c.norm(d, eps=cfg.norm_eps)) if cfg.qk_norm else None
    scale = attn_scale(cfg, layer)
    n_heads, n_kv_heads, head_dim = heads or (cfg.n_heads, cfg.kv_heads, cfg.d_head)
    factory = c.attn
    if cls is CrossAttention and not getattr(getattr(factory, "func", factory), "cross_ok", True):
        factory = None  # synthesizers and convolutions are about one sequence's positions: cross-attention keeps scaled_dot
    score = make_score(factory, causal, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim,
                       max_seq_len=cfg.max_seq_len, scale=scale, dropout=cfg.attn_dropout)
    if cls is SelfAttention and getattr(score, "attention_module", None) is not None:
        return score.attention_module(cfg.dim, n_heads, head_dim, cfg.bias, score)  # convolutions: their own sub-layer
    return cls(cfg.dim, n_heads, n_kv_heads, head_dim, cfg.bias, cfg.attn_dropout, scale, qk_norm, score, **extra)


def attn_scale(cfg: ModelConfig, layer: int) -> Optional[float]:
    """The softmax scale of layer `layer` (0-based); None = SDPA's own 1/sqrt(head_dim)."""
    if not cfg.attn_scale_by_layer:
        return cfg.attn_scale
    base = cfg.d_head ** -0.5 if cfg.attn_scale is None else cfg.attn_scale
    return base / (layer + 1)  # HF GPT-2 scale_attn_by_inverse_layer_idx (Stanford CRFM Mistral runs)


def make_block(cfg: ModelConfig, c: Components, cross: bool, layer: int = 0, causal: bool = False) -> Block:
    ffn_bias = cfg.bias if cfg.ffn_bias is None else cfg.ffn_bias
    norm = lambda d=cfg.dim: c.norm(d, eps=cfg.norm_eps)  # noqa: E731
    parts = dict(norm=norm, residual=type(cfg.norm).residual or cfg.norm_position,  # ReZero / Fixup name their own
                 dropout=cfg.dropout,
                 cross_attn=_attention(CrossAttention, cfg, c, layer) if cross else None)
    if cfg.block == BlockKind.weighted:  # each head's branch holds an FFN; the block has none (lm/model/weighted.py)
        ffns = [c.ffn(cfg.dim, bias=ffn_bias, dropout=cfg.dropout, hidden_dim=branch_hidden(cfg)) for _ in range(cfg.n_heads)]
        return Block(self_attn=_attention(WeightedAttention, cfg, c, layer, causal, ffns=ffns), ffn=None, **parts)
    if cfg.block == BlockKind.evolved:  # sub-layers before self-attention; the decoder cell's Swish FFN (lm/model/evolved.py)
        wide = (2 * cfg.n_heads, 2 * cfg.kv_heads, cfg.d_head // 2)
        parts["prelude"] = evolved.prelude(
            causal, cfg.dim, cfg.bias, cfg.dropout, norm,
            wide_self_attn=lambda: _attention(SelfAttention, cfg, c, layer, causal, heads=wide),
            cross_attn=lambda: _attention(CrossAttention, cfg, c, layer) if cross else None)
    ffn = (evolved.SwishFFN(cfg.dim, ffn_bias, cfg.dropout, norm) if cfg.block == BlockKind.evolved and causal else
           memory_or_ffn(cfg.pkm, layer, cfg.dim, ffn_bias, cfg.dropout,
                         lambda: c.ffn(cfg.dim, bias=ffn_bias, dropout=cfg.dropout)))  # model.pkm.layers
    return Block(self_attn=_attention(SelfAttention, cfg, c, layer, causal), ffn=ffn, **parts)


class Stack(nn.Module):
    def __init__(self, cfg: ModelConfig, c: Components, n_layers: int, causal: bool, cross: bool = False):
        super().__init__()
        self.causal = causal
        self.checkpointing = cfg.activation_checkpointing
        self.pos = c.pos(dim=cfg.dim, n_heads=cfg.n_heads, head_dim=cfg.d_head, max_seq_len=cfg.max_seq_len, causal=causal)
        self.embed_norm = c.norm(cfg.dim, eps=cfg.norm_eps) if cfg.embed_norm else nn.Identity()
        self.drop = nn.Dropout(cfg.dropout)
        # Layer i runs blocks[i % len(blocks)]: one block when shared (lm/model/sharing.py).
        self.depth = depth(cfg, n_layers)
        self.blocks = nn.ModuleList(make_block(cfg, c, cross, i, causal) for i in range(n_blocks(cfg, n_layers, causal)))
        self.step_embed = StepEmbedding(cfg.dim, cfg.ut_steps, cfg.ut_step_embedding) if cfg.ut_steps else None
        self.final_norm = c.norm(cfg.dim, eps=cfg.norm_eps) if cfg.final_norm else nn.Identity()

    def new_cache(self) -> List[LayerCache]:
        return [LayerCache() for _ in range(self.depth)]  # one per application: each sees other keys

    def forward(self, x: torch.Tensor, padding: Optional[torch.Tensor] = None, memory: Optional[torch.Tensor] = None,
                memory_padding: Optional[torch.Tensor] = None, cache: Optional[List[LayerCache]] = None,
                states: Optional[List[torch.Tensor]] = None) -> torch.Tensor:
        """x: token embeddings (B, T, D); padding: (B, T_past + T) 1 for tokens, 0 for pads.
        memory: (B, S, D), or one per block (transparent attention, lm/model/transparent.py).
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
            if self.step_embed is not None:
                x = self.step_embed(x, i)
            x = self.run_block(block, x, mask, rotate, memories[i], memory_mask, cache[i] if cache else None,
                               padding=own_padding)
            if states is not None:
                states.append(x)
        return self.final_norm(x)

    def run_block(self, block: Block, x, mask, rotate, memory=None, memory_mask=None, cache=None, pool=None,
                  padding=None):
        """One block; under activation checkpointing its activations are recomputed in backward."""
        if self.checkpointing and self.training:
            return checkpoint(block, x, self.causal, mask, rotate, memory, memory_mask, cache, pool, padding,
                              use_reentrant=False)
        return block(x, self.causal, mask, rotate, memory, memory_mask, cache, pool, padding)

    def active_matmul_params(self, count) -> float:
        """lm.model.flops: a shared block runs depth / len(blocks) times per token (lm/model/sharing.py)."""
        uses = self.depth // len(self.blocks)
        return (sum(count(m) for name, m in self.named_children() if name != "blocks")
                + uses * sum(count(b) for b in self.blocks))

    def pooled_forward(self, x: torch.Tensor, padding: Optional[torch.Tensor] = None):
        """What sequence classification reads: (hidden states, their padding). Funnel returns its pooled path."""
        return self(x, padding), padding
