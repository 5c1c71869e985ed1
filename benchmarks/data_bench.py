"""Data pipeline benchmark: lm prepare against raw `tokenizers`, the loader against training, memory.

    python benchmarks/data_bench.py                                   # 64 MB and 16 MB corpora
    python benchmarks/data_bench.py --mb 128 --small-mb 32 --skip-gpt2 --json /tmp/data_bench.json

Everything is measured side by side in one run, as ratios against a peer, on real text: the
files under $LM_DATA_MIRROR/text (tiny Shakespeare, WikiText-2, a TinyStories slice) are
concatenated, repeated, to --mb MB in a temporary directory (never in the repository).

1. Tokenization: a byte-level BPE tokenizer (--vocab-size) is trained once; then `lm prepare`
   (the real command, a subprocess: reading, splitting, hashing, workers, shard writing,
   meta.json) runs with 1 and 2 workers, and the raw `tokenizers` baseline encodes the same
   documents, already in memory, with `encode_batch_fast` (1 thread, then its own 2-thread
   pool). Throughput counts text tokens (EOS excluded) over the wall time of the whole command.
   Targets: 2 workers >= 1.7x 1 worker; lm prepare >= 80% of raw at equal parallelism.
2. Loader: PackedLoader tokens/s (clm, mlm, span) against the training consumption (tokens/s
   of forward + backward + AdamW, fp32) of the tiny model and a GPT-2-small-width model on
   the same batches. Target: loader >= 100x the model.
3. Memory: peak RSS of lm prepare's whole process tree (main + workers, sampled every 50 ms)
   for a corpus of --small-mb and of --mb MB. Target: it does not grow with the corpus.

`cat /proc/loadavg` is recorded with every measurement: on a shared machine, a load above the
core count distorts the 2-worker scaling, and a rerun on a quiet machine is the fair number.
The CPU seconds of every process are recorded too (getrusage of the command and its waited-for
workers; per process from /proc), giving tokens per CPU-second and the wall time the same work
would take alone on the cores: less sensitive to the neighbours, though not immune (their cache
and memory traffic still slows each CPU-second by 10-20% from run to run on a busy machine).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BLANK_LINE = r"\n[ \t\r]*\n"  # lm prepare --doc-split blank_line: paragraph-sized documents


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages (`cat /proc/loadavg`)."""
    path = Path("/proc/loadavg")
    return " ".join(path.read_text().split()[:3]) if path.exists() else "n/a"


def say(msg: str) -> None:
    print(msg, flush=True)


# -- corpus and tokenizer --------------------------------------------------------------------------


COMPRESSED = (".zst", ".gz", ".bz2", ".xz", ".zip")


def text_files(mirror: Path) -> list[Path]:
    return sorted(p for p in (mirror / "text").rglob("*") if p.is_file() and p.suffix not in COMPRESSED)


def build_corpus(mirror: Path, mb: float, dest: Path) -> Path:
    """The real plain-text files of the mirror, concatenated and repeated to at least `mb` MB (compressed shards,
    text/gutenberg's .jsonl.zst, are not text: read as such they made the corpus undecodable)."""
    files = text_files(mirror)
    if not files:
        raise SystemExit(f"no text files under {mirror / 'text'}; set LM_DATA_MIRROR to the data mirror")
    pieces = [p.read_bytes().strip() for p in files]
    target, size = int(mb * 2**20), 0
    with open(dest, "wb") as f:
        while size < target:
            for piece in pieces:
                f.write(piece + b"\n\n")
                size += len(piece) + 2
                if size >= target:
                    break
    return dest


def documents(corpus: Path):
    """The documents lm prepare --doc-split blank_line makes of the corpus (same regex, same filter)."""
    return [d for d in re.split(BLANK_LINE, corpus.read_text("utf-8")) if d.strip()]


def train_tokenizer(corpus: Path, vocab_size: int, dest: Path) -> float:
    from lm.data.tokenizer import iter_limited, train

    t0 = time.perf_counter()
    tok = train("bpe", iter_limited(documents(corpus), 20_000_000), vocab_size=vocab_size, n_sentinels=100)
    tok.save(dest)
    return time.perf_counter() - t0


# -- raw tokenizers baseline (runs in its own process, so the thread pool size can be chosen) -----


def raw_encode(tokenizer: str, corpus: str, batch_chars: int) -> dict:
    """encode_batch_fast over the documents in batches of ~batch_chars (lm prepare's task size)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer)
    tok.encode_special_tokens = True  # as lm.data.tokenizer.Tokenizer does
    docs = documents(Path(corpus))
    batches, batch, chars = [], [], 0
    for d in docs:
        batch.append(d)
        chars += len(d)
        if chars >= batch_chars:
            batches.append(batch)
            batch, chars = [], 0
    batches.append(batch)
    tok.encode_batch_fast(batches[0][:100], add_special_tokens=False)  # warm the thread pool
    t0, c0 = time.perf_counter(), time.process_time()
    tokens = sum(len(e.ids) for b in batches for e in tok.encode_batch_fast(b, add_special_tokens=False))
    return {
        "tokens": tokens,
        "documents": len(docs),
        "seconds": time.perf_counter() - t0,
        "cpu_s": time.process_time() - c0,
    }


def run_raw(args, tokenizer: Path, corpus: Path, threads: int) -> dict:
    env = {
        **os.environ,
        "RAYON_NUM_THREADS": str(threads),
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "true" if threads > 1 else "false",
    }
    cmd = [sys.executable, __file__, "--_raw", str(tokenizer), str(corpus), str(args.task_bytes)]
    load = loadavg()
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return {
        **r,
        "tokens_per_s": r["tokens"] / r["seconds"],
        "tokens_per_cpu_s": r["tokens"] / r["cpu_s"],
        "threads": threads,
        "loadavg": load,
    }


# -- lm prepare, with the RSS of its process tree ---------------------------------------------------


class TreeSampler:
    """Peak RSS of a process tree and each process' CPU seconds, sampled every `every` seconds.

    Finding the descendants scans all of /proc (milliseconds), so it is done only every
    `rescan` samples; reading the known processes costs microseconds. Sampling must cost next to
    nothing: it shares the cores with the command it measures.
    """

    def __init__(self, pid: int, every: float = 0.05, rescan: int = 10):
        import psutil

        self.root, self.every, self.rescan = psutil.Process(pid), every, rescan
        self.procs, self.peak, self.cpu = [self.root], 0, {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import psutil

        n = 0
        while not self.stop.is_set():
            if n % self.rescan == 0:
                try:
                    self.procs = [self.root, *self.root.children(recursive=True)]
                except psutil.NoSuchProcess:
                    return
            total = 0
            for p in self.procs:
                try:
                    with p.oneshot():
                        total += p.memory_info().rss
                        t = p.cpu_times()
                        self.cpu[p.pid] = t.user + t.system
                except psutil.NoSuchProcess:
                    pass
            self.peak, n = max(self.peak, total), n + 1
            self.stop.wait(self.every)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def run_prepare(args, tokenizer: Path, corpus: Path, workers: int, out: Path) -> dict:
    """One `lm prepare` command, timed end to end, its tree RSS sampled; tokens from its meta.json."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [
        sys.executable,
        "-m",
        "lm.cli.prepare",
        str(corpus),
        "--out",
        str(out),
        "--tokenizer",
        str(tokenizer),
        "--doc-split",
        "blank_line",
        "--workers",
        str(workers),
        "--task-bytes",
        str(args.task_bytes),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    load = loadavg()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(out.with_suffix(".log"), "w") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=log)
        sampler = TreeSampler(proc.pid)
        rc = proc.wait()
        wall = time.perf_counter() - t0
        sampler.close()
    if rc:
        raise SystemExit(
            f"lm prepare failed ({rc}); see {out.with_suffix('.log')}:\n" + out.with_suffix(".log").read_text()[-2000:]
        )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the command and its (waited-for) workers
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    meta = json.loads((out / "meta.json").read_text())
    tokens = sum(s["tokens"] for s in meta["splits"].values())
    docs = sum(s["documents"] for s in meta["splits"].values())
    text_tokens = tokens - docs  # one EOS per document; the raw baseline has none
    return {
        "workers": workers,
        "wall_s": wall,
        "pipeline_s": meta["seconds"],
        "tokens": tokens,
        "text_tokens": text_tokens,
        "documents": docs,
        "tokens_per_s": text_tokens / wall,
        "cpu_s": cpu_s,
        "tokens_per_cpu_s": text_tokens / cpu_s,
        "busiest_process_cpu_s": max(sampler.cpu.values()),
        "main_cpu_s": sampler.cpu.get(proc.pid, 0.0),
        "other_cpu_s": sorted((v for k, v in sampler.cpu.items() if k != proc.pid), reverse=True),
        "quiet_wall_s": quiet_wall(cpu_s, max(sampler.cpu.values()), workers),
        "peak_rss_mb": sampler.peak / 2**20,
        "loadavg": load,
        "command": "lm prepare " + " ".join(cmd[3:]),
    }


def quiet_wall(cpu_s: float, busiest_s: float, workers: int) -> float:
    """The wall time the same CPU work would take alone on min(workers, cores) cores: the total
    spread over the cores, but never less than its busiest process (the serial part)."""
    cores = min(workers, os.cpu_count() or 1)
    return max(cpu_s / cores, busiest_s)


# -- loader against training -------------------------------------------------------------------------


def loader_tokens_per_s(data: Path, objective: str, seq_len: int, batch: int, seconds: float) -> float:
    from lm.data.packed import PackedLoader

    it = iter(PackedLoader(data, "train", seq_len, batch, objective, seed=0))
    next(it)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            next(it)
        n += 20
    return n * batch * seq_len / (time.perf_counter() - t0)


def train_tokens_per_s(
    preset: str, overrides: list, data: Path, seq_len: int, batch: int, warmup: int, steps: int
) -> dict:
    """Forward + backward + AdamW steps of a model on real batches of the loader (fp32)."""
    import torch

    from lm.data.packed import PackedLoader
    from lm.model import build_model
    from lm.model.config import model_preset

    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)  # the model at its fastest: the loader's hardest customer
    model = build_model(model_preset(preset, overrides))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    it = iter(PackedLoader(data, "train", seq_len, batch, "clm", seed=0))
    batches = [next(it) for _ in range(warmup + steps)]

    def step(b):
        model(**b).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for b in batches[:warmup]:
        step(b)
    t0 = time.perf_counter()
    for b in batches[warmup:]:
        step(b)
    seconds = time.perf_counter() - t0
    params = sum(p.numel() for p in model.parameters())
    return {
        "preset": preset,
        "overrides": overrides,
        "params_m": params / 1e6,
        "tokens_per_s": steps * batch * seq_len / seconds,
        "torch_threads": torch.get_num_threads(),
    }


# -- the run -----------------------------------------------------------------------------------------


def best(runs: list, key: str = "tokens_per_s") -> dict:
    """The fastest round: on a shared machine the other rounds measure the neighbours' load."""
    return max(runs, key=lambda r: r[key])


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def tokenization(args, work: Path, tokenizer: Path, corpus: Path) -> dict:
    rounds = {"w1": [], "w2": [], "raw1": [], "raw2": []}
    for r in range(args.rounds):
        order = ["w1", "raw1", "w2", "raw2"] if r % 2 == 0 else ["raw2", "w2", "raw1", "w1"]
        for name in order:
            if name.startswith("w"):
                res = run_prepare(args, tokenizer, corpus, int(name[1]), work / f"out_{name}")
            else:
                res = run_raw(args, tokenizer, corpus, int(name[3]))
            rounds[name].append(res)
            say(
                f"  round {r} {name:4s} {res['tokens_per_s']:>10,.0f} tokens/s  "
                f"{res['tokens_per_cpu_s']:>10,.0f} tokens per CPU-s   loadavg {res['loadavg']}"
            )
    b = {k: best(v) for k, v in rounds.items()}
    if b["w1"]["text_tokens"] != b["raw1"]["tokens"]:
        say(f"  note: lm prepare made {b['w1']['text_tokens']:,} text tokens, raw {b['raw1']['tokens']:,}")
    c = {k: best(v, "tokens_per_cpu_s") for k, v in rounds.items()}  # the least disturbed CPU accounting
    return {
        "rounds": rounds,
        "best": b,
        "scaling": b["w2"]["tokens_per_s"] / b["w1"]["tokens_per_s"],
        "vs_raw_1": b["w1"]["tokens_per_s"] / b["raw1"]["tokens_per_s"],
        "vs_raw_2": b["w2"]["tokens_per_s"] / b["raw2"]["tokens_per_s"],
        "raw_scaling": b["raw2"]["tokens_per_s"] / b["raw1"]["tokens_per_s"],
        "cpu": {
            "best": c,
            "scaling": c["w1"]["quiet_wall_s"] / c["w2"]["quiet_wall_s"],
            "vs_raw_1": c["w1"]["tokens_per_cpu_s"] / c["raw1"]["tokens_per_cpu_s"],
            "vs_raw_2": c["w2"]["tokens_per_cpu_s"] / c["raw1"]["tokens_per_cpu_s"],
        },
    }


def loader_vs_models(args, data: Path, vocab: int) -> dict:
    T, B = args.seq_len, args.batch
    load = loadavg()
    loader = {obj: loader_tokens_per_s(data, obj, T, B, args.loader_seconds) for obj in ("clm", "mlm", "span")}
    models = [train_tokens_per_s("tiny", [f"model.vocab_size={vocab}", f"model.max_seq_len={T}"], data, T, B, 2, 6)]
    if not args.skip_gpt2:
        models.append(
            train_tokens_per_s(
                "gpt2",
                [f"model.vocab_size={vocab}", f"model.max_seq_len={T}", f"model.n_layers={args.gpt2_layers}"],
                data,
                T,
                B,
                1,
                2,
            )
        )
    return {
        "loader": loader,
        "models": models,
        "loadavg": load,
        "seq_len": T,
        "batch": B,
        "ratio": {m["preset"]: {o: v / m["tokens_per_s"] for o, v in loader.items()} for m in models},
    }


def report(res: dict) -> None:
    tk, mem, ld = res["tokenization"], res["memory"], res["loader"]
    b = tk["best"]
    say("\n== Data pipeline benchmark ==")
    say(f"machine: {res['machine']}; date: {res['date']}")
    say(
        f"corpus: {res['corpus_mb']:.1f} MB of real text ({res['sources']}), {b['w1']['documents']:,} documents "
        f"(--doc-split blank_line), {b['w1']['text_tokens']:,} text tokens, BPE vocab {res['vocab_size']}"
    )
    say(f"\n-- tokenization (best of {res['rounds']} rounds, wall time of the whole command; tokens/s) --")
    for key, threads in (("raw1", "1 thread "), ("raw2", "2 threads")):
        say(
            f"raw tokenizers encode_batch_fast, {threads}   {b[key]['tokens_per_s']:>12,.0f}   load {b[key]['loadavg']}"
        )
    say(f"lm prepare --workers 1                        {b['w1']['tokens_per_s']:>12,.0f}   load {b['w1']['loadavg']}")
    say(f"lm prepare --workers 2                        {b['w2']['tokens_per_s']:>12,.0f}   load {b['w2']['loadavg']}")
    say(
        f"2 workers / 1 worker         = {tk['scaling']:.2f}x   target >= 1.70x  {verdict(tk['scaling'] >= 1.7)}"
        f"   (raw tokenizers 2 threads / 1 thread = {tk['raw_scaling']:.2f}x)"
    )
    say(f"lm prepare / raw, 1 worker   = {tk['vs_raw_1']:.0%}     target >= 80%    {verdict(tk['vs_raw_1'] >= 0.8)}")
    say(f"lm prepare / raw, 2 workers  = {tk['vs_raw_2']:.0%}     target >= 80%    {verdict(tk['vs_raw_2'] >= 0.8)}")
    c = tk["cpu"]
    say("CPU-time accounting (robust to neighbours' load; what a quiet machine would show):")
    for name in ("w1", "w2"):
        r = c["best"][name]
        say(
            f"  lm prepare --workers {name[1]}: {r['cpu_s']:.1f} CPU-s in all, "
            f"busiest process {r['busiest_process_cpu_s']:.1f} CPU-s, {r['tokens_per_cpu_s']:,.0f} tokens per CPU-s; "
            f"alone on {min(int(name[1]), os.cpu_count())} "
            f"cores: {r['quiet_wall_s']:.1f}s"
        )
    w2 = c["best"]["w2"]
    say(
        f"  --workers 2 by process: main (reading, hashing, pickling, shard writer, progress bar) "
        f"{w2['main_cpu_s']:.1f} CPU-s; workers " + ", ".join(f"{x:.1f}" for x in w2["other_cpu_s"][:2]) + " CPU-s"
    )
    say(f"  raw tokenizers, 1 thread: {c['best']['raw1']['tokens_per_cpu_s']:,.0f} tokens per CPU-s")
    say(
        f"  2 workers / 1 worker (quiet-machine estimate)     = {c['scaling']:.2f}x   target >= 1.70x  "
        f"{verdict(c['scaling'] >= 1.7)}"
    )
    for key, workers in (("vs_raw_1", "1 worker "), ("vs_raw_2", "2 workers")):
        say(f"  lm prepare / raw per CPU-s, {workers} = {c[key]:.0%}    target >= 80%   {verdict(c[key] >= 0.8)}")
    say(f"command: {b['w2']['command']}")
    say(f"\n-- loader vs training (tokens/s, seq_len {ld['seq_len']}, micro-batch {ld['batch']}) --")
    for obj, v in ld["loader"].items():
        say(f"PackedLoader {obj:4s}                         {v:>12,.0f}")
    for m in ld["models"]:
        say(
            f"train step {m['preset']:5s} ({m['params_m']:.1f}M params, {m['torch_threads']} threads) "
            f"{m['tokens_per_s']:>10,.0f}"
        )
    for name, ratios in ld["ratio"].items():
        worst = min(ratios.values())
        say(
            f"loader / {name} training = "
            + ", ".join(f"{o} {r:,.0f}x" for o, r in ratios.items())
            + f"   target >= 100x  {verdict(worst >= 100)}"
        )
    say(f"load {ld['loadavg']}")
    say("\n-- lm prepare peak RSS of the process tree (main + workers), --workers 2 --")
    for row in mem["runs"]:
        say(f"corpus {row['corpus_mb']:6.1f} MB: peak {row['peak_rss_mb']:7.1f} MB   load {row['loadavg']}")
    say(
        f"growth {mem['growth']:.2f}x for {mem['size_ratio']:.1f}x the corpus   target: bounded (< 1.2x)  "
        f"{verdict(mem['growth'] < 1.2)}"
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--mb", type=float, default=64, help="corpus size in MB for throughput and the larger memory run")
    p.add_argument("--small-mb", type=float, default=16, help="corpus size in MB of the smaller memory run")
    p.add_argument("--vocab-size", type=int, default=8192, help="BPE vocabulary trained on the corpus")
    p.add_argument("--task-bytes", type=int, default=1 << 20, help="lm prepare --task-bytes, raw batch size in chars")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the tokenization runs (best kept)")
    p.add_argument("--seq-len", type=int, default=256, help="sequence length of the loader and the models")
    p.add_argument("--batch", type=int, default=8, help="micro-batch size of the loader and the models")
    p.add_argument("--loader-seconds", type=float, default=2.0, help="how long each loader objective is timed")
    p.add_argument("--gpt2-layers", type=int, default=12, help="layers of the GPT-2-small-width model")
    p.add_argument("--skip-gpt2", action="store_true", help="time only the tiny model")
    p.add_argument("--work", help="working directory (default: a temporary one, removed at the end)")
    p.add_argument("--json", help="also write all results to this JSON file")
    p.add_argument("--_raw", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._raw:
        print(json.dumps(raw_encode(args._raw[0], args._raw[1], int(args._raw[2]))))
        return
    mirror = Path(os.environ.get("LM_DATA_MIRROR", Path(__file__).resolve().parents[2] / "shared" / "data"))
    work = Path(args.work or tempfile.mkdtemp(prefix="lm_data_bench_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        say(f"building corpora from {mirror / 'text'} in {work}")
        large = build_corpus(mirror, args.mb, work / "corpus_large.txt")
        small = build_corpus(mirror, args.small_mb, work / "corpus_small.txt")
        tokenizer = work / "tokenizer.json"
        say(f"trained the BPE tokenizer in {train_tokenizer(large, args.vocab_size, tokenizer):.1f}s")
        say("tokenization rounds:")
        tk = tokenization(args, work, tokenizer, large)
        say("memory runs:")
        mem_runs = []
        for corpus in (small, large):
            r = run_prepare(args, tokenizer, corpus, 2, work / f"mem_{corpus.stem}")
            r["corpus_mb"] = corpus.stat().st_size / 2**20
            mem_runs.append(r)
            say(f"  {r['corpus_mb']:.1f} MB: peak RSS {r['peak_rss_mb']:.1f} MB")
        say("loader and models:")
        from lm.data.tokenizer import Tokenizer

        ld = loader_vs_models(args, work / "out_w1", Tokenizer.load(tokenizer).vocab_size)
        res = {
            "machine": f"{platform.node()}, {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
            f"Python {platform.python_version()}",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": " ".join(sys.argv),
            "corpus_mb": large.stat().st_size / 2**20,
            "vocab_size": args.vocab_size,
            "rounds": args.rounds,
            "sources": ", ".join(sorted({p.parent.name for p in text_files(mirror)})),
            "tokenization": tk,
            "loader": ld,
            "memory": {
                "runs": mem_runs,
                "size_ratio": mem_runs[1]["corpus_mb"] / mem_runs[0]["corpus_mb"],
                "growth": mem_runs[1]["peak_rss_mb"] / mem_runs[0]["peak_rss_mb"],
            },
        }
        report(res)
        if args.json:
            Path(args.json).write_text(json.dumps(res, indent=1))
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
