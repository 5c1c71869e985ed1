"""Your own text in one step (issue 48, item 5): `lm train data.source=<file>` prepares it with lm prepare's
defaults into a directory of its own (not shakespeare_char's split, tokenizer or directory); `lm train
data=<dir lm prepare wrote>` trains on that directory as it is; the model's vocabulary follows the tokenizer;
no message tells the user to --force over their data; and the same command again resumes the run."""

import hashlib
import json
import random
from pathlib import Path

import pytest
import yaml

from lm.cli.own_data import own_data_args
from lm.config import ConfigError
from lm.data.config import DataConfig
from lm.data.errors import DataError
from lm.data.prepare import ensure_prepared, prepare
from tests.engine_support import metrics
from tests.test_validation_errors import run_cli

TRAIN = [
    "model=tiny",
    "train.seq_len=32",
    "train.micro_batch_size=2",
    "train.eval_batches=1",
    "train.log_interval=1",
    "sched.warmup_steps=1",
    "train.progress=false",
]


def write_text(path, lines=300, seed=0):
    rng = random.Random(seed)
    words = [
        "the",
        "a",
        "cat",
        "dog",
        "sat",
        "ran",
        "on",
        "under",
        "mat",
        "tree",
        "house",
        "river",
        "quickly",
        "slowly",
        "red",
        "green",
        "small",
        "large",
    ]
    path.write_text("\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(lines)) + "\n")
    return path


def digest(directory):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir()) if p.is_file()}


def test_data_source_alone_selects_the_text_preset_and_a_directory_names_the_prepared_preset(tmp_path):
    assert own_data_args(["data.source=a.txt", "model=tiny"]) == ["data=text", "data.source=a.txt", "model=tiny"]
    assert own_data_args(["data=wikitext2_bpe", "data.source=a.txt"]) == ["data=wikitext2_bpe", "data.source=a.txt"]
    assert own_data_args(["experiment=cpu_smoke", "data.source=a"]) == ["experiment=cpu_smoke", "data.source=a"]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "meta.json").write_text("{}")
    assert own_data_args([f"data={tmp_path / 'mine'}", "seed=1"]) == [
        "data=prepared",
        f"data.dir={tmp_path / 'mine'}",
        "seed=1",
    ]
    assert own_data_args(["data=shakespeare_char"]) == ["data=shakespeare_char"]
    with pytest.raises(
        ConfigError,
        match=r"data=.*empty is neither a data preset .* has no meta.json \(run lm "
        r"prepare <your text> --out .*empty first\)",
    ):
        (tmp_path / "empty").mkdir()
        own_data_args([f"data={tmp_path / 'empty'}"])
    (tmp_path / "notes.txt").write_text("some text\n")  # the text itself, where its prepared directory belongs
    with pytest.raises(ConfigError, match=r"notes.txt is a file: train on its text with data.source=.*notes.txt$"):
        own_data_args([f"data={tmp_path / 'notes.txt'}"])


def test_verify_names_a_file_or_a_missing_directory_for_what_it_is(tmp_path):
    from lm.data.manifest import open_prepared

    (tmp_path / "notes.txt").write_text("some text\n")
    with pytest.raises(DataError, match=r"notes.txt is a file, not an lm prepare directory: lm prepare .*notes.txt"):
        open_prepared(tmp_path / "notes.txt")
    with pytest.raises(DataError, match=r"gone: no such directory; lm prepare <text> --out .*gone makes it"):
        open_prepared(tmp_path / "gone")


def test_prepared_data_with_other_settings_is_never_answered_with_force(tmp_path):
    text = write_text(tmp_path / "notes.txt")
    out = tmp_path / "mine"
    cfg = dict(source=str(text), tokenizer="bpe", vocab_size=400, workers=1, dir=str(out))
    prepare(cfg, progress=False)
    before = digest(out)
    with pytest.raises(DataError) as e:
        ensure_prepared({**cfg, "vocab_size": 448})  # what lm train does on first use
    assert "--force" not in str(e.value) and "data.name=<new name>" in str(e.value) and "data=<dir>" in str(e.value)
    assert ensure_prepared(DataConfig(dir=str(out), source=None)) == out  # data=prepared: read as it is
    assert digest(out) == before


def test_train_on_a_prepared_directory_follows_its_tokenizer_and_resumes_on_the_same_command(tmp_path):
    text = write_text(tmp_path / "notes.txt")
    out = tmp_path / "data" / "mine"
    p = run_cli(
        "lm",
        "prepare",
        str(text),
        "--out",
        str(out),
        "--vocab-size",
        "400",
        "--workers",
        "1",
        "--no-progress",
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr
    before = digest(out)
    vocab = json.loads((out / "meta.json").read_text())["tokenizer"]["vocab_size"]
    assert vocab > 256  # larger than model=tiny's vocabulary: the model must grow to it

    p = run_cli("lm", "train", "data=data/mine", *TRAIN, "train.max_steps=2", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1
    run = runs[0]
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["model"]["vocab_size"] == -(-vocab // 64) * 64
    assert config["data"]["dir"] == str(out) and config["data"]["source"] is None
    assert "--force" not in p.stdout + p.stderr
    assert digest(out) == before  # the user's data is read, never rewritten

    p = run_cli("lm", "train", "data=data/mine", *TRAIN, "train.max_steps=3", cwd=tmp_path)  # the same run, longer
    assert p.returncode == 0, p.stderr
    assert "resumed from" in p.stdout + p.stderr and run.name in p.stdout + p.stderr
    assert list((tmp_path / "runs").iterdir()) == [run]
    assert [m["step"] for m in metrics(run) if "loss" in m] == [1, 2, 3]


def test_a_model_vocabulary_larger_than_the_tokenizers_is_kept(tmp_path):
    """The vocabulary follows the tokenizer up, never down: model=tiny's 256 rows stay on shakespeare_char's 65
    characters (presets pad theirs for speed: GPT-2's 50304), not 128 (the 65 rounded up to 64's multiple)."""
    p = run_cli("lm", "train", "data=shakespeare_char", *TRAIN, "train.max_steps=1", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    (run,) = (tmp_path / "runs").iterdir()
    assert yaml.safe_load((run / "config.yaml").read_text())["model"]["vocab_size"] == 256
    assert "132864 params" in p.stdout + p.stderr  # the model built has them too (124672 with 128 rows)


@pytest.mark.slow
def test_train_on_a_text_file_in_one_step(tmp_path):
    text = write_text(tmp_path / "notes.txt")
    p = run_cli("lm", "train", "data.source=notes.txt", *TRAIN, "train.max_steps=2", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    (run,) = (tmp_path / "runs").iterdir()
    config = yaml.safe_load((run / "config.yaml").read_text())
    data = config["data"]
    assert data["name"].startswith("text-notes-") and data["source"] == "notes.txt"
    # lm prepare's defaults, not shakespeare_char's (char tokenizer, contiguous 90/10 split, no EOS)
    meta = json.loads((Path(data["dir"]) / "meta.json").read_text())
    assert meta["config"]["tokenizer"] == "bpe" and meta["config"]["split"] == "document"
    assert meta["config"]["append_eos"] is True
    assert config["model"]["vocab_size"] >= meta["tokenizer"]["vocab_size"]
    assert text.read_text().count("\n") == 300
