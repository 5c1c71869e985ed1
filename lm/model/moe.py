"""Mixture-of-experts FFN: `model/ffn=moe` (top-2: Shazeer et al. 2017; GShard, Lepikhin et al. 2021)
and `model/ffn=switch` (top-1: Switch Transformer, Fedus et al. 2021).

A router scores every token against n_experts expert FFNs (each one any `model/ffn` option) and
sends it to its top-k. An expert takes at most C = ceil(capacity_factor * k * N / E) of the N tokens of
a forward; choices past its capacity are dropped. Slots are filled choice by choice (every token's
first choice before any second choice, GShard section 2.2) and in token order within a choice. A
dropped choice contributes nothing, so a token whose every choice is dropped gets a zero output: the
block's residual passes it through unchanged. Gates: top-1 multiplies by the router probability
(Switch); top-k > 1 renormalises the k probabilities to sum to 1 (GShard) before any drop.

Shapes are fixed whatever the routing, (E, C, D) per forward: no host sync, and every expert takes
part in every forward, so DDP needs no find_unused_parameters and FSDP2 / ZeRO-3 shard the experts
like any weight of the block.

While training the layer records (lm/model/aux.py) the auxiliary loss
    aux_loss_weight * E * sum_e f_e P_e        (load balancing, Switch eq. 4)
  + z_loss_weight * mean_tokens(logsumexp(router logits)^2)      (router z-loss, Zoph et al. 2022)
with f_e the fraction of the N*k router choices that pick expert e and P_e the mean router
probability of e. GShard counts only first choices in f; counting all k and dividing by k keeps the
balance term's minimum at 1 for every k (reached when P is uniform, or f is).
"""

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from lm.model.aux import AuxSource
from lm.model.linear import MatmulCount


@dataclass
class Routing:
    """Where each of the N tokens' k choices goes. Dropped choices point at the dump slot E*C."""

    expert: torch.Tensor  # (N, k) chosen experts, best first
    gate: torch.Tensor  # (N, k) combine weights, 0 where dropped
    slot: torch.Tensor  # (N, k) row of the flattened (E*C + 1, D) expert buffer
    kept: torch.Tensor  # (N, k) bool
    capacity: int


def expert_capacity(n_tokens: int, n_experts: int, top_k: int, capacity_factor: float) -> int:
    """Slots per expert: the even share of the N*k choices times the factor, at least 1, at most N
    (a token reaches an expert at most once)."""
    return min(n_tokens, max(1, math.ceil(capacity_factor * top_k * n_tokens / n_experts)))


def route(probs: torch.Tensor, top_k: int, capacity: int) -> Routing:
    """probs: (N, E) router probabilities -> the top-k choices of each token, capped at `capacity` per expert."""
    n_experts = probs.shape[1]
    gate, expert = probs.topk(top_k, dim=-1)  # (N, k), distinct experts per token
    if top_k > 1:
        gate = gate / gate.sum(-1, keepdim=True)
    filled = torch.zeros(n_experts, dtype=torch.long, device=probs.device)  # slots taken by earlier choices
    slots, kept = [], []
    for r in range(top_k):
        onehot = F.one_hot(expert[:, r], n_experts)  # (N, E)
        position = (onehot.cumsum(0) - 1 + filled).gather(1, expert[:, r:r + 1]).squeeze(1)  # (N,)
        ok = position < capacity
        filled = filled + (onehot * ok[:, None]).sum(0)
        slots.append(torch.where(ok, expert[:, r] * capacity + position, n_experts * capacity))
        kept.append(ok)
    kept_t = torch.stack(kept, 1)
    return Routing(expert, gate * kept_t, torch.stack(slots, 1), kept_t, capacity)


def balance_loss(probs: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
    """E * sum_e f_e P_e: f_e the fraction of the N*k choices picking e (no gradient), P_e its mean probability."""
    n_experts = probs.shape[1]
    f = F.one_hot(expert, n_experts).float().mean((0, 1))  # (E,)
    return n_experts * (f * probs.mean(0)).sum()


class MoE(MatmulCount, AuxSource):
    """Top-k routed mixture of `n_experts` FFNs built by `expert(dim, bias=..., dropout=...)`."""

    def __init__(self, dim: int, expert: Callable[..., nn.Module], bias: bool = True, dropout: float = 0.0,
                 n_experts: int = 8, top_k: int = 2, capacity_factor: float = 1.25, aux_loss_weight: float = 0.01,
                 z_loss_weight: float = 0.0, router_jitter: float = 0.0, activation=None, hidden_mult=None,
                 multiple_of=None, hidden_dim=None):
        # activation/hidden_mult/multiple_of/hidden_dim: FFNConfig's dense fields, unused here (validate_model
        # refuses values other than their defaults); the expert node holds the experts' own.
        super().__init__()
        self.n_experts, self.top_k, self.capacity_factor = n_experts, top_k, capacity_factor
        self.aux_loss_weight, self.z_loss_weight, self.router_jitter = aux_loss_weight, z_loss_weight, router_jitter
        self.router = nn.Linear(dim, n_experts, bias=False)
        self.experts = nn.ModuleList(expert(dim, bias=bias, dropout=dropout) for _ in range(n_experts))

    def capacity(self, n_tokens: int) -> int:
        return expert_capacity(n_tokens, self.n_experts, self.top_k, self.capacity_factor)

    def router_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """(N, D) -> (N, E) in fp32: the softmax over experts is unstable in half precision (Switch section 2.4)."""
        if self.training and self.router_jitter:
            tokens = tokens * torch.empty_like(tokens).uniform_(1 - self.router_jitter, 1 + self.router_jitter)
        with torch.autocast(tokens.device.type, enabled=False):
            return F.linear(tokens.float(), self.router.weight.float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        tokens = x.reshape(B * T, D)  # (N, D)
        logits = self.router_logits(tokens)
        probs = logits.softmax(-1)
        r = route(probs, self.top_k, self.capacity(B * T))
        E, C, k = self.n_experts, r.capacity, self.top_k
        # Each choice's token copied into its expert's slot; dropped choices all land in the dump row E*C.
        buffer = tokens.new_zeros(E * C + 1, D).index_add(0, r.slot.flatten(), tokens.repeat_interleave(k, 0))
        expert_in = buffer[:-1].view(E, C, D)  # (E*C, D) -> (E, C, D)
        outs = [expert(expert_in[e]) for e, expert in enumerate(self.experts)]  # E x (C, D)
        expert_out = torch.cat(outs + [outs[0].new_zeros(1, D)])  # (E*C + 1, D); the dump row reads zeros
        picked = expert_out[r.slot.flatten()].view(B * T, k, D)  # each choice's expert output
        y = (picked * r.gate.to(picked.dtype)[..., None]).sum(1)  # (N, D)
        if self.training:
            self._record(logits, probs, r)
        return y.view(B, T, D)

    def _record(self, logits: torch.Tensor, probs: torch.Tensor, r: Routing) -> None:
        balance = balance_loss(probs, r.expert)
        z = torch.logsumexp(logits, -1).pow(2).mean()
        load = F.one_hot(r.expert, self.n_experts).float().mean((0, 1))  # (E,) share of the choices
        metrics = {"moe/balance_loss": balance, "moe/z_loss": z,
                   "moe/dropped_tokens": (~r.kept.any(1)).float().mean(),  # every choice dropped: residual only
                   "moe/dropped_choices": (~r.kept).float().mean()}
        metrics.update({f"moe/load_e{e}": load[e] for e in range(self.n_experts)})
        self.record_aux(self.aux_loss_weight * balance + self.z_loss_weight * z, metrics)

    def active_matmul_params(self, count: Callable[[nn.Module], float]) -> float:
        """Matmul weights one token uses (lm/model/flops.py): the router and k experts, not all E."""
        return self.router.weight.numel() + self.top_k * count(self.experts[0])


class Switch(MoE):
    """model/ffn=switch: the same layer with top-1 defaults (SwitchConfig)."""

    def __init__(self, dim: int, expert: Callable[..., nn.Module], top_k: int = 1, capacity_factor: float = 1.0,
                 **kw):
        super().__init__(dim, expert, top_k=top_k, capacity_factor=capacity_factor, **kw)
