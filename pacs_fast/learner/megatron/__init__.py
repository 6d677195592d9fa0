"""Megatron-core tensor-parallel learner (``learner.backend=megatron``).

- :mod:`.model`: ``GPTModel`` from a Hugging Face Qwen2 / Qwen3 / Llama config.
- :mod:`.convert`: HF <-> megatron weights (fused QKV per query group, ``[gate; up]`` halves,
  vocab padding, TP sharding).
- :mod:`.core_attention`: the layer spec's core attention (megatron's, plus varlen THD for packed rows).
- :mod:`.forward`: per-token log-probs through the vocab-parallel ``linear_logprobs`` (padded, or packed
  as THD or with the dense block-diagonal mask).
- :mod:`.sequence_parallel`: the norms (torch's RMSNorm, those whose gradients the TP ranks sum), the padding
  to a multiple of tp and the gather of sequence parallelism (``learner.sequence_parallel``).
- :mod:`.learner`: :class:`MegatronLearner`, the :class:`~pacs_fast.learner.base.Learner` (its old log-probs and
  off-policy correction from the update's own first forward: :mod:`pacs_fast.learner.fused_old_logprobs`).
- :mod:`.checkpointing`: its HF weights in and out, and its checkpoint state.
- :mod:`.data_parallel`: its data-parallel shares, same-batch check, gathers and reductions.
- :mod:`.setup`: the parallel state, the lazy HF checkpoint reader, the TP-aware gradient norm.
- :mod:`.optimizer`: AdamW, optionally sharded over the data-parallel ranks (ZeRO-1).
- :mod:`.export` / :mod:`.state`: the policy as an HF folder; the checkpoint state of the rest.
- :mod:`.cpu_compat`: the CUDA -> CPU redirections megatron-core needs without a GPU.

megatron-core is imported lazily (inside functions): importing these modules is cheap.
"""
from __future__ import annotations


def __getattr__(name: str):
    if name == "MegatronLearner":
        from pacs_fast.learner.megatron.learner import MegatronLearner

        return MegatronLearner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
