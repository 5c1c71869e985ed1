"""lm transfer's presets: their model sizes and objectives, the GPU preset's corpus of Gutenberg shards, and the
scratch arm ELECTRA shares with the encoder."""

from pathlib import Path

from omegaconf import OmegaConf

from lm.cli.transfer_recipe import Recipe, pretrain_config, tokens_per_step


def test_presets_are_one_size_two_objectives():
    from lm.model import build_model

    sizes = {}
    for preset in ("glue_transfer_decoder", "glue_transfer_encoder"):
        cfg = pretrain_config(Recipe(preset=preset, out=Path("/tmp/unused")))
        model = OmegaConf.to_object(cfg.model)
        sizes[str(model.arch)] = sum(p.numel() for p in build_model(model).parameters())
        assert cfg.data.name == "gutenberg_mix_bpe" and tokens_per_step(cfg) == 16 * 128
        assert (model.dim, model.n_layers, model.vocab_size) == (256, 4, 8192)
        # the encoder's RoPE: learned absolute positions left MLM at the unigram plateau (conf/experiment/...)
        assert cfg.model.pos._target_.endswith("RoPE" if preset.endswith("encoder") else "Learned")
    assert abs(sizes["encoder"] - sizes["decoder"]) / sizes["decoder"] < 0.01  # the MLM head's bias only


def test_the_gpu_preset_is_issue_17s_size():
    """20-50M parameters, bf16, the encoder arm's model family at 256 x 128 tokens a step."""
    from lm.model import build_model

    cfg = pretrain_config(Recipe(preset="glue_transfer_gpu", out=Path("/tmp/unused")))
    n = sum(p.numel() for p in build_model(OmegaConf.to_object(cfg.model)).parameters())
    assert 20e6 < n < 50e6 and cfg.model.arch == "encoder" and cfg.model.pos._target_.endswith("RoPE")
    assert tokens_per_step(cfg) == 256 * 128 and cfg.train.precision == "bf16"
    assert cfg.data.name == "gutenberg_shards_bpe"  # the CPU arms' corpus, from the shards the mirror holds


def test_the_shards_corpus_reads_the_gutenberg_shards_present(tmp_path, monkeypatch):
    """data=gutenberg_shards_bpe globs the mirror's shards (the GPU device carries a subset), and its
    validation is Gutenberg's own validation file."""
    from lm.data.prepare import resolve

    books = tmp_path / "text" / "gutenberg"
    books.mkdir(parents=True)
    for name in (
        "train-00000-of-00010.jsonl.zst",
        "train-00003-of-00010.jsonl.zst",
        "validation-00000-of-00001.jsonl.zst",
    ):
        (books / name).write_bytes(b"")
    monkeypatch.setenv("LM_DATA_MIRROR", str(tmp_path))
    d = OmegaConf.to_object(pretrain_config(Recipe(preset="glue_transfer_gpu", out=Path("/tmp/unused"))).data)
    assert d.source[-1] == f"{tmp_path}/text/gutenberg/train-*.jsonl.zst"
    train = [
        Path(str(f.path)).name
        for f in resolve(d.source[-1:], d.format, split="train", mirror=d.mirror, hf_split=d.hf_split)[0]
    ]
    assert train == ["train-00000-of-00010.jsonl.zst", "train-00003-of-00010.jsonl.zst"]
    assert Path(d.val_source).name == "validation-00000-of-00001.jsonl.zst"


def test_electra_shares_the_encoder_scratch_arm():
    """ELECTRA's discriminator is finetuned as the plain encoder, so the scratch arm an ELECTRA recipe records
    (and would train) is the encoder recipe's: the curve shares one instead of training the same arm twice."""
    from lm.cli.transfer_arms import same_value
    from lm.cli.transfer_recipe import finetuned_model_node

    nodes = {
        p: pretrain_config(Recipe(preset=f"glue_transfer_{p}", out=Path("/tmp/unused"))).model
        for p in ("encoder", "electra")
    }
    assert nodes["electra"].family is not None and nodes["encoder"].family is None
    as_dict = {p: OmegaConf.to_container(finetuned_model_node(n), resolve=True) for p, n in nodes.items()}
    assert as_dict["electra"] == as_dict["encoder"] and same_value("model", as_dict["encoder"], as_dict["electra"])
    assert nodes["electra"].family is not None  # the pretraining config itself is left alone
