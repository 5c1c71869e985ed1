"""hydra/launcher=sequential: Hydra's basic launcher, keeping going past a cell that exits."""

from hydra._internal.core_plugins.basic_launcher import BasicLauncher

from lm.sweep.launchers import KeepGoing


class Sequential(KeepGoing, BasicLauncher):
    """Cells one after another in this process; a failed cell is recorded and the sweep goes on."""
