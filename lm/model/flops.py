"""Parameter counts and training FLOPs per token, computed from the config alone.

The model is built on the meta device (no memory, no init), so the count can never drift from
the code. FLOPs follow the PaLM appendix (Chowdhery et al. 2022): 6 FLOPs per matmul parameter
per token (2 forward, 4 backward), plus attention's 12 * L * H * Dh * T for the score and value
products. Matmul parameters exclude embedding lookups (a gather, not a matmul) but include the
output projection, tied or not, since it is a matmul either way. A model/family option's model counts
itself as a MatmulCount (lm/zoo: a model without Stacks has no attention term).

The attention term is 3x each attention module's own forward count (`Score.forward_flops` in
lm/model/scores.py), so every model/attn option is counted as built: multiplicative adds q W,
additive its W1 q, W2 k and v^T tanh(.) over every pair, Linformer scores k rows instead of T and
adds its E K, F V projections. The weights of a score are counted there, not as matmul parameters.
A shared block (model/stack=shared|universal, lm/zoo/sharing.py) holds its parameters once but runs once per
layer: it counts once in num_params and `depth` times in the FLOPs (Narang et al. 2021's Params
and Ops columns differ exactly there). A factorized embedding's r x D projection is a matmul, on
the input side and, tied, again (transposed) on the output side.
"""

import torch
from torch import nn

from lm.model.attention import CrossAttention, _Attention
from lm.model.config import ModelConfig
from lm.model.linear import MatmulCount


def _meta_model(cfg: ModelConfig) -> nn.Module:
    from lm.model import build_model

    with torch.device("meta"):
        return build_model(cfg)


def num_params(cfg: ModelConfig, exclude_embeddings: bool = False) -> int:
    """Unique parameters (a tied output matrix counts once, a shared block once); exclude_embeddings
    drops the token embedding modules' (the whole adaptive input, projections included; the V x r
    table of a factorized one; both tables when an encoder-decoder's stacks have their own)."""
    from lm.model.heads import Embedding

    model = _meta_model(cfg)
    n = sum(p.numel() for p in model.parameters())
    tables = sum(p.numel() for m in model.modules() if isinstance(m, Embedding) for p in m.tok.parameters())
    return n - tables if exclude_embeddings else n


def matmul_params(cfg: ModelConfig) -> int:
    """Weights used in a matmul per token: every nn.Linear weight, counting a tied head again and a
    shared block once per layer that applies it; sparse components count what one token uses
    (lm.model.linear.MatmulCount)."""
    return round(active_matmul_params(_meta_model(cfg)))


def active_matmul_params(module: nn.Module) -> float:
    """A module that is a MatmulCount (lm/model/linear.py) counts itself, with `count` for its parts (MoE:
    the router and top_k experts, not all; product-key memory: its key scores and value reads; Funnel:
    each block times its share of the tokens; the adaptive input: one band's projection per token; the
    mixture of softmaxes: the output matrix once per component); otherwise every nn.Linear weight below it.
    The adaptive softmax counts every cluster once: the full log-probabilities of evaluation and
    generation need them all (training evaluates a tail cluster only for its own tokens)."""
    if isinstance(module, MatmulCount):
        return module.active_matmul_params(active_matmul_params)
    if isinstance(module, nn.Linear):
        return module.weight.numel()
    return sum(active_matmul_params(child) for child in module.children())


def attention_flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    """Training FLOPs of the attention scores and value products: 3 x forward, summed over every
    self- and cross-attention module of every stack (12 * L * H * Dh * T for scaled_dot). A stack says which
    share of the queries and keys each of its layers sees (Stack.attention_shares: a Funnel's pooled blocks
    see fewer); a model without stacks has no attention term."""
    from lm.model.stack import Stack

    total = 0.0
    for stack in (m for m in _meta_model(cfg).modules() if isinstance(m, Stack)):
        # Layer i runs blocks[i % len(blocks)]: a block shared by several layers counts once per layer.
        layers = [stack.blocks[i % len(stack.blocks)] for i in range(stack.depth)]
        for block, (queries, keys) in zip(layers, stack.attention_shares()):
            # every attention module of the block: self, cross, and a prelude's (model/block=evolved)
            for attn in (m for m in block.modules() if isinstance(m, _Attention)):
                total += queries * attn.score.forward_flops(keys * seq_len)
    return round(3 * total)


def flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    """Training FLOPs (forward + backward) per token at context length seq_len: what one token costs passing
    through every stack of the model (an encoder-decoder's token through encoder and decoder alike; its
    training step's cost per token read is encoder_decoder_flops_per_token)."""
    return 6 * matmul_params(cfg) + attention_flops_per_token(cfg, seq_len)


def encoder_decoder_flops_per_token(cfg: ModelConfig, enc_len: int, dec_len: int) -> float:
    """Training FLOPs per token read (encoder and decoder inputs, what the loop's tokens/s counts) of an
    encoder-decoder trained on enc_len encoder and dec_len decoder tokens per sequence (span corruption:
    lm.data.collate.t5_lengths). Each token passes through its own side only: the encoder's matmuls run on the
    enc_len tokens, the decoder's and the head's on the dec_len ones, but for cross-attention's key/value
    projection, which reads the encoder's enc_len outputs, and a shared input table's projection, which reads
    both; attention is enc_len x enc_len in the encoder, dec_len x dec_len (self) and dec_len x enc_len (cross)
    in the decoder. flops_per_token counts every token through both stacks (2.5x T5-small's cost at 512 / 114)."""
    model = _meta_model(cfg)
    encoder, decoder = model.encoder, model.decoder
    encoder_embed = model.encoder_embed  # None: one table for both inputs (model.tie_embeddings)
    enc_only = active_matmul_params(encoder) + (active_matmul_params(encoder_embed) if encoder_embed else 0.0)
    both = active_matmul_params(model.embed) if encoder_embed is None else 0.0  # one table reads both inputs
    on_memory = 0.0  # cross-attention's key/value projections: decoder weights applied to the encoder's outputs
    attention = 0.0
    for stack, q_len in ((encoder, enc_len), (decoder, dec_len)):
        layers = [stack.blocks[i % len(stack.blocks)] for i in range(stack.depth)]
        for block, (queries, keys) in zip(layers, stack.attention_shares()):
            for attn in (m for m in block.modules() if isinstance(m, _Attention)):
                cross = isinstance(attn, CrossAttention)
                on_memory += attn.kv.weight.numel() if cross else 0
                attention += queries * q_len * attn.score.forward_flops(keys * (enc_len if cross else q_len))
    dec_only = active_matmul_params(model) - enc_only - both - on_memory  # decoder and head, on the targets
    matmuls = (enc_only + on_memory) * enc_len + both * (enc_len + dec_len) + dec_only * dec_len
    return (6 * matmuls + 3 * attention) / (enc_len + dec_len)
