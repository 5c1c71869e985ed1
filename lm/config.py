"""Typed config schemas, registered in Hydra's ConfigStore, and their validation.

A choice that changes which class is built is a config group whose options carry `_target_`
(model/norm, model/ffn, model/pos, engine, ...). A choice inside one class is a typed field
here. Validation runs before anything is built and names the field, the value and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

ARCHS = ("decoder", "encoder", "encoder_decoder")
NORM_POSITIONS = ("pre", "post")
INITS = ("gpt2", "normal", "t5", "torch")


class ConfigError(ValueError):
    """A config asks for something impossible; the message names the field and the fix."""


def component(target: str, **hparams: Any) -> dict:
    """A `_partial_` component node, the same shape as the option files in conf/model/*/."""
    return {"_target_": target, "_partial_": True, **hparams}


@dataclass
class ModelConfig:
    """Hyperparameters of one model. The parent (this config) supplies shapes to components.

    `norm`, `ffn` and `pos` are component nodes (`_target_` + own hyperparameters), chosen by the
    config groups model/norm, model/ffn and model/pos.
    """

    arch: str = "decoder"  # decoder | encoder | encoder_decoder
    vocab_size: int = 256
    dim: int = 64
    n_layers: int = 2
    n_decoder_layers: Optional[int] = None  # encoder_decoder only; defaults to n_layers
    n_heads: int = 4
    n_kv_heads: Optional[int] = None  # None = n_heads (MHA); 1 = MQA; in between = GQA
    head_dim: Optional[int] = None  # None = dim // n_heads
    max_seq_len: int = 128
    norm_position: str = "pre"  # pre | post
    norm_eps: float = 1e-5
    bias: bool = True  # biases in attention and feed-forward projections
    ffn_bias: Optional[bool] = None  # biases in the feed-forward projections; None = same as bias (HF Llama mlp_bias)
    qk_norm: bool = False  # normalise q and k per head before the dot product (Dehghani et al. 2023)
    attn_scale: Optional[float] = None  # None = 1/sqrt(head_dim); T5 uses 1.0
    attn_scale_by_layer: bool = False  # also divide layer i's scores by i+1 (HF GPT-2 scale_attn_by_inverse_layer_idx)
    dropout: float = 0.0
    attn_dropout: float = 0.0
    tie_embeddings: bool = True
    scale_embeddings: bool = False  # multiply token embeddings by sqrt(dim) (Vaswani et al. 2017)
    embed_norm: bool = False  # norm after the embeddings (BERT)
    final_norm: bool = True  # norm after the last block (pre-norm stacks need it)
    n_segments: int = 0  # segment (token type) embeddings, BERT uses 2
    mlm_transform: bool = False  # BERT's dense+act+norm before the MLM output layer
    mlm_activation: str = "gelu"  # the activation of that transform (HF BERT uses hidden_act for it)
    logit_scale: float = 1.0  # T5 scales tied outputs by dim**-0.5
    pad_token_id: int = 0
    decoder_start_token_id: int = 0  # encoder_decoder: first decoder input (T5 uses pad)
    init: str = "gpt2"  # gpt2 | normal | t5 | torch
    init_std: float = 0.02
    loss_chunk_size: int = 0  # >0: chunked output projection + cross-entropy (tokens per chunk)
    activation_checkpointing: bool = False
    linear: str = "torch"  # torch (F.linear) | onednn (fp32 CPU matmuls on oneDNN: lm/model/linear.py)
    norm: Any = field(default_factory=lambda: component("lm.model.norms.LayerNorm"))
    ffn: Any = field(default_factory=lambda: component("lm.model.ffn.MLP", activation="gelu"))
    pos: Any = field(default_factory=lambda: component("lm.model.position.Learned"))

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def d_head(self) -> int:
        return self.head_dim or self.dim // self.n_heads

    @property
    def decoder_layers(self) -> int:
        return self.n_decoder_layers or self.n_layers


def conf_dir():
    """The Hydra config directory: lm/conf, a link to the repository's top-level conf/ (a wheel carries
    a copy), so installed and editable packages find the same configs."""
    from pathlib import Path

    return Path(__file__).resolve().parent / "conf"


def compose_model(preset: str = "tiny", overrides: Optional[list] = None):
    """The model node of a preset plus overrides, composed by Hydra as `lm-train model=<preset>` would.

    Overrides use the user grammar relative to the model: ["ffn=swiglu", "dim=128"].
    """
    from hydra import compose, initialize_config_dir

    model_overrides = [f"model/{o}" if "=" in o and "/" not in o.split("=")[0] and o.split("=")[0] in ("norm", "ffn", "pos")
                       else f"model.{o}" for o in (overrides or [])]
    register_configs()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        return compose(config_name=None, overrides=[f"+model={preset}", *model_overrides]).model


@dataclass
class ModelSchema(ModelConfig):
    """The Hydra schema of model presets: component slots start empty and are filled by groups."""

    norm: Any = None
    ffn: Any = None
    pos: Any = None


def register_configs() -> None:
    """Put the schemas in Hydra's ConfigStore (presets list `schema` first in their defaults)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(group="model", name="schema", node=ModelSchema)


def _choice(name: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ConfigError(f"model.{name}={value!r} is not one of {list(allowed)}; set model.{name}=<one of those>")


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or value < 1:
        raise ConfigError(f"model.{name}={value!r} must be a positive integer")


def validate_model(cfg: ModelConfig) -> None:
    """Fail before building when the config cannot make a model; the message names the field."""
    _choice("arch", cfg.arch, ARCHS)
    _choice("norm_position", cfg.norm_position, NORM_POSITIONS)
    _choice("init", cfg.init, INITS)
    for name in ("vocab_size", "dim", "n_layers", "n_heads", "max_seq_len"):
        _positive(name, getattr(cfg, name))
    if cfg.head_dim is None and cfg.dim % cfg.n_heads:
        raise ConfigError(
            f"model.dim={cfg.dim} is not divisible by model.n_heads={cfg.n_heads}; "
            f"choose n_heads among {[h for h in range(1, cfg.dim + 1) if cfg.dim % h == 0]} or set model.head_dim"
        )
    if cfg.n_kv_heads is not None:
        _positive("n_kv_heads", cfg.n_kv_heads)
        if cfg.n_heads % cfg.n_kv_heads:
            raise ConfigError(
                f"model.n_kv_heads={cfg.n_kv_heads} does not divide model.n_heads={cfg.n_heads}; "
                f"allowed: {[k for k in range(1, cfg.n_heads + 1) if cfg.n_heads % k == 0]}"
            )
    if not 0.0 <= cfg.dropout < 1.0 or not 0.0 <= cfg.attn_dropout < 1.0:
        raise ConfigError("model.dropout and model.attn_dropout must be in [0, 1)")
    for slot in ("norm", "ffn", "pos"):
        node = getattr(cfg, slot)
        if not hasattr(node, "get") or not node.get("_target_"):
            raise ConfigError(
                f"model.{slot} has no _target_; pick an option with model/{slot}=<option> "
                f"(see conf/model/{slot}/)"
            )


# -- data (lm/data; owned by the data pipeline) -------------------------------------------------

DATA_FORMATS = ("auto", "text", "jsonl", "parquet", "hf")
DOC_SPLITS = ("file", "line", "blank_line", "regex")
DATA_SPLITS = ("document", "contiguous")


@dataclass
class DataConfig:
    """One prepared dataset: where its text comes from, how it is tokenized, where it is written.

    `lm-train data=<name>` selects conf/data/<name>.yaml; `lm.data.prepare.ensure_prepared(cfg)`
    builds `dir` on first use. Fields left None take the registry corpus' own choice (tiny
    Shakespeare is one document split 90/10 by characters, TinyStories splits on its separator).
    """

    name: str = "custom"
    dir: str = "${oc.env:LM_CACHE,'~/.cache/lm'}/data/${.name}"  # the prepared directory (meta.json marks it done)
    source: Any = None  # registry corpus, file, directory, glob or hf:<dataset>[:<config>]; or a list of these
    val_source: Any = None  # optional sources that form the val split (then `split` applies to none of them)
    mirror: Optional[str] = None  # local copy of registry files; None = $LM_DATA_MIRROR
    format: str = "auto"  # auto (by extension) | text | jsonl | parquet | hf
    text_field: str = "text"  # the field (JSONL) or column (Parquet, hf) that holds the text
    hf_split: str = "train"
    hf_streaming: bool = True
    doc_split: Optional[str] = None  # file | line | blank_line | regex; None = corpus default or line
    doc_separator: Optional[str] = None  # the regex when doc_split=regex
    tokenizer: str = "bpe"  # bpe | unigram | char | path to an existing tokenizer.json
    vocab_size: int = 8192  # bpe/unigram; char uses the corpus' own symbols
    n_sentinels: int = 100  # <extra_id_i> tokens for span corruption
    tokenizer_train_chars: int = 200_000_000  # train the tokenizer on at most this much text of the train split
    split: Optional[str] = None  # document (hash of each document) | contiguous (last val_fraction of the text)
    val_fraction: float = 0.01
    split_seed: int = 0
    append_eos: bool = True  # EOS after every document
    workers: int = 0  # tokenizer processes; 0 = one per CPU core
    shard_tokens: int = 100_000_000
    task_bytes: int = 1 << 20  # text per worker task
    encoding_errors: str = "strict"  # strict | replace (bad UTF-8 bytes -> U+FFFD, counted)
    bad_records: str = "error"  # error | skip (JSONL/Parquet records without text, counted in meta.json)
    # packed loader (lm.data.packed)
    doc_boundaries: bool = False  # also yield doc_ids (B, T) for document-masked attention
    mlm_probability: float = 0.15  # BERT (Devlin et al. 2019)
    noise_density: float = 0.15  # T5 span corruption (Raffel et al. 2020)
    mean_span_length: float = 3.0
    train_stride: Optional[int] = None  # train windows start every this many tokens; None = tile (window - overlap)


def validate_data(cfg: "DataConfig") -> None:
    """Fail before reading any data when the data config cannot work; the message names the field."""
    import re

    def choice(name, allowed):
        value = getattr(cfg, name)
        if value is not None and value not in allowed:
            raise ConfigError(f"data.{name}={value!r} is not one of {list(allowed)}; set data.{name}=<one of those>")

    choice("format", DATA_FORMATS)
    choice("doc_split", DOC_SPLITS)
    choice("split", DATA_SPLITS)
    choice("encoding_errors", ("strict", "replace"))
    choice("bad_records", ("error", "skip"))
    if not 0.0 <= cfg.val_fraction < 1.0:
        raise ConfigError(f"data.val_fraction={cfg.val_fraction} must be in [0, 1)")
    if cfg.doc_split == "regex":
        if not cfg.doc_separator:
            raise ConfigError("data.doc_split=regex needs data.doc_separator=<regex>")
        try:
            pattern = re.compile(cfg.doc_separator)
        except re.error as e:
            raise ConfigError(f"data.doc_separator={cfg.doc_separator!r} is not a regex: {e}") from None
        if pattern.groups or pattern.fullmatch(""):
            raise ConfigError(f"data.doc_separator={cfg.doc_separator!r} must not match the empty string or use "
                              f"capturing groups; write (?:...) for a group")
    for name in ("vocab_size", "shard_tokens", "task_bytes", "tokenizer_train_chars"):
        if not isinstance(getattr(cfg, name), int) or getattr(cfg, name) < 1:
            raise ConfigError(f"data.{name}={getattr(cfg, name)!r} must be a positive integer")
    if cfg.workers < 0 or cfg.n_sentinels < 0:
        raise ConfigError("data.workers and data.n_sentinels must be >= 0")
    if cfg.train_stride is not None and cfg.train_stride < 1:
        raise ConfigError(f"data.train_stride={cfg.train_stride} must be >= 1, or null for windows that tile the text")
    if not 0.0 < cfg.mlm_probability < 1.0 or not 0.0 < cfg.noise_density < 1.0 or cfg.mean_span_length < 1.0:
        raise ConfigError("data.mlm_probability and data.noise_density must be in (0, 1), "
                          "data.mean_span_length >= 1")


# -- training (lm/cli/train.py, loop.py, engine.py, optim.py, checkpoint.py, tracking.py; owned by the engine) --

from typing import List  # noqa: E402 (this section's own import)

PRECISIONS = ("fp32", "bf16", "fp16")
ON_NONFINITE = ("stop", "skip")
SCHEDULES = ("cosine", "linear", "constant", "wsd")
WANDB_MODES = ("online", "offline", "disabled")


@dataclass
class TrainConfig:
    """The training run's single source of truth for batch size, accumulation, clipping and precision.

    Engines (DeepSpeed's JSON included, see conf/engine/) interpolate these; nothing repeats them.
    """

    micro_batch_size: int = 8  # sequences per rank per forward/backward
    grad_accum: int = 1  # micro-steps per optimizer step (derived when global_batch_size is set)
    global_batch_size: Optional[int] = None  # sequences per optimizer step = micro_batch_size * grad_accum * world
    seq_len: int = 128
    max_steps: int = 100
    grad_clip: float = 1.0  # max global gradient norm; 0 disables clipping
    precision: str = "fp32"  # fp32 | bf16 | fp16 (fp16 uses dynamic loss scaling)
    compile: bool = False  # torch.compile the model
    device: str = "auto"  # auto (cuda when available) | cpu | cuda
    log_interval: int = 10  # steps between metrics.jsonl lines
    eval_interval: int = 100  # steps between validation passes; 0 = only at the end
    eval_batches: int = 20  # micro-batches per validation pass (per rank)
    ckpt_interval: int = 100  # steps between checkpoints; 0 = only at the end
    keep_last: int = 3  # checkpoints kept (older ones are deleted once a newer one is complete)
    on_nonfinite: str = "stop"  # stop | skip: what a NaN/inf loss does
    max_nonfinite: int = 10  # consecutive skipped steps before `skip` stops anyway
    peak_flops: Optional[float] = None  # per-device peak FLOP/s for MFU; None = look the GPU up
    world_size: Optional[int] = None  # expected number of processes (asserted); None = what the launcher says
    progress: bool = True  # tqdm bar on rank 0 (only on a terminal)
    threads: Optional[int] = None  # torch intra-op CPU threads per process; None = torch's default (all cores)


@dataclass
class OptimConfig:
    """AdamW (Loshchilov & Hutter 2019); no weight decay on norms, biases, and embeddings unless decay_embeddings."""

    lr: float = 6e-4  # peak learning rate; the schedule multiplies it
    betas: List[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    weight_decay: float = 0.1
    decay_embeddings: bool = False  # True: embedding tables are decayed too (nanoGPT: every matrix)
    fused: Optional[bool] = None  # None = torch's default for the device


@dataclass
class SchedConfig:
    """Learning-rate multiplier as a pure function of the step (lm.core.optim.lr_multiplier)."""

    kind: str = "cosine"  # cosine | linear | constant | wsd (warmup-stable-decay)
    warmup_steps: int = 100  # linear warmup from 0
    min_lr_ratio: float = 0.1  # floor of the decay, as a fraction of optim.lr
    decay_fraction: float = 0.2  # wsd: last fraction of the steps that decays (Hägele et al. 2024)


@dataclass
class LoggerConfig:
    """Dashboards; metrics.jsonl in the run directory is always written and is the source of truth."""

    wandb: bool = False
    tensorboard: bool = False
    project: str = "lm"
    entity: Optional[str] = None
    group: Optional[str] = None
    job_type: str = "pretrain"
    tags: List[str] = field(default_factory=list)
    name: Optional[str] = None  # None = the run directory's name
    mode: Optional[str] = None  # online | offline | disabled; None = online if an API key is configured, else offline


@dataclass
class RunSchema:
    """The top of `conf/train.yaml`: unknown keys anywhere below fail at composition."""

    model: Any = None
    data: Any = None
    engine: Any = None  # an option of conf/engine/ (_target_ = an lm.engine class)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    sched: SchedConfig = field(default_factory=SchedConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    run_dir: str = "runs/${lm.stamp:}${lm.cell:}"  # one per run (per cell of a -m sweep); the same run_dir resumes
    seed: int = 1337
    resume: bool = True  # continue from <run_dir>/checkpoints/latest when it exists


def register_train_configs() -> None:
    """Schemas and resolvers of the training app (conf/train.yaml lists `run_schema` first)."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    register_configs()
    ConfigStore.instance().store(name="run_schema", node=RunSchema)
    if not OmegaConf.has_resolver("lm.stamp"):
        OmegaConf.register_new_resolver("lm.stamp", run_stamp)
        OmegaConf.register_new_resolver("lm.eq", lambda a, b: str(a) == str(b))
        OmegaConf.register_new_resolver("lm.cell", sweep_cell)


def sweep_cell() -> str:
    """"/<job number>" inside a Hydra multirun, "" otherwise: every cell of `lm-train -m ...` gets its own
    run directory under runs/<stamp>/ instead of resuming the previous cell's checkpoints."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return ""
    return f"/{HydraConfig.get().job.num}"


def run_stamp() -> str:
    """A timestamp that every rank agrees on: rank 0's, passed through LM_RUN_STAMP (lm.cli.train sets it)."""
    import os
    import time

    return os.environ.setdefault("LM_RUN_STAMP", time.strftime("%Y-%m-%d_%H-%M-%S"))


def validate_train(cfg: TrainConfig, optim: OptimConfig, sched: SchedConfig) -> None:
    """Fail before anything is built; every message names the field and the fix."""
    def bad(field_name, why):
        raise ConfigError(f"train.{field_name}={getattr(cfg, field_name)!r} {why}")

    for name in ("micro_batch_size", "grad_accum", "seq_len", "max_steps", "log_interval", "eval_batches", "keep_last"):
        if not isinstance(getattr(cfg, name), int) or getattr(cfg, name) < 1:
            bad(name, "must be a positive integer")
    if cfg.precision not in PRECISIONS:
        bad("precision", f"is not one of {list(PRECISIONS)}")
    if cfg.on_nonfinite not in ON_NONFINITE:
        bad("on_nonfinite", f"is not one of {list(ON_NONFINITE)}")
    if cfg.grad_clip < 0:
        bad("grad_clip", "must be >= 0 (0 disables clipping)")
    if cfg.device not in ("auto", "cpu", "cuda"):
        bad("device", "is not one of ['auto', 'cpu', 'cuda']")
    if cfg.threads is not None and cfg.threads < 1:
        bad("threads", "must be a positive integer, or null for torch's default")
    if sched.kind not in SCHEDULES:
        raise ConfigError(f"sched.kind={sched.kind!r} is not one of {list(SCHEDULES)}; pick sched=<one of those>")
    if sched.warmup_steps < 0 or not 0.0 <= sched.min_lr_ratio <= 1.0 or not 0.0 < sched.decay_fraction <= 1.0:
        raise ConfigError("sched.warmup_steps must be >= 0, sched.min_lr_ratio in [0, 1], sched.decay_fraction in (0, 1]")
    if optim.lr <= 0 or len(optim.betas) != 2 or optim.weight_decay < 0:
        raise ConfigError(f"optim: lr={optim.lr} must be > 0, betas={list(optim.betas)} two numbers, "
                          f"weight_decay={optim.weight_decay} >= 0")


def resolve_batch(cfg: TrainConfig, world_size: int) -> int:
    """grad_accum from global_batch_size when that is set; the message says which sizes divide."""
    if cfg.global_batch_size is None:
        return cfg.grad_accum
    per_step = cfg.micro_batch_size * world_size
    if cfg.global_batch_size % per_step:
        ok = [per_step * k for k in range(1, 5)]
        raise ConfigError(
            f"train.global_batch_size={cfg.global_batch_size} is not divisible by train.micro_batch_size "
            f"({cfg.micro_batch_size}) x world size ({world_size}) = {per_step}; use a multiple such as {ok}, "
            f"or change train.micro_batch_size")
    grad_accum = cfg.global_batch_size // per_step
    if cfg.grad_accum not in (1, grad_accum):
        raise ConfigError(
            f"train.grad_accum={cfg.grad_accum} contradicts train.global_batch_size={cfg.global_batch_size} "
            f"(which gives {grad_accum} at world size {world_size}); set only one of them")
    return grad_accum
