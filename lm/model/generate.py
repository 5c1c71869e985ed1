"""Autoregressive generation with a KV cache: greedy, temperature, top-k, top-p, stop token.

Works for any model with `new_cache()` and `next_logits(tokens, cache, state)`: DecoderLM
continues the prompt; EncoderDecoderLM encodes the prompt once and decodes from its start token.
A model whose new_cache() is None (model/block=evolved: its convolutions keep no state) is given the
whole sequence at every step instead of the new token: quadratic in the length, the same tokens.
Prompts in one batch must have the same length (no padding), so positions line up.
"""

import torch


def sample_next(
    logits: torch.Tensor,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """(B, V) logits -> (B, 1) token ids. temperature 0 means greedy."""
    if temperature < 0:  # dividing by it would sample the least likely tokens first
        raise ValueError(f"temperature={temperature} must be >= 0 (0 = greedy)")
    if top_p is not None and not 0 <= top_p <= 1:
        raise ValueError(f"top_p={top_p} must be in [0, 1]")
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        # Nucleus sampling (Holtzman et al. 2020): keep the smallest set whose mass reaches top_p.
        sorted_logits, order = logits.sort(-1, descending=True)
        mass_before = sorted_logits.softmax(-1).cumsum(-1) - sorted_logits.softmax(-1)
        drop = mass_before >= top_p
        drop[:, 0] = False  # the most likely token always stays: top_p=0 masked every one and sampled NaN
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)


@torch.no_grad()
def generate(
    model,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop_token: int | None = None,
    attention_mask: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Returns the generated tokens (B, <= max_new_tokens); rows that hit stop_token are padded with it."""
    if model.cfg.arch == "encoder":  # a masked LM (EncoderLM, ELECTRA's) has no next token to predict
        raise ValueError(f"generate needs a decoder or an encoder-decoder; {type(model).__name__} has no next_logits")
    if attention_mask is not None and model.cfg.arch != "encoder_decoder" and not bool(attention_mask.all()):
        # a decoder reads every prompt token: padding would be attended to and shift the positions
        raise ValueError("a decoder's prompts in one batch must have the same length: no padding in attention_mask")
    was_training = model.training
    model.eval()  # no dropout while sampling; the caller's mode comes back after (a probe mid-training)
    try:
        return _decode(
            model, input_ids, max_new_tokens, (temperature, top_k, top_p, generator), stop_token, attention_mask
        )
    finally:
        model.train(was_training)


def _decode(model, input_ids, max_new_tokens: int, sampling: tuple, stop_token, attention_mask) -> torch.Tensor:
    cache = model.new_cache()  # None: a model that keeps no state (model/block=evolved) reads the whole sequence
    if model.cfg.arch == "encoder_decoder":
        state = (model.encode(input_ids, attention_mask), attention_mask)
        tokens = torch.full_like(input_ids[:, :1], model.cfg.decoder_start_token_id)
    else:
        state, tokens = None, input_ids
    seq = tokens  # what the decoder has read so far: its input again at each step when there is no cache
    out, done = [], torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    for _ in range(max_new_tokens):
        nxt = sample_next(model.next_logits(tokens if cache is not None else seq, cache, state), *sampling)
        if stop_token is not None:
            nxt = nxt.masked_fill(done[:, None], stop_token)
            done |= nxt[:, 0] == stop_token
        out.append(nxt)
        tokens = nxt
        seq = seq if cache is not None else torch.cat([seq, nxt], dim=1)
        if stop_token is not None and bool(done.all()):
            break
    return torch.cat(out, dim=1)
