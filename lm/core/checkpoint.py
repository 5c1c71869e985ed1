"""Atomic checkpoints that continue a run exactly, keep-last-K, and `lm-export`.

    <run_dir>/checkpoints/
        step_00000100/            complete checkpoints only (written as .tmp-step_..., then renamed)
            trainer.json          step, tokens, engine layout (written last, before the rename)
            config.yaml           the run's resolved config (lm-export rebuilds the model from it)
            rank00000.pt ...      per rank: data-loader position and RNG states (torch, CUDA, numpy, python)
            model_optim.pt        single/ddp: model + optimizer (rank 0)
            dcp/                  fsdp2: torch.distributed.checkpoint shards, one file per rank
            deepspeed/            zero*: DeepSpeed's files, optimizer partitions per rank
        latest                    name of the newest complete checkpoint (replaced atomically, last)

A crash at any point leaves `latest` naming a complete checkpoint; a half-written one is only ever
a .tmp-* directory, deleted on the next save. Consolidating a sharded (ZeRO/FSDP2) checkpoint into
one file: `lm-export <run_dir or checkpoint dir>` (see `consolidated_state_dict`).
"""

import argparse
import json
import logging
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Dict, Optional, Tuple

import numpy as np
import torch

from lm.engine import dist as D

log = logging.getLogger("lm")

LATEST = "latest"
TMP_PREFIX = ".tmp-"


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message names it and what is still intact."""


def step_name(step: int) -> str:
    return f"step_{step:08d}"


# -- RNG -------------------------------------------------------------------------------------------

def rng_state() -> Dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# -- save / resume ---------------------------------------------------------------------------------

class Checkpointer:
    def __init__(self, run_dir, engine, keep_last: int = 3, config_yaml: str = ""):
        self.root = Path(run_dir) / "checkpoints"
        self.engine = engine
        self.keep_last = keep_last
        self.config_yaml = config_yaml  # the run's resolved config, copied into every checkpoint

    def latest(self) -> Optional[Path]:
        pointer = self.root / LATEST
        if not pointer.exists():
            return None
        path = self.root / pointer.read_text().strip()
        if not (path / "trainer.json").exists():
            raise CheckpointError(f"{pointer} names {path.name}, which is not a complete checkpoint "
                                  f"(no trainer.json); point it at another step_* directory or delete it")
        return path

    def save(self, trainer: Dict, loader_state: Dict) -> Path:
        """Write step `trainer['step']` atomically on every rank; raise (all ranks) if any rank failed."""
        name = step_name(trainer["step"])
        tmp, final = self.root / (TMP_PREFIX + name), self.root / name
        if self.engine.is_main:
            self.root.mkdir(parents=True, exist_ok=True)
            for stale in self.root.glob(TMP_PREFIX + "*"):  # debris of a run killed mid-save
                shutil.rmtree(stale, ignore_errors=True)
            tmp.mkdir()
        D.barrier()
        error = None
        try:
            self.engine.save(tmp)
            torch.save({"loader": loader_state, "rng": rng_state()}, tmp / f"rank{self.engine.rank:05d}.pt")
        except OSError as e:  # a full disk, a quota, a vanished mount
            error = e
        if D.any_rank(error is not None):
            self._abort(tmp, name, error)
        if self.engine.is_main:
            try:
                (tmp / "config.yaml").write_text(self.config_yaml)
                trainer = {**trainer, "engine": self.engine.describe(), "time": time.time()}
                _write_durably(tmp / "trainer.json", json.dumps(trainer, indent=1))  # marks completeness
                if final.exists():  # left by a run killed between this rename and the pointer update
                    shutil.rmtree(final)
                os.replace(tmp, final)
                _write_durably(self.root / (LATEST + ".tmp"), name)
                os.replace(self.root / (LATEST + ".tmp"), self.root / LATEST)
                _fsync_dir(self.root)
            except OSError as e:
                error = e
        if D.any_rank(error is not None):
            self._abort(tmp, name, error)
        if self.engine.is_main:
            self._prune()
        D.barrier()
        return final

    def _abort(self, tmp: Path, name: str, error: Optional[OSError]):
        if self.engine.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        previous = self.latest() if self.engine.is_main else None
        reason = f"{error.strerror or error}" if error else "another rank failed to write its part"
        raise CheckpointError(
            f"checkpoint {self.root / name} could not be written ({reason}); it was removed and "
            f"{'the previous checkpoint ' + str(previous) + ' is intact' if previous else 'no earlier checkpoint exists'}"
            f". Free space under {self.root} and run the same command again to resume.")

    def _prune(self) -> None:
        keep = self.latest()
        done = sorted(p for p in self.root.glob("step_*") if (p / "trainer.json").exists())
        for old in done[:-self.keep_last]:
            if old != keep:
                shutil.rmtree(old, ignore_errors=True)

    def load(self, path: Path) -> Tuple[Dict, Dict]:
        """Restore the engine's model and optimizer; returns (trainer.json, this rank's loader state)."""
        trainer = json.loads((path / "trainer.json").read_text())
        saved_world = trainer["engine"]["world_size"]
        if saved_world != self.engine.world_size or trainer["engine"]["engine"] != self.engine.name:
            raise CheckpointError(
                f"{path} was written by {trainer['engine']['engine']} on {saved_world} rank(s); this run is "
                f"{self.engine.name} on {self.engine.world_size}. Resume with the same engine and world size, "
                f"or start a new run_dir from the weights (lm-export {path})")
        self.engine.load(path)
        own = torch.load(path / f"rank{self.engine.rank:05d}.pt", weights_only=False)
        set_rng_state(own["rng"])
        return trainer, own["loader"]


def _write_durably(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- consolidation and export ----------------------------------------------------------------------

def resolve(path) -> Path:
    """A checkpoint directory from a run directory (its latest), a checkpoints/ dir, or itself."""
    path = Path(path)
    for candidate in (path / "checkpoints", path):
        if (candidate / LATEST).exists():
            return candidate / (candidate / LATEST).read_text().strip()
    if (path / "trainer.json").exists():
        return path
    raise CheckpointError(f"{path} is neither a run directory with checkpoints/latest nor a checkpoint "
                          f"(no trainer.json); pass <run_dir> or <run_dir>/checkpoints/step_XXXXXXXX")


def consolidated_state_dict(ckpt: Path) -> Dict[str, torch.Tensor]:
    """The full fp32 model state dict of a checkpoint of any engine, in one process, no process group."""
    info = json.loads((ckpt / "trainer.json").read_text())["engine"]
    fmt = info["format"]
    if fmt == "torch":
        return torch.load(ckpt / "model_optim.pt", map_location="cpu", weights_only=True)["model"]
    if fmt == "dcp":
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        import tempfile

        # A private scratch file: several processes (the ranks of a finetuning job) may consolidate the
        # same checkpoint at once.
        with tempfile.TemporaryDirectory(prefix="lm-consolidate-") as scratch:
            out = Path(scratch) / "consolidated.pt"
            dcp_to_torch_save(ckpt / "dcp", out)
            return torch.load(out, map_location="cpu", weights_only=False)["model"]
    if fmt == "deepspeed":
        if info.get("zero_stage", 0) == 0:
            states = torch.load(ckpt / "deepspeed" / "mp_rank_00_model_states.pt", map_location="cpu",
                                weights_only=False)
            return states["module"]
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        return get_fp32_state_dict_from_zero_checkpoint(str(ckpt), tag="deepspeed")
    raise CheckpointError(f"{ckpt}/trainer.json has an unknown engine format {fmt!r}")


def export(path, out: Optional[Path] = None, hf: bool = True) -> Path:
    """Write model.safetensors + config.json (+ hf/ for Hugging Face families) from any checkpoint."""
    from omegaconf import OmegaConf
    from safetensors.torch import save_model

    from lm.model import build_model
    from lm.model.config import model_from_saved

    ckpt = resolve(path)
    cfg = OmegaConf.load(ckpt / "config.yaml")
    model = build_model(model_from_saved(cfg.model))
    missing, unexpected = model.load_state_dict(consolidated_state_dict(ckpt), strict=False)
    tied = {"head.proj.weight"} if model.cfg.tie_embeddings else set()
    if unexpected or set(missing) - tied:
        raise CheckpointError(f"{ckpt} does not match its config.yaml model: missing={sorted(set(missing) - tied)}, "
                              f"unexpected={sorted(unexpected)}")
    out = Path(out) if out else ckpt / "export"
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_model(model, str(tmp / "model.safetensors"))  # tied tensors stored once
    config = OmegaConf.to_container(cfg.model, resolve=True)
    config["_lm_class"] = type(model).__name__
    (tmp / "config.json").write_text(json.dumps(config, indent=1))
    if hf:
        _export_hf(model, tmp / "hf", cfg)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def _export_hf(model, out: Path, cfg) -> None:
    from lm.model.hf_export import run_tokenizer_file, write_hf_dir

    try:
        write_hf_dir(model, out, run_tokenizer_file(cfg))  # the model, the run's tokenizer, bos/eos/pad ids
    except ValueError as e:  # no Hugging Face family matches this architecture
        log.warning("no Hugging Face export: %s", e)


def export_main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="lm-export", description="Consolidate a checkpoint of any engine (single, ddp, zero1-3, fsdp2) into "
                                      "model.safetensors + config.json, and a Hugging Face directory when the "
                                      "architecture matches GPT-2, Llama, BERT or T5.")
    parser.add_argument("path", help="run directory (uses checkpoints/latest) or a checkpoint directory")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default <checkpoint>/export)")
    parser.add_argument("--no-hf", action="store_true", help="skip the Hugging Face directory")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        out = export(args.path, args.out, hf=not args.no_hf)
    except (CheckpointError, FileNotFoundError) as e:
        sys.exit(f"lm-export: {e}")
    print(f"exported {out}: " + ", ".join(sorted(p.name for p in out.iterdir())))
