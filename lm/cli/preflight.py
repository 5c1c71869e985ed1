"""`lm preflight`: check a cluster before a long run, started by the same launcher as the run.

    torchrun --nproc_per_node 8 -m lm.cli.preflight --ckpt-dir /shared/runs --model gpt2
    LM_ENTRY=lm.cli.preflight NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 launch/torchrun_multinode.sh \\
        --ckpt-dir /shared/runs
    LM_ENTRY=lm.cli.preflight sbatch --nodes 4 --gpus-per-node 8 launch/slurm.sbatch --min-busbw 100

Every rank runs the checks; rank 0 prints one line per check (PASS / WARN / FAIL, or SKIP
when it does not apply, e.g. the all-reduce of one rank) and a verdict, and every rank exits 1 if any
check failed:

  rendezvous   all ranks joined the process group (and how long it took)
  world size   the group has the ranks the launcher promised (--expect-world-size), evenly per node
  devices      each local rank has its own GPU, the same model on every node; or CPU + gloo
  all-reduce   bus bandwidth of a --size-mb all-reduce (nccl-tests' busbw = 2(n-1)/n * bytes / time),
               and the sum is right
  disk         free space for checkpoints under --ckpt-dir on every node (--need-gb, or estimated
               from --model), writable, and one directory seen by every node
"""

import argparse
import json
import math
import os
import shutil
import socket
import sys
import textwrap
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from lm.cli.errors import entry
from lm.core.files import nearest_existing

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"
# Checkpoint bytes per parameter: fp32 weights (4) + Adam's two fp32 moments (8).
BYTES_PER_PARAM = 12


@dataclass
class Check:
    name: str
    status: str
    detail: str


@dataclass
class RankInfo:
    rank: int
    host: str
    local_rank: int
    local_world_size: int
    gpus: int
    gpu_name: str
    free_bytes: int
    writable: str  # "" when writable, else the error


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="lm preflight",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill(
            "Check a cluster before a long run: world size, devices, rendezvous, all-reduce bandwidth, free disk for "
            "checkpoints. Start it with the launcher of the run (torchrun, launch/*.sh, srun); alone it checks this "
            "machine.",
            110,
        ),
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument(
        "--ckpt-dir", help="where the run will write checkpoints (default: the run_dir override, else runs/)"
    )
    p.add_argument(
        "--need-gb",
        type=float,
        help="free space needed there on every node, in GB (default: estimated from --model, else 10)",
    )
    p.add_argument("--model", help="a model preset (conf/model/, e.g. gpt2, llama) to estimate checkpoint size from")
    p.add_argument("--keep-last", type=int, default=3, help="checkpoints kept (train.keep_last; default 3)")
    p.add_argument("--expect-world-size", type=int, help="fail unless exactly this many ranks joined")
    p.add_argument(
        "--require-gpu",
        action="store_true",
        help="fail on a rank without its own GPU (default on when any GPU is visible)",
    )
    p.add_argument("--size-mb", type=float, help="all-reduce message size in MiB (default 256 on GPU, 32 on CPU)")
    p.add_argument("--iters", type=int, default=5, help="timed all-reduces after 2 warm-up ones (default 5)")
    p.add_argument(
        "--min-busbw", type=float, help="fail below this all-reduce bus bandwidth, GB/s (default: report only)"
    )
    p.add_argument("--timeout", type=float, default=300, help="seconds to wait for every rank to join (default 300)")
    p.add_argument(
        "--json", help="also write the results to this file (rank 0): new, or a report of an earlier lm preflight"
    )
    p.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)  # the deepspeed launcher's
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="run_dir=PATH",
        help="accepted so launch/slurm.sbatch (which appends run_dir=...) can start it unchanged",
    )
    args = p.parse_args(argv)
    run_dirs = [o.split("=", 1)[1] for o in args.overrides if o.lstrip("+").startswith("run_dir=")]
    unknown = [o for o in args.overrides if not o.lstrip("+").startswith("run_dir=")]
    if unknown:
        p.error(f"unknown argument(s) {unknown}: lm preflight takes only run_dir=PATH besides its --options")
    for flag, value, ok, want in (
        ("--iters", args.iters, args.iters >= 1, "a positive integer"),
        ("--keep-last", args.keep_last, args.keep_last >= 1, "a positive integer"),
        (
            "--expect-world-size",
            args.expect_world_size,
            args.expect_world_size is None or args.expect_world_size >= 1,
            "a positive integer",
        ),
        ("--size-mb", args.size_mb, args.size_mb is None or 0 < args.size_mb < math.inf, "a finite number > 0"),
        ("--timeout", args.timeout, 0 < args.timeout < math.inf, "a finite number of seconds > 0"),
        ("--need-gb", args.need_gb, args.need_gb is None or 0 <= args.need_gb < math.inf, "a finite number >= 0"),
        (
            "--min-busbw",
            args.min_busbw,
            args.min_busbw is None or 0 <= args.min_busbw < math.inf,
            "a finite number >= 0",
        ),
    ):
        if not ok:  # checked before any rendezvous: a bad value would fail every rank (--iters 0: a division by 0)
            p.error(f"argument {flag}: {value:g} is not {want}")
    args.ckpt_dir = args.ckpt_dir or (run_dirs[-1] if run_dirs else "runs")
    why = _json_refused(Path(args.json)) if args.json else None
    if why:  # before any rendezvous, not after every check has run
        p.error(f"argument --json: {args.json} {why}")
    return args


def _json_refused(path: Path) -> str | None:
    """Why --json must not be written: a directory, a path below a file, or a file lm preflight did not write
    (a report of its own, a JSON object with its verdict and checks, is replaced); None when it may be."""
    above = nearest_existing(path.absolute().parent)
    if not above.is_dir():
        return f"lies below {above}, which is a file; name a file elsewhere"
    if path.is_dir():
        return "is a directory; name a file"
    if not path.exists() and not path.is_symlink():
        return None
    try:
        report = json.loads(path.read_text()) if path.is_file() and not path.is_symlink() else None
    except (OSError, ValueError):
        report = None
    if isinstance(report, dict) and {"verdict", "checks"} <= report.keys():
        return None
    return "exists and is not a report lm preflight wrote; name another file, or move it"


@entry("lm preflight")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        need_bytes, need_why = _needed_bytes(args)
    except Exception as e:  # noqa: BLE001 - a bad --model preset: say so before any rendezvous
        print(f"lm preflight: --model {args.model}: {e}", file=sys.stderr)
        return 2
    checks: list[Check] = []
    joined = _rendezvous(args, checks)
    if not joined:
        _report(args, checks, world=int(os.environ.get("WORLD_SIZE", 1)), nodes=0)
        return 1
    try:
        infos = _gather(_local_info(args))
        world = len(infos)
        checks.append(_check_world(args, infos))
        checks.append(_check_devices(args, infos))
        checks.append(_check_all_reduce(args, infos))
        checks.append(_check_disk(args, infos, need_bytes, need_why))
        failed = _broadcast(_report(args, checks, world, len({i.host for i in infos})) if _rank() == 0 else None)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 1 if failed else 0


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _uses_gpu() -> bool:
    return torch.cuda.is_available()


def _rendezvous(args, checks: list[Check]) -> bool:
    """Join the launcher's process group; one process without a launcher needs none."""
    from lm.engine.dist import EngineError, launched_world_size

    try:
        world = launched_world_size()
    except EngineError as e:
        checks.append(Check("rendezvous", FAIL, str(e)))
        return False
    if world == 1:
        checks.append(Check("rendezvous", PASS, "one process (no launcher): nothing to join"))
        return True
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if _uses_gpu() and local_rank < torch.cuda.device_count():
        torch.cuda.set_device(local_rank)
    backend = "cpu:gloo,cuda:nccl" if _uses_gpu() else "gloo"
    where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    t0 = time.perf_counter()
    try:
        dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
        dist.barrier()
    except Exception as e:  # noqa: BLE001 - the check's verdict is the report
        checks.append(
            Check(
                "rendezvous",
                FAIL,
                f"rank {os.environ.get('RANK')} could not join {world} ranks at "
                f"{where} within {args.timeout:.0f} s: {e}. Check MASTER_ADDR/MASTER_PORT, that every "
                f"node started, and the firewall (NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME)",
            )
        )
        return False
    checks.append(
        Check(
            "rendezvous",
            PASS,
            f"{world} ranks joined at {where} in {time.perf_counter() - t0:.2f} s (backend {backend})",
        )
    )
    return True


def _local_info(args) -> RankInfo:
    gpus = torch.cuda.device_count() if _uses_gpu() else 0
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    ckpt = Path(args.ckpt_dir)
    writable = _try_write(ckpt)
    free = shutil.disk_usage(ckpt).free if not writable else _free_bytes_of_nearest(ckpt)
    return RankInfo(
        rank=_rank(),
        host=socket.gethostname(),
        local_rank=local_rank,
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
        gpus=gpus,
        gpu_name=torch.cuda.get_device_name(min(local_rank, gpus - 1)) if gpus else "",
        free_bytes=free,
        writable=writable,
    )


def _try_write(directory: Path) -> str:
    """'' when a file can be written and renamed into `directory` (what a checkpoint does), else why not."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".lm preflight-{uuid.uuid4().hex}.tmp"
        tmp.write_bytes(b"x" * 4096)
        final = tmp.with_suffix(".done")
        os.replace(tmp, final)
        final.unlink()
        return ""
    except OSError as e:
        return f"{type(e).__name__}: {e}"


def _free_bytes_of_nearest(path: Path) -> int:
    return shutil.disk_usage(nearest_existing(path)).free


def _gather(info: RankInfo) -> list[RankInfo]:
    if not dist.is_initialized():
        return [info]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, info)
    return out


def _broadcast(obj):
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _per_host(infos: list[RankInfo]) -> dict[str, list[RankInfo]]:
    hosts: dict[str, list[RankInfo]] = {}
    for i in infos:
        hosts.setdefault(i.host, []).append(i)
    return hosts


def _check_world(args, infos: list[RankInfo]) -> Check:
    world, launched = len(infos), int(os.environ.get("WORLD_SIZE", 1))
    hosts = _per_host(infos)
    counts = sorted({len(v) for v in hosts.values()})
    layout = f"{world} rank(s) on {len(hosts)} node(s): " + ", ".join(
        f"{h} x{len(v)}" for h, v in sorted(hosts.items())
    )
    if world != launched:
        return Check("world size", FAIL, f"{layout}, but the launcher set WORLD_SIZE={launched}")
    if args.expect_world_size is not None and world != args.expect_world_size:
        return Check("world size", FAIL, f"{layout}, expected {args.expect_world_size} (--expect-world-size)")
    if len(counts) > 1:
        return Check("world size", WARN, f"{layout}: uneven ranks per node (the slowest node sets the pace)")
    return Check("world size", PASS, layout)


def _check_devices(args, infos: list[RankInfo]) -> Check:
    require = args.require_gpu or any(i.gpus for i in infos)
    if not require:
        return Check("devices", PASS, "no GPU on any node: every rank trains on CPU with gloo")
    short = [f"{i.host} local rank {i.local_rank} (sees {i.gpus} GPU(s))" for i in infos if i.local_rank >= i.gpus]
    if short:
        return Check(
            "devices",
            FAIL,
            f"no GPU of its own for {', '.join(short[:4])}{' ...' if len(short) > 4 else ''}; "
            f"start at most as many processes per node as it has GPUs (NPROC_PER_NODE)",
        )
    names = sorted({i.gpu_name for i in infos})
    spare = sorted({i.gpus - i.local_world_size for i in infos if i.gpus > i.local_world_size})
    detail = f"{len(infos)} rank(s), one GPU each: {' / '.join(names)}"
    if len(names) > 1:
        return Check("devices", WARN, f"{detail}: different GPU models (the slowest sets the pace)")
    if spare:
        return Check("devices", WARN, f"{detail}; {spare[0]} GPU(s) per node left idle (raise NPROC_PER_NODE?)")
    return Check("devices", PASS, detail)


def _check_all_reduce(args, infos: list[RankInfo]) -> Check:
    n = len(infos)
    if n == 1:
        return Check("all-reduce", SKIP, "one rank: nothing to reduce across")
    gpu = _uses_gpu() and all(i.local_rank < i.gpus for i in infos)
    device = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    size_mb = args.size_mb or (256 if gpu else 32)
    numel = max(1, int(size_mb * 2**20) // 4)
    x = torch.empty(numel, dtype=torch.float32, device=device)
    seconds = _time_all_reduce(x, args.iters)
    x.fill_(_rank() + 1.0)
    dist.all_reduce(x)
    correct = bool(torch.all(x == n * (n + 1) / 2).item())  # the sum of 1..n on every element
    algbw = numel * 4 / seconds / 1e9
    busbw = algbw * 2 * (n - 1) / n
    detail = (
        f"{size_mb:g} MiB fp32 on {device.type}: bus bandwidth {busbw:.2f} GB/s (algbw {algbw:.2f} GB/s, "
        f"{seconds * 1e3:.2f} ms per all-reduce, {args.iters} timed)"
    )
    if not correct:
        return Check("all-reduce", FAIL, f"{detail}; WRONG RESULT: the sum differs from {n * (n + 1) // 2}")
    if args.min_busbw is not None and busbw < args.min_busbw:
        return Check(
            "all-reduce",
            FAIL,
            f"{detail} < {args.min_busbw:g} GB/s (--min-busbw): check the fabric "
            f"(NCCL_DEBUG=INFO shows the transport; see launch/common.sh)",
        )
    return Check("all-reduce", PASS, detail)


def _time_all_reduce(x: torch.Tensor, iters: int) -> float:
    """Seconds per all-reduce, the slowest rank's (a collective is only as fast as its last rank)."""
    for _ in range(2):
        dist.all_reduce(x)
    _sync(x.device)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    _sync(x.device)
    t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
    if x.device.type == "cuda":
        t = t.to(x.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _check_disk(args, infos: list[RankInfo], need: int, why: str) -> Check:
    ckpt = Path(args.ckpt_dir)
    broken = [f"{i.host}: {i.writable}" for i in infos if i.writable]
    if broken:
        return Check("disk", FAIL, f"{ckpt} is not writable on {'; '.join(sorted(set(broken))[:4])}")
    shared, missing = _shared_directory(ckpt, infos)
    low = min(infos, key=lambda i: i.free_bytes)
    detail = f"{ckpt}: {low.free_bytes / 1e9:.1f} GB free (least: {low.host}), {need / 1e9:.1f} GB needed ({why})"
    if low.free_bytes < need:
        return Check("disk", FAIL, f"{detail}: free space or pass another --ckpt-dir / run_dir")
    if not shared:
        return Check(
            "disk",
            FAIL,
            f"{detail}; but it is not one shared directory: {', '.join(missing[:4])} do(es) not "
            f"see rank 0's files, and every rank writes its checkpoint shards there",
        )
    return Check("disk", PASS, f"{detail}, writable, the same directory on all {len(_per_host(infos))} node(s)")


def _shared_directory(ckpt: Path, infos: list[RankInfo]):
    """Rank 0 writes a marker; every rank looks for it (a node-local path fails this on a multi-node job)."""
    marker = ckpt / f".lm preflight-shared-{_broadcast(uuid.uuid4().hex)}"
    if _rank() == 0:
        marker.write_text("lm preflight")
    if dist.is_initialized():
        dist.barrier()
    seen = _gather_flags(marker.exists())
    if dist.is_initialized():
        dist.barrier()
    if _rank() == 0:
        marker.unlink()
    missing = sorted({infos[r].host for r, ok in enumerate(seen) if not ok})
    return not missing, missing


def _gather_flags(flag: bool) -> list[bool]:
    if not dist.is_initialized():
        return [flag]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, flag)
    return out


def _needed_bytes(args):
    if args.need_gb is not None:
        return int(args.need_gb * 1e9), "--need-gb"
    if not args.model:
        return int(10e9), "default; set --need-gb or --model"
    from lm.model.config import model_preset
    from lm.model.flops import num_params

    params = num_params(model_preset(args.model))
    # keep_last checkpoints plus the one being written before the oldest is deleted
    copies = args.keep_last + 1
    return params * BYTES_PER_PARAM * copies, (
        f"model={args.model}: {params / 1e6:.1f}M params x {BYTES_PER_PARAM} B "
        f"(fp32 weights + Adam) x {copies} checkpoints"
    )


def _report(args, checks: list[Check], world: int, nodes: int) -> bool:
    """Print the table and the verdict (rank 0); True when something failed."""
    failed = [c for c in checks if c.status == FAIL]
    warned = [c for c in checks if c.status == WARN]
    lines = [f"lm preflight: {world} rank(s) on {nodes or '?'} node(s)"]
    lines += [f"  {c.status:<5} {c.name:<11} {c.detail}" for c in checks]
    if failed:
        verdict = f"NOT READY: {', '.join(c.name for c in failed)} failed"
    else:
        verdict = f"READY ({sum(c.status == PASS for c in checks)} passed" + (
            f", {len(warned)} warning(s): {', '.join(c.name for c in warned)})" if warned else ")"
        )
    lines.append(f"verdict: {verdict}")
    print("\n".join(lines), flush=True)
    if args.json:
        _write_json(
            Path(args.json),
            {
                "verdict": "fail" if failed else "ready",
                "world_size": world,
                "nodes": nodes,
                "checks": [asdict(c) for c in checks],
            },
        )
    return bool(failed)


def _write_json(path: Path, data: dict) -> None:
    from lm.core.files import atomic_write_text

    atomic_write_text(path, json.dumps(data, indent=2))


if __name__ == "__main__":
    sys.exit(main())
