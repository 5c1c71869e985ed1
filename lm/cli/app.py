"""The Hydra entry point shared by lm train and lm finetune.

Both apps run the same way under every launcher (python, torchrun, accelerate, deepspeed, srun):
stop with a SIGKILLed torchrun (lm.engine.dist.stop_with_torchrun), drop the launcher's `--local_rank`
argument, agree on one run stamp across ranks, run the job, turn the errors a user can fix (lm/cli/errors.py)
into one log line (under torchrun, rank 0's) and exit status 1 (or, inside a Hydra multirun, re-raise so the
sweep records the cell and goes on), remove the run directory Hydra created when the job was refused before
writing into it, and always tear the process group down.
"""

import contextlib
import errno
import io
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig

from lm.config import conf_dir

log = logging.getLogger("lm")


def run_app(
    prog: str,
    config_name: str,
    job: Callable[[DictConfig], None],
    user_errors: tuple[type[BaseException], ...] = (),
    check_args: Callable[[list[str]], None] | None = None,
) -> None:
    """Compose `conf/<config_name>.yaml` with the command line and run `job(cfg)` on every rank.
    `check_args(argv)` refuses what Hydra would only report with a traceback. What a user can fix
    (lm/cli/errors.py's `describe`, plus `user_errors`) is logged as one line and ends the job with status 1."""
    import hydra

    from lm.cli.errors import describe, quiet
    from lm.cli.group_choice import check_group_options
    from lm.engine import dist as dist_utils

    dist_utils.stop_with_torchrun()
    _strip_launcher_args()
    _check_run_dir_arg(prog, config_name)
    _one_hydra_mode(prog, sys.argv[1:])
    sys.argv = [sys.argv[0], *cells_apart(sys.argv[1:])]
    _refuse_moved_overrides(sys.argv[1:])
    if check_args is not None:
        check_args(sys.argv[1:])  # its errors reach main()'s lm.cli.errors.entry: one line
    check_group_options(sys.argv[1:])
    _agree_on_run_stamp()
    fresh = _new_run_dirs(config_name)

    @hydra.main(config_path=str(conf_dir()), config_name=config_name, version_base=None)
    def app(cfg: DictConfig) -> None:
        try:
            job(cfg)
        except Exception as e:  # noqa: BLE001 - a bug (no line to say) is re-raised with its traceback
            line = describe(e) or (str(e) if isinstance(e, user_errors) else None)
            if line is None:
                raise
            said = f"{type(e).__name__}: {line}"
            if in_multirun() or not quiet(said):  # a sweep's cell goes on: no elastic error file is written for it
                log.error("%s", said)  # sweep reports read this line back (lm/report/runs.py)
            dist_utils.shutdown()
            _remove_if_empty(fresh)
            if in_multirun() and _stopped(e):  # preempted: end the sweep (lm.sweep.launchers.SweepStopped)
                from lm.sweep.launchers import SweepStopped

                raise SweepStopped(1) from e
            if in_multirun():  # Hydra records a cell's exception and goes on; an exit would end the sweep
                raise
            sys.exit(1)

    try:
        with _composition_errors_in_one_line(prog), _help_without_schemas():
            app()
    finally:
        dist_utils.shutdown()
    dist_utils.exit_after_success()


@contextlib.contextmanager
def _composition_errors_in_one_line(prog: str):
    """An override Hydra cannot apply (`train.max_step=20`, `train.max_steps=abc`) ends in one line naming the
    closest key (lm.config.composition_error), not Hydra's 5-7 lines that advise `+train.max_step=20`; one it cannot
    read (`run_dir=runs/lr=3e-4`) names the quoted form that reads as typed (override_parse_error). Hydra reports
    composition errors inside its private hydra._internal.utils.run_and_report and offers no hook, so that function
    is wrapped while the app runs; a Hydra without it keeps its own report, as does HYDRA_FULL_ERROR=1."""
    from hydra._internal import utils as hydra_utils
    from hydra.errors import ConfigCompositionException, OverrideParseException

    from lm.config import composition_error, null_node_error, override_parse_error

    original = getattr(hydra_utils, "run_and_report", None)
    if original is None or os.environ.get("HYDRA_FULL_ERROR") == "1":
        yield
        return

    def report(func):
        def one_line():
            try:
                return func()
            except ConfigCompositionException as e:
                line = composition_error(e, sys.argv[1:])
                if line is None:
                    raise  # a missing config file: Hydra's report lists the options
                sys.exit(f"{prog}: {line}")
            except OverrideParseException as e:  # `run_dir=runs/lr=3e-4`: Hydra's line names neither it nor a fix
                sys.exit(f"{prog}: {override_parse_error(e.override, e.message)}")
            except AssertionError as e:  # a field of a null node: OmegaConf asserts (lm.config.null_node_error)
                line = null_node_error(e, sys.argv[1:])
                if line is None:
                    raise
                sys.exit(f"{prog}: {line}")
            except Exception as e:  # noqa: BLE001 - a bug keeps Hydra's traceback
                line = _failed_cell_line(e)
                if line is None:
                    raise
                sys.exit(f"{prog}: {line}")

        return original(one_line)

    hydra_utils.run_and_report = report
    try:
        yield
    finally:
        hydra_utils.run_and_report = original


def _failed_cell_line(e: Exception) -> str | None:
    """The last line of a sweep whose cell failed with an error a user can fix: Hydra re-raises the first failed
    cell's exception once the cells have run, and would print its traceback for what the cell logged as one line."""
    from lm.cli.errors import describe
    from lm.sweep.launchers import CellExited

    if not {"-m", "--multirun"} & set(sys.argv[1:]):  # HydraConfig is the parent's again here: no mode to ask
        return None
    line = str(e) if isinstance(e, CellExited) else describe(e)
    if line is None:
        return None
    why = "each failed cell logged its error; the other cells ran"
    return f"a cell of the sweep failed ({why}); the first: {type(e).__name__}: {line}"


@contextlib.contextmanager
def _help_without_schemas():
    """--help: Hydra's text, each config group's line without the schema nodes (lm/cli/group_choice.py)."""
    if not {"--help", "-h"} & set(sys.argv[1:]):
        yield
        return
    from lm.cli.group_choice import offered_only

    text = io.StringIO()
    try:
        with contextlib.redirect_stdout(text):
            yield  # Hydra prints the help and exits
    finally:
        sys.stdout.write(offered_only(text.getvalue()))


# Hydra's modes, of which a command line takes one (hydra/_internal/utils.py _run_hydra)
_MODES = {"--run": "-r", "--multirun": "-m", "--cfg": "-c", "--info": "-i", "--shell-completion": "-sc"}


def _one_hydra_mode(prog: str, args: list[str]) -> None:
    """`lm train -m a=1,2 --cfg job` (to see a sweep's config first) ended in Hydra's ValueError traceback:
    one line instead, saying what does work."""
    given = [f for f, short in _MODES.items() if any(a in (f, short) or a.startswith(f + "=") for a in args)]
    if len(given) < 2:
        return
    hint = ""
    if {"--multirun", "--cfg"} <= set(given):
        hint = "; to print a cell's config, drop -m and give each swept key one of its values"
    flags = " and ".join(_MODES[f] if f in ("--multirun", "--run") else f for f in given)
    sys.exit(f"{prog}: {flags} do not go together (Hydra runs, sweeps or prints, one per command){hint}")


def _refuse_moved_overrides(args: list[str]) -> None:
    """An override of a model field that became a zoo option (lm/model/upgrade.py): one line naming the new one."""
    from lm.config import ConfigError
    from lm.model.upgrade import moved_override

    for arg in args:
        line = moved_override(arg)
        if line is not None:
            raise ConfigError(line)


def _new_run_dirs(config_name: str) -> list[Path]:
    """The run directory Hydra is about to create, and each of its parents it will create with it, when
    they do not exist yet: a job refused before writing anything removes them again (they are empty)."""
    from lm.config import run_name_of

    args = [a.lstrip("+") for a in sys.argv[1:]]
    values = [a.split("=", 1)[1] for a in args if a.startswith(("run_dir=", "hydra.run.dir="))]
    if values:
        run_dir = values[-1]
    else:  # runs/<the overrides>, as lm.config.run_name will name it
        prefix = _default_run_dir_prefix(config_name)
        run_dir = prefix + run_name_of(_task_overrides(sys.argv[1:])) if prefix else ""
    if not run_dir or "${" in run_dir or "," in run_dir or "-m" in sys.argv[1:] or "--multirun" in sys.argv[1:]:
        return []
    path, fresh = Path(run_dir).expanduser().absolute(), []
    while not path.exists() and not path.is_symlink() and path != path.parent:
        fresh.append(path)
        path = path.parent
    return fresh


def _remove_if_empty(fresh: list[Path]) -> None:
    for path in fresh:  # deepest first
        try:
            path.rmdir()  # only an empty directory: anything written into it stays
        except OSError:
            return


def _agree_on_run_stamp() -> None:
    """Rank 0's clock names a sweep (`runs/${lm.stamp:}/<cell>`, `logger.group: ..._${lm.stamp:}`): one name
    for all ranks."""
    from lm.config import STAMP_ENV, run_stamp
    from lm.engine import dist as dist_utils

    if STAMP_ENV in os.environ:
        return
    stamp = run_stamp()  # made here: a sweep's directory it names is claimed (lm.sweep.callbacks.OwnSweepDir)
    if dist_utils.launched_world_size() > 1:
        dist_utils.init(dist_utils.pick_device("auto"))
        os.environ[STAMP_ENV] = dist_utils.broadcast_object(stamp)


def _stopped(e: Exception) -> bool:
    """Whether a stop signal (SIGTERM, SIGUSR1, Ctrl-C) stopped the job (lm.core.loop, when it ran, says so)."""
    loop = sys.modules.get("lm.core.loop")
    return loop is not None and isinstance(e, loop.Preempted)


def in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _check_run_dir_arg(prog: str, config_name: str = "") -> None:
    """Hydra creates `run_dir=` (hydra.run.dir is pinned to it; a sweep's hydra.sweep.dir) before the job
    starts, so an unwritable one would end in Hydra's traceback: refuse it here in one line. With no run_dir=
    the default (`runs/...` of conf/<config_name>.yaml, under the current directory) is checked. lm/core/lock.py
    catches the rest (an existing read-only run_dir, a sweep's cells)."""
    from lm.core.lock import unwritable_message

    args = [a.lstrip("+") for a in sys.argv[1:]]
    for key in ("run_dir", "hydra.run.dir", "hydra.sweep.dir"):
        values = [a.split("=", 1)[1] for a in args if a.startswith(key + "=")]
        if not values or "${" in values[-1] or "," in values[-1]:  # interpolations and sweeps: Hydra's to resolve
            continue
        run_dir = Path(values[-1]).expanduser()
        error = _unwritable(run_dir)
        if error is not None:
            sys.exit(
                f"{prog}: {unwritable_message(run_dir, error)}"
                if key == "run_dir"
                else f"{prog}: {key}={run_dir} is not writable: {_reason(error)}; pick another {key}"
            )
    if not any(a.startswith(("run_dir=", "hydra.run.dir=", "hydra.sweep.dir=")) for a in args):
        default = _default_run_dir_prefix(config_name)
        error = _unwritable(Path(default)) if default else None
        if error is not None:
            sys.exit(
                f"{prog}: the default run_dir ({default}<overrides>, under the current directory "
                f"{Path.cwd()}) is not writable: {_reason(error)}. Pass run_dir=<a writable directory>, "
                f"or run {prog} from a directory you can write to"
            )


def cells_apart(args: list[str]) -> list[str]:
    """Under -m, a `run_dir=X` given once would put every cell in X (each later cell resuming the first, or
    refused by the resume check): X becomes the sweep's directory instead, and each cell X/<job number>.
    A run_dir that is swept (`a,b`) or interpolated is the user's own plan and is left as it is."""
    if not any(a in ("-m", "--multirun") for a in args):
        return args
    at = [i for i, a in enumerate(args) if a.lstrip("+").startswith("run_dir=")]
    if not at:
        return args
    value = args[at[-1]].split("=", 1)[1]
    if "${" in value or "," in value:
        return args
    out = [a for i, a in enumerate(args) if i not in at] + [f"run_dir={value}/${{hydra:job.num}}"]
    if not any(a.lstrip("+").startswith("hydra.sweep.dir=") for a in args):
        out.append(f"hydra.sweep.dir={value}")  # Hydra's multirun.yaml goes beside the cells, not to runs/<stamp>
    return out


def _reason(error: OSError) -> str:
    return error.strerror + (f" ({error.filename})" if error.filename else "")


def _default_run_dir_prefix(config_name: str) -> str:
    """The literal start of conf/<config_name>.yaml's run_dir (`runs/` of `runs/${lm.run_name:}${lm.cell:}`), the
    directory the default run_dir is named in. Empty when it is not a plain relative path followed by the name."""
    import yaml

    try:
        value = str(yaml.safe_load((conf_dir() / f"{config_name}.yaml").read_text()).get("run_dir", ""))
    except (OSError, yaml.YAMLError, AttributeError):
        return ""
    prefix, _, rest = value.partition("${")
    named = "${" + rest in ("${lm.run_name:}", "${lm.run_name:}${lm.cell:}")  # lm.cell: "" outside a multirun
    return prefix if named and not prefix.startswith(("/", "~")) and prefix.endswith("/") else ""


# Hydra's flags that take the next argument as their value (hydra/_internal/utils.py get_args_parser)
_VALUE_FLAGS = (
    "--cfg",
    "-c",
    "--package",
    "-p",
    "--config-path",
    "-cp",
    "--config-name",
    "-cn",
    "--config-dir",
    "-cd",
    "--experimental-rerun",
)


def _task_overrides(argv: list[str]) -> list[str]:
    """The overrides of a command line as Hydra records them in hydra.overrides.task: flags, their values and
    hydra.* / hydra/ overrides left out."""
    found, skip = [], False
    for arg in argv:
        if skip or arg.startswith("-"):
            skip = not skip and arg in _VALUE_FLAGS
            continue
        if not arg.lstrip("+~").startswith(("hydra.", "hydra/")):
            found.append(arg)
    return found


def _unwritable(run_dir: Path):
    """The OSError creating or writing in `run_dir` would raise, found without creating anything; None if none."""
    path = run_dir.absolute()
    while not path.exists() and not path.is_symlink() and path != path.parent:
        path = path.parent  # the nearest existing ancestor is where mkdir would write
    if not path.is_dir():
        return NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path))
    if not os.access(path, os.W_OK | os.X_OK):
        return PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
    return None


def _strip_launcher_args() -> None:
    # The deepspeed launcher appends --local_rank=N (LOCAL_RANK is in the environment too); Hydra
    # would take it for an override.
    sys.argv = [a for a in sys.argv if not a.startswith("--local_rank")]
