"""Adaptive input, adaptive softmax, mixture of softmaxes and transparent attention (issue #19):
properties from their papers, the loss path (ignore_index, micro-batch token weighting),
generation, parameter/FLOP formulas, refusals, and checkpoint/resume through lm train."""

import math

import pytest
import torch
import torch.nn.functional as F

from lm.config import ConfigError
from lm.model import build_model
from lm.model.config import ModelConfig
from lm.model.flops import attention_flops_per_token, flops_per_token, matmul_params, num_params
from lm.model.generate import generate
from lm.zoo.adaptive import AdaptiveConfig, AdaptiveSoftmaxConfig
from lm.zoo.funnel import FunnelConfig
from lm.zoo.mos import MixtureOfSoftmaxesConfig
from lm.zoo.transparent import TransparentConfig

V, D = 96, 32
ASM = dict(output=AdaptiveSoftmaxConfig(cutoffs=[16, 48]), tie_embeddings=False)
ASM_NO_PROJ = dict(ASM, output=AdaptiveSoftmaxConfig(cutoffs=[16, 48], tail_projection=False))
MOS = dict(output=MixtureOfSoftmaxesConfig(components=3))
ADAPTIVE_IN = dict(embedding=AdaptiveConfig(cutoffs=[16, 48]), tie_embeddings=False)
OUTPUTS = {"adaptive_softmax": ASM, "adaptive_softmax_no_proj": ASM_NO_PROJ, "mos": MOS}


def cfg_of(arch="decoder", **kw) -> ModelConfig:
    return ModelConfig(arch=arch, vocab_size=V, dim=D, n_layers=2, n_heads=4, max_seq_len=32, **kw)


def built(arch="decoder", seed=0, **kw):
    torch.manual_seed(seed)
    return build_model(cfg_of(arch, **kw)).eval()


def batch(arch, B=3, T=10, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (B, T), generator=g)
    labels = torch.randint(0, V, (B, T), generator=g)
    labels[0, :4] = -100  # ignored targets
    return {"input_ids": ids, "labels": labels}


def hidden(model, b):
    """The final hidden states the head reads, (B, T, D)."""
    if model.cfg.arch == "encoder_decoder":
        from lm.model.lm import shift_right

        memory = model.encode(b["input_ids"])
        return model.decode(shift_right(b["labels"], 0, 0), memory)
    return model.features(b["input_ids"])


# -- log-probabilities and the loss ----------------------------------------------------------------


@pytest.mark.parametrize("arch", ["decoder", "encoder", "encoder_decoder"])
@pytest.mark.parametrize("kind", sorted(OUTPUTS))
def test_log_probs_sum_to_one_and_the_loss_is_their_mean_nll(arch, kind):
    model, b = built(arch, **OUTPUTS[kind]), batch(arch)
    with torch.no_grad():
        log_p = model.head(hidden(model, b))  # (B, T, V)
        assert log_p.shape == (3, 10, V)
        torch.testing.assert_close(log_p.exp().sum(-1), torch.ones(3, 10), atol=1e-5, rtol=0)
        loss = model(**b).loss
    keep = b["labels"] != -100
    expected = -log_p[keep].gather(-1, b["labels"][keep][:, None]).mean()  # mean over the 26 kept targets
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)


def test_adaptive_softmax_is_torchs_module_with_and_without_tail_projection():
    with_proj, without = built(**ASM), built(**ASM_NO_PROJ)
    tail = with_proj.head.asm.tail
    assert [tuple(c[0].weight.shape) for c in tail] == [(D // 4, D), (D // 16, D)]  # dim / 4**i
    assert [tuple(c[1].weight.shape) for c in tail] == [(32, D // 4), (48, D // 16)]
    assert all(isinstance(c[0], torch.nn.Identity) for c in without.head.asm.tail)
    assert [tuple(c[1].weight.shape) for c in without.head.asm.tail] == [(32, D), (48, D)]


def test_mixture_of_softmaxes_matches_its_formula():
    model = built(**MOS)
    head, h = model.head, torch.randn(5, D)
    pi = F.softmax(h @ head.prior.weight.T, -1)  # (5, K)
    h_k = torch.tanh(h @ head.latent.weight.T + head.latent.bias).view(5, 3, D)
    p = (pi[..., None] * F.softmax(h_k @ model.embed.tok.weight.T, -1)).sum(1)  # tied W: (5, V)
    with torch.no_grad():
        torch.testing.assert_close(head(h), p.log(), atol=1e-5, rtol=1e-5)


def test_micro_batch_token_weighting_gives_the_full_batch_loss():
    """The loop weights each micro-batch's mean loss by its share of label tokens (lm/core/objectives.py):
    with ignored targets unevenly spread, that must give the whole batch's token mean."""
    from lm.core.objectives import label_tokens, weights

    for kw in OUTPUTS.values():
        model, b = built(**kw), batch("decoder", B=4)
        b["labels"][1, :9] = -100
        halves = [{k: v[:2] for k, v in b.items()}, {k: v[2:] for k, v in b.items()}]
        w = weights([label_tokens(h) for h in halves], label_tokens(b))
        with torch.no_grad():
            split = sum(wi * model(**h).loss for wi, h in zip(w, halves))
            torch.testing.assert_close(split, model(**b).loss, atol=1e-5, rtol=1e-5)


def test_all_targets_ignored_gives_a_zero_loss_with_a_graph():
    model = built(**ASM)
    b = batch("decoder")
    b["labels"][:] = -100
    loss = model(**b).loss
    assert float(loss.detach()) == 0.0 and loss.requires_grad


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
@pytest.mark.parametrize("kind", sorted(OUTPUTS))
def test_greedy_generation_is_the_argmax_of_the_log_probs(arch, kind):
    model = built(arch, **OUTPUTS[kind])
    prompt = torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(3))
    out = generate(model, prompt, max_new_tokens=4)
    assert out.shape == (2, 4) and int(out.min()) >= 0 and int(out.max()) < V
    with torch.no_grad():  # the first generated token, recomputed without the cache
        if arch == "decoder":
            first = model.head(model.features(prompt))[:, -1].argmax(-1)
        else:
            first = model.head(model.decode(torch.zeros_like(prompt[:, :1]), model.encode(prompt)))[:, -1].argmax(-1)
    assert torch.equal(out[:, 0], first)


# -- adaptive input ------------------------------------------------------------------------------


def test_adaptive_input_looks_each_token_up_in_its_band_and_projects_it():
    model = built(**ADAPTIVE_IN)
    emb = model.embed.tok
    assert [tuple(b.weight.shape) for b in emb.bands] == [(16, D), (32, D // 4), (48, D // 16)]
    ids = torch.tensor([[0, 15, 16, 47, 48, 95]])
    bands = [0, 0, 1, 1, 2, 2]
    lo = [0, 16, 48]
    expected = torch.stack([emb.projs[k](emb.bands[k].weight[i - lo[k]]) for i, k in zip(ids[0].tolist(), bands)])
    torch.testing.assert_close(emb(ids)[0], expected)


def test_adaptive_input_trains_every_band():
    model = built(**ADAPTIVE_IN).train()
    ids = torch.tensor([[1, 20, 60, 2, 30, 90]])
    model(input_ids=ids, labels=ids).loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.embed.tok.parameters())


# -- transparent attention -------------------------------------------------------------------------


def test_transparent_attention_on_the_last_layer_alone_is_the_plain_model():
    plain = built("encoder_decoder")
    transparent = build_model(cfg_of("encoder_decoder", memory=TransparentConfig())).eval()
    missing, unexpected = transparent.load_state_dict(plain.state_dict(), strict=False)
    assert missing == ["memory.weights"] and unexpected == []
    with torch.no_grad():
        transparent.memory.weights.fill_(-1e4)[:, -1] = 0.0  # all weight on the last encoder layer
    b = batch("encoder_decoder")
    with torch.no_grad():
        torch.testing.assert_close(transparent(**b).loss, plain(**b).loss)
        transparent.memory.weights.zero_()  # the initial state: the average of all encoder states
        assert not torch.allclose(transparent(**b).loss, plain(**b).loss)


def test_transparent_attention_mixes_per_decoder_layer_and_gets_gradients():
    model = build_model(cfg_of("encoder_decoder", memory=TransparentConfig(), n_decoder_layers=3)).train()
    assert tuple(model.memory.weights.shape) == (3, 3)  # 3 decoder layers x (embeddings + 2 encoder layers)
    model(**batch("encoder_decoder")).loss.backward()
    assert model.memory.weights.grad.abs().min() > 0


# -- params and FLOPs per token (the table's Params and Ops columns) --------------------------------


def test_params_and_flops_follow_the_formulas():
    T = 32
    base = cfg_of(tie_embeddings=False)
    body = matmul_params(base) - V * D  # everything but the output layer
    attn = attention_flops_per_token(base, T)
    assert flops_per_token(base, T) == 6 * (body + V * D) + attn

    asm = cfg_of(**ASM)  # head: D x (16 + 2 clusters); tails: D x D/4 + D/4 x 32, D x D/16 + D/16 x 48
    asm_out = D * 18 + (D * 8 + 8 * 32) + (D * 2 + 2 * 48)
    assert matmul_params(asm) == body + asm_out
    assert flops_per_token(asm, T) == 6 * (body + asm_out) + attn
    assert num_params(asm) == num_params(base) - V * D + asm_out

    no_proj = cfg_of(**ASM_NO_PROJ)  # no tail projections, full-width tails
    assert matmul_params(no_proj) == body + D * 18 + D * 32 + D * 48

    mos = cfg_of(**MOS)  # tied W used K times; prior D x K; latent D x K*D (+ K*D bias)
    assert matmul_params(mos) == body + D * 3 + D * 3 * D + 3 * V * D
    assert num_params(mos) == num_params(cfg_of()) + D * 3 + D * 3 * D + 3 * D

    adaptive_in = cfg_of(**ADAPTIVE_IN)
    table = 16 * D + 32 * (D // 4) + 48 * (D // 16)
    projs = D * D + (D // 4) * D + (D // 16) * D
    assert num_params(adaptive_in) == num_params(base) - V * D + table + projs
    assert num_params(adaptive_in, exclude_embeddings=True) == num_params(base, exclude_embeddings=True)
    assert matmul_params(adaptive_in) == matmul_params(base) + D * D  # one band's projection per token: band 0's

    ed = cfg_of("encoder_decoder", n_decoder_layers=3)
    tr = cfg_of("encoder_decoder", n_decoder_layers=3, memory=TransparentConfig())
    assert num_params(tr) == num_params(ed) + 3 * (2 + 1)
    assert flops_per_token(tr, T) == flops_per_token(ed, T)  # the mix is L_dec x (N+1) multiply-adds per position


# -- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw,fields",
    [
        (dict(output=AdaptiveSoftmaxConfig()), ["model/output=adaptive_softmax", "model.tie_embeddings=True"]),
        (dict(embedding=AdaptiveConfig()), ["model/embedding=adaptive", "model.tie_embeddings=true"]),
        (dict(MOS, loss_chunk_size=64), ["model/output=mixture_of_softmaxes", "model.loss_chunk_size=64"]),
        (dict(ASM, loss_chunk_size=64), ["model/output=adaptive_softmax", "model.loss_chunk_size=64"]),
        (dict(memory=TransparentConfig()), ["model/memory=transparent", "model.arch=decoder"]),
        (
            dict(ASM, output=AdaptiveSoftmaxConfig(cutoffs=[48, 16])),
            ["model.output.cutoffs=[48, 16]", "model.vocab_size=96"],
        ),
        (dict(ADAPTIVE_IN, embedding=AdaptiveConfig(cutoffs=[16, 96])), ["model.embedding.cutoffs=[16, 96]"]),
        (dict(output=MixtureOfSoftmaxesConfig(components=0)), ["model.output.components=0"]),
    ],
)
def test_undefined_combinations_are_refused_naming_the_fields(kw, fields):
    with pytest.raises(ConfigError) as e:
        build_model(cfg_of(**kw))
    for f in fields:
        assert f in str(e.value)


def test_encoder_only_model_refuses_transparent_attention():
    with pytest.raises(ConfigError, match="model.arch=encoder"):
        build_model(cfg_of("encoder", memory=TransparentConfig()))


def test_funnel_encoder_refuses_transparent_attention():

    with pytest.raises(ConfigError, match=r"model/memory=transparent with model.stack.blocks=\[1, 1\]"):
        build_model(cfg_of("encoder_decoder", memory=TransparentConfig(), stack=FunnelConfig(blocks=[1, 1])))


def test_options_compose_from_the_command_line_grammar():
    from lm.model.config import model_preset

    cfg = model_preset(
        "tiny",
        [
            "model/output=mixture_of_softmaxes",
            "model.output.components=2",
            "model/embedding=adaptive",
            "model.tie_embeddings=false",
            "model.embedding.cutoffs=[64,128]",
        ],
    )
    assert cfg.output == MixtureOfSoftmaxesConfig(components=2) and cfg.embedding.cutoffs == [64, 128]
    with pytest.raises(ConfigError, match="model/output"):
        model_preset("tiny", ["model/output=softermax"])


@pytest.mark.parametrize(
    "old,new",
    [
        ("model.output=mixture_of_softmaxes", "model/output=adaptive_softmax or model/output=mixture_of_softmaxes"),
        ("model.embedding=adaptive", "model/embedding=adaptive"),
        (
            "model.adaptive_cutoffs=[64,128]",
            "model.embedding.cutoffs (model/embedding=adaptive) or model.output.cutoffs",
        ),
        ("model.adaptive_tail_projection=false", "model.output.tail_projection (model/output=adaptive_softmax)"),
        ("model.mos_components=2", "model.output.components (model/output=mixture_of_softmaxes)"),
    ],
)
def test_the_fields_that_moved_to_the_zoo_are_refused_naming_the_new_override(old, new):
    from lm.model.config import model_preset

    with pytest.raises(ConfigError) as e:
        model_preset("tiny", [old])
    assert str(e.value).startswith(f"{old}: this option moved to the zoo") and new in str(e.value)
    assert "\n" not in str(e.value)


def test_a_config_saved_with_the_old_fields_loads_as_the_option_nodes():
    from dataclasses import asdict

    from lm.model.config import model_from_saved

    saved = {k: v for k, v in asdict(cfg_of()).items() if k not in ("embedding", "output")}
    old = dict(
        saved,
        embedding="adaptive",
        output="adaptive_softmax",
        adaptive_cutoffs=[16, 48],
        adaptive_div_value=2.0,
        adaptive_tail_projection=False,
        adaptive_head_bias=True,
        mos_components=4,
    )
    cfg = model_from_saved(old)
    assert cfg.embedding == AdaptiveConfig(cutoffs=[16, 48], div_value=2.0)
    assert cfg.output == AdaptiveSoftmaxConfig(cutoffs=[16, 48], div_value=2.0, tail_projection=False, head_bias=True)
    cfg = model_from_saved(dict(saved, embedding="standard", output="mixture_of_softmaxes", mos_components=3))
    assert cfg.embedding is None and cfg.output == MixtureOfSoftmaxesConfig(components=3)
    assert model_from_saved(dict(saved, embedding="standard", output="softmax")).output is None


def test_hugging_face_export_refuses_these_options():
    from lm.model.convert import to_hf

    with pytest.raises(ValueError, match="model/output=mixture_of_softmaxes"):
        to_hf(built(**MOS))


# -- checkpoint / resume through lm train ----------------------------------------------------------


@pytest.mark.parametrize(
    "extra,objective",
    [
        (["model/output=adaptive_softmax", "model.tie_embeddings=false", "model.output.cutoffs=[64,128]"], "clm"),
        (["model/output=mixture_of_softmaxes", "model/embedding=adaptive", "model.tie_embeddings=false"], "clm"),
        (["model.arch=encoder_decoder", "model/memory=transparent"], "span"),
    ],
)
def test_training_resumes_bit_identically(tmp_path, extra, objective):
    from lm.cli.train import train
    from tests.engine_support import compose, loaders, tiny_overrides, train_losses

    def run(run_dir, steps):
        cfg = compose(tiny_overrides(run_dir, steps) + ["sched=constant", "model.dropout=0.1"] + extra)
        return train(cfg, loaders=loaders(cfg, objective=objective))

    run(tmp_path / "whole", 6)
    run(tmp_path / "split", 3)
    run(tmp_path / "split", 6)
    whole, split = train_losses(tmp_path / "whole"), train_losses(tmp_path / "split")
    assert list(split) == list(range(1, 7)) and split == whole
    assert all(math.isfinite(v) for v in whole.values())
