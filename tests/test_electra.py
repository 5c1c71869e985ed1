"""ELECTRA's replaced-token detection (model/family=electra, lm/zoo/electra.py): the discriminator's targets on a
hand-made batch with a forced sampler, what the generator may replace, the loss weighting, gradients, refusals,
parameter/FLOP counts, exact resume through lm train, and finetuning the discriminator as a plain encoder."""

import math
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from lm.config import ConfigError
from lm.model import EncoderLM, build_model
from lm.model.config import Arch, model_preset
from lm.model.flops import active_matmul_params as count
from lm.model.flops import attention_flops_per_token, matmul_params, num_params
from lm.zoo.adaptive import AdaptiveSoftmaxConfig
from lm.zoo.electra import MASKED_FRACTION, ElectraConfig, ElectraLM
from lm.zoo.evolved import EvolvedConfig
from tests.engine_support import compose, loaders, metrics, tiny_overrides, train_losses

SMALL = [
    "model.arch=encoder",
    "model.vocab_size=32",
    "model.dim=16",
    "model.n_heads=2",
    "model.n_layers=2",
    "model/family=electra",
    "model.family.generator_dim=8",
    "model.family.generator_layers=1",
]
MASK = 3


@pytest.fixture(scope="module")
def cfg():
    return model_preset("tiny", SMALL)


def built(cfg, seed=0):
    torch.manual_seed(seed)
    return build_model(cfg)


def watch_discriminator(model):
    """Record the ids the discriminator reads (ElectraLM.features runs only for it)."""
    seen = []
    features = model.features

    def recording(ids, *args, **kwargs):
        seen.append(ids.clone())
        return features(ids, *args, **kwargs)

    model.features = recording
    return seen


# -- the objective ---------------------------------------------------------------------------------------


def test_the_discriminator_learns_corrupted_vs_original_on_a_hand_made_batch(cfg):
    model = built(cfg)
    original = torch.arange(10, 18)[None]  # (1, 8)
    labels = torch.full_like(original, -100)
    labels[0, [1, 3, 5, 6]] = original[0, [1, 3, 5, 6]]
    input_ids = original.clone()
    input_ids[0, [1, 6]] = MASK  # BERT's 80/10/10: [MASK], a random token (position 3), kept (position 5)
    input_ids[0, 3] = 20
    # The forced samples: the original twice (position 3's included, though its input was noised), then two others.
    model.sample = lambda logits: torch.tensor([original[0, 1], original[0, 3], 25, 26])
    padding = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0]])  # the last token is padding: no loss there
    seen = watch_discriminator(model)
    out = model(input_ids, labels, attention_mask=padding)

    corrupted = original.clone()
    corrupted[0, [5, 6]] = torch.tensor([25, 26])
    assert torch.equal(seen[0], corrupted)
    target = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 0]]).float()
    assert out.logits.shape == (1, 8)
    disc = F.binary_cross_entropy_with_logits(out.logits[0, :7], target[0, :7])
    torch.testing.assert_close(out.metrics["electra/disc_loss"], disc.detach())
    masked = labels != -100
    with torch.no_grad():
        gen_logits = model.generator(model.embed(input_ids), padding, masked.nonzero(as_tuple=True))  # (4, V)
    gen = F.cross_entropy(gen_logits, labels[masked])
    torch.testing.assert_close(out.metrics["electra/gen_loss"], gen)
    torch.testing.assert_close(out.loss.detach(), gen + 50.0 * disc.detach())
    assert out.metrics["electra/replaced"].item() == pytest.approx(2 / 7)
    correct = ((out.logits[0, :7] > 0).float() == target[0, :7]).float().mean()
    assert out.metrics["electra/disc_accuracy"].item() == pytest.approx(correct.item())


def test_only_masked_positions_are_replaced_by_real_samples(cfg):
    model = built(cfg)
    g = torch.Generator().manual_seed(1)
    original = torch.randint(8, 32, (4, 12), generator=g)
    masked = torch.rand(4, 12, generator=g) < 0.4
    input_ids, labels = original.masked_fill(masked, MASK), original.masked_fill(~masked, -100)
    seen = watch_discriminator(model)
    for _ in range(5):
        model(input_ids, labels)
    corrupted = torch.stack(seen)  # (5, 4, 12)
    assert torch.equal(corrupted[:, ~masked], input_ids[~masked].expand(5, -1))  # unmasked: never replaced
    assert (corrupted[:, masked] != MASK).float().mean() > 0.8  # masked: the generator's samples, rarely [MASK]
    assert len({tuple(c[masked].tolist()) for c in corrupted}) > 1  # sampled, not argmax


def test_evaluation_samples_with_its_own_seed_and_logs_nothing(cfg):
    model = built(cfg).eval()
    g = torch.Generator().manual_seed(2)
    original = torch.randint(8, 32, (2, 10), generator=g)
    masked = torch.rand(2, 10, generator=g) < 0.3
    input_ids, labels = original.masked_fill(masked, MASK), original.masked_fill(~masked, -100)
    torch.manual_seed(5)
    state = torch.get_rng_state()
    with torch.no_grad():
        a, b = model(input_ids, labels), model(input_ids, labels)
    assert torch.equal(torch.get_rng_state(), state)  # training's random stream is left where it was
    assert a.loss == b.loss and a.metrics == {} and math.isfinite(a.loss.item())
    assert model(input_ids).logits.shape == (2, 10)  # no labels: the discriminator's logits


def test_gradients_reach_the_generator_the_shared_embedding_and_the_discriminator(cfg):
    model = built(cfg)
    g = torch.Generator().manual_seed(3)
    original = torch.randint(8, 32, (3, 10), generator=g)
    masked = torch.rand(3, 10, generator=g) < 0.3
    model(original.masked_fill(masked, MASK), original.masked_fill(~masked, -100)).loss.backward()
    for name in (
        "embed.tok.weight",
        "encoder.blocks.1.ffn.down.weight",
        "head.proj.weight",
        "head.dense.weight",
        "generator.project.weight",
        "generator.encoder.blocks.0.self_attn.qkv.weight",
        "generator.head.transform.0.weight",
    ):
        grad = model.get_parameter(name).grad
        assert grad is not None and grad.abs().sum() > 0, name
    # ELECTRA ties the generator's input and output to the discriminator's token table
    assert model.generator.head.proj.weight is model.embed.tok.weight


def test_the_generator_is_a_stack_of_its_own_width_and_depth(cfg):
    model = built(cfg)
    assert isinstance(model, ElectraLM) and len(model.generator.encoder.blocks) == 1 and len(model.encoder.blocks) == 2
    assert model.generator.project.weight.shape == (8, 16)  # dim -> generator_dim (ELECTRA's embeddings_project)
    assert model.generator.encoder.blocks[0].ffn.up.weight.shape == (32, 8)  # the MLP's 4x of the generator's width
    assert model.generator.head.transform[0].weight.shape == (16, 8)  # back to the table's width
    wide = build_model(replace(cfg, family=replace(cfg.family, generator_ffn_dim=24, generator_heads=2)))
    assert wide.generator.encoder.blocks[0].ffn.up.weight.shape == (24, 8)
    assert wide.generator.encoder.blocks[0].self_attn.n_heads == 2


# -- config: refusals, counts -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(arch=Arch.decoder), r"model/family=electra with model.arch=decoder: .*set model.arch=encoder"),
        (dict(arch=Arch.encoder_decoder), r"model/family=electra with model.arch=encoder_decoder"),
        (
            dict(family=dict(generator_dim=12, generator_heads=5)),
            r"model.family.generator_dim=12 is not divisible by model.family.generator_heads=5",
        ),
        (dict(family=dict(disc_weight=0.0)), r"model.family.disc_weight=0.0 must be > 0"),
        (dict(family=dict(temperature=-1.0)), r"model.family.temperature=-1.0 must be > 0"),
        (dict(family=dict(generator_layers=0)), r"model.family.generator_layers=0 must be a positive integer"),
        (
            dict(output=AdaptiveSoftmaxConfig(), tie_embeddings=False),
            r"model/family=electra with .*model/output=adaptive_softmax",
        ),
        (
            dict(loss_chunk_size=64),
            r"model/family=electra with .*model.loss_chunk_size=64: .*needs .*model.loss_chunk_size=0",
        ),
        (
            dict(family=dict(generator_dim=9), block=EvolvedConfig()),
            r"model/family=electra's generator \(model.family.generator_dim=9.*cannot be built: "
            r"model/block=evolved needs an even",
        ),
    ],
)
def test_refusals_name_the_field_and_the_fix(cfg, change, message):
    if "family" in change:
        change = {**change, "family": replace(cfg.family, **change["family"])}
    with pytest.raises(ConfigError, match=message):
        build_model(replace(cfg, **change))


def test_electra_on_a_recurrent_preset_is_refused_by_name():
    """One model/family at a time: electra in place of model=lstm's recurrent layers finds no Transformer slots."""
    with pytest.raises(ConfigError, match="model.norm is not set; pick an option with model/norm="):
        build_model(model_preset("lstm", ["model/family=electra", "model.arch=encoder"]))


def test_a_wrong_key_fails_at_composition():
    from lm.config_base import ConfigError

    with pytest.raises(ConfigError, match=r"\]: model\.family\.bogus: Key 'bogus' not in 'ElectraConfig'"):
        model_preset("tiny", [*SMALL, "model.family.bogus=1"])


def test_a_config_saved_with_the_electra_node_loads_as_the_family_option(cfg):
    """Runs saved before the move (lm/model/upgrade.py): their model.electra node is model/family=electra now, the
    same model; the old overrides are refused in one line naming the new spelling."""
    from omegaconf import OmegaConf

    from lm.model.config import model_from_saved

    node = OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True)  # as config.yaml holds it
    old = {k: v for k, v in node.items() if k != "family"}
    old["electra"] = {k: v for k, v in node["family"].items() if not k.startswith("_")}
    loaded = model_from_saved(old)
    assert isinstance(loaded.family, ElectraConfig) and loaded.family == cfg.family and loaded.arch == cfg.arch
    assert model_from_saved({**old, "electra": None}).family is None  # a plain encoder saved with the node unset
    for arg, new in [
        ("+model/electra=small", "write model/family=electra"),
        ("model.electra.generator_dim=8", "write model.family.generator_dim=8"),
        ("model.electra=null", "write model.family (model/family=electra; model.family=null for none)"),
    ]:
        with pytest.raises(ConfigError, match=f"^{re.escape(arg)}: this option moved to the zoo .*{re.escape(new)}"):
            model_preset("tiny", [arg])


def test_params_and_flops_count_both_models(cfg):
    model = built(cfg)
    assert num_params(cfg) == sum(p.numel() for p in model.parameters())  # the tied table once
    encoder = replace(cfg, family=None, sparse_prediction=False)  # the same discriminator with BERT's dense MLM head
    plain, gen = build_model(encoder), model.generator
    assert count(model.head) == 16 * 16 + 16 and count(gen.head) == 8 * 16 + 32 * 16  # the output layer is tied
    assert count(plain.head) == 32 * 16 and count(gen.encoder) == 4 * 8 * 8 + 2 * 4 * 8 * 8
    assert matmul_params(encoder) == count(plain)
    # The discriminator and the generator's stack on every token, the generator's head on the masked share.
    assert matmul_params(cfg) == round(
        count(plain)
        - count(plain.head)
        + count(model.head)
        + 16 * 8
        + count(gen.encoder)
        + MASKED_FRACTION * count(gen.head)
    )
    # 12 * heads * head_dim * T per layer: two discriminator layers of 2 x 8, one generator layer of 1 x 8
    assert attention_flops_per_token(encoder, 32) == 12 * 32 * 2 * 16
    assert attention_flops_per_token(cfg, 32) == 12 * 32 * (2 * 16 + 8)


def test_the_transfer_preset_pretrains_the_encoder_presets_model():
    from omegaconf import OmegaConf

    from lm.cli.transfer_recipe import OBJECTIVE, POOLING, Recipe, family, pretrain_config, tokens_per_step

    electra = pretrain_config(Recipe(preset="glue_transfer_electra", out=Path("/tmp/unused")))
    encoder = pretrain_config(Recipe(preset="glue_transfer_encoder", out=Path("/tmp/unused")))
    model = OmegaConf.to_object(electra.model)
    assert replace(model, family=None) == OmegaConf.to_object(encoder.model)  # the discriminator is that encoder
    assert (model.family.generator_dim, model.family.generator_heads, model.family.disc_weight) == (64, 1, 50.0)
    assert tokens_per_step(electra) == tokens_per_step(encoder) and electra.sched == encoder.sched
    # its own rate and sampling temperature: the encoder's 2e-3 flattens the discriminator (docs/glue_transfer.md)
    assert (electra.optim.lr, model.family.temperature) == (2e-4, 2.0) and encoder.optim.lr == 2e-3
    assert POOLING[family(electra.model)] == "first" and OBJECTIVE[family(electra.model)] == "rtd"
    assert family(encoder.model) == "encoder"
    other = pretrain_config(
        Recipe(preset="glue_transfer_electra", out=Path("/tmp/unused"), pretrain=["model.family.generator_dim=128"])
    )
    assert other.model.family.generator_dim == 128


# -- lm train: exact resume; finetuning the discriminator --------------------------------------------------


def _train(run_dir, steps, **train):
    from lm.cli.train import train as lm_train

    cfg = compose(
        tiny_overrides(run_dir, steps, **train) + ["sched=constant", "model.dropout=0.1", *SMALL[:1], *SMALL[5:]]
    )
    return lm_train(cfg, loaders=loaders(cfg, objective="mlm"))


def test_lm_train_logs_both_losses_and_resumes_exactly(tmp_path):
    _train(tmp_path / "whole", 6, eval_interval=3)
    _train(tmp_path / "split", 3, eval_interval=3, ckpt_interval=3)
    _train(tmp_path / "split", 6, eval_interval=3, ckpt_interval=3)
    whole, split = train_losses(tmp_path / "whole"), train_losses(tmp_path / "split")
    assert list(split) == list(range(1, 7)) and split == whole  # the samples come back with the RNG state
    logged = [m for m in metrics(tmp_path / "whole") if "loss" in m]
    for m in logged:
        assert m["loss"] == pytest.approx(m["electra/gen_loss"] + 50 * m["electra/disc_loss"], rel=1e-5)
        assert 0 <= m["electra/disc_accuracy"] <= 1 and 0 < m["electra/replaced"] < 0.3  # ~15% are masked
    val = [m for m in metrics(tmp_path / "whole") if "val_loss" in m]
    assert len(val) == 2 and all("electra/gen_loss" not in m for m in val)
    # exp(MLM + 50 x BCE) is no perplexity (it was logged as val_ppl, e^35 and more)
    assert all("val_ppl" not in m for m in val)


def test_a_pretrained_discriminator_finetunes_as_a_plain_encoder(tmp_path):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from lm.cli.export import export
    from lm.cli.train import train
    from lm.config import conf_dir, register_train_configs
    from lm.core.checkpoint import consolidated_state_dict, resolve
    from lm.glue.init import build_classifier, load_backbone
    from lm.model.convert import _family_of

    register_train_configs()
    overrides = [
        f"run_dir={tmp_path / 'run'}",
        "model=tiny",
        *SMALL,
        "model.vocab_size=512",
        "model.max_seq_len=32",
        "data=tinystories_sample_bpe",
        f"data.dir={tmp_path / 'data'}",
        "data.vocab_size=512",
        "data.workers=1",
        "data.tokenizer_train_chars=200000",
        "train.max_steps=3",
        "train.seq_len=32",
        "train.micro_batch_size=4",
        "train.eval_interval=0",
        "train.eval_batches=1",
        "train.ckpt_interval=3",
        "train.progress=false",
    ]
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        train(hydra_compose(config_name="train", overrides=overrides))
    assert all(math.isfinite(m["electra/disc_loss"]) for m in metrics(tmp_path / "run") if "loss" in m)

    saved = consolidated_state_dict(resolve(tmp_path / "run"))
    for source in (tmp_path / "run", export(tmp_path / "run", hf=False)):  # a checkpoint, an lm export directory
        backbone = load_backbone(str(source))
        assert isinstance(backbone.model_cfg.family, ElectraConfig)
        classifier = build_classifier(backbone, n_labels=2, dropout=0.1)  # refuses missing/unexpected keys
        assert type(classifier.backbone) is EncoderLM and classifier.pooling == "first"
        names = [n for n, _ in classifier.named_parameters()]
        assert not any("generator" in n for n in names) and classifier.backbone.head is None
        ours = classifier.backbone.state_dict()
        assert set(ours) == {k for k in saved if k.startswith(("embed.", "encoder."))}
        assert all(torch.equal(ours[k], saved[k]) for k in ours)
        out = classifier(torch.randint(8, 512, (2, 12)), labels=torch.tensor([0, 1]))
        assert out.logits.shape == (2, 2) and math.isfinite(out.loss.item())
    with pytest.raises(ValueError, match="no Hugging Face family matches model/family=electra.* as the plain encoder"):
        _family_of(backbone.model_cfg)  # lm export's Hugging Face directory: refused (a warning there)
