"""Factorized embeddings (ALBERT, Lan et al. 2019; model/embedding=factorized): Narang et al. 2021's rows.

The token table is V x r (model.embedding.rank) instead of V x D; the core's Embedding (lm/model/heads.py) projects
any nn.Embedding table narrower than model.dim to it (`embed.proj`, r -> D), so the model holds (V + D) r embedding
parameters instead of V D. Tied to the plain softmax output, the output runs the factorization backwards (D -> r
through the projection's transpose, then the table: LMHead's `unfactor`). (This option was the ModelConfig field
model.factorized_embedding: saved configs holding it load through lm/model/upgrade.py.)
"""

from dataclasses import dataclass

from torch import nn

from lm.config_base import ConfigError
from lm.model.config import ModelConfig
from lm.model.options import EmbeddingConfig, option_name
from lm.model.registry import register


@register("embedding")
@dataclass
class FactorizedConfig(EmbeddingConfig):
    """model/embedding=factorized: a vocab_size x rank table, projected to model.dim."""

    _target_: str = "lm.zoo.factorized.factorized_table"
    rank: int = 128  # ALBERT's r (128 of BERT-base's 768)

    def check(self, model: ModelConfig) -> None:
        if not isinstance(self.rank, int) or not 1 <= self.rank < model.dim:
            raise ConfigError(
                f"model.embedding.rank={self.rank!r} must be a rank below model.dim={model.dim} (a table as wide as "
                f"the model is the plain one: drop model/embedding=factorized)"
            )
        if model.output_tied and model.output is not None:
            raise ConfigError(
                f"model/embedding=factorized tied (model.tie_embeddings={model.tie_embeddings}) with model/output="
                f"{option_name(model.output)}: only a plain softmax runs the factorization backwards; set "
                f"model.tie_embeddings=false"
            )


def factorized_table(cfg: ModelConfig, rank: int) -> nn.Embedding:
    """The V x r table; the core's Embedding adds the r -> D projection (`embed.proj`) for a table this narrow."""
    return nn.Embedding(cfg.vocab_size, rank)
