"""Mixture-of-experts FFN: `model/ffn=moe` (top-2: Shazeer et al. 2017; GShard, Lepikhin et al. 2021)
and `model/ffn=switch` (top-1: Switch Transformer, Fedus et al. 2021).

A router scores every token against n_experts expert FFNs (each one any `model/ffn` option) and
sends it to its top-k. Gates: top-1 multiplies by the router probability (Switch); top-k > 1
renormalises the k probabilities to sum to 1 (GShard) before any drop.

Which tokens a token competes with (issue 49: a token's output may depend only on what it may see):
- Pads are never routed: they claim no slot, count towards no capacity and get a zero output. The
  block passes the stack's padding in (`forward(x, padding, causal)`).
- Each sequence is its own routing group (GShard's groups, one per sequence): sequences of a batch
  never compete for slots, so a sequence's outputs do not depend on its batch neighbours.
- Training caps each expert at C = ceil(capacity_factor * k * n / E) slots per sequence, n the
  sequence's real tokens (not its padded length, so padding changes nothing; in a padded decoder
  batch a sequence's length, never its later tokens' content, sets its C); choices past an
  expert's capacity are dropped.
  A dropped choice contributes nothing, so a token whose every choice is dropped gets a zero output:
  the block's residual passes it through unchanged.
- Slots go to the choices in a fixed order, each choice kept while fewer than C earlier choices
  claimed its expert. Bidirectional stacks (encoders) use GShard's order (section 2.2): every
  token's first choice before any second choice, in token order within a choice. Causal stacks
  (decoders) serve the choices in position order instead (token t's first, then its second choice,
  then token t+1's), so whether a choice is kept depends only on the tokens at positions <= t: a
  later token can never take an earlier token's slot, and the decoder stays causal in training.
  (Choice-major order is not causal: a later token's first choice would evict an earlier token's
  second choice.)
- Evaluation (model.eval(): validation, finetuning dev/test, generation) drops nothing: every real
  choice reaches its expert, so a token's output is a function of that token alone and cached
  generation (one token per step) equals recomputing the whole sequence. It runs each expert on just
  its tokens, whose counts are read on the host (one sync per layer; a graph break under
  torch.compile): the cost is k, not E, expert passes per token.

Training shapes are fixed whatever the routing, (E, B * C, D) per forward: no host sync, and every
expert takes part in every forward, so DDP needs no find_unused_parameters and FSDP2 / ZeRO-3 shard
the experts like any weight of the block.

While training the layer records (lm/model/aux.py) the auxiliary loss
    aux_loss_weight * E * sum_e f_e P_e        (load balancing, Switch eq. 4)
  + z_loss_weight * mean_tokens(logsumexp(router logits)^2)      (router z-loss, Zoph et al. 2022)
with f_e the fraction of the real tokens' k router choices that pick expert e and P_e the mean router
probability of e over the real tokens (pads count in neither). GShard counts only first choices in f;
counting all k and dividing by k keeps the balance term's minimum at 1 for every k (reached when P is
uniform, or f is).
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from lm.model.aux import AuxSource
from lm.model.block import TokenRouter
from lm.model.linear import MatmulCount


@dataclass
class Routing:
    """Where each of the (G, T) tokens' k choices goes, G routing groups (sequences) of T tokens. The
    expert buffer is (E, G, C) slots flattened, plus a dump slot E*G*C for dropped choices and pads."""

    expert: torch.Tensor  # (G, T, k) chosen experts, best first
    gate: torch.Tensor  # (G, T, k) combine weights, 0 where dropped
    slot: torch.Tensor  # (G, T, k) row of the flattened (E*G*C + 1, D) expert buffer
    kept: torch.Tensor  # (G, T, k) bool; False for every choice of a pad
    capacity: int  # C: buffer slots per expert per group


def expert_capacity(n_tokens: int, n_experts: int, top_k: int, capacity_factor: float) -> int:
    """Slots per expert for n tokens: the even share of the n*k choices times the factor, at least 1, at
    most n (a token reaches an expert at most once)."""
    return min(n_tokens, max(1, math.ceil(capacity_factor * top_k * n_tokens / n_experts)))


def sequence_capacity(n_real: torch.Tensor, n_experts: int, top_k: int, capacity_factor: float) -> torch.Tensor:
    """expert_capacity of each sequence's count of real tokens, (G,) -> (G,), on the device (no host sync);
    the same arithmetic in float64, as Python's."""
    share = torch.ceil(n_real.double() * (capacity_factor * top_k) / n_experts).long()
    return share.clamp(min=1).minimum(n_real.long())


def choose(probs: torch.Tensor, top_k: int):
    """(..., E) router probabilities -> (gate, expert), each (..., k): distinct experts, best first."""
    gate, expert = probs.topk(top_k, dim=-1)
    if top_k > 1:
        gate = gate / gate.sum(-1, keepdim=True)
    return gate, expert


def route(
    probs: torch.Tensor,
    top_k: int,
    capacity: int,
    real: torch.Tensor | None = None,
    causal: bool = False,
    limit: torch.Tensor | None = None,
) -> Routing:
    """probs: (G, T, E) router probabilities -> each token's top-k choices, at most `capacity` (or the
    group's `limit`, (G,) <= capacity) kept per expert and group. real: (G, T) bool, False for pads,
    which claim nothing. Choices are served in the order the module docstring gives: position-major
    when `causal`, else choice-major; a choice is kept while fewer than the limit claimed its expert
    before it."""
    G, T, n_experts = probs.shape
    gate, expert = choose(probs, top_k)  # (G, T, k)
    claiming = torch.ones_like(expert, dtype=torch.bool) if real is None else real[..., None].expand_as(expert)
    # Each group's choices in serve order, read row-major: (T, k) is position-major, (k, T) choice-major.
    # The transpose is its own inverse, so `serve` also maps back to (G, T, k).
    serve = (lambda t: t) if causal else (lambda t: t.transpose(1, 2))
    queue = serve(expert).reshape(G, T * top_k)  # (G, T*k): each choice's expert, in serve order
    claims = F.one_hot(queue, n_experts) * serve(claiming).reshape(G, T * top_k, 1)  # (G, T*k, E); pads claim nothing
    earlier = claims.cumsum(1).gather(2, queue[..., None]) - 1  # claims on the same expert before this one
    taken = serve(earlier.view(serve(expert).shape))  # (G, T, k)
    kept = claiming & (taken < (capacity if limit is None else limit.view(G, 1, 1)))
    group = torch.arange(G, device=probs.device).view(G, 1, 1)
    slot = torch.where(kept, (expert * G + group) * capacity + taken, n_experts * G * capacity)
    return Routing(expert, gate * kept, slot, kept, capacity)


def _mean(values: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """Mean over the first dimension, over the rows of weight 1 only (the real tokens) when given."""
    if weight is None:
        return values.mean(0)
    weight = weight.to(values.dtype).view(-1, *([1] * (values.dim() - 1)))  # (N,) -> (N, 1, ...) like values
    return (values * weight).sum(0) / weight.sum().clamp(min=1)


def balance_loss(probs: torch.Tensor, expert: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """E * sum_e f_e P_e: f_e the fraction of the N*k choices picking e (no gradient), P_e its mean probability.
    probs (N, E), expert (N, k); weight (N,): 1 for the tokens that count (real), 0 for pads."""
    n_experts = probs.shape[1]
    f = _mean(F.one_hot(expert, n_experts).float().mean(1), weight)  # (E,)
    return n_experts * (f * _mean(probs, weight)).sum()


class MoE(MatmulCount, AuxSource, TokenRouter):
    """Top-k routed mixture of `n_experts` FFNs built by `expert(dim, bias=..., dropout=...)`."""

    def __init__(
        self,
        dim: int,
        expert: Callable[..., nn.Module],
        bias: bool = True,
        dropout: float = 0.0,
        n_experts: int = 8,
        top_k: int = 2,
        capacity_factor: float = 1.25,
        aux_loss_weight: float = 0.01,
        z_loss_weight: float = 0.0,
        router_jitter: float = 0.0,
        activation=None,
        hidden_mult=None,
        multiple_of=None,
        hidden_dim=None,
    ):
        # activation/hidden_mult/multiple_of/hidden_dim: FFNConfig's dense fields, unused here (validate_model
        # refuses values other than their defaults); the expert node holds the experts' own.
        super().__init__()
        self.n_experts, self.top_k, self.capacity_factor = n_experts, top_k, capacity_factor
        self.aux_loss_weight, self.z_loss_weight, self.router_jitter = aux_loss_weight, z_loss_weight, router_jitter
        self.router = nn.Linear(dim, n_experts, bias=False)
        self.experts = nn.ModuleList(expert(dim, bias=bias, dropout=dropout) for _ in range(n_experts))

    def capacity(self, n_tokens: int) -> int:
        """Slots per expert for a sequence of n_tokens tokens."""
        return expert_capacity(n_tokens, self.n_experts, self.top_k, self.capacity_factor)

    def router_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """(..., D) -> (..., E) in fp32: the softmax over experts is unstable in half precision (Switch section 2.4)."""
        if self.training and self.router_jitter:
            tokens = tokens * torch.empty_like(tokens).uniform_(1 - self.router_jitter, 1 + self.router_jitter)
        with torch.autocast(tokens.device.type, enabled=False):
            return F.linear(tokens.float(), self.router.weight.float())

    def forward(self, x: torch.Tensor, padding: torch.Tensor | None = None, causal: bool = False) -> torch.Tensor:
        """x: (B, T, D); padding: (B, T), 1 for tokens and 0 for pads (None: no pads); causal: the stack's
        attention is causal (a decoder), so training serves slots in position order."""
        real = None if padding is None else padding.bool()
        logits = self.router_logits(x)  # (B, T, E)
        probs = logits.softmax(-1)
        if not self.training:
            gate, expert = choose(probs, self.top_k)
            kept = torch.ones_like(expert, dtype=torch.bool) if real is None else real[..., None].expand_as(expert)
            return self._dropless(x, expert, gate * kept, kept)
        # each sequence's real tokens set its capacity, whatever the padded length
        limit = (
            None if real is None else sequence_capacity(real.sum(1), self.n_experts, self.top_k, self.capacity_factor)
        )
        r = route(probs, self.top_k, self.capacity(x.shape[1]), real, causal, limit)
        y = self._dispatch(x, r)
        # Last: activation checkpointing's recompute stops once it has the saved tensors (early stop), so it
        # never records twice
        self._record(logits, probs, r, real)
        return y

    def _dispatch(self, x: torch.Tensor, r: Routing) -> torch.Tensor:
        """Training: every kept choice's token copied into its expert's slot, the experts run on their (B*C, D)
        slots, and each token sums its choices' outputs times their gates."""
        B, T, D = x.shape
        E, k = self.n_experts, self.top_k
        tokens = x.reshape(B * T, D)
        # Dropped choices and pads all land in the dump row E*B*C, which no expert reads.
        buffer = tokens.new_zeros(E * B * r.capacity + 1, D).index_add(
            0, r.slot.flatten(), tokens.repeat_interleave(k, 0)
        )
        expert_in = buffer[:-1].view(E, B * r.capacity, D)
        outs = [expert(expert_in[e]) for e, expert in enumerate(self.experts)]  # E x (B*C, D)
        expert_out = torch.cat(outs + [outs[0].new_zeros(1, D)])  # (E*B*C + 1, D); the dump row reads zeros
        picked = expert_out[r.slot.flatten()].view(B * T, k, D)  # each choice's expert output
        y = (picked * r.gate.reshape(B * T, k).to(picked.dtype)[..., None]).sum(1)  # (N, D)
        return y.view(B, T, D)

    def _dropless(self, x: torch.Tensor, expert: torch.Tensor, gate: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
        """Evaluation: each expert runs on exactly the tokens that chose it (nothing dropped); pads (not kept)
        run nowhere and get zeros. Sums the k choices in the same order as _dispatch."""
        B, T, D = x.shape
        E, k = self.n_experts, self.top_k
        tokens = x.reshape(B * T, D)
        claim = torch.where(kept, expert, E).flatten()  # (N*k,) the expert of each choice; E = none (a pad)
        order = claim.argsort(stable=True)  # choices grouped by expert
        counts = torch.bincount(claim, minlength=E + 1).tolist()  # the host sync: chunk sizes
        served = order[: len(order) - counts[E]]
        chunks = tokens[served // k].split(counts[:E])
        # Every expert runs, an empty chunk too: a sharded engine (ZeRO-3, FSDP) gathers an expert's weights in
        # its forward, a collective that every rank must join whatever its own tokens chose.
        outs = torch.cat([self.experts[e](chunk) for e, chunk in enumerate(chunks)])
        picked = outs.new_zeros(B * T * k, D).index_copy(0, served, outs)  # (N*k, D), zeros for pads
        y = (picked.view(B * T, k, D) * gate.reshape(B * T, k).to(picked.dtype)[..., None]).sum(1)
        return y.view(B, T, D)

    def _record(self, logits: torch.Tensor, probs: torch.Tensor, r: Routing, real: torch.Tensor | None) -> None:
        E, k = self.n_experts, self.top_k
        weight = None if real is None else real.flatten()  # pads count in no loss or metric
        # (B, T, E) -> (N, E); (B, T, k) -> (N, k), N = B*T tokens
        flat_probs, expert, kept = probs.reshape(-1, E), r.expert.reshape(-1, k), r.kept.reshape(-1, k)
        balance = balance_loss(flat_probs, expert, weight)
        z = _mean(torch.logsumexp(logits.reshape(-1, E), -1).pow(2), weight)
        load = _mean(F.one_hot(expert, E).float().mean(1), weight)  # (E,) share of the choices
        metrics = {
            "moe/balance_loss": balance,
            "moe/z_loss": z,
            "moe/dropped_tokens": _mean((~kept.any(1)).float(), weight),  # every choice dropped: residual only
            "moe/dropped_choices": _mean((~kept).float().mean(1), weight),
        }
        metrics.update({f"moe/load_e{e}": load[e] for e in range(E)})
        self.record_aux(self.aux_loss_weight * balance + self.z_loss_weight * z, metrics)

    def active_matmul_params(self, count: Callable[[nn.Module], float]) -> float:
        """Matmul weights one token uses (lm/model/flops.py): the router and k experts, not all E."""
        return self.router.weight.numel() + self.top_k * count(self.experts[0])


class Switch(MoE):
    """model/ffn=switch: the same layer with top-1 defaults (SwitchConfig)."""

    def __init__(self, dim: int, expert: Callable[..., nn.Module], top_k: int = 1, capacity_factor: float = 1.0, **kw):
        super().__init__(dim, expert, top_k=top_k, capacity_factor=capacity_factor, **kw)
