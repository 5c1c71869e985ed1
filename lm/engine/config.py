"""Engine option schemas (conf/engine/*.yaml): one dataclass per engine class with its own options.

`engine=<option>` picks the class by `_target_`; lm.cli.train instantiates the `_partial_` node with
the run's TrainConfig and process-group info. No option repeats a train.* value: DeepSpeed's JSON is
built from the TrainConfig in lm/engine/ds.py.
"""

from dataclasses import dataclass, field
from typing import Any, Protocol


class TrainSettings(Protocol):
    """The train.* values an engine reads (lm.core.config.TrainConfig has them): the engine is handed the
    run's typed train config but never imports lm.core (lm.core's loop imports lm.engine)."""

    @property
    def micro_batch_size(self) -> int: ...

    @property
    def grad_accum(self) -> int: ...

    @property
    def grad_clip(self) -> float: ...  # 0 disables clipping

    @property
    def precision(self) -> str: ...  # fp32 | bf16 | fp16

    @property
    def compile(self) -> bool: ...

    @property
    def compile_mode(self) -> str: ...  # torch.compile's mode (a str Enum: "default", "reduce-overhead", ...)

    @property
    def float8(self): ...  # False | "torchao" (lm/engine/float8.py)


@dataclass
class EngineConfig:
    _target_: str = ""
    _partial_: bool = True


@dataclass
class SingleConfig(EngineConfig):
    _target_: str = "lm.engine.SingleEngine"


@dataclass
class DDPConfig(EngineConfig):
    _target_: str = "lm.engine.DDPEngine"
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False


@dataclass
class FSDP2Config(EngineConfig):
    _target_: str = "lm.engine.FSDP2Engine"
    reshard_after_forward: bool = True  # ZeRO-3 behaviour; false keeps gathered weights until backward


@dataclass
class DeepSpeedConfig(EngineConfig):
    _target_: str = "lm.engine.DeepSpeedEngine"
    _convert_: str = "all"  # the engine gets `config` as a plain dict
    shm_comm: bool = False  # DeepSpeed's shared-memory CPU allreduce: a ~50 s compile on first use
    cpu_adam: bool = (
        False  # with optimizer offload: DeepSpeedCPUAdam (fast, ~100 s compile once) instead of torch AdamW
    )
    # DeepSpeed's own JSON minus what train.* decides (batch sizes, accumulation, clipping, precision),
    # which lm.engine.ds.ds_config adds; e.g. zero_optimization.stage, offload_optimizer.
    config: dict[str, Any] = field(default_factory=dict)


ENGINES = {"single": SingleConfig, "ddp": DDPConfig, "fsdp2": FSDP2Config, "deepspeed": DeepSpeedConfig}


def register_engine_configs() -> None:
    """engine/<name>_schema: each conf/engine/*.yaml lists its engine's schema first."""
    from hydra.core.config_store import ConfigStore

    for name, node in ENGINES.items():
        ConfigStore.instance().store(group="engine", name=f"{name}_schema", node=node)
