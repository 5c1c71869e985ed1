"""SIGKILL a real `lm finetune` in the middle of its second seed, run the same command again: the finished
seed is skipped, the interrupted one continues from its last epoch-end checkpoint, and results.json and
every logged loss equal an uninterrupted run's (one CPU process: bit-identical, dropout included).
"""

import json
import random
import subprocess
import sys

import pytest

from tests.engine_support import REPO, metrics, subprocess_env, train_losses
from tests.glue_support import TINY, sentence, write_tsv
from tests.test_train_kill_resume import run_and_kill

pytestmark = pytest.mark.slow

PER_EPOCH, EPOCHS = 10, 3  # 160 train examples / batch 16; checkpoints at steps 10 and 20 of each seed
KILL_AT = 2 * PER_EPOCH * EPOCHS - 5  # process step 55 = seed 1's step 25: inside its third epoch


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The easy SST-2-shaped task of tests/test_finetune.py (160 train, 60 dev, 20 test) and a BPE tokenizer."""
    from lm.data.tokenizer import train as train_tokenizer

    root = tmp_path_factory.mktemp("ft_resume")
    rng = random.Random(0)
    for split, n in (("train", 160), ("dev", 60)):
        write_tsv(
            root / "glue" / "SST-2" / f"{split}.tsv",
            ["sentence", "label"],
            [[sentence(rng, i % 2), i % 2] for i in range(n)],
        )
    write_tsv(
        root / "glue" / "SST-2" / "test.tsv", ["index", "sentence"], [[i, sentence(rng, i % 2)] for i in range(20)]
    )
    train_tokenizer("bpe", [sentence(rng, i % 2) for i in range(400)], vocab_size=300, n_sentinels=0).save(
        root / "tokenizer.json"
    )
    return root


def overrides(files, run_dir):
    return [
        "init=none",
        *TINY,
        "model.dropout=0.1",
        f"tokenizer={files / 'tokenizer.json'}",
        "task=glue/sst2",
        f"glue.data_root={files / 'glue'}",
        "hf=false",
        f"run_dir={run_dir}",
        "train.progress=false",
        "train.log_interval=1",
        "train.threads=1",
        "tasks.sst2.seeds=[0,1]",
        f"tasks.sst2.epochs={EPOCHS}",
        "tasks.sst2.batch_size=16",
        "tasks.sst2.max_len=24",
        "optim.lr=3e-3",
    ]


def finetune(args, **env):
    proc = subprocess.run(
        [sys.executable, "-m", "lm.cli.finetune", *args],
        cwd=REPO,
        env=subprocess_env(**env),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def whole(files, tmp_path_factory):
    """The uninterrupted job."""
    run_dir = tmp_path_factory.mktemp("whole") / "run"
    finetune(overrides(files, run_dir))
    return run_dir


def same_results(whole, killed):
    expected, got = (json.loads((d / "results.json").read_text()) for d in (whole, killed))
    assert got["columns"] == expected["columns"]  # dev metrics of both seeds, and their medians
    for seed in ("0", "1"):
        runs = (r["tasks"]["sst2"]["runs"][seed] for r in (expected, got))
        a, b = next(runs), next(runs)
        assert (a["history"], a["best_epoch"], a["main"]) == (b["history"], b["best_epoch"], b["main"])
    for seed in ("seed0", "seed1"):  # every step's loss logged once, and the same as without the kill
        losses = train_losses(killed / "sst2" / seed)
        assert list(losses) == list(range(1, PER_EPOCH * EPOCHS + 1))
        assert losses == train_losses(whole / "sst2" / seed)
    assert (killed / "submission" / "SST-2.tsv").read_text() == (whole / "submission" / "SST-2.tsv").read_text()


def test_sigkill_mid_seed_then_same_command_gives_the_uninterrupted_results(files, whole, tmp_path, monkeypatch):
    killed = tmp_path / "killed"

    import tests.test_train_kill_resume as kr

    monkeypatch.setattr(kr, "KILL_AT", KILL_AT)
    monkeypatch.setattr(kr, "command", lambda world: [sys.executable, "-m", "lm.cli.finetune"])
    run_and_kill(1, overrides(files, killed), files, tmp_path)
    assert (killed / "sst2" / "seed0" / "result.pt").is_file()  # seed 0 finished before the kill
    assert not (killed / "sst2" / "seed1" / "result.pt").exists()
    ckpts = killed / "sst2" / "seed1" / "checkpoints"
    assert (ckpts / "latest").read_text() == f"step_{2 * PER_EPOCH:08d}"  # the last epoch end before the kill
    assert not (killed / "results.json").exists()

    proc = finetune(overrides(files, killed))
    log = proc.stdout + proc.stderr
    assert "seed 0: done in an earlier run" in log and f"resumed from {ckpts / f'step_{2 * PER_EPOCH:08d}'}" in log
    same_results(whole, killed)
    dev = [m["dev/main"] for m in metrics(killed / "sst2" / "seed1") if "dev/main" in m]
    assert len(dev) == EPOCHS
    assert not ckpts.exists()  # a finished seed keeps result.pt, not its checkpoints


def test_ctrl_c_mid_seed_stops_with_a_checkpoint_and_the_same_command_resumes(files, whole, tmp_path, monkeypatch):
    """Issue 49 item 10 for lm finetune: Ctrl-C inside seed 1's step 25 stops after that step with its checkpoint
    (one line, exit status 1, as SIGTERM), and the same command gives the uninterrupted results."""
    import signal

    import tests.test_train_kill_resume as kr

    stopped = tmp_path / "stopped"
    monkeypatch.setattr(kr, "KILL_AT", KILL_AT)
    monkeypatch.setattr(kr, "command", lambda world: [sys.executable, "-m", "lm.cli.finetune"])
    proc = kr.start_paused(1, overrides(files, stopped), files, tmp_path, stdout=subprocess.PIPE)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1 and "Traceback" not in out + err, out[-2000:] + err[-2000:]
    ckpt = stopped / "sst2" / "seed1" / "checkpoints" / f"step_{KILL_AT - PER_EPOCH * EPOCHS:08d}"
    assert f"SIGINT (Ctrl-C) received: stopped after step {KILL_AT - PER_EPOCH * EPOCHS} with checkpoint {ckpt}" in out
    log = "".join(finetune(overrides(files, stopped)).stdout)
    assert f"resumed from {ckpt}" in log
    same_results(whole, stopped)
