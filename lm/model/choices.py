"""The choices of ModelConfig's own fields (model.arch, model.tie_embeddings, ...): `Choice`
Enums, so a wrong value fails when Hydra composes the config and comparisons with strings keep working.

They live apart from ModelConfig (lm/model/config.py) because the option schemas
(lm/model/options.py) read some of them too (Activation, Arch).
"""

from lm.config_base import Choice


class Arch(Choice):
    decoder = "decoder"
    encoder = "encoder"
    encoder_decoder = "encoder_decoder"


class NormPosition(Choice):
    pre = "pre"
    post = "post"


class Init(Choice):
    gpt2 = "gpt2"
    normal = "normal"
    t5 = "t5"
    torch = "torch"


class LinearKind(Choice):
    auto = "auto"  # onednn where this PyTorch build has it, else torch
    torch = "torch"  # F.linear
    onednn = "onednn"  # fp32 CPU matmuls on oneDNN: lm/model/linear.py


class Activation(Choice):
    relu = "relu"
    gelu = "gelu"
    gelu_tanh = "gelu_tanh"  # GPT-2's "gelu_new"
    silu = "silu"  # swish (Ramachandran et al. 2017)
    elu = "elu"
    selu = "selu"
    sigmoid = "sigmoid"  # gates Dauphin et al. 2017's GLU
    softplus = "softplus"
    linear = "linear"  # identity: gates the bilinear LiGLU (Shazeer 2020)


# -- Narang et al. 2021 (issue #19): tied embeddings -------------------------------


class TieEmbeddings(Choice):
    none = "none"  # encoder input, decoder input and output: three matrices
    decoder_input_output = "decoder_input_output"  # output = decoder input; an encoder has its own table
    encoder_decoder_inputs = "encoder_decoder_inputs"  # one input table for both stacks; output untied
    all = "all"  # one matrix for every table (Vaswani et al. 2017, T5)
