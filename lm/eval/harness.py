"""The LM Evaluation Harness (lm-eval, EleutherAI) on lm's own model: `LMAdapter` implements its model interface.

    from lm.eval.harness import LMAdapter, evaluate
    results = evaluate(LMAdapter.from_saved("runs/pretrain"), ["local_sst2", "local_wikitext2"], limit=100)

The adapter subclasses lm_eval.api.model.TemplateLM, so the harness's own code splits a (context,
continuation) pair into tokens exactly as its Hugging Face backend does (trailing spaces of the context
move to the continuation; an empty context is the BOS token, else EOS). What it adds is the scoring, through
the model's public forward (no change to lm/model):

- loglikelihood: each request is (context + continuation)[-(max_len + 1):][:-1] in one forward; the
  continuation's log-probabilities are summed (fp32 log-softmax), and `is_greedy` says whether every
  continuation token was the argmax; a continuation of more than max_len tokens is refused (HarnessError).
  Requests are sorted by length and right-padded into batches, which a causal model never reads. An
  encoder-decoder encodes the context and teacher-forces the continuation.
- loglikelihood_rolling (perplexity): the harness's own disjoint windows of at most max_len tokens, each
  conditioned on the window before it, as the Hugging Face backend makes them; the sum over a document.
- generate_until: lm.model.generate (greedy unless do_sample, with the KV cache), cut at the first `until`.

Decoders (the zoo's recurrent LMs among them: model=lstm|gru|rnn) support all three; encoder-decoders
loglikelihood and generation (refuse_unscorable: a perplexity task, before any runs); encoders (masked LMs)
none, which is refused naming why. One process (rank 0).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from lm.extras import require

log = logging.getLogger("lm")

TASKS_DIR = Path(__file__).parent / "tasks"  # the offline task YAMLs over $LM_DATA_MIRROR (lm/eval/tasks/)

require("eval", "lm's LM Evaluation Harness adapter (lm.eval.harness)", "lm_eval")
from lm_eval import utils as lm_eval_utils  # noqa: E402
from lm_eval.api.model import TemplateLM  # noqa: E402  (after the one-line check above)


class HarnessError(ValueError):
    """The model or request cannot be evaluated; the message says why and what works instead."""


class LMAdapter(TemplateLM):
    """lm's DecoderLM / RNNLM / EncoderDecoderLM behind the harness's model interface."""

    def __init__(
        self,
        model,
        tokenizer,
        batch_size: int = 16,
        max_length: int | None = None,
        max_gen_toks: int = 256,
        device: str = "cpu",
    ):
        super().__init__()
        arch = model.cfg.arch
        if arch == "encoder":
            raise HarnessError(
                "the LM Evaluation Harness scores left-to-right likelihoods; an encoder (masked LM) "
                "has none: evaluate a decoder, RNN or encoder-decoder, or probe it (--tasks probe)"
            )
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.backend = "seq2seq" if arch == "encoder_decoder" else "causal"
        self.batch_size = int(batch_size)
        self._max_length = int(max_length or model.cfg.max_seq_len)
        self._max_gen_toks = max_gen_toks
        self._device = torch.device(device)

    @classmethod
    def from_saved(cls, path, tokenizer: str | None = None, **kw) -> LMAdapter:
        """From a run directory, checkpoint or lm export directory (lm/eval/saved.py)."""
        from lm.eval.saved import load_model

        model, tok = load_model(path, tokenizer)
        return cls(model, tok, **kw)

    # -- what TemplateLM asks of a model
    @property
    def eot_token_id(self) -> int:
        eos = self.tokenizer.eos_id
        return eos if eos is not None else self.tokenizer.pad_id

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_id  # as HFLM: BOS when the tokenizer has one, else EOS
        return bos if bos is not None else self.eot_token_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def device(self):
        return self._device

    @property
    def tokenizer_name(self) -> str:
        return f"lm:{self.tokenizer.kind}"

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.tokenizer.encode(string)

    def tok_decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=True)

    # -- scoring
    @torch.no_grad()
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """requests: ((context, continuation) or None, context ids, continuation ids) -> (sum of log p, greedy)."""
        order = sorted(range(len(requests)), key=lambda i: -len(requests[i][1]) - len(requests[i][2]))
        out: list[tuple[float, bool] | None] = [None] * len(requests)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            scores = self._score_batch([requests[i] for i in chunk])
            for i, score in zip(chunk, scores):
                out[i] = score
                if requests[i][0] is not None:
                    self.cache_hook.add_partial("loglikelihood", requests[i][0], score)
        return out  # type: ignore[return-value]

    def _score_batch(self, batch) -> list[tuple[float, bool]]:
        for _, _, cont in batch:
            if len(cont) > self.max_length:  # its first tokens would have no position left to be predicted from
                raise HarnessError(
                    f"a continuation of {len(cont)} tokens does not fit in the model's {self.max_length} positions "
                    f"(model.max_seq_len); evaluate a model with a longer max_seq_len, or tasks with shorter answers"
                )
        if self.backend == "seq2seq":
            return self._score_seq2seq(batch)
        rows, conts = [], []
        for _, ctx, cont in batch:
            if not cont:
                raise HarnessError("an empty continuation has no likelihood to score")
            whole = (list(ctx) + list(cont))[-(self.max_length + 1) :]
            rows.append(whole[:-1])  # the inputs; the model predicts whole[1:]
            conts.append(list(cont))
        logp = self._log_probs(rows)  # (B, T, V)
        return [_continuation_score(logp[b, len(rows[b]) - len(c) : len(rows[b])], c) for b, c in enumerate(conts)]

    def _log_probs(self, rows: list[list[int]], **extra) -> torch.Tensor:
        """fp32 log-softmax of the model's outputs on right-padded rows (B, T, V)."""
        ids = _pad(rows, self.tokenizer.pad_id or 0).to(self.device)
        logits = self.model(input_ids=ids, **extra).logits
        return F.log_softmax(logits.float(), dim=-1).cpu()  # log-probs already (adaptive softmax): unchanged

    def _score_seq2seq(self, batch) -> list[tuple[float, bool]]:
        from lm.model.lm import shift_right

        pad = self.tokenizer.pad_id or 0
        ctx = [list(c)[-self.max_length :] for _, c, _ in batch]
        conts = [list(c) for _, _, c in batch]
        ids, mask = _pad(ctx, pad), _pad([[1] * len(c) for c in ctx], 0)
        labels = _pad(conts, pad)
        dec = shift_right(labels, self.model.cfg.decoder_start_token_id, pad)
        logits = self.model(
            input_ids=ids.to(self.device), attention_mask=mask.to(self.device), decoder_input_ids=dec.to(self.device)
        ).logits
        logp = F.log_softmax(logits.float(), dim=-1).cpu()
        return [_continuation_score(logp[b, : len(c)], c) for b, c in enumerate(conts)]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        if self.backend != "causal":
            raise HarnessError(
                "rolling log-likelihood (perplexity tasks) needs a decoder or RNN; this model is an encoder-decoder"
            )
        windows, owner = [], []
        for i, (string,) in enumerate(req.args for req in requests):
            for w in map(
                lm_eval_utils.make_disjoint_window,
                lm_eval_utils.get_rolling_token_windows(
                    token_list=self.tok_encode(string),
                    prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length,
                    context_len=1,
                ),
            ):
                windows.append((None, *w))
                owner.append(i)
        totals = [0.0] * len(requests)
        for i, (ll, _) in zip(owner, self._loglikelihood_tokens(windows)):
            totals[i] += ll
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    @torch.no_grad()
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        return [self._generate(context, dict(gen_kwargs)) for context, gen_kwargs in (r.args for r in requests)]

    def _generate(self, context: str, kw: dict) -> str:
        from lm.model.generate import generate

        until = kw.pop("until", None) or []
        until = [until] if isinstance(until, str) else list(until)
        n_new = int(kw.pop("max_gen_toks", self.max_gen_toks))
        sample = bool(kw.pop("do_sample", False))
        temperature = float(kw.pop("temperature", 1.0 if sample else 0.0)) if sample else 0.0
        ids = self.tok_encode(context) or [self.prefix_token_id]
        if self.backend == "causal":
            n_new = max(1, min(n_new, self.max_length - 1))
            ids = ids[-(self.max_length - n_new) :]  # the prompt and its continuation fit the positions
        else:
            ids = ids[-self.max_length :]
            n_new = min(n_new, self.max_length)
        out = generate(
            self.model,
            torch.tensor([ids], device=self.device),
            n_new,
            temperature=temperature,
            top_k=kw.pop("top_k", None),
            top_p=kw.pop("top_p", None),
            stop_token=self.eot_token_id,
        )
        tokens = [t for t in out[0].tolist() if t != self.eot_token_id]
        text = self.tok_decode(tokens)
        for stop in until:
            text = text.split(stop)[0] if stop else text
        return text


def _continuation_score(logp: torch.Tensor, cont: list[int]) -> tuple[float, bool]:
    """(sum of log p(cont), every token the argmax) from the (len(cont), V) log-probs that predict it."""
    target = torch.tensor(cont)
    ll = logp.gather(-1, target[:, None])[:, 0].sum().item()
    return float(ll), bool((logp.argmax(-1) == target).all())


def _pad(rows: list[list[int]], fill: int) -> torch.Tensor:
    """Right-padded (B, T) long tensor."""
    width = max(len(r) for r in rows)
    return torch.tensor([r + [fill] * (width - len(r)) for r in rows], dtype=torch.long)


LOCAL_TASKS = ("local_glue", *(p.stem for p in sorted(TASKS_DIR.glob("local_*.yaml"))))


def task_manager(tasks: Sequence[str] = ()):
    """The harness's task index with lm's offline tasks (lm/eval/tasks/*.yaml) added; ours alone when only
    they are asked for (indexing the harness's ~15,000 task YAMLs takes seconds, more on a cold disk)."""
    from lm_eval.tasks import TaskManager

    ours_only = bool(tasks) and all(t in LOCAL_TASKS for t in tasks)
    return TaskManager(include_path=str(TASKS_DIR), include_defaults=not ours_only)


def refuse_unknown(names: Sequence[str], option: str, index=None, ours: Sequence[str] = LOCAL_TASKS) -> None:
    """HarnessError for a task name nobody registered, naming the closest (`--tasks local_rtee`: did you mean
    local_rte?); the harness says only "not a registered task", and only once the model is loaded and wrapped.
    Without `index` (before the model is loaded, which should not wait for the harness's index: task_manager) only
    the names of lm's own prefix local_ are checked, against `ours`; with it (task_manager's),
    every name, as the harness matches them (a glob such as local_* too)."""
    import difflib
    import fnmatch

    for name in names:
        if index is not None:
            if index.match_tasks([name]):
                continue
            known, what = [*ours, *index.all_tasks], "neither lm nor the harness has a task of that name"
        elif name.startswith("local_") and not fnmatch.filter(ours, name):
            known, what = list(ours), "lm has no task of that name"
        else:
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise HarnessError(f"{option} {name}: {what}{hint} (lm's own: {', '.join(ours)})")


def rolling_tasks(index, names: Sequence[str]) -> list[str]:
    """The tasks among `names` (tags and groups expanded) that the task index says score rolling log-likelihoods
    (perplexity: local_wikitext2), which an encoder-decoder has none of; a task whose type the index does not
    hold is left to the evaluation."""
    found, seen, todo = [], set(), list(names)
    while todo:
        name = todo.pop(0)
        entry = index.task_index.get(name) if name not in seen else None
        seen.add(name)
        if entry is None:
            continue
        cfg = entry.cfg or {}
        if entry.kind.name == "TAG":
            todo += sorted(entry.tags)
        elif entry.kind.name == "GROUP":
            members = cfg.get("task", [])
            todo += [m for m in (members if isinstance(members, list) else [members]) if isinstance(m, str)]
        elif cfg.get("output_type") == "loglikelihood_rolling":
            found.append(name)
    return found


def refuse_unscorable(index, names: Sequence[str], arch: str, option: str) -> None:
    """HarnessError before anything is evaluated when an encoder-decoder is asked for a perplexity task (it would
    fail only after the other tasks, or, in the training loop, after the training); `option` is how the user
    named the tasks (--tasks, train.eval_tasks=)."""
    rolling = rolling_tasks(index, names) if arch == "encoder_decoder" else []
    if rolling:
        rest = ",".join(n for n in names if n not in rolling) or "local_glue"
        fix = f"{option} {rest}" if option.startswith("--") else f"{option}=[{rest}]"
        raise HarnessError(
            f"{', '.join(rolling)} scores rolling log-likelihoods (perplexity), which an encoder-decoder has none "
            f"of (decoders and RNNs do); evaluate the other tasks alone: {fix}"
        )


def evaluate(
    adapter,
    tasks: Sequence[str],
    limit: float | None = None,
    num_fewshot: int | None = None,
    log_samples: bool = False,
    index=None,
) -> dict:
    """lm_eval.simple_evaluate on the adapter; any harness task by name, ours included (`index`: task_manager(tasks)
    when the caller has built it already)."""
    from lm_eval import simple_evaluate

    return simple_evaluate(
        model=adapter,
        tasks=list(tasks),
        limit=limit,
        num_fewshot=num_fewshot,
        task_manager=index or task_manager(tasks),
        log_samples=log_samples,
        bootstrap_iters=0,
        random_seed=0,
        numpy_random_seed=0,
        torch_random_seed=0,
        fewshot_random_seed=0,
    )


def harness_metrics(out: dict) -> dict[str, dict[str, float]]:
    """{task: {metric: value}} from simple_evaluate's results ("acc,none" -> "acc"; stderr and aliases dropped)."""
    table = {}
    for task, metrics in out["results"].items():
        table[task] = {
            k.split(",")[0]: v
            for k, v in metrics.items()
            if isinstance(v, (int, float)) and "_stderr" not in k and "," in k
        }
    return table
