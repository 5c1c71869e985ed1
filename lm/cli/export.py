"""`lm export`: a checkpoint of any engine -> model.safetensors + config.json (+ hf/ for Hugging Face families).

    lm export runs/pretrain                      # checkpoints/latest -> <checkpoint>/export
    lm export runs/pretrain --out exports/gpt    # a new or empty directory, or a previous export with --force

The engine that wrote the checkpoint consolidates it (lm.core.checkpoint.consolidated_state_dict).
The output is written to a temporary sibling directory and swapped in at the end, so an interrupted
export leaves the previous one (or nothing) in place. `--out` never replaces user files: a non-empty
directory that is not a previous export, the run directory, a directory holding it, or the current
directory are refused; a previous export is replaced only with --force.
"""

import argparse
import ctypes
import json
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Optional

from lm.core.checkpoint import CheckpointError, consolidated_state_dict, resolve, verified
from lm.core.saved_model import LM_CLASS  # the key of config.json that marks an lm export output
from lm.extras import MissingExtra

log = logging.getLogger("lm")

EXPORT_FILES = {"model.safetensors", "config.json", "hf"}  # what export() writes


def export(path, out: Optional[Path] = None, hf: bool = True, force: bool = False) -> Path:
    """Write model.safetensors + config.json (+ hf/) from checkpoint `path`; returns the output directory."""
    from omegaconf import OmegaConf
    from safetensors.torch import save_model

    from lm.model import build_model
    from lm.model.config import model_from_saved

    ckpt = verified(resolve(path))  # its files match manifest.json before any is read
    out = Path(out) if out else ckpt / "export"
    check_output(out, ckpt, force)
    cfg = OmegaConf.load(ckpt / "config.yaml")
    model = build_model(model_from_saved(cfg.model))
    missing, unexpected = model.load_state_dict(consolidated_state_dict(ckpt), strict=False)
    tied = {"head.proj.weight", "head.unfactor.weight"} if model.cfg.output_tied else set()
    if unexpected or set(missing) - tied:
        raise CheckpointError(f"{ckpt} does not match its config.yaml model: missing={sorted(set(missing) - tied)}, "
                              f"unexpected={sorted(unexpected)}")
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    for stale in out.parent.glob(f".{out.name}.tmp-*"):  # left by an export killed mid-write
        shutil.rmtree(stale, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        save_model(model, str(tmp / "model.safetensors"))  # tied tensors stored once
        config = OmegaConf.to_container(cfg.model, resolve=True)
        config[LM_CLASS] = type(model).__name__
        (tmp / "config.json").write_text(json.dumps(config, indent=1))
        if hf:
            _export_hf(model, tmp / "hf", cfg)
        _swap_in(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def check_output(out: Path, ckpt: Path, force: bool) -> None:
    """Refuse an --out whose replacement would delete anything but a previous export (with --force)."""
    where, target = Path.cwd().resolve(), out.resolve()
    run_dir = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt
    if target == run_dir.resolve() or run_dir.resolve().is_relative_to(target) or ckpt.resolve().is_relative_to(target):
        raise CheckpointError(f"--out {out} is the run directory {run_dir} or holds it; exporting there would "
                              f"delete the run. Pick a new directory, e.g. --out {run_dir}-export")
    if where.is_relative_to(target):
        raise CheckpointError(f"--out {out} is the current directory (or holds it); it cannot be replaced by "
                              f"the export. Name a new directory, e.g. --out ./export")
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise CheckpointError(f"--out {out} is a file, not a directory; remove it or name a new directory")
    if not out.exists() or not any(out.iterdir()):
        return
    if not is_export(out):
        raise CheckpointError(f"--out {out} is a non-empty directory that is not an lm export output "
                              f"(it holds {', '.join(sorted(p.name for p in out.iterdir())[:5])}); lm export "
                              f"replaces its --out, so name a new or empty directory")
    if not force:
        raise CheckpointError(f"--out {out} holds a previous export; pass --force to replace it, or name "
                              f"another directory")


def is_export(path: Path) -> bool:
    """A directory written by lm export: its files only, and a config.json with lm's class marker."""
    names = {p.name for p in path.iterdir()}
    if not names <= EXPORT_FILES or "config.json" not in names:
        return False
    try:
        return LM_CLASS in json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False


def _swap_in(tmp: Path, out: Path) -> None:
    """Put directory `tmp` at `out`: one atomic exchange where the kernel offers it, else two renames."""
    if not out.exists():
        os.replace(tmp, out)
        return
    if not any(out.iterdir()):
        os.replace(tmp, out)  # a rename replaces an empty directory atomically
        return
    if not _rename_exchange(tmp, out):
        # A kill between these two renames leaves the previous export at .<name>.old-<pid>.
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
        os.replace(tmp, old.with_name(out.name))
        tmp = old
    shutil.rmtree(tmp)  # the previous export, now at the temporary name


def _rename_exchange(a: Path, b: Path) -> bool:
    """Linux renameat2(RENAME_EXCHANGE): swap two paths in one step; False where it is not available."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def _export_hf(model, out: Path, cfg) -> None:
    from lm.model.hf_export import run_tokenizer_file, write_hf_dir

    try:
        write_hf_dir(model, out, run_tokenizer_file(cfg))  # the model, the run's tokenizer, bos/eos/pad ids
    except ValueError as e:  # no Hugging Face family matches this architecture
        log.warning("no Hugging Face export: %s", e)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="lm export", description="Consolidate a checkpoint of any engine (single, ddp, zero1-3, fsdp2) into "
                                      "model.safetensors + config.json, and a Hugging Face directory when the "
                                      "architecture matches GPT-2, Llama, BERT or T5.")
    parser.add_argument("path", help="run directory (uses checkpoints/latest) or a checkpoint directory")
    parser.add_argument("--out", type=Path, default=None,
                        help="output directory: new, empty, or a previous export (with --force); default "
                             "<checkpoint>/export")
    parser.add_argument("--force", action="store_true", help="replace a previous lm export output at --out")
    parser.add_argument("--no-hf", action="store_true", help="skip the Hugging Face directory")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        out = export(args.path, args.out, hf=not args.no_hf, force=args.force)
    except (CheckpointError, FileNotFoundError, MissingExtra) as e:  # MissingExtra: the hf/ part needs lm[hf]
        sys.exit(f"lm export: {e}")
    print(f"exported {out}: " + ", ".join(sorted(p.name for p in out.iterdir())))


if __name__ == "__main__":
    main()
