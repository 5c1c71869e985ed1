"""`lm attention RUN_OR_EXPORT --text "..."`: heatmaps of a trained model's attention probabilities.

    lm attention runs/pretrain --text "The cat sat on the mat."            # grids of all layers x heads
    lm attention runs/pretrain --text "..." --layer 3 --head 5 --out maps  # plus that head, tokens as labels
    lm attention runs/t5/checkpoints/step_00001000/export --text "..." --tokenizer data/tokenizer.json

Writes to --out (default <run_dir>/attention/<step_N>, or <export>-attention beside an export):
grid_<stack>_<self|cross>.png per attention stack (rows: layers, columns: heads), one PNG per requested
layer/head, and attention.md / attention.html listing the tokens. --layer alone draws every head of that
layer, --head alone that head in every layer. A file of one of those names there that lm attention did not
write (docs/attention.md, a figure of yours) is never replaced: the call is refused in one line.
Loading, checks and the maps are lm/report/attention_maps.py; drawing is lm/report/attention_plots.py.
Exit status 2 with one line when the request cannot be drawn (RNN run, out-of-range values, long text).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from lm.cli.errors import entry
from lm.config import ConfigError
from lm.core.checkpoint import CheckpointError
from lm.extras import exit_if_missing
from lm.report.runs import ReportError


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="lm attention",
        description=textwrap.fill(
            "Draw a trained model's attention probabilities on a text: every layer x head as one grid per attention "
            "stack (encoder-decoders: encoder self, decoder self, decoder cross), chosen layers/heads with tokens as "
            "axis labels, and an HTML page.",
            110,
        ),
        epilog=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "path", help="an lm train run directory, one of its checkpoints/step_* (any engine), or an lm export directory"
    )
    p.add_argument("--text", required=True, help="the text the model reads (at most model.max_seq_len tokens)")
    p.add_argument("--layer", type=int, help="draw this layer's heads on their own (0-based, per stack)")
    p.add_argument("--head", type=int, help="draw this head on its own (0-based)")
    p.add_argument(
        "--out", type=Path, help="output directory (default: <run_dir>/attention/<step_N>, or <export>-attention)"
    )
    p.add_argument(
        "--tokenizer",
        help="tokenizer.json (or a prepared data directory) when the run's own is "
        "not where its config says, or for an export without its checkpoint",
    )
    p.add_argument(
        "--decoder-text",
        help="encoder-decoders: what the decoder reads (default: the text shifted "
        "right, after the decoder start token)",
    )
    return p.parse_args(argv)


def requested(maps, layer: int | None, head: int | None) -> list[tuple]:
    """(map, head) pairs to draw alone: --layer's heads, --head in every layer, or the one pair."""
    if layer is None and head is None:
        return []
    return [
        (m, h)
        for m in maps
        if layer is None or m.layer == layer
        for h in range(m.probs.shape[0])
        if head is None or h == head
    ]


def default_out(source: Path) -> Path:
    """<run_dir>/attention/<step_N> for a checkpoint of a run, <export>-attention beside an export: never inside
    checkpoints/ (the run's keep-last rotation would delete the pictures with the checkpoint) or inside an export
    (which holds only lm export's files, so that `lm export --force` can still replace it)."""
    if source.parent.name == "checkpoints" and not (source / "model.safetensors").is_file():
        return source.parent.parent / "attention" / source.name
    return source.with_name(f"{source.name}-attention")


def draw(
    path, text: str, layer=None, head=None, out: Path | None = None, tokenizer=None, decoder_text: str | None = None
) -> Path:
    from lm.model.options import option_name
    from lm.report.attention_maps import (
        attention_maps,
        check_request,
        decoder_input_ids,
        encode_text,
        groups,
        load_model,
        saved_model_config,
        token_labels,
    )
    from lm.report.attention_plots import PAGE_FILES, draw_grid, draw_single, grid_name, single_name, write_page
    from lm.report.outputs import ATTENTION_TITLE, check_out

    cfg, where = saved_model_config(path)
    check_request(cfg, layer, head, where=str(where))  # before any weight is read
    if out is not None:  # a file in the way is refused before the model is loaded
        check_out(Path(out), [], "lm attention", "--out", "the maps")
    if decoder_text is not None and cfg.arch != "encoder_decoder":
        raise ReportError(
            f"--decoder-text applies to encoder-decoders only; {where} is model.arch={cfg.arch.value}: "
            f"drop it (the model reads --text alone)"
        )
    loaded = load_model(path, tokenizer)
    ids = encode_text(loaded, text)
    dec_ids = decoder_input_ids(loaded, ids, decoder_text) if cfg.arch == "encoder_decoder" else None
    maps = attention_maps(loaded, ids, dec_ids)
    out = Path(out) if out else default_out(Path(loaded.source))
    stacks, pairs = list(groups(maps).values()), requested(maps, layer, head)
    names = [grid_name(ms[0]) for ms in stacks] + [single_name(m, h) for m, h in pairs] + PAGE_FILES
    check_out(out, names, "lm attention", "--out", "the maps")  # a user's file of one of these names stays as it is
    out.mkdir(parents=True, exist_ok=True)
    (out / PAGE_FILES[1]).unlink(missing_ok=True)  # written last: maps stopped halfway have no page, not an old one
    grids = [draw_grid(ms, out / grid_name(ms[0])) for ms in stacks]
    singles = [draw_single(m, h, out / single_name(m, h)) for m, h in pairs]
    inputs = [("Input tokens" if dec_ids is None else "Encoder input tokens", token_labels(loaded.tokenizer, ids), ids)]
    lines = [
        f"Model: `{loaded.source}` (model.arch={cfg.arch.value}, model/attn="
        f"{option_name(cfg.attn)}, {cfg.n_heads} heads). "  # the option as a user picks it: scaled_dot
        f"Text: {text!r}. Rows of every map are queries, columns keys; each row sums to 1 (convolutions: "
        f"except where the kernel's window hangs over an end of the text)."
    ]
    if dec_ids is not None:
        how = "--decoder-text" if decoder_text is not None else "the text shifted right (teacher forcing)"
        lines.append(
            f"The decoder reads {how}: the decoder start token (id {cfg.decoder_start_token_id}), then "
            f"its tokens; decoder cross-attention maps have decoder tokens as queries and encoder tokens "
            f"as keys."
        )
        inputs.append(("Decoder input tokens", token_labels(loaded.tokenizer, dec_ids), dec_ids))
    if any(m.keys and m.keys[0] == "E1" for m in maps):
        lines.append(
            "Linformer: the key axis of its (non-causal) attentions is the k projected rows E1..Ek "
            "(K' = E K), not tokens."
        )
    return write_page(out, f"{ATTENTION_TITLE}{Path(path).name}", lines, inputs, grids, singles)


@entry("lm attention", usage=(ReportError, ConfigError, CheckpointError))  # status 2: the request cannot be drawn
def main(argv=None) -> int:
    exit_if_missing("lm attention", "report")
    args = parse_args(argv)
    page = draw(args.path, args.text, args.layer, args.head, args.out, args.tokenizer, args.decoder_text)
    print(f"wrote {page.parent}/ ({', '.join(sorted(p.name for p in page.parent.iterdir()))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
