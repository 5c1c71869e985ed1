"""Narang et al. 2021 (issue #19, part 1) and the Universal Transformer (#20): activations, ReZero and
Fixup, shared blocks, factorized and tied embeddings, the depth presets; each against a formula or a
defining property, through checkpoint/resume, and through the engines that shard or replicate it."""

import re

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from lm.config import ConfigError
from lm.model import Block, build_model
from lm.model.config import model_from_saved, model_preset
from lm.model.flops import attention_flops_per_token, flops_per_token, matmul_params, num_params
from lm.zoo.factorized import FactorizedConfig
from lm.zoo.residual import fixup_scale

V, D = 64, 48
BASE = [f"model.vocab_size={V}", f"model.dim={D}", "model.n_heads=4"]


def tiny(*over, arch="decoder"):
    return model_preset("tiny", BASE + [f"model.arch={arch}", *over])


def batch(cfg, B=2, T=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(1, cfg.vocab_size, (B, T), generator=g)
    if cfg.arch == "encoder_decoder":
        return {"input_ids": x, "labels": torch.randint(1, cfg.vocab_size, (B, T // 2), generator=g)}
    return {"input_ids": x, "labels": torch.roll(x, -1, dims=1)}


def built(cfg, seed=0):
    torch.manual_seed(seed)
    return build_model(cfg)


def trains(cfg, steps=40, lr=3e-3) -> tuple:
    model, b = built(cfg), batch(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = model(**b).loss
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return losses[0], losses[-1]


# -- activations -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "option,act",
    [("swish", F.silu), ("elu", F.elu), ("selu", F.selu), ("sigmoid", torch.sigmoid), ("softplus", F.softplus)],
)
def test_plain_mlp_activations(option, act):
    ffn = built(tiny(f"model/ffn={option}")).decoder.blocks[0].ffn
    x = torch.randn(2, 5, D)
    assert torch.allclose(ffn(x), ffn.down(act(ffn.up(x))), atol=1e-6)
    assert ffn.up.out_features == 4 * D


@pytest.mark.parametrize("option,gate", [("glu", torch.sigmoid), ("liglu", lambda z: z)])
def test_glu_and_bilinear_variants(option, gate):
    ffn = built(tiny(f"model/ffn={option}")).decoder.blocks[0].ffn
    x = torch.randn(2, 5, D)
    g, u = ffn.gate_up(x).chunk(2, dim=-1)
    assert torch.allclose(ffn(x), ffn.down(gate(g) * u), atol=1e-6)
    # parameter-matched to the 4x ReLU MLP (8/3 * 96 = 256 exactly, no biases)
    same = ["model.dim=96", "model.bias=false"]
    assert num_params(tiny(f"model/ffn={option}", *same)) == num_params(tiny("model/ffn=relu", *same))


# -- ReZero and Fixup ------------------------------------------------------------------------------


@pytest.mark.parametrize("norm", ["rezero", "rezero_layernorm", "rezero_rmsnorm", "fixup"])
@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_every_block_is_the_identity_at_init(norm, arch):
    """ReZero's alpha starts at 0; Fixup zeroes each branch's last layer: x -> x exactly, in every block."""
    model = built(tiny(f"model/norm={norm}", arch=arch))
    x, memory = torch.randn(2, 7, D), torch.randn(2, 5, D)
    for block in (m for m in model.modules() if isinstance(m, Block)):
        rotate = lambda q, k: (q, k)  # noqa: E731 (no RoPE here)
        out = block(x, True, None, rotate, memory if block.cross_attn is not None else None)
        assert torch.equal(out, x)


@pytest.mark.parametrize("norm", ["rezero", "rezero_layernorm", "rezero_rmsnorm", "fixup"])
@pytest.mark.parametrize("arch", ["decoder", "encoder", "encoder_decoder"])
def test_rezero_and_fixup_train(norm, arch):
    first, last = trains(tiny(f"model/norm={norm}", arch=arch), steps=60)
    assert last < 0.6 * first, (first, last)


def test_rezero_alpha_is_learned_from_zero():
    model = built(tiny("model/norm=rezero"))
    alphas = [p for n, p in model.named_parameters() if n.endswith(".alpha")]
    assert len(alphas) == 2 * 2 and all(a.item() == 0.0 for a in alphas)  # 2 layers x (attention, FFN)
    model(**batch(model.cfg)).loss.backward()
    assert all(a.grad is not None and a.grad.abs().item() > 0 for a in alphas)


@pytest.mark.parametrize(
    "old,new",
    [
        ("lm.model.norms.rezero_norm", "lm.zoo.residual.rezero_norm"),
        ("lm.model.norms.fixup_norm", "lm.zoo.residual.fixup_norm"),
    ],
)
def test_a_config_saved_before_rezero_and_fixup_moved_to_the_zoo_loads(old, new):
    node = OmegaConf.to_container(OmegaConf.structured(tiny("model/norm=rezero_layernorm")))
    node["norm"] = {"_target_": old, "_partial_": True, **({"with_norm": "layernorm"} if "rezero" in old else {})}
    cfg = model_from_saved(node)
    assert cfg.norm._target_ == new and type(cfg.norm).__module__ == "lm.zoo.residual"
    assert build_model(cfg).decoder.blocks[0].scalars_self is not None  # the option's residual scalars


def test_fixup_scale_formula():
    assert fixup_scale(4) == pytest.approx(4**-0.5)  # m = 2 (an FFN): L^(-1/2)
    assert fixup_scale(64, m=4) == pytest.approx(0.5)  # m = 4 (attention: W_Q, W_K, W_V, W_O): 64^(-1/6)
    assert fixup_scale(16, m=3) == pytest.approx(16**-0.25)  # L^(-1/(2m-2))
    assert fixup_scale(1) == 1.0


@pytest.mark.parametrize("arch,branches", [("decoder", 2 * 2), ("encoder_decoder", 2 * 2 + 3 * 2)])
def test_fixup_rescales_the_same_draws(arch, branches):
    """Same seed, same draws as a norm-free model without Fixup's init (ReZero's scalars take no RNG): the
    attention's q, k, v are scaled by L^(-1/6) (m = 4), the FFN's first layer by L^(-1/2) (m = 2), the last
    layers and an untied output are 0."""
    over = ["model.tie_embeddings=false"]
    fixup = dict(built(tiny("model/norm=fixup", *over, arch=arch)).named_parameters())
    plain = dict(built(tiny("model/norm=rezero", *over, arch=arch)).named_parameters())
    checked = {}
    for name, p in fixup.items():
        if ".blocks." not in name or not name.endswith(".weight"):
            continue
        if re.search(r"\.(out|down)\.weight$", name):
            assert torch.count_nonzero(p) == 0, name
            continue
        kind = "attn" if re.search(r"_attn\.(qkv|q|kv)\.weight$", name) else "ffn"
        scale = branches ** (-1 / 6) if kind == "attn" else branches**-0.5
        assert torch.allclose(p, plain[name] * scale), name
        checked[kind] = checked.get(kind, 0) + 1
    assert checked["attn"] >= 2 and checked["ffn"] >= 2, checked
    assert torch.count_nonzero(fixup["head.proj.weight"]) == 0
    assert torch.equal(fixup["embed.tok.weight"], plain["embed.tok.weight"])
    assert {n for n in fixup if n.endswith((".bias", ".multiplier")) and "scalars" in n}


@pytest.mark.parametrize(
    "over,message",
    [
        (["model/norm=rezero", "model.norm_position=post"], "model/norm=rezero .* model.norm_position=post"),
        (["model/norm=fixup", "model.norm_position=post"], "model/norm=fixup .* model.norm_position=post"),
        (["model/norm=fixup", "model.qk_norm=true"], "model/norm=fixup has no norm, but model.qk_norm=true"),
        (["model/norm=rezero", "model.embed_norm=true"], "model/norm=rezero has no norm, but model.embed_norm=true"),
        (
            ["model/stack=shared", "model.stack.share=encoder"],
            "model.stack.share=encoder: model.arch=decoder has no encoder",
        ),
        (
            ["model/stack=universal", "model.stack.steps=2", "model.stack.share=decoder"],
            "model.stack.steps=2\\) .* model.stack.share=decoder",
        ),
        (["model/stack=universal", "model.stack.steps=-1"], "model.stack.steps=-1"),
        (
            ["model/stack=shared", "model.attn_scale_by_layer=true"],
            "model.attn_scale_by_layer=true .*model.stack.share=all",
        ),
        (
            ["model.tie_embeddings=encoder_decoder_inputs"],
            "model.tie_embeddings=encoder_decoder_inputs .* model.arch=decoder",
        ),
        (
            ["model.tie_embeddings=some"],
            "model.tie_embeddings='some' is not one of true, false, none, decoder_input_output",
        ),
        (
            ["model/embedding=factorized", "model.embedding.rank=48"],
            "model.embedding.rank=48 must be a rank below model.dim=48",
        ),
    ],
)
def test_undefined_combinations_are_refused_naming_both_fields(over, message):
    with pytest.raises(ConfigError, match=message):
        build_model(tiny(*over))


@pytest.mark.parametrize(
    "over,message",
    [
        (
            ["model/stack=universal", "model.stack.steps=2", "model/block=pkm", "model.block.layers=[0]"],
            "model.stack.steps=2\\) with model/block=pkm \\(model.block.layers=\\[0\\]\\)",
        ),
        (
            ["model/stack=universal", "model.stack.steps=2", "model/memory=transparent"],
            "model.stack.steps=2\\) with model/memory=transparent",
        ),
        (
            ["model/embedding=factorized", "model.embedding.rank=16", "model/output=mixture_of_softmaxes"],
            "model/embedding=factorized tied .* model/output=mixture_of_softmaxes",
        ),
    ],
)
def test_combinations_with_the_other_issue_options_are_refused(over, message):
    with pytest.raises(ConfigError, match=message):
        build_model(tiny(*over, arch="encoder_decoder"))


@pytest.mark.parametrize(
    "over", [["model/memory=transparent"], ["model/ffn=moe"], ["model/ffn=switch", "model.tie_embeddings=none"]]
)
def test_sharing_works_with_the_other_issue_options(over):
    """Transparent attention gets one encoder mix per application; a shared MoE block records its aux loss per call."""
    cfg = tiny("model/stack=shared", "model.n_layers=3", "model.n_decoder_layers=3", *over, arch="encoder_decoder")
    model = built(cfg)
    out = model(**batch(cfg))
    out.loss.backward()
    assert torch.isfinite(out.loss)
    if "model/ffn=moe" in over:
        assert out.aux_loss is not None and out.aux_loss > 0
    assert matmul_params(cfg) == matmul_params(
        tiny("model.n_layers=3", "model.n_decoder_layers=3", *over, arch="encoder_decoder")
    )


def test_rezero_with_a_norm_keeps_the_norm_in_the_branch():
    model = built(tiny("model/norm=rezero_rmsnorm", "model.qk_norm=true"))  # a norm exists: qk_norm is fine
    block = model.decoder.blocks[0]
    assert type(block.norm_self).__name__ == "RMSNorm" and block.scalars_self.alpha.shape == (1,)
    assert type(model.decoder.final_norm).__name__ == "RMSNorm"


# -- shared blocks and the Universal Transformer ---------------------------------------------------


@pytest.mark.parametrize(
    "arch,share", [("decoder", "all"), ("decoder", "decoder"), ("encoder", "encoder"), ("encoder_decoder", "all")]
)
def test_a_shared_stack_has_one_blocks_parameters(arch, share):
    """6 layers sharing one block hold the parameters of a 1-layer model, and cost the FLOPs of 6 layers."""
    shared = tiny(
        "model.n_layers=6", "model.n_decoder_layers=6", "model/stack=shared", f"model.stack.share={share}", arch=arch
    )
    one = tiny("model.n_layers=1", "model.n_decoder_layers=1", arch=arch)
    six = tiny("model.n_layers=6", "model.n_decoder_layers=6", arch=arch)
    assert num_params(shared) == num_params(one) == sum(p.numel() for p in built(shared).parameters())
    assert matmul_params(shared) == matmul_params(six)
    assert flops_per_token(shared, 16) == flops_per_token(six, 16)


def test_share_one_stack_of_two():
    enc = tiny(
        "model.n_layers=4",
        "model.n_decoder_layers=4",
        "model/stack=shared",
        "model.stack.share=encoder",
        arch="encoder_decoder",
    )
    model = built(enc)
    assert len(model.encoder.blocks) == 1 and len(model.decoder.blocks) == 4
    assert model.encoder.depth == model.decoder.depth == 4


def test_shared_model_equals_an_unshared_one_with_copied_blocks():
    shared = built(tiny("model.n_layers=3", "model/stack=shared"))
    plain = built(tiny("model.n_layers=3"))
    state = shared.state_dict()
    for key, value in list(state.items()):
        if key.startswith("decoder.blocks.0."):
            for i in (1, 2):
                state[key.replace("blocks.0.", f"blocks.{i}.")] = value
    plain.load_state_dict(state)
    b = batch(shared.cfg)
    assert torch.allclose(shared(**b).logits, plain(**b).logits, atol=1e-6)


@pytest.mark.parametrize("kind", ["sinusoidal", "learned"])
def test_universal_transformer_applies_one_block_with_step_embeddings(kind):
    cfg = tiny(
        "model/stack=universal", "model.stack.steps=3", f"model.stack.step_embedding={kind}", "model.n_layers=5"
    )  # n_layers: unused
    model = built(cfg)
    stack = model.decoder
    assert len(stack.blocks) == 1 and stack.depth == 3 and len(model.new_cache()) == 3
    learned = D * 3 if kind == "learned" else 0
    assert num_params(cfg) == num_params(tiny("model.n_layers=1")) + learned
    assert matmul_params(cfg) == matmul_params(tiny("model.n_layers=3"))
    assert attention_flops_per_token(cfg, 16) == 12 * 3 * 4 * (D // 4) * 16
    # the forward by hand: positions once, then (step embedding, block) x 3
    ids = batch(cfg)["input_ids"]
    q = torch.arange(ids.shape[1])
    x = stack.pos.embed(model.embed(ids), q)
    table = stack.step_embed.table.weight if kind == "learned" else stack.step_embed.fixed
    for t in range(3):
        x = stack.blocks[0](x + table[t], True, None, stack.pos.rotary(q))
    assert torch.allclose(model(ids).logits, model.head(stack.final_norm(x)), atol=1e-5)
    if kind == "sinusoidal":  # sin/cos of the step: step 0 is (0, 1, 0, 1, ...)
        assert torch.equal(table[0, 0::2], torch.zeros(D // 2)) and torch.equal(table[0, 1::2], torch.ones(D // 2))
        assert "decoder.step_embed.fixed" not in model.state_dict()  # recomputed, never saved


def test_kv_cache_decoding_with_a_shared_block_matches_the_full_forward():
    from lm.model.generate import generate

    model = built(tiny("model/stack=universal", "model.stack.steps=3")).eval()
    prompt = batch(model.cfg)["input_ids"][:1, :4]
    out = generate(model, prompt, max_new_tokens=6)
    full = model(out).logits  # greedy: each new token is the argmax of the full forward at its position
    assert torch.equal(out[0, 4:], full[0, 3:-1].argmax(-1))


@pytest.mark.parametrize(
    "over",
    [
        ["model/stack=shared"],
        ["model/stack=universal", "model.stack.steps=2"],
        ["model/stack=universal", "model.stack.steps=2", "model.stack.step_embedding=learned"],
    ],
)
@pytest.mark.parametrize("arch", ["decoder", "encoder", "encoder_decoder"])
def test_shared_models_train(over, arch):
    # 80 steps: the sinusoidal step signal (norm ~sqrt(D/2)) swamps the unscaled 0.02 embeddings at first
    first, last = trains(tiny(*over, arch=arch), steps=80)
    assert last < 0.6 * first, (first, last)


# -- factorized and tied embeddings ----------------------------------------------------------------


def test_factorized_embedding_counts_and_tied_output():
    r = 16
    cfg = tiny("model/embedding=factorized", f"model.embedding.rank={r}")
    full = tiny()
    assert num_params(cfg) == num_params(full) - V * D + V * r + r * D
    model = built(cfg)
    assert model.head.proj.weight is model.embed.tok.weight and model.head.unfactor.weight is model.embed.proj.weight
    h = torch.randn(2, 3, D)
    assert torch.allclose(model.head(h), h @ model.embed.proj.weight @ model.embed.tok.weight.T, atol=1e-5)
    # FLOPs: the r x D projection runs in (input) and out (transposed); the output reads V x r
    assert matmul_params(cfg) == matmul_params(full) - V * D + V * r + 2 * r * D
    untied = tiny("model/embedding=factorized", f"model.embedding.rank={r}", "model.tie_embeddings=false")
    assert num_params(untied) == num_params(cfg) + V * D  # a plain D x V output layer
    assert matmul_params(untied) == matmul_params(full) + r * D
    assert num_params(cfg, exclude_embeddings=True) == num_params(cfg) - V * r


def test_factorized_chunked_loss_equals_the_plain_loss():
    cfg = tiny("model/embedding=factorized", "model.embedding.rank=16")
    chunked = tiny("model/embedding=factorized", "model.embedding.rank=16", "model.loss_chunk_size=8")
    b = batch(cfg)
    assert torch.allclose(built(cfg)(**b).loss, built(chunked)(**b).loss, atol=1e-5)


@pytest.mark.parametrize(
    "tie,tables,encoder_table",
    [
        ("true", 1, False),
        ("all", 1, False),
        ("false", 2, False),
        ("encoder_decoder_inputs", 2, False),
        ("decoder_input_output", 2, True),
        ("none", 3, True),
    ],
)
def test_encoder_decoder_tying_options(tie, tables, encoder_table):
    cfg = tiny(f"model.tie_embeddings={tie}", arch="encoder_decoder")
    model = built(cfg)
    assert (model.encoder_embed is not None) == encoder_table
    assert num_params(cfg) == num_params(tiny(arch="encoder_decoder")) + (tables - 1) * V * D
    if encoder_table:  # the encoder reads its own table: changing the decoder's does not change the memory
        ids = batch(cfg)["input_ids"]
        before = model.encode(ids)
        with torch.no_grad():
            model.embed.tok.weight.add_(1.0)
        assert torch.equal(model.encode(ids), before)
    first, last = trains(cfg)
    assert last < 0.6 * first


def test_bools_keep_their_meaning_for_saved_configs():
    """A config saved before the options grew (tie_embeddings: false) loads with the same weights layout."""
    cfg = tiny("model.tie_embeddings=false", arch="encoder_decoder")
    saved = OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True)
    again = model_from_saved(saved)
    assert again.tie_embeddings is False and again.tying == "encoder_decoder_inputs"
    keys = set(built(again).state_dict())
    assert "head.proj.weight" in keys and not any(k.startswith("encoder_embed") for k in keys)
    stack = {"_target_": "lm.zoo.sharing.shared_stack", "universal": True, "steps": 2}  # a zoo option, by _target_
    new = model_from_saved({**saved, "tie_embeddings": "none", "factorized_embedding": 8, "stack": stack})
    # model.factorized_embedding became the zoo's model/embedding=factorized (lm/model/upgrade.py)
    assert new.tying == "none" and isinstance(new.embedding, FactorizedConfig) and new.embedding.rank == 8
    assert new.stack.steps == 2 and model_from_saved({**saved, "factorized_embedding": 0}).embedding is None
    old = model_from_saved({**saved, "factorized_embedding": 16})
    factorized = tiny(
        "model/embedding=factorized", "model.embedding.rank=16", "model.tie_embeddings=false", arch="encoder_decoder"
    )
    assert old.embedding == factorized.embedding and old.tying == factorized.tying
    assert set(built(old).state_dict()) == set(built(factorized).state_dict())  # embed.proj.weight: old names load
    with pytest.raises(ConfigError, match="write model/embedding=factorized model.embedding.rank=<rank>"):
        tiny("model.factorized_embedding=16")


# -- Hugging Face conversion refuses what it cannot express ------------------------------------------


@pytest.mark.parametrize(
    "preset,over,field",
    [
        ("gpt2", ["model/embedding=factorized", "model.embedding.rank=32"], "model/embedding=factorized"),
        ("gpt2", ["model/stack=shared"], "model/stack=shared"),
        ("llama", ["model.n_kv_heads=1", "model/stack=universal"], "model/stack=universal"),
        ("t5", ["model.tie_embeddings=none"], "model.tie_embeddings=none"),
        ("gpt2", ["model/norm=rezero_layernorm"], "norm=rezero_norm"),
        ("gpt2", ["model/ffn=liglu"], "liglu|activation|GLU|glu"),
    ],
)
def test_hf_export_refuses_options_it_cannot_express(preset, over, field):
    pytest.importorskip("transformers")
    from lm.model.convert import to_hf

    small = [
        "model.n_layers=1",
        "model.n_decoder_layers=1",
        "model.dim=64",
        "model.n_heads=2",
        "model.vocab_size=128",
        "model.max_seq_len=32",
    ]
    with pytest.raises(ValueError, match=field):
        to_hf(built(model_preset(preset, small + over)))


def test_hf_export_keeps_working_for_the_bool_ties():
    pytest.importorskip("transformers")
    from lm.model.convert import from_hf, to_hf

    small = [
        "model.n_layers=1",
        "model.n_decoder_layers=1",
        "model.dim=64",
        "model.n_heads=2",
        "model.vocab_size=128",
        "model.max_seq_len=32",
        "model.tie_embeddings=false",
        "model.logit_scale=1.0",
    ]
    model = built(model_preset("t5", small)).eval()
    hf = to_hf(model).eval()
    back, cfg = from_hf(hf)
    assert cfg.output_tied is False
    ids = torch.randint(1, 128, (1, 8))
    assert torch.allclose(model(ids, labels=ids).logits, back.eval()(ids, labels=ids).logits, atol=1e-5)


# -- depth vs width presets ------------------------------------------------------------------------


def test_narang_depth_cells_are_parameter_matched():
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from lm.config import conf_dir, register_train_configs

    register_train_configs()
    GlobalHydra.instance().clear()
    shapes = {}
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        cfg = compose("train", overrides=["experiment=narang_depth"], return_hydra_config=True)
        cells = str(cfg.hydra.sweeper.params["experiment/narang_depth"]).split(",")
        for cell in cells:
            m = OmegaConf.to_object(
                compose("train", overrides=["experiment=narang_depth", f"experiment/narang_depth={cell}"]).model
            )
            shapes[m.n_layers] = (m.n_heads, m.ffn.hidden_dim, num_params(m), m)
    GlobalHydra.instance().clear()
    assert sorted(shapes) == [6, 8, 12, 18, 24]
    vanilla = shapes[12][2]
    for layers, (heads, d_ff, params, m) in shapes.items():
        assert m.arch == "encoder_decoder" and m.decoder_layers == layers and m.dim == 192 and m.d_head == 16
        assert heads * layers == 144 and d_ff == 4 * 16 * heads  # the paper's shapes / 4 in width
        assert abs(params / vanilla - 1) < 0.01, (layers, params, vanilla)
        # the blocks alone hold exactly the vanilla's block parameters, minus norms/biases/bias tables
        assert abs(num_params(m, exclude_embeddings=True) / shapes[12][2] - 1) < 0.02


# -- checkpoint/resume and engines -----------------------------------------------------------------

RESUME_CASES = {
    "fixup_factorized_ut": [
        "model/norm=fixup",
        "model/embedding=factorized",
        "model.embedding.rank=16",
        "model/stack=universal",
        "model.stack.steps=3",
    ],
    "rezero_shared_liglu": ["model/norm=rezero_layernorm", "model/stack=shared", "model/ffn=liglu"],
    "encdec_untied_inputs": [
        "model.arch=encoder_decoder",
        "model.tie_embeddings=decoder_input_output",
        "model/ffn=glu",
        "model/norm=rezero",
    ],
}


@pytest.mark.parametrize("case", sorted(RESUME_CASES))
def test_checkpoint_resume_is_exact(case, tmp_path):
    from lm.cli.train import train
    from tests.engine_support import compose, loaders, tiny_overrides, train_losses

    extra = ["sched=constant", "optim.lr=3e-3", *RESUME_CASES[case]]
    objective = "span" if "model.arch=encoder_decoder" in extra else "clm"

    def run(run_dir, steps):
        cfg = compose(tiny_overrides(run_dir, steps) + extra)
        return train(cfg, loaders=loaders(cfg, objective=objective))

    run(tmp_path / "whole", 8)
    run(tmp_path / "split", 4)
    run(tmp_path / "split", 8)
    whole, split = train_losses(tmp_path / "whole"), train_losses(tmp_path / "split")
    assert list(split) == list(range(1, 9)) and split == whole
    assert whole[8] < whole[1]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("engine", ["ddp", "fsdp2", "zero3"])
def test_engines_match_one_process_with_shared_blocks(engine, tmp_path):
    """One block applied 3 times (FSDP2 wraps it once), a factorized tied embedding, ReZero's scalars:
    2 gloo ranks train like one process with the same global batch."""
    from lm.cli.train import train
    from tests.engine_support import compose, loaders, spawn, tiny_overrides, train_losses

    extra = [
        "model/stack=universal",
        "model.stack.steps=3",
        "model/embedding=factorized",
        "model.embedding.rank=16",
        "model/norm=rezero_layernorm",
        "optim.lr=1e-2",
    ]
    cfg = compose(tiny_overrides(tmp_path / "single", 6, micro_batch_size=4) + extra)
    result = train(cfg, loaders=loaders(cfg))
    assert sum(isinstance(m, Block) for m in result.engine.module.modules()) == 1
    reports = spawn(2, tiny_overrides(tmp_path / engine, 6, micro_batch_size=2) + extra + [f"engine={engine}"])
    assert [r[2]["world_size"] for r in reports] == [2, 2]
    ref, got = train_losses(tmp_path / "single"), train_losses(tmp_path / engine)
    assert max(abs(got[s] - ref[s]) for s in ref) < 1e-5
    assert ref[6] < ref[1]
