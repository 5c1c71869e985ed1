"""Every option file and preset composes with Hydra, builds, runs forward/backward, and learns."""

import re
from pathlib import Path

import pytest
import torch

from lm.config import ConfigError, conf_dir
from lm.model import build_model
from lm.model.config import MLPConfig, ModelConfig, model_from_saved, model_preset, options
from lm.model.flops import flops_per_token, matmul_params, num_params

OPTIONS = [
    (slot, p.stem) for slot in ("norm", "ffn", "pos") for p in sorted((conf_dir() / "model" / slot).glob("*.yaml"))
]
PRESETS = sorted(p.stem for p in (conf_dir() / "model").glob("*.yaml"))


def _batch(cfg, B=2, T=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(1, cfg.vocab_size, (B, T), generator=g)
    if cfg.arch == "encoder_decoder":
        return {"input_ids": x, "labels": torch.randint(1, cfg.vocab_size, (B, T // 2), generator=g)}
    return {"input_ids": x, "labels": torch.roll(x, -1, dims=1)}


def test_every_option_and_preset_is_tested():
    # norm: 2 + rezero, rezero_layernorm, rezero_rmsnorm, fixup; ffn: 6 dense + moe, switch + swish, elu, selu,
    # sigmoid, softplus, glu, liglu; pos: 6 schemes + rope_linear, rope_dynamic, rope_llama3
    assert len(OPTIONS) == 6 + 15 + 9, OPTIONS
    assert set(PRESETS) >= {"tiny", "transformer", "gpt2", "llama", "bert", "t5"}


# Options that start slower and get 60 steps: without a norm (rezero, fixup) the residual stream starts
# at the embeddings' 0.02 scale and every branch at zero; sigmoid and softplus are not zero-centred
# (Narang et al. 2021 find both rows worse than ReLU too). Each halves its loss by step 60.
SLOW_STARTERS = {"fixup": 60, "rezero": 60, "sigmoid": 60, "softplus": 60}


@pytest.mark.parametrize("slot,option", OPTIONS)
def test_option_trains_a_tiny_model(slot, option):
    """Each option composes into the tiny preset, and 30 AdamW steps lower the loss on a fixed batch."""
    cfg = model_preset("tiny", [f"model/{slot}={option}", "model.vocab_size=64", "model.dim=48", "model.n_heads=4"])
    torch.manual_seed(0)
    model = build_model(cfg)
    batch = _batch(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(SLOW_STARTERS.get(option, 30)):
        loss = model(**batch).loss
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    assert loss.item() < 0.5 * first, (first, loss.item())


# Full-size forward/backward costs seconds; Llama's 1.1B is run at 2 layers (its full size is
# built on the meta device and counted below).
PRESET_DEPTH = {"llama": ["model.n_layers=2"]}


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_builds_and_runs_forward_backward(preset):
    cfg = model_preset(preset, PRESET_DEPTH.get(preset, []))
    model = build_model(cfg)
    out = model(**_batch(cfg, B=1, T=8))
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert model.embed.tok.weight.grad is not None


@pytest.mark.parametrize(
    "preset,millions", [("gpt2", 124.48), ("bert", 109.51), ("t5", 60.51), ("llama", 1100.05), ("transformer", 63.08)]
)
def test_preset_parameter_counts(preset, millions):
    # gpt2 124.4M at vocab 50257 (+0.04M padding to 50304); bert-base 109.5M; t5-small 60.5M; TinyLlama 1.1B.
    assert num_params(model_preset(preset)) / 1e6 == pytest.approx(millions, abs=0.01)


def test_num_params_matches_the_built_model():
    for preset, over in [
        ("tiny", []),
        ("tiny", ["model/ffn=swiglu", "model.n_kv_heads=2", "model.tie_embeddings=false"]),
    ]:
        cfg = model_preset(preset, over)
        assert num_params(cfg) == sum(p.numel() for p in build_model(cfg).parameters())


@pytest.mark.parametrize("glu", ["swiglu", "geglu", "reglu"])
@pytest.mark.parametrize("mlp", ["relu", "gelu"])
def test_glu_variants_are_parameter_matched(glu, mlp):
    base = ["model.dim=96", "model.bias=false"]  # 8/3 * 96 = 256 exactly
    a = num_params(model_preset("tiny", base + [f"model/ffn={mlp}"]))
    b = num_params(model_preset("tiny", base + [f"model/ffn={glu}"]))
    assert a == b
    # With bias the GLU has one more hidden-size bias vector per layer.
    cfg = model_preset("tiny", ["model.dim=96", f"model/ffn={glu}"])
    ffn = build_model(cfg).decoder.blocks[0].ffn
    assert ffn.gate_up.out_features == 2 * 256


def test_gqa_and_mqa_shrink_only_the_key_value_projections():
    d, h = 64, 8
    counts = {
        kv: num_params(
            model_preset("tiny", [f"model.dim={d}", f"model.n_heads={h}", f"model.n_kv_heads={kv}", "model.bias=false"])
        )
        for kv in (8, 2, 1)
    }
    head_dim = d // h
    for kv in (2, 1):
        assert counts[8] - counts[kv] == 2 * 2 * d * (h - kv) * head_dim  # 2 layers x (k and v)


def test_flops_per_token_follows_the_palm_formula():
    cfg = model_preset("gpt2")
    n = matmul_params(cfg)
    per_layer = 768 * 3 * 768 + 768 * 768 + 2 * 768 * 3072  # qkv, attention out, MLP up and down
    assert n == 12 * per_layer + 50304 * 768  # plus the (tied) output projection
    assert flops_per_token(cfg, 1024) == 6 * n + 12 * 12 * 12 * 64 * 1024


@pytest.mark.parametrize(
    "override,field",
    [
        (["model.dim=100", "model.n_heads=3"], "model.dim=100 is not divisible by model.n_heads=3"),
        (["model.n_kv_heads=3"], "model.n_kv_heads=3 does not divide model.n_heads=4"),
    ],
)
def test_impossible_models_fail_at_build_time(override, field):
    with pytest.raises(ConfigError, match=field):
        build_model(model_preset("tiny", override))


@pytest.mark.parametrize(
    "override,message",
    [
        ("model.norm_position=middle", "model.norm_position: Invalid value 'middle', expected one of [pre, post]"),
        (
            "model.arch=lstm",
            "model.arch: Invalid value 'lstm', expected one of [decoder, encoder, encoder_decoder]",
        ),
        ("model.init=xavier", "model.init: Invalid value 'xavier', expected one of [gpt2, normal, t5, torch]"),
        (
            "model.ffn.activation=bogus",
            "model.ffn.activation: Invalid value 'bogus', expected one of "
            "[relu, gelu, gelu_tanh, silu, elu, selu, sigmoid, softplus, linear]",
        ),
        ("model.linear=mkl", "model.linear: Invalid value 'mkl', expected one of [auto, torch, onednn]"),
        ("model.pos.theta=wide", "model.pos.theta: Value 'wide' of type 'str' could not be converted to Float"),
    ],
)
def test_wrong_choices_and_types_fail_at_composition(override, message):
    """Enums and typed component options: Hydra rejects the value while composing, naming field and choices."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        model_preset("tiny", ["model/pos=rope", override])


def test_unknown_field_and_wrong_type_are_named():
    with pytest.raises(ConfigError, match="n_layer"):
        model_preset("tiny", ["model.n_layer=3"])
    with pytest.raises(ConfigError, match="model.ffn.theta"):  # theta belongs to model/pos=rope, not to an FFN
        model_preset("tiny", ["model.ffn.theta=3"])
    with pytest.raises(ConfigError, match="n_layer"):
        model_from_saved({"n_layer": 3})
    with pytest.raises(ConfigError, match="dim"):
        model_from_saved({"dim": "wide"})


def test_saved_config_round_trips_to_the_same_typed_model():
    """A run's config.yaml (plain dicts, components named by _target_) comes back as the same dataclasses."""
    from dataclasses import asdict

    from omegaconf import OmegaConf

    cfg = model_preset("llama", ["model.n_layers=2"])
    saved = OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True)
    again = model_from_saved(saved)
    assert type(again.ffn) is type(cfg.ffn) and again.ffn.multiple_of == 256
    assert asdict(again) == asdict(cfg)


def test_every_component_option_has_a_schema_and_a_file():
    """An option is one dataclass (lm/model/options.py) plus one YAML file listing it as its schema."""
    for slot in ("norm", "ffn", "pos"):
        files = {p.stem: p.read_text() for p in (conf_dir() / "model" / slot).glob("*.yaml")}
        for cls in (c for c in options(slot) if c.__module__ == "lm.model.options"):
            name = cls.__name__.removesuffix("Config").lower() + "_schema"
            assert any(name in text for text in files.values()), (slot, cls)
        assert all("_schema" in text for text in files.values()), slot


def test_lm_model_config_stays_the_one_import_path():
    """lm/model/config.py re-exports every public name defined in the modules it was split into (choices,
    options): callers, tests and pickled configs import them from lm.model.config. Validation lives in
    lm.model.validate, which imports the config (the reverse would be a cycle)."""
    import ast
    import importlib

    import lm.model.config as config

    for part in ("choices", "options"):  # validate imports config, never the reverse (no cycle)
        module = importlib.import_module(f"lm.model.{part}")
        tree = ast.parse(Path(module.__file__).read_text())
        defined = [node.name for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef))]
        defined += [
            t.id
            for node in tree.body
            if isinstance(node, (ast.Assign, ast.AnnAssign))
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        ]
        public = [name for name in defined if not name.startswith("_")]
        assert len(public) > 5, part
        assert [n for n in public if getattr(config, n, None) is not getattr(module, n)] == [], part


def test_unknown_component_names_the_slot():
    cfg = ModelConfig(ffn=MLPConfig(_target_="lm.model.ffn.NoSuchFFN"))
    with pytest.raises(ConfigError, match="model.ffn could not be built"):
        build_model(cfg)


def test_unknown_group_option_lists_the_choices():
    with pytest.raises(ConfigError, match="swiglu"):
        model_preset("tiny", ["model/ffn=swishglu"])


def test_a_new_option_is_one_dataclass_and_one_yaml_file(tmp_path):
    """The extension path: subclass the slot's schema, register it (lm/model/registry.py), write one option file
    listing it; nothing else."""
    from dataclasses import dataclass

    from lm.model.registry import register

    @register("ffn")
    @dataclass
    class WideMLPConfig(MLPConfig):
        hidden_mult: float = 6.0

    (tmp_path / "model" / "ffn").mkdir(parents=True)
    (tmp_path / "model" / "ffn" / "wide.yaml").write_text("defaults:\n  - widemlp_schema\n  - _self_\n")
    search = f"hydra.searchpath=[file://{tmp_path}]"
    cfg = model_preset("tiny", [search, "model/ffn=wide"])
    assert type(cfg.ffn) is WideMLPConfig and build_model(cfg).decoder.blocks[0].ffn.up.out_features == 6 * 64
    with pytest.raises(ConfigError, match="model.ffn.hidden_mult"):  # typed like every other option
        model_preset("tiny", [search, "model/ffn=wide", "model.ffn.hidden_mult=wide"])


TENSOR_READS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__", "__index__")


def _count_tensor_reads(monkeypatch) -> list:
    """Every way the host reads a tensor (waits for the device), as tests/test_loop_syncs.py counts them."""
    seen = []
    for name in TENSOR_READS:
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda *a, _n=name, _real=real, **k: seen.append(_n) or _real(*a, **k))
    return seen


def test_dynamic_rope_takes_the_length_from_the_host_and_rotates_as_before(monkeypatch):
    """model/pos=rope_dynamic: the stack passes the furthest position as a host integer, so the forward reads
    no tensor; the rotation is the one computed from reading positions[-1] (below, at and past the trained length)."""
    from lm.model.position import RoPE

    torch.manual_seed(0)
    rope = RoPE(64, 4, 16, 64, True, theta=100.0, scaling="dynamic", factor=2.0, original_max_seq_len=8)
    q, k = torch.randn(2, 4, 6, 16), torch.randn(2, 2, 6, 16)
    plain = RoPE(64, 4, 16, 64, True, theta=100.0).rotary(torch.arange(10, 16))(q, k)
    for past in (0, 2, 3, 10):  # furthest position + 1 = 6, 8, 9, 16; original_max_seq_len = 8
        positions = torch.arange(past, past + 6)
        expected = rope.rotary(positions)(q, k)  # reads positions[-1]
        got = rope.rotary(positions, length=past + 6)(q, k)
        assert all(torch.equal(a, b) for a, b in zip(got, expected)), past
    assert not torch.allclose(got[0], plain[0])  # past the trained length the dynamic theta is in effect

    cfg = model_preset("tiny", ["model/pos=rope_dynamic", "model.pos.original_max_seq_len=8"])
    model = build_model(cfg).eval()
    x = torch.randint(0, cfg.vocab_size, (2, 12))
    with torch.no_grad():
        seen = _count_tensor_reads(monkeypatch)
        logits = model(x).logits
        assert seen == []
        monkeypatch.setattr(
            RoPE, "rotary", lambda self, positions, length=None, _real=RoPE.rotary: _real(self, positions)
        )
        assert torch.equal(logits, model(x).logits)  # the old path: positions[-1] read from the device
        assert "__int__" in seen


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_swiglu_backward_writes_the_gate_up_gradient_once_and_bit_identically(precision):
    """GLU with silu (the Llama layout) backpropagates through lm/model/ffn.py's _SiLUGate: the same numbers, bit for
    bit, as autograd through chunk(), without chunk's concatenation of the two halves' gradients."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from lm.model.ffn import GLU

    class CountCat(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.cats = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.cats += func.overloadpacket is torch.ops.aten.cat
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    glu = GLU(48, activation="silu", bias=True)
    x, g = torch.randn(3, 7, 48), torch.randn(3, 7, 48)

    def run(stacked: bool):
        glu.silu = stacked  # False: the chunk() path every other activation takes
        glu.zero_grad()
        xi = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            y = glu(xi)
        with CountCat() as count:
            y.float().backward(g)
        return [y, xi.grad] + [p.grad.clone() for p in glu.parameters()], count.cats

    (eager, eager_cats), (fused, fused_cats) = run(False), run(True)
    assert all(torch.equal(a, b) for a, b in zip(eager, fused))
    assert (eager_cats, fused_cats) == (1, 0)
    assert GLU(48, activation="gelu").silu is False


def test_sparse_prediction_gives_the_dense_masked_lm_loss_and_gradients():
    """model.sparse_prediction (the default): the MLM head runs on the masked positions only; the loss and every
    gradient equal the dense head's (which projects every position and ignores the unmasked ones)."""
    from lm.constants import IGNORE_INDEX
    from lm.model import build_model
    from lm.model.config import model_preset

    small = ["model.vocab_size=97", "model.dim=32", "model.n_layers=2", "model.n_heads=2", "model.dropout=0.0"]
    torch.manual_seed(0)
    sparse = build_model(model_preset("bert", small + ["model.mlm_transform=true"]))
    dense = build_model(model_preset("bert", small + ["model.mlm_transform=true", "model.sparse_prediction=false"]))
    dense.load_state_dict(sparse.state_dict())
    ids = torch.randint(5, 97, (3, 16))
    labels = torch.full_like(ids, IGNORE_INDEX)
    masked = torch.rand(3, 16) < 0.15
    masked[0, 0] = True
    labels[masked] = ids[masked]
    out_s, out_d = sparse(ids, labels=labels), dense(ids, labels=labels)
    assert out_s.logits.shape == (1, int(masked.sum()), 97) and out_d.logits.shape == (3, 16, 97)
    torch.testing.assert_close(out_s.loss, out_d.loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out_s.logits[0], out_d.logits[masked], rtol=1e-5, atol=1e-5)
    out_s.loss.backward()
    out_d.loss.backward()
    grads = dict(dense.named_parameters())
    for name, p in sparse.named_parameters():
        torch.testing.assert_close(p.grad, grads[name].grad, rtol=1e-5, atol=1e-6, msg=name)
    # lm.model.flops counts the head (transform 32 x 32 + tied projection 97 x 32) at 15% of the positions
    from lm.model.flops import matmul_params

    assert matmul_params(dense.cfg) - matmul_params(sparse.cfg) == round(0.85 * (32 * 32 + 97 * 32))


def t5_flops_per_sequence(enc_len, dec_len, d=512, heads=8, layers=6, vocab=32128):
    """T5-small's training FLOPs per (enc_len, dec_len) sequence by hand, PaLM's counting: 6 per matmul weight
    per token that it reads, 12 x H x Dh per query and key."""
    encoder = 12 * d * d  # qkv, out, MLP 4x up and down: on the encoder's tokens
    cross_kv = 2 * d * d  # the decoder's cross-attention keys and values: on the encoder's outputs
    decoder = 4 * d * d + 2 * d * d + 8 * d * d  # self qkv + out, cross q + out, MLP: on the targets
    head = vocab * d  # the tied output projection, on the targets
    matmuls = layers * (encoder + cross_kv) * enc_len + (layers * decoder + head) * dec_len
    attention = 12 * d * layers * (enc_len * enc_len + dec_len * dec_len + dec_len * enc_len)
    return 6 * matmuls + attention


def test_encoder_decoder_flops_count_each_token_through_its_own_stack():
    from lm.model.flops import encoder_decoder_flops_per_token

    cfg = model_preset("t5")
    per_token = encoder_decoder_flops_per_token(cfg, 512, 114)
    assert per_token * (512 + 114) == pytest.approx(t5_flops_per_sequence(512, 114), rel=1e-12)
    # every token through both stacks, as flops_per_token counts, is 2.47x that
    assert flops_per_token(cfg, 512) / per_token == pytest.approx(2.47, abs=0.01)


class _SpanBatches:
    """Fixed span-corruption shapes: enc_len encoder tokens, dec_len targets per sequence."""

    dense_labels = True

    def __init__(self, b, enc_len, dec_len, n=None):
        self.b, self.enc_len, self.dec_len, self.n = b, enc_len, dec_len, n

    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        i = 0
        while self.n is None or i < self.n:
            labels = torch.randint(8, 256, (self.b, self.dec_len), generator=g)
            start = torch.full((self.b, 1), 2)
            yield {
                "input_ids": torch.randint(8, 256, (self.b, self.enc_len), generator=g),
                "decoder_input_ids": torch.cat([start, labels[:, :-1]], 1),
                "labels": labels,
            }
            i += 1

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def test_mfu_of_an_encoder_decoder_counts_its_span_lengths(tmp_path):
    from lm.cli.train import train
    from lm.data.collate import t5_lengths
    from tests.engine_support import compose, metrics, tiny_overrides

    _, enc_len, dec_len = t5_lengths(32, 0.15, 3.0)  # what lm train's span batches hold at train.seq_len=32
    cfg = compose(tiny_overrides(tmp_path, 3, seq_len=32, peak_flops=1e9) + ["model.arch=encoder_decoder"])
    train(cfg, loaders=(_SpanBatches(4, enc_len, dec_len), _SpanBatches(4, enc_len, dec_len, n=2)))
    record = [m for m in metrics(tmp_path) if "mfu" in m][-1]
    d, heads, layers, vocab = 64, 4, 2, 256  # model=tiny
    per_token = t5_flops_per_sequence(enc_len, dec_len, d, heads, layers, vocab) / (enc_len + dec_len)
    assert record["mfu"] == pytest.approx(per_token * record["tokens_per_s"] / 1e9, rel=1e-3)
    # lm report's FLOPs per token of the run is the same count (read from its config.yaml, data section included)
    from lm.report.runs import load_run
    from lm.report.summary import model_cost

    assert model_cost(load_run(tmp_path))[1] == pytest.approx(per_token, rel=1e-12)
