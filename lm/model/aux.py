"""Auxiliary training losses and metrics of model components, and how they leave the model.

Some components add a loss of their own while training (MoE's load-balancing and router z-loss,
lm/model/moe.py) and have numbers worth logging (the fraction of tokens dropped, each expert's load).
They cannot return them through the block (its slots return tensors), so such a component is an
`AuxSource`: each training forward it records (weighted loss, metrics). The model's forward is
wrapped by `collected`: it clears every source first (activation checkpointing re-runs forwards
during backward) and afterwards puts the sum of the losses in `LMOutput.aux_loss` and the mean of
each metric over the sources in `LMOutput.metrics`.

Beyond the model, the protocol is two fields: lm/core/objectives.py adds `aux_loss` to the loss it
backpropagates and hands `metrics` to lm/core/tracking.py's ModelMetrics, which the loop logs as
means over each log interval and over ranks. Nothing outside lm/model names a component.
"""

import functools

import torch
from torch import nn


class AuxSource(nn.Module):
    """A module with training-only losses/metrics. A forward may record several times (a block shared
    over steps, Universal Transformer style); every record counts."""

    def __init__(self):
        super().__init__()
        self._aux: list[tuple[torch.Tensor, dict[str, torch.Tensor]]] = []

    def record_aux(self, loss: torch.Tensor, metrics: dict[str, torch.Tensor]) -> None:
        self._aux.append((loss, {k: v.detach() for k, v in metrics.items()}))

    def pop_aux(self) -> list[tuple[torch.Tensor, dict[str, torch.Tensor]]]:
        records, self._aux = self._aux, []
        return records


def _sources(model: nn.Module) -> list[AuxSource]:
    return [m for m in model.modules() if isinstance(m, AuxSource)]


def collect(model: nn.Module, out):
    """Move what the sources recorded into out.aux_loss (summed) and out.metrics (mean per name)."""
    records = [r for source in _sources(model) for r in source.pop_aux()]
    if not records:
        return out
    out.aux_loss = torch.stack([loss.float() for loss, _ in records]).sum()
    sums: dict[str, list[torch.Tensor]] = {}
    for _, metrics in records:
        for name, value in metrics.items():
            sums.setdefault(name, []).append(value.float())
    # merged: a model may report metrics of its own (a model/family option's: the parts of its own loss)
    out.metrics = {**out.metrics, **{name: torch.stack(values).mean() for name, values in sums.items()}}
    return out


def collected(forward):
    """Decorator for a model's forward returning LMOutput: fresh records in, aux loss and metrics out."""

    @functools.wraps(forward)
    def wrapper(self, *args, **kwargs):
        for source in _sources(self):
            source.pop_aux()  # stale records of an activation-checkpointing recompute
        return collect(self, forward(self, *args, **kwargs))

    return wrapper
