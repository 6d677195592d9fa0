"""Shard-local export of a tensor-parallel megatron ``GPTModel`` in Hugging Face names, a bucket
of whole units (embedding, one transformer block, final norm, LM head) at a time.

No rank ever holds the full model: a bucket's shards are gathered inside the tensor-parallel
group only (all-gather for a rollout engine's weight sync, where every TP rank's engine loads the
full tensors and slices its own shard; a gather to one rank for a file export), cast to the target
dtype *before* they travel, handed on, and dropped before the next bucket is gathered. Peak extra
memory per rank is about two buckets (the gathered parts and the merged HF tensors), not the model.

- :func:`weight_manifest`: ``[(hf_name, full_shape)]`` inferred from the local shard shapes, no
  communication, so a rollout engine can check every name and shape *before* anything is gathered
  or sent.
- :func:`iter_hf_buckets`: the buckets (collective over the TP group).
- :func:`save_hf_folder`: an HF folder (sharded safetensors + index when it takes several buckets)
  written by one rank, gathered a bucket at a time.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Iterator

import torch

from pacs_fast.files import write_atomic
from pacs_fast.learner.hf_folder import finish_weights, save_config, shard_name, write_shard
from pacs_fast.learner.megatron.convert import gather_unit, hf_shapes, unit_rules


def local_shards(model) -> dict[str, torch.Tensor]:
    """This rank's megatron parameter shards (detached, no copy)."""
    return {name: p.detach() for name, p in model.named_parameters()}


def weight_manifest(model, hf_config, *, tp_size: int) -> list[tuple[str, tuple[int, ...]]]:
    """``[(hf_name, full shape)]`` of the policy, unit by unit, from the local shard shapes alone.

    Raises ValueError naming the megatron parameter when a shard's shape is impossible."""
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    out = []
    for _, rules in unit_rules(hf_config):
        out.extend(hf_shapes(shapes, hf_config, tp_size=tp_size, rules=rules).items())
    return out


def plan_buckets(hf_config, bucket_bytes: int, itemsize: int, manifest) -> list[list[tuple[str, dict]]]:
    """Consecutive units packed into buckets of about ``bucket_bytes`` (a unit is never split, so a
    bucket may exceed it by up to one unit): ``[[(unit, rules), ...], ...]``."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    sizes = {name: itemsize * int(torch.Size(shape).numel()) for name, shape in manifest}
    buckets, current, size = [], [], 0
    for unit, rules in unit_rules(hf_config):
        current.append((unit, rules))
        size += sum(sizes[hf] for _, hf_names in rules.values() for hf in hf_names if hf in sizes)
        if size >= bucket_bytes:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


@torch.no_grad()
def iter_hf_buckets(model, hf_config, *, tp_group, tp_size: int, bucket_bytes: int, dtype=None,
                    dst: int | None = None) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Buckets ``[(hf_name, full tensor), ...]`` of whole units; collective over ``tp_group`` (every
    TP rank must consume the iterator to the end). ``dtype``: cast of the shards before the gather
    (the engine's dtype). ``dst=r``: only TP-group rank ``r`` receives (the others get empty lists).
    Tensors may share storage with the live parameters (replicated norms; every tensor at tp=1):
    use a bucket before the next
    optimiser step, or copy it."""
    local = local_shards(model)
    manifest = weight_manifest(model, hf_config, tp_size=tp_size)
    itemsize = (dtype or next(iter(local.values())).dtype).itemsize
    for bucket in plan_buckets(hf_config, bucket_bytes, itemsize, manifest):
        out: list[tuple[str, torch.Tensor]] = []
        for _, rules in bucket:
            full = gather_unit(local, rules, hf_config, tp_group=tp_group, dst=dst, dtype=dtype)
            if full is not None:
                out.extend(full.items())
        yield out
        del out


@torch.no_grad()
def save_hf_folder(model, hf_config, folder, *, tp_group, tp_size: int, is_writer: bool,
                   participates: bool, bucket_bytes: int = 1 << 30, dtype=None,
                   extra_files: tuple = ()) -> None:
    """Writes the policy as a Hugging Face folder from the writing rank, a bucket at a time.

    ``participates``: this rank's TP group is the one that gathers (data-parallel replicas are
    identical: only one group does); ``is_writer``: this rank writes (it must be in that group and
    be its TP-group rank 0). One bucket: ``model.safetensors``; several: ``model-0000i-of-0000n
    .safetensors`` + ``model.safetensors.index.json`` (the transformers layout). Each file is
    written atomically. ``extra_files``: files copied next to them (e.g. ``generation_config.json``).
    Not collective beyond ``tp_group``; the caller adds a barrier if it needs one. A write that fails (a full disk)
    stops the writing, not the gathering: the group's collectives all run, then the writer raises the error.
    """
    if not participates:
        return
    folder = Path(folder)
    if is_writer:
        folder.mkdir(parents=True, exist_ok=True)
    manifest = weight_manifest(model, hf_config, tp_size=tp_size)
    itemsize = (dtype or next(model.parameters()).dtype).itemsize
    n = len(plan_buckets(hf_config, bucket_bytes, itemsize, manifest))
    weight_map, total, failure = {}, 0, None
    for i, bucket in enumerate(iter_hf_buckets(model, hf_config, tp_group=tp_group, tp_size=tp_size,
                                               bucket_bytes=bucket_bytes, dtype=dtype, dst=0)):
        if not is_writer or failure is not None:  # (a failed writer still takes part in the next buckets' gathers)
            continue
        name = shard_name(i, n)
        tensors = {k: v.contiguous() for k, v in bucket}
        try:
            total += write_shard(folder, name, tensors)
        except Exception as e:  # noqa: BLE001 - OSError, safetensors' error on a full disk
            failure = e
        weight_map.update(dict.fromkeys(tensors, name))
    if failure is not None:
        raise failure
    if not is_writer:
        return
    finish_weights(folder, weight_map, total)
    config = copy.deepcopy(hf_config)  # labelled with the dtype written (not the input model's: fp32 weights
    config.dtype = dtype or next(model.parameters()).dtype  # labelled bf16 were loaded as bf16 by dtype="auto")
    save_config(config, folder)  # (architectures filled in where the input's config.json had none)
    for src in extra_files:
        src = Path(src)
        if src.is_file():
            data = src.read_bytes()
            write_atomic(folder / src.name, lambda p: p.write_bytes(data))
