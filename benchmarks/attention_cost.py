"""The cost of attention, measured (issue #18): forward+backward time and peak memory of ONE layer against
sequence length T, for each scoring function and an LSTM layer of the same width.

Variants (one layer, width --dim, --heads heads, batch --batch, fp32 on CPU and CUDA):
    scaled_dot       lm's SelfAttention with model/attn=scaled_dot (SDPA's fused kernels)
    multiplicative   q^T W k, explicit (B, H, T, T) probabilities
    additive         v^T tanh(W1 q + W2 k): a (B, H, T, T, Dh) tanh tensor, so memory grows fastest
    linformer        keys/values projected to k = --linformer-k rows (k = T when T is smaller)
    lstm             torch.nn.LSTM, hidden = --dim (lm.zoo.rnn.recurrent_layers, as model=lstm builds it)
The attention layers are non-causal (encoder) self-attention built by lm.model.scores.make_score and
lm.model.attention.SelfAttention, so what is timed is the code the models run.

Each (variant, T) point runs in its own subprocess: a fresh process per point, so one point's caches or an
out-of-memory kill cannot touch another. Peak memory:
    CPU   the rise of the process's resident-set high-water mark (resource.getrusage ru_maxrss) over a
          forward+backward, measured from the level reached after building the layer and its inputs; it
          counts what the allocator took from the OS (page granularity), not tensor bytes
    CUDA  torch.cuda.max_memory_allocated() minus the memory allocated before the step (allocator peak)
Time: the median of --repeats forward+backward passes after one warm-up pass (CUDA: synchronized).
A curve stops when its next point's memory, extrapolated from its last two points on the log-log line,
would exceed --mem-cap-gb, or its time would exceed --max-point-s, or a point fails (out of memory).

Outputs in --out: attention_cost.json (every point), attention_cost.md (machine, date, command, a table of
time and memory per T, the fitted log-log slope of each curve: ~2 is quadratic, ~1 linear),
attention_cost.png (time and memory against T, log-log).

    python benchmarks/attention_cost.py --out bench/attn_cost                       # T = 128 ... 8192
    python benchmarks/attention_cost.py --tmin 16 --tmax 64 --dim 32 --heads 2 --repeats 1 --out /tmp/x   # smoke
"""

import argparse
import datetime
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = ["scaled_dot", "multiplicative", "additive", "linformer", "lstm"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {VARIANTS}")
    p.add_argument("--tmin", type=int, default=128)
    p.add_argument("--tmax", type=int, default=8192)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--linformer-k", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cuda" if _cuda() else "cpu", choices=["cpu", "cuda"])
    p.add_argument(
        "--mem-cap-gb",
        type=float,
        default=None,
        help="stop a curve before a point would need more (default: CPU 8 GB, CUDA 80%% of the GPU)",
    )
    p.add_argument("--max-point-s", type=float, default=120.0, help="stop a curve before a pass would take longer")
    p.add_argument(
        "--fit-from", type=int, default=512, help="fit slopes on points with T >= this (all if fewer than 2)"
    )
    p.add_argument("--out", type=Path, default=Path("bench/attention_cost"))
    p.add_argument("--point", nargs=2, metavar=("VARIANT", "T"), help=argparse.SUPPRESS)  # the subprocess' job
    return p.parse_args(argv)


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


# -- one point, in its own process -------------------------------------------------------------------


def build_layer(variant: str, T: int, args):
    """The layer and its forward function: x (B, T, D) -> (B, T, D)."""
    from lm.model import components
    from lm.model.attention import SelfAttention
    from lm.model.config import model_preset
    from lm.model.scores import make_score

    if variant == "lstm":
        from lm.zoo.rnn import recurrent_layers

        cfg = model_preset(
            "lstm", [f"model.dim={args.dim}", "model.n_layers=1", "model.dropout=0.0", f"model.max_seq_len={T}"]
        )
        lstm = recurrent_layers(cfg)
        return lstm, lambda x: lstm(x)[0]
    k = min(args.linformer_k, T)
    extra = [f"model.attn.k={k}"] if variant == "linformer" else []
    cfg = model_preset(
        "tiny",
        [
            "model.arch=encoder",
            f"model.dim={args.dim}",
            f"model.n_heads={args.heads}",
            f"model.max_seq_len={T}",
            "model.dropout=0.0",
            f"model/attn={variant}",
            *extra,
        ],
    )
    c = components(cfg)
    score = make_score(
        c.attn,
        False,
        n_heads=cfg.n_heads,
        n_kv_heads=cfg.kv_heads,
        head_dim=cfg.d_head,
        max_seq_len=T,
        scale=None,
        dropout=0.0,
    )
    layer = SelfAttention(cfg.dim, cfg.n_heads, cfg.kv_heads, cfg.d_head, True, 0.0, None, None, score)
    no_pos = lambda q, k: (q, k)  # noqa: E731 - position schemes are not what is measured
    return layer, lambda x: layer(x, False, None, no_pos)


def measure_point(variant: str, T: int, args) -> dict:
    import torch

    torch.manual_seed(0)
    device = torch.device(args.device)
    layer, forward = build_layer(variant, T, args)
    layer.to(device)
    x = torch.randn(args.batch, T, args.dim, device=device, requires_grad=True)

    def step():
        forward(x).sum().backward()
        layer.zero_grad(set_to_none=True)
        x.grad = None

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    if device.type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        sync()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        step()
        peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    times = []
    for _ in range(args.repeats):
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    return {
        "variant": variant,
        "T": T,
        "seconds": statistics.median(times),
        "peak_bytes": int(peak),
        "linformer_k": min(args.linformer_k, T) if variant == "linformer" else None,
    }


# -- the sweep ------------------------------------------------------------------------------------


def run_point(variant: str, T: int, argv, timeout: float) -> dict:
    cmd = [sys.executable, __file__, *argv, "--point", variant, str(T)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"variant": variant, "T": T, "error": f"took longer than {timeout:.0f} s"}
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return {"variant": variant, "T": T, "error": tail[-200:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def next_over(points: list, T_next: int, key: str, cap: float) -> bool:
    """Would the curve's next point exceed `cap`, extrapolating its last two points on the log-log line?"""
    if not points:
        return False
    last = points[-1]
    slope = fit_slope(points[-2:], key) if len(points) >= 2 else 2.0
    # clamped to [1, 3]: two noisy small points can give any slope; no variant here grows faster than T^3
    slope = min(max(slope, 1.0), 3.0) if slope == slope else 2.0
    return last[key] * (T_next / last["T"]) ** slope > cap


def fit_slope(points: list, key: str) -> float:
    """Least-squares slope of log(value) against log(T)."""
    pts = [(math.log(p["T"]), math.log(p[key])) for p in points if p.get(key, 0) > 0]
    if len(pts) < 2:
        return float("nan")
    mx, my = statistics.fmean(x for x, _ in pts), statistics.fmean(y for _, y in pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx else float("nan")


def sweep(args, argv) -> dict:
    lengths = [T for T in (2**i for i in range(4, 20)) if args.tmin <= T <= args.tmax]
    cap = args.mem_cap_gb * 2**30 if args.mem_cap_gb else _default_cap(args.device)
    curves = {}
    for variant in [v.strip() for v in args.variants.split(",") if v.strip()]:
        if variant not in VARIANTS:
            sys.exit(f"attention_cost.py: error: --variants: {variant!r} is not one of {VARIANTS}")
        points, stopped = [], None
        for T in lengths:
            if next_over(points, T, "peak_bytes", cap):
                stopped = f"T={T} would need more than {cap / 2**30:.1f} GB (--mem-cap-gb)"
                break
            if next_over(points, T, "seconds", args.max_point_s):
                stopped = f"T={T} would take more than {args.max_point_s:.0f} s a pass (--max-point-s)"
                break
            point = run_point(variant, T, argv, timeout=max(60.0, 10 * args.max_point_s))
            if "error" in point:
                stopped = f"T={T} failed: {point['error']}"
                break
            points.append(point)
            print(
                f"{variant:>14} T={T:>5}: {point['seconds'] * 1e3:9.2f} ms, {point['peak_bytes'] / 2**20:9.1f} MiB",
                flush=True,
            )
        fit = [p for p in points if p["T"] >= args.fit_from]
        fit = fit if len(fit) >= 2 else points
        curves[variant] = {
            "points": points,
            "stopped": stopped,
            "slope_time": fit_slope(fit, "seconds"),
            "slope_memory": fit_slope(fit, "peak_bytes"),
        }
    return curves


def _default_cap(device: str) -> float:
    if device == "cuda":
        import torch

        return 0.8 * torch.cuda.get_device_properties(0).total_memory
    return 8 * 2**30


def machine(device: str) -> str:
    import torch

    if device == "cuda":
        return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    return (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"{torch.get_num_threads()} torch threads, torch {torch.__version__}"
    )


def markdown(curves: dict, args, command: str) -> str:
    lengths = sorted({p["T"] for c in curves.values() for p in c["points"]})
    names = list(curves)
    lines = [
        f"# The cost of attention: one layer, forward+backward ({args.device})",
        "",
        f"Machine: {machine(args.device)}. Date: {datetime.date.today().isoformat()}. Command: `{command}`.",
        f"Width {args.dim}, {args.heads} heads, batch {args.batch}, fp32; Linformer k = {args.linformer_k} "
        f"(k = T below it); LSTM hidden = width. Peak memory: "
        + (
            "torch.cuda.max_memory_allocated over the step."
            if args.device == "cuda"
            else "rise of the process's ru_maxrss high-water mark over the step (a fresh process per point)."
        ),
        "",
        "Time per forward+backward (ms):",
        "",
        "| T | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    table = {(v, p["T"]): p for v, c in curves.items() for p in c["points"]}
    for T in lengths:
        lines.append(
            f"| {T} | "
            + " | ".join(f"{table[v, T]['seconds'] * 1e3:.2f}" if (v, T) in table else "–" for v in names)
            + " |"
        )
    lines += ["", "Peak memory (MiB):", "", "| T | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for T in lengths:
        lines.append(
            f"| {T} | "
            + " | ".join(f"{table[v, T]['peak_bytes'] / 2**20:.1f}" if (v, T) in table else "–" for v in names)
            + " |"
        )
    lines += [
        "",
        f"Fitted log-log slopes (points with T >= {args.fit_from}; ~2 quadratic, ~1 linear):",
        "",
        "| variant | time slope | memory slope | stopped |",
        "|---|---|---|---|",
    ]
    for v, c in curves.items():
        lines.append(f"| {v} | {c['slope_time']:.2f} | {c['slope_memory']:.2f} | {c['stopped'] or '–'} |")
    return "\n".join(lines) + "\n"


def plot(curves: dict, path: Path, device: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, (v, c) in enumerate(curves.items()):
        pts = [p for p in c["points"] if p["peak_bytes"] > 0]
        if c["points"]:
            axes[0].loglog(
                [p["T"] for p in c["points"]],
                [p["seconds"] * 1e3 for p in c["points"]],
                "o-",
                color=f"C{i}",
                label=f"{v} (slope {c['slope_time']:.2f})",
            )
        if pts:
            axes[1].loglog(
                [p["T"] for p in pts],
                [p["peak_bytes"] / 2**20 for p in pts],
                "o-",
                color=f"C{i}",
                label=f"{v} (slope {c['slope_memory']:.2f})",
            )
    for ax, label in zip(axes, ["forward+backward (ms)", "peak memory (MiB)"]):
        ax.set_xlabel("sequence length T")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"One layer's cost against T ({device})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.point:
        import torch

        torch.set_grad_enabled(True)
        print(json.dumps(measure_point(args.point[0], int(args.point[1]), args)))
        return 0
    curves = sweep(args, list(argv))
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/attention_cost.py " + " ".join(argv)
    (args.out / "attention_cost.json").write_text(
        json.dumps(
            {
                "device": args.device,
                "machine": machine(args.device),
                "date": datetime.date.today().isoformat(),
                "command": command,
                "curves": curves,
            },
            indent=1,
        )
    )
    (args.out / "attention_cost.md").write_text(markdown(curves, args, command))
    plot(curves, args.out / "attention_cost.png", args.device)
    print(f"wrote {args.out}/attention_cost.{{md,json,png}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
