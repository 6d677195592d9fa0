"""The parts of a Hugging Face causal LM (``*ForCausalLM``) the library reaches into: its decoder body
(hidden states without the head), its LM head, and whether its train-mode forward differs from eval.

Used by the learner (log-probs from hidden states + head), the rollout engines (the fp32 head) and the
warm-up (its SFT loss). Each raises a ValueError naming the model's class when the part is missing.
:func:`logits_transform` names a config by which the model's logits are not its head's (Gemma 2's soft-capping,
Cohere's / Granite's scales); :func:`logits_map` says how the log-prob op reproduces them (a ``softcap`` and a
scale folded into the temperature), None for the few it cannot (the learners refuse those).
"""
from __future__ import annotations

import torch


# wrappers whose model_type transformers' causal-LM mapping gives a text-only class (``Qwen3_5ForCausalLM``) that
# drops the vision tower on load: a hub Qwen3.5 folder (``Qwen3_5ForConditionalGeneration``) trained as it and saved
# as a text-only ``qwen3_5_text`` folder without its tower (sweep of 2026-12-07); Llama 3.2 Vision's
# ``MllamaForConditionalGeneration`` and Llama 4's likewise (41 of 66, 26 of 53 tensors of tiny ones dropped). Loaded as
# the folder's wrapper (Llama 4's holds a whole causal LM as its decoder: :func:`decoder_body` takes its body).
WHOLE_WRAPPERS = ("qwen3_5", "qwen3_5_moe", "mllama", "llama4")


def auto_model_class(config):
    """The transformers auto class that builds ``config``'s model with its LM head: ``AutoModelForCausalLM``, or
    ``AutoModelForImageTextToText`` for a multimodal wrapper only that maps (transformers 5's mistral3, llava;
    gemma3 is in both) and for a :data:`WHOLE_WRAPPERS` folder whose architecture is its wrapper."""
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)

    kind = getattr(config, "model_type", None)
    wrapper = MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.get(kind)
    whole = kind in WHOLE_WRAPPERS and wrapper in (getattr(config, "architectures", None) or [])
    if wrapper is not None and (kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or whole):
        from transformers import AutoModelForImageTextToText
        return AutoModelForImageTextToText
    return AutoModelForCausalLM


def decoder_body(model) -> torch.nn.Module:
    """The transformer body of a ``*ForCausalLM`` (``model.model`` for Qwen2 / Llama, else
    ``get_decoder()``): called with ``input_ids`` it returns ``last_hidden_state`` ``[B, T, H]``."""
    body = getattr(model, "model", None)
    if body is None and hasattr(model, "get_decoder"):
        body = model.get_decoder()
    if body is None:
        raise ValueError(f"{type(model).__name__} has no decoder body (model.model)")
    inner = getattr(body, "model", None)  # (a whole causal LM as the wrapper's decoder, Llama 4's language_model:
    if inner is not None and callable(getattr(body, "get_output_embeddings", None)) and \
            body.get_output_embeddings() is not None:  # its body)
        body = inner
    return body


def lm_head(model) -> torch.nn.Module:
    """The model's output embedding (``get_output_embeddings()``) with a ``weight`` tensor ``[V, H]``
    (and ``bias`` ``[V]`` or None)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or not isinstance(getattr(head, "weight", None), torch.Tensor):
        raise ValueError(f"{type(model).__name__} has no LM head with a weight (get_output_embeddings())")
    return head


def has_active_dropout(model) -> bool:
    """Whether train-mode forwards differ from eval-mode ones: a dropout module with p > 0, or a
    config dropout probability > 0 (Hugging Face attention dropout is a config value, not a module)."""
    if any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()):
        return True
    return bool(config_dropouts(getattr(model, "config", None)))


def config_dropouts(config) -> dict[str, float]:
    """The dropout probabilities > 0 of a model config (a ``PretrainedConfig``, or its dict; anything else has
    none): every number whose key names a dropout or a ``pdrop`` (``attention_dropout``, ``resid_pdrop``, ...),
    by key in sorted order."""
    items = config.to_dict().items() if hasattr(config, "to_dict") else config.items() if isinstance(config, dict) \
        else ()
    return {k: v for k, v in sorted(items) if ("dropout" in k or "pdrop" in k) and isinstance(v, (int, float))
            and not isinstance(v, bool) and v > 0}


# Config keys by which a model's forward changes the LM head's logits after ``hidden @ W.T + b`` (Gemma 2's
# tanh soft-capping, Cohere's logit_scale, Granite's logits_scaling, Falcon-H1's lm_head_multiplier, ...).
LOGIT_TRANSFORM_KEYS = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier",
                        "logits_scaling")


def _text_config(config) -> dict | None:
    """The (text) config as a dict: a ``PretrainedConfig``'s ``get_text_config()``, a dict's ``text_config``.
    A key of :data:`LOGIT_TRANSFORM_KEYS` that the config class computes is added: MiniCPM3's ``logits_scaling``
    is a property (``hidden_size / dim_model_base``), absent from ``to_dict()`` and from its config.json."""
    if hasattr(config, "to_dict"):
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        config = text.to_dict()
        for key in LOGIT_TRANSFORM_KEYS:
            if key not in config and getattr(text, key, None) is not None:
                config[key] = getattr(text, key)
    if isinstance(config, dict) and isinstance(config.get("text_config"), dict):
        config = config["text_config"]
    if not isinstance(config, dict):
        return None
    if (config.get("model_type") == "minicpm3" and "logits_scaling" not in config
            and _positive(config.get("dim_model_base")) and _positive(config.get("hidden_size"))):
        config = {**config, "logits_scaling": config["hidden_size"] / config["dim_model_base"]}
    return config


def logits_transform(config) -> str | None:
    """``"key=value"`` of the config key by which the model's logits are not ``hidden @ W.T + b`` (one of
    :data:`LOGIT_TRANSFORM_KEYS` set: a soft-capping, a scale other than 1), else None. ``config``: a
    ``PretrainedConfig`` or a config.json's dict (its ``text_config`` is read when it has one). The log-prob op
    (:func:`~pacs_fast.ops.linear_logprobs.linear_logprobs`) computes from the head's weight alone, so for such
    a model it would give other log-probs than the ones the engines sample from."""
    config = _text_config(config)
    if config is None:
        return None
    for key in LOGIT_TRANSFORM_KEYS:
        value = config.get(key)
        # (a soft-capping of 0 or none is off; a scale of 1 is no scale)
        if value not in ((None, 0) if key == "final_logit_softcapping" else (None, 1)):
            return f"{key}={value}"
    return None


# How each scale key scales the head's logits, by model type (transformers' modeling files: Cohere's
# ``logits * logit_scale``, Falcon-H1's ``lm_head(h) * lm_head_multiplier``, Granite's ``logits / logits_scaling``,
# MiniCPM3's ``lm_head(h / logits_scaling)`` (a head without bias), HyperCLOVA X's ``logits * logits_scaling``).
# A key / model type not listed (MuseGlimmer's ``output_multiplier``, applied *before* its cap) maps to None.
_SCALES = {"logit_scale": (("", False),), "lm_head_multiplier": (("", False),),
           "logits_scaling": (("granite", True), ("minicpm3", True), ("hyperclovax", False))}


def logits_map(config) -> tuple[float | None, float] | None:
    """``(softcap, scale)`` such that the model's logits are ``scale * s(hidden @ W.T + b)``, ``s`` the soft-cap
    ``softcap * tanh(z / softcap)`` (Gemma 2's ``final_logit_softcapping``; None: no cap): the log-prob op
    reproduces them as ``linear_logprobs(..., softcap=softcap, temperature=T / scale)``. ``(None, 1.0)`` for a
    plain head (:func:`logits_transform` None); None for a transform it cannot reproduce: a scale key of a model
    type whose direction is not known here, a cap and a scale together (their order differs by model), a
    non-positive or non-finite value. ``config`` as :func:`logits_transform` takes it."""
    if logits_transform(config) is None:
        return None, 1.0
    config = _text_config(config)
    model_type = str(config.get("model_type") or "")
    cap, scale, scales = config.get("final_logit_softcapping"), 1.0, 0
    for key in LOGIT_TRANSFORM_KEYS[1:]:
        value = config.get(key)
        if value in (None, 1):
            continue
        rule = next((div for prefix, div in _SCALES.get(key, ()) if model_type.startswith(prefix)), None)
        if rule is None or not _positive(value):
            return None
        scale, scales = (1.0 / float(value) if rule else float(value)), scales + 1
    if cap in (None, 0):
        return (None, scale) if scales == 1 else None
    return (float(cap), 1.0) if scales == 0 and _positive(cap) else None


def _positive(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < float(value) < float("inf"))


def checkpoint_names(model, named_tensors) -> dict[str, str]:
    """``{name in the model: name in its checkpoint}`` for the tensors of ``named_tensors`` (``(name, tensor)``
    pairs, the model's state-dict names; only shapes are read) that transformers renames when it loads a
    checkpoint: a multimodal wrapper's prefixes (Gemma 3 4B+'s ``language_model.model.*`` loads as
    ``model.language_model.*``, SigLIP's ``vision_tower.vision_model.*`` as ``model.vision_tower.*``; LLaVA's,
    Mistral 3's). Found by transformers' own reversal, what its ``save_pretrained`` writes (transformers 5's
    ``revert_weight_conversion``, 4's ``_checkpoint_conversion_mapping``). Empty for the many models loaded as they
    are, and for those whose tensors transformers also fuses on load (a mixture of experts' in transformers 5: the
    engines' weight syncs keep the model's names throughout, not a mix of the two; their checkpoints are written in
    the hub's layout whole, :mod:`pacs_fast.learner.fused_checkpoint`)."""
    import re

    shapes = {n: (tuple(t.shape), t.dtype) for n, t in named_tensors}
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers 4: the class's regexes, reversed as its save_pretrained reverses them
        mapping = getattr(model, "_checkpoint_conversion_mapping", None) or {}
        reverse = [(v, re.sub(r"\(.*\)", "", k.lstrip("^"))) for k, v in mapping.items()]
        out = {}
        for name in shapes:
            for pattern, replacement in reverse:
                new, hits = re.subn(pattern, replacement, name)
                if hits:
                    out[name] = new
                    break
        return {k: v for k, v in out.items() if k != v}
    meta = {n: torch.empty(s, dtype=d, device="meta") for n, (s, d) in shapes.items()}
    try:
        reverted = revert_weight_conversion(model, dict(meta))
    except Exception:  # noqa: BLE001 - a conversion it cannot reverse on stand-ins: the model's names, as before
        return {}
    found = {id(t): n for n, t in reverted.items()}  # (a renamed tensor is the same object under its new name)
    if len(found) != len(meta) or any(id(t) not in found for t in meta.values()):  # (some fused or split)
        return {}
    return {n: found[id(t)] for n, t in meta.items() if found[id(t)] != n}


def pin_longrope(model, context: int) -> bool:
    """Pins a longrope model's (Phi-3.5-mini's, Phi-4-mini's) factors for a run of ``context`` tokens (prompt +
    response): transformers picks the short or the long ones per forward call, by the call's largest position, so
    a decode step past ``original_max_position_embeddings`` rotated with the long ones beside a cache rotated with
    the short ones, and one long row turned a micro-batch's other rows long; vLLM picks once per engine (long when
    its max_model_len exceeds it). Here as vLLM: the long factors throughout when ``context`` exceeds it (True:
    pinned), else nothing to do (no row reaches it)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    params = getattr(config, "rope_parameters", None) or {}
    original = params.get("original_max_position_embeddings")
    if params.get("rope_type") != "longrope" or not original or int(context) <= int(original):
        return False
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for module in model.modules():
        if getattr(module, "rope_type", None) == "longrope" and hasattr(module, "original_inv_freq"):
            inv_freq, _ = ROPE_INIT_FUNCTIONS["longrope"](module.config, module.inv_freq.device, seq_len=original + 1)
            module.original_inv_freq = inv_freq  # (what the per-call update takes for a call below the threshold)
            module.inv_freq = inv_freq
    return True
