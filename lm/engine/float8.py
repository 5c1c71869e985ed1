"""train.float8=torchao: float8 training through torchao's convert_to_float8_training, as torchtitan does.

A model transform applied once, before the engine wraps (and compiles) the model: the model's plain Linears
become torchao's Float8Linear, whose matmuls cast inputs, weights and gradients to float8 with dynamic
tensor-wise scales and run on the GPU's float8 tensor cores; the weights themselves stay in their dtype, with the
same names (checkpoints are unchanged). Which Linears qualify is the model's call
(lm.model.linear.float8_eligible: not the output layer). The model code stays single-device PyTorch.

Refused in one line: first by DeepSpeed, which keeps weights of its own (Engine.takes_float8, read before the
rest: no GPU or package would help there); then on anything but a CUDA device of compute capability >= 8.9 (H100,
H200, L40S, RTX 4090), and without torchao (the `kernels` extra).
torchao reports float8 slower than bf16 below ~2k-wide matmuls (torchtitan), so it pays at the 1B scale.
"""

import torch
from torch import nn

from lm.engine.dist import EngineError
from lm.extras import require

OFF = "train.float8=false"


def check(device: torch.device) -> None:
    """Refuse float8 where it cannot run, before anything is built."""
    if device.type != "cuda":  # first: installing torchao would not help here
        raise EngineError(
            f"train.float8=torchao needs a CUDA device (float8 tensor cores), and this run is on "
            f"{device.type}: set {OFF}"
        )
    require("kernels", "train.float8=torchao", "torchao")
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        raise EngineError(
            f"train.float8=torchao needs float8 tensor cores (compute capability >= 8.9: H100, H200, "
            f"L40S); {torch.cuda.get_device_name(device)} has {major}.{minor}: set {OFF}"
        )


def to_float8(model: nn.Module) -> nn.Module:
    """The model with every eligible Linear swapped for torchao's Float8Linear (in place; returned)."""
    # torchao comes with the kernels extra, which CI does not install (check() refused its absence already)
    from torchao.float8 import convert_to_float8_training  # pyright: ignore[reportMissingImports]

    from lm.model.linear import float8_eligible

    return convert_to_float8_training(model, module_filter_fn=lambda module, fqn: float8_eligible(module))
