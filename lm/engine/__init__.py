"""Engines: the only code that knows about DDP, FSDP2 or DeepSpeed (imported lazily).

conf/engine/<name>.yaml picks the class (`_target_`); lm.cli.train instantiates it with the run's
TrainConfig and process-group info, then `engine.wrap(model, make_optimizer)`. See base.py for the
interface the loop uses.
"""

from typing import TYPE_CHECKING

from lm.engine.base import Engine, SingleEngine
from lm.engine.dist import Dist, EngineError

if TYPE_CHECKING:  # loaded lazily by __getattr__ below; named here for type checkers
    from lm.engine.ds import DeepSpeedEngine
    from lm.engine.torch_engines import DDPEngine, FSDP2Engine

__all__ = [
    "Engine",
    "SingleEngine",
    "DDPEngine",
    "FSDP2Engine",
    "DeepSpeedEngine",
    "Dist",
    "EngineError",
    "engine_for_format",
]

# trainer.json's engine "format" -> the class that reads that checkpoint layout back (DDP shares "torch").
CHECKPOINT_FORMATS = {"torch": "Engine", "dcp": "FSDP2Engine", "deepspeed": "DeepSpeedEngine"}


def engine_for_format(fmt: str) -> type:
    """The engine class whose save_state wrote checkpoints of format `fmt` (imports only that engine)."""
    if fmt not in CHECKPOINT_FORMATS:
        raise EngineError(f"unknown checkpoint format {fmt!r}; this lm reads {sorted(CHECKPOINT_FORMATS)}")
    name = CHECKPOINT_FORMATS[fmt]
    return globals()[name] if name in globals() else __getattr__(name)


def __getattr__(name):
    # torch.distributed's wrappers and deepspeed load only when an engine that needs them is picked.
    if name in ("DDPEngine", "FSDP2Engine"):
        from lm.engine import torch_engines

        return getattr(torch_engines, name)
    if name == "DeepSpeedEngine":
        from lm.engine.ds import DeepSpeedEngine

        return DeepSpeedEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
