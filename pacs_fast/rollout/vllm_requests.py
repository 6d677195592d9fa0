"""One ``vllm.LLM.generate`` call that leaves no request behind (:class:`~pacs_fast.rollout.vllm_engine.VLLMEngine`).

``LLM.generate`` adds every request, then steps the engine until none is unfinished and returns the finished ones,
sorted by request id. A call that stops half-way (a ``KeyboardInterrupt`` in a notebook, an exception raised while
its requests were added or stepped) leaves its requests in the engine, and the next call then either

- returns them too, ahead of its own (the outputs of the interrupted call's prompts, in its prompts' places: a
  silently wrong result), or
- never returns (a request that failed half-way through being added is never finished: ``generate`` steps forever).

:func:`generate_all` aborts whatever an earlier call left (with one warning line), aborts its own requests when it
is interrupted, and checks that the outputs are its prompts' own, in order.
"""
from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def unfinished_request_ids(llm) -> list[str]:
    """The internal ids of the requests (and parent requests of ``n > 1`` sampling) ``llm``'s engine holds."""
    processor = getattr(llm.llm_engine, "output_processor", None)
    if processor is None:  # (an engine without vLLM v1's output processor: nothing to look at)
        return []
    return list(getattr(processor, "request_states", {})) + list(getattr(processor, "parent_requests", {}))


def abort_unfinished(llm) -> int:
    """Abort every request ``llm``'s engine holds; returns how many ids were aborted."""
    ids = unfinished_request_ids(llm)
    if ids:
        llm.llm_engine.abort_request(ids, internal=True)
    return len(ids)


def generate_all(llm, prompts: list, sampling, *, token_ids: list[list[int]]) -> list:
    """``llm.generate(prompts, sampling)`` with no request left behind, before or after.

    Args:
        llm: a ``vllm.LLM``.
        prompts: its prompts (``vllm.TokensPrompt`` each).
        sampling: one ``vllm.SamplingParams`` or one per prompt.
        token_ids: each prompt's token ids, to check each output belongs to its prompt.
    Returns:
        ``llm.generate``'s ``RequestOutput`` list, one per prompt, in the prompts' order.
    """
    stale = abort_unfinished(llm)
    if stale:
        logger.warning("vLLM held %d request(s) an interrupted call left behind: aborted before this call", stale)
    try:
        outputs = llm.generate(prompts, sampling, use_tqdm=False)
    except BaseException:
        abort_unfinished(llm)
        raise
    if len(outputs) != len(token_ids) or any(list(o.prompt_token_ids) != list(p)
                                             for o, p in zip(outputs, token_ids)):
        raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(token_ids)} prompts, not each prompt's "
                           "own: requests from elsewhere ran in this engine (one engine serves one caller at a time)")
    return outputs
