"""`lm export`: a checkpoint of any engine -> model.safetensors + config.json (+ hf/ for Hugging Face families).

    lm export runs/pretrain                      # checkpoints/latest -> <checkpoint>/export
    lm export runs/pretrain --out exports/gpt    # a new or empty directory, or a previous export with --force

The engine that wrote the checkpoint consolidates it (lm.core.checkpoint.consolidated_state_dict).
The output is written to a temporary sibling directory and swapped in at the end, so an interrupted
export leaves the previous one (or nothing) in place; one export at a time writes in a directory (a second
to the same --out waits, then is refused unless --force). `--out` never replaces user files: a non-empty
directory that is not a previous export, the run directory, a directory holding it, or the current
directory are refused; a previous export is replaced only with --force. hf/ gets the tokenizer the run was
pretrained with (the sha256 its checkpoint recorded), never a data directory's newer one.
"""

import argparse
import contextlib
import ctypes
import fcntl
import json
import logging
import os
import re
import shutil
from pathlib import Path

from lm.cli.errors import entry
from lm.core.checkpoint import CheckpointError, consolidated_state_dict, resolve, verified
from lm.core.files import nearest_existing
from lm.core.saved_model import LM_CLASS  # the key of config.json that marks an lm export output

log = logging.getLogger("lm")

EXPORT_FILES = {"model.safetensors", "config.json", "hf"}  # what export() writes
HF_FILES = {  # what hf/ may hold besides weight shards: transformers' save_pretrained of the model and tokenizer
    "config.json",
    "generation_config.json",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
}


def export(path, out: Path | None = None, hf: bool = True, force: bool = False, tokenizer=None) -> Path:
    """Write model.safetensors + config.json (+ hf/) from checkpoint `path`; returns the output directory.
    `tokenizer` (a tokenizer.json or a prepared data directory) replaces the run's own in hf/."""
    from omegaconf import OmegaConf
    from safetensors.torch import save_model

    from lm.model import build_model
    from lm.model.config import model_from_saved

    ckpt = verified(resolve(path))  # its files match manifest.json before any is read
    out = Path(out) if out else ckpt / "export"
    check_output(out, ckpt, force)
    cfg = OmegaConf.load(ckpt / "config.yaml")
    tokenizer_file = run_tokenizer(cfg, ckpt, tokenizer) if hf else None  # refused before anything is written
    model = build_model(model_from_saved(cfg.model))
    missing, unexpected = model.load_state_dict(consolidated_state_dict(ckpt), strict=False)
    tied = {"head.proj.weight", "head.unfactor.weight"} if model.cfg.output_tied else set()
    if unexpected or set(missing) - tied:
        raise CheckpointError(
            f"{ckpt} does not match its config.yaml model: missing={sorted(set(missing) - tied)}, "
            f"unexpected={sorted(unexpected)}"
        )
    with _writing(out):
        check_output(out, ckpt, force)  # again: an export that held the lock may have written `out` meanwhile
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
        for stale in out.parent.glob(f".{out.name}.tmp-*"):  # left by an export killed mid-write (none is running)
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
        try:
            save_model(model, str(tmp / "model.safetensors"))  # tied tensors stored once
            config = OmegaConf.to_container(cfg.model, resolve=True)
            config[LM_CLASS] = type(model).__name__
            (tmp / "config.json").write_text(json.dumps(config, indent=1))
            if hf:
                _export_hf(model, tmp / "hf", tokenizer_file)
            _swap_in(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


@contextlib.contextmanager
def _writing(out: Path):
    """One lm export at a time writes in `out`'s parent directory: a flock on that directory itself (no lock file
    left beside the user's files), released by the kernel however the holder ends. A second export to the same
    --out swept the first's temporary directory away as stale and swapped its output over the first's without
    --force; now it waits, then finds the first's output (replaced only with --force)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(out.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another lm export writing in %s", out.parent)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def check_output(out: Path, ckpt: Path, force: bool) -> None:
    """Refuse an --out whose replacement would delete anything but a previous export (with --force)."""
    where, target = Path.cwd().resolve(), out.resolve()
    run_dir = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt
    if target == run_dir.resolve() or run_dir.resolve().is_relative_to(target) or ckpt.resolve().is_relative_to(target):
        raise CheckpointError(
            f"--out {out} is the run directory {run_dir} or holds it; exporting there would "
            f"delete the run. Pick a new directory, e.g. --out {run_dir}-export"
        )
    if where.is_relative_to(target):
        raise CheckpointError(
            f"--out {out} is the current directory (or holds it); it cannot be replaced by "
            f"the export. Name a new directory, e.g. --out ./export"
        )
    if out.is_symlink():  # the swap would replace the link, not write where it points
        raise CheckpointError(
            f"--out {out} is a symbolic link (to {os.readlink(out)}); name a real directory: the link's target "
            f"itself, or a new one"
        )
    if out.exists() and not out.is_dir():
        raise CheckpointError(
            f"--out {out} is a file, not a directory; name a directory (new, empty, or a previous export)"
        )
    above = nearest_existing(out.absolute().parent)
    if not above.is_dir():
        raise CheckpointError(
            f"--out {out} lies below {above}, which is a file, not a directory; name a directory elsewhere"
        )
    if not out.exists() or not any(out.iterdir()):
        return
    if not is_export(out):
        held = _not_written_by_export(out) or sorted(p.name for p in out.iterdir())
        raise CheckpointError(
            f"--out {out} is a non-empty directory that is not an lm export output "
            f"(it holds {', '.join(held[:5])}); lm export "
            f"replaces its --out, so name a new or empty directory"
        )
    if not force:
        raise CheckpointError(
            f"--out {out} holds a previous export; pass --force to replace it, or name another directory"
        )


def is_export(path: Path) -> bool:
    """A directory written by lm export: its files only (hf/'s too), and a config.json with lm's class marker."""
    if _not_written_by_export(path) or not (path / "config.json").is_file():
        return False
    try:
        return LM_CLASS in json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False


def _not_written_by_export(path: Path) -> list[str]:
    """What in `path` lm export does not write: a replacement with --force would delete it (hf/README.md, a model
    card added by hand, as much as a file beside config.json)."""
    foreign = sorted(p.name for p in path.iterdir() if p.name not in EXPORT_FILES)
    hf = path / "hf"
    if hf.is_dir() and not hf.is_symlink():
        foreign += sorted(f"hf/{p.name}" for p in hf.iterdir() if not (p.is_file() and _hf_file(p.name)))
    elif hf.exists() or hf.is_symlink():
        foreign.append("hf")
    return foreign


def _hf_file(name: str) -> bool:
    """A file that save_pretrained writes for a model or a tokenizer (weights sharded or not)."""
    return name in HF_FILES or re.fullmatch(r"model(-\d{5}-of-\d{5})?\.safetensors", name) is not None


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


def run_tokenizer(cfg, ckpt: Path, given=None) -> Path | None:
    """The tokenizer.json for hf/: `given`, else the run's <data.dir>/tokenizer.json; refused when it is not
    the file the run was pretrained with (the sha256 its checkpoint recorded): a data directory re-prepared
    since holds another vocabulary, whose ids would index the wrong embedding rows."""
    from lm.core.saved_model import recorded_tokenizer_sha256
    from lm.data.tokenizer import FILE_NAME, Tokenizer

    path = Path(given).expanduser() if given else run_tokenizer_file(cfg)
    if path is not None and path.is_dir():
        path = path / FILE_NAME
    recorded = recorded_tokenizer_sha256(ckpt)
    if path is None:
        _warn_no_tokenizer(cfg, recorded)
        return None
    sha256 = Tokenizer.load(path).sha256  # read here, before any output: a bad file is refused, not a lost hf/
    if recorded and sha256 != recorded:
        where = "--tokenizer" if given else "the run's data directory"
        raise CheckpointError(
            f"{path} ({where}, sha256 {sha256[:12]}) is not the tokenizer {ckpt} was pretrained with (sha256 "
            f"{recorded[:12]}, recorded in its rank00000.pt)"
            + ("" if given else ": the data directory was re-prepared since")
            + f", so hf/ would pair the weights with the wrong vocabulary. Pass --tokenizer "
            f"<the original tokenizer.json> (sha256 {recorded}), re-prepare the data with the run's own settings "
            f"(its config.yaml), or --no-hf to export the weights alone"
        )
    return path


def _warn_no_tokenizer(cfg, recorded: str | None) -> None:
    """hf/ without a tokenizer: say where the run's was looked for and how to give it."""
    where = _data_tokenizer_path(cfg)
    log.warning(
        "hf/ gets no tokenizer: %s, so AutoTokenizer.from_pretrained cannot load hf/; pass --tokenizer <the run's "
        "tokenizer.json>%s",
        f"the run's {where} is not there (moved or deleted?)" if where else "the run's config names no data.dir",
        f" (sha256 {recorded})" if recorded else "",
    )


def run_tokenizer_file(run_cfg) -> Path | None:
    """<data.dir>/tokenizer.json of a run's config (as lm prepare writes it), or None when not there."""
    path = _data_tokenizer_path(run_cfg)
    return path if path is not None and path.is_file() else None


def _data_tokenizer_path(run_cfg) -> Path | None:
    """Where <data.dir>/tokenizer.json of a run's config is, there or not; None when data.dir does not resolve."""
    from omegaconf import OmegaConf

    from lm.config import register_train_configs

    data = run_cfg.get("data") if hasattr(run_cfg, "get") else None
    if not data or not data.get("dir"):
        return None
    register_train_configs()  # the ${oc.env:...} resolvers of lm train's config
    try:
        return Path(os.path.expanduser(str(OmegaConf.create({"data": data}).data.dir))) / "tokenizer.json"
    except Exception:  # noqa: BLE001 - an unresolvable interpolation: no tokenizer to write
        return None


def _export_hf(model, out: Path, tokenizer_file: Path | None) -> None:
    from lm.data.tokenizer import to_transformers
    from lm.model.hf_export import write_hf_dir

    try:
        # the model, the run's tokenizer, bos/eos/pad ids
        write_hf_dir(model, out, to_transformers(tokenizer_file) if tokenizer_file is not None else None)
    except ValueError as e:  # no Hugging Face family matches this architecture
        log.warning("no Hugging Face export: %s", e)


EPILOG = """examples:
  lm export runs/data-shakespeare_char+model-tiny        # -> <its latest checkpoint>/export
  lm export runs/my_run/checkpoints/step_00001000 --out exports/step1000 --no-hf

then: transformers' AutoModelForCausalLM (a decoder; AutoModelForMaskedLM for an encoder) and AutoTokenizer
load <out>/hf with from_pretrained (docs/convert.md); lm finetune task=glue/rte init=<out>
finetunes the export on GLUE (docs/finetuning.md)."""


@entry("lm export")
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="lm export",
        description="Consolidate a checkpoint of any engine (single, ddp, zero1-3, fsdp2) into model.safetensors +\n"
        "config.json, and a Hugging Face directory (hf/) when the architecture matches GPT-2, Llama, BERT, ESM or T5.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("path", help="run directory (uses checkpoints/latest) or a checkpoint directory")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory: new, empty, or a previous export (with --force); default <checkpoint>/export",
    )
    parser.add_argument("--force", action="store_true", help="replace a previous lm export output at --out")
    parser.add_argument("--no-hf", action="store_true", help="skip the Hugging Face directory")
    parser.add_argument(
        "--tokenizer",
        help="tokenizer.json (or a prepared data directory) for hf/ when the run's "
        "own is not where its config says; it must be the file the run was "
        "pretrained with",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out = export(args.path, args.out, hf=not args.no_hf, force=args.force, tokenizer=args.tokenizer)
    print(f"exported {out}: " + ", ".join(sorted(p.name for p in out.iterdir())))


if __name__ == "__main__":
    main()
