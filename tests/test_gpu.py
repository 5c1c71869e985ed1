"""On a CUDA device: the same numbers as on the CPU, and bf16 training with MFU reported.

Run on a GPU machine with `python -m pytest -m gpu`; skipped elsewhere (tests/conftest.py).
"""

import pytest
import torch

from lm.cli.train import train
from lm.model import build_model
from lm.model.config import model_preset
from tests.engine_support import compose, loaders, metrics, tiny_overrides, train_losses

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("preset", ["tiny", "llama"])
def test_cuda_logits_equal_cpu_logits(preset):
    overrides = ["model.dim=64", "model.n_layers=2", "model.n_heads=4", "model.vocab_size=256", "model.max_seq_len=64"]
    torch.manual_seed(0)
    model = build_model(model_preset(preset, overrides + (["model.n_kv_heads=2"] if preset == "llama" else []))).eval()
    x = torch.randint(0, 256, (2, 64))
    with torch.no_grad():
        cpu = model(input_ids=x).logits
        cuda = model.cuda()(input_ids=x.cuda()).logits.cpu()
    assert torch.allclose(cpu, cuda, atol=1e-4), (cpu - cuda).abs().max()


def test_bf16_training_on_cuda_tracks_fp32_and_reports_mfu(tmp_path):
    common = ["train.device=cuda", "train.peak_flops=1e14"]
    fp32 = tmp_path / "fp32"
    cfg = compose(tiny_overrides(fp32, 8) + common)
    train(cfg, loaders=loaders(cfg))
    bf16 = tmp_path / "bf16"
    cfg = compose(tiny_overrides(bf16, 8, precision="bf16") + common)
    train(cfg, loaders=loaders(cfg))
    a, b = train_losses(fp32), train_losses(bf16)
    assert max(abs(a[s] - b[s]) for s in a) < 0.05
    assert all(0 < m["mfu"] < 1 for m in metrics(bf16) if "mfu" in m)
    assert all(m["memory"] > 0 for m in metrics(bf16) if "memory" in m)
