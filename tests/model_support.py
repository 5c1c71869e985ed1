"""Helpers the model tests share."""

import torch

# BERT's layout in our ModelConfig (post-norm, LayerNorm on the embeddings, segment embeddings, the MLM
# head's transform): what lm export maps to BertForMaskedLM
BERT_LAYOUT = dict(
    arch="encoder", norm_position="post", embed_norm=True, final_norm=False, n_segments=2, mlm_transform=True
)


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


# -- Hugging Face parity (tests/test_model_parity.py, tests/test_convert_exact.py) ----------------------------

# a two-layer Llama with GQA and an untied head, as transformers.LlamaConfig fields (vocab_size apart)
TINY_LLAMA = dict(
    hidden_size=32,
    intermediate_size=88,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    tie_word_embeddings=False,
)


def perturb(model, seed: int = 0, scale: float = 0.2):
    """Add noise to every parameter (tied ones once), so biases, norms and embeddings are all non-trivial: zero
    biases and unit norms would hide mapping errors. Returns the model in eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model.eval()


def untie_head(hf):
    """Give an HF model's output layer its own tensor (the T5 v1.1 / Flan layout: transformers 5's T5 ties lm_head
    to the embedding whatever the config says)."""
    head = hf.get_output_embeddings()
    head.weight = torch.nn.Parameter(head.weight.detach().clone())
    return hf


def hf_inputs(vocab: int, seq2seq: bool, seq: int = 12) -> dict:
    """Two rows of ids in [1, vocab), the second right-padded from position 9; T5's decoder ids when seq2seq."""
    g = torch.Generator().manual_seed(1)
    x = torch.randint(1, vocab, (2, seq), generator=g)
    mask = torch.ones_like(x)
    mask[1, 9:] = 0
    kw = {"input_ids": x, "attention_mask": mask}
    if seq2seq:
        kw["decoder_input_ids"] = torch.randint(1, vocab, (2, 7), generator=g)
    return kw


@torch.no_grad()
def eval_logits(model, kw: dict) -> torch.Tensor:
    return model.eval()(**kw).logits


def real_positions(kw: dict, logits: torch.Tensor) -> torch.Tensor:
    """The logits of real tokens: padded query positions are undefined (each implementation fills them differently);
    a seq2seq batch's decoder has no padding."""
    return logits if "decoder_input_ids" in kw else logits[kw["attention_mask"].bool()]
