"""What :class:`~pacs_fast.integrations.trl.PACSTrainer` changes on TRL's model and vLLM engine.

- :func:`add_pacs_head`: the policy's ``forward`` answers ``pacs_logits_to_keep=K`` with the last K tokens'
  log-probs (and entropies) from the backbone's hidden states through :func:`pacs_fast.ops.linear_logprobs`, never the
  ``[B, T, V]`` logits; :func:`head_unsupported_reason` says when it cannot (TRL's own head is used then).
- :func:`sync_by_reload`: TRL's colocated vLLM weight sync through vLLM's ``reload_weights``, which works on a CPU
  where TRL's direct ``load_weights`` call fails (:func:`vllm_runs_on_cpu`).

Imports neither TRL nor vLLM at module level.
"""
from __future__ import annotations

import types

from pacs_fast.causal_lm import logits_map, logits_transform
from pacs_fast.ops.linear_logprobs import linear_logprobs


def head_unsupported_reason(model) -> str | None:
    """Why ``linear_logprobs`` cannot reproduce this model's logits (None when it can: a plain head, or Gemma 2's
    soft-cap / Cohere's / Granite's scale, :func:`pacs_fast.causal_lm.logits_map`)."""
    transform = logits_transform(model.config)
    if transform and logits_map(model.config) is None:
        return transform.split("=")[0]
    if not hasattr(model, "get_output_embeddings") or model.get_output_embeddings() is None:
        return "no output embeddings"
    return None


def add_pacs_head(model, temperature: float) -> None:
    """Wraps ``model.forward`` (kept as is otherwise, so generation is unchanged):
    ``model(input_ids=..., attention_mask=..., pacs_logits_to_keep=K, pacs_entropy=bool)`` returns
    ``(logp [B, K] fp32, entropy [B, K] or None)`` of the last K tokens, from the backbone's last
    hidden states through ``linear_logprobs``. Runs inside ``forward`` so that DDP / FSDP wrappers
    see it as the module's forward."""
    inner = model.forward
    softcap, scale = logits_map(model.config)  # (the model's soft-cap; its logit scale folds into the temperature)

    def forward(self, *args, pacs_logits_to_keep=None, pacs_entropy=False, **kwargs):
        if pacs_logits_to_keep is None:
            return inner(*args, **kwargs)
        input_ids, attention_mask = kwargs["input_ids"], kwargs["attention_mask"]
        kwargs["use_cache"] = False
        hidden = self.base_model(*args, **kwargs).last_hidden_state
        K = int(pacs_logits_to_keep)
        # hidden state t predicts token t+1: the last K tokens come from positions -K-1 .. -2
        h = hidden[:, -K - 1:-1]
        labels = input_ids[:, -K:].masked_fill(attention_mask[:, -K:] == 0, -100)
        head = self.get_output_embeddings()
        weight, bias = head.weight, head.bias
        if hasattr(weight, "full_tensor"):  # FSDP2 DTensor shards
            weight = weight.full_tensor()
            bias = None if bias is None else bias.full_tensor()
        out = linear_logprobs(h.to(weight.device), weight, labels.to(weight.device), bias=bias,
                              temperature=temperature / scale, return_entropy=bool(pacs_entropy), softcap=softcap)
        return out if pacs_entropy else (out, None)

    model.forward = types.MethodType(forward, model)


def sync_by_reload(generation) -> None:
    """TRL's colocate weight sync, done through vLLM's ``reload_weights`` worker call.

    TRL 1.16 (``VLLMGeneration.sync_weights``) calls the vLLM model's ``load_weights`` directly.
    On a CPU, vLLM (0.32) repacks every linear layer's weight for oneDNN or, on CPUs with AMX,
    sgl-kernel, and leaves an empty ``Parameter`` without ``weight_loader`` in its place, so that
    call fails (``AttributeError: 'Parameter' object has no attribute 'weight_loader'``).
    ``reload_weights`` loads into fresh parameters and packs again, which works on every CPU (it is
    how :class:`pacs_fast.rollout.vllm_engine.VLLMEngine` syncs), then re-packs an LM head tied to
    the embedding (the reload refreshes the embedding's weight, not the head's packed copy). One call
    carries the whole model: the tensors are referenced, not copied (the engine runs in this process)."""
    from pacs_fast.rollout.vllm_worker import refresh_tied_lm_heads

    if getattr(generation, "enable_sleep_mode", False):
        generation.llm.wake_up(tags=["weights"])
        generation._llm_weights_sleeping = False
    weights = [(name, tensor.detach()) for name, tensor in generation._iter_named_params()]
    generation.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
    generation.llm.collective_rpc(refresh_tied_lm_heads)
    generation.llm.reset_prefix_cache()


def vllm_runs_on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()
