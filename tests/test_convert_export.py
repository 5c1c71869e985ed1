"""lm export's Hugging Face directory: the model, the run's tokenizer, and its bos/eos/pad ids.

A checkpoint is written by hand in the single-process layout (trainer.json, model_optim.pt,
config.yaml), so the test needs no training run.
"""

import dataclasses
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
from omegaconf import OmegaConf  # noqa: E402

from lm.cli.export import export  # noqa: E402
from lm.data.tokenizer import Tokenizer, train  # noqa: E402
from lm.model import build_model  # noqa: E402
from lm.model.config import GLUConfig, MLPConfig, ModelConfig, RMSNormConfig, RoPEConfig, T5BiasConfig  # noqa: E402
from tests.model_support import BERT_LAYOUT  # noqa: E402

TEXT = ["the quick brown fox jumps over the lazy dog", "pack my box with five dozen liquor jugs"]


def _checkpoint(tmp_path, model_cfg: ModelConfig, tokenizer: Tokenizer):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    tokenizer.save(data_dir / "tokenizer.json")
    torch.manual_seed(0)
    model = build_model(model_cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)  # non-trivial biases and norms
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "trainer.json").write_text(json.dumps({"engine": {"format": "torch"}}))
    torch.save({"model": model.state_dict()}, ckpt / "model_optim.pt")
    OmegaConf.save(
        {"model": dataclasses.asdict(model_cfg), "data": {"name": "t", "dir": str(data_dir)}}, ckpt / "config.yaml"
    )
    return ckpt, model.eval()


@pytest.mark.parametrize("family", ["llama", "t5", "gpt2", "bert", "esm"])
def test_export_writes_tokenizer_and_special_ids(tmp_path, family):
    tok = train("char", TEXT, n_sentinels=4)
    vocab = 64 * ((tok.vocab_size + 63) // 64)
    if family == "gpt2":  # both of GPT-2's attention-scaling flags off their defaults, untied
        cfg = ModelConfig(
            vocab_size=vocab,
            dim=32,
            n_layers=3,
            n_heads=4,
            attn_scale=1.0,
            attn_scale_by_layer=True,
            tie_embeddings=False,
        )
        auto = transformers.AutoModelForCausalLM
    elif family == "bert":  # ReLU in the FFN and the MLM-head transform
        cfg = ModelConfig(
            **BERT_LAYOUT,
            vocab_size=vocab,
            dim=32,
            n_layers=2,
            n_heads=4,
            mlm_activation="relu",
            ffn=MLPConfig(activation="relu"),
        )
        auto = transformers.AutoModelForMaskedLM
    elif family == "llama":  # Llama 3.1-style RoPE scaling, attention biases without MLP biases
        cfg = ModelConfig(
            vocab_size=vocab,
            dim=32,
            n_layers=2,
            n_heads=4,
            n_kv_heads=2,
            bias=True,
            ffn_bias=False,
            tie_embeddings=False,
            norm=RMSNormConfig(),
            ffn=GLUConfig(activation="silu"),
            pos=RoPEConfig(theta=500.0, scaling="llama3", factor=8.0, original_max_seq_len=16),
        )
        auto = transformers.AutoModelForCausalLM
    elif family == "esm":  # the GLUE GPU preset's encoder (RoPE, pre-norm, no MLM-head transform): EsmModel
        cfg = ModelConfig(arch="encoder", vocab_size=vocab, dim=32, n_layers=2, n_heads=4, pos=RoPEConfig(theta=500.0))
        auto = transformers.AutoModel
    else:  # T5 v1.1 layout: untied, GeGLU (tanh), unscaled logits
        cfg = ModelConfig(
            arch="encoder_decoder",
            vocab_size=vocab,
            dim=32,
            n_layers=2,
            n_heads=4,
            bias=False,
            attn_scale=1.0,
            tie_embeddings=False,
            norm=RMSNormConfig(),
            ffn=GLUConfig(activation="gelu_tanh"),
            pos=T5BiasConfig(),
        )
        auto = transformers.AutoModelForSeq2SeqLM
    ckpt, model = _checkpoint(tmp_path, cfg, tok)
    out = export(ckpt, tmp_path / "export")
    hf_dir = out / "hf"

    hf_tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    assert hf_tok(TEXT[0], add_special_tokens=False)["input_ids"] == tok.encode(TEXT[0])
    config = json.loads((hf_dir / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (
        tok.bos_id,
        tok.eos_id,
        tok.pad_id,
    )
    assert (hf_tok.bos_token_id, hf_tok.eos_token_id, hf_tok.pad_token_id) == (tok.bos_id, tok.eos_id, tok.pad_id)
    # truncation=True cuts at the trained length (transformers' default model_max_length, 1e30, never cut)
    assert hf_tok.model_max_length == cfg.max_seq_len
    assert len(hf_tok(TEXT[1] * 50, truncation=True)["input_ids"]) == cfg.max_seq_len

    hf = auto.from_pretrained(hf_dir).eval()
    x = torch.tensor([tok.encode(TEXT[1])[:12]])
    kw = {"input_ids": x}
    if family == "t5":
        kw["decoder_input_ids"] = x[:, :7]
    with torch.no_grad():
        if family == "esm":  # the encoder alone: its last hidden states
            ours, theirs = model.features(x), hf(**kw).last_hidden_state
        else:
            ours, theirs = model(**kw).logits, hf(**kw).logits
    assert (ours - theirs).abs().max().item() < 1e-5 * max(1.0, ours.abs().max().item())


def test_a_bad_tokenizer_is_refused_before_anything_is_written(tmp_path):
    """A checkpoint without a recorded tokenizer sha256 (not written by the packed loader) and a --tokenizer that
    is not a tokenizer: the file was first read inside the export, whose ValueError passed for "no Hugging Face
    family matches", so the export ended with success and no hf/ at all."""
    ckpt, _ = _checkpoint(tmp_path, ModelConfig(vocab_size=64, dim=32, n_layers=1, n_heads=4), train("char", TEXT))
    bad = tmp_path / "notes.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match=f"{bad}: not a valid tokenizer.json"):
        export(ckpt, tmp_path / "export", tokenizer=bad)
    assert not (tmp_path / "export").exists()


def test_a_run_whose_tokenizer_is_gone_is_told_where_it_was_and_what_to_pass(tmp_path, caplog):
    ckpt, _ = _checkpoint(tmp_path, ModelConfig(vocab_size=64, dim=32, n_layers=1, n_heads=4), train("char", TEXT))
    (tmp_path / "data" / "tokenizer.json").unlink()
    with caplog.at_level("WARNING", logger="lm"):
        out = export(ckpt, tmp_path / "export")
    assert sorted(p.name for p in (out / "hf").iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
    ]
    assert (
        f"hf/ gets no tokenizer: the run's {tmp_path / 'data' / 'tokenizer.json'} is not there (moved or deleted?), "
        "so AutoTokenizer.from_pretrained cannot load hf/; pass --tokenizer <the run's tokenizer.json>"
    ) in caplog.text


def test_a_bert_vocabulary_exports_no_id_past_the_embedding(tmp_path):
    """A run on a BERT-style tokenizer.json (no bos/eos) and a model of its size: lm's Tokenizer appended <bos> and
    <eos>, so hf/ held 2 tokens more than config.json's vocab_size (140 for 138), config's bos/eos ids were 138 and
    139, and a text spelling "<eos>" ran AutoModelForMaskedLM into "IndexError: index out of range". They are
    [CLS] and [SEP] now."""
    from tests.test_data_tokenizer import bert_vocab_tokenizer

    n = bert_vocab_tokenizer(tmp_path / "bert.json")
    tok = Tokenizer.load(tmp_path / "bert.json")
    cfg = ModelConfig(**BERT_LAYOUT, vocab_size=n, dim=32, n_layers=1, n_heads=4, mlm_activation="relu",
                      ffn=MLPConfig(activation="relu"))  # fmt: skip
    ckpt, _ = _checkpoint(tmp_path, cfg, tok)
    (tmp_path / "data" / "tokenizer.json").write_bytes((tmp_path / "bert.json").read_bytes())  # the user's file
    hf_dir = export(ckpt, tmp_path / "export") / "hf"
    hf_tok, config = (
        transformers.AutoTokenizer.from_pretrained(hf_dir),
        json.loads((hf_dir / "config.json").read_text()),
    )
    assert len(hf_tok) == config["vocab_size"] == n and max(hf_tok.get_vocab().values()) == n - 1
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (2, 3, 0)
    ids = hf_tok("the quick fox <eos> <bos> [MASK]", return_tensors="pt")
    assert ids["input_ids"][0, 0].item() == 2 and ids["input_ids"][0, -1].item() == 3  # its own [CLS] a [SEP]
    with torch.no_grad():
        logits = transformers.AutoModelForMaskedLM.from_pretrained(hf_dir)(**ids).logits
    assert logits.shape == (1, ids["input_ids"].shape[1], n)
