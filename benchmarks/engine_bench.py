"""Engine benchmarks (issue 4), each a ratio against a peer measured in the same run.

    python benchmarks/engine_bench.py overhead      # lm train's loop vs a bare fwd+bwd+AdamW loop
    python benchmarks/engine_bench.py zero-memory   # bytes per rank, ZeRO-0/1/2/3 on 2 CPU ranks, vs the formula

overhead: the same GPT-2-layout model, the same packed batches of tiny Shakespeare, the same AdamW;
`lm.cli.train.train` (engine=single, its tokens/s as logged in metrics.jsonl, batch fetching included)
against a hand-written loop, interleaved over several rounds; prints the medians and lm/bare.

zero-memory: `torchrun --nproc_per_node 2` per stage (started by this script), 2 training steps, then
each rank counts the bytes it holds: parameters (ds_tensor partitions under ZeRO-3), Adam's m and v,
and DeepSpeed's fp32 master partition. Formula (Rajbhandari et al. 2020, fp32 training, Psi
parameters, N ranks): parameters 4Psi (ZeRO-3: 4Psi/N); m+v 8Psi (ZeRO-1/2/3: 8Psi/N).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODEL = [
    "model=gpt2",
    "model.dim=192",
    "model.n_layers=6",
    "model.n_heads=6",
    "model.vocab_size=128",
    "model.max_seq_len=256",
    "model.dropout=0.0",
]


def compose(overrides):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from lm.config import conf_dir, register_train_configs

    register_train_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        return hydra_compose(config_name="train", overrides=overrides)


def run_overrides(run_dir, steps, extra=()):
    half = steps // 2
    return [
        f"run_dir={run_dir}",
        "data=shakespeare_char",
        *MODEL,
        "train.seq_len=256",
        "train.micro_batch_size=8",
        f"train.max_steps={steps}",
        f"train.log_interval={half}",
        "train.eval_interval=0",
        "train.eval_batches=1",
        "train.ckpt_interval=0",
        "train.progress=false",
        "sched.warmup_steps=5",
        *extra,
    ]


# -- overhead ---------------------------------------------------------------------------------------


def lm_train_tokens_per_s(steps):
    """lm train's own tokens/s over the second half of the run (the first half warms up)."""
    from lm.cli.train import train

    with tempfile.TemporaryDirectory() as d:
        train(compose(run_overrides(d, steps)))
        records = [json.loads(line) for line in (Path(d) / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "tokens_per_s" in r][-1]["tokens_per_s"]


def bare_tokens_per_s(steps):
    """The peer: build, then loss.backward(); clip; AdamW step; zero_grad; batches from the same loader."""
    import torch
    from omegaconf import OmegaConf

    from lm.core.config import OptimConfig
    from lm.core.optim import adamw
    from lm.data.packed import PackedLoader
    from lm.model import build_model

    cfg = compose(run_overrides("unused", steps))
    torch.manual_seed(0)
    model = build_model(OmegaConf.to_object(cfg.model))
    optimizer = adamw(model, OptimConfig())
    data_dir = os.path.expanduser(cfg.data.dir)
    batches = iter(PackedLoader(data_dir, "train", 256, 8, "clm", seed=0))

    def step():
        batch = next(batches)
        model(**batch).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    half = steps // 2
    for _ in range(half):
        step()
    t0 = time.perf_counter()
    for _ in range(half):
        step()
    return half * 8 * 256 / (time.perf_counter() - t0)


def overhead(args):
    import torch
    from omegaconf import OmegaConf

    torch.set_num_threads(args.threads)
    from lm.data.prepare import ensure_prepared

    ensure_prepared(OmegaConf.to_container(compose(run_overrides("unused", 2)).data, resolve=True))
    ours, bare = [], []
    for r in range(args.rounds):
        if r % 2 == 0:  # neither side always runs first
            bare.append(bare_tokens_per_s(args.steps))
            ours.append(lm_train_tokens_per_s(args.steps))
        else:
            ours.append(lm_train_tokens_per_s(args.steps))
            bare.append(bare_tokens_per_s(args.steps))
        print(f"round {r + 1}: bare {bare[-1]:.0f} tok/s, lm train {ours[-1]:.0f} tok/s", flush=True)
    b, o = statistics.median(bare), statistics.median(ours)
    print(
        f"\nGPT-2 layout {' '.join(MODEL[1:5])}, seq 256, batch 8, {args.threads} threads, fp32, median of "
        f"{args.rounds} rounds of {args.steps // 2} timed steps"
    )
    print(
        f"| bare loop | lm train (engine=single) | lm train / bare |\n|---|---|---|\n| {b:.0f} tok/s | {o:.0f} tok/s "
        f"| {o / b:.3f} |"
    )
    print(f"target >= 0.90: {'met' if o / b >= 0.9 else 'NOT met'}")


# -- ZeRO memory per rank ---------------------------------------------------------------------------


def _inner_torch_optimizer(opt):
    """DeepSpeed wraps the client AdamW (ZeRO-1/2/3); stage 0 uses it as it is."""
    import torch

    while not type(opt).__module__.startswith("torch.optim"):
        opt = opt.optimizer
    assert isinstance(opt, torch.optim.Optimizer)
    return opt


def zero_worker(stage):
    """Runs under torchrun: train 2 steps with ZeRO-`stage`, print this rank's byte counts as JSON."""
    import torch

    from lm.cli.train import train

    torch.set_num_threads(1)
    engine = "deepspeed" if stage == 0 else f"zero{stage}"
    with tempfile.TemporaryDirectory() as d:
        d = os.environ.get("LM_BENCH_RUN_DIR", d)
        result = train(compose(run_overrides(d, 2, [f"engine={engine}", "train.micro_batch_size=2"])))
    eng = result.engine
    inner = _inner_torch_optimizer(eng.optimizer)
    state = sum(
        t.numel() * t.element_size()
        for s in inner.state.values()
        for t in s.values()
        if torch.is_tensor(t) and t.dim() > 0
    )
    model_ids = {id(p) for p in eng.module.parameters()}
    master = sum(
        p.numel() * p.element_size() for g in inner.param_groups for p in g["params"] if id(p) not in model_ids
    )
    report = {
        "stage": stage,
        "rank": eng.rank,
        "world": eng.world_size,
        "psi": sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in eng.module.parameters()),
        "param_bytes": eng.local_numel() * 4,
        "adam_bytes": state,
        "master_bytes": master,
    }
    # one file per rank: torchrun interleaves the ranks' stdout
    Path(os.environ["LM_BENCH_OUT"], f"stage{stage}_rank{eng.rank}.json").write_text(json.dumps(report))
    from lm.engine import dist

    dist.shutdown()


def zero_memory(args):
    rows, out_dir = [], tempfile.mkdtemp()
    for stage in (0, 1, 2, 3):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            str(29600 + stage),
            __file__,
            "zero-worker",
            "--stage",
            str(stage),
        ]
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "WANDB_MODE": "disabled",
            "PYTHONPATH": str(REPO),
            "LM_BENCH_OUT": out_dir,
        }
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if out.returncode:
            sys.exit(f"stage {stage} failed:\n{out.stderr[-3000:]}")
        rows += [json.loads(p.read_text()) for p in sorted(Path(out_dir).glob(f"stage{stage}_rank*.json"))]
    print(
        "| ZeRO stage | rank | params/rank measured | formula | Adam m+v/rank measured | formula "
        "| DeepSpeed fp32 master/rank |\n|---|---|---|---|---|---|---|"
    )
    for r in sorted(rows, key=lambda r: (r["stage"], r["rank"])):
        psi, n = r["psi"], r["world"]
        params_formula = 4 * psi / (n if r["stage"] == 3 else 1)
        adam_formula = 8 * psi / (n if r["stage"] >= 1 else 1)
        print(
            f"| {r['stage']} | {r['rank']} | {r['param_bytes'] / 2**20:.2f} MiB | {params_formula / 2**20:.2f} MiB "
            f"| {r['adam_bytes'] / 2**20:.2f} MiB | {adam_formula / 2**20:.2f} MiB "
            f"| {r['master_bytes'] / 2**20:.2f} MiB |"
        )
    print(f"\nPsi = {rows[0]['psi']:,} parameters (fp32), N = {rows[0]['world']} ranks")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("overhead", help="lm train's loop vs a bare loop, same model/data/optimizer")
    o.add_argument("--steps", type=int, default=40, help="steps per run; the second half is timed")
    o.add_argument("--rounds", type=int, default=3)
    o.add_argument("--threads", type=int, default=2)
    sub.add_parser("zero-memory", help="bytes per rank for ZeRO-0/1/2/3 on 2 CPU ranks vs the formula")
    w = sub.add_parser("zero-worker", help=argparse.SUPPRESS)
    w.add_argument("--stage", type=int, required=True)
    args = parser.parse_args(argv)
    os.environ.setdefault("WANDB_MODE", "disabled")
    if args.cmd == "overhead":
        overhead(args)
    elif args.cmd == "zero-memory":
        zero_memory(args)
    else:
        zero_worker(args.stage)


if __name__ == "__main__":
    main()
