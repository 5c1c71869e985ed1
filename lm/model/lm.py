"""The three model families as thin wrappers around Stack, and a sequence classifier for all three.

| model            | stacks | causal              | cross-attention | head                  |
| DecoderLM        | 1      | yes                 | no              | LM head (tied or not) |
| EncoderLM        | 1      | no                  | no              | MLM head              |
| EncoderDecoderLM | 2      | encoder no, dec yes | decoder yes     | LM head on decoder    |

Batch conventions (see lm/core/objectives.py): decoder labels are already aligned with input_ids (the
loader shifts them); encoder labels are -100 except at masked positions; encoder-decoder labels
align with decoder_input_ids (built by shifting labels right when not given, as in T5).
"""

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from lm.constants import IGNORE_INDEX
from lm.model import aux
from lm.model.attention import LayerCache
from lm.model.heads import Embedding, LMOutput, make_head, mlm_transform, pool, whitening
from lm.model.linear import MatmulCount
from lm.model.stack import Components, make_stack

if TYPE_CHECKING:  # model code reads the config's values; it does not need its schema module to run
    from lm.model.config import ModelConfig


class _LanguageModel(nn.Module):
    def __init__(self, cfg: "ModelConfig", c: Components):
        super().__init__()
        self.cfg = cfg
        self.embed = Embedding(cfg, c.embedding)

    def _head(self, c: Components, bias: bool, transform: nn.Module) -> nn.Module:
        tied = self.cfg.output_tied
        return make_head(
            self.cfg, c.output, self.embed.tok if tied else None, bias, transform, self.embed.proj if tied else None
        )

    def classify_features(self, input_ids, attention_mask=None, token_type_ids=None):
        """(hidden states, padding) for a sequence classifier."""
        return self.features(input_ids, attention_mask, token_type_ids), attention_mask

    def num_params(self, exclude_embeddings: bool = False) -> int:
        """exclude_embeddings: without the token tables (each input table: two when an encoder-decoder's
        stacks have their own)."""
        n = sum(p.numel() for p in self.parameters())
        tables = sum(p.numel() for m in self.modules() if isinstance(m, Embedding) for p in m.tok.parameters())
        return n - tables if exclude_embeddings else n

    def pooled(self, input_ids, attention_mask=None, token_type_ids=None, how: str = "last") -> torch.Tensor:
        """(B, D): one vector per sequence for a classifier (a model/family option's model may pool its own way)."""
        h, padding = self.classify_features(input_ids, attention_mask, token_type_ids)  # (B, T', D)
        return pool(h, padding, how)


class DecoderLM(_LanguageModel):
    """GPT / Llama: one causal stack and an LM head."""

    def __init__(self, cfg: "ModelConfig", c: Components):
        super().__init__(cfg, c)
        self.decoder = make_stack(cfg, c, cfg.n_layers, causal=True)
        self.head = self._head(c, bias=False, transform=nn.Identity())

    def features(self, input_ids, attention_mask=None, token_type_ids=None, cache=None) -> torch.Tensor:
        return self.decoder(self.embed(input_ids, token_type_ids), attention_mask, cache=cache)  # (B, T, D)

    @aux.collected
    def forward(self, input_ids, labels=None, attention_mask=None, token_type_ids=None) -> LMOutput:
        return self.head.output(self.features(input_ids, attention_mask, token_type_ids), labels)

    def new_cache(self) -> list[LayerCache] | None:
        return self.decoder.new_cache()

    def next_logits(self, tokens: torch.Tensor, cache: list[LayerCache], state=None) -> torch.Tensor:
        """Logits for the position after `tokens`, appending their keys/values to `cache`."""
        return self.head(self.features(tokens, cache=cache)[:, -1])


# The share of positions a masked-LM head runs on under sparse prediction, for lm/model/flops.py: BERT's masking
# rate, the default of data.mlm_probability (lm/data/config.py), which model code does not see.
MASKED_FRACTION = 0.15


class EncoderLM(MatmulCount, _LanguageModel):
    """BERT: one bidirectional stack and a masked-LM head."""

    def __init__(self, cfg: "ModelConfig", c: Components):
        super().__init__(cfg, c)
        self.encoder = make_stack(cfg, c, cfg.n_layers, causal=False)
        transform = mlm_transform(cfg, c.norm(cfg.dim, eps=cfg.norm_eps)) if cfg.mlm_transform else nn.Identity()
        self.head = self._head(c, bias=True, transform=transform)

    def features(self, input_ids, attention_mask=None, token_type_ids=None) -> torch.Tensor:
        return self.encoder(self.embed(input_ids, token_type_ids), attention_mask)

    @aux.collected
    def forward(self, input_ids, labels=None, attention_mask=None, token_type_ids=None) -> LMOutput:
        """With labels: the loss over the masked positions (labels != -100); its logits are theirs only when
        model.sparse_prediction (1, M, V), else every position's (B, T, V)."""
        h = self.features(input_ids, attention_mask, token_type_ids)  # (B, T, D)
        if labels is not None and self.cfg.sparse_prediction and not torch.compiler.is_compiling():
            # The same mean cross-entropy over the same positions; a compiled graph keeps the dense, fixed shape.
            masked = labels != IGNORE_INDEX  # (B, T)
            h, labels = h[masked].unsqueeze(0), labels[masked].unsqueeze(0)  # (1, M, D), (1, M)
        return self.head.output(h, labels)

    def classify_features(self, input_ids, attention_mask=None, token_type_ids=None):
        """(hidden states, padding) for a sequence classifier: a Funnel's pooled path runs alone."""
        return self.encoder.pooled_forward(self.embed(input_ids, token_type_ids), attention_mask)

    def active_matmul_params(self, count) -> float:
        """lm.model.flops: under model.sparse_prediction the head runs at the masked positions only."""
        share = MASKED_FRACTION if self.cfg.sparse_prediction else 1.0
        return sum(count(m) for name, m in self.named_children() if name != "head") + share * count(self.head)


def shift_right(ids: torch.Tensor, start_id: int, pad_id: int) -> torch.Tensor:
    """Decoder inputs from targets: prepend the start token, drop the last (T5 / BART teacher forcing)."""
    shifted = torch.cat([torch.full_like(ids[:, :1], start_id), ids[:, :-1]], dim=1)
    return shifted.masked_fill(shifted == IGNORE_INDEX, pad_id)


class EncoderDecoderLM(_LanguageModel):
    """T5 / the original Transformer: bidirectional encoder, causal decoder with cross-attention."""

    def __init__(self, cfg: "ModelConfig", c: Components):
        super().__init__(cfg, c)
        # `embed` is the decoder's input table; the encoder reads it too unless model.tie_embeddings
        # says the two stacks have their own (decoder_input_output, none: Narang et al. 2021).
        self.encoder_embed = None if cfg.shared_inputs else Embedding(cfg, c.embedding)
        self.encoder = make_stack(cfg, c, cfg.n_layers, causal=False)
        self.decoder = make_stack(cfg, c, cfg.decoder_layers, causal=True, cross=True)
        self.head = self._head(c, bias=False, transform=nn.Identity())
        # model/memory (the zoo's transparent attention): each decoder layer reads its own mix of encoder states
        self.memory = c.memory(cfg.n_layers, cfg.decoder_layers) if c.memory is not None else None

    def encode(self, input_ids, attention_mask=None):
        """The encoder memory (B, S, D); with a model/memory option, one per decoder layer."""
        embed = self.embed if self.encoder_embed is None else self.encoder_embed  # model.tie_embeddings
        if self.memory is None:
            return self.encoder(embed(input_ids), attention_mask)  # (B, S, D)
        states: list[torch.Tensor] = []
        self.encoder(embed(input_ids), attention_mask, states=states)  # N+1 states (B, S, D)
        return self.memory(states, self.encoder.final_norm)

    def decode(self, decoder_input_ids, memory, memory_padding=None, decoder_padding=None, cache=None) -> torch.Tensor:
        return self.decoder(self.embed(decoder_input_ids), decoder_padding, memory, memory_padding, cache)

    @aux.collected
    def forward(
        self, input_ids, attention_mask=None, decoder_input_ids=None, labels=None, decoder_attention_mask=None
    ) -> LMOutput:
        if decoder_input_ids is None:
            if labels is None:
                raise ValueError("EncoderDecoderLM needs decoder_input_ids or labels")
            decoder_input_ids = shift_right(labels, self.cfg.decoder_start_token_id, self.cfg.pad_token_id)
        memory = self.encode(input_ids, attention_mask)
        h = self.decode(decoder_input_ids, memory, attention_mask, decoder_attention_mask)
        return self.head.output(h, labels)

    def features(self, input_ids, attention_mask=None, token_type_ids=None) -> torch.Tensor:
        """For classification (as BART): the decoder reads the input shifted right, attending to its encoding."""
        memory = self.encode(input_ids, attention_mask)
        decoder_input_ids = shift_right(input_ids, self.cfg.decoder_start_token_id, self.cfg.pad_token_id)
        return self.decode(decoder_input_ids, memory, attention_mask, attention_mask)

    def new_cache(self) -> list[LayerCache] | None:
        return self.decoder.new_cache()

    def next_logits(self, tokens, cache, state) -> torch.Tensor:
        memory, memory_padding = state
        return self.head(self.decode(tokens, memory, memory_padding, cache=cache)[:, -1])


class SequenceClassifier(nn.Module):
    """A backbone of any family + pooled linear head; n_labels == 1 is regression (STS-B).

    Pooling: encoders use the first ([CLS]) position through a dense+tanh pooler as BERT does;
    decoders and encoder-decoders use the last real token, the only one that has seen everything;
    a model/family option's model its own way (`pooled`).
    pair_input (lm.glue.config.PairInput) "both_orders" and "siamese" read 2B rows for B labels: rows
    B..2B-1 are the second reading of rows 0..B-1 (lm.glue.encode.collate).
      both_orders: (a, b) then (b, a); the two pooled vectors are added before the head (Radford et al.
        2018, GPT-1's similarity tasks).
      siamese: a alone then b alone, pooled to u and v (Reimers & Gurevych 2019, Sentence-BERT): classes
        from a linear layer on [u; v; |u - v|], a score from cos(u, v) through a scale and shift that start
        out mapping [-1, 1] onto score_range, so the pretrained similarity is the first prediction.
        whiten=True maps u and v to (x - m) W first (Su et al. 2021): m and W are buffers, the identity
        until fit_whitening sets them from pooled training pairs; then frozen. fit_cosine_head starts a score's
        scale and shift from the training pairs' least-squares line.
    The backbone's LM head is dropped: it is unused here, and unused parameters break DDP.
    """

    def __init__(
        self,
        backbone: _LanguageModel,
        n_labels: int,
        pooling: str | None = None,
        dropout: float = 0.1,
        pair_input: str = "joint",
        score_range: tuple[float, float] = (0.0, 1.0),
        whiten: bool = False,
    ):
        super().__init__()
        self.backbone = backbone
        self.pair_input = pair_input
        backbone.head = None
        self.cfg = backbone.cfg
        self.n_labels = n_labels
        self.pooling = pooling or ("first" if backbone.cfg.arch == "encoder" else "last")
        dim = backbone.cfg.dim
        self.pooler = nn.Sequential(nn.Linear(dim, dim), nn.Tanh()) if self.pooling == "first" else nn.Identity()
        self.drop = nn.Dropout(dropout)
        if pair_input == "siamese" and n_labels == 1:
            lo, hi = score_range
            self.classifier = nn.Linear(1, 1)  # score = scale * cos(u, v) + shift
            nn.init.constant_(self.classifier.weight, (hi - lo) / 2)
            nn.init.constant_(self.classifier.bias, (hi + lo) / 2)
        else:
            self.classifier = nn.Linear(3 * dim if pair_input == "siamese" else dim, n_labels)
        self.whiten = whiten
        if whiten:
            if pair_input != "siamese":
                raise ValueError(f"whiten=True whitens a siamese pair's pooled vectors, not pair_input={pair_input}")
            self.register_buffer("white_mean", torch.zeros(dim))
            self.register_buffer("white_map", torch.eye(dim))

    @aux.collected
    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None) -> LMOutput:
        if self.pair_input == "joint":
            h = self.pooler(self.backbone.pooled(input_ids, attention_mask, token_type_ids, self.pooling))  # (B, D)
            logits = self.classifier(self.drop(h))  # (B, n_labels)
        else:
            first, second = self.pooled_pairs(input_ids, attention_mask, token_type_ids)  # (2, B, D)
            if self.whiten:
                first, second = self._whitened(first), self._whitened(second)
            logits = self._pair_logits(first, second)
        if labels is None:
            return LMOutput(logits=logits)
        if self.n_labels == 1:
            loss = F.mse_loss(logits.squeeze(-1).float(), labels.float())  # (B, 1) -> (B,)
        else:
            loss = F.cross_entropy(logits.float(), labels.long())
        return LMOutput(loss=loss, logits=logits.detach())

    def pooled_pairs(self, input_ids, attention_mask=None, token_type_ids=None) -> torch.Tensor:
        """(2, B, D): the pooled vectors of a batch of pairs' two readings (rows 0..B-1 and B..2B-1 of the
        batch), before any whitening."""
        h = self.pooler(self.backbone.pooled(input_ids, attention_mask, token_type_ids, self.pooling))  # (2B, D)
        return h.view(2, -1, h.shape[-1])  # (2B, D) -> (2, B, D)

    @torch.no_grad()
    def fit_whitening(self, x: torch.Tensor) -> None:
        """Sets m and W from pooled vectors x (N, D) so that (x - m) W has identity covariance (heads.whitening)."""
        m, w = whitening(x)
        self.white_mean.copy_(m)
        self.white_map.copy_(w)

    @torch.no_grad()
    def fit_cosine_head(self, first: torch.Tensor, second: torch.Tensor, labels: torch.Tensor) -> None:
        """Sets the score head (score = scale * cos(u, v) + shift) to the least-squares line of labels (N,) on the
        cosines of pooled pairs (N, D) each, read as the head reads them (whitened when it whitens): the first
        prediction is then the best linear reading of the backbone's own similarity, and the first steps' large
        errors do not pull the backbone away from it (linear probing before finetuning, Kumar et al. 2022).
        Cosines that do not vary leave the head as it is."""
        if self.pair_input != "siamese" or self.n_labels != 1:
            raise ValueError(f"fit_cosine_head fits a siamese regression head, not pair_input={self.pair_input}")
        if self.whiten:
            first, second = self._whitened(first), self._whitened(second)
        cos = F.cosine_similarity(first.double(), second.double(), dim=-1)  # (N,)
        y, var = labels.double(), cos.var(unbiased=False)
        if var <= 1e-12:
            return
        scale = ((cos - cos.mean()) * (y - y.mean())).mean() / var
        self.classifier.weight.fill_(float(scale))
        self.classifier.bias.fill_(float(y.mean() - scale * cos.mean()))

    def _whitened(self, x: torch.Tensor) -> torch.Tensor:
        return ((x.float() - self.white_mean) @ self.white_map).to(x.dtype)

    def _pair_logits(self, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        """(B, n_labels) from the pooled vectors of each pair's two readings, (B, D) each."""
        if self.pair_input == "both_orders":
            return self.classifier(self.drop(first + second))
        u, v = first, second
        if self.n_labels == 1:
            return self.classifier(F.cosine_similarity(u.float(), v.float(), dim=-1)[:, None].to(u.dtype))
        return self.classifier(self.drop(torch.cat([u, v, (u - v).abs()], dim=-1)))  # (B, 3D) -> (B, n_labels)
