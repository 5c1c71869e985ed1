"""benchmarks/hf_glue_check.py: its own pair encoding (the export's transformers tokenizer, no lm.glue code) must
give lm finetune's token ids, or the two sides of the check would finetune on different inputs."""

import json

import pytest

pytest.importorskip("transformers")

from lm.data.tokenizer import to_transformers, train  # noqa: E402
from lm.glue.encode import encode_examples  # noqa: E402
from lm.glue.readers import Example  # noqa: E402
from tests.benchmark_scripts import load  # noqa: E402
from tests.model_support import BERT_LAYOUT  # noqa: E402

check = load("hf_glue_check")

ROWS = [  # (a, b, label): short pairs, one that must be truncated on the longer side, one truncated on a tie
    ("The cat sat on the mat.", "A cat is sitting on a mat.", 4.2),
    ("A man is playing a guitar loudly in the street " * 3, "Someone plays music.", 1.0),
    ("two dogs run", "two dogs run", 5.0),
    ("the quick brown fox jumps over the lazy dog " * 2, "pack my box with five dozen liquor jugs " * 2, 0.0),
]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """lm's byte-level BPE and the transformers tokenizer lm export writes from the same file."""
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    ours = train("bpe", [a + " " + b for a, b, _ in ROWS] * 20, vocab_size=400, n_sentinels=0)
    ours.save(path)
    return ours, to_transformers(path)


@pytest.mark.parametrize(("kind", "arch"), [("gpt2", "decoder"), ("bert", "encoder"), ("esm", "encoder")])
@pytest.mark.parametrize("max_len", [12, 128])
def test_the_script_encodes_pairs_as_lm_finetune_does(tokenizers, kind, arch, max_len):
    ours, theirs = tokenizers
    lm_rows = encode_examples(ours, [Example(i, a, b, y) for i, (a, b, y) in enumerate(ROWS)], max_len, arch)
    hf_rows = check.encode(theirs, ROWS, max_len, kind)
    keys = ["input_ids", "attention_mask", "labels"] + (["token_type_ids"] if kind == "bert" else [])
    assert [{k: r[k] for k in keys} for r in hf_rows] == [{k: r[k] for k in keys} for r in lm_rows]
    assert max(len(r["input_ids"]) for r in hf_rows) == min(max_len, max(len(r["input_ids"]) for r in lm_rows))
    if kind != "bert":  # GPT-2 would add the embedding of token id 0/1 to every position; ESM takes none
        assert all("token_type_ids" not in r for r in hf_rows)
    if kind == "gpt2":
        assert {r["input_ids"][-1] for r in hf_rows} == {ours.eos_id}  # the pooled last token


def test_the_family_comes_from_the_export_and_others_are_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    assert check.family(tmp_path) == "gpt2"
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(SystemExit, match="model_type 'llama'"):
        check.family(tmp_path)


STSB_HEADER = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"


def _checkpoint(tmp_path, tok, model_cfg):
    """A minimal lm train checkpoint (as tests/test_convert_export.py builds it) with non-trivial weights."""
    import dataclasses

    import torch
    from omegaconf import OmegaConf

    from lm.model import build_model

    data_dir, ckpt = tmp_path / "data", tmp_path / "ckpt"
    data_dir.mkdir()
    ckpt.mkdir()
    tok.save(data_dir / "tokenizer.json")
    torch.manual_seed(0)
    model = build_model(model_cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    (ckpt / "trainer.json").write_text(json.dumps({"engine": {"format": "torch"}}))
    torch.save({"model": model.state_dict()}, ckpt / "model_optim.pt")
    OmegaConf.save(
        {"model": dataclasses.asdict(model_cfg), "data": {"name": "t", "dir": str(data_dir)}}, ckpt / "config.yaml"
    )
    return ckpt


@pytest.mark.parametrize("kind", ["gpt2", "bert", "esm"])
def test_both_sides_compute_the_same_classifier(tmp_path, kind):
    """Given the same head weights, lm finetune's classifier and the Hugging Face one give the same STS-B
    scores (the pooled position, the pair layout and the backbone all agree); mean pooling would not."""
    from lm.cli.export import export
    from lm.model.config import ModelConfig, RoPEConfig

    root = tmp_path / "glue"
    (root / "STS-B").mkdir(parents=True)
    lines = [f"{i}\tg\tf\t2012\t{i}\tnone\tnone\t{a}\t{b}\t{y:.3f}\n" for i, (a, b, y) in enumerate(ROWS)]
    (root / "STS-B" / "dev.tsv").write_text(STSB_HEADER + "".join(lines))
    tok = train("bpe", [a + " " + b for a, b, _ in ROWS] * 20, vocab_size=400, n_sentinels=0)
    vocab = 64 * ((tok.vocab_size + 63) // 64)
    if kind == "gpt2":
        cfg = ModelConfig(vocab_size=vocab, dim=32, n_layers=2, n_heads=4, max_seq_len=64)
    elif kind == "esm":  # the GLUE GPU preset's layout: a pre-norm RoPE encoder, exported as EsmModel
        cfg = ModelConfig(
            arch="encoder", vocab_size=vocab, dim=32, n_layers=2, n_heads=4, max_seq_len=64, pos=RoPEConfig()
        )
    else:
        cfg = ModelConfig(**BERT_LAYOUT, vocab_size=vocab, dim=32, n_layers=2, n_heads=4, max_seq_len=64)
    ckpt = _checkpoint(tmp_path, tok, cfg)
    hf_dir = export(ckpt, tmp_path / "export") / "hf"
    assert check.forward_gap(ckpt, hf_dir, root, "stsb", 24) < 1e-5
    if kind == "gpt2":  # the check can fail: the recipe's mean pooling is another function
        check.LM_HEADS["lm"]["gpt2"][0] = "pooling=mean"
        try:
            assert check.forward_gap(ckpt, hf_dir, root, "stsb", 24) > 1e-3
        finally:
            check.LM_HEADS["lm"]["gpt2"][0] = "pooling=last"


@pytest.mark.slow
def test_the_gpu_hf_check_script_pretrains_exports_and_checks_tiny(tmp_path, data_mirror):
    """benchmarks/gpu_hf_check.sh on the CPU with a tiny model of the GPU preset's layout: the pretraining,
    the export (ESM's EsmModel) and both sides of the check run; both sides encode RTE's dev rows alike and
    compute the same classifier; OUT holds six files (a device call brings back at most 8)."""
    import os
    import subprocess
    from pathlib import Path

    repo = Path(__file__).parents[1]
    subprocess.run(
        ["bash", str(repo / "benchmarks" / "gpu_transfer_data.sh"), "1", str(data_mirror)],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = {
        **os.environ,
        "LM_CACHE": str(tmp_path / "cache"),
        "LM_DATA_MIRROR": str(tmp_path / ".gpu_data"),
        "RUN_DIR": str(tmp_path / "run"),
        "TOKENS": "20000",
        "COMPILE": "false",
        "PRETRAIN": "model.dim=32 model.n_layers=1 model.n_heads=2 train.micro_batch_size=8 train.precision=fp32 "
        "train.eval_batches=2",
        "TASKS": "rte",
        "SEEDS": "0",
        "EPOCHS": "1",
        "MAX_TRAIN": "32",
    }
    out = tmp_path / "out"
    done = subprocess.run(
        ["bash", "benchmarks/gpu_hf_check.sh", str(out)], cwd=repo, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == [
        "check.json",
        "check.log",
        "env.txt",
        "export.log",
        "log.txt",
        "pretrain.log",
    ]
    assert "esm ['EsmModel']" in (out / "log.txt").read_text()
    log = (out / "check.log").read_text()
    assert "rte: dev rows encoded differently by the two sides: 0" in log
    gap = float(log.split("max |logit difference| / max |logit| on 64 dev rows: ")[1].split()[0])
    assert gap < 1e-5
    rows = json.loads((out / "check.json").read_text())
    assert [(r["task"], r["side"], sorted(r["seeds"])) for r in rows] == [("rte", "hf", ["0"]), ("rte", "lm", ["0"])]
    assert all(0 <= r["seeds"]["0"]["best"] <= 100 for r in rows)
