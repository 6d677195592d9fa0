"""Functions that run inside a vLLM worker (``LLM.collective_rpc(fn, args=...)``, with the worker
as first argument): the padded-vocabulary mask of the rollout engines and the re-pack of a tied LM
head after a weight sync (:mod:`pacs_fast.rollout.vllm_engine`, the TRL integration). They import
vLLM lazily, inside the worker.
"""
from __future__ import annotations

import functools


def refresh_tied_lm_heads(worker) -> int:
    """Runs inside the vLLM worker: re-packs each ``lm_head`` that shares the embedding weight."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    model = worker.model_runner.get_model()
    embeds = [m.weight for m in model.modules()
              if isinstance(m, VocabParallelEmbedding) and not isinstance(m, ParallelLMHead)]
    count = 0
    for m in model.modules():
        if isinstance(m, ParallelLMHead) and any(m.weight is w for w in embeds):
            m.quant_method.process_weights_after_loading(m)
            count += 1
    return count


def mask_padded_rows(worker, vocab_size: int) -> int:
    """Runs inside the vLLM worker: hooks every ``LogitsProcessor`` so that logits of ids
    ``>= vocab_size`` are -inf (before vLLM's raw log-probs, sampling and prompt log-probs).
    Returns how many were hooked (again on a second call: the old hook is replaced)."""
    from vllm.model_executor.layers.logits_processor import LogitsProcessor

    count = 0
    for m in worker.model_runner.get_model().modules():
        if isinstance(m, LogitsProcessor):
            old = getattr(m, "_pacs_fast_vocab_hook", None)
            if old is not None:
                old.remove()
            m._pacs_fast_vocab_hook = m.register_forward_hook(functools.partial(_fill_padded_rows, vocab_size),
                                                              with_kwargs=True)
            count += 1
    return count


def _fill_padded_rows(vocab_size: int, module, args, kwargs, logits):
    # None: a tensor-parallel rank without logits; skip_gather: a vocabulary shard (batch-sharded
    # sampling, which the engine refuses to hook: it uses allowed_token_ids then)
    if logits is not None and not kwargs.get("skip_gather") and logits.shape[-1] > vocab_size:
        logits[..., vocab_size:] = float("-inf")
    return logits
