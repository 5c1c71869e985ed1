"""Linear probe: how much of a GLUE task a checkpoint's FROZEN features already solve, against the
same model with random weights.

Each example is encoded as lm finetune encodes it, run through the backbone once (no training),
pooled (mean over real tokens, and the last real token), and a logistic regression
(scikit-learn) is fit on the training features and scored on dev. If the pretrained features
probe barely above random ones, finetuning from them cannot be expected to beat training from
scratch.

A regression task (STS-B) is probed without any fit: each sentence is encoded alone, pooled, and the
cosine of a pair's two vectors is correlated with the dev scores (Pearson, Spearman), the zero-shot
similarity that tasks.stsb.pair_input=siamese starts its finetuning from; and again after whitening the
pooled vectors (a mean and linear map fit on the first --whiten-rows training pairs, no labels).

    python benchmarks/glue_probe.py runs/quickstart/pretrain                 # SST-2, first 5000 train rows
    python benchmarks/glue_probe.py runs/quickstart/pretrain --task cola --train-examples 0   # all rows
    python benchmarks/glue_probe.py runs/quickstart/pretrain --task stsb     # cosine of pooled a and b
    python benchmarks/glue_probe.py runs/quickstart/pretrain --label-words   # SST-2 by the LM's next word

The label-word probe (decoders) asks whether the language model itself already knows sentiment, the
knowledge prompt-based finetuning builds on (Schick & Schuetze 2021; Gao et al. 2021, LM-BFF): each SST-2
dev sentence is followed by a template (" It was"), and log p(positive word) - log p(negative word) at the
next position ranks the sentences; the ROC AUC of that ranking against the labels is 50 for no knowledge.

Data: $LM_DATA_MIRROR/glue_data (or --data-root), as lm finetune reads it.
"""

import argparse
import time

import numpy as np
import torch

POOLINGS = ("mean", "last")
SIMILARITY_POOLINGS = ("mean", "weighted_mean", "last")


def features(model, tokenizer, examples, arch: str, max_len: int, batch: int = 256, poolings=POOLINGS):
    """{pooling: (N, D) array} and the (N,) labels of `examples`, from one no-grad pass."""
    from lm.glue.encode import collate, encode_examples
    from lm.model.heads import pool

    enc = encode_examples(tokenizer, examples, max_len, arch)
    out = {p: [] for p in poolings}
    with torch.no_grad():
        for i in range(0, len(enc), batch):
            b = collate(enc[i : i + batch], tokenizer.pad_id)
            h = model.features(b["input_ids"], b["attention_mask"], b["token_type_ids"])  # (B, T, D)
            for p in poolings:
                out[p].append(pool(h, b["attention_mask"], p).numpy())
    return {p: np.concatenate(v) for p, v in out.items()}, np.array([e.get("labels") for e in enc])


def both_weights(bb, seed: int):
    """("pretrained", model) then ("random init", the same model freshly initialised from `seed`)."""
    from lm.model import build_model

    for name in ("pretrained", "random init"):
        torch.manual_seed(seed)
        model = build_model(bb.model_cfg).eval()
        if name == "pretrained":
            model.load_state_dict(bb.state_dict)
        yield name, model


def probe(init: str, task: str, train_examples: int, max_len: int, root, seed: int = 0) -> dict:
    from sklearn.linear_model import LogisticRegression

    from lm.glue.init import load_backbone
    from lm.glue.readers import load_split
    from lm.glue.tasks import get_task

    if get_task(task).n_labels == 1:
        raise SystemExit(f"glue_probe: {task} is a regression task; its probe is similarity()")
    bb = load_backbone(init)
    train = load_split(task, "train", root, hf=False)[: train_examples or None]
    dev = load_split(task, "dev", root, hf=False)
    rows = {}
    for name, model in both_weights(bb, seed):
        x_tr, y_tr = features(model, bb.tokenizer, train, bb.model_cfg.arch, max_len)
        x_dev, y_dev = features(model, bb.tokenizer, dev, bb.model_cfg.arch, max_len)
        for p in POOLINGS:
            clf = LogisticRegression(max_iter=3000).fit(x_tr[p], y_tr)
            rows[(name, p)] = (100 * clf.score(x_tr[p], y_tr), 100 * clf.score(x_dev[p], y_dev))
    return rows


def similarity(init: str, task: str, max_len: int, root, seed: int = 0, whiten_rows: int = 2000) -> dict:
    """{(weights, pooling, "raw" | "whitened"): (Pearson, Spearman)} of cos(u, v) against a regression task's dev
    scores, u and v the pooled features of each sentence encoded alone; no training. "whitened" maps every
    pooled vector x to (x - m) W first, m and W the mean and whitening of the first `whiten_rows` training
    pairs' pooled sentences (Su et al. 2021, "Whitening Sentence Representations"): what the cosine says once
    the direction every sentence shares is taken out."""
    from scipy.stats import pearsonr, spearmanr

    from lm.glue.init import load_backbone
    from lm.glue.readers import load_split

    bb = load_backbone(init)
    dev = load_split(task, "dev", root, hf=False)
    if dev[0].text_b is None:
        raise SystemExit(f"glue_probe: {task} has one sentence per example; the similarity probe needs pairs")
    train = load_split(task, "train", root, hf=False, limit=whiten_rows)
    scores = np.array([e.label for e in dev])
    rows = {}
    for name, model in both_weights(bb, seed):
        u, v = (sentence_features(model, bb, dev, side, max_len) for side in ("text_a", "text_b"))
        fit = (
            sentence_features(model, bb, train, "text_a", max_len),
            sentence_features(model, bb, train, "text_b", max_len),
        )
        for p in SIMILARITY_POOLINGS:
            m, w = whitening(np.concatenate([fit[0][p], fit[1][p]]))
            for kind, (a, b) in (("raw", (u[p], v[p])), ("whitened", ((u[p] - m) @ w, (v[p] - m) @ w))):
                cos = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)
                rows[(name, p, kind)] = (100 * pearsonr(cos, scores)[0], 100 * spearmanr(cos, scores)[0])
    return rows


def sentence_features(model, bb, examples, side: str, max_len: int) -> dict:
    """{pooling: (N, D)} of one side of each pair ("text_a" or "text_b"), encoded alone."""
    from lm.glue.readers import Example

    alone = [Example(e.index, getattr(e, side), None, None) for e in examples]
    return features(model, bb.tokenizer, alone, bb.model_cfg.arch, max_len, poolings=SIMILARITY_POOLINGS)[0]


def whitening(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """lm.model.heads.whitening (the map tasks.<task>.whiten fits) of pooled vectors x (N, D), as numpy."""
    from lm.model.heads import whitening as fit

    m, w = fit(torch.from_numpy(x))
    return m.numpy(), w.numpy()


LABEL_WORDS = ((" great", " terrible"), (" good", " bad"), (" wonderful", " awful"), (" happy", " sad"))
TEMPLATES = (" It was", " This is")


def label_words(init: str, root, max_len: int, seed: int = 0, batch: int = 128) -> dict:
    """{(weights, template, "pos/neg"): ROC AUC} of the next-word log-odds of each label-word pair after
    each template, over SST-2 dev (a decoder's LM head; its first token of each word)."""
    from sklearn.metrics import roc_auc_score

    from lm.glue.init import load_backbone
    from lm.glue.readers import load_split

    bb = load_backbone(init)
    if bb.model_cfg.arch != "decoder":
        raise SystemExit(f"glue_probe: --label-words reads a decoder's next word; {init} is {bb.model_cfg.arch}")
    dev = load_split("sst2", "dev", root, hf=False)
    labels = np.array([e.label for e in dev])
    words = [(bb.tokenizer.encode(a)[0], bb.tokenizer.encode(b)[0]) for a, b in LABEL_WORDS]
    rows = {}
    for name, model in both_weights(bb, seed):
        for template in TEMPLATES:
            ids = [bb.tokenizer.encode(e.text_a.strip() + template)[-max_len:] for e in dev]
            logp = next_word_logprobs(model, ids, bb.tokenizer.pad_id, batch)  # (N, V)
            for (a, b), (pos, neg) in zip(LABEL_WORDS, words):
                auc = roc_auc_score(labels, logp[:, pos] - logp[:, neg])
                rows[(name, template, f"{a.strip()}/{b.strip()}")] = 100 * auc
    return rows


def next_word_logprobs(model, ids: list[list[int]], pad_id: int, batch: int) -> np.ndarray:
    """(N, V) log-probabilities of the token after each of the N sequences `ids` (right-padded batches)."""
    out = []
    with torch.no_grad():
        for i in range(0, len(ids), batch):
            rows = ids[i : i + batch]
            x = torch.full((len(rows), max(map(len, rows))), pad_id, dtype=torch.long)  # (B, T)
            for r, seq in enumerate(rows):
                x[r, : len(seq)] = torch.tensor(seq)
            logits = model(x).logits  # (B, T, V); causal, so right padding changes no real position
            last = torch.tensor([len(seq) - 1 for seq in rows])
            out.append(logits[torch.arange(len(rows)), last].float().log_softmax(-1).numpy())
    return np.concatenate(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("init", help="an lm train run dir (or checkpoint, or lm export dir)")
    p.add_argument("--task", default="sst2")
    p.add_argument("--train-examples", type=int, default=5000, help="first N training rows (0 = all)")
    p.add_argument("--max-len", type=int, default=64)
    p.add_argument("--data-root", default=None, help="GLUE root (default: $LM_DATA_MIRROR/glue_data)")
    p.add_argument("--whiten-rows", type=int, default=2000, help="training pairs the whitening is fit on (STS-B)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--label-words", action="store_true", help="SST-2 by the next-word log-odds (decoders)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    if args.label_words:
        rows = label_words(args.init, args.data_root, args.max_len)
        print(f"label words: ROC AUC of log p(pos) - log p(neg) after a template, SST-2 dev, init={args.init}")
        print("| weights | template | words | AUC |\n|---|---|---|---:|")
        for (name, template, pair), auc in rows.items():
            print(f"| {name} | {template!r} | {pair} | {auc:.1f} |")
        for name in dict.fromkeys(w for w, _, _ in rows):
            aucs = [auc for (w, _, _), auc in rows.items() if w == name]
            print(f"{name}: mean AUC {np.mean(aucs):.1f} (range {min(aucs):.1f}-{max(aucs):.1f})")
        print(f"({time.perf_counter() - t0:.0f} s)")
        return
    from lm.glue.tasks import get_task

    if get_task(args.task).n_labels == 1:
        rows = similarity(args.init, args.task, args.max_len, args.data_root, whiten_rows=args.whiten_rows)
        print(f"zero-shot similarity: cos of the pooled sentences against {args.task} dev, init={args.init}")
        print("| weights | pooling | vectors | Pearson | Spearman |\n|---|---|---|---:|---:|")
        for (name, pooling, kind), (r, rho) in rows.items():
            print(f"| {name} | {pooling} | {kind} | {r:.1f} | {rho:.1f} |")
        print(f"({time.perf_counter() - t0:.0f} s)")
        return
    rows = probe(args.init, args.task, args.train_examples, args.max_len, args.data_root)
    print(f"linear probe on frozen features, {args.task}, init={args.init}")
    print("| weights | pooling | train acc | dev acc |\n|---|---|---:|---:|")
    for (name, pooling), (tr, dv) in rows.items():
        print(f"| {name} | {pooling} | {tr:.1f} | {dv:.1f} |")
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
