"""Outside check of lm-finetune (issue 50 item 1): the same pretrained checkpoint finetuned by Hugging Face's
own BertForSequenceClassification + Trainer (the run_glue recipe) and by `lm-finetune`, on the same GLUE dev
sets, several seeds each, side by side.

    python -m lm.cli.export runs/bert_tiny                 # -> runs/bert_tiny/checkpoints/<step>/export/hf
    python benchmarks/hf_glue_check.py --run runs/bert_tiny --tasks stsb,mrpc --seeds 0,1,2 --lrs 1e-4,3e-4 \\
        --epochs 4 --out runs/hf_glue_check

`--run` is an lm-train run of a model the BERT family can hold (model=bert, any size): its export's hf/
directory is what the Hugging Face side loads, the run itself is lm-finetune's init=. Runs offline from the
local GLUE copy ($LM_DATA_MIRROR/glue_data, or --data-root).

What is the same on both sides: the weights, the tokenizer, [CLS] a [SEP] b [SEP] with segment ids 0/1 and
longest-first truncation to --max-len, a fresh dense+tanh pooler on [CLS] and a linear head (MSE with one
output for STS-B, cross-entropy otherwise), dropout 0.1 before the head, AdamW with weight decay 0.01,
linear decay after a 10% warmup, gradient clipping at 1.0, batch 32, dev scored after every epoch and
the best epoch kept (the number lm-finetune reports), fp32.
What differs by design: the Hugging Face side encodes with the export's own fast tokenizer and reads the
TSV files with its own few lines (no lm.glue code), scores raw predictions (lm clips STS-B to [0, 5] as the
leaderboard would), initialises the new pooler/head as BERT does (normal, std 0.02), and its data order,
dropout masks and head init come from its own seeding; weight decay follows Trainer's default groups
(none on biases and LayerNorm weights; lm: none on vectors: the same tensors).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

TASKS = {  # dir, text columns, label column, label strings (None: regression)
    "stsb": ("STS-B", "sentence1", "sentence2", "score", None),
    "mrpc": ("MRPC", "#1 String", "#2 String", "Quality", ["0", "1"]),
    "rte": ("RTE", "sentence1", "sentence2", "label", ["entailment", "not_entailment"]),
}


def read_tsv(root: Path, task: str, split: str):
    """(text_a, text_b, label) rows of a GLUE TSV, read independently of lm.glue.readers."""
    d, a, b, y, labels = TASKS[task]
    with open(root / d / f"{split}.tsv", encoding="utf-8-sig", newline="") as f:
        rows = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(rows)
        ia, ib, iy = header.index(a), header.index(b), header.index(y)
        return [(r[ia], r[ib], float(r[iy]) if labels is None else labels.index(r[iy])) for r in rows]


def encode(tok, rows, max_len: int):
    """BERT's run_classifier layout with the export's tokenizer: [CLS] a [SEP] b [SEP], longest-first."""
    out = []
    for a, b, y in rows:
        ta = tok.encode(a, add_special_tokens=False)
        tb = tok.encode(b, add_special_tokens=False)
        while len(ta) + len(tb) > max_len - 3:
            (ta if len(ta) > len(tb) else tb).pop()
        ids = [tok.cls_token_id, *ta, tok.sep_token_id, *tb, tok.sep_token_id]
        out.append(
            {
                "input_ids": ids,
                "token_type_ids": [0] * (len(ta) + 2) + [1] * (len(tb) + 1),
                "attention_mask": [1] * len(ids),
                "labels": y,
            }
        )
    return out


def metrics(task: str, preds, labels) -> dict:
    import numpy as np
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import accuracy_score, f1_score

    p, y = np.asarray(preds), np.asarray(labels)
    if task == "stsb":
        m = {"pearson": pearsonr(p[:, 0], y)[0], "spearman": spearmanr(p[:, 0], y)[0]}
    elif task == "mrpc":
        m = {"f1": f1_score(y, p.argmax(-1)), "acc": accuracy_score(y, p.argmax(-1))}
    else:
        m = {"acc": accuracy_score(y, p.argmax(-1))}
    m = {k: 100.0 * float(v) for k, v in m.items()}
    m["score"] = statistics.fmean(m.values())
    return m


def layout_mismatches(hf_dir: Path, root: Path, task: str, max_len: int) -> int:
    """Dev rows whose ids or segment ids differ between this script's encoding (the export's fast
    tokenizer) and lm-finetune's (lm.glue.encode with the run's tokenizer file, as the export holds it)."""
    from transformers import AutoTokenizer

    from lm.data.tokenizer import Tokenizer
    from lm.glue.encode import encode_examples
    from lm.glue.readers import load_split

    ours = encode_examples(
        Tokenizer.load(hf_dir / "tokenizer.json"), load_split(task, "dev", root, hf=False), max_len, "encoder"
    )
    theirs = encode(AutoTokenizer.from_pretrained(hf_dir), read_tsv(root, task, "dev"), max_len)
    keys = ("input_ids", "token_type_ids", "labels")
    return sum(any(o[k] != t[k] for k in keys) for o, t in zip(ours, theirs)) + abs(len(ours) - len(theirs))


def hf_side(hf_dir: Path, root: Path, task: str, seed: int, lr: float, args) -> dict:
    """One Trainer run; dev scored at every epoch end; returns the best epoch's and the last epoch's scores."""
    from transformers import (
        AutoTokenizer,
        BertForSequenceClassification,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )

    tok = AutoTokenizer.from_pretrained(hf_dir)
    train = encode(tok, read_tsv(root, task, "train")[: args.max_train_examples], args.max_len)
    dev = encode(tok, read_tsv(root, task, "dev"), args.max_len)
    n_labels = 1 if TASKS[task][4] is None else len(TASKS[task][4])
    # run_glue: num_labels=1 makes the model's loss MSE (problem_type "regression")
    model = BertForSequenceClassification.from_pretrained(hf_dir, num_labels=n_labels)
    history = []

    def compute(p):
        m = metrics(task, p.predictions.reshape(len(dev), -1), p.label_ids)
        history.append(m)
        return m

    targs = TrainingArguments(
        output_dir=str(args.out / "hf_tmp"),
        learning_rate=lr,
        num_train_epochs=args.epochs,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=128,
        weight_decay=0.01,
        warmup_steps=round(0.1 * math.ceil(args.epochs * math.ceil(len(train) / args.batch_size))),
        lr_scheduler_type="linear",
        max_grad_norm=1.0,
        eval_strategy="epoch",
        save_strategy="no",
        logging_strategy="no",
        report_to=[],
        seed=seed,
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    Trainer(
        model=model,
        args=targs,
        train_dataset=train,
        eval_dataset=dev,
        compute_metrics=compute,
        data_collator=DataCollatorWithPadding(tok),
    ).train()
    best = max(history, key=lambda m: m["score"])
    return {
        "best": best["score"],
        "last": history[-1]["score"],
        "epochs": [m["score"] for m in history],
        "best_metrics": best,
    }


def lm_side(run: Path, task: str, seeds, lr: float, args) -> dict:
    """lm-finetune from the run itself (pooling=first: [CLS] through a dense+tanh pooler, as BERT)."""
    out = args.out / f"lm_{task}_lr{lr:g}"
    cmd = [
        sys.executable,
        "-m",
        "lm.cli.finetune",
        f"task=glue/{task}",
        f"init={run}",
        f"run_dir={out}",
        f"optim.lr={lr}",
        "optim.weight_decay=0.01",
        "pooling=first",
        "predict_test=false",
        "train.progress=false",
        "train.precision=fp32",
        f"tasks.{task}.epochs={args.epochs}",
        f"tasks.{task}.batch_size={args.batch_size}",
        f"tasks.{task}.max_len={args.max_len}",
        f"tasks.{task}.warmup_ratio=0.1",
        f"tasks.{task}.seeds=[{','.join(map(str, seeds))}]",
        f"tasks.{task}.dropout=0.1",
        "hf=false",
    ]
    if args.max_train_examples:
        cmd.append(f"tasks.{task}.max_train_examples={args.max_train_examples}")
    if args.data_root:
        cmd.append(f"glue.data_root={args.data_root}")
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL if args.quiet else None)
    res = json.loads((out / "results.json").read_text())
    runs = res["tasks"][task]["runs"]
    return {
        int(s): {"best": r["main"], "last": r["history"][-1]["main"], "epochs": [h["main"] for h in r["history"]]}
        for s, r in runs.items()
    }


def export_dir(run: Path) -> Path:
    """The run's lm-export hf/ directory (lm-export writes <checkpoint>/export by default)."""
    latest = run / "checkpoints" / "latest"
    ckpt = run / "checkpoints" / latest.read_text().strip() if latest.is_file() else latest.resolve()
    hf = ckpt / "export" / "hf"
    if not (hf / "config.json").is_file():
        raise SystemExit(f"no Hugging Face export at {hf}; run `python -m lm.cli.export {run}` first")
    return hf


def table(rows) -> str:
    lines = [
        "| task | lr | side | seeds: best epoch's dev score | median | last-epoch median |",
        "|---|---:|---|---|---:|---:|",
    ]
    for task, lr, side, per_seed in rows:
        best = [per_seed[s]["best"] for s in sorted(per_seed)]
        last = [per_seed[s]["last"] for s in sorted(per_seed)]
        lines.append(
            f"| {task} | {lr:g} | {side} | {', '.join(f'{v:.1f}' for v in best)} | "
            f"{statistics.median(best):.1f} | {statistics.median(last):.1f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--run", type=Path, required=True, help="lm-train run dir of a BERT-family model, exported")
    p.add_argument("--tasks", default="stsb,mrpc", help=f"comma-separated, of {sorted(TASKS)}")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--lrs", default="1e-4,3e-4", help="peak learning rates (each side runs every one)")
    p.add_argument("--epochs", type=float, default=4.0)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--max-train-examples", type=int, default=None, help="first N training rows (CPU budget)")
    p.add_argument("--sides", default="hf,lm", help="hf, lm or both")
    p.add_argument("--data-root", default=None, help="glue_data dir (default $LM_DATA_MIRROR/glue_data)")
    p.add_argument("--out", type=Path, default=Path("runs/hf_glue_check"))
    p.add_argument("--quiet", action="store_true", help="hide lm-finetune's log")
    args = p.parse_args(argv)
    root = Path(args.data_root or Path(os.environ.get("LM_DATA_MIRROR", ".")) / "glue_data")
    seeds = [int(s) for s in args.seeds.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    hf = export_dir(args.run) if "hf" in args.sides else None
    rows, t0 = [], time.time()
    for task in args.tasks.split(","):
        if hf is not None:
            print(
                f"{task}: dev rows encoded differently by the two sides: "
                f"{layout_mismatches(hf, root, task, args.max_len)}",
                flush=True,
            )
        for lr in (float(x) for x in args.lrs.split(",")):
            if "hf" in args.sides:
                rows.append((task, lr, "hf", {s: hf_side(hf, root, task, s, lr, args) for s in seeds}))
            if "lm" in args.sides:
                rows.append((task, lr, "lm", lm_side(args.run, task, seeds, lr, args)))
            (args.out / "check.json").write_text(
                json.dumps([{"task": t, "lr": r, "side": s, "seeds": v} for t, r, s, v in rows], indent=1)
            )
            print(table(rows), flush=True)
    print(f"\n{time.strftime('%Y-%m-%d')}, {time.time() - t0:.0f} s; command: {' '.join(sys.argv)}")


if __name__ == "__main__":
    main()
