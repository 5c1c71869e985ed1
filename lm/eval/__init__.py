"""Downstream evaluation: GLUE probes on frozen features (probe.py) and the LM Evaluation Harness on lm's
models (harness.py, offline tasks in tasks/); lm eval runs both on a checkpoint, and both run in the training
loop (probe.py's GlueProbe, harness_loop.py), paced by a share of the training time (pacing.py)."""
