"""The Hugging Face engine's decode step in memory, and the rows a run can hold, from the settings and the model's
``config.json``, before any model loads (:mod:`pacs_fast.trainer.memory_model` re-exports them;
:mod:`pacs_fast.trainer.preflight` compares them with the device's memory).

What is estimated is the peak of one decode step: for every row of a chunk (``max(rollout.n, engine batch)`` rows)
four fp32 vocabulary-sized tensors (the logits, their temperature-scaled copy, the probabilities and the sampler's
scratch), plus the rows' KV cache for ``data.max_prompt_tokens + rollout.max_new_tokens`` tokens (within the
model's context: :func:`row_limits`); model weights and activations come on top. vLLM manages its own memory
(``rollout.gpu_memory_utilization``) and is not estimated here.
"""
from __future__ import annotations

from pathlib import Path

from pacs_fast.config.hybrid_blocks import mamba_state_bytes
from pacs_fast.config.linear_attention import linear_state_bytes

VOCAB_COPIES = 4  # fp32 [rows, vocab] tensors alive at a decode step's peak (see the module docstring)


def _bytes_of(dtype: str) -> int:
    return 2 if dtype in ("bfloat16", "float16") else 4


def engine_row_terms(cfg) -> dict[str, int]:
    """What sets the HF engine's largest decode chunk (see pacs_fast.trainer.build and rollout.hf), at most 1,024
    rows: a group (``rollout.n``, ``rollout.eval_n``: 1 with greedy evaluation, which decodes one response a
    problem; a larger group is decoded 1,024 rows at a time) or a batch (the training step's, the evaluation's)."""
    eval_n = cfg.rollout.eval_n if cfg.rollout.eval_temperature > 0 else 1
    return {"rollout.n": min(cfg.rollout.n, 1024), "rollout.eval_n": min(eval_n, 1024),
            "train.prompts_per_step x rollout.n": min(cfg.train.prompts_per_step * cfg.rollout.n, 1024),
            "data.eval_size x rollout.eval_n": min(cfg.data.eval_size * eval_n, 1024)}


def engine_rows(cfg) -> int:
    """Rows of the HF engine's largest decode chunk (:func:`engine_row_terms`)."""
    return max(engine_row_terms(cfg).values())


def row_limits(cfg) -> tuple[int, int, int]:
    """``(prompt, response, row)``: the most tokens a run's prompt, response and row (prompt + response) hold:
    ``data.max_prompt_tokens``, ``rollout.max_new_tokens`` and their sum, within the model's context where its
    config.json gives one (:func:`pacs_fast.config.model_files.trained_positions`): both engines refuse a prompt
    that fills it and end a response there. (Qwen2.5-Math's 4,096 at ``rollout.max_new_tokens=8192`` had been
    sized as rows of 8,704 tokens: the learner's activations and the engine's cache twice what any row needs.)"""
    P, R = cfg.data.max_prompt_tokens, cfg.rollout.max_new_tokens
    context = None
    if cfg.model.path:
        from pacs_fast.config.model_files import trained_positions

        try:
            context = trained_positions(Path(cfg.model.path).expanduser())
        except Exception:  # noqa: BLE001 - an unreadable config: the sum, as before (its own error comes later)
            context = None
    if not context or context < 2:
        return P, R, P + R
    return min(P, context - 1), min(R, context - 1), min(P + R, context)


def hf_engine_bytes(cfg, shape: dict) -> int:
    rows = engine_rows(cfg)
    logits = VOCAB_COPIES * rows * shape["vocab"] * 4
    tokens = row_limits(cfg)[2]  # the cache holds the prompt too
    b = shape["bytes"] if cfg.rollout.dtype == "auto" else _bytes_of(cfg.rollout.dtype)  # (an HF copy's rollout.dtype)
    linear = shape.get("linear")  # (a hybrid model's linear layers: a constant state a row, not a cache a token)
    state = (linear_state_bytes(linear, b) if linear else 0) + \
        (mamba_state_bytes(shape["blocks"], b) if shape.get("blocks") else 0)  # (Nemotron-H's Mamba layers)
    return logits + rows * (kv_per_token(shape) * tokens * b + state)


def kv_per_token(shape: dict) -> int:
    """Elements of the HF engine's cache a token of a row, all layers: keys and values, ``2 x kv_heads x head_dim``
    a layer; of multi-head latent attention (``shape["mla"]``), transformers' cache of the latent and the shared
    rope key, ``kv_lora + rope`` a layer (576 for DeepSeek-V2-Lite, whose KV had been counted as 2 x 16 x 128 = 4,096
    a layer: 7.1 times over). Of a hybrid model (``shape["linear"]``: Qwen3.5), its full-attention layers alone (a
    quarter of Qwen3.5's had been counted 4 times)."""
    mla, linear = shape.get("mla"), shape.get("linear")
    if shape.get("cached_kv") is not None:  # (Gemma 4: its full layers' wider heads, none in its KV-shared layers)
        return shape["cached_kv"]
    layers = shape["layers"] - (linear["layers"] if linear else 0)  # (a hybrid model's full-attention layers alone)
    layers = shape["blocks"]["attention"] if shape.get("blocks") else layers  # (Nemotron-H's attention layers)
    return layers * (mla["kv_lora"] + mla["rope"] if mla else 2 * shape["kv_heads"] * shape["head_dim"])
