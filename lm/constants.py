"""The batch contract shared by lm/data (which writes labels) and lm/model (which computes the loss);
a module of its own so that both import it without importing each other (or torch)."""

IGNORE_INDEX = -100  # label of positions without a loss (PyTorch's cross_entropy ignore_index)
# BERT's masking (Devlin et al. 2019): of the positions an mlm batch predicts, the fractions given the mask token and
# a random token (the rest keep theirs): lm/data's MaskedLM default, and the model's unless its family masks otherwise
# (FamilyConfig.mlm_corruption: ELECTRA's 85/0)
BERT_MLM_CORRUPTION = (0.8, 0.1)
