"""Callbacks at fixed points of a run, for tools that are not part of training itself (fault injection in
tests and benchmarks/fault_injection.py, step timers of the speed benchmarks). Production code only calls
them; it never knows why.

    step_begin(step)              as each optimizer step starts (lm.core.loop; step: the run's 0-based step)
    step_batches(step, micro)     each optimizer step's micro-batches as the task handed them out, before the
                                  forward (lm.core.loop; micro: this rank's list of batch dicts, read-only)
    after_backward(step, micro)   after each micro-batch's backward (lm.core.loop; step: the run's 0-based
                                  optimizer step, micro: the micro-batch's index in it)
    save_phase(phase)             at each point of Checkpointer.save (lm.core.checkpoint): "begin" on every
                                  rank, then SAVE_PHASES in the order the save reaches them (with
                                  train.async_checkpoint, in the background thread that writes it)

The extension point for a process started elsewhere (a test runs `lm train` in a subprocess):
LM_PLUGINS=<module or file.py>[,...] names modules with an `install(hooks)` function; the run harness
(lm.core.session.Session) calls each one with the Hooks of every run it starts.
"""

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Hooks:
    step_begin: list[Callable[[int], None]] = field(default_factory=list)
    step_batches: list[Callable[[int, list], None]] = field(default_factory=list)
    after_backward: list[Callable[[int, int], None]] = field(default_factory=list)
    save_phase: list[Callable[[str], None]] = field(default_factory=list)

    def on_save_phase(self, phase: str) -> None:
        for hook in self.save_phase:
            hook(phase)


def from_env(env: Mapping[str, str] = os.environ) -> Hooks:
    """Hooks installed by the LM_PLUGINS modules (none when it is unset)."""
    hooks = Hooks()
    for name in (n.strip() for n in env.get("LM_PLUGINS", "").split(",")):
        if name:
            _plugin(name).install(hooks)
    return hooks


def _plugin(name: str):
    """The module `name` (a dotted module name, or a .py file), imported once per process."""
    if not name.endswith(".py"):
        return importlib.import_module(name)
    key = f"lm_plugin_{Path(name).stem}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, name)
        if spec is None or spec.loader is None or not Path(name).is_file():
            raise FileNotFoundError(f"LM_PLUGINS names {name}, which is not a file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]
