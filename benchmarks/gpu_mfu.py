"""MFU of a training step on one GPU: bf16 autocast, SDPA (torch picks cuDNN or flash), torch.compile, fused AdamW.

MFU = tokens/s x training FLOPs per token (lm.model.flops: 6N + 12*L*H*Dh*T, PaLM appendix) /
the device's dense bf16 peak (H100 SXM 989 TFLOP/s, H200 989, A100 312; no sparsity). HFU, as llm-foundry
reports it beside MFU, counts the FLOPs the hardware runs: MFU's plus the forward recomputed under
model.activation_checkpointing (+2N + 4*L*H*Dh*T per token, i.e. x4/3); without it HFU = MFU. Neither counts
a float8 matmul as cheaper: under --float8 the same FLOPs are divided by the same bf16 peak.
Each preset is built once, on the device; the largest power-of-two micro-batch that fits is found
by eager steps of doubling size until out of memory, then the compiled step is timed at that batch
(halved if the compiled step does not fit), at twice it if the compiled step fits there, and at any
--also-batch (nanoGPT's bench.py uses 12).

    python benchmarks/gpu_mfu.py --preset gpt2 --seq 1024            # GPT-2 124M
    python benchmarks/gpu_mfu.py --preset llama --seq 2048           # TinyLlama-shape 1.1B
    python benchmarks/gpu_mfu.py --attention-sweep                   # flash vs math SDPA, T = 512 ... 16384
    python benchmarks/gpu_mfu.py --all --also-batch 12               # all three, one JSON line each
    python benchmarks/gpu_mfu.py --device cpu --preset tiny --seq 64 --batch 2 --steps 2 --no-compile  # a smoke run
    python benchmarks/gpu_mfu.py --preset gpt2 --batch 64 model.kernels.cross_entropy=liger       # a fused kernel
    python benchmarks/gpu_mfu.py --preset llama --seq 2048 --batch 8 --float8                     # torchao float8
    python benchmarks/gpu_mfu.py --preset experiment=glue_transfer_gpu --seq 128 --batch 256  # an experiment's model

--inductor KEY=VALUE sets a torch._inductor.config field (e.g. coordinate_descent_tuning=True); each row
records it. The model starts from seed 0 and each row gives its last step's loss, so two runs of one preset
can be checked to compute the same thing.

What is timed is what lm train runs: lm's loop and single engine (train.precision=bf16, clipping, lm's fused
AdamW, the loop's batch prefetch and host-to-device copy) through the run harness (lm/core/session.py), on one
fixed batch; the engine's model is compiled here with --compile-mode and dynamic=False. Only the search for the
largest batch that fits uses a hand-written eager step (it times nothing).
"""

import argparse
import contextlib
import json
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

from lm.model import build_model
from lm.model.config import model_preset
from lm.model.flops import flops_per_token

PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12}


def device_peak(device: str):
    """Dense bf16 peak FLOP/s of this CUDA device; None on a CPU (no MFU is reported there)."""
    if device == "cpu":
        return None
    name = torch.cuda.get_device_name()
    for key, peak in PEAK_BF16.items():
        if key in name:
            return peak
    raise SystemExit(f"unknown peak for {name}; add it to PEAK_BF16")


def sync(device: str):
    if device != "cpu":
        torch.cuda.synchronize()


def train_step_fn(model, opt, device: str):
    def step(x, y):
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=y).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def model_config(preset: str, overrides):
    """conf/model/<preset>.yaml, or with preset `experiment=<name>` the model that `lm train experiment=<name>` builds
    (e.g. glue_transfer_gpu's encoder: its masked-LM head is timed on every position, as its step computes it)."""
    if not preset.startswith("experiment="):
        return model_preset(preset, overrides)
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from lm.config import conf_dir, register_train_configs

    register_train_configs()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        cfg = compose(config_name="train", overrides=[preset, *overrides])
    return OmegaConf.to_object(cfg.model)


def hardware_flops_per_token(cfg, fpt: float) -> float:
    """llm-foundry's HFU numerator: the model FLOPs plus a recomputed forward (a third of them) under activation
    checkpointing."""
    return fpt * 4 / 3 if cfg.activation_checkpointing else fpt


def build(preset: str, seq: int, overrides, device: str):
    """The preset's model, built and initialised directly on the device (no host copy of 1B weights), from seed 0:
    two runs of one preset start from the same weights and see the same tokens, so their losses compare."""
    torch.manual_seed(0)
    cfg = model_config(preset, [f"model.max_seq_len={max(seq, 1)}", "model.dropout=0.0", *overrides])
    with torch.device(device):
        model = build_model(cfg)
    return cfg, model


def timed(
    model,
    cfg,
    seq: int,
    batch: int,
    steps: int,
    device: str,
    compile_model: bool = False,
    compile_mode: str = "default",
    warmup: int = 3,
    around=contextlib.nullcontext,
    float8=False,
):
    """(tokens/s of `steps` steps after `warmup` (compilation happens there), the last step's loss, what `around()`
    gave): lm's loop and single engine through the run harness on one fixed batch; `around()` is entered and left
    around the timed steps (a profiler). The run ends after them (the loop's last step would write a checkpoint).
    float8: train.float8 (torchao's Float8Linear swapped in by the engine's wrap, as lm train does)."""
    from lm.core.config import OptimConfig, TrainConfig
    from lm.core.fixed_task import FixedTask, Records, TimedStepsDone
    from lm.core.hooks import Hooks
    from lm.core.session import Session
    from lm.engine import Dist, SingleEngine

    x = torch.randint(0, cfg.vocab_size, (batch, seq + 1), generator=torch.Generator().manual_seed(0))
    task = FixedTask([{"input_ids": x[:, :-1].contiguous(), "labels": x[:, 1:].contiguous()}])
    total, clock, inside = warmup + steps, {}, contextlib.ExitStack()

    def step_begin(step: int) -> None:
        if step in (warmup, total):
            sync(device)
            clock[step] = time.perf_counter()
        if step == warmup:
            clock["around"] = inside.enter_context(around())
        if step == total:
            inside.close()
            raise TimedStepsDone

    train = TrainConfig(
        micro_batch_size=batch,
        seq_len=seq,
        max_steps=total + 1,
        precision="bf16",
        device=device,
        log_interval=total,
        eval_interval=0,
        ckpt_interval=0,
        progress=False,
        float8=float8,
    )
    engine = SingleEngine(train, Dist(rank=0, world_size=1, local_rank=0, device=torch.device(device)))
    records = Records()
    with (
        tempfile.TemporaryDirectory(prefix="gpu-mfu-") as run_dir,
        inside,
        Session(train, engine, task, run_dir, "", hooks=Hooks(step_begin=[step_begin])) as session,
    ):
        session.build(lambda: model, 0, OptimConfig(lr=1e-4))
        if compile_model:  # dynamic=False: each batch gets its own static graph, as a training run of one shape would
            engine.model = torch.compile(engine.model, dynamic=False, mode=compile_mode)
        session.tracker = records
        try:
            session.train(lambda step: 1e-4)
        except TimedStepsDone:
            pass
    return steps * batch * seq / (clock[total] - clock[warmup]), records.records[-1]["loss"], clock.get("around")


def free(device: str, model=None):
    if model is not None:
        model.zero_grad(set_to_none=True)
    if device != "cpu":
        torch.cuda.empty_cache()


def largest_batch(model, cfg, seq: int, device: str, start: int = 4, limit: int = 512) -> int:
    """The largest power of two (from `start`) whose eager step, optimizer state included, fits (a hand-written
    step: this only probes memory)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device != "cpu")
    step, batch, best = train_step_fn(model, opt, device), start, None
    while batch <= limit:
        try:
            x = torch.randint(0, cfg.vocab_size, (batch, seq + 1), device=device)
            step(x[:, :-1], x[:, 1:])
            sync(device)
            best = batch
            batch *= 2
        except torch.OutOfMemoryError:
            break
        finally:
            free(device, model)
    del opt  # its state: the timed runs build lm's own optimizer
    free(device)
    if best is None:
        raise SystemExit(f"even micro-batch {start} does not fit")
    return best


def profile_table(
    model, cfg, seq: int, batch: int, device: str, rows: int, compile_model: bool, compile_mode: str
) -> str:
    """torch.profiler's table of 3 steps after 3 warm-up steps of lm's loop, by self time on the device: where a
    step goes."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device != "cpu" else [])
    prof = timed(
        model, cfg, seq, batch, 3, device, compile_model, compile_mode, around=lambda: profile(activities=activities)
    )[2]
    if device == "cpu":
        return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)
    try:
        return prof.key_averages().table(sort_by="self_device_time_total", row_limit=rows)
    except (KeyError, AttributeError):  # an older torch names it after CUDA
        return prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=rows)


def plan_batches(batches, model, cfg, seq: int, device: str, compile_model: bool):
    """(batch, optional) pairs: 0 becomes the largest eager batch and, compiled on a GPU, twice it as an
    optional try (a compiled step holds fewer activations: the eager search can stop one doubling short)."""
    plan = []
    for batch in batches:
        if batch:
            plan.append((batch, False))
            continue
        batch = largest_batch(model, cfg, seq, device)
        plan.append((batch, False))
        if compile_model and device != "cpu":
            plan.append((2 * batch, True))
    return plan


def measure(
    preset: str,
    seq: int,
    batches,
    steps: int,
    compile_model: bool,
    overrides,
    device: str = "cuda",
    profile: int = 0,
    compile_mode: str = "default",
    tags=None,
    float8=False,
):
    """One JSON-able row per micro-batch in `batches` (0 = the largest that fits: plan_batches), from one
    built model; `profile` > 0 prints that many rows of the profiler's table of the last timed batch's step;
    `tags` are added to every row."""
    cfg, model = build(preset, seq, overrides, device)
    fpt, peak, rows = flops_per_token(cfg, seq), device_peak(device), []
    for batch, optional in plan_batches(batches, model, cfg, seq, device, compile_model):
        tokens_per_s = None
        while True:
            try:
                if device != "cpu":
                    torch.cuda.reset_peak_memory_stats()
                tokens_per_s, loss, _ = timed(
                    model, cfg, seq, batch, steps, device, compile_model, compile_mode, float8=float8
                )
                break
            except torch.OutOfMemoryError:
                free(device, model)
                if optional:
                    break
                if batch == 1:
                    raise
                batch //= 2
        if optional and tokens_per_s is None:
            print(f"{preset}: micro-batch {batch} does not fit compiled either", file=sys.stderr, flush=True)
            continue
        rows.append(
            {
                "preset": preset,
                "seq": seq,
                "batch": batch,
                "compiled": compile_mode if compile_model else False,
                "tokens_per_s": round(tokens_per_s),
                "loss": round(loss, 4),
                "flops_per_token": fpt,
                "mfu": round(tokens_per_s * fpt / peak, 4) if peak else None,
                "hfu": round(tokens_per_s * hardware_flops_per_token(cfg, fpt) / peak, 4) if peak else None,
                "float8": float8,
                "overrides": list(overrides),
                "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device != "cpu" else None,
                "device": torch.cuda.get_device_name() if device != "cpu" else "cpu",
                "torch": torch.__version__,
                **(tags or {}),
            }
        )
        last = batch
        free(device, model)
    if profile:
        table = profile_table(model, cfg, seq, last, device, profile, compile_model, compile_mode)
        print(f"profile: {preset}, batch {last}, T={seq}", table, sep="\n", flush=True)
    del model
    free(device)
    return rows


def apply_inductor_config(settings) -> dict:
    """KEY=VALUE strings -> torch._inductor.config fields (VALUE: True, False, an int, or a string)."""
    import torch._inductor.config as inductor

    applied = {}
    for item in settings:
        key, sep, raw = item.partition("=")
        if not sep or not hasattr(inductor, key):
            raise SystemExit(f"--inductor {item!r}: expected KEY=VALUE with KEY a torch._inductor.config field")
        value = {"True": True, "False": False}.get(raw, int(raw) if raw.lstrip("-").isdigit() else raw)
        setattr(inductor, key, value)
        applied[f"inductor.{key}"] = value
    return applied


def attention_sweep(heads=12, head_dim=64, batch=1) -> list:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    for T in (512, 1024, 2048, 4096, 8192, 16384):
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("math", SDPBackend.MATH)):
            q, k, v = (
                torch.randn(batch, heads, T, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                for _ in range(3)
            )
            torch.cuda.reset_peak_memory_stats()
            try:
                with sdpa_kernel(backend):
                    for i in range(4):
                        if i == 1:
                            torch.cuda.synchronize()
                            start = time.perf_counter()
                        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
                    torch.cuda.synchronize()
                ms = (time.perf_counter() - start) / 3 * 1e3
                rows.append(
                    {
                        "T": T,
                        "backend": name,
                        "ms_fwd_bwd": round(ms, 2),
                        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
                    }
                )
            except torch.OutOfMemoryError:
                rows.append({"T": T, "backend": name, "ms_fwd_bwd": None, "peak_mem_gib": "OOM"})
            del q, k, v
            torch.cuda.empty_cache()
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="gpt2")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=0, help="0 = the largest power of two that fits")
    p.add_argument(
        "--also-batch",
        type=int,
        action="append",
        default=[],
        help="also time this micro-batch (GPT-2 in --all; repeatable), e.g. 12 to match nanoGPT's bench.py",
    )
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run (no MFU: no peak is known)")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument(
        "--compile-mode",
        default="default",
        help="torch.compile mode: default, max-autotune-no-cudagraphs (Triton autotunes matmuls and fusions; "
        "minutes of compiling), reduce-overhead, max-autotune",
    )
    p.add_argument(
        "--profile",
        type=int,
        nargs="?",
        const=25,
        default=0,
        metavar="ROWS",
        help="print torch.profiler's table (25 rows, or ROWS) of the last batch's step; before a model override "
        "give ROWS (--profile 25 model.x=...), or the override is read as ROWS",
    )
    p.add_argument(
        "--inductor",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set torch._inductor.config.KEY (repeatable), e.g. coordinate_descent_tuning=True",
    )
    p.add_argument(
        "--float8",
        action="store_const",
        const="torchao",
        default=False,
        help="train.float8=torchao: the engine swaps the Linears for torchao's Float8Linear before compiling",
    )
    p.add_argument("--attention-sweep", action="store_true")
    p.add_argument("--all", action="store_true", help="GPT-2 124M at T=1024, the 1.1B Llama at T=2048, then the sweep")
    p.add_argument("overrides", nargs="*", help="model overrides, e.g. model.loss_chunk_size=4096 model/ffn=swiglu")
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    compile_model = not args.no_compile
    tags = apply_inductor_config(args.inductor)
    if args.all:
        for preset, seq, also in (("gpt2", 1024, args.also_batch), ("llama", 2048, [])):
            for row in measure(
                preset,
                seq,
                [0, *also],
                args.steps,
                compile_model,
                args.overrides,
                args.device,
                compile_mode=args.compile_mode,
                tags=tags,
            ):
                print(json.dumps(row), flush=True)
        args.attention_sweep = True
    if args.attention_sweep:
        for row in attention_sweep():
            print(json.dumps(row), flush=True)
        return
    for row in measure(
        args.preset,
        args.seq,
        [args.batch, *args.also_batch],
        args.steps,
        compile_model,
        args.overrides,
        args.device,
        args.profile,
        args.compile_mode,
        tags,
        args.float8,
    ):
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
