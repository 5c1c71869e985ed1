"""Chunked output projection + cross-entropy that never materialises the (N, V) logits.

At GPT-2's vocabulary the logits of a batch (B*T x 50304 fp32) are larger than all activations
of a small model, and writing, soft-maxing and re-reading them costs more than the matmul. This
computes the loss and its gradients chunk by chunk in the forward pass (the approach of
Liger-Kernel's fused linear cross-entropy and of Wijmans et al. 2024, "Cut your losses"):
per chunk, logits -> softmax - onehot -> grad_h = g W and grad_W += g^T h, then drops the chunk.
Backward only scales the stored gradients.

Under autocast every matmul here runs in autocast's dtype, as an autocast nn.Linear's would: the final
norm hands over fp32 activations (norms run in fp32 under autocast) and the master weight is fp32, and
a custom autograd.Function gets no autocast casts of its own. Only the softmax and the weight-gradient
accumulator stay fp32, so no GEMM falls off the GPU's bf16 path.
"""

import torch

from lm.constants import IGNORE_INDEX


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, bias, labels, chunk_size: int):
        """h: (N, D), weight: (V, D), bias: (V,) or None, labels: (N,) -> mean loss over valid labels."""
        n_valid = (labels != IGNORE_INDEX).sum().clamp(min=1)
        need_grad = any(ctx.needs_input_grad[:3])
        ctx.dtypes = (h.dtype, weight.dtype, bias.dtype if bias is not None else None)
        device = h.device.type
        compute = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else h.dtype
        low = compute != torch.float32
        h, weight = h.to(compute), weight.to(compute)
        bias = bias.to(compute) if bias is not None else None
        grad_h = torch.zeros_like(h) if need_grad else None
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if need_grad else None
        grad_b = (
            torch.zeros(weight.shape[0], dtype=torch.float32, device=h.device)
            if need_grad and bias is not None
            else None
        )
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        # One logits buffer for every chunk: a fresh (n, V) tensor per chunk is a large allocation
        # that the CPU allocator maps, page-faults and zeroes each time.
        buf = h.new_empty(min(chunk_size, h.shape[0]), weight.shape[0])
        for start in range(0, h.shape[0], chunk_size):
            hc, lc = h[start : start + chunk_size], labels[start : start + chunk_size]
            logits = torch.mm(hc, weight.t(), out=buf[: hc.shape[0]])
            if bias is not None:
                logits = logits + bias
            logits = logits.float()  # (n, V)
            valid = lc != IGNORE_INDEX
            target = lc.clamp(min=0)
            rows = torch.arange(logits.shape[0], device=logits.device)
            target_logit = logits[rows, target]
            # One exp pass serves both the loss (log-sum-exp) and the gradient (softmax).
            peak = logits.amax(dim=-1, keepdim=True)
            e = logits.sub_(peak).exp_()  # in place: the chunk's logits are not needed again
            sum_e = e.sum(-1)
            total += ((peak[:, 0] + sum_e.log() - target_logit) * valid).sum()
            if need_grad:
                row_scale = valid.float() / n_valid  # d(mean loss)/d(row loss)
                g = e.mul_((row_scale / sum_e)[:, None])  # softmax, scaled
                g[rows, target] -= row_scale  # minus the one-hot target
                gc = g.to(compute)  # one cast of the (n, V) chunk serves both GEMMs (a no-op in fp32)
                torch.mm(gc, weight, out=grad_h[start : start + chunk_size])
                if low:  # a bf16 GEMM (fp32 accumulation inside), summed over chunks in fp32
                    grad_w += torch.mm(gc.t(), hc)
                else:
                    grad_w.addmm_(g.t(), hc)
                if grad_b is not None:
                    grad_b += g.sum(0)
        ctx.save_for_backward(grad_h, grad_w, grad_b)
        return total / n_valid

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w, grad_b = ctx.saved_tensors
        h_dtype, w_dtype, b_dtype = ctx.dtypes
        gb = (grad_b * grad_out).to(b_dtype) if grad_b is not None else None
        gh = (grad_h * grad_out.to(grad_h.dtype)).to(h_dtype)
        return gh, (grad_w * grad_out).to(w_dtype), gb, None, None


def target_mean(summed: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """A loss summed over the label tokens, divided by their count (not below 1). The mean F.cross_entropy takes
    is 0/0 = NaN on a micro-batch whose labels are all IGNORE_INDEX (short mlm windows, a span batch, a
    micro-batch of padding), and the loop's weight 0 for it cannot cancel a NaN (NaN x 0 = NaN): the whole
    step would be skipped as non-finite. Here such a micro-batch gives loss 0 and gradient 0, exactly."""
    return summed / (labels != IGNORE_INDEX).sum().clamp(min=1)


def chunked_cross_entropy(
    h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor, chunk_size: int
) -> torch.Tensor:
    """Mean cross-entropy of softmax(h W^T + b) against labels; h (..., D), labels (...)."""
    h2, target = h.reshape(-1, h.shape[-1]), labels.reshape(-1)  # (N, D), (N,)
    return _ChunkedLinearCrossEntropy.apply(h2, weight, bias, target, chunk_size)
