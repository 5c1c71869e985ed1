"""RNN baselines (model=lstm|gru|rnn: model/family=lstm|gru|rnn, lm/zoo/rnn.py): the model against hand-written
cell equations, causality, generation, padding, FLOPs, refusals of Transformer options, configs saved before the
move; lm train (single, DDP on 2 gloo ranks, exact resume), lm finetune (pooling, a bidirectional classifier from a
unidirectional LM), and the ablate_seq_model sweep through lm report."""

import json
import multiprocessing as mp
import re
from dataclasses import replace

import pytest
import torch
from omegaconf import OmegaConf

from lm.config import ConfigError
from lm.model import build_model
from lm.model.config import model_preset
from lm.model.flops import flops_per_token, num_params
from lm.model.generate import generate
from lm.model.lm import SequenceClassifier
from lm.model.validate import check_objective
from lm.zoo.rnn import RNNLM, load_unidirectional
from tests.engine_support import compose, free_port, loaders, tiny_overrides, train_losses
from tests.glue_support import easy_glue as easy_glue  # the SST-2-shaped easy task (a module fixture, re-exported)

CELLS = ["lstm", "gru", "rnn"]
SMALL = ["model.vocab_size=48", "model.dim=16", "model.n_layers=2"]


def small(cell, *extra):
    return model_preset(cell, [*SMALL, *extra])


def built(cfg, seed=0):
    torch.manual_seed(seed)
    return build_model(cfg).eval()


# -- the model ------------------------------------------------------------------------------------


def test_presets_are_the_three_cells():
    for cell, cls in (("lstm", torch.nn.LSTM), ("gru", torch.nn.GRU), ("rnn", torch.nn.RNN)):
        cfg = model_preset(cell)
        assert (cfg.arch, cfg.family.cell, cfg.norm, cfg.ffn, cfg.pos) == ("decoder", cell, None, None, None)
        model = build_model(cfg)
        assert isinstance(model, RNNLM) and type(model.rnn) is cls and model.rnn.num_layers == cfg.n_layers == 2
        assert model.head.proj.weight is model.embed.tok.weight  # tied output layer
        assert isinstance(model.proj, torch.nn.Identity)  # hidden = dim: no projection


def test_one_layer_lstm_matches_the_cell_equations():
    """Logits of a 1-layer LSTM LM against the LSTM equations written out here (Hochreiter &
    Schmidhuber 1997 with a forget gate; torch's gate order i, f, g, o), hidden 12 projected to dim 16."""
    cfg = small("lstm", "model.n_layers=1", "model.family.hidden=12")
    model = built(cfg)
    x = torch.randint(0, 48, (2, 7))
    W, U = model.rnn.weight_ih_l0, model.rnn.weight_hh_l0
    b = model.rnn.bias_ih_l0 + model.rnn.bias_hh_l0
    h, c, outs = torch.zeros(2, 12), torch.zeros(2, 12), []
    for t in range(7):
        i, f, g, o = (model.embed.tok.weight[x[:, t]] @ W.T + h @ U.T + b).chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        outs.append(h)
    feats = torch.stack(outs, 1) @ model.proj.weight.T + model.proj.bias  # (B, T, D)
    want = feats @ model.embed.tok.weight.T  # tied output
    torch.testing.assert_close(model(x).logits, want, atol=1e-5, rtol=1e-5)


def test_one_layer_gru_matches_the_cell_equations():
    """Cho et al. 2014 as torch writes it: n = tanh(W_n x + b_in + r * (U_n h + b_hn))."""
    cfg = small("gru", "model.n_layers=1")
    model = built(cfg)
    x = torch.randint(0, 48, (2, 5))
    W, U, bi, bh = model.rnn.weight_ih_l0, model.rnn.weight_hh_l0, model.rnn.bias_ih_l0, model.rnn.bias_hh_l0
    h, outs = torch.zeros(2, 16), []
    for t in range(5):
        gi = (model.embed.tok.weight[x[:, t]] @ W.T + bi).chunk(3, -1)
        gh = (h @ U.T + bh).chunk(3, -1)
        r, z = torch.sigmoid(gi[0] + gh[0]), torch.sigmoid(gi[1] + gh[1])
        n = torch.tanh(gi[2] + r * gh[2])
        h = (1 - z) * n + z * h
        outs.append(h)
    torch.testing.assert_close(model.features(x), torch.stack(outs, 1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("cell", CELLS)
def test_future_tokens_do_not_change_earlier_logits(cell):
    model = built(small(cell))
    x = torch.randint(0, 48, (2, 10))
    y = x.clone()
    y[:, 6:] = torch.randint(0, 48, (2, 4))
    a, b = model(x).logits, model(y).logits
    torch.testing.assert_close(a[:, :6], b[:, :6], atol=0, rtol=0)
    assert (a[:, 6:] - b[:, 6:]).abs().max() > 1e-4


@pytest.mark.parametrize("cell", CELLS)
def test_generation_carries_the_state(cell):
    """Greedy generation step by step (the state as cache) equals re-reading the whole prefix each time."""
    model = built(small(cell))
    prompt = torch.randint(0, 48, (2, 5))
    got = generate(model, prompt, 6)
    seq = prompt
    for _ in range(6):
        seq = torch.cat([seq, model(seq).logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(got, seq[:, 5:])


@pytest.mark.parametrize("cell", CELLS)
def test_a_few_steps_lower_the_loss(cell):
    """30 AdamW steps on a counting task (the next token is this one + 1) with the preset's init and dropout."""
    model = built(small(cell, "model.dropout=0.1"))
    model.train()
    x = (torch.arange(4)[:, None] * 7 + torch.arange(16)) % 48  # (B, T)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        loss = model(x, labels=(x + 1) % 48).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 1.5, losses[::10]


def test_parameters_and_flops_from_the_config():
    """An LSTM layer has 4 gates of (in + hidden) x hidden weights and two biases; GRU 3; RNN 1.
    FLOPs per token are 6 per matmul weight (recurrent, projection, tied head) and do not grow with T."""
    D, H, V = 16, 24, 48
    for cell, gates in (("lstm", 4), ("gru", 3), ("rnn", 1)):
        cfg = small(cell, f"model.family.hidden={H}")
        recurrent = gates * (H * (D + H) + 2 * H) + gates * (H * (H + H) + 2 * H)
        assert num_params(cfg) == V * D + recurrent + (H * D + D)
        weights = gates * H * (D + H) + gates * H * 2 * H + H * D + V * D
        assert flops_per_token(cfg, 32) == flops_per_token(cfg, 1024) == 6 * weights
    assert (
        num_params(small("lstm", "model.family.bidirectional=true"))
        == V * D + 2 * (4 * (16 * 32 + 32) + 4 * (16 * 48 + 32)) + 32 * D + D
    )  # layer 2 reads both directions; 2H -> D projection


# -- refusals ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override,named",
    [
        ("model/pos=rope", "model/pos=rope"),
        ("model/norm=rmsnorm", "model/norm=rmsnorm"),
        ("model/ffn=swiglu", "model/ffn=swiglu"),
        ("model.n_heads=8", "model.n_heads=8"),
        ("model.qk_norm=true", "model.qk_norm=True"),
        ("model.activation_checkpointing=true", "activation_checkpointing"),
        ("model/ffn=moe", "model/ffn=moe"),
        ("model/block=pkm", "model/block=pkm"),
        ("model/stack=funnel", "model/stack=funnel"),
    ],
)
def test_transformer_options_are_refused_naming_the_field(override, named):
    with pytest.raises(ConfigError) as e:
        build_model(model_preset("lstm", [override]))
    msg = str(e.value)
    assert named in msg and "Transformer option" in msg and "model.family.{cell, hidden, bidirectional" in msg


def test_bad_rnn_values_are_refused():
    with pytest.raises(ConfigError, match=r"model.family.hidden=0 must be a positive integer"):
        build_model(model_preset("gru", ["model.family.hidden=0"]))
    with pytest.raises(ConfigError, match=r"nonlinearity=relu applies to model.family.cell=rnn only"):
        build_model(model_preset("lstm", ["model.family.nonlinearity=relu"]))
    with pytest.raises(ConfigError, match=r"model.family.cell.*lstm.*gru.*rnn|Invalid value 'cnn'"):
        model_preset("lstm", ["model.family.cell=cnn"])
    # a Transformer preset under the recurrent family: what differs from ModelConfig's defaults is refused by name
    with pytest.raises(ConfigError, match=r"model/pos=rope is a Transformer option; an RNN model"):
        build_model(replace(model_preset("tiny", ["model/pos=rope"]), family=model_preset("lstm").family))
    with pytest.raises(ConfigError, match=r"model.arch=encoder with model/family=lstm: a recurrent LM reads left"):
        build_model(model_preset("lstm", ["model.arch=encoder"]))
    assert build_model(model_preset("rnn", ["model.family.nonlinearity=relu"])).rnn.nonlinearity == "relu"


def test_a_config_saved_with_arch_rnn_loads_as_the_family_option():
    """Runs saved before the move (lm/model/upgrade.py): model.arch=rnn with the model.rnn node is model=lstm's
    decoder with model/family=lstm now, the same model and parameter names; the old overrides are refused in one
    line naming the new spelling."""
    from lm.model.config import model_from_saved
    from lm.zoo.rnn import RNNConfig

    cfg = small("gru", "model.family.hidden=12")
    node = OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True)  # as config.yaml holds it
    old = {k: v for k, v in node.items() if k != "family"}
    old.update(arch="rnn", rnn={k: v for k, v in node["family"].items() if not k.startswith("_")})
    loaded = model_from_saved(old)
    assert isinstance(loaded.family, RNNConfig) and loaded.family == cfg.family and loaded.arch == cfg.arch == "decoder"
    assert built(loaded).state_dict().keys() == built(cfg).state_dict().keys()
    assert model_from_saved({**node, "rnn": None}).family == cfg.family  # a run saved with the node unset
    for arg, new in [
        ("model.arch=rnn", "write model=lstm, model=gru or model=rnn"),
        ("model.rnn.hidden=12", "write model.family.hidden=12"),
        ("model.rnn.cell=gru", "write model.family.cell=gru"),
    ]:
        with pytest.raises(ConfigError, match=f"^{re.escape(arg)}: this option moved to the zoo .*{re.escape(new)}"):
            model_preset("lstm", [arg])
    assert model_preset("tiny", ["model.arch=encoder"]).arch == "encoder"  # other values of model.arch are not moved


def test_pretraining_objectives():
    check_objective(model_preset("lstm"), "clm")
    with pytest.raises(ConfigError, match="clm .*next-token prediction. only"):
        check_objective(model_preset("lstm"), "mlm")
    with pytest.raises(ConfigError, match="bidirectional=true reads the tokens it would predict"):
        check_objective(model_preset("lstm", ["model.family.bidirectional=true"]), "clm")


# -- classification: pooling, padding, a bidirectional classifier from a unidirectional LM ---------------


def _padded_batch():
    """Two sequences of lengths 9 and 5, right-padded to 9, with junk ids in the padding."""
    x = torch.randint(1, 48, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 5:] = 0
    return x, mask


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("how", ["last", "mean"])
def test_padding_does_not_influence_the_pooled_output(bidirectional, how):
    model = built(small("lstm", f"model.family.bidirectional={bidirectional}", "model.family.hidden=12"))
    x, mask = _padded_batch()
    pooled = model.pooled(x, mask, how=how)
    alone = model.pooled(x[1:, :5], how=how)  # the short sequence with no padding at all
    torch.testing.assert_close(pooled[1], alone[0], atol=1e-6, rtol=1e-6)
    y = x.clone()
    y[1, 5:] = torch.randint(1, 48, (4,))  # other junk in the pads: nothing moves
    torch.testing.assert_close(model.pooled(y, mask, how=how), pooled, atol=0, rtol=0)
    if bidirectional and how == "last":  # the backward direction's final state is at the first token
        H = 12
        out, _ = model.recurrent(x[1:, :5])
        want = model.proj(torch.cat([out[0, -1, :H], out[0, 0, H:]]))
        torch.testing.assert_close(pooled[1], want, atol=1e-6, rtol=1e-6)


def test_first_token_pooling_is_refused_for_rnns():
    with pytest.raises(ValueError, match="allowed: last, mean"):
        built(small("gru")).pooled(torch.ones(1, 3, dtype=torch.long), how="first")


@pytest.mark.parametrize("hidden", [16, 12])  # without and with a projection in the unidirectional model
def test_bidirectional_classifier_from_a_unidirectional_lm_starts_where_it_was(hidden):
    uni_cfg = small("lstm", f"model.family.hidden={hidden}")
    uni = built(uni_cfg, seed=0)
    bi = built(replace(uni_cfg, family=replace(uni_cfg.family, bidirectional=True)), seed=1)
    state = {k: v for k, v in uni.state_dict().items() if not k.startswith("head.")}
    load_unidirectional(bi, state)
    x, mask = _padded_batch()
    for how in ("last", "mean"):
        torch.testing.assert_close(bi.pooled(x, mask, how=how), uni.pooled(x, mask, how=how), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(bi.rnn.weight_ih_l0, uni.rnn.weight_ih_l0, atol=0, rtol=0)
    assert bi.rnn.weight_ih_l0_reverse.abs().sum() > 0  # the backward direction is initialised, not zero
    # The backward direction learns: its projection columns get a gradient on the first step.
    clf = SequenceClassifier(bi, 2)
    clf(x, mask, labels=torch.tensor([0, 1])).loss.backward()
    assert bi.proj.weight.grad[:, hidden:].abs().sum() > 0


# -- lm train: single process, exact resume, DDP on 2 gloo ranks -------------------------------------


def rnn_overrides(run_dir, steps, cell="lstm", **train):
    return tiny_overrides(run_dir, steps, **train) + [
        f"model={cell}",
        "model.vocab_size=64",
        "model.dim=32",
        "model.max_seq_len=64",
        "model.family.hidden=40",
    ]


def run_train(overrides):
    from lm.cli.train import train

    cfg = compose(overrides)
    return cfg, train(cfg, loaders=loaders(cfg))


@pytest.mark.parametrize("cell", CELLS)
def test_lm_train_learns_and_records_params_and_flops(tmp_path, cell):
    from tests.engine_support import metrics

    run_train(rnn_overrides(tmp_path, 20, cell, ckpt_interval=10) + ["optim.lr=1e-2"])
    losses = train_losses(tmp_path)
    assert list(losses) == list(range(1, 21)) and losses[20] < losses[1] - 0.5
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_00000020"
    saved = OmegaConf.load(tmp_path / "config.yaml").model
    assert saved.arch == "decoder" and saved.family.cell == cell and saved.pos is None
    from lm.model.config import model_from_saved

    assert num_params(model_from_saved(saved)) == sum(
        p.numel() for p in build_model(model_from_saved(saved)).parameters()
    )
    assert any("tokens_per_s" in m for m in metrics(tmp_path))


def test_lm_train_resumes_an_lstm_bit_identically(tmp_path):
    extra = ["sched=constant", "model.dropout=0.2"]  # dropout: the RNG state must come back too
    run_train(rnn_overrides(tmp_path / "whole", 8) + extra)
    run_train(rnn_overrides(tmp_path / "split", 4, ckpt_interval=4) + extra)
    run_train(rnn_overrides(tmp_path / "split", 8, ckpt_interval=4) + extra)
    whole, split = train_losses(tmp_path / "whole"), train_losses(tmp_path / "split")
    assert list(split) == list(range(1, 9)) and split == whole


def test_export_writes_safetensors_and_says_why_there_is_no_hf_directory(tmp_path, caplog):
    from safetensors.torch import load_file

    from lm.cli.export import main as lm_export
    from lm.model.config import model_from_saved

    run_train(rnn_overrides(tmp_path, 2, cell="gru", ckpt_interval=2))
    with caplog.at_level("WARNING", logger="lm"):
        lm_export([str(tmp_path)])
    out = tmp_path / "checkpoints" / "step_00000002" / "export"
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert "no Hugging Face family matches model/family=gru" in caplog.text
    node = json.loads((out / "config.json").read_text())
    assert node.pop("_lm_class") == "RNNLM"
    model = build_model(model_from_saved(node))
    missing, unexpected = model.load_state_dict(load_file(str(out / "model.safetensors")), strict=False)
    assert not unexpected and set(missing) <= {"head.proj.weight"}  # the tied output is the embedding
    assert model.rnn.weight_hh_l1.shape == (3 * 40, 40)


def test_lm_train_refuses_a_bidirectional_rnn_and_transformer_options_before_work(tmp_path):
    from lm.cli.train import train

    cfg = compose(rnn_overrides(tmp_path / "a", 2) + ["model.family.bidirectional=true"])
    with pytest.raises(ConfigError, match="bidirectional=true reads the tokens it would predict"):
        train(cfg, loaders=loaders(cfg))
    cfg = compose(rnn_overrides(tmp_path / "b", 2) + ["model/pos=rope"])
    with pytest.raises(ConfigError, match="model/pos=rope is a Transformer option"):
        train(cfg, loaders=loaders(cfg))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def _ddp_worker(rank, port, overrides, out):
    import os

    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": "2",
            "OMP_NUM_THREADS": "1",
            "WANDB_MODE": "disabled",
        }
    )
    torch.set_num_threads(1)
    from lm.cli.train import train
    from lm.engine import dist as dist_utils

    try:
        cfg = compose(overrides)
        result = train(cfg, loaders=loaders(cfg, rank, 2))
        out.put((rank, "ok", result.engine.world_size))
    except BaseException:  # noqa: BLE001 - reported to the parent
        import traceback

        out.put((rank, "error", traceback.format_exc()))
    finally:
        dist_utils.shutdown()


@pytest.mark.distributed
@pytest.mark.parametrize(
    "engine", ["ddp", pytest.param("fsdp2", marks=pytest.mark.slow), pytest.param("zero3", marks=pytest.mark.slow)]
)
def test_two_gloo_ranks_match_one_process(tmp_path, engine):
    """Micro-batch 2 on each of 2 ranks = micro-batch 4 in one process (the synthetic stream is split by
    global sample index): the same losses to float tolerance. FSDP2 shards the model as one unit (it has
    no Block); ZeRO-3 partitions the LSTM's weights like any others."""
    extra = ["train.threads=1"]
    run_train(rnn_overrides(tmp_path / "single", 5, micro_batch_size=4) + extra)
    overrides = (
        rnn_overrides(tmp_path / "ddp", 5, micro_batch_size=2) + extra + [f"engine={engine}", "train.world_size=2"]
    )
    ctx = mp.get_context("spawn")
    out, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_ddp_worker, args=(r, port, overrides, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert all(status == "ok" for _, status, _ in results), results
    assert sorted(ws for _, _, ws in results) == [2, 2]
    single, ddp = train_losses(tmp_path / "single"), train_losses(tmp_path / "ddp")
    assert list(ddp) == list(range(1, 6))
    assert [ddp[s] for s in ddp] == pytest.approx([single[s] for s in single], rel=1e-5)


# -- lm finetune ----------------------------------------------------------------------------------------

LSTM_TINY = ["model=lstm", "model.vocab_size=320", "model.dim=32", "model.n_layers=1", "model.family.hidden=48"]


@pytest.fixture(scope="module")
def lstm_run(tmp_path_factory, easy_glue):
    """A short lm train run of a tiny LSTM on the easy task's sentences (BPE, 320 tokens); its work dir."""
    import random

    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from lm.cli.train import train
    from lm.config import conf_dir, register_train_configs
    from tests.glue_support import corpus_data, sentence

    work = tmp_path_factory.mktemp("lstm_pretrain")
    rng = random.Random(1)
    (work / "corpus.txt").write_text("\n".join(sentence(rng, i % 2) for i in range(600)) + "\n")
    overrides = [
        *LSTM_TINY,
        f"run_dir={work / 'run'}",
        "train.max_steps=20",
        "train.seq_len=32",
        "train.micro_batch_size=8",
        "optim.lr=3e-3",
        "train.eval_interval=0",
        "train.eval_batches=1",
        "train.ckpt_interval=20",
        "train.progress=false",
        *corpus_data(work, "easy"),
    ]
    register_train_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        cfg = hydra_compose(config_name="train", overrides=overrides)
    train(cfg)
    return work


def test_glue_finetune_of_a_tiny_lstm_learns_the_easy_task(tmp_path, easy_glue, lstm_run):
    from lm.cli.finetune import finetune
    from tests.glue_support import dev_acc, easy_task, finetune_cfg

    for pooling in ("last", "mean"):
        run_dir = tmp_path / pooling
        summary = finetune(
            finetune_cfg(run_dir, [f"init={lstm_run / 'run'}", f"pooling={pooling}", *easy_task(easy_glue, epochs=4)])
        )
        history = [h["main"] for h in summary["tasks"]["sst2"]["runs"]["0"]["history"]]
        assert max(history) > history[0], (pooling, history)  # it improves (measured: 83 -> 100, 88 -> 100)
        assert dev_acc(run_dir) > 90.0, (pooling, history)  # chance is 50


def test_bidirectional_finetune_from_a_unidirectional_lstm(tmp_path, easy_glue, lstm_run):
    from lm.cli.finetune import finetune
    from lm.glue.init import build_classifier, load_backbone
    from tests.glue_support import dev_acc, easy_task, finetune_cfg

    backbone = load_backbone(str(lstm_run / "run"))
    assert not backbone.model_cfg.family.bidirectional
    model = build_classifier(backbone, 2, 0.1, bidirectional=True)
    assert model.backbone.rnn.bidirectional and model.cfg.family.bidirectional
    assert torch.equal(model.backbone.rnn.weight_hh_l0, backbone.state_dict["rnn.weight_hh_l0"])
    run_dir = tmp_path / "bi"
    finetune(finetune_cfg(run_dir, [f"init={lstm_run / 'run'}", "bidirectional=true", *easy_task(easy_glue, epochs=4)]))
    assert dev_acc(run_dir) > 90.0  # measured: 82 after the first epoch, 100 after the second


def test_finetune_refuses_first_pooling_for_rnns_and_bidirectional_transformers(tmp_path, lstm_run):
    from lm.glue.init import InitError, build_classifier, load_backbone

    backbone = load_backbone(str(lstm_run / "run"))
    for how in ("first", "weighted_mean"):
        with pytest.raises(InitError, match=f"pooling={how} is for Transformer .* use pooling=last .* or pooling=mean"):
            build_classifier(backbone, 2, 0.1, pooling=how)
    tiny = load_backbone(
        "none", str(lstm_run / "data"), OmegaConf.structured(model_preset("tiny", ["model.vocab_size=320"]))
    )
    with pytest.raises(InitError, match="bidirectional=true widens a recurrent backbone"):
        build_classifier(tiny, 2, 0.1, bidirectional=True)


# -- experiment=ablate_seq_model ----------------------------------------------------------------------------


def test_ablate_seq_model_cells_are_parameter_matched():
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from lm.config import conf_dir, register_train_configs
    from lm.report.table import PARAM_MISMATCH

    register_train_configs()
    GlobalHydra.instance().clear()
    sizes = {}
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        for cell in ("transformer", "lstm", "gru"):
            cfg = hydra_compose(
                "train",
                overrides=["experiment=ablate_seq_model", f"experiment/ablate_seq_model={cell}"],
                return_hydra_config=True,
            )
            model = OmegaConf.to_object(cfg.model)
            sizes[cell] = (model.arch, model.family and model.family.cell, num_params(model))
    GlobalHydra.instance().clear()
    assert sizes == {
        "transformer": ("decoder", None, 858_880),
        "lstm": ("decoder", "lstm", 856_064),
        "gru": ("decoder", "gru", 863_104),
    }
    assert all(abs(n / 858_880 - 1) < min(0.005, PARAM_MISMATCH) for _, _, n in sizes.values())


@pytest.mark.slow
def test_ablate_seq_model_sweep_through_lm_report(tmp_path):
    """The real sweep at a tiny size (1 seed, 6 steps), on the char-level tiny Shakespeare, then lm report:
    one row per cell with validation loss and tokens/s."""
    import os
    import subprocess
    import sys

    from tests.engine_support import REPO, subprocess_env

    data = tmp_path / "data"
    cmd = [
        sys.executable,
        "-m",
        "lm.cli.train",
        "-m",
        "experiment=ablate_seq_model",
        "seed=0",
        "logger.group=seq",
        f"hydra.sweep.dir={tmp_path / 'runs'}",
        f"hydra.run.dir={tmp_path / 'runs'}",
        f"data.dir={data}",
        "train.max_steps=6",
        "train.seq_len=32",
        "train.micro_batch_size=4",
        "train.eval_interval=6",
        "train.eval_batches=2",
        "train.ckpt_interval=6",
        "train.log_interval=1",
        "train.progress=false",
        "train.threads=1",
    ]
    env = subprocess_env(LM_CACHE=str(tmp_path / "cache"), LM_DATA_MIRROR=os.environ.get("LM_DATA_MIRROR", ""))
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lm_report = "import sys; from lm.cli.report import main; sys.exit(main(sys.argv[1:]))"
    report = subprocess.run(
        [sys.executable, "-c", lm_report, str(tmp_path / "runs"), "--out", str(tmp_path / "report")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert report.returncode == 0, report.stdout[-3000:] + report.stderr[-3000:]
    table = (tmp_path / "report" / "report.md").read_text()
    assert "| variant | seeds | params | FLOPs/token | steps/s | tokens/s |" in table and "final val_loss" in table
    rows = {
        cell: next(line for line in table.splitlines() if line.startswith(f"| `experiment/ablate_seq_model={cell}` |"))
        for cell in ("transformer", "lstm", "gru")
    }
    for cell, params in (("transformer", "858.88k"), ("lstm", "856.06k"), ("gru", "863.10k")):
        assert f"| 1/1 | {params} |" in rows[cell] and rows[cell].endswith("| ok |"), rows[cell]
    vals = [
        json.loads(line)["val_loss"]
        for p in (tmp_path / "runs").rglob("metrics.jsonl")
        for line in p.read_text().splitlines()
        if "val_loss" in line
    ]
    assert len(vals) == 3 and all(3.0 < v < 6.5 for v in vals), vals  # near ln(256) = 5.55 after 6 steps
