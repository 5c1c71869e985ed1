"""lm transfer's recipe (lm/cli/transfer.py runs it; lm/cli/transfer_join.py joins its one-arm records): what a
recipe is (Recipe), what it resolves to before any work (plan -> Plan), its steps (pretrain, finetune_arm on the
finetuning budget below) and the records it writes (transfer.json, transfer_seconds.json; each arm's
transfer_arm.json is compared and written by lm/cli/transfer_arms.py).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import platform
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from lm.config import ConfigError
from lm.core.files import file_sha256

log = logging.getLogger("lm")

DEFAULT_PRESET = "glue_transfer_decoder"
# Keyed by the preset's model family: model.arch, or the module of its model/family option (electra: an encoder
# pretrained by replaced-token detection, its discriminator finetuned as a plain encoder). Mean pooling for decoders
# (a causal model's last token has seen the text, but one position carries less than the average of all) and
# for masked-LM encoders (MLM trains no [CLS] objective); ELECTRA's [CLS]; docs/glue_transfer.md, "Pooling".
POOLING = {"decoder": "mean", "encoder": "mean", "encoder_decoder": "last", "electra": "first"}
OBJECTIVE = {"decoder": "causal LM", "encoder": "masked LM", "encoder_decoder": "span corruption", "electra": "rtd"}
CANDIDATE_TASKS = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")
FIXED = ("tokenizer", "init", "run_dir", "model")  # set by the recipe: the same for both arms and the pretraining
# --arm: the whole recipe, or one arm (the table is written by a call with --arm all once both are done)
ARMS = ("all", "scratch", "pretrained")
# The finetuning budget of both arms, the same for every task (conf/task/glue/ holds the full recipes): 3 epochs
# at lr 5e-4 (tiny models want more than BERT's 2e-5..1e-4, Turc et al. 2019), the first 5000 of SST-2's 67k
# training sentences and the first 2000 of STS-B's 5749 pairs; --finetune overrides any of it.
BUDGET_EXAMPLES = {"sst2": 5000, "stsb": 2000}
# The similarity pairs read apart (Sentence-BERT, Reimers & Gurevych 2019: each sentence pooled alone; the score
# from cos(u, v), MRPC's classes from [u; v; |u - v|]). A model this small finetuned on a few thousand pairs does
# not learn to compare two sentences read as one text: STS-B dev 12-22 in either arm read jointly, ~50 pretrained
# read apart (docs/glue_transfer.md, "How a pair is read"). RTE (entailment) stays joint.
BUDGET_PAIR_INPUT = {"mrpc": "siamese", "stsb": "siamese"}
# STS-B's cosine score starts from the training pairs' least-squares line, not the fixed [-1, 1] -> [0, 5] map,
# whose large first errors pull the backbone away from the similarity it encodes (docs/finetuning.md, fit_head).
BUDGET_FIT_HEAD = ("stsb",)
# Finetuning in the pretraining's precision: bf16 autocast where the device computes bf16 natively (a GPU, a CPU
# with AVX512-BF16 or AMX), else fp32. On such a CPU its steps run 2.2x faster and it scores as fp32 does
# (docs/results.md, "Finetuning in bf16").
BUDGET_PRECISION = "auto"
ARM_RECORD = "transfer_arm.json"  # in each arm's directory: the recipe it was finetuned under (transfer_arms.py)
LANE_LOG = "lane.log"  # --parallel: the scratch arm's log, in its directory (lm/cli/transfer_lane.py)


class TransferError(ConfigError):
    """The recipe cannot run as asked (mismatched tokenizers or models, a reused scratch arm of another
    recipe); the message says why and the fix."""


@dataclass
class Recipe:
    preset: str = DEFAULT_PRESET
    tokens: int = 10_000_000
    out: Path | None = None  # default runs/transfer/<preset>_<tokens>
    tasks: list[str] | None = None  # None = every task present in the mirror
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    scratch: Path | None = None  # default <out>/finetune/scratch
    group: str | None = None  # wandb group; default the output directory's name
    logger: str = "none"
    pretrain: list[str] = field(default_factory=list)  # lm train overrides
    finetune: list[str] = field(default_factory=list)  # lm finetune overrides (both arms)
    command: str = ""
    arm: str = "all"  # all; scratch: that arm alone; pretrained: the pretraining and that arm (ARMS; at 0 tokens
    # the pretrained arm is the scratch arm)
    parallel: bool = False  # the scratch arm in a second process beside the pretraining (lm/cli/transfer_lane.py)
    lane: bool = False  # this call is that second process: the parent counts the time

    def __post_init__(self):
        if self.arm not in ARMS:
            raise TransferError(f"--arm {self.arm}: must be one of {', '.join(ARMS)}")
        if self.parallel and self.arm != "all":
            raise TransferError(
                f"--parallel runs the scratch arm beside the pretraining, which --arm {self.arm} "
                f"leaves out; use --arm all (the default)"
            )
        self.out = Path(self.out or f"runs/transfer/{self.preset}_{self.tokens}")
        self.scratch = Path(self.scratch or self.out / "finetune" / "scratch")
        self.group = self.group or self.out.name

    def arm_dir(self, arm: str) -> Path:
        """An arm's lm finetune run directory; at 0 tokens the pretrained arm IS the scratch arm."""
        return self.out / "finetune" / "pretrained" if arm == "pretrained" and self.tokens else self.scratch


# -- the steps ---------------------------------------------------------------------------------------


def pretrain_config(r: Recipe, max_steps: int | None = None):
    """lm train's composed config for the recipe (max_steps None: the preset's, to read the batch shape)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    from lm.config import check_known_keys, composition_error, conf_dir, null_node_error, register_train_configs

    register_train_configs()
    presets = sorted(p.stem for p in (conf_dir() / "experiment").glob("*.yaml"))
    if r.preset not in presets:
        raise TransferError(
            f"--preset {r.preset}: no such experiment (conf/experiment/{r.preset}.yaml); pick one of "
            f"{', '.join(p for p in presets if p.startswith('glue_transfer'))} (or any of "
            f"{', '.join(p for p in presets if not p.startswith('glue_transfer'))})"
        )
    overrides = [
        f"experiment={r.preset}",
        f"run_dir={r.out / 'pretrain'}",
        f"logger={r.logger}",
        f"logger.group={r.group}",
        *r.pretrain,
    ]
    if max_steps is not None:
        overrides.append(f"train.max_steps={max_steps}")
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
            cfg = compose(config_name="train", overrides=overrides)
    except HydraException as e:  # one line: Hydra's second ("use +key=value to append") is wrong advice for a typo
        why = composition_error(e, r.pretrain) or str(e).strip().splitlines()[0]
        raise TransferError(f"--pretrain {' '.join(r.pretrain)}: {why} (lm train --help lists the keys)") from None
    except AssertionError as e:  # a field of a null node (model.family.hidden=512 on a Transformer): OmegaConf asserts
        why = null_node_error(e, r.pretrain)
        if why is None:
            raise
        raise TransferError(f"--pretrain {' '.join(r.pretrain)}: {why}") from None
    check_known_keys(cfg)  # a `+key=` no schema reads: refused now, not after the scratch arm's hours
    return cfg


def tokens_per_step(cfg) -> int:
    t = cfg.train
    sequences = t.global_batch_size or t.micro_batch_size * t.grad_accum  # one process: world size 1
    return int(sequences) * int(t.seq_len)


def check_finetune_overrides(overrides: list[str]) -> None:
    for o in overrides:
        key = o.lstrip("+~").split("=", 1)[0]
        flag = {"task": "--tasks"}.get(key) or ("--seeds" if re.fullmatch(r"tasks\.[^.]+\.seeds", key) else None)
        if flag:  # the recipe's own choice, which its records and table report: a --finetune one would replace it
            raise TransferError(
                f"--finetune {o}: the recipe chooses the {flag[2:]} of both arms itself (its table and records name "
                f"them); use {flag} instead (e.g. {'--tasks rte,mrpc' if flag == '--tasks' else '--seeds 0,1,2'})"
            )
        if key.split(".")[0].split("/")[0] in FIXED:
            raise TransferError(
                f"--finetune {o}: the recipe sets {key.split('.')[0]} itself. Both arms finetune the pretraining "
                f"run's model with its tokenizer (a different tokenizer would index the wrong embedding rows, a "
                f"different model would not be the same experiment); change the model or corpus with --pretrain "
                f"(e.g. --pretrain model.dim=384 data.vocab_size=4096)"
            )


def present_tasks(data_root: str | None = None) -> list[str]:
    """The GLUE tasks whose train and dev files are on disk (the mirror's glue_data, or glue.data_root)."""
    missing = missing_tasks(list(CANDIDATE_TASKS), data_root)
    return [t for t in CANDIDATE_TASKS if t not in missing]


def missing_tasks(tasks: list[str], data_root: str | None = None) -> dict[str, str]:
    """{task: why} for the tasks among `tasks` whose train or dev file is not on disk."""
    from lm.glue.config import GlueTaskConfig
    from lm.glue.run import check_data

    return check_data([GlueTaskConfig(name=t, data_root=data_root) for t in tasks])


def check_tasks_present(r: Recipe, tasks: list[str]) -> None:
    """A chosen task without its files is a TransferError before the corpus or the pretraining, as lm finetune
    would raise it only after them (the recipe reads GLUE from disk: hf=false); --finetune skip_missing=true
    lets lm finetune skip it instead."""
    root = _data_root(r.finetune)
    missing = missing_tasks(tasks, root)
    if missing and (override_value(r.finetune, "skip_missing") or "").lower() != "true":
        lines = "\n  ".join(f"{t}: {why}" for t, why in missing.items())
        have = ", ".join(present_tasks(root)) or "none"
        raise TransferError(
            f"--tasks: GLUE data missing for {', '.join(missing)}:\n  {lines}\npoint LM_DATA_MIRROR at the "
            f"directory that holds glue_data/ (or --finetune glue.data_root=<the glue_data directory>), or leave "
            f"the task out (on disk: {have}), or --finetune skip_missing=true"
        )


def prepared_tokenizer(cfg) -> Path:
    """Prepare the pretraining corpus (once; lm train finds it done) and return its tokenizer.json."""
    from omegaconf import OmegaConf

    from lm.data.config import DataConfig
    from lm.data.prepare import ensure_prepared

    data = OmegaConf.to_object(cfg.data)
    assert isinstance(data, DataConfig)
    return Path(ensure_prepared(data)) / "tokenizer.json"


def check_same_tokenizer(init_dir: Path, tokenizer: Path) -> None:
    """The pretrained arm reads its run's tokenizer, the scratch arm `tokenizer`: they must be one file."""
    from lm.glue.init import load_backbone

    used = load_backbone(str(init_dir)).tokenizer.sha256  # what lm finetune init=<run> will use (checked there too)
    if used != file_sha256(tokenizer):
        raise TransferError(
            f"the pretraining run {init_dir} was trained with a tokenizer (sha256 {used[:12]}) other than the one the "
            f"scratch arm would use ({tokenizer}, sha256 {file_sha256(tokenizer)[:12]}): the two arms would not be "
            f"comparable. Re-run with the corpus the pretraining used, or a new --out"
        )


def finetune_arm(
    r: Recipe, run_dir: Path, init: str, model_node, tokenizer: Path | None, pooling: str, tasks: list[str]
):
    """One arm: lm finetune (its Python API, the recipe's budget) on every task and seed."""
    from omegaconf import open_dict

    from lm.cli.finetune import finetune

    cfg = finetune_config(r, run_dir, init, tokenizer, pooling, tasks)
    with open_dict(cfg):
        cfg.model = model_node  # init=none builds exactly the pretraining run's model
    # --finetune resume=false starts the pairs over; the arm's recipe record stays (it was just compared with this
    # call's: moved aside, a shared scratch arm went unguarded and unarchivable) and so does the lane's log (moved
    # aside, the running lane wrote into previous/ and a failed lane's error could not read it back)
    return finetune(cfg, keep=(ARM_RECORD, LANE_LOG))


def budget(tasks: list[str]) -> list[str]:
    """The finetuning budget as lm finetune overrides of the selected tasks (tasks.<task>.<field>), seeds aside."""
    out = [f"task=[{','.join(f'glue/{t}' for t in tasks)}]", "optim.lr=5e-4", f"train.precision={BUDGET_PRECISION}"]
    for t in tasks:
        out += [f"tasks.{t}.epochs=3"]
        out += [f"tasks.{t}.max_train_examples={BUDGET_EXAMPLES[t]}"] if t in BUDGET_EXAMPLES else []
        out += [f"tasks.{t}.pair_input={BUDGET_PAIR_INPUT[t]}"] if t in BUDGET_PAIR_INPUT else []
        out += [f"tasks.{t}.fit_head=true"] if t in BUDGET_FIT_HEAD else []
    return out


def budget_overrides(tasks: list[str], seeds: list[int]) -> list[str]:
    """The budget and the seeds, as lm finetune overrides."""
    return [*budget(tasks), *(f"tasks.{t}.seeds=[{','.join(map(str, seeds))}]" for t in tasks)]


# --finetune keys that set every task's value, and the budget's per-task field each stands for: a per-task value
# outranks the shared one (the presets interpolate it), so the budget's own would silently win over the user's
SHARED_FIELDS = {"glue.max_train_examples": "max_train_examples"}


def superseded_budget(overrides: list[str], finetune: list[str]) -> list[str]:
    """The budget's overrides without the per-task ones that a --finetune shared key replaces (--finetune
    glue.max_train_examples=64 limits SST-2 and STS-B too, not only the tasks the budget leaves unlimited)."""
    fields = {f for key, f in SHARED_FIELDS.items() if override_value(finetune, key) is not None}
    return [o for o in overrides if not (o.startswith("tasks.") and o.split("=", 1)[0].split(".")[-1] in fields)]


def finetune_config(r: Recipe, run_dir: Path, init: str, tokenizer: Path | None, pooling: str, tasks: list[str]):
    """lm finetune's composed config for one arm. A --finetune override that does not compose (a task
    that is not selected, a wrong key) is a TransferError, raised before any pretraining."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    from lm.cli.finetune import register
    from lm.config import composition_error, conf_dir
    from lm.glue.config import unselected_task_override

    register()
    overrides = [
        f"init={init}",
        f"run_dir={run_dir}",
        *([f"tokenizer={tokenizer}"] if tokenizer else []),
        *superseded_budget(budget_overrides(tasks, r.seeds), r.finetune),
        f"pooling={pooling}",
        "predict_test=false",
        "hf=false",
        f"logger={r.logger}",
        f"logger.group={r.group}",
        *r.finetune,
    ]
    found = unselected_task_override(r.finetune, tasks)
    if found is not None:
        raise TransferError(
            f"--finetune {found[0]}: {found[1]} is not among the tasks the recipe finetunes ({', '.join(tasks)}); "
            f"add it to --tasks or leave the override out"
        )
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
            cfg = compose(config_name="finetune", overrides=overrides)
    except HydraException as e:  # one line: Hydra's second ("use +key=value to append") is wrong advice here
        why = composition_error(e, r.finetune) or str(e).strip().splitlines()[0]
        raise TransferError(f"--finetune {' '.join(r.finetune)}: {why}") from None
    for t in BUDGET_FIT_HEAD:  # unless --finetune sets it, the budget's score line follows how the pairs are read
        if (
            t in cfg.tasks
            and cfg.tasks[t].pair_input != "siamese"
            and override_value(r.finetune, f"tasks.{t}.fit_head") is None
        ):
            cfg.tasks[t].fit_head = False
    return cfg


def finetuned_model_node(model_node):
    """The model node the scratch arm builds: what finetuning makes of the pretrained model (its model/family
    option's `finetuned`). ELECTRA is finetuned as the plain encoder its discriminator is (lm/glue/init.py), so an
    ELECTRA recipe's scratch arm is the encoder recipe's, and a curve can share it (glue_transfer_curve.py does)."""
    from omegaconf import open_dict

    from lm.model.config import model_from_saved

    node = copy.deepcopy(model_node)
    typed = model_from_saved(node) if node.get("family") is not None else None
    if typed is not None and typed.family is not None and typed.family.finetuned(typed).family is None:
        with open_dict(node):
            node.family = None
    return node


def last_logged(run_dir: Path, key: str) -> float | None:
    """The last value of `key` in the run's metrics.jsonl (val_loss; probe/avg, the GLUE probe average that
    train.probe_interval logs), or None."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    values = [json.loads(line).get(key) for line in path.read_text().splitlines() if line.strip()]
    values = [v for v in values if v is not None]
    return values[-1] if values else None


def spent(out: Path, seconds: float) -> float:
    """Adds a call's seconds to the point's running total and returns the total."""
    from lm.core.files import atomic_write_text

    path = out / "transfer_seconds.json"
    try:
        total = float(json.loads(path.read_text())["seconds"]) if path.is_file() else 0.0
    except (ValueError, KeyError, TypeError):
        total = 0.0  # an unreadable counter restarts; the record then undercounts, never fails the run
    total += seconds
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({"seconds": round(total, 1)}) + "\n")
    return total


@dataclass
class Plan:
    """What a recipe resolves to before any work: the composed pretraining config and what both arms use."""

    cfg: object  # lm train's composed config (train.max_steps = steps, or the preset's when steps is 0)
    steps: int
    per_step: int  # tokens a pretraining step
    arch: str  # family(): the key of POOLING and OBJECTIVE
    pooling: str
    tasks: list[str]
    tokenizer: Path  # the prepared corpus' tokenizer.json: the scratch arm's, and the pretraining run's
    model_node: object  # the model both arms finetune (finetuned_model_node)


def plan(r: Recipe) -> Plan:
    """Checks the recipe and resolves it; prepares the corpus (once). A bad --tokens, --finetune or missing
    GLUE data fails here, before any pretraining."""
    check_finetune_overrides(r.finetune)
    if r.tokens < 0:
        raise TransferError(f"--tokens {r.tokens}: must be >= 0 (0 = no pretraining, the curve's origin)")
    base = pretrain_config(r)
    per_step = tokens_per_step(base)
    steps = math.ceil(r.tokens / per_step)
    cfg = pretrain_config(r, steps) if steps else base
    arch = family(cfg.model)
    if arch not in POOLING:
        given = f"--pretrain {' '.join(r.pretrain)}" if r.pretrain else f"--preset {r.preset}"
        raise TransferError(
            f"{given}: the model family {arch} is not one the "
            f"recipe finetunes ({', '.join(POOLING)}); pretrain it with lm train and finetune it with "
            f"lm finetune init=<run>"
        )
    pooling = _pooling(r.finetune) or POOLING[arch]
    tasks = r.tasks or present_tasks(_data_root(r.finetune))
    if not tasks:
        raise TransferError(
            "no GLUE task has its train and dev files on disk; set LM_DATA_MIRROR (or --finetune "
            "glue.data_root=<glue_data>)"
        )
    if r.tasks:  # chosen; present_tasks' own are on disk
        check_tasks_present(r, tasks)
    finetune_config(r, r.scratch, "none", None, pooling, tasks)  # a bad --finetune fails here, not after hours
    return Plan(
        cfg=cfg,
        steps=steps,
        per_step=per_step,
        arch=arch,
        pooling=pooling,
        tasks=tasks,
        tokenizer=prepared_tokenizer(cfg),
        model_node=finetuned_model_node(cfg.model),
    )


def pretrain(r: Recipe, p: Plan) -> None:
    """lm train on the plan's config (resumes from <out>/pretrain's latest checkpoint); then checks that the
    run's tokenizer is the prepared corpus' one, the scratch arm's."""
    from lm.cli.train import train

    log.info(
        "lm transfer: pretraining %s for %d steps (%d tokens) in %s",
        r.preset,
        p.steps,
        p.steps * p.per_step,
        r.out / "pretrain",
    )
    train(p.cfg)
    check_same_tokenizer(r.out / "pretrain", p.tokenizer)


def scratch_record(r: Recipe, p: Plan) -> dict:
    """What the scratch arm's results depend on besides the code (<scratch>/transfer_arm.json): a curve's runs
    share the arm while this agrees on the tasks both name (seeds and tasks aside: lm/cli/transfer_arms.py), and
    the curve's archive keys a finished arm by the record as written there (the seeds and tasks it holds)."""
    from omegaconf import OmegaConf

    return {
        "tokenizer_sha256": file_sha256(p.tokenizer),
        "pooling": p.pooling,
        "tasks": p.tasks,
        "seeds": r.seeds,
        "model": OmegaConf.to_container(p.model_node, resolve=True),
        "budget": budget(p.tasks),  # a scratch arm finetuned under an older budget is not reused
        "finetune": r.finetune,
    }


def recipe_record(r: Recipe, p: Plan) -> dict:
    """What the table says of the recipe (transfer.json's "recipe")."""
    return {
        "preset": r.preset,
        "arch": p.arch,
        "objective": OBJECTIVE[p.arch],
        "pooling": p.pooling,
        "pos": position_scheme(p.cfg.model),
        "tokens": p.steps * p.per_step,
        "tokens_asked": r.tokens,
        "steps": p.steps,
        "tokens_per_step": p.per_step,
        "val_loss": last_logged(r.out / "pretrain", "val_loss") if p.steps else None,
        "probe": last_logged(r.out / "pretrain", "probe/avg") if p.steps else None,
        "tasks": p.tasks,
        "seeds": r.seeds,
        "tokenizer": str(p.tokenizer),
        "tokenizer_sha256": file_sha256(p.tokenizer),
        "group": r.group,
        "pretrain_overrides": r.pretrain,
        "finetune_overrides": r.finetune,
        "finetune_note": "the quickstart's budget (3 epochs, lr 5e-4, SST-2 first 5,000 and STS-B first "
        "2,000 train examples, MRPC and STS-B read as siamese pairs, STS-B's score line fit first) unless "
        f"overridden, {p.pooling} pooling, "
        "best dev epoch" + (f"; overrides: {' '.join(r.finetune)}" if r.finetune else ""),
    }


def run_record(command: str, seconds: float) -> dict:
    return {
        "command": command,
        "machine": f"{platform.node()} ({platform.machine()}, {cpu_cores()} cores)",
        "finished": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "seconds": round(seconds, 1),
    }


def write_table(out: Path, summary: dict) -> dict:
    from lm.core.files import atomic_write_text
    from lm.report.transfer import transfer_table

    summary["run"] = _kept_run(out / "transfer.json", summary)
    atomic_write_text(out / "transfer.json", json.dumps(summary, indent=2) + "\n")
    atomic_write_text(out / "transfer.md", transfer_table(summary))
    return summary


# The recipe fields that decide the work done: equal ones (and equal scores) mean nothing was redone.
WORK_KEYS = ("preset", "tokens", "seeds", "tasks", "pretrain_overrides", "finetune_overrides")


def position_scheme(model_node) -> str:
    """The model's position scheme as the report names it (model/pos: learned, rope, alibi, ...)."""
    target = (model_node.get("pos") or {}).get("_target_")
    return str(target).rsplit(".", 1)[-1].lower() if target else "none"


def _kept_run(path: Path, summary: dict) -> dict:
    """This call's run record, or the earlier one where this call only read finished arms back (same recipe,
    same scores): the record then keeps the command, date and duration of the call that did the work."""
    if path.is_file():
        try:
            old = json.loads(path.read_text())
        except ValueError:
            return summary["run"]
        new = json.loads(json.dumps(summary))  # as it would read back (tuples become lists)
        same = all(_same_work(k, old.get("recipe", {}).get(k), new["recipe"][k]) for k in WORK_KEYS)
        if same and old.get("comparison") == new["comparison"] and "run" in old:
            return old["run"]
    return summary["run"]


def _same_work(key: str, old, new) -> bool:
    """Two recipes' WORK_KEYS value agrees; override lists by the overrides that change what is computed (a read-back
    call adding train.progress=false took over the record of the call that did the work)."""
    if key.endswith("_overrides") and isinstance(old, list):
        from lm.report.transfer import computes

        side = key.split("_")[0]
        return [o for o in old if computes(side, o)] == [o for o in new if computes(side, o)]
    return old == new


def family(model_node) -> str:
    """The key of POOLING / OBJECTIVE and the report's label: model.arch, or the module of the model/family option
    (lm.zoo.electra.ElectraLM: electra)."""
    option = model_node.get("family")
    return str(option["_target_"]).split(".")[-2] if option is not None else str(model_node.arch)


def cpu_cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def override_value(overrides: list[str], key: str) -> str | None:
    """The value the last `key=value` among the overrides sets (a later one wins), None where none sets key."""
    values = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == key]
    return values[-1] if values else None


def _pooling(overrides: list[str]) -> str | None:
    return override_value(overrides, "pooling")


def _data_root(overrides: list[str]) -> str | None:
    return override_value(overrides, "glue.data_root")
