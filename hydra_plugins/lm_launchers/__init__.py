"""lm's Hydra launchers, registered where Hydra looks for plugins (the hydra_plugins namespace).

Thin subclasses only; what they do is in lm/sweep/launchers.py (and submitit_launchers.py).
conf/hydra/launcher/{sequential,local_gpus,slurm}.yaml select them.
"""
