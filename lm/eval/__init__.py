"""Downstream evaluation: GLUE probes on frozen features (probe.py, also in the training loop) and the
LM Evaluation Harness on lm's models (harness.py, offline tasks in tasks/); lm eval runs both."""
