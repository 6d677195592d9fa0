"""What ``model.path``'s ``config.json`` says of the model's attention, for the checks made before any model loads
(the memory model, the preflight): whether :mod:`pacs_fast.ops.varlen_attention` is its exact attention, whether it
attends within a window, and so whether the torch learner's packed rows take the dense block-diagonal mask. The
config is read once per folder (and again when it changes)."""
from __future__ import annotations

import functools
from pathlib import Path


def varlen_unsupported(cfg) -> str | None:
    """Why :mod:`pacs_fast.ops.varlen_attention` would not be the exact attention of ``model.path``'s model, from its
    ``config.json`` (:func:`pacs_fast.ops.varlen_attention.unsupported`: another family, sliding-window layers,
    attention dropout; ``model.attention=flex...``), or None (it is, or the folder cannot tell: the built-in model is
    a plain Qwen2, a hub id or an unreadable config is left to the loader)."""
    return _attention_of(cfg)[0]


def windowed_model(cfg) -> str | None:
    """Why ``model.path``'s model attends within a window (sliding-window or GPT-Neo's local layers), or None: the
    torch learner then runs no shared-prefix forward (:func:`pacs_fast.learner.packing.shared_prefix_problem`, the
    one rule both read)."""
    return _attention_of(cfg)[1]


def _attention_of(cfg) -> tuple[str | None, str | None]:
    if not cfg.model.path:
        return None, None
    config = Path(cfg.model.path).expanduser() / "config.json"
    try:
        stat = config.stat()  # (the cache's key: a config.json edited in place is read again)
    except OSError:
        return None, None
    return _attention_at(str(config.parent), cfg.model.attention, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)
def _attention_at(folder: str, attention: str, *_stat) -> tuple[str | None, str | None]:
    """(the memory check asks once per candidate budget: the config is read once)"""
    from pacs_fast.learner.packing import shared_prefix_problem
    from pacs_fast.config.remote_code import trusted
    from pacs_fast.ops.varlen_attention import unsupported
    from transformers import AutoConfig
    try:
        config = AutoConfig.from_pretrained(folder, trust_remote_code=trusted())
    except Exception:  # noqa: BLE001 - the loader's own error comes when the model loads
        return None, None
    why = unsupported(config)
    if why is None and attention.startswith("flex"):
        why = f"the model's attention is {attention}"
    return why, shared_prefix_problem(config)


def packed_rows_dense(cfg) -> bool:
    """Whether the torch learner's packed rows attend through the dense block-diagonal mask
    (:func:`pacs_fast.learner.packing.packed_attention_mode`): ``learner.packed_attention=dense``, or ``auto`` on a
    model whose exact attention varlen is not (:func:`varlen_unsupported`; the learner warns and packs with the
    mask, with the window of a sliding-window model). Flash-attention models take their own varlen path, no mask;
    ``learner.packing=off`` packs nothing."""
    from pacs_fast.ops.varlen_attention import FLASH

    lc = cfg.learner
    if lc.backend != "torch" or lc.packing == "off" or cfg.model.attention in FLASH:
        return False
    return lc.packed_attention == "dense" or (lc.packed_attention == "auto" and varlen_unsupported(cfg) is not None)
