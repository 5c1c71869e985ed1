"""Group runs into variants (cells of a sweep minus the seed) and refuse unfair comparisons.

A variant is named by the Hydra overrides that differ between runs, seeds excluded
(`model/ffn=swiglu model/norm=rmsnorm`, in whichever order a run lists them). Runs without
.hydra/overrides.yaml are named by the config values that differ instead, with component nodes
(model.ffn, ...) shown by the option file they match (`model/ffn=swiglu`).

Comparisons are only fair at equal data and budget: every run of one table must agree on the
data config and the training budget (steps, batch, sequence length). Seeds may differ.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

from lm.report.runs import ReportError, Run

# Keys that never define a variant: seeds (they are what we average over), where outputs go,
# and how the run is tracked.
IGNORED = re.compile(
    r"(^|[./])seed$|(^|\.)(run|out|output|save|checkpoint)_dir$|^(hydra|logger|wandb|tensorboard)([./]|$)"
)
# Keys that define the data and the training budget: they must agree within one table.
SETUP = re.compile(r"^data\.|^train\.(max_steps|max_tokens|seq_len|[a-z_]*batch[a-z_]*|[a-z_]*accum[a-z_]*)$")
# Data keys that change how fast the data is prepared, not what it is.
NOT_SETUP = re.compile(r"^data\.(workers|mirror|task_bytes|shard_tokens|hf_streaming)$")
COMPONENT_SLOTS = ("norm", "ffn", "pos", "attn", "block", "stack", "memory")  # config groups: lm/model/registry.py


@dataclass
class Variant:
    label: str
    runs: list = field(default_factory=list)

    @property
    def ok_runs(self) -> list:
        return [r for r in self.runs if r.ok]

    @property
    def failed_runs(self) -> list:
        return [r for r in self.runs if r.status == "failed"]

    @property
    def running_runs(self) -> list:
        return [r for r in self.runs if r.status == "running"]

    @property
    def repeated_runs(self) -> list:
        return [r for r in self.runs if r.status == "repeat"]

    def set_repeats_aside(self) -> None:
        """A finished run of the same variant and seed as an earlier one (a grid run again with other cells, its
        old cells landing at new job numbers) is the same experiment again: kept in the numbers, one seed would
        count twice, as if independent. The first in job order counts; the others are listed, not averaged."""
        first: dict = {}
        for r in self.ok_runs:
            seed = repr(r.get("seed"))
            if seed in first:
                r.status, r.reason = "repeat", f"the same variant and seed as {first[seed].path}"
            else:
                first[seed] = r


def flatten(node: Any, prefix: str = "") -> dict:
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out or ({prefix[:-1]: {}} if prefix else {})
    return {prefix[:-1]: node}


def _override_key(o: str) -> str:
    return o.lstrip("+~").split("=", 1)[0]


def _varying_overrides(runs: list) -> list:
    """Per run, its overrides minus ignored keys and minus those every run shares."""
    kept = [[o.lstrip("+") for o in r.overrides if not IGNORED.search(_override_key(o))] for r in runs]
    common = set.intersection(*map(set, kept)) if kept else set()
    return [[o for o in ks if o not in common] for ks in kept]


def _option_name(slot: str, node: Any) -> str | None:
    """The conf/model/<slot>/ option whose composed node equals this component node."""
    return next((name for name, option in _option_nodes(slot) if option == node), None)


@functools.cache
def _option_nodes(slot: str) -> tuple:
    """(name, node as saved in a run's config.yaml) of every conf/model/<slot>/ option, composed by Hydra."""
    from omegaconf import OmegaConf

    from lm.config import compose_group, conf_dir

    return tuple(
        (f.stem, OmegaConf.to_container(OmegaConf.structured(compose_group(f"model/{slot}", f.stem)), enum_to_str=True))
        for f in sorted((conf_dir() / "model" / slot).glob("*.yaml"))
    )


def _config_labels(runs: list) -> list:
    flats = [flatten(r.config) for r in runs]
    keys = sorted({k for f in flats for k in f if not IGNORED.search(k)})
    varying = [k for k in keys if len({repr(f.get(k)) for f in flats}) > 1]
    labels = []
    for run, flat in zip(runs, flats):
        parts, done = [], set()
        for k in varying:
            slot = next((s for s in COMPONENT_SLOTS if k.startswith(f"model.{s}.")), None)
            if slot and slot not in done:
                done.add(slot)
                name = _option_name(slot, run.get(f"model.{slot}"))
                if name:
                    parts.append(f"model/{slot}={name}")
                    continue
            if slot and slot in done and any(p.startswith(f"model/{slot}=") for p in parts):
                continue
            parts.append(f"{k}={flat.get(k)}")
        labels.append(" ".join(parts))
    return labels


def group_variants(runs: list) -> list:
    """Variants in order of first appearance (Hydra's job order)."""
    if runs and all(r.overrides is not None for r in runs):
        varying = _varying_overrides(runs)
        labels = [" ".join(o) for o in varying]
        # the same overrides in another order (two sweeps, their grids typed in another order) are one variant
        keys = [tuple(sorted(o)) for o in varying]
    else:
        labels = _config_labels(runs)
        keys = labels
    variants: dict = {}
    for run, label, key in zip(runs, labels, keys):
        variants.setdefault(key, Variant(label or "baseline")).runs.append(run)
    merged = _merge_same_configs(list(variants.values()))
    for v in merged:
        v.set_repeats_aside()
    return merged


def _merge_same_configs(variants: list) -> list:
    """Variants whose runs computed the same thing are one: an option named on the command line that is the default
    (`model/ffn=gelu` beside runs that left the ffn at gelu) made a second row of identical runs, each with a share
    of the seeds. Runs are the same when their resolved configs agree on every key but IGNORED's (seed, paths,
    tracking); a variant whose runs do not all agree, or that has no resolved config, is left as it is."""
    merged: dict = {}
    for i, v in enumerate(variants):
        into = merged.setdefault(_experiment(v) or i, v)
        if into is not v:
            into.runs += v.runs
            into.label = into.label if into.label != "baseline" else v.label  # the name the command line gave it
    return list(merged.values())


def _experiment(v: Variant) -> str | None:
    """What every run of `v` computed (its config minus IGNORED keys), or None if they differ or none is known."""
    flats = [flatten(r.config) for r in v.runs if r.config]
    configs = {
        repr(sorted((k, repr(x)) for k, x in flat.items() if not IGNORED.search(k)))
        for flat in flats
        if not any(unresolved(x) for x in flat.values())
    }
    return configs.pop() if len(configs) == 1 else None


def unresolved(v: Any) -> bool:
    """A cell that failed before writing its resolved config.yaml leaves only Hydra's
    .hydra/config.yaml, whose interpolations (`${oc.env:LM_CACHE,...}/data/${.name}`) cannot be
    compared with resolved values."""
    return isinstance(v, str) and "${" in v


def setup_of(run: Run) -> dict:
    return {
        k: v
        for k, v in flatten(run.config).items()
        if SETUP.search(k) and not IGNORED.search(k) and not NOT_SETUP.search(k) and not unresolved(v)
    }


def check_comparable(runs: list) -> None:
    """Raise when runs differ in data or budget (lm report --force skips this check)."""
    setups = [setup_of(r) for r in runs if r.config]
    keys = sorted({k for s in setups for k in s})
    # a key a run does not have (or has unresolved) is unknown there, not a difference
    values = {k: sorted({repr(s[k]) for s in setups if k in s}) for k in keys}
    differing = {k: vals for k, vals in values.items() if len(vals) > 1}
    if not differing:
        return
    lines = []
    for k, vals in differing.items():
        examples = []
        for v in vals:
            run = next(r for r in runs if r.config and k in setup_of(r) and repr(setup_of(r)[k]) == v)
            examples.append(f"{v} ({run.path})")
        lines.append(f"  {k}: " + " vs ".join(examples))
    raise ReportError(
        "these runs differ in data or training budget, so their losses are not comparable:\n"
        + "\n".join(lines)
        + "\nreport them separately, or pass --force to put them in one table anyway"
    )
