"""The rows of Narang et al. (2021), "Do Transformer Modifications Transfer Across Implementations
and Applications?", Table 1, as data: one line per row, in the paper's order.

Each row is (name, the paper's label, lm train overrides against the vanilla base of
conf/experiment/narang.yaml). `register_narang_rows` stores each row as the config group option
`experiment/narang_row=<name>` (package _global_), so `lm train -m experiment=narang` sweeps the
rows listed in narang.yaml and lm report (lm/report/narang.py) puts them back in this order.

Adding a row once its option exists: one line in ROWS (in the paper's place), and its name in the
sweep list of conf/experiment/narang.yaml.
"""

from __future__ import annotations

from typing import NamedTuple

# Band edges of the adaptive rows: [V/8, V/2] of the experiment's vocabulary (experiment=narang: [512, 2048] of
# 4096 BPE ids; narang_gpu: [4096, 16384] of 32768), quoted so the row's YAML reads each as one interpolation.
BANDS = "['${lm.div:${model.vocab_size},8}','${lm.div:${model.vocab_size},2}']"
# The funnel row's two groups of the encoder's blocks: half of model.n_layers each (experiment=narang: [1, 1];
# narang_gpu: [3, 3]).
HALVES = "['${lm.div:${model.n_layers},2}','${lm.div:${model.n_layers},2}']"
# Rank of the factorized-embedding rows: ALBERT's 128 of 768 is 1/6 of the width; 32 of 128 is the
# nearest power of two at this base's width.
FACTOR_RANK = 32


class Row(NamedTuple):
    name: str  # the option name: experiment/narang_row=<name>
    paper: str  # the row's label in Table 1
    overrides: list[str]  # lm train grammar: `model/ffn=swiglu` picks a group option, `model.x=1` sets a value


ROWS: list[Row] = [
    Row("vanilla", "Vanilla Transformer", []),
    Row("gelu", "GeLU", ["model/ffn=gelu"]),
    Row("swish", "Swish", ["model/ffn=swish"]),
    Row("elu", "ELU", ["model/ffn=elu"]),
    Row("glu", "GLU", ["model/ffn=glu"]),
    Row("geglu", "GeGLU", ["model/ffn=geglu"]),
    Row("reglu", "ReGLU", ["model/ffn=reglu"]),
    Row("selu", "SeLU", ["model/ffn=selu"]),
    Row("swiglu", "SwiGLU", ["model/ffn=swiglu"]),
    Row("liglu", "LiGLU", ["model/ffn=liglu"]),
    Row("sigmoid", "Sigmoid", ["model/ffn=sigmoid"]),
    Row("softplus", "Softplus", ["model/ffn=softplus"]),
    Row("rms_norm", "RMS Norm", ["model/norm=rmsnorm"]),
    Row("rezero", "Rezero", ["model/norm=rezero"]),
    Row("rezero_layernorm", "Rezero + LayerNorm", ["model/norm=rezero_layernorm"]),
    Row("rezero_rmsnorm", "Rezero + RMS Norm", ["model/norm=rezero_rmsnorm"]),
    Row("fixup", "Fixup", ["model/norm=fixup"]),
    # Depth against width at equal parameters: H * L and d_ff = 4 * d_kv * H as in the paper (d_kv = 32 here).
    # At this base's 2 layers per stack only the paper's 2x (24 layers) and 0.5x (6 layers) depths are whole
    # numbers of layers; the 18- and 8-layer rows need the 12-layer base of experiment=narang_depth. These two
    # rows hold the CPU base's shapes, so experiment=narang_gpu leaves them out of its sweep.
    Row(
        "depth_24",
        "24 layers, d_ff = 1536, H = 6",
        [
            "model.n_layers=4",
            "model.n_decoder_layers=4",
            "model.n_heads=2",
            "model.head_dim=32",
            "model.ffn.hidden_dim=256",
        ],
    ),
    Row(
        "depth_6",
        "6 layers, d_ff = 6144, H = 24",
        [
            "model.n_layers=1",
            "model.n_decoder_layers=1",
            "model.n_heads=8",
            "model.head_dim=32",
            "model.ffn.hidden_dim=1024",
        ],
    ),
    Row("block_sharing", "Block sharing", ["model/stack=shared"]),
    Row(
        "block_sharing_factorized",
        "+ Factorized embeddings",
        [
            "model/stack=shared",
            "model/embedding=factorized",
            f"model.embedding.rank={FACTOR_RANK}",
            "model.tie_embeddings=none",
        ],
    ),
    Row(
        "block_sharing_factorized_shared",
        "+ Factorized & shared embeddings",
        ["model/stack=shared", "model/embedding=factorized", f"model.embedding.rank={FACTOR_RANK}"],
    ),
    Row("encoder_block_sharing", "Encoder only block sharing", ["model/stack=shared", "model.stack.share=encoder"]),
    Row("decoder_block_sharing", "Decoder only block sharing", ["model/stack=shared", "model.stack.share=decoder"]),
    # Factorized: each table (encoder input, decoder input, output) its own V x r + r x D pair; shared: one
    # factorized table for all three, as the vanilla base shares its one full table.
    Row(
        "factorized_embedding",
        "Factorized Embedding",
        ["model/embedding=factorized", f"model.embedding.rank={FACTOR_RANK}", "model.tie_embeddings=none"],
    ),
    Row(
        "factorized_shared_embedding",
        "Factorized & shared embeddings",
        ["model/embedding=factorized", f"model.embedding.rank={FACTOR_RANK}"],
    ),
    Row(
        "tied_encoder_decoder_input",
        "Tied encoder/decoder input embeddings",
        ["model.tie_embeddings=encoder_decoder_inputs"],
    ),
    Row(
        "tied_decoder_input_output",
        "Tied decoder input and output embeddings",
        ["model.tie_embeddings=decoder_input_output"],
    ),
    Row("untied_embeddings", "Untied embeddings", ["model.tie_embeddings=none"]),
    Row(
        "adaptive_input",
        "Adaptive input embeddings",
        ["model/embedding=adaptive", f"model.embedding.cutoffs={BANDS}", "model.tie_embeddings=false"],
    ),
    Row(
        "adaptive_softmax",
        "Adaptive softmax",
        ["model/output=adaptive_softmax", f"model.output.cutoffs={BANDS}", "model.tie_embeddings=false"],
    ),
    Row(
        "adaptive_softmax_no_proj",
        "Adaptive softmax without projection",
        [
            "model/output=adaptive_softmax",
            f"model.output.cutoffs={BANDS}",
            "model.tie_embeddings=false",
            "model.output.tail_projection=false",
        ],
    ),
    Row("mixture_of_softmaxes", "Mixture of softmaxes", ["model/output=mixture_of_softmaxes"]),
    Row("transparent_attention", "Transparent attention", ["model/memory=transparent"]),
    # Convolutions replace self-attention and with it the relative position bias (Mesh TF's bias lives in the
    # attention layers): position comes from the causal/centred window alone.
    Row("dynamic_conv", "Dynamic convolution", ["model/attn=dynamic_conv", "model/pos=none"]),
    Row("lightweight_conv", "Lightweight convolution", ["model/attn=lightweight_conv", "model/pos=none"]),
    Row("evolved_transformer", "Evolved Transformer", ["model/block=evolved"]),
    Row("synthesizer_dense", "Synthesizer (dense)", ["model/attn=synthesizer_dense"]),
    Row("synthesizer_dense_plus", "Synthesizer (dense plus)", ["model/attn=synthesizer_dense", "model.attn.mix=plus"]),
    Row(
        "synthesizer_dense_plus_alpha",
        "Synthesizer (dense plus alpha)",
        ["model/attn=synthesizer_dense", "model.attn.mix=plus_alpha"],
    ),
    Row("synthesizer_factorized", "Synthesizer (factorized)", ["model/attn=synthesizer_factorized"]),
    Row("synthesizer_random", "Synthesizer (random)", ["model/attn=synthesizer_random"]),
    Row(
        "synthesizer_random_plus", "Synthesizer (random plus)", ["model/attn=synthesizer_random", "model.attn.mix=plus"]
    ),
    Row(
        "synthesizer_random_plus_alpha",
        "Synthesizer (random plus alpha)",
        ["model/attn=synthesizer_random", "model.attn.mix=plus_alpha"],
    ),
    # One block applied as many times as the base has layers, so Ops equal vanilla's and Params one block's.
    Row("universal_transformer", "Universal Transformer", ["model/stack=universal"]),
    # Experts are the base's ReLU FFN; every block's FFN is routed (8 experts).
    Row("mixture_of_experts", "Mixture of experts", ["model/ffn=moe", "model/ffn@model.ffn.expert=relu"]),
    Row("switch_transformer", "Switch Transformer", ["model/ffn=switch", "model/ffn@model.ffn.expert=relu"]),
    # The encoder's blocks in two equal groups (length halved between them), one full-length block after
    # up-sampling for the decoder's memory. Pooling needs positions added to the embeddings (the relative
    # bias acts inside attention, at lengths pooling changes), so this row uses learned absolute positions. Every
    # position is pooled alike, as in the Mesh TensorFlow code the paper ran (its inputs have no [CLS]) and in the
    # report's runs, saved before model.stack.separate_cls existed.
    Row(
        "funnel_transformer",
        "Funnel Transformer",
        [
            "model/stack=funnel",
            f"model.stack.blocks={HALVES}",
            "model.stack.decoder_layers=1",
            "model/pos=learned",
            "model.stack.separate_cls=false",
        ],
    ),
    Row("weighted_transformer", "Weighted Transformer", ["model/block=weighted"]),
    # The memory replaces the FFN of the second block of each stack.
    Row("product_key_memory", "Product key memory", ["model/block=pkm", "model.block.layers=[1]"]),
]

# The paper's full order (Table 1), so rows added later sort into place and the report can say
# which rows a sweep lacks.
PAPER_ORDER: list[str] = [
    "Vanilla Transformer",
    "GeLU",
    "Swish",
    "ELU",
    "GLU",
    "GeGLU",
    "ReGLU",
    "SeLU",
    "SwiGLU",
    "LiGLU",
    "Sigmoid",
    "Softplus",
    "RMS Norm",
    "Rezero",
    "Rezero + LayerNorm",
    "Rezero + RMS Norm",
    "Fixup",
    "24 layers, d_ff = 1536, H = 6",
    "18 layers, d_ff = 2048, H = 8",
    "8 layers, d_ff = 4608, H = 18",
    "6 layers, d_ff = 6144, H = 24",
    "Block sharing",
    "+ Factorized embeddings",
    "+ Factorized & shared embeddings",
    "Encoder only block sharing",
    "Decoder only block sharing",
    "Factorized Embedding",
    "Factorized & shared embeddings",
    "Tied encoder/decoder input embeddings",
    "Tied decoder input and output embeddings",
    "Untied embeddings",
    "Adaptive input embeddings",
    "Adaptive softmax",
    "Adaptive softmax without projection",
    "Mixture of softmaxes",
    "Transparent attention",
    "Dynamic convolution",
    "Lightweight convolution",
    "Evolved Transformer",
    "Synthesizer (dense)",
    "Synthesizer (dense plus)",
    "Synthesizer (dense plus alpha)",
    "Synthesizer (factorized)",
    "Synthesizer (random)",
    "Synthesizer (random plus)",
    "Synthesizer (random plus alpha)",
    "Universal Transformer",
    "Mixture of experts",
    "Switch Transformer",
    "Funnel Transformer",
    "Weighted Transformer",
    "Product key memory",
]

GROUP = "experiment/narang_row"


def by_name() -> dict[str, Row]:
    return {r.name: r for r in ROWS}


def paper_rank(row: Row) -> int:
    return PAPER_ORDER.index(row.paper) if row.paper in PAPER_ORDER else len(PAPER_ORDER)


def row_node(row: Row) -> dict:
    """A row's overrides as a config node: group picks go in its defaults list, values in the body."""
    defaults: list = []
    body: dict = {}
    for o in row.overrides:
        key, value = o.split("=", 1)
        if "/" in key:
            defaults.append({f"override /{key}": value})
            continue
        node = body
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = _value(value)
    return {"defaults": [*defaults, "_self_"], **body}


def _value(text: str):
    import yaml

    return yaml.safe_load(text)


def register_narang_rows() -> None:
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    for row in ROWS:
        cs.store(group=GROUP, name=row.name, package="_global_", node=row_node(row))


def row_of(label: str) -> Row | None:
    """The row a variant label names (`experiment/narang_row=swiglu`, other overrides ignored)."""
    for part in label.split():
        key, _, value = part.partition("=")
        if key.lstrip("+") == GROUP:
            return by_name().get(value)
    return None
