"""Elastic resume: a checkpoint written on N ranks by one engine continues on M ranks and/or another engine, with
the same global batch, the same samples in every step (a digest of each step's token ids, tests/token_log.py)
and the uninterrupted run's losses to 1e-5 (fp32: only the reduction order differs). Real `lm train` processes
(torchrun, gloo) on tiny Shakespeare; the run is 4 steps on the first layout, then 4 more on the second. Engines:
single, DDP, FSDP2 and DeepSpeed ZeRO-1/2/3, in both directions. Validation after a 1 -> 2 ranks resume scores the
run's val windows: the uninterrupted run's val_loss.
"""

import subprocess
import sys

import pytest

from tests.engine_support import REPO, free_port, metrics, subprocess_env, train_losses
from tests.token_log import steps as token_steps

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

STEPS, SPLIT, GLOBAL = 8, 4, 4  # sequences per step: micro-batch 1 x grad_accum x world
TOL = 1e-5


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def overrides(run_dir, steps, engine, grad_accum):
    return [
        f"run_dir={run_dir}",
        "model=tiny",
        "model.max_seq_len=64",
        "data=shakespeare_char",
        "train.seq_len=32",
        "train.micro_batch_size=1",
        f"train.grad_accum={grad_accum}",
        f"train.max_steps={steps}",
        "train.log_interval=1",
        "train.eval_interval=0",
        "train.ckpt_interval=0",
        "sched.warmup_steps=2",
        "train.progress=false",
        f"engine={engine}",
        "sched=constant",
    ]  # the first launch stops at SPLIT: its schedule must not depend on max_steps


def launch(world, args, cache, log, segment, *torchrun):
    cmd = (
        [sys.executable, "-m", "lm.cli.train"]
        if world == 1
        else [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(world),
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(free_port()),
            *torchrun,
            "-m",
            "lm.cli.train",
        ]
    )
    env = subprocess_env(
        LM_CACHE=str(cache),
        LM_PLUGINS=str(REPO / "tests" / "token_log.py"),
        LM_TOKEN_LOG=str(log),
        LM_TOKEN_SEGMENT=str(segment),
    )
    return subprocess.run(cmd + args, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def ok(proc):
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache):
    """The uninterrupted run: one process, grad_accum 4."""
    root = tmp_path_factory.mktemp("reference")
    ok(launch(1, overrides(root / "run", STEPS, "single", GLOBAL), cache, root / "tokens", 0))
    return train_losses(root / "run"), token_steps(root / "tokens")


LAYOUTS = {  # name: (first world, engine), (second world, engine)
    "2->1 ddp->single": ((2, "ddp"), (1, "single")),
    "1->2 single->ddp": ((1, "single"), (2, "ddp")),
    "2->4 fsdp2": ((2, "fsdp2"), (4, "fsdp2")),
    "ddp->fsdp2": ((2, "ddp"), (2, "fsdp2")),
    "fsdp2->single": ((2, "fsdp2"), (1, "single")),
    # ZeRO (lm/engine/ds_reshard.py): its partitions merged into the full state, or a full state partitioned
    "2->1 zero2": ((2, "zero2"), (1, "zero2")),
    "1->2 zero2": ((1, "zero2"), (2, "zero2")),
    "2->1 zero1": ((2, "zero1"), (1, "zero1")),
    "2->1 zero3->single": ((2, "zero3"), (1, "single")),
    "zero2->single": ((2, "zero2"), (1, "single")),
    "zero2->ddp": ((2, "zero2"), (2, "ddp")),
    "zero2->fsdp2": ((2, "zero2"), (2, "fsdp2")),
    "fsdp2->zero2": ((2, "fsdp2"), (2, "zero2")),
    "ddp->zero3": ((2, "ddp"), (2, "zero3")),
    "zero1->zero3": ((2, "zero1"), (2, "zero3")),  # one engine class, another stage's files
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_resume_on_another_layout_continues_the_same_stream_and_losses(name, reference, cache, tmp_path):
    (w1, e1), (w2, e2) = LAYOUTS[name]
    run, log = tmp_path / "run", tmp_path / "tokens"
    ok(launch(w1, overrides(run, SPLIT, e1, GLOBAL // w1), cache, log, 0))
    # the same command on the new layout: grad_accum as the first run had it, adjusted to keep 4 per step
    second = ok(launch(w2, overrides(run, STEPS, e2, GLOBAL // w1), cache, log, 1))
    if w2 != w1:
        assert (
            f"train.grad_accum {GLOBAL // w1} -> {GLOBAL // w2} keeps the run's {GLOBAL} sequences"
            in second.stdout + second.stderr
        )
    ref_losses, ref_tokens = reference
    tokens = token_steps(log)
    assert sorted(tokens) == sorted(ref_tokens) == list(range(STEPS))
    for step in range(STEPS):  # no sample repeated or skipped: each step holds exactly the reference's samples
        assert tokens[step] == ref_tokens[step], f"step {step}: other samples than the uninterrupted run's"
        assert len(tokens[step]) == GLOBAL
    losses = train_losses(run)
    assert list(losses) == list(range(1, STEPS + 1))
    worst = max(abs(losses[s] - ref_losses[s]) for s in ref_losses)
    assert worst < TOL, f"{name}: max |loss - uninterrupted| = {worst:.2e}"


def test_resume_from_two_to_three_zero2_ranks_keeps_a_global_batch_of_six(cache, tmp_path):
    """2 -> 3 ranks where the global batch allows it (6 sequences: grad_accum 3 -> 2): ZeRO-2's partitions of 2
    ranks repartitioned over 3, the same samples in every step and the 1-process run's losses."""
    ref, run = tmp_path / "ref", tmp_path / "run"
    ok(launch(1, overrides(ref / "run", STEPS, "single", 6), cache, ref / "tokens", 0))
    ok(launch(2, overrides(run, SPLIT, "zero2", 3), cache, tmp_path / "tokens", 0))
    second = ok(launch(3, overrides(run, STEPS, "zero2", 3), cache, tmp_path / "tokens", 1))
    assert "train.grad_accum 3 -> 2 keeps the run's 6 sequences" in second.stdout + second.stderr
    tokens, ref_tokens = token_steps(tmp_path / "tokens"), token_steps(ref / "tokens")
    assert sorted(tokens) == sorted(ref_tokens) == list(range(STEPS))
    assert all(tokens[s] == ref_tokens[s] and len(tokens[s]) == 6 for s in range(STEPS))
    losses, ref_losses = train_losses(run), train_losses(ref / "run")
    assert list(losses) == list(ref_losses) == list(range(1, STEPS + 1))
    worst = max(abs(losses[s] - ref_losses[s]) for s in ref_losses)
    assert worst < TOL, f"zero2 2 -> 3: max |loss - uninterrupted| = {worst:.2e}"


def test_validation_after_a_resume_on_two_ranks_scores_the_uninterrupted_runs_windows(cache, tmp_path):
    """train.eval_batches=20 micro-batches of 1 window on 1 rank: 20 val windows, recorded in the checkpoint; the
    resume on 2 ranks scores those 20 (10 per rank), not 40, so val_loss at step 8 is the 1-process run's."""

    def validated(run_dir, steps, engine, grad_accum):
        args = overrides(run_dir, steps, engine, grad_accum)
        return [a if a != "train.eval_interval=0" else "train.eval_interval=4" for a in args]

    ref, run = tmp_path / "ref", tmp_path / "run"
    ok(launch(1, validated(ref, STEPS, "single", GLOBAL), cache, tmp_path / "ref_tokens", 0))
    ok(launch(1, validated(run, SPLIT, "single", GLOBAL), cache, tmp_path / "tokens", 0))
    ok(launch(2, validated(run, STEPS, "ddp", GLOBAL), cache, tmp_path / "tokens", 1))
    want = {m["step"]: m["val_loss"] for m in metrics(ref) if "val_loss" in m}
    got = {m["step"]: m["val_loss"] for m in metrics(run) if "val_loss" in m}
    assert list(got) == list(want) == [SPLIT, STEPS]
    assert abs(got[STEPS] - want[STEPS]) < TOL, f"val_loss at step {STEPS}: {got[STEPS]:.6f}, not {want[STEPS]:.6f}"


def test_checkpoint_on_zero_stage_0_is_refused_in_one_line(cache, tmp_path):
    """engine=deepspeed (ZeRO stage 0) keeps DeepSpeed's own optimizer file, which elastic resume does not read or
    write: one line naming the fix, status 1, and the checkpoint still resumes on FSDP2 afterwards."""
    run, log = tmp_path / "run", tmp_path / "tokens"
    ok(launch(2, overrides(run, SPLIT, "fsdp2", 2), cache, log, 0))
    ranks = tmp_path / "ranks"  # each rank's own output (torchrun's summary of failed ranks has a traceback of its own)
    refused = launch(
        2, overrides(run, STEPS, "deepspeed", 2), cache, log, 1, "--log-dir", str(ranks), "--redirects", "3"
    )
    assert refused.returncode != 0
    for rank in ("0", "1"):  # rank 0 prints the line; rank 1 only writes it where torchrun's summary reads it
        out = "".join(f.read_text() for f in sorted(ranks.glob(f"*/attempt_*/{rank}/std*.log")))
        assert "Traceback" not in out, out[-3000:]
        said = out if rank == "0" else "".join(f.read_text() for f in ranks.glob(f"*/attempt_*/{rank}/error.json"))
        assert "cannot be resumed by DeepSpeedEngine (ZeRO-0) on 2 rank(s)" in said, out[-3000:]
        assert "use engine=zero2 (or zero1, zero3), or resume with engine=fsdp2 on 2 rank(s)" in said
    ok(launch(2, overrides(run, STEPS, "fsdp2", 2), cache, log, 2))
    assert list(train_losses(run)) == list(range(1, STEPS + 1))


# -- lm finetune: a task/seed pair stopped on one process continues on 2 ranks (DDP or ZeRO-2) ---------------


@pytest.mark.parametrize("engine", ["ddp", "zero2"])
def test_finetune_pair_stopped_on_one_process_continues_on_two_ranks(engine, tmp_path):
    """Ctrl-C inside step 15 of a 30-step pair (1 process, DDP), then the same command under torchrun on 2 ranks
    (DDP, or ZeRO-2: the engine may change too): every step holds the uninterrupted run's examples and its loss
    to 1e-5 (dropout off: the streams of per-rank dropout masks cannot continue across world sizes)."""
    import signal
    import time

    files = _finetune_files(tmp_path / "files")
    token_log = str(REPO / "tests" / "token_log.py")
    finetune = [sys.executable, "-m", "lm.cli.finetune"]
    whole = subprocess.run(
        finetune + _finetune_args(files, tmp_path / "whole"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=subprocess_env(LM_PLUGINS=token_log, LM_TOKEN_LOG=str(tmp_path / "whole_tokens")),
    )
    assert whole.returncode == 0, whole.stderr[-3000:]

    flag = tmp_path / "paused"  # benchmarks/fault_pause.py parks the run inside step 15, then Ctrl-C
    stopped = subprocess.Popen(
        finetune + _finetune_args(files, tmp_path / "run"),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(
            LM_PLUGINS=f"{token_log},{REPO / 'benchmarks' / 'fault_pause.py'}",
            LM_TOKEN_LOG=str(tmp_path / "tokens"),
            LM_FAULT_PAUSE_FILE=str(flag),
            LM_FAULT_PAUSE_AT_STEP="15",
        ),
    )
    deadline = time.time() + 600
    while not flag.exists() and stopped.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    stopped.send_signal(signal.SIGINT)
    out, err = stopped.communicate(timeout=300)
    assert stopped.returncode == 1 and "stopped after step 15" in out + err, (out + err)[-3000:]

    resumed = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(free_port()),
            "-m",
            "lm.cli.finetune",
        ]
        + [a if a != "engine=ddp" else f"engine={engine}" for a in _finetune_args(files, tmp_path / "run")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=subprocess_env(LM_PLUGINS=token_log, LM_TOKEN_LOG=str(tmp_path / "tokens"), LM_TOKEN_SEGMENT="1"),
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout + resumed.stderr
    tokens, reference = token_steps(tmp_path / "tokens"), token_steps(tmp_path / "whole_tokens")
    assert sorted(tokens) == sorted(reference) == list(range(30))
    assert all(tokens[s] == reference[s] for s in reference)
    got, want = train_losses(tmp_path / "run" / "sst2" / "seed0"), train_losses(tmp_path / "whole" / "sst2" / "seed0")
    assert list(got) == list(want) == list(range(1, 31))
    worst = max(abs(got[s] - want[s]) for s in want)
    assert worst < TOL, f"finetune 1 -> 2 ranks ({engine}): max |loss - uninterrupted| = {worst:.2e}"


def _finetune_args(files, run_dir):
    """tests/test_finetune_kill_resume.py's job, one seed (30 steps), DDP, dropout off."""
    from tests.test_finetune_kill_resume import overrides as kill_resume_overrides

    return [a for a in kill_resume_overrides(files, run_dir) if a != "model.dropout=0.1"] + [
        "model.dropout=0.0",
        "tasks.sst2.dropout=0.0",
        "tasks.sst2.seeds=[0]",
        "engine=ddp",
    ]


def _finetune_files(root):
    """tests/test_finetune_kill_resume.py's task files (its module fixture's body, called directly)."""
    import random

    from lm.data.tokenizer import train as train_tokenizer
    from tests.glue_support import sentence, write_tsv

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
