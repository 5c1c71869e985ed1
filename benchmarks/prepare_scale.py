"""How lm prepare and the packed loader scale with the corpus, on real text: the mirror's Gutenberg shards.

    python benchmarks/prepare_scale.py                       # everything, ~15 minutes on 2 cores
    python benchmarks/prepare_scale.py --steps memory,loader --json /tmp/scale.json

1. Tokenizer training: peak RSS of a byte-level BPE (8192) trained on the first N characters of the
   train split (data.tokenizer_train_chars), for several N: it grows with the sample, which that setting caps.
2. Memory against corpus size: peak RSS of `lm prepare` (the command, 2 workers, the tokenizer of step 1)
   over its whole process tree and of its main process alone, on the first k train shards and on all of them
   listed --repeat times (a source listed n times is read n times), so the slope is measured on real text.
3. Workers: the same command with 2 and 1 workers, alternated --rounds times, on --speed-shards shards:
   wall time, CPU seconds, and the main process' CPU seconds (the serial part: reading, cutting, writing).
4. Loader: a PackedLoader over a directory of --loader-tokens train tokens (sparse shard files, made
   in --work, no disk used): construction time, and the anonymous memory after 200 batches (file-backed
   pages are the page cache, shared by every rank of a node).

`cat /proc/loadavg` is recorded with every measurement: other jobs on the cores slow the wall times, so
compare the ratios (2 workers against 1) and the CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

TRAIN_TOKENIZER = """
import sys
from lm.data.documents import iter_texts
from lm.data.prepare import _sources, data_config, read_options, with_corpus_defaults
from lm.data.tasks import Planner
from lm.data.tokenizer import iter_limited, train
cfg = data_config({"source": sys.argv[1], "dir": sys.argv[3]})
files, corpus = _sources(cfg)
opts = read_options(with_corpus_defaults(cfg, corpus))
texts = iter_limited(iter_texts(Planner(files, opts, None), opts, "train"), int(sys.argv[2]))
train("bpe", texts, 8192, 100).save(sys.argv[3])
import resource
print("maxrss_mb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)  # exact: the sampler may miss a peak
"""


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


class Sampler:
    """Peak RSS of a process tree and of its root, and each process' CPU seconds, every 50 ms."""

    def __init__(self, pid: int):
        import psutil

        self.root, self.tree, self.main, self.cpu = psutil.Process(pid), 0, 0, {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import psutil

        n, procs = 0, [self.root]
        while not self.stop.is_set():
            if n % 10 == 0:
                try:
                    procs = [self.root, *self.root.children(recursive=True)]
                except psutil.NoSuchProcess:
                    return
            total = 0
            for p in procs:
                try:
                    with p.oneshot():
                        rss, t = p.memory_info().rss, p.cpu_times()
                except psutil.NoSuchProcess:
                    continue
                total += rss
                self.cpu[p.pid] = t.user + t.system
                if p.pid == self.root.pid:
                    self.main = max(self.main, rss)
            self.tree, n = max(self.tree, total), n + 1
            self.stop.wait(0.05)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def measure(cmd: list[str], log: Path) -> dict:
    """Run `cmd`; its wall time, CPU seconds (it and its waited-for children), peak RSS of its tree and root."""
    load, before = loadavg(), resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(log, "w") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=out, env=env)
        sampler = Sampler(proc.pid)
        rc = proc.wait()
        wall = time.perf_counter() - t0
        sampler.close()
    if rc:
        raise SystemExit(f"{' '.join(cmd)} failed ({rc}):\n{log.read_text()[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "wall_s": round(wall, 1),
        "cpu_s": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 1),
        "main_cpu_s": round(sampler.cpu.get(proc.pid, 0.0), 1),
        "peak_tree_mb": round(sampler.tree / 2**20, 1),
        "peak_main_mb": round(sampler.main / 2**20, 1),
        "loadavg": f"{load} -> {loadavg()}",
    }


def prepare(sources: list[str], tokenizer: Path, workers: int, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "lm.cli.prepare", *sources, "--tokenizer", str(tokenizer)]
    res = measure([*cmd, "--workers", str(workers), "--out", str(out), "--no-progress"], out.with_suffix(".log"))
    meta = json.loads((out / "meta.json").read_text())
    shutil.rmtree(out)
    return {"workers": workers, "tokens": sum(s["tokens"] for s in meta["splits"].values()), **res}


def sparse_prepared(like: Path, dest: Path, tokens: int, shard_tokens: int = 100_000_000) -> Path:
    """A prepared directory of `tokens` train tokens in sparse (all-zero) shards: meta.json and val from `like`."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    meta = json.loads((like / "meta.json").read_text())
    for name in [meta["tokenizer"]["file"], *(s["file"] for s in meta["splits"]["val"]["shards"])]:
        shutil.copy(like / name, dest)
    shards = []
    for i in range(-(-tokens // shard_tokens)):
        n = min(shard_tokens, tokens - i * shard_tokens)
        with open(dest / f"train_{i:05d}.bin", "wb") as f:
            f.truncate(n * 2)  # uint16
        shards.append({"file": f"train_{i:05d}.bin", "tokens": n, "sha256": "0" * 64})
    meta["splits"]["train"] = {"tokens": tokens, "documents": 1, "shards": shards}
    (dest / "meta.json").write_text(json.dumps(meta))
    return dest


def loader(data: Path, batches: int) -> dict:
    """Build a PackedLoader (rank 3 of 8) and draw `batches` batches: how long building takes, and the memory it holds
    after (the pages read are file-backed: RssFile). Not the batches' speed: the first reads of a fresh sparse file
    are slow on some disks (35 s for 200 batches on one VM, 0.1 s once read), which real shards are not."""
    from lm.data.packed import PackedLoader

    t0 = time.perf_counter()
    packed = PackedLoader(data, "train", 1024, 16, "clm", rank=3, world_size=8)
    built = time.perf_counter() - t0
    it = iter(packed)
    for _ in range(batches):
        next(it)
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return {
        "tokens": packed.stream.n,
        "shards": len(packed.stream.files),
        "shards_read": len(packed.stream._maps),
        "construct_s": round(built, 4),
        "rss_anon": status.get("RssAnon", "").strip(),
        "rss_file": status.get("RssFile", "").strip(),
    }


def tokenizers(glob: str, samples: list[float], work: Path) -> list[dict]:
    """Step 1; leaves work/tokenizer.json, the one of 50M characters (the gutenberg_bpe preset's sample)."""
    out = []
    for n in samples:
        path, log = work / f"tokenizer_{int(n)}.json", work / "tokenizer.log"
        r = measure([sys.executable, "-c", TRAIN_TOKENIZER, glob, str(int(n)), str(path)], log)
        out.append({"chars": int(n), "maxrss_mb": round(float(log.read_text().split("maxrss_mb")[-1]), 1), **r})
        print("tokenizer", out[-1], flush=True)
        if n == 50e6 or not (work / "tokenizer.json").exists():
            shutil.copy(path, work / "tokenizer.json")
    return out


def workers(shards: list[str], tokenizer: Path, rounds: int, work: Path) -> dict:
    """Step 3: 2 workers and 1, alternated; the ratios of their wall times, round by round."""
    runs = []
    for _ in range(rounds):
        for w in (2, 1):
            runs.append(prepare(shards, tokenizer, w, work / "out"))
            print("workers", runs[-1], flush=True)
    walls = {w: [r["wall_s"] for r in runs if r["workers"] == w] for w in (1, 2)}
    return {"runs": runs, "two_against_one": [round(a / b, 2) for a, b in zip(walls[1], walls[2])]}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--mirror", default=os.environ.get("LM_DATA_MIRROR"), help="the data mirror (text/gutenberg/)")
    p.add_argument("--work", help="scratch directory (default: a temporary one, removed)")
    p.add_argument("--steps", default="tokenizer,memory,workers,loader", help="which of the four to run")
    p.add_argument("--sample-chars", default="25e6,50e6,100e6,200e6", help="tokenizer samples, characters")
    p.add_argument("--shards", default="2,10", help="corpus sizes in train shards (of 10)")
    p.add_argument("--repeat", type=int, default=4, help="and all 10 shards listed this many times")
    p.add_argument("--speed-shards", type=int, default=5)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--loader-tokens", type=float, default=10e9)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    if not args.mirror:
        raise SystemExit("set LM_DATA_MIRROR (or --mirror) to the data mirror holding text/gutenberg/")
    shards = sorted((Path(args.mirror) / "text" / "gutenberg").glob("train-*.jsonl.zst"))
    if not shards:
        raise SystemExit(f"no text/gutenberg/train-*.jsonl.zst under {args.mirror}")
    work = Path(args.work or tempfile.mkdtemp(prefix="prepare_scale_"))
    work.mkdir(parents=True, exist_ok=True)
    steps, glob = args.steps.split(","), str(shards[0].parent / "train-*.jsonl.zst")
    res: dict = {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "cpus": os.cpu_count()}
    try:
        samples = [float(s) for s in args.sample_chars.split(",")] if "tokenizer" in steps else [50e6]
        res["tokenizer"] = tokenizers(glob, samples, work)  # the other steps tokenize with its tokenizer
        tokenizer = work / "tokenizer.json"
        if "memory" in steps:
            sizes = [(int(k), [str(s) for s in shards[: int(k)]]) for k in args.shards.split(",")]
            res["memory"] = []
            for read, sources in [*sizes, (args.repeat * len(shards), [glob] * args.repeat)]:
                res["memory"].append({"shards_read": read, **prepare(sources, tokenizer, 2, work / "out")})
                print("memory", res["memory"][-1], flush=True)
        if "workers" in steps:
            res["workers"] = workers([str(s) for s in shards[: args.speed_shards]], tokenizer, args.rounds, work)
        if "loader" in steps:
            like = work / "like"  # one shard prepared: the sparse directory takes its tokenizer and val split
            shutil.rmtree(like, ignore_errors=True)
            cmd = [sys.executable, "-m", "lm.cli.prepare", str(shards[0]), "--tokenizer", str(tokenizer)]
            subprocess.run([*cmd, "--out", str(like)], check=True, capture_output=True)
            res["loader"] = loader(sparse_prepared(like, work / "sparse", int(args.loader_tokens)), 200)
            print("loader", res["loader"], flush=True)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(res, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
