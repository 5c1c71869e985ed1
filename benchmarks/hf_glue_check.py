"""Outside check of lm finetune (issue 50 item 1): the same pretrained checkpoint finetuned by Hugging Face's
own sequence-classification model + Trainer (the run_glue recipe) and by `lm finetune`, on the same GLUE dev
sets, several seeds each, side by side.

    python -m lm.cli.export runs/dec --out runs/dec_export        # -> runs/dec_export/hf
    python benchmarks/hf_glue_check.py --run runs/dec --hf-dir runs/dec_export/hf --tasks stsb,mrpc,rte \\
        --seeds 0,1,2 --lrs 5e-4 --epochs 3 --sides hf,lm,lm-mean --out runs/hf_glue_check

`--run` is what lm finetune starts from (init=: an lm train run dir or one of its checkpoints); `--hf-dir` is
its lm export hf/ directory (default: <run>/checkpoints/<latest>/export/hf, where lm export writes by default).
The family comes from the export's config.json model_type: bert (model=bert, any size), esm (a pre-norm
RoPE encoder, e.g. the GLUE GPU preset's, which lm export writes as ESM's EsmModel) or gpt2 (a decoder of the
GPT-2 layout: learned positions, LayerNorm, GELU, biases). Runs offline from the local GLUE copy
($LM_DATA_MIRROR/glue_data, or --data-root). Sides: hf (Trainer), lm (lm finetune with the head that matches
the Hugging Face one), lm-mean (lm finetune with the GLUE-transfer recipe's own head, for context).

What is the same on both sides (hf and lm): the weights, the tokenizer, the pair layout and longest-first
truncation to --max-len (bert: [CLS] a [SEP] b [SEP], segment ids 0/1; esm: the same without segment ids, as the
model has no segment table; gpt2: [BOS] a [SEP] b [EOS], no segment ids: GPT-2 would add the token embedding of
a segment id), the pooled position (bert, esm: [CLS] through a fresh dense+tanh pooler; gpt2: the last real
token, i.e. [EOS], no pooler: lm's pooling=first / last), a new linear head (MSE with one output for STS-B,
cross-entropy otherwise), the dropout before it (bert: 0.1, the export sets no classifier dropout so this script
does; esm: 0.1, set on ESM's classification head; gpt2: none, GPT2ForSequenceClassification has none), dropout 0
inside the backbone (the export's, and lm's model.dropout), AdamW (0.9, 0.999, eps 1e-8) with weight decay 0.01
on the same tensors (Linear weights and the embedding tables; none on biases and norms: Trainer's default
groups, lm's optim.decay_embeddings=true), linear decay to 0 after a 10% warmup, gradient clipping at 1.0,
--batch-size with the last partial batch kept, dev scored after every epoch and the best epoch kept (the number
lm finetune reports), fp32 on the same device (the GPU when there is one), the same first --max-train-examples
rows.
What differs by design: the Hugging Face side encodes with the export's own fast tokenizer and reads the TSV
files with its own few lines (no lm.glue code); it scores raw predictions (lm clips STS-B to [0, 5] as the
leaderboard would); its new head is initialised as the family does (normal, std 0.02; lm: torch's Linear
default, uniform +-1/sqrt(dim)) and GPT-2's `score` has no bias (lm's classifier has one); its warmup starts at
lr 0 (lm's at (step+1)/(warmup+1)); both decays reach 0 one step after the last (lm's since d47fca8); ESM's head
also drops out before its dense+tanh (lm's only before the last linear layer); its data order, dropout masks and
head init come from its own seeding.
The lm-mean side is lm finetune as the GLUE-transfer recipe runs it (mean pooling, dropout 0.1 before the
head, no weight decay on embeddings) with this script's lr, epochs, batch and examples.
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


FAMILIES = {"bert": "encoder", "esm": "encoder", "gpt2": "decoder"}  # config.json model_type -> lm's arch
SEGMENTS = {"bert"}  # the families whose pairs carry segment ids (token_type_ids)


def family(hf_dir: Path) -> str:
    """The export's model_type, one this script can finetune on the Hugging Face side."""
    kind = json.loads((hf_dir / "config.json").read_text()).get("model_type")
    if kind not in FAMILIES:
        raise SystemExit(f"{hf_dir}/config.json: model_type {kind!r}; this check runs {sorted(FAMILIES)} exports")
    return kind


def encode(tok, rows, max_len: int, kind: str = "bert"):
    """lm's pair layout with the export's tokenizer, longest-first truncation (the longer side loses its last
    token; b on a tie). bert: [CLS] a [SEP] b [SEP] with segment ids 0/1 (BERT's run_classifier); esm: the same
    without segment ids; gpt2: [BOS] a [SEP] b [EOS] and no segment ids (GPT-2 adds wte(token_type_ids) to its
    input: not lm's model)."""
    encoder = FAMILIES[kind] == "encoder"
    first, last = (tok.cls_token_id, tok.sep_token_id) if encoder else (tok.bos_token_id, tok.eos_token_id)
    out = []
    for a, b, y in rows:
        ta = tok.encode(a, add_special_tokens=False)
        tb = tok.encode(b, add_special_tokens=False)
        while len(ta) + len(tb) > max_len - 3:
            (ta if len(ta) > len(tb) else tb).pop()
        ids = [first, *ta, tok.sep_token_id, *tb, last]
        f = {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": y}
        if kind in SEGMENTS:
            f["token_type_ids"] = [0] * (len(ta) + 2) + [1] * (len(tb) + 1)
        out.append(f)
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
    """Dev rows whose ids (bert: and segment ids) or labels differ between this script's encoding (the
    export's fast tokenizer) and lm finetune's (lm.glue.encode with the run's tokenizer file, as the export
    holds it)."""
    from transformers import AutoTokenizer

    from lm.data.tokenizer import Tokenizer
    from lm.glue.encode import encode_examples
    from lm.glue.readers import load_split

    kind = family(hf_dir)
    ours = encode_examples(
        Tokenizer.load(hf_dir / "tokenizer.json"), load_split(task, "dev", root, hf=False), max_len, FAMILIES[kind]
    )
    theirs = encode(AutoTokenizer.from_pretrained(hf_dir), read_tsv(root, task, "dev"), max_len, kind)
    keys = ("input_ids", "token_type_ids", "labels") if kind in SEGMENTS else ("input_ids", "labels")
    return sum(any(o[k] != t[k] for k in keys) for o, t in zip(ours, theirs)) + abs(len(ours) - len(theirs))


def hf_model(hf_dir: Path, kind: str, n_labels: int, tok):
    """The family's sequence classifier on the export (a new head), as run_glue builds it."""
    from transformers import BertForSequenceClassification, EsmForSequenceClassification, GPT2ForSequenceClassification

    # run_glue: num_labels=1 makes the model's loss MSE (problem_type "regression")
    if kind == "bert":  # the export's hidden_dropout_prob is 0: the head's dropout is set as lm's (0.1)
        return BertForSequenceClassification.from_pretrained(hf_dir, num_labels=n_labels, classifier_dropout=0.1)
    if kind == "esm":  # its head's dropout is hidden_dropout_prob, 0 in the export as in the backbone: set here
        model = EsmForSequenceClassification.from_pretrained(hf_dir, num_labels=n_labels)
        model.classifier.dropout.p = 0.1
        return model
    # GPT-2 pools the rightmost token that is not pad_token_id: pads must be the collator's pads only
    if tok.pad_token_id in (tok.eos_token_id, None):
        raise SystemExit(f"{hf_dir}: the pad token must be its own token (not [EOS]) for last-token pooling")
    return GPT2ForSequenceClassification.from_pretrained(hf_dir, num_labels=n_labels, pad_token_id=tok.pad_token_id)


def forward_gap(run: Path, hf_dir: Path, root: Path, task: str, max_len: int, rows: int = 64) -> float:
    """Whether both sides finetune the same function: lm finetune's classifier (lm.glue.init, the `lm` side's
    pooling) and the Hugging Face one, given the same head weights (lm's; its bias zeroed where the family's head
    has none), on the first dev rows as each side encodes them: max |logit difference| / max |logit|."""
    import torch
    from transformers import AutoTokenizer

    from lm.glue.encode import collate, encode_examples
    from lm.glue.init import build_classifier, load_backbone
    from lm.glue.readers import load_split

    kind = family(hf_dir)
    n_labels = 1 if TASKS[task][4] is None else len(TASKS[task][4])
    backbone = load_backbone(str(run))
    head = dict(o.split("=", 1) for o in LM_HEADS["lm"][kind])
    ours = build_classifier(backbone, n_labels, 0.0, head["pooling"]).eval()
    tok = AutoTokenizer.from_pretrained(hf_dir)
    theirs = hf_model(hf_dir, kind, n_labels, tok).eval()
    with torch.no_grad():
        if kind == "bert":
            theirs.bert.pooler.dense.load_state_dict(ours.pooler[0].state_dict())
            theirs.classifier.load_state_dict(ours.classifier.state_dict())
        elif kind == "esm":
            theirs.classifier.dense.load_state_dict(ours.pooler[0].state_dict())
            theirs.classifier.out_proj.load_state_dict(ours.classifier.state_dict())
        else:
            ours.classifier.bias.zero_()
            theirs.score.weight.copy_(ours.classifier.weight)
        feats = encode_examples(
            backbone.tokenizer, load_split(task, "dev", root, hf=False)[:rows], max_len, FAMILIES[kind]
        )
        batch = collate(feats, backbone.tokenizer.pad_id)
        a = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits
        hf_feats = [
            {k: v for k, v in f.items() if k != "labels"}
            for f in encode(tok, read_tsv(root, task, "dev")[:rows], max_len, kind)
        ]
        b = theirs(**tok.pad(hf_feats, return_tensors="pt")).logits
    return float((a - b).abs().max() / a.abs().max())


def hf_side(hf_dir: Path, root: Path, task: str, seed: int, lr: float, args) -> dict:
    """One Trainer run; dev scored at every epoch end; returns the best epoch's and the last epoch's scores."""
    import torch
    from transformers import (
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
        set_seed,
    )

    t0 = time.time()
    kind = family(hf_dir)
    tok = AutoTokenizer.from_pretrained(hf_dir)
    train = encode(tok, read_tsv(root, task, "train")[: args.max_train_examples], args.max_len, kind)
    # sorted by length: batches pad less (as lm's predict does); the scores do not depend on the order
    dev = sorted(encode(tok, read_tsv(root, task, "dev"), args.max_len, kind), key=lambda f: len(f["input_ids"]))
    n_labels = 1 if TASKS[task][4] is None else len(TASKS[task][4])
    set_seed(seed)  # before the new head's init, as run_glue
    model = hf_model(hf_dir, kind, n_labels, tok)
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
        use_cpu=not torch.cuda.is_available(),  # where lm finetune runs (train.device=auto)
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
        "seconds": time.time() - t0,
    }


SIDES = ["hf", "lm", "lm-mean"]
LM_HEADS = {  # side -> family -> lm finetune overrides that give the head (see the module docstring)
    "lm": {
        "bert": ["pooling=first", "dropout=0.1", "optim.decay_embeddings=true"],
        "esm": ["pooling=first", "dropout=0.1", "optim.decay_embeddings=true"],
        "gpt2": ["pooling=last", "dropout=0.0", "optim.decay_embeddings=true"],
    },
    "lm-mean": {k: ["pooling=mean", "dropout=0.1", "optim.decay_embeddings=false"] for k in FAMILIES},
}


def lm_command(run: Path, task: str, seeds, lr: float, args, side: str, kind: str, out: Path) -> list[str]:
    """The lm finetune command line of one side, task and lr (every seed)."""
    head = {k: v for k, _, v in (o.partition("=") for o in LM_HEADS[side][kind])}
    cmd = [
        sys.executable,
        "-m",
        "lm.cli.finetune",
        f"task=glue/{task}",
        f"init={run}",
        f"run_dir={out}",
        f"optim.lr={lr}",
        "optim.weight_decay=0.01",
        f"optim.decay_embeddings={head['optim.decay_embeddings']}",
        f"pooling={head['pooling']}",
        "predict_test=false",
        "train.progress=false",
        "train.precision=fp32",
        f"tasks.{task}.epochs={args.epochs:g}",
        f"tasks.{task}.batch_size={args.batch_size}",
        f"tasks.{task}.max_len={args.max_len}",
        f"tasks.{task}.warmup_ratio=0.1",
        f"tasks.{task}.seeds=[{','.join(map(str, seeds))}]",
        f"tasks.{task}.dropout={head['dropout']}",
        "hf=false",
    ]
    if args.max_train_examples:
        cmd.append(f"tasks.{task}.max_train_examples={args.max_train_examples}")
    if args.data_root:
        cmd.append(f"glue.data_root={args.data_root}")
    if args.threads:
        cmd.append(f"train.threads={args.threads}")
    return cmd


def lm_side(run: Path, task: str, seeds, lr: float, args, side: str = "lm", kind: str = "bert") -> dict:
    """lm finetune from the run itself with the head of `side` (LM_HEADS)."""
    out = args.out / f"{side}_{task}_lr{lr:g}"
    cmd = lm_command(run, task, seeds, lr, args, side, kind, out)
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL if args.quiet else None)
    res = json.loads((out / "results.json").read_text())
    runs = res["tasks"][task]["runs"]
    return {
        int(s): {
            "best": r["main"],
            "last": r["history"][-1]["main"],
            "epochs": [h["main"] for h in r["history"]],
            "seconds": r.get("seconds", float("nan")),
        }
        for s, r in runs.items()
    }


def export_dir(run: Path, hf_dir: Path | None = None) -> Path:
    """--hf-dir, else the run's lm export hf/ directory (lm export writes <checkpoint>/export by default)."""
    if hf_dir is None:
        latest = run / "checkpoints" / "latest"
        ckpt = run / "checkpoints" / latest.read_text().strip() if latest.is_file() else latest.resolve()
        hf_dir = ckpt / "export" / "hf"
    if not (hf_dir / "config.json").is_file():
        raise SystemExit(f"no Hugging Face export at {hf_dir}; run `python -m lm.cli.export {run} --out <dir>` first")
    return hf_dir


def table(rows) -> str:
    lines = [
        "| task | lr | side | seeds: best epoch's dev score | median | last-epoch median | s per seed |",
        "|---|---:|---|---|---:|---:|---:|",
    ]
    for task, lr, side, per_seed in rows:
        best = [per_seed[s]["best"] for s in sorted(per_seed)]
        last = [per_seed[s]["last"] for s in sorted(per_seed)]
        lines.append(
            f"| {task} | {lr:g} | {side} | {', '.join(f'{v:.1f}' for v in best)} | "
            f"{statistics.median(best):.1f} | {statistics.median(last):.1f} | "
            f"{statistics.fmean(per_seed[s]['seconds'] for s in per_seed):.0f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--run", type=Path, required=True, help="lm finetune's init=: an lm train run or checkpoint dir")
    p.add_argument("--hf-dir", type=Path, default=None, help="its lm export hf/ dir (default: under the checkpoint)")
    p.add_argument("--tasks", default="stsb,mrpc", help=f"comma-separated, of {sorted(TASKS)}")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--lrs", default="1e-4,3e-4", help="peak learning rates (each side runs every one)")
    p.add_argument("--epochs", type=float, default=4.0)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--max-train-examples", type=int, default=None, help="first N training rows (CPU budget)")
    p.add_argument("--sides", default="hf,lm", help=f"comma-separated, of {SIDES}")
    p.add_argument("--data-root", default=None, help="glue_data dir (default $LM_DATA_MIRROR/glue_data)")
    p.add_argument("--out", type=Path, default=Path("runs/hf_glue_check"))
    p.add_argument("--quiet", action="store_true", help="hide lm finetune's log")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads of both sides (default: torch's)")
    args = p.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    root = Path(args.data_root or Path(os.environ.get("LM_DATA_MIRROR", ".")) / "glue_data")
    seeds = [int(s) for s in args.seeds.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    sides = args.sides.split(",")
    if not set(sides) <= set(SIDES):
        raise SystemExit(f"--sides={args.sides}: each side is one of {SIDES}")
    hf = export_dir(args.run, args.hf_dir)
    kind = family(hf)
    rows, t0 = [], time.time()
    for task in args.tasks.split(","):
        print(
            f"{task}: dev rows encoded differently by the two sides: {layout_mismatches(hf, root, task, args.max_len)}"
        )
        gap = forward_gap(args.run, hf, root, task, args.max_len)
        print(f"{task}: same head weights, max |logit difference| / max |logit| on 64 dev rows: {gap:.1e}", flush=True)
        for lr in (float(x) for x in args.lrs.split(",")):
            for side in sides:
                if side == "hf":
                    per_seed = {s: hf_side(hf, root, task, s, lr, args) for s in seeds}
                else:
                    per_seed = lm_side(args.run, task, seeds, lr, args, side, kind)
                rows.append((task, lr, side, per_seed))
                (args.out / "check.json").write_text(
                    json.dumps([{"task": t, "lr": r, "side": s, "seeds": v} for t, r, s, v in rows], indent=1)
                )
                print(table(rows), flush=True)
    print(f"\n{time.strftime('%Y-%m-%d')}, {time.time() - t0:.0f} s; command: {' '.join(sys.argv)}")


if __name__ == "__main__":
    main()
