"""model.kernels: fused CUDA kernels from well-kept libraries in place of eager ops (the `kernels` extra).

Each switch of model.kernels (lm/model/options.py's KernelsConfig) swaps one op and nothing else:
- cross_entropy=liger|cce: the output layer and its cross-entropy in one op that never writes the (B*T, V)
  logits (Liger-Kernel's fused linear cross-entropy; Apple's Cut Cross-Entropy, Wijmans et al. 2024);
- norm=liger: Liger-Kernel's Triton LayerNorm / RMSNorm (subclasses of lm's, so the weights keep their names);
- glu=liger: Liger-Kernel's SwiGLU / GeGLU product, read straight from the GLU's stacked gate-up output.
The modules keep lm's parameters and state-dict keys: a checkpoint moves between kernels and eager ops freely.
They are Triton kernels: CUDA only. `check` refuses them, in one line naming the fix, on a machine without
CUDA, without the package, or with a model option they do not compute; a module also refuses a CPU tensor
(train.device=cpu on a GPU machine). tests/test_kernels.py checks the refusals and that each switch reaches its
module; tests/test_kernels_gpu.py compares each kernel with the eager op, forward and gradients, on a GPU.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from lm.config_base import ConfigError
from lm.constants import IGNORE_INDEX
from lm.model.ffn import GLU
from lm.model.loss import target_mean
from lm.model.norms import LayerNorm, RMSNorm

if TYPE_CHECKING:
    from lm.model.config import ModelConfig

# The package each kernel comes from (its import name; pyproject.toml's `kernels` extra installs them all).
PACKAGES = {"liger": "liger_kernel", "cce": "cut_cross_entropy"}

# The eager modules each switch replaces, by the option's _target_ (build_model swaps the target it instantiates).
SWAPS = {
    "norm": {
        "lm.model.norms.LayerNorm": "lm.model.kernels.LigerLayerNorm",
        "lm.model.norms.RMSNorm": "lm.model.kernels.LigerRMSNorm",
    },
    "glu": {"lm.model.ffn.GLU": "lm.model.kernels.LigerGLU"},
}
SLOT_OF = {"norm": "norm", "glu": "ffn"}  # the model slot each module switch fills
GLU_ACTIVATIONS = ("silu", "gelu_tanh")  # what Liger's kernels compute: SwiGLU and GeGLU with tanh-approximate GELU


def _setting(name: str, cfg: ModelConfig) -> str:
    return f"model.kernels.{name}={getattr(cfg.kernels, name).value}"


def check(cfg: ModelConfig) -> None:
    """Refuse, before anything is built, a switch that cannot run here or does not apply to the model."""
    from lm.extras import MissingExtra, missing

    for name, kernel in cfg.kernels.chosen().items():
        setting, off = _setting(name, cfg), f"model.kernels.{name}=torch"
        if not torch.cuda.is_available():  # first: installing the extra would not help here
            raise ConfigError(
                f"{setting} runs Triton kernels on a CUDA device only, and this machine has none: "
                f"set {off} (the default)"
            )
        if missing("kernels", [PACKAGES[kernel]]):
            raise MissingExtra(
                f"{setting} needs {PACKAGES[kernel]} (not installed): pip install 'lm[kernels]', or set {off}"
            )
        _check_applies(name, kernel, cfg, setting, off)


def _check_applies(name: str, kernel: str, cfg: ModelConfig, setting: str, off: str) -> None:
    from lm.model.options import option_name

    if name == "cross_entropy":
        if cfg.output is not None or cfg.family is not None:
            what = (
                f"model/family={option_name(cfg.family)} (its loss is its own)"
                if cfg.family is not None
                else f"model/output={option_name(cfg.output)}"
            )
            raise ConfigError(
                f"{setting} fuses the plain softmax output layer with its loss, which {what} does not use: set {off}"
            )
        if cfg.loss_chunk_size:
            raise ConfigError(
                f"{setting} replaces model.loss_chunk_size's chunked loss: set model.loss_chunk_size=0 (or {off})"
            )
        if kernel == "cce" and cfg.arch == "encoder":
            raise ConfigError(
                f"{setting} has no bias term, and an encoder's masked-LM output layer has one (BERT's): "
                f"set model.kernels.cross_entropy=liger (or torch)"
            )
        return
    slot = getattr(cfg, SLOT_OF[name])
    if slot._target_ not in SWAPS[name]:
        raise ConfigError(
            f"{setting} has kernels for model/{SLOT_OF[name]}="
            f"{'layernorm|rmsnorm' if name == 'norm' else 'swiglu|glu'} only, not "
            f"model/{SLOT_OF[name]}={option_name(slot)}: set {off}"
        )
    if name == "glu" and slot.activation not in GLU_ACTIVATIONS:
        raise ConfigError(
            f"{setting} computes SwiGLU (silu) and GeGLU with tanh-approximate GELU, not "
            f"model.ffn.activation={slot.activation.value}: set model.ffn.activation=gelu_tanh "
            f"(or silu), or {off}"
        )


def swap(name: str, node, cfg: ModelConfig):
    """The slot's option node as build_model instantiates it: the fused module's target when model.kernels.<name>
    is on (check() has made sure it has one)."""
    if getattr(cfg.kernels, name) == "torch":
        return node
    return replace(node, _target_=SWAPS[name][node._target_])


def _on_cuda(x: torch.Tensor, name: str) -> None:
    if x.device.type != "cuda":
        raise ConfigError(
            f"model.kernels.{name}=liger runs on a CUDA device only, and this run's tensors are on "
            f"{x.device.type}: set model.kernels.{name}=torch, or train on a GPU"
        )


class LigerLayerNorm(LayerNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _on_cuda(x, "norm")
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction

        # Liger's kernel always adds a bias: a bias-free LayerNorm adds zeros (no gradient is computed for them).
        bias = self.bias if self.bias is not None else torch.zeros_like(self.weight)
        return LigerLayerNormFunction.apply(x, self.weight, bias, self.eps)


class LigerRMSNorm(RMSNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _on_cuda(x, "norm")
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        # casting_mode="llama": normalise in fp32, cast to x's dtype, then scale by the weight, as RMSNorm.forward;
        # not in place: x is the residual stream, which the block adds to afterwards.
        return LigerRMSNormFunction.apply(x, self.weight, self.eps, 0.0, "llama", False)


class LigerGLU(GLU):
    def __init__(self, dim: int, activation: str = "silu", **kw):
        super().__init__(dim, activation=activation, **kw)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _on_cuda(x, "glu")
        gate_up = self.gate_up(x)  # (B, T, 2*hidden): gate then up, as GLU.forward chunks it
        if self.activation == "silu":
            from liger_kernel.ops.swiglu import LigerFusedGateUpSiLUMulFunction

            h = LigerFusedGateUpSiLUMulFunction.apply(gate_up)  # reads both halves in place: no chunk copies
        else:
            from liger_kernel.ops.geglu import LigerGELUMulFunction

            h = LigerGELUMulFunction.apply(*gate_up.chunk(2, dim=-1))
        return self.down(self.dropout(h))


def fused_linear_cross_entropy(
    kernel: str, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor
) -> torch.Tensor:
    """Mean cross-entropy of softmax(h W^T + b) over the labels that are not IGNORE_INDEX, without the logits.
    h (..., D), labels (...)."""
    _on_cuda(h, "cross_entropy")
    h2, target = h.reshape(-1, h.shape[-1]), labels.reshape(-1)  # (N, D), (N,)
    if kernel == "liger":
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

        # Gradients of the fp32 master weight accumulate in fp32 across chunks, as lm/model/loss.py's do. Its mean
        # divides each row by the target count inside the kernel and skips ignored rows: no targets give 0, not NaN.
        return liger_fused_linear_cross_entropy(
            h2, weight, target, bias=bias, ignore_index=IGNORE_INDEX, accum_dtype=torch.float32
        )
    from cut_cross_entropy import linear_cross_entropy

    # Cut Cross-Entropy's kernels read one dtype for both operands and no autocast casts reach them: cast to
    # autocast's dtype as an autocast matmul would. It has no bias term: check() refuses the encoder's biased head.
    assert bias is None, "model.kernels.cross_entropy=cce with an output bias (check() refuses it)"
    dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else h.dtype
    # Summed, then / the target count (not below 1): no targets give 0, as every loss of the model's does (target_mean).
    summed = linear_cross_entropy(h2.to(dtype), weight.to(dtype), target, ignore_index=IGNORE_INDEX, reduction="sum")
    return target_mean(summed.float(), target)
