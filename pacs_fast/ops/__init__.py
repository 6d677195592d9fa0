"""Autograd ops with backend dispatch: Triton kernels (compiled on CUDA; the Triton interpreter on
CPU tensors in the tests) or a chunked pure-PyTorch path with the same contract (the CPU default).

- :func:`token_logprobs`: per-token log-probs (and entropy) from logits, never the full softmax.
- :func:`linear_logprobs`: the same from hidden states and the LM head, never the ``[N, V]`` logits.
- :func:`fused_pacs_loss`: the grouped PACS loss in one kernel (forward) and one broadcast (backward);
  imported on first use, since it needs Triton (the log-prob ops work without it on CPU).
"""
from pacs_fast.ops.linear_logprobs import linear_logprobs
from pacs_fast.ops.token_logprobs import token_logprobs

__all__ = ["fused_pacs_loss", "linear_logprobs", "token_logprobs"]


def __getattr__(name):
    if name == "fused_pacs_loss":
        from pacs_fast.ops.pacs_loss import fused_pacs_loss

        return fused_pacs_loss
    raise AttributeError(f"module 'pacs_fast.ops' has no attribute {name!r}")
