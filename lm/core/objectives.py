"""Which pretraining objective each model family uses, and how a batch counts toward the loss.

| arch            | objective | batch (built by lm.data.packed)                                        |
| decoder         | clm       | input_ids, labels shifted by one (Radford et al. 2018)                  |
| encoder         | mlm       | 15% of tokens masked 80/10/10, labels -100 elsewhere (Devlin et al. 2019) |
| encoder_decoder | span      | sentinel-replaced spans in, the spans out (Raffel et al. 2020)           |

A model/family option (lm/zoo) keeps its arch's batch: the recurrent LMs are decoders (a bidirectional one is
refused: lm.model.validate.check_objective); ELECTRA is an encoder that reads the mlm batch (masked 85/0/15 as
ELECTRA's code masks: the model config's mlm_corruption) and returns its own loss (the generator's MLM loss +
disc_weight x the replaced-token detection loss over every real token).

The model returns the mean cross-entropy over a micro-batch's label tokens. Averaging those means
over micro-batches and ranks would weight a token by how crowded its micro-batch was, so the loop
weights each micro-batch by its share of the step's label tokens instead (`weights`): the step's
loss and gradient are then exactly the token mean over the global batch, whatever the split.
"""

import torch

from lm.constants import IGNORE_INDEX
from lm.core.tracking import ModelMetrics

OBJECTIVES = {"decoder": "clm", "encoder": "mlm", "encoder_decoder": "span"}


def objective_for(arch: str) -> str:
    return OBJECTIVES[arch]


def label_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Tokens that carry a target in this micro-batch."""
    return int((batch["labels"] != IGNORE_INDEX).sum())


def input_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Tokens the model reads (encoder and decoder inputs): what the logged tokens and tokens/s count. A padded
    batch (GLUE's: attention_mask 0 on pads) counts its real tokens only, as a user comparing throughput
    across tasks expects (Hugging Face Trainer's include_num_input_tokens_seen="non_padding"); packed
    pretraining windows have no mask and no padding, so every position counts. Call it on host tensors
    (lm/core/prefetch.py does, before the copy): summing a device mask would wait for the device."""
    mask = batch.get("attention_mask")
    n = int(mask.sum()) if mask is not None else batch["input_ids"].numel()
    return n + (batch["decoder_input_ids"].numel() if "decoder_input_ids" in batch else 0)


def weights(local_counts: list[int], global_count: int) -> list[float]:
    """Each micro-batch's share of the global token mean (sums to this rank's share of 1)."""
    if global_count == 0:
        raise ValueError("no label tokens in this step's global batch (all labels are -100)")
    return [n / global_count for n in local_counts]


def loss(model, batch: dict[str, torch.Tensor], metrics: ModelMetrics | None = None) -> torch.Tensor:
    """Mean cross-entropy over the micro-batch's label tokens, plus the model's auxiliary loss.

    Components with training-only losses (MoE load balancing) put their weighted sum in the output's
    `aux_loss` and their detached metrics in `metrics` (lm/model/aux.py); both are absent in eval mode,
    so validation losses stay pure cross-entropy. The metrics are added to `metrics` (the loop's, which it
    logs as means over each log interval; None drops them).
    """
    out = model(**batch)
    model_metrics = getattr(out, "metrics", None)
    if model_metrics and metrics is not None:
        metrics.add(model_metrics)
    aux_loss = getattr(out, "aux_loss", None)
    return out.loss if aux_loss is None else out.loss + aux_loss


def training_flops_per_token(model_cfg, seq_len: int, noise_density: float, mean_span_length: float) -> float:
    """Training FLOPs per token read (what MFU and lm report count): an encoder-decoder reads seq_len encoder
    tokens and span corruption's shorter targets, each through its own stack (lm/model/flops.py)."""
    from lm.model.flops import encoder_decoder_flops_per_token, flops_per_token

    if objective_for(model_cfg.arch) != "span":
        return flops_per_token(model_cfg, seq_len)
    from lm.data.collate import t5_lengths

    _, enc_len, dec_len = t5_lengths(seq_len, noise_density, mean_span_length)
    return encoder_decoder_flops_per_token(model_cfg, enc_len, dec_len)
