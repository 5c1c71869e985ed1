"""Helpers the model tests share."""

import torch


@torch.no_grad()
def greedy_by_recompute(model, prompt: torch.Tensor, arch: str, n: int) -> torch.Tensor:
    """The n greedy continuation tokens of `prompt`, recomputing the whole sequence at every step (no KV
    cache): the reference that cached generation must equal. A decoder continues the prompt itself; an
    encoder-decoder reads it as the source and decodes from token 0."""
    if arch == "decoder":
        seq = prompt
        for _ in range(n):
            seq = torch.cat([seq, model(seq).logits[:, -1:].argmax(-1)], dim=1)
        return seq[:, prompt.shape[1] :]
    dec = torch.zeros(prompt.shape[0], 1, dtype=torch.long)
    for _ in range(n):
        dec = torch.cat([dec, model(prompt, decoder_input_ids=dec).logits[:, -1:].argmax(-1)], dim=1)
    return dec[:, 1:]
