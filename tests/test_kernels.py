"""model.kernels.* and train.float8 on a CPU (issue 53, item 1): every switch is off by default, is refused in one
line naming the fix where it cannot run (no CUDA, no package, a model option it does not compute), and reaches its
module when on (checked here by pretending CUDA and the packages are there; the numbers are compared with the eager
ops on a GPU in tests/test_kernels_gpu.py)."""

import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import lm.extras
from lm.config import ConfigError
from lm.extras import MissingExtra
from lm.model import build_model
from lm.model.config import ModelConfig, model_from_saved, model_preset
from tests.engine_support import compose, subprocess_env

LLAMA_TINY = [
    "model.dim=64",
    "model.n_layers=2",
    "model.n_heads=4",
    "model.n_kv_heads=2",
    "model.vocab_size=96",
    "model.max_seq_len=32",
]
SWITCHES = [("cross_entropy", "liger"), ("cross_entropy", "cce"), ("norm", "liger"), ("glu", "liger")]


def one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


@pytest.fixture
def installed(monkeypatch):
    """The kernels' packages count as installed, whether or not this machine has them."""
    real = lm.extras._installed
    monkeypatch.setattr(lm.extras, "_installed", lambda m: m in lm.extras.EXTRAS["kernels"] or real(m))


@pytest.fixture
def cuda(monkeypatch, installed):
    """As on a GPU machine with the `kernels` extra: check() lets every switch through (nothing runs a kernel)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def llama(*overrides):
    return model_preset("llama", LLAMA_TINY + list(overrides))


def test_every_switch_is_off_by_default():
    for preset in ("tiny", "gpt2", "llama", "bert", "t5"):
        cfg = model_preset(preset)
        assert cfg.kernels.chosen() == {}, preset
    run = compose(["model=tiny"])
    assert dict(run.model.kernels) == {"cross_entropy": "torch", "norm": "torch", "glu": "torch"}
    assert run.train.float8 is False


@pytest.mark.parametrize("name, kernel", SWITCHES)
def test_a_switch_without_cuda_is_refused_in_one_line(monkeypatch, installed, name, kernel):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError) as e:
        build_model(llama(f"model.kernels.{name}={kernel}"))
    assert one_line(e) == (
        f"model.kernels.{name}={kernel} runs Triton kernels on a CUDA device only, and this "
        f"machine has none: set model.kernels.{name}=torch (the default)"
    )


@pytest.mark.parametrize("name, kernel", SWITCHES)
def test_a_switch_without_its_package_names_the_extra(monkeypatch, name, kernel):
    package = {"liger": "liger_kernel", "cce": "cut_cross_entropy"}[kernel]
    monkeypatch.setitem(sys.modules, package, None)  # as if not installed
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # on a CPU the device is refused first
    with pytest.raises(MissingExtra) as e:
        build_model(llama(f"model.kernels.{name}={kernel}"))
    assert one_line(e) == (
        f"model.kernels.{name}={kernel} needs {package} (not installed): pip install "
        f"'lm[kernels]', or set model.kernels.{name}=torch"
    )


def test_lm_train_refuses_a_kernel_on_the_cpu_in_one_line(tmp_path):
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "lm.cli.train",
            "model=tiny",
            "data=shakespeare_char",
            "train.device=cpu",
            "train.max_steps=1",
            "model.kernels.norm=liger",
            f"run_dir={tmp_path / 'r'}",
        ],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=300,
    )
    said = p.stdout + p.stderr  # Hydra's app prints the error on stdout
    assert p.returncode == 1 and "Traceback" not in said, said[-2000:]
    assert (
        said.strip()
        .splitlines()[-1]
        .endswith(
            "model.kernels.norm=liger runs Triton kernels on a CUDA device "
            "only, and this machine has none: set model.kernels.norm=torch "
            "(the default)"
        )
    )
    assert not (tmp_path / "r" / "checkpoints").exists()


@pytest.mark.parametrize(
    "overrides, says",
    [
        (["model/norm=fixup", "model.kernels.norm=liger"], "model/norm=layernorm|rmsnorm only, not model/norm=fixup"),
        (["model/ffn=gelu", "model.kernels.glu=liger"], "model/ffn=swiglu|glu only, not model/ffn=gelu"),
        (["model/ffn=geglu", "model.kernels.glu=liger"], "set model.ffn.activation=gelu_tanh"),
        (["model.loss_chunk_size=64", "model.kernels.cross_entropy=liger"], "set model.loss_chunk_size=0"),
        (
            ["model/output=adaptive_softmax", "model.tie_embeddings=false", "model.kernels.cross_entropy=cce"],
            "model/output=adaptive_softmax does not use",
        ),
    ],
)
def test_a_switch_the_model_does_not_use_is_refused(cuda, overrides, says):
    with pytest.raises(ConfigError) as e:
        build_model(llama(*overrides))
    assert says in one_line(e)


def test_cce_refuses_an_encoders_biased_output_layer_and_liger_takes_it(cuda):
    with pytest.raises(ConfigError, match="an encoder's masked-LM output layer has one"):
        build_model(
            model_preset(
                "bert", ["model.dim=64", "model.n_layers=1", "model.n_heads=4", "model.kernels.cross_entropy=cce"]
            )
        )
    model = build_model(
        model_preset(
            "bert", ["model.dim=64", "model.n_layers=1", "model.n_heads=4", "model.kernels.cross_entropy=liger"]
        )
    )
    assert model.head.loss_kernel == "liger" and model.head.proj.bias is not None


def test_a_recurrent_model_refuses_kernels():
    with pytest.raises(ConfigError, match="kernels"):
        build_model(model_preset("lstm", ["model.kernels.norm=liger"]))


def test_the_module_switches_reach_their_modules_with_the_same_weights(cuda):
    from lm.model.ffn import GLU
    from lm.model.kernels import LigerGLU, LigerLayerNorm, LigerRMSNorm
    from lm.model.norms import LayerNorm, RMSNorm

    torch.manual_seed(0)
    eager = build_model(llama())
    torch.manual_seed(0)
    fused = build_model(llama("model.kernels.norm=liger", "model.kernels.glu=liger", "model.qk_norm=true"))
    kinds = {type(m) for m in fused.modules()}
    assert {LigerRMSNorm, LigerGLU} <= kinds and not {RMSNorm, GLU} & kinds
    norms = [m for m in fused.modules() if isinstance(m, RMSNorm)]
    assert all(type(m) is LigerRMSNorm for m in norms) and len(norms) == 2 * 2 + 1 + 2 * 2  # blocks, final, q/k
    with_qk = build_model(llama("model.qk_norm=true"))
    assert fused.state_dict().keys() == with_qk.state_dict().keys()
    fused_plain = build_model(llama("model.kernels.norm=liger", "model.kernels.glu=liger"))
    fused_plain.load_state_dict(eager.state_dict())  # the same names and shapes: checkpoints move freely
    gpt = build_model(model_preset("tiny", ["model.kernels.norm=liger"]))
    assert {type(m) for m in gpt.modules() if isinstance(m, LayerNorm)} == {LigerLayerNorm}
    assert eager.head.loss_kernel == "torch"


def test_a_fused_module_refuses_cpu_tensors_in_one_line(cuda):
    model = build_model(llama("model.kernels.norm=liger"))
    with pytest.raises(ConfigError) as e:
        model(input_ids=torch.zeros(1, 4, dtype=torch.long))
    assert one_line(e) == (
        "model.kernels.norm=liger runs on a CUDA device only, and this run's tensors are on cpu: "
        "set model.kernels.norm=torch, or train on a GPU"
    )


@pytest.mark.parametrize("kernel", ["liger", "cce"])
def test_the_cross_entropy_switch_hands_the_hidden_states_and_weight_to_the_kernel(cuda, monkeypatch, kernel):
    """The output layer's weight (tied or not), its hidden states and the labels reach the kernel, which returns the
    loss; the eager model's loss on the same weights is what the kernel must equal (tests/test_kernels_gpu.py)."""
    import lm.model.kernels

    calls = []

    def eager_fused(k, h, weight, bias, labels):  # what the kernel computes, in eager ops
        calls.append((k, h.shape, weight.data_ptr()))
        logits = F.linear(h.reshape(-1, h.shape[-1]), weight, bias)
        return F.cross_entropy(logits.float(), labels.reshape(-1), ignore_index=-100)

    monkeypatch.setattr(lm.model.kernels, "fused_linear_cross_entropy", eager_fused)
    for preset, extra in (("llama", LLAMA_TINY), ("tiny", [])):
        torch.manual_seed(0)
        eager = build_model(model_preset(preset, extra))
        fused = build_model(model_preset(preset, extra + [f"model.kernels.cross_entropy={kernel}"]))
        fused.load_state_dict(eager.state_dict())
        x = torch.randint(0, eager.cfg.vocab_size, (2, 8))
        y = x.roll(-1, 1)
        y[0, :3] = -100
        out = fused(input_ids=x, labels=y)
        assert out.logits is None and torch.allclose(out.loss, eager(input_ids=x, labels=y).loss, atol=1e-6)
        assert calls[-1] == (kernel, (2, 8, eager.cfg.dim), fused.head.proj.weight.data_ptr())
        assert fused(input_ids=x).logits.shape == (2, 8, eager.cfg.vocab_size)  # no labels: the logits as always
    if kernel == "liger":  # tied (tiny): the kernel reads the token table itself
        assert fused.head.proj.weight is fused.embed.tok.weight


def test_a_saved_model_loads_with_the_eager_ops():
    """Kernels say how a run computed, not what: a GPU run's saved model is read back on a CPU (lm finetune init=)."""
    from dataclasses import asdict

    from omegaconf import OmegaConf

    saved = OmegaConf.create(asdict(ModelConfig()))
    saved.kernels = {"cross_entropy": "cce", "norm": "liger", "glu": "liger"}
    assert model_from_saved(saved).kernels.chosen() == {}


# -- train.float8 -----------------------------------------------------------------------------------


def test_float8_takes_false_or_torchao():
    from lm.core.config import OptimConfig, SchedConfig, TrainConfig, validate_train

    validate_train(TrainConfig(float8="torchao"), OptimConfig(), SchedConfig())
    with pytest.raises(ConfigError) as e:
        validate_train(TrainConfig(float8=True), OptimConfig(), SchedConfig())
    assert (
        one_line(e) == "train.float8=True is not one of false, torchao (float8 matmuls from torchao: "
        "train.float8=torchao)"
    )
    assert compose(["model=tiny", "train.float8=torchao"]).train.float8 == "torchao"


def _engine(float8, device="cpu"):
    from lm.core.config import TrainConfig
    from lm.engine import Dist, SingleEngine

    return SingleEngine(
        TrainConfig(float8=float8), Dist(rank=0, world_size=1, local_rank=0, device=torch.device(device))
    )


def test_float8_on_a_cpu_is_refused_in_one_line(installed):
    from lm.engine.dist import EngineError

    with pytest.raises(EngineError) as e:
        _engine("torchao")
    assert (
        one_line(e) == "train.float8=torchao needs a CUDA device (float8 tensor cores), and this run is on cpu: "
        "set train.float8=false"
    )
    assert not hasattr(_engine(False), "module")  # float8 off: built (set by wrap(), not yet called)


def test_float8_without_torchao_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao", None)
    with pytest.raises(MissingExtra) as e:
        _engine("torchao", "cuda")  # on a CPU the device is refused first: installing would not help there
    assert one_line(e) == "train.float8=torchao needs torchao (not installed): pip install 'lm[kernels]'"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_deepspeed_refuses_float8_before_the_device_or_the_extra(device, monkeypatch):
    """ZeRO with float8 is refused for what it is, first: the device's or torchao's refusal would send the user to
    a GPU or to pip install, after which this one would still come."""
    from lm.core.config import TrainConfig
    from lm.engine import Dist
    from lm.engine.dist import EngineError
    from lm.engine.ds import DeepSpeedEngine

    monkeypatch.setitem(sys.modules, "torchao", None)
    dist = Dist(rank=0, world_size=1, local_rank=0, device=torch.device(device))
    with pytest.raises(EngineError) as e:
        DeepSpeedEngine(TrainConfig(float8="torchao"), dist, config={"zero_optimization": {"stage": 1}})
    assert one_line(e) == (
        "train.float8=torchao swaps the model's Linears before the engine wraps it, and DeepSpeedEngine keeps "
        "weights of its own: use engine=single, ddp or fsdp2, or train.float8=false"
    )


def test_float8_converts_the_blocks_linears_and_keeps_the_output_layer():
    from lm.model.heads import OutputLinear
    from lm.model.linear import Linear, float8_eligible

    model = build_model(llama())
    eligible = [m for m in model.modules() if float8_eligible(m)]
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    # per block: the fused q/k/v, the attention output, the FFN's gate-up and down; the 64 x 96 output layer is not
    assert (
        len(eligible) == 2 * 4 and len(linears) == 2 * 4 + 1 and not any(isinstance(m, OutputLinear) for m in eligible)
    )
    assert not float8_eligible(Linear(64, 24)) and float8_eligible(Linear(64, 32))


def test_the_gpu_script_is_valid_bash_and_refuses_an_out_it_cannot_make():
    import pathlib

    script = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_kernels.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    p = subprocess.run(["bash", str(script), "--dry-run", "/dev/null/x"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2  # OUT must be a directory it can make: refused before any part runs


@pytest.mark.slow
def test_the_gpu_script_dry_run_starts_every_command_of_its_parts(tmp_path):
    """benchmarks/gpu_kernels.sh --dry-run on the CPU: the GPU tests collect (and skip), each gpu_mfu.py command
    composes and runs at tiny shapes, and each kernel or float8 command ends in its one-line CUDA refusal."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    p = subprocess.run(
        ["bash", "benchmarks/gpu_kernels.sh", "--dry-run", str(tmp_path / "out")],
        cwd=root,
        capture_output=True,
        text=True,
        env=subprocess_env(PARTS="tests gpt2 llama"),
        timeout=1500,
    )
    assert p.returncode == 0 and p.stdout.strip().endswith("dry-run: every part starts"), p.stdout[-3000:]
    assert p.stdout.count("dry-run ok") == 1 + 5 + 2
    rows = (tmp_path / "out" / "rows.jsonl").read_text().splitlines()
    assert [json.loads(r)["preset"] for r in rows] == ["gpt2", "llama"]
