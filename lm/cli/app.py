"""The Hydra entry point shared by lm-train and lm-finetune.

Both apps run the same way under every launcher (python, torchrun, accelerate, deepspeed, srun):
drop the launcher's `--local_rank` argument, agree on one run stamp across ranks, run the job,
turn the errors a user can fix into one log line and exit status 1 (or, inside a Hydra multirun,
re-raise so the sweep records the cell and goes on), and always tear the process group down.
"""

import logging
import os
import sys
import time
from typing import Callable, Tuple, Type

from omegaconf import DictConfig

from lm.config import conf_dir
from lm.extras import MissingExtra

log = logging.getLogger("lm")


def run_app(prog: str, config_name: str, job: Callable[[DictConfig], None],
            user_errors: Tuple[Type[BaseException], ...]) -> None:
    """Compose `conf/<config_name>.yaml` with the command line and run `job(cfg)` on every rank."""
    import hydra

    from lm.engine import dist as D
    from lm.engine.dist import EngineError

    _strip_launcher_args()
    try:
        _agree_on_run_stamp()
    except EngineError as e:
        sys.exit(f"{prog}: {e}")

    @hydra.main(config_path=str(conf_dir()), config_name=config_name, version_base=None)
    def app(cfg: DictConfig) -> None:
        try:
            job(cfg)
        except (EngineError, MissingExtra, *user_errors) as e:
            log.error("%s: %s", type(e).__name__, e)
            D.shutdown()
            if _in_multirun():  # Hydra records a cell's exception and goes on; an exit would end the sweep
                raise
            sys.exit(1)

    try:
        app()
    finally:
        D.shutdown()
    D.exit_after_success()


def _agree_on_run_stamp() -> None:
    """Rank 0's clock names the run: `run_dir: runs/${lm.stamp:}` is then one directory for all ranks."""
    from lm.engine import dist as D

    if "LM_RUN_STAMP" in os.environ:
        return
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    if D.launched_world_size() > 1:
        D.init(D.pick_device("auto"))
        stamp = D.broadcast_object(stamp)
    os.environ["LM_RUN_STAMP"] = stamp


def _in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _strip_launcher_args() -> None:
    # The deepspeed launcher appends --local_rank=N (LOCAL_RANK is in the environment too); Hydra
    # would take it for an override.
    sys.argv = [a for a in sys.argv if not a.startswith("--local_rank")]
