"""lm report on a synthetic ffn x norm sweep: the table's numbers, the seed-noise rule, the files."""

import csv
import math

import pytest
from scipy import stats as sps

from lm.cli.report import main
from lm.report.runs import load_runs
from lm.report.table import build_rows
from lm.report.variants import group_variants
from tests.fixtures.runs.synthetic import loss_at, make_run

SEED_OFFSETS = (-0.01, 0.0, 0.01)  # the same per seed in every variant: sample std 0.01
EFFECT = {
    ("gelu", "layernorm"): 0.0,
    ("gelu", "rmsnorm"): 0.005,
    ("swiglu", "layernorm"): -0.1,
    ("swiglu", "rmsnorm"): -0.1,
}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    job = 0
    for (ffn, norm), effect in EFFECT.items():
        for seed, noise in enumerate(SEED_OFFSETS):
            make_run(
                root / str(job), ffn=ffn, norm=norm, seed=seed, offset=effect + noise, tokens_per_s=1000.0 + 100 * seed
            )
            job += 1
    return root


@pytest.fixture(scope="module")
def report(sweep):
    assert main([str(sweep)]) == 0
    return sweep / "report"


def test_variants_are_the_overrides_minus_the_seed(sweep):
    variants = group_variants(load_runs([sweep]))
    assert [v.label for v in variants] == [f"model/ffn={f} model/norm={n}" for f, n in EFFECT]
    assert [len(v.runs) for v in variants] == [3, 3, 3, 3]


@pytest.mark.parametrize("newer_lm", [False, True])
def test_two_sweeps_whose_grids_were_typed_in_another_order_make_one_variant_per_cell(tmp_path, newer_lm):
    """Seeds 0-1 from one sweep, seed 2 from a second whose command named model/norm before model/ffn: Hydra orders a
    cell's overrides as the command did, and the report still averages each cell over its three seeds. newer_lm: the
    second sweep ran after an lm update that added a config key, so the cells' resolved configs differ and only
    their overrides can join them (with the overrides compared in order: 8 rows, of 2 seeds and of 1)."""
    import yaml

    for (ffn, norm), effect in EFFECT.items():
        for seed, noise in enumerate(SEED_OFFSETS):
            d = make_run(tmp_path / ("b" if seed == 2 else "a") / f"{ffn}_{norm}_{seed}", ffn=ffn, norm=norm,
                         seed=seed, offset=effect + noise)  # fmt: skip
            if seed == 2:
                overrides = d / ".hydra" / "overrides.yaml"
                overrides.write_text(yaml.safe_dump(list(reversed(yaml.safe_load(overrides.read_text())))))
                if newer_lm:
                    config = yaml.safe_load((d / "config.yaml").read_text())
                    (d / "config.yaml").write_text(yaml.safe_dump({**config, "train": {**config["train"], "new": 1}}))
    rows = build_rows(group_variants(load_runs([tmp_path / "a", tmp_path / "b"])))
    assert [r["variant"] for r in rows] == [f"model/ffn={f} model/norm={n}" for f, n in EFFECT]
    for row, effect in zip(rows, EFFECT.values()):
        assert row["n_ok"] == 3 and row["final_loss"].mean == pytest.approx(loss_at(200, effect), abs=1e-9)
        assert row["final_loss"].std == pytest.approx(0.01, rel=1e-6)


def test_table_numbers_match_the_curves(sweep):
    rows = build_rows(group_variants(load_runs([sweep])))
    for row, effect in zip(rows, EFFECT.values()):
        final, early = row["final_loss"], row["early_loss"]
        # train loss averaged over the last 5% of 200 steps = only step 200 (logged every 10)
        assert final.mean == pytest.approx(loss_at(200, effect), abs=1e-9)
        assert final.std == pytest.approx(0.01, rel=1e-6)
        assert early.mean == pytest.approx(loss_at(20, effect), abs=1e-9)  # 1/8 of 200 steps -> step 20
        assert row["tokens_per_s"].mean == pytest.approx(1100.0)  # median per run, then mean over seeds
        assert row["steps_per_s"].mean == pytest.approx(1100.0 / 512)
    assert rows[1]["params"] < rows[0]["params"]  # RMSNorm has no bias
    assert abs(rows[2]["params"] / rows[0]["params"] - 1) < 0.01  # SwiGLU at 8/3 width: matched


def test_seed_noise_rule_is_welch(sweep):
    rows = build_rows(group_variants(load_runs([sweep])))
    # gelu+rmsnorm is 0.005 (half a seed-std) worse: Welch t = 0.005 / sqrt(2 * 0.01**2 / 3), df = 4
    t = 0.005 / math.sqrt(2 * 0.01**2 / 3)
    assert rows[1]["final_loss_p"] == pytest.approx(2 * sps.t.sf(t, 4), rel=1e-6)
    assert rows[1]["final_loss_p"] > 0.5
    assert rows[2]["final_loss_delta"] == pytest.approx(-0.1, abs=1e-9)
    assert rows[2]["final_loss_p"] == pytest.approx(2 * sps.t.sf(0.1 / math.sqrt(2 * 0.01**2 / 3), 4), rel=1e-6)
    assert rows[2]["final_loss_p"] < 1e-3


def test_markdown_and_csv(report):
    md = (report / "report.md").read_text()
    lines = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith("| `")}
    assert "+0.005 (p=0.57)" in lines["`model/ffn=gelu model/norm=rmsnorm`"]
    assert "-0.100 * (p=" in lines["`model/ffn=swiglu model/norm=layernorm`"]
    assert "(baseline)" in lines["`model/ffn=gelu model/norm=layernorm`"]
    assert "Welch" in md and "seeds: 0, 1, 2" in md
    rows = list(csv.DictReader((report / "report.csv").read_text().splitlines()))
    assert [r["variant"] for r in rows][2] == "model/ffn=swiglu model/norm=layernorm"
    assert float(rows[2]["final_loss_mean"]) == pytest.approx(loss_at(200, -0.1))
    assert float(rows[2]["final_loss_std"]) == pytest.approx(0.01)
    per_run = list(csv.DictReader((report / "runs.csv").read_text().splitlines()))
    assert len(per_run) == 12 and {r["status"] for r in per_run} == {"ok"}
    assert sorted(r["seed"] for r in per_run[:3]) == ["0", "1", "2"]


def test_html_is_self_contained(report):
    html = (report / "report.html").read_text()
    assert html.count('src="data:image/png;base64,') == 2
    assert 'src="loss_curves.png"' not in html and "<table>" in html
    for png in ("loss_curves.png", "final_loss.png"):
        assert (report / png).read_bytes()[:4] == b"\x89PNG"
        assert (report / png).stat().st_size < 200_000


def test_baseline_choice(sweep, tmp_path):
    assert main([str(sweep), "-o", str(tmp_path), "--baseline", "swiglu model/norm=layernorm"]) == 0
    rows = list(csv.DictReader((tmp_path / "report.csv").read_text().splitlines()))
    assert float(rows[0]["final_loss_delta"]) == pytest.approx(0.1)
    with pytest.raises(SystemExit) as e:
        main([str(sweep), "-o", str(tmp_path), "--baseline", "swiglu"])  # ambiguous
    assert e.value.code == 2


def test_parameter_mismatch_is_flagged(tmp_path):
    for seed in (0, 1):
        make_run(tmp_path / f"a{seed}", ffn="gelu", seed=seed)
        make_run(tmp_path / f"b{seed}", ffn="swiglu", seed=seed, model_extra=("model.ffn.hidden_mult=4",))
    assert main([str(tmp_path), "-o", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    flagged = [line for line in md.splitlines() if "⚠" in line and line.startswith("| `")]
    # a third matrix at 4x width: +2 * 64 * 256 weights (2 layers) on ~133k, about +25%
    assert len(flagged) == 1 and "swiglu" in flagged[0] and "(+25.0% ⚠)" in flagged[0]


def test_user_strings_reach_the_html_page_as_text(tmp_path):
    """issue 49 item 7: run names, overrides, titles and notes are the user's; none may become markup."""
    pytest.importorskip("markdown")
    from lm.report.html import to_html

    (tmp_path / "grid.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    md = (
        "# Report <img src=x onerror=alert(1)>\n\n| run | loss |\n|---|---|\n| <script>alert(2)</script> | 1.0 |\n\n"
        "[home](javascript:alert(3)) [doc](docs/a.md) [web](https://example.org)\n\n"
        '<div onclick="alert(4)">notes</div>\n\n![grid](grid.png) ![secret](/etc/secret.png) src="grid.png"\n'
    )
    page = to_html(md, "<script>alert(5)</script>", tmp_path)
    for markup in ("<script", "<img src=x", "<div", "javascript:"):
        assert markup not in page, markup
    assert "<title>&lt;script&gt;alert(5)&lt;/script&gt;</title>" in page
    assert "<td>&lt;script&gt;alert(2)&lt;/script&gt;</td>" in page
    assert '<a href="docs/a.md">doc</a>' in page and '<a href="https://example.org">web</a>' in page
    assert page.count('src="data:image/png;base64,') == 1  # our figure is embedded, not a file outside the report


def test_files_of_the_users_at_out_are_never_replaced(sweep, tmp_path, capsys):
    out = tmp_path / "docs"
    out.mkdir()
    for name, text in (("report.md", "# my conclusions\n"), ("runs.csv", "a,b\n1,2\n")):
        (out / name).write_text(text)
        with pytest.raises(SystemExit) as e:
            main([str(sweep), "-o", str(out), "--notes", str(out / "report.md")])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err == (
            f"lm report: error: {out / name} exists and is not a file lm report wrote; the report would replace "
            f"it: pass -o <another directory>, or move the file\n"
        )
        assert (out / name).read_text() == text and not (out / "report.html").exists()
        (out / name).rename(tmp_path / name)
    assert main([str(sweep), "-o", str(out), "--notes", str(tmp_path / "report.md")]) == 0
    assert main([str(sweep), "-o", str(out)]) == 0  # its own report is replaced
    (out / "card").mkdir()
    (out / "card" / "card.md").write_text("my run notes\n")
    with pytest.raises(SystemExit):
        main([str(sweep / "0"), "-o", str(out / "card")])
    assert (out / "card" / "card.md").read_text() == "my run notes\n"
    assert "card.md exists and is not a file lm report wrote" in capsys.readouterr().err


def _png(path, software=None):
    """A matplotlib PNG as a user makes one (matplotlib's own Software text), or marked `software`."""
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(1, 1))
    fig.savefig(path, **({"metadata": {"Software": software}} if software else {}))
    plt.close(fig)
    return path.read_bytes()


def test_a_figure_of_the_users_at_out_is_never_replaced(sweep, tmp_path, capsys):
    """lm report checked only its text files: a user's loss_curves.png at -o was overwritten."""
    from lm.report.outputs import SOFTWARE, ours

    out = tmp_path / "docs"
    out.mkdir()
    mine = _png(out / "loss_curves.png")
    with pytest.raises(SystemExit) as e:
        main([str(sweep), "-o", str(out)])
    assert e.value.code == 2 and "loss_curves.png exists and is not a file lm report wrote" in capsys.readouterr().err
    assert (out / "loss_curves.png").read_bytes() == mine and not (out / "report.md").exists()
    (out / "loss_curves.png").unlink()
    assert main([str(sweep), "-o", str(out)]) == 0
    assert all(ours(out / name) for name in ("loss_curves.png", "final_loss.png", "report.md", "runs.csv"))
    _png(out / "final_loss.png")  # a figure of an earlier lm report, before figures carried the mark
    assert ours(out / "final_loss.png")  # ... that its report.md shows: replaced
    assert main([str(sweep), "-o", str(out)]) == 0
    (out / "report.md").write_text("# my notes\n\n![final](final_loss.png)\n")
    _png(out / "final_loss.png")
    assert not ours(out / "final_loss.png")  # a user's page links it: theirs
    _png(out / "final_loss.png", SOFTWARE)
    assert ours(out / "final_loss.png")  # lm's mark
    (out / "card").write_text("a file")
    with pytest.raises(SystemExit):
        main([str(sweep / "0"), "-o", str(out / "card")])
    assert "-o " + str(out / "card") + ": " in capsys.readouterr().err


def test_a_report_stopped_halfway_leaves_no_earlier_page_looking_complete(sweep, tmp_path, monkeypatch):
    """report.html, written last, marks a complete report; a rewrite stopped halfway (a full disk at report.md)
    left the earlier report's page beside the new CSVs and figures."""
    import errno

    import lm.report.sweep as sweep_report

    out = tmp_path / "r"
    assert main([str(sweep), "-o", str(out)]) == 0
    write = sweep_report.atomic_write_text

    def full_at_report_md(path, text):
        if path.name == "report.md":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return write(path, text)

    monkeypatch.setattr(sweep_report, "atomic_write_text", full_at_report_md)
    with pytest.raises(SystemExit) as e:
        main([str(sweep), "-o", str(out)])
    assert "No space left on device" in e.value.code
    assert (out / "runs.csv").is_file() and not (out / "report.html").exists()


def test_a_transfer_md_of_lm_transfer_is_not_replaced_by_the_curve_report(tmp_path):
    from lm.cli.report import check_out
    from lm.report.runs import ReportError
    from lm.report.transfer import CURVE_NOTE

    (tmp_path / "transfer.md").write_text("# GLUE transfer: decoder, 0 pretraining tokens\n\nDev scores in points\n")
    with pytest.raises(ReportError, match="transfer.md exists and is not a file lm report wrote"):
        check_out(tmp_path, ["transfer.md"])  # lm report runs/t -o runs/t: lm transfer's own table
    (tmp_path / "transfer.md").write_text(f"# GLUE transfer\n\n{CURVE_NOTE}\n")
    check_out(tmp_path, ["transfer.md"])  # a curve report of lm report's: replaced


def test_a_cell_run_again_counts_once_and_seeds_are_in_number_order(tmp_path):
    """A grid run again with more cells puts its old cells at new job numbers: the same variant and seed twice,
    which the table averaged as two independent seeds (n=4 of 3 seeds, a std too small)."""
    for job, (seed, offset) in enumerate([(0, -0.01), (1, 0.0), (10, 0.01), (1, 0.05)]):  # the last repeats seed 1
        make_run(tmp_path / str(job), ffn="gelu", norm="layernorm", seed=seed, offset=offset)
    (row,) = build_rows(group_variants(load_runs([tmp_path])))
    assert row["n_ok"] == 3 and row["final_loss"].mean == pytest.approx(loss_at(200, 0.0), abs=1e-9)
    assert row["repeated"] == [(tmp_path / "3", f"the same variant and seed as {tmp_path / '1'}")]
    assert main([str(tmp_path)]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert "seeds: 0, 1, 10" in md and f"- `{tmp_path / '3'}`: the same variant and seed as {tmp_path / '1'}" in md
    per_run = list(csv.DictReader((tmp_path / "report" / "runs.csv").read_text().splitlines()))
    assert [r["status"] for r in per_run] == ["ok", "ok", "ok", "repeat"]


def test_runs_that_named_the_default_option_are_one_variant_with_those_that_did_not(tmp_path):
    """`model/ffn=gelu` on the command line beside runs that left the ffn at its default (gelu) made two rows of the
    same experiment, each averaging a share of the seeds; runs of another config stay apart."""
    import yaml

    for seed, noise in enumerate(SEED_OFFSETS):
        plain = make_run(tmp_path / f"default_{seed}", ffn="gelu", seed=seed, offset=noise)
        overrides = plain / ".hydra" / "overrides.yaml"
        overrides.write_text(yaml.safe_dump([o for o in yaml.safe_load(overrides.read_text()) if "ffn" not in o]))
    make_run(tmp_path / "named_3", ffn="gelu", seed=3, offset=0.02)
    make_run(tmp_path / "swiglu_0", ffn="swiglu", seed=0, offset=-0.1)
    rows = build_rows(group_variants(load_runs([tmp_path])))
    assert [(r["variant"], r["n_ok"]) for r in rows] == [("model/ffn=gelu", 4), ("model/ffn=swiglu", 1)]
    offsets = [*SEED_OFFSETS, 0.02]
    assert rows[0]["final_loss"].mean == pytest.approx(loss_at(200, sum(offsets) / 4), abs=1e-9)
