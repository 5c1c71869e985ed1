"""Atomic checkpoints that continue a run exactly: keep-last-K, checksums, reading them back (lm export).

    <run_dir>/checkpoints/
        step_00000100/            complete checkpoints only (written as .tmp-step_..., then renamed)
            trainer.json          step, tokens, engine layout, manifest's sha256 (written last, before the rename)
            manifest.json         sha256 and size of every file above and below (verified before reading)
            config.yaml           the run's resolved config (lm export rebuilds the model from it)
            rank00000.pt ...      per rank: data-loader position and RNG states (tensors and plain types)
            model_optim.pt        the engine's own files (engine.save_state): single/ddp model_optim.pt,
            dcp/ | deepspeed/     fsdp2 torch.distributed.checkpoint shards, zero* DeepSpeed's files
        latest                    name of the newest complete checkpoint (replaced atomically, last)

A crash or a failed write (full disk) at any point leaves `latest` naming a complete checkpoint; a
half-written one is only ever a .tmp-* directory, removed when the write fails or on the next save. A checkpoint
being deleted (train.keep_last) is renamed to a .tmp-* name first, so a kill in the deletion leaves the same debris.
Asynchronous saves (train.async_checkpoint) take a snapshot in save() and run the same writing and sealing in
a background thread (lm/core/async_save.py); the next save, and the loop at the end and at a stop, wait() for it.
This file never reads an engine's files itself: trainer.json records the engine's format and the
engine class of that format loads or consolidates them (lm.engine.engine_for_format). Everything is
read with torch.load(weights_only=True): a checkpoint from elsewhere cannot run pickled code, and only
after its files match manifest.json. `latest` must name a direct child step_NNNNNNNN of checkpoints/ (never
a path: `../../other/checkpoints/step_...` would resume another run). A resume whose `latest` is missing,
names anything else or a damaged checkpoint resumes from the newest intact step_* directory, saying so, or
refuses when none is intact: a run never starts over (pruning and overwriting its checkpoints) while any
are there. The resume config check reads the checkpoint chosen here, the one loaded (lm/core/resume.py).
lm export and lm finetune init= refuse a damaged checkpoint.
A checkpoint resumes on another world size or engine class (elastic resume) when the engine can read the
files (Engine.load_resharded: DCP reshards FSDP2's; lm/engine/reshard.py converts between single/DDP and
FSDP2, lm/engine/ds_reshard.py between ZeRO and the others); a rank beyond the saved world size reads rank 0's
task state (a global position) and keeps its freshly seeded RNGs.
Consolidating a sharded (ZeRO/FSDP2) checkpoint into one file: `lm export` (lm/cli/export.py).
"""

import json
import logging
import os
import pickle
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from lm.core.async_save import BackgroundWrite
from lm.core.files import file_sha256
from lm.core.rng import plain_state, rng_state, set_rng_state
from lm.engine import dist as dist_utils
from lm.engine.dist import EngineError

log = logging.getLogger("lm")

LATEST = "latest"
TMP_PREFIX = ".tmp-"
MANIFEST = "manifest.json"
UNSEALED = (MANIFEST, "trainer.json")  # the checkpoint files the manifest does not list (it is in trainer.json)
STEP_DIR = re.compile(r"step_\d{8}")  # the only names `latest` may hold
# trainer.json key: the task state in the rank files is global and carries its batch guard (samples per step,
# steps per epoch), so the checkpoint may resume on another world size or engine (Checkpointer._load_elsewhere)
ELASTIC = "elastic"
SAVE_PHASES = ("files", "manifest", "rename", "latest", "prune")  # Checkpointer.save's on_phase points, in order


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message names it and what is still intact."""


def step_name(step: int) -> str:
    return f"step_{step:08d}"


def load_rank_state(path: Path) -> dict:
    # numpy's array reconstruction is allowed only for rank files written before RNG states were tensors.
    core = getattr(np, "_core", None) or np.core  # numpy 2 renamed numpy.core
    # numpy's stubs omit the multiarray submodule of numpy(._)core, which exists at run time
    reconstruct = core.multiarray._reconstruct  # pyright: ignore[reportAttributeAccessIssue]
    legacy = [np.dtype, np.ndarray, reconstruct, type(np.dtype(np.uint32))]
    with torch.serialization.safe_globals(legacy):
        return _weights_only(lambda: torch.load(path, weights_only=True), path)


def _weights_only(read, what):
    """Run `read` (torch.load with weights_only=True somewhere inside); a pickle that asks for anything
    but tensors and plain containers becomes a CheckpointError naming the file."""
    try:
        return read()
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"{what} holds pickled objects other than tensors and plain containers, which lm refuses to load "
            f"(they could run code: {_unpickler_reason(e)}). Use a checkpoint written by lm train, or convert "
            f"it where you trust it"
        ) from None


def _unpickler_reason(error: Exception) -> str:
    """The line of torch's weights_only message that names the refused global (not its advice)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    after = [i + 1 for i, line in enumerate(lines) if "WeightsUnpickler error" in line]
    return lines[after[0]] if after and after[0] < len(lines) else (lines[0] if lines else type(error).__name__)


# -- save / resume ---------------------------------------------------------------------------------


class Checkpointer:
    def __init__(
        self,
        run_dir,
        engine,
        keep_last: int = 3,
        config_yaml: str = "",
        on_phase: Callable[[str], None] | None = None,
        asynchronous: bool = False,
    ):
        self.root = Path(run_dir) / "checkpoints"
        self.engine = engine
        self.keep_last = keep_last
        self._kept: set[Path] = set()  # checkpoints _prune keeps for the files added to them (logged once)
        self.config_yaml = config_yaml  # the run's resolved config, copied into every checkpoint
        self._verified: Path | None = None  # what resume_point checked against its manifest (not hashed twice)
        # called with "begin" as a save starts (every rank), then each of SAVE_PHASES (lm.core.hooks.Hooks.save_phase)
        self.on_phase = on_phase or (lambda phase: None)
        # train.async_checkpoint: the one write in flight (lm/core/async_save.py); None: save() writes everything itself
        self.writes = BackgroundWrite(engine.is_main) if asynchronous else None

    def latest(self) -> Path | None:
        """The complete checkpoint of this run that `latest` names, else None (for messages: what is intact;
        a resume asks resume_point, which verifies and falls back)."""
        name, _ = _read_pointer(self.root)
        path = self.root / name if name is not None and _own_step_dir(self.root, name) else None
        return path if path is not None and (path / "trainer.json").is_file() else None

    def resume_point(self) -> Path | None:
        """The verified checkpoint a resume loads (None: nothing to resume, start fresh), decided on rank 0 and
        the same on every rank (collective). Load and config-check this one (lm/core/resume.py check_resume)."""
        chosen, error = None, None
        if self.engine.is_main:
            try:
                chosen = resume_point(self.root)
            except CheckpointError as e:
                error = str(e)
        chosen, error = dist_utils.broadcast_object((chosen, error))
        if error:
            raise CheckpointError(error)
        if chosen is not None:
            self._verified = chosen
        return chosen

    def save(self, trainer: dict, loader_state: dict) -> Path:
        """Write step `trainer['step']` atomically on every rank; raise (all ranks) if any rank failed.
        Asynchronous (lm/core/async_save.py): the previous write is waited for first (its error raised here), the
        state is snapshotted, and the rest runs in the background: call wait() before relying on the result."""
        self.wait()
        name = step_name(trainer["step"])
        tmp, final = self.root / (TMP_PREFIX + name), self.root / name
        self.on_phase("begin")
        if self.engine.is_main:
            self.root.mkdir(parents=True, exist_ok=True)
            for stale in self.root.glob(TMP_PREFIX + "*"):  # debris of a run killed mid-save
                shutil.rmtree(stale, ignore_errors=True)
            tmp.mkdir()
        dist_utils.barrier()
        rank_state = {"loader": plain_state(loader_state), "rng": rng_state()}
        if self.writes is None:
            self._write(tmp, final, trainer, lambda: self.engine.save_state(tmp), rank_state)
            return final
        from lm.engine.staging import cpu_copy

        group = self.writes.group
        write_engine, error = None, None
        try:
            write_engine = self.engine.stage_state(tmp, group)
            rank_state = cpu_copy(rank_state)
        except Exception as e:  # noqa: BLE001 - no memory for the copy: nothing was written yet
            error = e
        if dist_utils.any_rank(error is not None):
            self._abort(tmp, name, error)
        assert write_engine is not None  # staged on every rank (else _abort raised)
        self.writes.start(lambda: self._write(tmp, final, trainer, write_engine, rank_state, group), name)
        return final

    def wait(self) -> None:
        """Return once no checkpoint write is in flight (asynchronous saves); raise the error of one that failed."""
        if self.writes is not None:
            self.writes.wait()

    def write_failed(self) -> bool:
        """Whether a background write failed and its error waits to be raised (by wait())."""
        return self.writes is not None and self.writes.failed()

    def _write(
        self, tmp: Path, final: Path, trainer: dict, write_engine: Callable[[], None], rank_state: dict, group=None
    ) -> None:
        """The engine's files and this rank's state under `tmp`, then sealed by rank 0 and renamed to `final`, then
        `latest` and pruning. `group`: the process group of the ranks' agreement (a background write's own)."""
        name = final.name
        error = None
        try:
            write_engine()
            torch.save(rank_state, tmp / f"rank{self.engine.rank:05d}.pt")
        except Exception as e:  # noqa: BLE001 - a full disk is OSError from open() but RuntimeError from torch.save
            error = e
        self.on_phase("files")  # every rank's files written, nothing sealed
        if dist_utils.any_rank(error is not None, group):
            self._abort(tmp, name, error)
        if self.engine.is_main:
            try:
                (tmp / "config.yaml").write_text(self.config_yaml)
                manifest = _write_manifest(tmp)
                trainer = {
                    **trainer,
                    "engine": self.engine.describe(),
                    ELASTIC: True,
                    "time": time.time(),
                    "manifest_sha256": manifest,
                }
                self.on_phase("manifest")  # manifest written, trainer.json not yet
                _write_durably(tmp / "trainer.json", json.dumps(trainer, indent=1))  # marks completeness
                self.on_phase("rename")  # complete, still under its .tmp- name
                if final.exists():  # left by a run killed between this rename and the pointer update
                    _remove(final)
                os.replace(tmp, final)
                self.on_phase("latest")  # renamed, `latest` still names the previous checkpoint
                (self.root / (LATEST + ".tmp")).unlink(missing_ok=True)  # never write through a planted symlink
                _write_durably(self.root / (LATEST + ".tmp"), name)
                os.replace(self.root / (LATEST + ".tmp"), self.root / LATEST)
                _fsync_dir(self.root)
            except Exception as e:  # noqa: BLE001 - as above
                error = e
        if dist_utils.any_rank(error is not None, group):
            self._abort(tmp, name, error)
        if self.engine.is_main:
            self.on_phase("prune")  # `latest` updated, older checkpoints not yet pruned
            self._prune()
        dist_utils.barrier(group)

    def _abort(self, tmp: Path, name: str, error: Exception | None):
        if self.engine.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            (self.root / (LATEST + ".tmp")).unlink(missing_ok=True)
        previous = self.latest() if self.engine.is_main else None
        if error is None:
            reason = "another rank failed to write its part"
        elif isinstance(error, OSError) and error.strerror:
            reason = error.strerror
        else:  # torch.save's RuntimeError on a full disk says only "unexpected pos ..."
            reason = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
        kept = f"the previous checkpoint {previous} is intact" if previous else "no earlier checkpoint exists"
        raise CheckpointError(
            f"checkpoint {self.root / name} could not be written ({reason}; {_free_space(self.root)} free "
            f"under {self.root}); it was removed and {kept}"
            f". Free space under {self.root} and run the same command again to resume."
        ) from error

    def _prune(self) -> None:
        """Remove the checkpoints older than the last train.keep_last, except one that holds what the checkpoint
        did not write (lm export's default <checkpoint>/export, lm eval's eval_results.json): it stays, said once."""
        keep = self.latest()
        done = sorted(p for p in step_dirs(self.root) if (p / "trainer.json").exists())
        stale = [old for old in done[: -self.keep_last] if old != keep]
        for old in stale:
            added = added_files(old)
            if not added:
                _remove(old)
            elif old not in self._kept:
                self._kept.add(old)
                log.warning(
                    "kept %s past train.keep_last=%d: it holds %s, which the checkpoint did not write (an lm export, "
                    "eval results); move them out of it and a later checkpoint prunes it",
                    old,
                    self.keep_last,
                    ", ".join(added),
                )
        removed = [old.name for old in stale if not old.exists()]
        if len(removed) > 1:  # more than the one a save rotates out: a resume with a smaller keep_last, said here
            log.warning("train.keep_last=%d: removed the older checkpoints %s", self.keep_last, ", ".join(removed))

    def _check_intact(self, path: Path) -> None:
        """Raise (every rank) unless `path` matches its manifest; rank 0 checks. No fallback here: the
        checkpoint loaded must be the one whose config was compared (resume_point chose it)."""
        error = None
        if self.engine.is_main and path != self._verified:
            try:
                verified(path)
            except CheckpointError as e:
                error = str(e)
        error = dist_utils.broadcast_object(error)
        if error:
            raise CheckpointError(error)

    def load(self, path: Path) -> tuple[dict, dict]:
        """Restore the engine's model and optimizer from checkpoint `path` (as resume_point returned it);
        returns (trainer.json, this rank's loader state)."""
        self._check_intact(path)
        trainer = read_trainer(path)
        saved = trainer["engine"]
        try:
            if same_layout(saved, self.engine.describe()):
                _weights_only(lambda: self.engine.load_state(path), f"{path} ({self.engine.name}'s files)")
            else:
                self._load_elsewhere(path, trainer)
        except EngineError as e:  # the engine's refusal (lm.engine.formats.check_grouping, an elastic resume's)
            raise CheckpointError(str(e)) from None
        own = load_rank_state(self._rank_file(path, saved["world_size"]))
        if self.engine.rank < saved["world_size"]:  # a rank that did not exist continues its seeded streams
            set_rng_state(own["rng"])
        return trainer, own["loader"]

    def _load_elsewhere(self, path: Path, trainer: dict) -> None:
        """Another world size or engine class (elastic resume): the engine reshards what it can read
        (lm.engine.Engine.load_resharded) or says why not, in one line."""
        saved = trainer["engine"]
        if not trainer.get(ELASTIC):
            raise CheckpointError(
                f"{path} was written by {saved['engine']} on {saved['world_size']} rank(s), before lm could resume "
                f"on another engine or world size; this run is {self.engine.name} on {self.engine.world_size}. "
                f"Resume with the same engine and world size, or start a new run_dir from the weights "
                f"(lm export {path})"
            )
        _weights_only(lambda: self.engine.load_resharded(path, saved), f"{path} ({saved['engine']}'s files)")
        if self.engine.is_main:
            log.info(
                "resumed %s (%s on %d rank(s)) as %s on %d rank(s)",
                path,
                saved["engine"],
                saved["world_size"],
                self.engine.name,
                self.engine.world_size,
            )

    def _rank_file(self, path: Path, saved_world: int) -> Path:
        """This rank's file; a rank beyond the saved world size reads rank 0's: the task states are global
        positions (lm.data.packed, lm.glue.trainer), the same in every rank's file."""
        rank = self.engine.rank if self.engine.rank < saved_world else 0
        return path / f"rank{rank:05d}.pt"


def same_layout(saved: dict, current: dict) -> bool:
    """Whether the engine `current` describes (Engine.describe) reads the checkpoint `saved` (its trainer.json engine
    record) with its own load_state: the same engine class and world size, and for DeepSpeed the same ZeRO stage,
    whose files one DeepSpeedEngine class writes in another layout per stage. A key a checkpoint predates matches."""
    return all(saved.get(key, value) == value for key, value in current.items())


# -- checksums -------------------------------------------------------------------------------------


def _write_manifest(ckpt: Path) -> str:
    """sha256 + size of every file but trainer.json (which records the manifest's own sha256, returned)."""
    files = sorted(p for p in ckpt.rglob("*") if p.is_file() and str(p.relative_to(ckpt)) not in UNSEALED)
    entries = {str(p.relative_to(ckpt)): {"sha256": file_sha256(p), "bytes": p.stat().st_size} for p in files}
    _write_durably(ckpt / MANIFEST, json.dumps({"files": entries}, indent=1))
    return file_sha256(ckpt / MANIFEST)


def damage(ckpt: Path) -> str | None:
    """Why checkpoint `ckpt` cannot be trusted (a missing, truncated or changed file), or None.
    Files added later (an lm export into <checkpoint>/export) are not part of it."""
    ckpt = Path(ckpt)
    try:
        trainer = json.loads((ckpt / "trainer.json").read_text())
    except (OSError, ValueError) as e:
        return f"trainer.json cannot be read ({e})"
    if "manifest_sha256" not in trainer:
        return None  # written before checkpoints had checksums: nothing to compare with
    manifest = ckpt / MANIFEST
    if not manifest.is_file() or file_sha256(manifest) != trainer["manifest_sha256"]:
        return f"{MANIFEST} is missing or does not match the sha256 recorded in trainer.json"
    for name, want in json.loads(manifest.read_text())["files"].items():
        path = ckpt / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != want["bytes"]:
            return f"{name} has {path.stat().st_size} bytes, {want['bytes']} when written (truncated or overwritten)"
        if file_sha256(path) != want["sha256"]:
            return f"{name} does not match the sha256 written with it (its bytes changed since)"
    return None


def added_files(ckpt: Path) -> list[str]:
    """The names in checkpoint `ckpt` that it did not write (not in its manifest): an lm export's export/, lm eval's
    eval_results.json. [] for a checkpoint without a readable manifest (written before checksums): all its own."""
    try:
        listed = json.loads((Path(ckpt) / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    own = {name.split("/", 1)[0] for name in listed} | set(UNSEALED)
    return sorted(
        p.name
        for p in Path(ckpt).iterdir()
        if p.name not in own and (p.is_file() or any(f.is_file() for f in p.rglob("*")))  # not an empty directory
    )


def _read_pointer(root: Path) -> tuple[str | None, str | None]:
    """(the name `latest` holds, None) or (None, why there is none usable: missing, unreadable)."""
    pointer = root / LATEST
    if not pointer.exists() and not pointer.is_symlink():
        return None, f"{pointer} is missing"
    try:
        return pointer.read_text().strip(), None
    except (OSError, UnicodeDecodeError) as e:
        return None, f"{pointer} cannot be read ({e})"


def _own_step_dir(root: Path, name: str) -> bool:
    """Whether `name` is a step_NNNNNNNN directory directly in `root` (not a path, not a symlink elsewhere)."""
    path = root / name
    return bool(STEP_DIR.fullmatch(name)) and path.is_dir() and not path.is_symlink()


def step_dirs(root: Path):
    """This run's checkpoint directories under `root` (checkpoints/), newest first."""
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if _own_step_dir(root, p.name)), reverse=True)


def resume_point(root: Path) -> Path | None:
    """The checkpoint under `root` (a run's checkpoints/) to resume from: the one `latest` names when it is
    intact; else the newest intact step_* directory (older than a damaged one `latest` names), logged in one
    line; None when there is no checkpoint at all. A CheckpointError naming the damage and the options when
    checkpoints exist and none is intact: starting over would prune and overwrite them."""
    root = Path(root)
    name, problem = _read_pointer(root)
    candidates = step_dirs(root)
    if name is not None and _own_step_dir(root, name):
        ckpt = root / name
        why = damage(ckpt)
        if why is None:
            return ckpt
        problem = f"checkpoint {ckpt} is damaged ({why})"
        candidates, others = [p for p in candidates if p.name < name], "older checkpoint"
    elif name is not None:
        problem, others = (
            (f"{root / LATEST} names {name!r}, which is not a step_NNNNNNNN directory in {root} (treated as damaged)"),
            "checkpoint",
        )
    elif not candidates:
        return None  # a new run (at most .tmp-* debris of a first save that never completed)
    else:
        others = "checkpoint"
    for candidate in candidates:
        if damage(candidate) is None:
            log.warning("%s; resuming from %s, the newest intact checkpoint", problem, candidate)
            return candidate
    raise CheckpointError(
        f"{problem} and no {others} in {root} is intact. Options: restore the file from a copy; or start from "
        f"scratch in a new run_dir (or with resume=false); or move {root} away and rerun"
    )


def verified(ckpt: Path) -> Path:
    """`ckpt` if its files match its manifest (lm export, lm finetune init=), else a CheckpointError
    naming the damage and the intact checkpoints of the same run."""
    why = damage(ckpt)
    if why is None:
        return ckpt
    intact = [
        p.name for p in sorted(Path(ckpt).parent.glob("step_*"), reverse=True) if p != Path(ckpt) and damage(p) is None
    ]
    raise CheckpointError(
        f"checkpoint {ckpt} is damaged: {why}. "
        + (
            f"Intact checkpoints of this run: {', '.join(intact)} (pass one of them)"
            if intact
            else "No other intact checkpoint of this run exists"
        )
    )


def _remove(ckpt: Path) -> None:
    """Delete checkpoint `ckpt` as .tmp- debris that the next save removes: a kill mid-deletion left a step_* without
    its trainer.json, no longer a checkpoint and so never pruned, its files on disk for good."""
    trash = ckpt.with_name(f"{TMP_PREFIX}removed-{ckpt.name}")
    shutil.rmtree(trash, ignore_errors=True)
    try:
        os.replace(ckpt, trash)
    except OSError:  # not renamable (permissions): deleted in place, as far as it goes
        trash = ckpt
    shutil.rmtree(trash, ignore_errors=True)


def _free_space(path: Path) -> str:
    try:
        return f"{shutil.disk_usage(path).free / 2**20:.1f} MiB"
    except OSError:
        return "unknown space"


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


# -- reading a checkpoint outside training (lm export, lm finetune init=) ----------------------------


def resolve(path) -> Path:
    """A checkpoint directory from a run directory (its latest), a checkpoints/ dir, or itself."""
    path = Path(path)
    for candidate in (path / "checkpoints", path):
        if (candidate / LATEST).exists():
            name, why = _read_pointer(candidate)
            if name is None or not _own_step_dir(candidate, name):
                raise CheckpointError(
                    why
                    or f"{candidate / LATEST} names {name!r}, which is not a step_NNNNNNNN "
                    f"directory in {candidate}; pass one of its step_* directories instead"
                )
            return candidate / name
    if (path / "trainer.json").exists():
        return path
    raise CheckpointError(
        f"{path} is neither a run directory with checkpoints/latest nor a checkpoint "
        f"(no trainer.json); pass <run_dir> or <run_dir>/checkpoints/step_XXXXXXXX"
    )


def read_trainer(ckpt: Path) -> dict:
    try:
        return json.loads((Path(ckpt) / "trainer.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(
            f"{ckpt}/trainer.json cannot be read ({e}); the checkpoint is incomplete or "
            f"damaged: use another step_* directory of the run"
        ) from None


def consolidated_state_dict(ckpt: Path) -> dict[str, torch.Tensor]:
    """The full model state dict of a checkpoint of any engine, in one process, no process group: read
    by the engine class of the format recorded in its trainer.json."""
    from lm.engine import engine_for_format

    info = read_trainer(verified(ckpt))["engine"]
    try:
        engine_cls = engine_for_format(info["format"])
    except EngineError as e:
        raise CheckpointError(f"{ckpt}/trainer.json: {e}") from None
    return _weights_only(
        lambda: engine_cls.consolidated_state_dict(Path(ckpt), info),
        f"{ckpt} ({info.get('engine', info['format'])}'s files)",
    )
