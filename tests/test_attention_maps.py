"""lm attention (issue 18, "Attention maps"): heatmaps of tiny trained runs for a decoder with its own
tokenizer, an encoder-decoder with Linformer, and an additive-attention decoder; the matrices drawn are
probabilities (rows sum to 1, causal maps zero above the diagonal); the refusals name the value and the
allowed range before any weight is read; lm report's run card carries the grid (a note for an RNN)."""

import json

import numpy as np
import pytest
from omegaconf import OmegaConf

pytest.importorskip("matplotlib")

from lm.cli.attention import main  # noqa: E402
from lm.report.attention_maps import attention_maps, encode_text, groups, load_model  # noqa: E402
from lm.report.attention_plots import grid_panels  # noqa: E402
from tests.engine_support import compose, loaders, tiny_overrides  # noqa: E402

TEXT = "the cat sat on the mat"


@pytest.fixture(scope="module")
def decoder_run(tmp_path_factory):
    """A 2-step lm train run of model=tiny on a prepared corpus (char tokenizer): the run's own tokenizer."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from lm.cli.train import train
    from lm.config import conf_dir, register_train_configs

    work = tmp_path_factory.mktemp("attn_dec")
    words = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "in", "fog"]
    lines = [" ".join(words[(i * j + j) % len(words)] for j in range(6)) for i in range(120)]  # distinct documents
    (work / "corpus.txt").write_text("\n".join(lines) + "\n")
    data = {
        "name": "cats",
        "dir": work / "data",
        "source": work / "corpus.txt",
        "tokenizer": "char",
        "n_sentinels": 0,
        "workers": 1,
        "val_fraction": 0.1,
        "doc_split": "line",
    }
    overrides = [o for o in tiny_overrides(work / "run", 2) if not o.startswith("train.eval_batches")]
    overrides += ["train.eval_batches=1", "train.ckpt_interval=2", "~data", *(f"data.{k}={v}" for k, v in data.items())]
    register_train_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        cfg = hydra_compose(config_name="train", overrides=overrides)
    train(cfg)
    return work / "run"


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    from lm.data.tokenizer import train as train_tokenizer

    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_tokenizer("char", [TEXT, "a dog ran in the fog"], n_sentinels=0).save(path)
    return path


def synthetic_run(root, name, extra, objective):
    from lm.cli.train import train

    path = root / name
    cfg = compose(tiny_overrides(path, 2, ckpt_interval=2) + extra)
    train(cfg, loaders=loaders(cfg, objective=objective))
    return path


@pytest.fixture(scope="module")
def linformer_run(tmp_path_factory):
    return synthetic_run(
        tmp_path_factory.mktemp("attn_ed"),
        "run",
        ["model.arch=encoder_decoder", "model.n_decoder_layers=1", "model/attn=linformer"],
        "span",
    )


@pytest.fixture(scope="module")
def additive_run(tmp_path_factory):
    return synthetic_run(tmp_path_factory.mktemp("attn_add"), "run", ["model/attn=additive"], "clm")


def _error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lm attention: error: ") and "\n" not in err, err
    return err


def _assert_probabilities(panel, causal=False):
    assert np.allclose(panel.sum(-1), 1.0, atol=1e-5)
    assert (panel >= 0).all()
    if causal:
        assert np.all(np.triu(panel, k=1) == 0.0)  # no query sees a later token


def test_decoder_run_writes_grid_single_and_page(decoder_run, tmp_path, capsys):
    out = tmp_path / "maps"
    assert main([str(decoder_run), "--text", TEXT, "--layer", "1", "--head", "2", "--out", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    assert names == {"grid_decoder_self.png", "decoder_self_layer1_head2.png", "attention.md", "attention.html"}
    for png in ("grid_decoder_self.png", "decoder_self_layer1_head2.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md, html = (out / "attention.md").read_text(), (out / "attention.html").read_text()
    assert "| token | `t` | `h` | `e` | `·` | `c` |" in md  # the run's char tokenizer; spaces shown as '·'
    assert "model/attn=scaled_dot, 4 heads" in md  # the option's name as `lm train model/attn=` takes it
    assert html.count("data:image/png;base64,") == 2  # self-contained: both figures embedded
    # --layer alone: every head of that layer; the default out is <run_dir>/attention/<step_N>, outside
    # checkpoints/, whose rotation would delete it with the checkpoint (issue 48 item 5)
    before = sorted(p.relative_to(decoder_run) for p in (decoder_run / "checkpoints").rglob("*"))
    assert main([str(decoder_run), "--text", TEXT, "--layer", "0"]) == 0
    default = sorted(p.relative_to(decoder_run).as_posix() for p in decoder_run.glob("attention/*/decoder_self_*"))
    step = (decoder_run / "checkpoints" / "latest").read_text().strip()  # the checkpoint drawn: step_<N>
    assert default == [f"attention/{step}/decoder_self_layer0_head{h}.png" for h in range(4)]
    assert sorted(p.relative_to(decoder_run) for p in (decoder_run / "checkpoints").rglob("*")) == before


def test_decoder_grid_is_layers_by_heads_of_causal_probabilities(decoder_run):
    loaded = load_model(decoder_run)
    ids = encode_text(loaded, TEXT)
    ((key, layer_maps),) = groups(attention_maps(loaded, ids)).items()
    assert key == ("decoder", "self")
    panels = grid_panels(layer_maps)
    assert len(panels) == 2 and all(len(row) == 4 for row in panels)  # model=tiny: 2 layers x 4 heads
    for row in panels:
        for panel in row:
            assert panel.shape == (len(TEXT), len(TEXT))
            _assert_probabilities(panel, causal=True)
    assert layer_maps[0].queries[:3] == ["t", "h", "e"] and layer_maps[0].keys == layer_maps[0].queries


def test_encoder_decoder_linformer_draws_cross_attention_over_projected_rows(linformer_run, tokenizer_file, tmp_path):
    out = tmp_path / "maps"
    assert (
        main([str(linformer_run), "--text", TEXT, "--tokenizer", str(tokenizer_file), "--head", "0", "--out", str(out)])
        == 0
    )
    names = {p.name for p in out.iterdir()}
    assert {"grid_encoder_self.png", "grid_decoder_self.png", "grid_decoder_cross.png"} <= names
    assert {"encoder_self_layer1_head0.png", "decoder_cross_layer0_head0.png"} <= names
    assert "decoder_self_layer1_head0.png" not in names  # model.n_decoder_layers=1
    md = (out / "attention.md").read_text()
    assert "The decoder reads the text shifted right" in md and "## Decoder input tokens" in md
    assert "k projected rows E1..Ek" in md

    loaded = load_model(linformer_run, str(tokenizer_file))
    ids = encode_text(loaded, TEXT)
    grids = groups(attention_maps(loaded, ids))
    k = 64 // 4  # model.max_seq_len=64, model.attn.k unset
    enc, dec, cross = grids["encoder", "self"], grids["decoder", "self"], grids["decoder", "cross"]
    assert [len(g) for g in (enc, dec, cross)] == [2, 1, 1]
    assert enc[0].keys == [f"E{i}" for i in range(1, k + 1)] and cross[0].keys == enc[0].keys
    assert dec[0].keys == dec[0].queries and dec[0].queries[0] != "t"  # decoder start token first, then the text
    assert dec[0].queries[1:] == [c.replace(" ", "·") for c in TEXT[:-1]]
    for g, shape, causal in (
        (enc, (len(TEXT), k), False),
        (cross, (len(TEXT), k), False),
        (dec, (len(TEXT), len(TEXT)), True),
    ):
        for panel in grid_panels(g)[0]:
            assert panel.shape == shape
            _assert_probabilities(panel, causal)


def test_additive_attention_maps_are_causal_probabilities(additive_run, tokenizer_file, tmp_path):
    out = tmp_path / "maps"
    assert main([str(additive_run), "--text", TEXT, "--tokenizer", str(tokenizer_file), "--out", str(out)]) == 0
    assert (out / "grid_decoder_self.png").is_file() and "model/attn=additive" in (out / "attention.md").read_text()
    loaded = load_model(additive_run, str(tokenizer_file))
    for panel in np.concatenate([m.probs for m in attention_maps(loaded, encode_text(loaded, TEXT))]):
        _assert_probabilities(panel, causal=True)


def test_out_of_range_layer_head_and_long_text_are_refused(decoder_run, capsys):
    err = _error([str(decoder_run), "--text", TEXT, "--layer", "2"], capsys)
    assert "--layer 2 is out of range" in err and "2 layers per stack (decoder: 2)" in err and "[0, 1]" in err
    err = _error([str(decoder_run), "--text", TEXT, "--head", "-1"], capsys)
    assert "--head -1 is out of range" in err and "model.n_heads=4" in err and "[0, 3]" in err
    err = _error([str(decoder_run), "--text", "x" * 65], capsys)
    assert "--text is 65 tokens long" in err and "model.max_seq_len=64" in err and "at most 64 tokens" in err
    err = _error([str(decoder_run), "--text", TEXT, "--decoder-text", "a dog"], capsys)
    assert "--decoder-text applies to encoder-decoders only" in err and "model.arch=decoder" in err
    assert "nowhere: no such directory" in _error([str(decoder_run.parent / "nowhere"), "--text", TEXT], capsys)


def test_an_rnn_is_refused_before_its_weights_are_read(tmp_path, capsys):
    from lm.model.config import model_preset

    export = tmp_path / "lstm_export"
    export.mkdir()
    node = OmegaConf.to_container(OmegaConf.structured(model_preset("lstm")), resolve=True)
    (export / "config.json").write_text(json.dumps({**node, "_lm_class": "RNNLM"}))
    (export / "model.safetensors").write_bytes(b"not read")  # would fail to load if anything read it
    err = _error([str(export), "--text", TEXT], capsys)
    assert "a model/family=lstm model: it has no attention to draw" in err


def test_run_card_shows_the_attention_grid(decoder_run, tmp_path):
    from lm.cli.report import main as report_main

    out = tmp_path / "card"
    assert report_main([str(decoder_run), "-o", str(out)]) == 0
    md = (out / "card.md").read_text()
    assert "## Attention" in md and "![decoder self-attention](attention_decoder_self.png)" in md
    assert (out / "attention_decoder_self.png").read_bytes()[:4] == b"\x89PNG"
    assert "The quick brown fox" in md


def test_run_card_of_an_rnn_says_why_there_is_no_grid(tmp_path):
    from lm.cli.report import main as report_main
    from lm.cli.train import train

    run = tmp_path / "lstm"
    cfg = compose([o.replace("model=tiny", "model=lstm") for o in tiny_overrides(run, 2, ckpt_interval=2)])
    train(cfg, loaders=loaders(cfg))
    assert report_main([str(run), "-o", str(tmp_path / "card")]) == 0
    md = (tmp_path / "card" / "card.md").read_text()
    assert "## Attention\n\nNo attention maps: a model/family=lstm model has no attention." in md
    assert not list((tmp_path / "card").glob("attention_*.png"))


def test_an_export_directory_is_read_and_left_replaceable(decoder_run, tmp_path, capsys):
    from lm.cli.export import export, is_export

    out = export(decoder_run, hf=False)  # <checkpoint>/export: the checkpoint's config.yaml names the tokenizer
    assert main([str(out), "--text", TEXT, "--head", "1"]) == 0
    maps = out.with_name("export-attention")
    assert {"grid_decoder_self.png", "decoder_self_layer0_head1.png", "decoder_self_layer1_head1.png"} <= {
        p.name for p in maps.iterdir()
    }
    assert is_export(out)  # nothing was written into the export: lm export --force can still replace it
    alone = export(decoder_run, tmp_path / "alone", hf=False)  # no config.yaml beside it: no tokenizer known
    assert "needs --tokenizer <path to tokenizer.json" in _error([str(alone), "--text", TEXT], capsys)


@pytest.mark.parametrize("option", ["synthesizer_random", "lightweight_conv"])
def test_synthesizer_and_convolution_maps(option, tmp_path, tokenizer_file):
    run = synthetic_run(tmp_path, option, [f"model/attn={option}"], "clm")
    assert main([str(run), "--text", TEXT, "--tokenizer", str(tokenizer_file), "--out", str(tmp_path / "maps")]) == 0
    assert f"model/attn={option}," in (tmp_path / "maps" / "attention.md").read_text()  # not synthesizerrandom
    loaded = load_model(run, str(tokenizer_file))
    (layer_maps,) = groups(attention_maps(loaded, encode_text(loaded, TEXT))).values()
    for panel in (p for row in grid_panels(layer_maps) for p in row):
        assert panel.shape == (len(TEXT), len(TEXT)) and np.all(np.triu(panel, k=1) == 0.0)  # causal
        if option == "synthesizer_random":
            _assert_probabilities(panel, causal=True)
        else:  # a banded kernel: rows whose window lies inside the text sum to 1
            assert np.allclose(panel[-1].sum(), 1.0, atol=1e-5)


def test_the_text_is_escaped_in_the_html_page(decoder_run, tmp_path):
    """issue 49 item 7: --text '<script>...' landed in attention.html as markup."""
    out = tmp_path / "maps"
    assert (
        main([str(decoder_run), "--text", "<script>alert(1)</script> [a](javascript:alert(2))", "--out", str(out)]) == 0
    )
    html = (out / "attention.html").read_text()
    assert "<script" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert 'href="javascript:' not in html and '<a href="#">a</a>' in html  # a link's script scheme dropped


def test_an_out_that_is_a_file_is_one_line(decoder_run, tmp_path, capsys):
    (tmp_path / "notes.md").write_text("mine")
    for out in (tmp_path / "notes.md", tmp_path / "notes.md" / "maps"):
        err = _error([str(decoder_run), "--text", TEXT, "--out", str(out)], capsys)
        assert err == (
            f"lm attention: error: --out {out}: {tmp_path / 'notes.md'} is a file, not a directory; name a "
            f"directory (new, or one lm attention wrote before)"
        )
    assert (tmp_path / "notes.md").read_text() == "mine"


def test_a_users_file_at_out_is_never_replaced(decoder_run, tmp_path, capsys):
    """lm attention --out docs replaced docs/attention.md (and any figure of a name it writes) without a word."""
    out = tmp_path / "docs"
    out.mkdir()
    for name in ("attention.md", "grid_decoder_self.png", "decoder_self_layer1_head0.png"):
        (out / name).write_bytes(b"mine")
        err = _error([str(decoder_run), "--text", TEXT, "--layer", "1", "--head", "0", "--out", str(out)], capsys)
        assert err == (
            f"lm attention: error: {out / name} exists and is not a file lm attention wrote; the maps would replace "
            f"it: pass --out <another directory>, or move the file"
        )
        assert sorted(p.name for p in out.iterdir()) == [name]  # nothing written beside it either
        (out / name).unlink()
    for _ in range(2):  # its own files are replaced by the next call
        assert main([str(decoder_run), "--text", TEXT, "--head", "0", "--out", str(out)]) == 0
    assert not list(out.glob(".*"))  # no temporary file left
