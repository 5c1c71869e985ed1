"""Mixture of softmaxes (Yang et al. 2018, "Breaking the Softmax Bottleneck").

One softmax over h W^T has rank at most dim; a mixture of K softmaxes does not:
    P(y | h) = sum_k pi_k(h) softmax(W h_k)_y,   pi = softmax(W_pi h),   h_k = tanh(W_k h)
with the output matrix W shared by the K components (and tied to the input embedding when
model.tie_embeddings is true, as in Yang et al.). model/output=mixture_of_softmaxes, K = model.output.components
(it was the ModelConfig fields model.output=mixture_of_softmaxes, model.mos_components: lm/model/upgrade.py).
"""

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from lm.config_base import ConfigError
from lm.constants import IGNORE_INDEX
from lm.model.config import ModelConfig
from lm.model.heads import LMOutput, OutputLinear
from lm.model.linear import Linear, MatmulCount
from lm.model.loss import target_mean
from lm.model.options import OutputConfig
from lm.model.registry import register


@register("output")
@dataclass
class MixtureOfSoftmaxesConfig(OutputConfig):
    """model/output=mixture_of_softmaxes (conf/model/output/mixture_of_softmaxes.yaml)."""

    _target_: str = "lm.zoo.mos.MixtureOfSoftmaxes"
    option_file: ClassVar[str] = "mixture_of_softmaxes"
    components: int = 4  # K, the number of softmaxes

    def check(self, model: ModelConfig) -> None:
        if not isinstance(self.components, int) or self.components < 1:
            raise ConfigError(f"model.output.components={self.components} must be a positive integer")
        super().check(model)


class MixtureOfSoftmaxes(MatmulCount, nn.Module):
    """The LM head's interface: forward(h) gives log-probabilities (..., V) that sum to 1 (evaluation
    and sampling use them as logits); output(h, labels) the mean NLL over labels != -100."""

    def __init__(
        self, cfg: ModelConfig, tied: nn.Embedding | None, bias: bool, transform: nn.Module, components: int = 4
    ):
        super().__init__()
        self.k, self.dim = components, cfg.dim
        self.transform = transform
        self.prior = Linear(cfg.dim, self.k, bias=False)  # W_pi
        self.latent = Linear(cfg.dim, self.k * cfg.dim, bias=cfg.bias)  # the K matrices W_k, stacked
        self.proj = OutputLinear(cfg.dim, cfg.vocab_size, bias=bias)  # W, shared by the components
        if tied is not None:
            self.proj.weight = tied.weight
        self.logit_scale = cfg.logit_scale

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x = self.transform(h)  # (..., D)
        log_pi = F.log_softmax(self.prior(x).float(), dim=-1)  # (..., K)
        h_k = torch.tanh(self.latent(x)).unflatten(-1, (self.k, self.dim))  # (..., K*D) -> (..., K, D)
        log_p_k = F.log_softmax(self.proj(h_k * self.logit_scale).float(), dim=-1)  # (..., K, V)
        return torch.logsumexp(log_pi.unsqueeze(-1) + log_p_k, dim=-2)  # log sum_k pi_k p_k: (..., V)

    def output(self, h: torch.Tensor, labels: torch.Tensor | None):
        log_probs = self(h)  # (B, T, V)
        if labels is None:
            return LMOutput(logits=log_probs)
        summed = F.nll_loss(log_probs.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
        loss = target_mean(summed, labels)  # no targets: 0, not NaN (lm/model/loss.py)
        return LMOutput(loss=loss, logits=log_probs.detach())

    def active_matmul_params(self, count) -> float:
        """For lm.model.flops: the prior, the K latent matrices, and the output matrix once per component."""
        return count(self.prior) + count(self.latent) + self.k * count(self.proj)
