"""ELECTRA (Clark et al. 2020): pretraining an encoder by replaced-token detection (model/family=electra).

A small masked-LM generator fills the masked positions of the MLM batch with tokens sampled from its
softmax; the discriminator, an encoder of the model's full size, predicts for every token whether it
was replaced. The loss is the generator's MLM loss plus lambda (model.family.disc_weight, 50 in the
paper) times the discriminator's binary cross-entropy over the real tokens. Learning from every token
rather than the 15% masked ones is what makes it pay at small compute (ELECTRA-Small: GLUE dev 79.9
against 75.1 for a BERT-Small of the same size).

As in ELECTRA's code (its pretrain_helpers.py and run_pretraining.py): the masked positions of the mlm batch are
[MASK] at 85% and keep their token at 15%, with no random tokens (ElectraConfig.mlm_corruption, which lm train's
loader reads); every masked position gets a sample, and a sample that equals the original is labelled original.
Samples are drawn over the whole vocabulary, special tokens included, as that code draws them (its
`disallow` mask is off by default): the generator is trained never to predict them (no masked position holds
one), so after the first steps it all but never samples them; this model has no tokenizer to name them by.

Parameter names: the discriminator's parts are EncoderLM's (`embed.*`, `encoder.*`), so finetuning
(lm/glue/init.py build_classifier) loads them into a plain EncoderLM; `head.*` (the per-token binary
head) and `generator.*` are pretraining-only. The generator reads the discriminator's token (and
segment) embeddings `embed` and predicts through the same table, tied as in the paper. Its stack is a
Stack at its own width with its own position scheme: here positions live in each Stack
(lm/model/stack.py), not in the shared embedding module.

Finetuning builds the plain encoder (ElectraConfig.finetuned), so lm finetune, lm transfer's scratch arm and
lm glue read no ELECTRA code.
"""

from dataclasses import dataclass, replace
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from lm.config_base import ConfigError
from lm.constants import IGNORE_INDEX
from lm.model import aux
from lm.model.choices import Arch
from lm.model.config import ModelConfig
from lm.model.heads import Embedding, LMOutput, head_activation, make_head, mlm_transform
from lm.model.linear import Linear, MatmulCount
from lm.model.lm import MASKED_FRACTION, _LanguageModel
from lm.model.options import FamilyConfig, MoEConfig, option_name, positive
from lm.model.registry import register
from lm.model.stack import Components, Stack, make_stack
from lm.model.validate import validate_model
from lm.zoo.factorized import FactorizedConfig

# Evaluation samples replacements from its own generator with this seed: val losses stay comparable
# across evaluations, and evaluating does not move the global RNG that training samples from.
EVAL_SEED = 0


# -- the option schema (conf/model/family/electra.yaml) -------------------------------------------------------


@register("family")
@dataclass
class ElectraConfig(FamilyConfig):
    """model/family=electra: pretrain the encoder as ELECTRA's discriminator (Clark et al. 2020): a small masked-LM
    generator, reading the same token embeddings, fills the masked positions with samples; the encoder
    learns to tell replaced tokens from original ones. Finetuning keeps the discriminator only.

    The defaults are ELECTRA-Small's generator (a quarter of the discriminator's 256 width, one head of 64,
    as deep as the discriminator) and its loss weight lambda = 50.
    """

    _target_: str = "lm.zoo.electra.ElectraLM"
    nll_loss: ClassVar[bool] = False  # MLM + lambda x BCE: its exp is no perplexity
    # ELECTRA's masking (its pretrain_helpers.mask): 85% of the predicted positions become [MASK], 15% stay, no random
    # tokens; BERT's 10% random tokens would only blur the generator's input (every one is replaced by a sample anyway)
    mlm_corruption: ClassVar[tuple[float, float]] = (0.85, 0.0)
    generator_dim: int = 64
    generator_heads: int = 1
    generator_ffn_dim: int | None = None  # None = model/ffn's hidden_mult x generator_dim (4x for an MLP)
    generator_layers: int | None = None  # None = model.n_layers
    disc_weight: float = 50.0  # lambda: loss = generator MLM loss + lambda * discriminator BCE
    temperature: float = 1.0  # replacements are sampled from softmax(generator logits / temperature)

    def build(self, model: ModelConfig, components) -> "ElectraLM":
        return ElectraLM(model, components(model), components(self.generator_config(model)))

    def finetuned(self, model: ModelConfig) -> ModelConfig:
        """The discriminator is a plain EncoderLM (its parameter names are EncoderLM's)."""
        return replace(model, family=None)

    def generator_config(self, model: ModelConfig) -> ModelConfig:
        """The generator's stack: the model's options at the generator's width, heads and depth, in a plain
        Stack (no model/stack option: no Funnel pooling, no sharing) and no table of its own (model/embedding):
        ELECTRA's generator is a small BERT, and it reads the discriminator's embeddings through its own projection."""
        hidden = self.generator_ffn_dim  # None: derived from the generator's width by the FFN option
        ffn = model.ffn
        ffn = (
            replace(ffn, expert=replace(ffn.expert, hidden_dim=hidden))
            if isinstance(ffn, MoEConfig)
            else replace(ffn, hidden_dim=hidden)
        )
        return replace(
            model,
            dim=self.generator_dim,
            n_heads=self.generator_heads,
            n_kv_heads=None,
            head_dim=None,
            n_layers=self.generator_layers or model.n_layers,
            ffn=ffn,
            stack=None,
            embedding=None,
            family=None,
        )

    def unread(self, model: ModelConfig) -> str | None:
        if not model.sparse_prediction:
            return (
                "model.sparse_prediction=false has no effect with model/family=electra: its generator predicts at "
                "the masked positions only and its discriminator at every token, whatever it says; drop the override"
            )
        return None

    def check(self, model: ModelConfig) -> None:
        """An encoder; the generator's numbers make a model; the model's output layer is one the generator can
        sample."""
        if model.arch != Arch.encoder:
            raise ConfigError(
                f"model/family=electra with model.arch={model.arch.value}: ELECTRA's replaced-token detection "
                f"pretrains a bidirectional encoder (its discriminator); set model.arch=encoder (as "
                f"experiment=glue_transfer_electra does) or remove model/family=electra"
            )
        for name in ("generator_dim", "generator_heads"):
            positive(f"family.{name}", getattr(self, name))
        for name in ("generator_ffn_dim", "generator_layers"):
            if getattr(self, name) is not None:
                positive(f"family.{name}", getattr(self, name))
        if self.generator_dim % self.generator_heads:
            raise ConfigError(
                f"model.family.generator_dim={self.generator_dim} is not divisible by "
                f"model.family.generator_heads={self.generator_heads}; ELECTRA's generators use heads of 64 "
                f"(generator_heads={max(1, self.generator_dim // 64)})"
            )
        if not self.disc_weight > 0:
            raise ConfigError(
                f"model.family.disc_weight={self.disc_weight} must be > 0 (the paper's lambda is 50); "
                f"without it the discriminator, the model that is finetuned, learns nothing"
            )
        if not self.temperature > 0:
            raise ConfigError(
                f"model.family.temperature={self.temperature} must be > 0 (1.0 samples the generator's softmax as "
                f"it is)"
            )
        table = model.embedding is None or isinstance(model.embedding, FactorizedConfig)  # a (V, r <= D) matrix
        if not table or model.output is not None or model.loss_chunk_size:
            raise ConfigError(
                f"model/family=electra with model/embedding={_named(model.embedding)}, model/output="
                f"{_named(model.output)}, model.loss_chunk_size={model.loss_chunk_size}: the generator samples "
                f"its replacements from a plain softmax over the token table, so it needs model.embedding=null "
                f"(or factorized), model.output=null and model.loss_chunk_size=0"
            )
        try:
            validate_model(self.generator_config(model))
        except ConfigError as err:
            raise ConfigError(
                f"model/family=electra's generator (model.family.generator_dim={self.generator_dim}, generator_heads="
                f"{self.generator_heads}, the model's other options) cannot be built: {err}"
            ) from None


def _named(node) -> str:
    """An optional slot's option name for messages: null when unset."""
    return "null" if node is None else option_name(node)


# -- the models --------------------------------------------------------------------------------------------------


class DiscriminatorHead(nn.Module):
    """ELECTRA's discriminator head: dense + activation, then one logit per token (> 0: replaced)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense = Linear(cfg.dim, cfg.dim)
        self.act = head_activation(cfg)
        self.proj = Linear(cfg.dim, 1)  # `proj`: the output layer Fixup starts at 0 (lm/model/init.py)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.proj(self.act(self.dense(h))).squeeze(-1)  # (B, T, D) -> (B, T, 1) -> (B, T)


class Generator(MatmulCount, nn.Module):
    """ELECTRA's generator: a narrow masked LM on the discriminator's embeddings. The paper finds a
    generator 1/4 to 1/2 of the discriminator's width works best: a stronger one makes the task too hard."""

    def __init__(self, cfg: ModelConfig, c: Components, embed: Embedding):
        """cfg: the discriminator's (the model's) config; c: the components built for the generator's config."""
        super().__init__()
        assert isinstance(cfg.family, ElectraConfig)
        gen = cfg.family.generator_config(cfg)
        self.project = Linear(cfg.dim, gen.dim)  # ELECTRA's embeddings_project: the shared table is model.dim wide
        self.encoder = Stack(gen, c, gen.n_layers, causal=False)
        # Back to the table's width (dense + activation + norm), then the tied output: ELECTRA's MLM head.
        transform = mlm_transform(cfg, c.norm(cfg.dim, eps=cfg.norm_eps), in_dim=gen.dim)
        tied = cfg.output_tied
        self.head = make_head(cfg, c.output, embed.tok if tied else None, True, transform, embed.proj if tied else None)

    def forward(self, x: torch.Tensor, padding, where: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """x: the shared embeddings of the masked input (B, T, D); where: the N masked positions (rows,
        columns). Logits (N, V) at those positions only: the vocabulary projection is the expensive part."""
        h = self.encoder(self.project(x), padding)  # (B, T, D) -> (B, T, Dg)
        return self.head(h[where])  # (N, Dg) -> (N, V)

    def active_matmul_params(self, count) -> float:
        """lm.model.flops: the head runs at the masked positions only."""
        return count(self.project) + count(self.encoder) + MASKED_FRACTION * count(self.head)


class ElectraLM(MatmulCount, _LanguageModel):
    """ELECTRA: a discriminator (EncoderLM's embeddings and stack + a binary head) and a small generator."""

    def __init__(self, cfg: ModelConfig, c: Components, generator_components: Components):
        super().__init__(cfg, c)
        self.encoder = make_stack(cfg, c, cfg.n_layers, causal=False)
        self.head = DiscriminatorHead(cfg)
        self.generator = Generator(cfg, generator_components, self.embed)
        assert isinstance(cfg.family, ElectraConfig)
        self.disc_weight = cfg.family.disc_weight
        self.temperature = cfg.family.temperature

    def features(self, input_ids, attention_mask=None, token_type_ids=None) -> torch.Tensor:
        return self.encoder(self.embed(input_ids, token_type_ids), attention_mask)  # (B, T, D)

    def classify_features(self, input_ids, attention_mask=None, token_type_ids=None):
        return self.encoder.pooled_forward(self.embed(input_ids, token_type_ids), attention_mask)

    @aux.collected
    def forward(self, input_ids, labels=None, attention_mask=None, token_type_ids=None) -> LMOutput:
        """labels: the MLM batch's (-100 except at the masked positions; lm.data.packed builds it for
        arch=encoder). Without labels: the discriminator's logits (B, T) on input_ids as they are."""
        if labels is None:
            return LMOutput(logits=self.head(self.features(input_ids, attention_mask, token_type_ids)))
        masked = labels != IGNORE_INDEX  # (B, T)
        # The one device sync of the forward: N, the number of masked positions, sets the generator head's shapes.
        where = masked.nonzero(as_tuple=True)  # rows (N,), columns (N,)
        gen_logits = self.generator(self.embed(input_ids, token_type_ids), attention_mask, where)  # (N, V)
        # Summed over the N masked positions, then / N: a micro-batch with none gives 0, not F.cross_entropy's NaN mean
        gen_loss = F.cross_entropy(gen_logits.float(), labels[where], reduction="sum") / max(1, where[0].numel())
        # Every masked position gets a sample, [MASK]ed or not; the batch's other tokens are the originals.
        corrupted = input_ids.index_put(where, self.sample(gen_logits.detach()).to(input_ids.dtype))  # (B, T)
        original = torch.where(masked, labels, input_ids)  # (B, T)
        # A sample that equals the original counts as original (the paper's labels), so the target is the comparison.
        replaced = (corrupted != original).float()  # (B, T)
        disc_logits = self.head(self.features(corrupted, attention_mask, token_type_ids))  # (B, T)
        real = attention_mask.float() if attention_mask is not None else torch.ones_like(replaced)  # (B, T)
        n_real = real.sum().clamp(min=1)
        bce = F.binary_cross_entropy_with_logits(disc_logits.float(), replaced, reduction="none")  # (B, T)
        disc_loss = (bce * real).sum() / n_real  # a weighted mean: indexing the real tokens would sync again
        metrics = {}
        if self.training:  # evaluation records nothing (lm/model/aux.py): the loop logs training means only
            correct = ((disc_logits.detach() > 0).float() == replaced).float()
            metrics = {
                "electra/gen_loss": gen_loss.detach(),
                "electra/disc_loss": disc_loss.detach(),
                "electra/disc_accuracy": (correct * real).sum() / n_real,
                "electra/replaced": (replaced * real).sum() / n_real,
            }
        return LMOutput(loss=gen_loss + self.disc_weight * disc_loss, logits=disc_logits.detach(), metrics=metrics)

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        """Replacements (N,) drawn from softmax(logits / temperature) (N, V), as ELECTRA samples them; no
        gradient flows through a sample. Training draws from torch's global RNG, which checkpoints restore
        (exact resume); evaluation from a fixed-seed generator of its own (EVAL_SEED)."""
        probs = F.softmax(logits.float() / self.temperature, dim=-1)  # (N, V)
        rng = None if self.training else torch.Generator(device=logits.device).manual_seed(EVAL_SEED)
        return torch.multinomial(probs, 1, generator=rng).squeeze(-1)  # (N, 1) -> (N,)

    def active_matmul_params(self, count) -> float:
        """lm.model.flops: the discriminator reads every token, the generator's head the masked ones only."""
        return sum(
            count(m) for name, m in self.named_children() if name != "generator"
        ) + self.generator.active_matmul_params(count)
