"""The run card's attention section: the grid of the final checkpoint on one fixed sentence.

Small by design (the model runs once on ~10 words); a run it cannot draw (an RNN, no checkpoint, no
tokenizer where the run's config says) gets a one-line note instead, so the card is always written.
"""

from __future__ import annotations

from pathlib import Path

from lm.report.runs import Run

SENTENCE = "The quick brown fox jumps over the lazy dog."


def png_name(stack: str, kind: str) -> str:
    return f"attention_{stack}_{kind}.png"


FILES = [png_name(stack, kind) for stack in ("encoder", "decoder") for kind in ("self", "cross")]  # every grid's


def attention_section(run: Run, out: Path) -> list[str]:
    """Markdown lines for the card: the grids (written under `out`) or a note saying why there are none."""
    from lm.config import ConfigError
    from lm.core.checkpoint import CheckpointError
    from lm.model.options import option_name
    from lm.report.attention_maps import (
        AttentionMapError,
        attention_maps,
        check_request,
        encode_text,
        groups,
        load_model,
        saved_model_config,
    )
    from lm.report.attention_plots import draw_grid

    head = ["## Attention", ""]
    try:
        cfg, where = saved_model_config(run.path)
        if cfg.family is not None and not cfg.family.transformer:
            return head + [f"No attention maps: a model/family={option_name(cfg.family)} model has no attention.", ""]
        check_request(cfg, None, None)
        loaded = load_model(run.path)
        ids = encode_text(loaded, SENTENCE)[: cfg.max_seq_len]
        maps = attention_maps(loaded, ids)
    except (AttentionMapError, CheckpointError, ConfigError, OSError) as e:
        return head + [f"No attention maps: {e}", ""]
    except Exception as e:  # noqa: BLE001 - a card is always written; the note names what failed
        return head + [f"No attention maps: {type(e).__name__}: {e}", ""]
    lines = head + [
        f'`{where}` on "{SENTENCE}" (rows: layers, columns: heads; in each panel rows are '
        f"queries, columns keys; `lm attention {run.path} --text ...` draws any text, layer or head).",
        "",
    ]
    for ms in groups(maps).values():
        name = png_name(ms[0].stack, ms[0].kind)
        draw_grid(ms, out / name)
        lines += [f"![{ms[0].title}]({name})", ""]
    return lines
