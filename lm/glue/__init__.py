"""GLUE internals (registry, readers, metrics, encoding, submission and results files).

Import the public API from `lm.data.glue`, which lists it.
"""
