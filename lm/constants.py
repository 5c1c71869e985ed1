"""The batch contract shared by lm/data (which writes labels) and lm/model (which computes the loss);
a module of its own so that both import it without importing each other (or torch)."""

IGNORE_INDEX = -100  # label of positions without a loss (PyTorch's cross_entropy ignore_index)
