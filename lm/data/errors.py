"""The error of bad input data, shared by every lm.data module."""


class DataError(ValueError):
    """Bad input data: the message names the file (and line) and what to do."""
