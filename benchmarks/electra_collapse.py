"""Does ELECTRA's discriminator learn, or go flat? A short diagnostic run (docs/glue_transfer.md, Conclusions).

Trains experiment=glue_transfer_electra's model (or, with --mlm, the same encoder by masked-LM) on
16 x 128 windows of the prepared pretraining corpus with AdamW at a constant rate, and prints every 25
steps: the discriminator's accuracy against the base rate (1 - replaced share: what calling every token
original scores) and the standard deviation over positions of its stack's final hidden states, averaged
over the batch and features (0.85 at initialisation; near 0 = every position reads the same).

    python benchmarks/electra_collapse.py --steps 100                       # the preset's rate, 2e-3
    python benchmarks/electra_collapse.py --steps 300 --lr 5e-4
    python benchmarks/electra_collapse.py --prior-bias                      # output bias at the base-rate logit
    python benchmarks/electra_collapse.py --generator-warmup 150 --steps 200 # lambda 0 for the first 150 steps
    python benchmarks/electra_collapse.py --detach-embeddings               # the discriminator cannot move the table
    python benchmarks/electra_collapse.py --disc-weight 1
    python benchmarks/electra_collapse.py --temperature 2 --lr 2e-4         # flatter generator samples
    python benchmarks/electra_collapse.py --accumulate 8 --lr 5e-4          # 128 x 128 tokens a step
    python benchmarks/electra_collapse.py --mlm                             # the MLM encoder, for reference
    python benchmarks/electra_collapse.py --hf                              # Hugging Face's ELECTRA, same sizes

The corpus is data=gutenberg_mix_bpe's, prepared first (lm prepare data=gutenberg_mix_bpe, or any
lm transfer run of the encoder presets).
"""

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from lm.cli.transfer_recipe import Recipe, pretrain_config
from lm.data.packed import make_collator
from lm.model import build_model

BATCH, SEQ = 16, 128


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--accumulate", type=int, default=1, help="micro-batches of 16 x 128 per optimizer step")
    p.add_argument("--prior-bias", action="store_true", help="start the output bias at log(0.15 / 0.85)")
    p.add_argument("--generator-warmup", type=int, default=0, help="steps with lambda = 0 (generator alone)")
    p.add_argument("--detach-embeddings", action="store_true", help="the discriminator's input embeddings detached")
    p.add_argument("--disc-weight", type=float, default=None, help="lambda (default the preset's, 50)")
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="the generator's sampling temperature (default the preset's, 1): above 1, easier replacements",
    )
    p.add_argument("--mlm", action="store_true", help="the same encoder trained by masked-LM (model.family=null)")
    p.add_argument(
        "--hf",
        action="store_true",
        help="transformers' ElectraForPreTraining + ElectraForMaskedLM at the preset's sizes (a reference "
        "implementation: post-norm, learned positions, dropout off), on the same batches",
    )
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def build(a):
    torch.manual_seed(a.seed)
    cfg = pretrain_config(
        Recipe(
            preset="glue_transfer_electra", out=Path("/nonexistent"), pretrain=["model.family=null"] if a.mlm else []
        )
    )
    model = HFElectra(cfg.model) if a.hf else build_model(OmegaConf.to_object(cfg.model))
    if a.temperature is not None:
        model.temperature = a.temperature
    if a.prior_bias:
        with torch.no_grad():
            model.head.proj.bias.fill_(math.log(0.15 / 0.85))
    if a.detach_embeddings:
        model.features = lambda ids, mask=None, types=None: model.encoder(model.embed(ids, types).detach(), mask)
    return cfg, model


class HFElectra(torch.nn.Module):
    """transformers' ELECTRA at the preset's sizes, with this script's interface: forward(input_ids, labels)
    returns the same loss and metrics as lm.zoo.electra.ElectraLM; `encoder` is the discriminator's stack; `head`
    its per-token head (`head.proj`: the output layer). Generator and discriminator share the embeddings
    (and the generator's output is tied to them), as in the paper and in lm.zoo.electra."""

    def __init__(self, m):
        super().__init__()
        from transformers import ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining

        def config(dim, heads, ffn):
            return ElectraConfig(
                vocab_size=m.vocab_size,
                embedding_size=m.dim,
                hidden_size=dim,
                num_hidden_layers=m.n_layers,
                num_attention_heads=heads,
                intermediate_size=ffn,
                max_position_embeddings=m.max_seq_len,
                hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0,
                type_vocab_size=1,
            )

        e = m.family
        self.disc = ElectraForPreTraining(config(m.dim, m.n_heads, 4 * m.dim))
        self.gen = ElectraForMaskedLM(config(e.generator_dim, e.generator_heads, 4 * e.generator_dim))
        self.gen.electra.embeddings = self.disc.electra.embeddings
        self.gen.generator_lm_head.weight = self.disc.electra.embeddings.word_embeddings.weight
        self.encoder, self.head = self.disc.electra.encoder, self.disc.discriminator_predictions
        self.head.proj = self.head.dense_prediction
        self.disc_weight, self.temperature = e.disc_weight, e.temperature

    def forward(self, input_ids, labels):
        from types import SimpleNamespace

        import torch.nn.functional as F

        masked = labels != -100
        gen_logits = self.gen(input_ids).logits[masked]  # (N, V)
        gen_loss = F.cross_entropy(gen_logits, labels[masked])
        sample = torch.multinomial(F.softmax(gen_logits.detach() / self.temperature, -1), 1).squeeze(-1)
        corrupted = input_ids.masked_scatter(masked, sample)
        replaced = (corrupted != torch.where(masked, labels, input_ids)).float()
        disc_logits = self.disc(corrupted).logits  # (B, T)
        disc_loss = F.binary_cross_entropy_with_logits(disc_logits, replaced)
        accuracy = ((disc_logits > 0).float() == replaced).float().mean()
        metrics = {
            "electra/gen_loss": gen_loss,
            "electra/disc_loss": disc_loss,
            "electra/disc_accuracy": accuracy,
            "electra/replaced": replaced.mean(),
        }
        return SimpleNamespace(loss=gen_loss + self.disc_weight * disc_loss, metrics=metrics)


def windows(cfg, seed):
    """Endless MLM batches of random 128-token windows of the prepared train split, masked as lm train masks them
    for the model (ELECTRA's 85% [MASK] / 15% kept; BERT's 80/10/10 for --mlm's encoder)."""
    root = Path(cfg.data.dir).expanduser()
    meta = json.loads((root / "meta.json").read_text())
    tokens = np.memmap(root / "train_00000.bin", dtype=meta["dtype"], mode="r")
    corruption = OmegaConf.to_object(cfg.model).mlm_corruption
    collate = make_collator("mlm", SEQ, meta, seed, 0, mlm_corruption=corruption)
    rng, i = np.random.default_rng(seed), 0
    while True:
        starts = rng.integers(0, len(tokens) - SEQ - 2, BATCH)
        batch = collate(
            np.stack([np.asarray(tokens[s : s + SEQ], dtype=np.int64) for s in starts]), list(range(i, i + BATCH))
        )
        i += BATCH
        yield torch.from_numpy(batch["input_ids"]), torch.from_numpy(batch["labels"])


def main(argv=None):
    a = parse(argv)
    cfg, model = build(a)
    weight = a.disc_weight if a.disc_weight is not None else getattr(model, "disc_weight", 0.0)
    hidden = {}
    # (ElectraEncoder returns an output object whose first field is the hidden states)
    model.encoder.register_forward_hook(lambda m, i, out: hidden.__setitem__("h", (out[0] if a.hf else out).detach()))
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01)
    batches = windows(cfg, a.seed)
    for step in range(a.steps + 1):
        if not a.mlm:
            model.disc_weight = 0.0 if step < a.generator_warmup else weight
        opt.zero_grad()
        for _ in range(a.accumulate):
            out = model(*next(batches))
            (out.loss / a.accumulate).backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 25 == 0:
            m = {k.split("/")[1]: round(float(v), 3) for k, v in out.metrics.items()}
            line = f"step {step}: loss {out.loss.item():.3f}, grad_norm {norm:.2f}"
            if m:
                line += (
                    f", disc accuracy {m['disc_accuracy']:.3f} (base rate {1 - m['replaced']:.3f}), "
                    f"disc loss {m['disc_loss']:.3f}, gen loss {m['gen_loss']:.3f}"
                )
            std = hidden["h"].float().std(1).mean().item()  # (B, T, D) -> std over T -> mean over B, D
            print(line + f", hidden std over positions {std:.4f}", flush=True)


if __name__ == "__main__":
    main()
