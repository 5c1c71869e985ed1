"""Multi-head attention: MHA, GQA and MQA by `n_kv_heads`, with a swappable scoring function.

Self-attention projects q, k, v with one fused matmul; cross-attention projects q from the
decoder and k, v from the encoder memory. Both share `attend` and the output projection; `attend`
hands q, k, v to the module's score (`model/attn`, lm/model/scores.py): the default `scaled_dot`
runs on scaled_dot_product_attention, the other options compute explicit probabilities.
Masks are additive float tensors broadcastable to (B, H, Tq, Tk), built once per stack call by
`build_mask`; when nothing but causality must be masked, the mask is None and SDPA's
`is_causal` fast path (flash / memory-efficient kernels) is used.

Reading attention probabilities, for any scoring function:

    with capture(model) as maps:
        model(input_ids)
    maps[0]["layer"], maps[0]["kind"], maps[0]["probs"]   # 0, "self", (B, H, Tq, Tk)

`capture(model)` makes every attention module of the model compute explicit probabilities (the
default leaves SDPA's fused kernel for the same maths written out) and appends one dict per
attention call, in call order: {"stack": "encoder" | "decoder" | ..., "layer": the layer of its
stack that ran (a shared block, model/stack=shared|universal, reports each application),
"kind": "self" | "cross", "probs": detached (B, H, Tq, Tk) tensor}. Rows sum to 1; masked
keys (future, padding) get exactly 0. Linformer's Tk is its k projected positions. A KV-cached
generation step appends Tq = 1 rows. Leaving the block restores the fast path. Meant for eval
(`torch.no_grad()`): under activation checkpointing a training step would record each call twice.
"""

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from lm.model.linear import Linear
from lm.model.scores import ScaledDot, Score


@dataclass
class LayerCache:
    """Keys and values seen so far by one block: self-attention grows, cross-attention is fixed."""

    k: torch.Tensor | None = None  # (B, KVH, T_past, Dh)
    v: torch.Tensor | None = None  # (B, KVH, T_past, Dh)
    memory_kv: tuple | None = None  # cross-attention (k, v) of the encoder memory

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)  # (B, KVH, T_past + T, Dh)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v


def build_mask(
    causal: bool,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    key_padding: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Additive mask (B or 1, H or 1, Tq, Tk), or None when `is_causal` alone is exact.

    key_padding: (B, Tk) with 1 for real tokens and 0 for padding. bias: (1, H, Tq, Tk) from the
    position scheme. Masked entries get the dtype's most negative finite value rather than -inf,
    so a query row with no visible key (a left pad) gives a uniform, not NaN, softmax.
    """
    offset_free = q_pos.shape[0] == k_pos.shape[0]
    if key_padding is None and bias is None and (offset_free or not causal):
        return None
    visible = torch.ones(q_pos.shape[0], k_pos.shape[0], dtype=torch.bool, device=q_pos.device)[None, None]
    if causal:
        visible = visible & (k_pos[None, :] <= q_pos[:, None])[None, None]  # (1, 1, Tq, Tk)
    if key_padding is not None:
        visible = visible & key_padding.bool()[:, None, None, :]  # (B, Tk) -> (B, 1, 1, Tk): (B, 1, Tq, Tk)
    base = bias.float() if bias is not None else torch.zeros((), device=q_pos.device)
    return base.masked_fill(~visible, torch.finfo(torch.float32).min)


def key_keep(mask: torch.Tensor | None, T: int) -> torch.Tensor | None:
    """(B, T) 1 for real tokens, 0 for pads, of the last T key positions, from build_mask's additive
    mask; None when nothing is padded. The last query row sees every non-padded key (causal or not)."""
    if mask is None:
        return None
    keep = mask[:, 0, -1, -T:] > torch.finfo(torch.float32).min  # (B, H or 1, Tq, Tk) -> (B, T): the last query row
    return keep.to(mask.dtype if mask.is_floating_point() else torch.float32)


class _Attention(nn.Module):
    """What self- and cross-attention share: the score, the output projection, QK-norm, the head split and merge.
    Heads: H query heads, KVH key/value heads (H = KVH: MHA; KVH = 1: MQA; else GQA), each Dh wide."""

    kind = ""  # "self" or "cross": how capture() labels its probabilities

    def __init__(
        self,
        dim: int,
        n_heads: int,
        n_kv_heads: int,
        head_dim: int,
        bias: bool,
        dropout: float,
        scale: float | None,
        qk_norm: Callable[[int], nn.Module] | None,
        score: Score | None = None,
    ):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        # the scoring function (lm/model/scores.py); scaled_dot on SDPA unless the model chose another
        self.score = score if score is not None else ScaledDot(n_heads, n_kv_heads, head_dim, 0, scale, dropout, False)
        self.out = Linear(n_heads * head_dim, dim, bias=bias, residual=True)  # scaled at init (GPT-2)
        # QK-norm (Dehghani et al. 2023) bounds the attention logits; identity when off.
        self.q_norm = qk_norm(head_dim) if qk_norm else nn.Identity()
        self.k_norm = qk_norm(head_dim) if qk_norm else nn.Identity()

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, n, self.head_dim).transpose(1, 2)  # (B, T, n*Dh) -> (B, n, T, Dh)

    def attend(self, q, k, v, mask: torch.Tensor | None, is_causal: bool) -> torch.Tensor:
        y = self.score(q, k, v, mask, is_causal)  # (B, H, Tq, Dh)
        B, _, T, _ = y.shape
        y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)  # (B, H, T, Dh) -> (B, T, H*Dh)
        return self.out(y)  # (B, T, D)


class SelfAttention(_Attention):
    kind = "self"

    def __init__(self, dim, n_heads, n_kv_heads, head_dim, bias, dropout, scale, qk_norm, score=None):
        super().__init__(dim, n_heads, n_kv_heads, head_dim, bias, dropout, scale, qk_norm, score)
        self.qkv = Linear(dim, (n_heads + 2 * n_kv_heads) * head_dim, bias=bias)

    def forward(self, x, causal: bool, mask, pos, cache: LayerCache | None = None):
        """x (B, T, D) -> (B, T, D). mask: build_mask's additive (B or 1, H or 1, T, T_past + T), or None;
        pos: the position scheme's rotation of q and k (identity unless RoPE)."""
        q_size, kv_size = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        q, k, v = self.qkv(x).split([q_size, kv_size, kv_size], dim=-1)  # (B, T, H*Dh), 2 x (B, T, KVH*Dh)
        q = self.q_norm(self._heads(q, self.n_heads))  # (B, H, T, Dh)
        k = self.k_norm(self._heads(k, self.n_kv_heads))  # (B, KVH, T, Dh)
        v = self._heads(v, self.n_kv_heads)
        q, k = pos(q, k)
        if cache is not None:
            k, v = cache.append(k, v)
        # With a cache and one new query, every cached key is in the past: no causal mask needed.
        return self.attend(q, k, v, mask, is_causal=causal and q.shape[2] == k.shape[2])


class CrossAttention(_Attention):
    kind = "cross"

    def __init__(self, dim, n_heads, n_kv_heads, head_dim, bias, dropout, scale, qk_norm, score=None):
        super().__init__(dim, n_heads, n_kv_heads, head_dim, bias, dropout, scale, qk_norm, score)
        self.q = Linear(dim, n_heads * head_dim, bias=bias)
        self.kv = Linear(dim, 2 * n_kv_heads * head_dim, bias=bias)

    def _memory_kv(self, memory: torch.Tensor) -> tuple:
        k, v = self.kv(memory).chunk(2, dim=-1)  # (B, S, 2*KVH*Dh) -> 2 x (B, S, KVH*Dh)
        return self.k_norm(self._heads(k, self.n_kv_heads)), self._heads(v, self.n_kv_heads)

    def forward(self, x, memory, memory_mask, cache: LayerCache | None = None):
        """x: the decoder's (B, T, D); memory: the encoder's (B, S, D); memory_mask: (B, 1, T, S) additive or None."""
        q = self.q_norm(self._heads(self.q(x), self.n_heads))  # (B, T, D) -> (B, T, H*Dh) -> (B, H, T, Dh)
        if cache is None:
            k, v = self._memory_kv(memory)
        else:  # the encoder memory does not change while decoding: project it once
            cache.memory_kv = cache.memory_kv or self._memory_kv(memory)
            k, v = cache.memory_kv
        return self.attend(q, k, v, memory_mask, is_causal=False)


@contextmanager
def capture(model: nn.Module) -> Iterator[list[dict]]:
    """Record the attention probabilities of every attention call of `model` (see the module docstring)."""
    maps: list[dict] = []
    scores = []
    for name, module in model.named_modules():
        if isinstance(module, _Attention):
            stack, block = _where(name)
            module.score.record = _recorder(maps, stack, block, _repeats(model, stack), module.kind)
            scores.append(module.score)
    try:
        yield maps
    finally:
        for score in scores:
            score.record = None


def _where(name: str) -> tuple:
    """'decoder.blocks.3.self_attn' -> ('decoder', 3);
    'backbone.encoder.blocks.0.cross_attn' -> ('backbone.encoder', 0)."""
    found = re.search(r"^(.*?)\.?blocks\.(\d+)\.", name)
    return (found.group(1), int(found.group(2))) if found else (name, 0)


def _repeats(model: nn.Module, stack: str) -> tuple:
    """(distinct blocks, applications of each per forward) of a stack: a shared block (model/stack=shared,
    universal) runs at layers i, i + n, i + 2n, ... (lm/zoo/sharing.py)."""
    try:
        module = model.get_submodule(stack)
    except AttributeError:
        return 1, 1
    n = len(getattr(module, "blocks", [])) or 1
    return n, max(1, getattr(module, "depth", n) // n)


def _recorder(maps: list[dict], stack: str, block: int, repeats: tuple, kind: str) -> Callable[[torch.Tensor], None]:
    n_blocks, applications = repeats
    calls = [0]

    def record(probs: torch.Tensor) -> None:
        layer = block + (calls[0] % applications) * n_blocks  # the applied layer, also under sharing
        calls[0] += 1
        maps.append({"stack": stack, "layer": layer, "kind": kind, "probs": probs.detach()})

    return record
