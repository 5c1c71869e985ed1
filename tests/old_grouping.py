"""An LM_PLUGINS module: the weight decay grouping lm had before 2026-11-30 (nn.Linear weights only), so a test's
`lm train` process writes the checkpoint such a run left. Importing it replaces lm.core.optim.param_groups in that
process (lm.core.optim.adamw looks it up at each call); install adds no hooks."""

import torch

import lm.core.optim as optim


def linear_only(model, weight_decay, decay_embeddings=False):
    """lm.core.optim.param_groups as it was: Linear weights decayed, but not a head tied to an embedding table."""
    linear = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    tables = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    decayed = linear | tables if decay_embeddings else linear - tables
    groups = ([], [])
    for p in model.parameters():
        groups[id(p) not in decayed].append(p)
    return [{"params": groups[0], "weight_decay": weight_decay}, {"params": groups[1], "weight_decay": 0.0}]


optim.param_groups = linear_only


def install(hooks) -> None:
    pass
