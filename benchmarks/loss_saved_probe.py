"""What a compiled training step keeps for backward from its loss: the (N, V)-sized tensors the partitioner
saves, with F.cross_entropy (aten) and with lm.model.loss.cross_entropy (ours), on this device.

    python benchmarks/loss_saved_probe.py [--device cuda] [--batch 8]

One GPT-2-shaped layer (vocabulary 50,304, T=1024) under bf16 autocast; the partitioner is inductor's
(min-cut rematerialisation), the kernels are not generated (aot_autograd with a recording compiler).
"""

import argparse

import torch
import torch.nn.functional as F

import lm.model.heads
from lm.constants import IGNORE_INDEX
from lm.model import build_model
from lm.model.config import model_preset


def saved_for_backward(fn, *args, autocast: str = "", **kwargs):
    """(shape, dtype) of every tensor the compiled forward graph of fn(*args, **kwargs) outputs: fn's own
    outputs (a loss, a model's logits), then what the partitioner saves for backward."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    saved = []

    def forward_compiler(gm, _):
        outputs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        saved.extend((tuple(o.meta["val"].shape), o.meta["val"].dtype) for o in outputs
                     if hasattr(o, "meta") and isinstance(o.meta.get("val"), torch.Tensor))
        return make_boxed_func(gm)

    backend = aot_autograd(fw_compiler=forward_compiler, bw_compiler=lambda gm, _: make_boxed_func(gm),
                           partition_fn=min_cut_rematerialization_partition)
    torch._dynamo.reset()
    with torch.autocast(autocast or "cpu", dtype=torch.bfloat16, enabled=bool(autocast)):
        out = torch.compile(fn, backend=backend)(*args, **kwargs)
    (out if isinstance(out, torch.Tensor) else out.loss).backward()
    return saved


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch", type=int, default=8)
    args = p.parse_args()
    torch.manual_seed(0)
    cfg = model_preset("gpt2", ["model.max_seq_len=1024", "model.dropout=0.0", "model.n_layers=1"])
    with torch.device(args.device):
        model = build_model(cfg)
    x = torch.randint(0, cfg.vocab_size, (args.batch, 1025), device=args.device)
    ours = lm.model.heads.cross_entropy
    aten = lambda logits, labels: F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX)  # noqa: E731
    for name, ce in (("aten", aten), ("ours", ours)):
        lm.model.heads.cross_entropy = ce
        # The model itself, compiled as lm-train and gpu_mfu.py compile it: its logits are an output too.
        saved = saved_for_backward(model, input_ids=x[:, :-1], labels=x[:, 1:], autocast=args.device)
        big = [(shape, str(dtype)) for shape, dtype in saved if shape and shape[-1] == cfg.vocab_size]
        print(f"{name}: (..., V) forward outputs (the returned logits, then what backward keeps): {big}", flush=True)
    lm.model.heads.cross_entropy = ours


if __name__ == "__main__":
    main()
