"""hydra/launcher=local_gpus and hydra/launcher=slurm, when the submitit plugin is installed
(the `slurm` extra). Without it this module defines nothing, so Hydra's plugin scan stays quiet."""

try:
    from lm.sweep.submitit_launchers import LocalGPUs as _LocalGPUs
    from lm.sweep.submitit_launchers import Slurm as _Slurm
except ImportError:  # hydra-submitit-launcher not installed: conf/hydra/launcher/*.yaml say how
    pass
else:

    class LocalGPUs(_LocalGPUs):
        """One cell per GPU at a time, every cell its own process (submitit local)."""

    class Slurm(_Slurm):
        """One SLURM array task per cell (submitit)."""
